""".bench/results.md from a results dict: one table per section; columns ours | floor | peer | target | result
(pass, or miss and by how much)."""

from __future__ import annotations

from typing import Any


def judge(value: float | None, limit: float, unit: str = "", *, lower_is_better: bool = True) -> str:
    if value is None:
        return "n/a"
    ok = value <= limit if lower_is_better else value >= limit
    if ok:
        return "pass"
    diff = value - limit
    return f"**miss** by {diff:+.4g}{unit}"


def err(r: dict[str, Any] | None) -> str | None:
    if not r:
        return "not run"
    if "error" in r:
        return f"error: {r['error']}"
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    return None


def ms(x: dict[str, Any] | None, key: str) -> str:
    return f"{x[key]} ms" if x and key in x else ""


def verbs(by_verb: dict[str, float]) -> str:
    return ", ".join(f"{v} {c}" for v, c in by_verb.items()) or "none"


class Table:
    def __init__(self, title: str, header: list[str], note: str = "") -> None:
        self.lines = [f"### {title}", ""] + ([note, ""] if note else []) + [
            "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        self.width = len(header)

    def row(self, *cells: Any) -> None:
        cells_s = [str(c) for c in cells] + [""] * (self.width - len(cells))
        self.lines.append("| " + " | ".join(cells_s) + " |")

    def note_row(self, label: str, text: str) -> None:
        self.row(label, text)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    out = [f"Benchmarks (`make bench`, run {meta.get('run')}, {meta.get('date')}, {meta.get('machine')}, "
           f"{meta.get('total_seconds')} s{', --quick counts' if meta.get('quick') else ''}). "
           f"Operator: {meta.get('operator')}. Each figure was measured in the same run as its floor (a minimal "
           "asyncio/aiohttp client making the same writes, bench/floor.py) and, where there is one, its Go peer "
           "(built from source in the run, testsupport/peer_build.py); per-event figures alternate the sides event by "
           "event so they see the same noise.", ""]
    peers = results.get("peers") or {}
    out.append(latency_table(results, peers))
    out.append(convergence_table(results))
    out.append(scale_table(results))
    out.append(memory_table(results))
    out.append(waves_table(results))
    out.append(tenants_table(results))
    out.append(takeover_table(results))
    out.append(api_table(results))
    out.append(logs_table(results))
    out.append(peers_table(peers))
    for section, why in (meta.get("rerun_sections") or {}).items():
        out.append(f"`{section}`: {why}.\n")
    return "\n".join(out)


def _peer_lat(peers: dict[str, Any], peer: str, key: str) -> tuple[dict[str, Any] | None, str]:
    p = peers.get(peer) or {}
    if isinstance(p.get(key), dict):
        return p[key]["latency"], ""
    if isinstance(p.get("peer"), str):
        return None, p["peer"]
    return None, ""


def latency_table(results: dict[str, Any], peers: dict[str, Any]) -> str:
    t = Table("Latency (one change at a time)", ["Measure", "Ours", "Floor", "Peer", "Target", "Result"])
    cp = results.get("copyrator_latency") or {}
    rows: list[tuple[str, dict[str, Any] | None, tuple[dict[str, Any] | None, str], bool]] = [
        ("Immortal: pod deleted → replacement created", results.get("immortal_latency"), (None, "none"), False),
        ("Copyrator: namespace created → copy exists", cp.get("namespace_created") if not err(cp) else cp,
         _peer_lat(peers, "replicator", "replicator"), False),
        ("Copyrator: source edited → 5 copies updated", cp.get("source_edited") if not err(cp) else cp,
         (None, "none"), False),
        ("Re-roller: ConfigMap edited → template patched (debounce 0)", results.get("reroller_latency"),
         _peer_lat(peers, "reloader", "reloader"), False),
        ("Re-roller, defaults (debounce 2 s, min interval 10 s)", results.get("reroller_latency_defaults"),
         _peer_lat(peers, "reloader", "reloader"), True),
    ]
    for label, r, (peer, peer_why), by_design in rows:
        if e := err(r):
            t.row(label, e)
            continue
        assert r is not None
        o, f = r["operator"], r["floor"]
        p50_peer = ms(peer, "p50_ms") or peer_why
        p99_peer = ms(peer, "p99_ms") or ("" if peer_why == "none" else peer_why)
        design = "n/a (the 2 s debounce is by design)"
        t.row(f"{label}: p50", f"{o['p50_ms']} ms", f"{f['p50_ms']} ms", p50_peer,
              f"≤ 2x floor ({2 * f['p50_ms']:.1f} ms)",
              design if by_design else judge(o["p50_ms"], 2 * f["p50_ms"], " ms"))
        t.row(f"{label}: p99 (n={o['n']})", f"{o['p99_ms']} ms", f"{f['p99_ms']} ms", p99_peer, "≤ 250 ms",
              design if by_design else judge(o["p99_ms"], 250, " ms"))
    return t.text()


def convergence_table(results: dict[str, Any]) -> str:
    n = (results.get("meta") or {}).get("counts", {})
    t = Table("Convergence (one burst)", ["Measure", "Ours", "Floor", "Peer", "Target", "Result"])
    for label, r in ((f"{n.get('ics')} ImmortalContainers created", results.get("immortal_convergence")),
                     (f"1 CopyratorRule → {n.get('namespaces')} namespaces", results.get("copyrator_convergence")),
                     (f"1 ConfigMap → {n.get('deployments')} Deployments", results.get("reroller_convergence"))):
        if e := err(r):
            t.row(label, e)
            continue
        assert r is not None
        t.row(label, f"{r['operator_s']} s", f"{r['floor_s']} s", "", f"≤ 1.5x floor ({1.5 * r['floor_s']:.2f} s)",
              judge(r["operator_s"], 1.5 * r["floor_s"], " s"))
    return t.text()


def scale_table(results: dict[str, Any]) -> str:
    sc = results.get("scale")
    t = Table("Scale: one event as the cluster fills with unrelated objects",
              ["Measure", "Ours", "Floor", "Peer", "Target", "Result"],
              "Ratios are the top level over the empty cluster; CPU per event is utime+stime of the process "
              "(/proc/<pid>/stat) over the event; requests from the audit log.")
    if e := err(sc):
        t.row("scale", e)
        return t.text()
    assert sc is not None
    detail: list[str] = []
    for key, label, unit in (("immortal", "Immortal: pod deleted → replacement", "unrelated_pods"),
                             ("copyrator", "Copyrator: namespace created → copy", "namespaces")):
        r = sc.get(key) or {}
        if e := err(r):
            t.row(label, e)
            continue
        levels = r["levels"]
        top = levels[-1][unit]
        ratio, fratio = r.get("ratio_top_vs_empty") or {}, r.get("floor_ratio_top_vs_empty") or {}
        not_loaded = str(r.get("operator", "not run"))

        def ours(k: str, ratio: dict[str, Any] = ratio, not_loaded: str = not_loaded) -> str:
            return f"{ratio[k]}x" if ratio else not_loaded
        t.row(f"{label}: p50 latency at {top:,} {unit.replace('_', ' ')} vs 0", ours("p50"),
              f"{fratio.get('p50')}x", "", "≤ 1.3x", judge(ratio.get("p50"), 1.3, "x") if ratio else "n/a")
        t.row(f"{label}: p99 latency, same", ours("p99"), f"{fratio.get('p99')}x", "", "(report)", "")
        t.row(f"{label}: CPU per event, same", ours("cpu"), f"{fratio.get('cpu')}x", "", "≤ 1.3x",
              judge(ratio.get("cpu"), 1.3, "x") if ratio else "n/a")
        if ratio.get("requests") is not None:
            t.row(f"{label}: requests per event, same", ours("requests"), "", "", "≤ 1.3x",
                  judge(ratio["requests"], 1.3, "x"))
        rt = r.get("requests_target")
        if rt:
            top_api = levels[-1]["operator"]["api_per_event"]
            t.row(f"{label}: requests per event at {top:,}", verbs(top_api["by_verb_resource"]), "", "",
                  rt["target"], "pass" if rt["pass"] else "**miss**")
        detail += [f"{label} — per level (n = {r['events_per_level']} events per level per side):", "",
                   "| Level | Ours p50 / p99 | Ours CPU/event | Ours requests/event | Ours RSS | Floor p50 / p99 "
                   "| Floor CPU/event | Floor RSS | Objects created in |", "|---|---|---|---|---|---|---|---|---|"]
        for lv in levels:
            o, f = lv.get("operator"), lv["floor"]
            made = lv.get("pods_created_s", lv.get("namespaces_created_s"))
            detail.append(
                f"| {lv[unit]:,} | " + (f"{o['latency']['p50_ms']} / {o['latency']['p99_ms']} ms | "
                                        f"{o['cpu_per_event']['mean_ms']} ms | {o['api_per_event']['requests']} "
                                        f"({verbs(o['api_per_event']['by_verb'])}) | {o['rss_mb']} MB | "
                                        if o else "not loaded | | | | ")
                + f"{f['latency']['p50_ms']} / {f['latency']['p99_ms']} ms | {f['cpu_per_event']['mean_ms']} ms | "
                  f"{f['rss_mb']} MB | {made} s |")
        detail.append("")
        if key == "immortal" and (fr := r.get("foreign_ratio_top_vs_empty")):
            foreign_label = "Immortal: a foreign pod in the way deleted → our pod"
            t.row(f"{foreign_label}: p50 latency at {top:,} unrelated pods vs 0", f"{fr['p50']}x", "", "", "≤ 1.3x",
                  judge(fr["p50"], 1.3, "x"))
            t.row(f"{foreign_label}: CPU per event, same", f"{fr['cpu']}x", "", "", "≤ 1.3x",
                  judge(fr["cpu"], 1.3, "x"))
            detail += [f"{foreign_label} — per level (the process's CPU while it follows the foreign pod, per second "
                       "of the hold):", "", "| Level | p50 / p99 | CPU/event | requests/event | CPU while following |",
                       "|---|---|---|---|---|"]
            for lv in levels:
                if fo := lv.get("foreign"):
                    detail.append(f"| {lv[unit]:,} | {fo['latency']['p50_ms']} / {fo['latency']['p99_ms']} ms | "
                                  f"{fo['cpu_per_event']['mean_ms']} ms | {fo['api_per_event']['requests']} "
                                  f"({verbs(fo['api_per_event']['by_verb_resource'])}) | "
                                  f"{fo['cpu_while_following_ms_per_s']['mean_ms']} ms/s |")
            detail.append("")
    return t.text() + "\n" + "\n".join(detail)


def memory_table(results: dict[str, Any]) -> str:
    t = Table("Memory (RSS of the operator process, from /proc/<pid>/status)",
              ["Measure", "Ours", "Floor", "Peer", "Target", "Result"])
    mem = results.get("memory") or {}
    if e := err(mem):
        t.row("Memory", e)
    else:
        t.row("Idle RSS (HWM), one object per operator", f"{mem['idle_rss_mb']} MB ({mem['idle_hwm_mb']} MB)", "",
              "", f"≤ {mem.get('target_idle_mb', 85)} MB", judge(mem["idle_rss_mb"], mem.get("target_idle_mb", 85),
                                                                 " MB"))
        o = mem["objects"]
        t.row(f"Growth with {o['pods']:,} unrelated pods + {o['configmaps']:,} ConfigMaps + {o['secrets']:,} Secrets "
              f"(RSS {mem['loaded_rss_mb']} MB)", f"+{mem['growth_mb']} MB", "", "",
              f"≤ {mem.get('target_growth_mb', 15)} MB", judge(mem["growth_mb"], mem.get("target_growth_mb", 15),
                                                               " MB"))
        if st := mem.get("start_with_objects"):
            t.row(f"A start with those objects in place: high-water (quiet after {st['quiet_after_s']} s)",
                  f"{st['hwm_mb']} MB", "", "", f"≤ {st['chart_limit_mb']:.0f} MB (the chart's limit)",
                  judge(st["hwm_mb"], st["chart_limit_mb"], " MB"))
    cp = ((results.get("scale") or {}).get("copyrator") or {})
    nm = cp.get("memory_with_namespaces")
    if nm:
        t.row(f"Growth at {nm['namespaces']:,} namespaces with one copy each (RSS {nm['rss_mb']} MB)",
              f"+{nm['growth_mb']} MB", "", "", f"≤ {nm['target_mb']} MB",
              judge(nm["growth_mb"], nm["target_mb"], " MB"))
    elif cp:
        t.row("Growth at 3,000 namespaces with one copy each", err(cp) or cp.get("operator", "not measured"))
    return t.text()


def waves_table(results: dict[str, Any]) -> str:
    r = results.get("reroller_waves")
    t = Table("Progressive rollouts (the floor: the immediate rollout of the same run)",
              ["Measure", "Progressive", "Immediate", "Peer"], r.get("what", "") if r and not err(r) else "")
    if e := err(r):
        t.row("Re-roller waves", e)
        return t.text()
    assert r is not None
    p, i = r["progressive"], r["immediate"]
    n = p["deployments"]
    peer = "none (no Go peer rolls in waves)"
    t.row(f"ConfigMap edited → the last of {n} rollouts written", f"{p['last_rollout_s']} s",
          f"{i['last_rollout_s']} s", peer)
    t.row(f"ConfigMap edited → all {n} rollouts finished", f"{p['all_finished_s']} s", f"{i['all_finished_s']} s",
          "")
    t.row("Waves seen (sizes)", f"{p['waves']} ({', '.join(map(str, p['wave_sizes']))})", str(i["waves"]), "")
    t.row("The gate: earlier waves finished → the next wave's first rollout, p50 / max",
          f"{p.get('release_p50_s', '?')} / {p.get('release_max_s', '?')} s", "", "")
    for key, label in (("writes", "Writes"), ("reads", "Reads")):
        t.row(f"{label} per workload during the change", p["api_per_workload"][key], i["api_per_workload"][key], "")
    return t.text()


def tenants_table(results: dict[str, Any]) -> str:
    t = Table("One tenant against the others", ["Measure", "Ours", "Floor", "Peer", "Target", "Result"])
    fair = results.get("reroller_fairness")
    if e := err(fair):
        t.row("Re-roller fairness", e)
    else:
        assert fair is not None
        interval = fair["token_interval_ms"]
        diff = fair.get("ours_minus_floor")
        if diff is None:  # a result from before the floor was measured beside ours
            t.row("Quiet namespace's rollout during the flood: extra delay over the same edit alone, worst",
                  f"{fair['worst_extra_ms']} ms", "", "", f"≤ one token interval ({interval:.0f} ms)",
                  judge(fair["worst_extra_ms"], interval, " ms"))
        else:
            sent = fair.get("write_sent_later_than_floor")
            if sent is not None:
                t.row(f"Quiet namespace's edit during a flood of {fair['flood_floor_s']} s of rollouts → its PATCH "
                      "received by the API server, ours minus the floor's (edited at the same moment): p50 / max "
                      f"(rounds: {', '.join(map(str, sent['rounds_ms']))})", f"{sent['p50_ms']} / {sent['max_ms']} ms",
                      "", "", f"≤ one token interval ({interval:.0f} ms)", judge(sent["max_ms"], interval, " ms"))
            t.row("The same, end to end (edit → pod template changed, as the harness's watch sees it), ours minus "
                  f"the floor's: p50 / max (rounds: {', '.join(map(str, diff['rounds_ms']))})",
                  f"{diff['p50_ms']} / {diff['max_ms']} ms", "", "", "",
                  "" if sent is not None else judge(diff["max_ms"], interval, " ms"))
            ours_ph, floor_ph = fair.get("ours_patch_phases") or {}, fair.get("floor_patch_phases") or {}
            for part, label in (("edit_to_patch_received", "edit → its PATCH received by the API server"),
                                ("patch_at_api_server", "its PATCH received → answered (the API server's)")):
                cells = [f"{x[part]['p50_ms']} / {x[part]['max_ms']} ms" if part in x else ""
                         for x in (ours_ph, floor_ph)]
                t.row(f"During the flood, {label}: p50 / max", *cells, "", "", "")
            if busy := fair.get("flood_loop_busy"):
                t.row(f"During the flood ({fair['flood_s']} s, {fair.get('flood_events_per_rollout')} Deployment "
                      "events per rollout): the process's event-loop thread busy", f"{busy['operator']:.0%}",
                      f"{busy['floor']:.0%}", "", "", "")
            for label, ours, floor in (("during the flood", "flooded", "floor_flooded"),
                                       ("alone (no flood)", "alone", "floor_alone")):
                t.row(f"Quiet namespace's rollout {label}, edit → pod template changed: p50 / max",
                      f"{fair[ours]['p50_ms']} / {fair[ours]['max_ms']} ms",
                      f"{fair[floor]['p50_ms']} / {fair[floor]['max_ms']} ms", "", "", "")
    abuse = results.get("tenant_abuse")
    if e := err(abuse):
        t.row("Event-loop lag under a tenant's abuse", e)
    else:
        assert abuse is not None
        quiet, abused = abuse["lag_quiet"], abuse["lag_abuse"]
        t.row(f"Event-loop lag (largest in the last 10 s, read every second), quiet ({quiet['n']} s) → under a "
              f"tenant's abuse ({abused['n']} s; written as the {abuse['writer']}): p50 / max",
              f"{quiet['p50_ms']} / {quiet['max_ms']} ms → {abused['p50_ms']} / {abused['max_ms']} ms", "", "", "", "")
        t.row("A bystander's ConfigMap edit → its Deployment's pod template changed, quiet → under the abuse "
              f"(edited {abuse.get('bystander_abuse_edited_after_s', '?')} s after the abuse's first write)",
              f"{abuse['bystander_quiet_ms']} → {abuse['bystander_abuse_ms']} ms", "", "", "", "")
    restart = results.get("restart_configmaps")
    if e := err(restart):
        t.row("Restart with a tenant's ConfigMaps in place", e)
    else:
        assert restart is not None
        first = restart.get("start_first_handler_s")
        t.row(f"A start with {restart['configmaps']:,} ConfigMaps in place: high-water (handlers run after "
              f"{first} s, quiet after {restart['start_quiet_after_s']} s; "
              f"{restart.get('steady_rss_mb')} MB at rest)", f"{restart['start_hwm_mb']} MB", "", "",
              f"≤ {restart['chart_limit_mb']:.0f} MB (the chart's limit)",
              judge(restart["start_hwm_mb"], restart["chart_limit_mb"], " MB"))
    pushes = results.get("push_bytes")
    if e := err(pushes):
        t.row("A start with a tenant's 1 MiB pushes in place", e)
    elif pushes is not None:
        start, before = pushes["start"], pushes.get("baseline")
        t.row(f"A start with {pushes['configmaps']} ConfigMaps of {pushes['data_bytes']:,} bytes pushing at namespaces "
              f"that never consented: high-water (quiet after {start['quiet_after_s']} s; {start['rss_mb']} MB at "
              f"rest)", f"{start['hwm_mb']} MB", f"before: {before['hwm_mb']} MB" if before else "", "",
              f"≤ {pushes['chart_limit_mb']:.0f} MB (the chart's limit)",
              judge(start["hwm_mb"], pushes["chart_limit_mb"], " MB"))
    return t.text()


def takeover_table(results: dict[str, Any]) -> str:
    r = results.get("takeover")
    t = Table("High availability on the Lease", ["Measure", "Ours", "Target", "Result"],
              r.get("what", "") if r else "")
    if e := err(r):
        t.row("Takeover", e)
        return t.text()
    assert r is not None
    for sig, target in (("sigkill", 15.0), ("sigterm", 3.0)):
        x = r[sig]
        t.row(f"{sig.upper()} of the holder → the new holder's first write (acting after {x['acting_after_s']} s; "
              f"pod creates by it: {x['pod_creates_by_new_holder']})", f"{x['first_write_after_s']} s",
              f"≤ {target:.0f} s", judge(x["first_write_after_s"], target, " s"))
    t.row(f"Warm standby at rest ({r['window_seconds']} s): requests/min, writes but the Lease's, RSS",
          f"{r['standby_requests_per_minute']}/min, {r['standby_writes_but_the_lease']}, {r['standby_rss_mb']} MB",
          f"holder: {r['holder_requests_per_minute']}/min, {r['holder_rss_mb']} MB", "")
    return t.text()


def api_table(results: dict[str, Any]) -> str:
    t = Table("API requests per handled change (ours, from the audit log)",
              ["Change", "Requests", "Writes", "Reads", "By verb and resource", "Target", "Result"])
    cp = results.get("copyrator_latency") or {}
    sc = results.get("scale") or {}

    def row(label: str, a: dict[str, Any] | None, target: str, ok: bool | None, per: float = 1) -> None:
        if not a:
            return
        t.row(label, round(a["requests"] / per, 2), round(a["writes"] / per, 2), round(reads(a) / per, 2),
              ", ".join(f"{k} {round(v / per, 2)}" for k, v in a["by_verb_resource"].items()), target,
              "n/a" if ok is None else ("pass" if ok else "**miss**"))

    def get(r: dict[str, Any] | None) -> dict[str, Any] | None:
        return (r or {}).get("api_per_change")

    def reads(a: dict[str, Any] | None) -> float:
        return sum(v for k, v in (a or {}).get("by_verb", {}).items() if k in ("get", "list"))

    a = get(results.get("immortal_latency"))
    if a:
        by = a["by_verb_resource"]
        st = sum(v for k, v in by.items() if k.startswith("patch ") and k.endswith("/status"))
        row("pod deleted (immortal)", a, "1 create + ≤ 1 status patch, 0 reads",
            by.get("create pods", 0) <= 1.1 and st <= 1.1 and reads(a) == 0)
    a = get(cp.get("namespace_created"))
    if a:
        row("namespace created (copyrator)", a, "1 create per copy, 0 reads",
            a["by_verb_resource"].get("create configmaps", 0) == 1 and reads(a) == 0)
    a = get(cp.get("source_edited"))
    if a:
        k = cp["source_edited"].get("copies", 5)
        w = sum(v for kk, v in a["by_verb_resource"].items()
                if kk.split()[0] in ("update", "patch") and kk.split()[1] == "configmaps")
        row(f"source edited, per copy ({k} copies) (copyrator)", a, "1 write per copy, 0 reads",
            abs(w / k - 1) < 0.05 and reads(a) == 0, per=k)
    a = get(results.get("reroller_latency"))
    row("ConfigMap edited (re-roller)", a, "(report)", None)
    for label, key in (("pod deleted at the top scale level (immortal)", "immortal"),
                       ("namespace created at the top scale level (copyrator)", "copyrator")):
        r = sc.get(key) or {}
        if r.get("requests_target") and r.get("levels"):
            row(label, r["levels"][-1]["operator"]["api_per_event"], r["requests_target"]["target"],
                r["requests_target"]["pass"])
    conv = (("per ImmortalContainer (convergence)", (results.get("immortal_convergence") or {}).get("operator", {})
             .get("api")),
            ("per namespace (copyrator convergence)", (results.get("copyrator_convergence") or {}).get("api")),
            ("per Deployment (re-roller convergence)", (results.get("reroller_convergence") or {}).get("api")))
    for label, r in conv:
        if r:
            t.row(label, r["total_per_change"], r["writes_per_change"], "", verbs(r["by_verb_per_change"]),
                  "(report)", "")
    idle = results.get("idle") or {}
    if "requests" in idle:
        t.row(f"when idle ({idle['window_seconds']} s, 1 object per operator)",
              f"{idle['requests']['total']} ({idle['requests_per_minute']}/min)", idle["writes"],
              idle["requests"].get("reads", ""), verbs(idle["requests"]["by_verb_resource"]), "0 writes",
              "pass" if idle["writes"] == 0 else "**miss**")
    return t.text()


def logs_table(results: dict[str, Any]) -> str:
    t = Table("Log lines at the default level (no --verbose)", ["Measure", "Ours", "Floor", "Peer", "Target", "Result"])
    r = results.get("quiet_logs")
    if e := err(r):
        t.row("Log lines", e)
    else:
        assert r is not None
        t.row(f"Lines written during {r['changes']} changes to objects no operator cares about", r["lines"], "", "",
              f"{r['target_lines']}", judge(r["lines"], r["target_lines"], " lines"))
        if r.get("sample"):
            t.lines.append("")
            t.lines.append("First lines: " + "; ".join(f"`{s[:160]}`" for s in r["sample"][:5]))
    return t.text()


def peers_table(peers: dict[str, Any]) -> str:
    t = Table("Go peers, side by side (built from source in the same run)",
              ["Measure", "Ours", "Ours (shipped defaults)", "Peer", "Note"])
    if e := err(peers):
        t.row("peers", e)
        return t.text()
    for key, peer_key, label, ours_keys in (
            ("reloader", "reloader", "Re-roller vs stakater Reloader: ConfigMap edited → template changed",
             ("ours_debounce_0", "ours_defaults")),
            ("replicator", "replicator", "Copyrator vs mittwald replicator: namespace created → copy exists",
             ("ours", None))):
        r = peers.get(key) or {}
        if e := err(r):
            t.row(label, e)
            continue
        peer = r.get(peer_key)
        info = r.get("peer")
        note = (f"{info['repo']}@{info['commit'][:12]} {' '.join(info['args'])}" if isinstance(info, dict)
                else (info or ""))
        ours = r.get(ours_keys[0]) or r.get("ours")
        dflt = r.get(ours_keys[1]) if ours_keys[1] else None

        def cell(x: Any, f: str) -> str:
            if not isinstance(x, dict):
                return str(x) if x else ""
            if f == "lat":
                return f"{x['latency']['p50_ms']} / {x['latency']['p99_ms']} ms (n={x['latency']['n']})"
            if f == "cpu":
                return f"{x['cpu_per_event']['mean_ms']} ms"
            if f == "req":
                return f"{x['api_per_event']['requests']} ({verbs(x['api_per_event']['by_verb'])})"
            return f"{x['rss_mb']} MB"
        for f, what in (("lat", "latency p50 / p99"), ("cpu", "CPU per event"), ("req", "requests per event"),
                        ("rss", "RSS after")):
            t.row(f"{label}: {what}", cell(ours, f), cell(dflt, f), cell(peer, f) or (info if isinstance(info, str)
                                                                                        else ""),
                  note if f == "lat" else "")
    return t.text()
