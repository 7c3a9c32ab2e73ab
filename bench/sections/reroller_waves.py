"""reroller_waves: one ConfigMap used by n Deployments of one replica each (on the KWOK node, so their
rollouts finish) edited -> every Deployment rolled and finished its rollout; once with an immediate
rollout (every user at once), once progressive (``rollout: progressive``, ``first-wave: "1"``: waves of
1, 2, 4…, each after the earlier ones finished). No Go peer rolls in waves: the floor is the immediate
rollout of the same run.
"""

from __future__ import annotations

import math
import time
from typing import Any

from bench.harness import Bench, deployment, log, on_kwok, within
from bench.kube import Watcher, bounded
from bench.sections.reroller_latency import template_annotations
from kopf_operators.core.rollouts import in_progress, rollout_status
from kopf_operators.reroller.settings import CONFIG_HASH, FIRST_WAVE, OBSERVED_HASH, ROLLOUT
from kopf_operators.reroller.waves import PROGRESSIVE, wave_sizes
from testsupport.stats import percentile

PEER = "none: no Go peer rolls a change in waves; the floor is the immediate rollout of the same run"


def finished(o: dict[str, Any]) -> bool:
    """Whether the Deployment's rollout is over as ``kubectl rollout status`` tells it: its controller saw
    the newest spec, every replica is updated and available, and no old replica is left."""
    meta, spec, status = o.get("metadata") or {}, o.get("spec") or {}, o.get("status") or {}
    desired = spec["replicas"] if spec.get("replicas") is not None else 1
    updated = status.get("updatedReplicas") or 0
    return ((status.get("observedGeneration") or 0) >= (meta.get("generation") or 0) and updated >= desired
            and (status.get("replicas") or 0) <= updated and (status.get("availableReplicas") or 0) >= updated)


def gate_done(o: dict[str, Any]) -> bool:
    """Whether the re-roller's gate counts the Deployment's rollout as finished (its own reading)."""
    return not in_progress(rollout_status("Deployment", o))


def waves_seen(rolled: dict[str, float], done: dict[str, float]) -> list[int]:
    """The waves' sizes as the rollouts show them: a rollout opens a new wave when it was written after
    every rollout written before it had finished (``done``: when; missing: never). Rollouts of one wave
    are written back to back, so a wave-mate finishing first does not split a wave unless the writes
    stall for as long as a rollout takes."""
    sizes: list[int] = []
    last_done = -math.inf
    for name in sorted(rolled, key=lambda k: rolled[k]):
        if not sizes or rolled[name] >= last_done:
            sizes.append(1)
        else:
            sizes[-1] += 1
        last_done = max(last_done, done.get(name, math.inf))
    return sizes


def timeline(order: list[str], sizes: list[int], rolled: dict[str, float], done: dict[str, float],
             t0: float) -> list[dict[str, Any]]:
    """Per wave of the gate's own order (``order`` cut by ``sizes``): when its first and last rollouts
    were written and its last one finished (seconds from ``t0``), how long after the earlier waves' last
    finish its first rollout came (the gate's release), and its rollouts written before that finish
    (``early``: none when the gate holds)."""
    waves, start = [], 0
    for size in sizes:
        members, earlier = order[start:start + size], order[:start]
        written = [rolled[k] for k in members if k in rolled]
        earlier_done = max((done.get(k, math.inf) for k in earlier), default=t0)
        entry: dict[str, Any] = {"size": size, "rolled": len(written)}
        if written:
            entry.update(first_rollout_s=round(min(written) - t0, 2), last_rollout_s=round(max(written) - t0, 2),
                         release_s=round(min(written) - earlier_done, 2),
                         early=sum(1 for w in written if w < earlier_done))
        if all(k in done for k in members):
            entry["finished_s"] = round(max(done[k] for k in members) - t0, 2)
        waves.append(entry)
        start += size
    return waves


def per_workload(counts: dict[str, Any], n: int) -> dict[str, Any]:
    return {"writes": round(counts["writes"] / n, 2), "reads": round(counts["reads"] / n, 2),
            "requests": round(counts["total"] / n, 2),
            "by_verb_resource": {k: round(v / n, 2) for k, v in counts["by_verb_resource"].items()}}


async def scenario(b: Bench, n: int, label: str, first_wave: str = "") -> dict[str, Any]:
    """n Deployments on one ConfigMap, baselined and available; then its data changed: until every one
    rolled and finished. ``first_wave``: the ConfigMap rolls progressively, with this first wave."""
    source_annotations = {ROLLOUT: PROGRESSIVE, FIRST_WAVE: first_wave} if first_wave else {}
    ns = await b.namespace(f"bench-rrw-{label[0]}-{b.run}")
    await b.kube.create(f"/api/v1/namespaces/{ns}/configmaps", {
        "metadata": {"name": "waves-cfg", "annotations": source_annotations}, "data": {"v": "0"}})
    baselined: set[str] = set()
    ready: set[str] = set()
    before: dict[str, str | None] = {}
    rolled: dict[str, float] = {}
    done: dict[str, float] = {}     # the gate's reading
    over: dict[str, float] = {}     # kubectl's reading (old replica gone too)

    def listener(t: str, o: dict[str, Any], now: float) -> None:
        name = o["metadata"]["name"]
        if t == "DELETED":
            return
        if OBSERVED_HASH in (o["metadata"].get("annotations") or {}):
            baselined.add(name)
        (ready.add if finished(o) else ready.discard)(name)
        if name not in before:
            return
        if name not in rolled and template_annotations(o).get(CONFIG_HASH) != before[name]:
            rolled[name] = now
        if name in rolled:
            if name not in done and gate_done(o):
                done[name] = now
            if name not in over and finished(o):
                over[name] = now

    deps = Watcher(b.kube, f"/apis/apps/v1/namespaces/{ns}/deployments")
    deps.listeners.append(listener)
    await deps.start()
    try:
        base = deps.expect(lambda t, o, _: len(baselined) >= n and len(ready) >= n)
        started = time.monotonic()
        bodies = []
        for j in range(n):
            d = deployment(f"w-{j:03d}", "waves-cfg", True)
            d["spec"]["replicas"] = 1
            d["spec"]["template"]["spec"] = {**on_kwok(), "containers": d["spec"]["template"]["spec"]["containers"]}
            bodies.append(d)
        await bounded(32, [b.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", d) for d in bodies])
        await within(base, 600, f"{n} Deployments baselined and available")
        baseline_s = time.monotonic() - started
        assert b.operator
        await b.operator.settle()
        listing = await b.kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments")
        before.update({o["metadata"]["name"]: template_annotations(o).get(CONFIG_HASH) for o in listing["items"]})
        all_over = deps.expect(lambda t, o, _: len(over) >= n)
        mark = b.a.mark()
        await b.kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/waves-cfg", {"data": {"v": "1"}})
        t0 = time.monotonic()
        end = await within(all_over, 1800, f"{n} Deployments rolled and finished ({label})")
        api = per_workload(await b.a.count(mark), n)
    finally:
        await deps.stop()
        await b.cleanup([ns], wait=300)
    sizes = waves_seen(rolled, done)
    log(f"  {label}: last rollout {max(rolled.values()) - t0:.1f} s, all finished {end - t0:.1f} s, waves {sizes}")
    return {"deployments": n, "baseline_s": round(baseline_s, 1),
            "last_rollout_s": round(max(rolled.values()) - t0, 2), "all_finished_s": round(end - t0, 2),
            "all_done_for_the_gate_s": round(max(done.values()) - t0, 2),
            "waves": len(sizes), "wave_sizes": sizes,
            # by kubectl's reading (old replicas gone): fewer waves would mean the gate let one go early
            "wave_sizes_by_kubectl_reading": waves_seen(rolled, over),
            "timeline": timeline(sorted(before), wave_sizes(n, int(first_wave)), rolled, done, t0)
            if first_wave else [], "api_per_workload": api}


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("reroller"):
        return skipped
    n = b.n["wave_deployments"]
    immediate = await scenario(b, n, "immediate")
    progressive = await scenario(b, n, "progressive", first_wave="1")
    releases = [w["release_s"] for w in progressive["timeline"][1:] if "release_s" in w]
    progressive.update(expected_wave_sizes=wave_sizes(n, 1),
                       release_p50_s=percentile(releases, 0.5) if releases else 0.0,
                       release_max_s=max(releases, default=0.0))
    return {"what": f"one ConfigMap used by {n} Deployments of 1 replica (KWOK node) edited -> every Deployment's "
                    f"pod template {CONFIG_HASH} changed and its rollout finished (kubectl rollout status); "
                    "operator: REROLLER_DEBOUNCE_SECONDS=0, REROLLER_MIN_INTERVAL_SECONDS=0, "
                    "REROLLER_CLUSTER_ROLLOUTS_PER_SECOND=0",
            "peer": PEER, "immediate": immediate, "progressive": progressive,
            "ratio_all_finished": round(progressive["all_finished_s"] / immediate["all_finished_s"], 2)}
