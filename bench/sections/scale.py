"""scale: the cost of one event as the cluster fills with objects the event has nothing to do with.

- immortal: at 0 / 10,000 / 20,000 unrelated pods (on the KWOK node, in a namespace of their own), an
  ImmortalContainer's pod deleted -> replacement pod ADDED (operator) and a floor pod deleted -> re-created
  (floor), alternating; and a foreign pod in the way: an ImmortalContainer created while a pod it does
  not own holds its name (the operator follows that pod with a watch of its name), the foreign pod
  deleted -> our pod ADDED, with the process's CPU while it follows the foreign pod (per second);
- copyrator: one CopyratorRule in the article's form (top-level ruleType/selector/namespace, so it copies
  into every namespace) at 0 / 1,000 / 3,000 / 5,000 namespaces (each with its copy), a namespace created ->
  the operator's copy and the floor's copy ADDED (both copy into every namespace, under different names).

Per event: latency (p50/p99), CPU of the process (utime+stime deltas from /proc/<pid>/stat over the event,
operator and floor alike), the operator's requests (audit log, its ServiceAccount) and RSS per level.
Levels are reached by adding to the previous level's objects (created concurrently, bounded); everything
is deleted at the end. The ratio top level / empty cluster is the figure with a target (<= 1.3x).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from typing import Any

from bench.harness import (
    BENCH_LABEL,
    FLOOR_LABEL,
    IC_PATH,
    RULE_PATH,
    Bench,
    Floor,
    api_per_change,
    log,
    origin,
    sub_sections,
    within,
)
from bench.kube import Watcher, bounded
from bench.sections.immortal_latency import starts_at
from testsupport.stats import percentile, summary_ms

RATIO_TARGET = 1.3
NS_MEMORY_TARGET_MB = 25


async def run(b: Bench) -> dict[str, Any]:
    return await sub_sections(b, "scale", (("immortal", immortal), ("copyrator", copyrator)))


def cpu_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"mean_ms": round(statistics.fmean(ms), 2), "median_ms": round(percentile(ms, 0.5), 2)}


def ratios(levels: list[dict[str, Any]], side: str = "operator") -> dict[str, Any]:
    """Top level vs the empty cluster: latency p50/p99, CPU per event, requests per event."""
    first, top = levels[0], levels[-1]
    if side not in first or side not in top:
        return {}
    out: dict[str, Any] = {
        "p50": round(top[side]["latency"]["p50_ms"] / first[side]["latency"]["p50_ms"], 2),
        "p99": round(top[side]["latency"]["p99_ms"] / first[side]["latency"]["p99_ms"], 2),
        "cpu": round(top[side]["cpu_per_event"]["mean_ms"] / max(first[side]["cpu_per_event"]["mean_ms"], 0.01), 2),
    }
    if "api_per_event" in first[side]:
        out["requests"] = round(top[side]["api_per_event"]["requests"]
                                / max(first[side]["api_per_event"]["requests"], 0.01), 2)
    out["target"] = RATIO_TARGET
    out["pass"] = out["p50"] <= RATIO_TARGET and out["cpu"] <= RATIO_TARGET
    return out


async def create_many(b: Bench, coros: list[Any], concurrency: int) -> float:
    t0 = time.monotonic()
    await bounded(concurrency, coros)
    return round(time.monotonic() - t0, 1)


async def all_running(b: Bench, ns: str, timeout: float = 900) -> float:
    """Seconds until KWOK has marked every pod of ``ns`` Running, so the node's status updates are over
    before the events are timed (setup only: a count of non-Running pods every 2 s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        pending = await b.kube.get(f"/api/v1/namespaces/{ns}/pods", fieldSelector="status.phase!=Running", limit=1)
        if not pending["items"]:
            break
        await asyncio.sleep(2)
    else:
        log(f"  pods of {ns} still not all Running after {timeout}s; timing anyway")
    return round(time.monotonic() - t0, 1)


# --- immortal ------------------------------------------------------------------------------------


async def immortal(b: Bench) -> dict[str, Any]:
    op_on = b.loaded("immortal")
    levels = list(b.n["scale_pods"])
    events = b.n["scale_events"]
    ns = await b.namespace(f"bench-scl-imm-{b.run}")
    ns_pods = await b.namespace(f"bench-scl-pods-{b.run}")
    pods = await Watcher(b.kube, f"/api/v1/namespaces/{ns}/pods").start()
    ics = await Watcher(b.kube, f"{IC_PATH}/namespaces/{ns}/immortalcontainers").start()
    expected = {"starts": 1}
    if op_on:
        ready = ics.expect(starts_at(1, "scale"))
        await b.kube.create(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
            "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
            "metadata": {"name": "scale"}, "spec": {"image": "busybox:1.36"}})
        await within(ready, 60, "the ImmortalContainer's first pod")
    await b.kube.create(f"/api/v1/namespaces/{ns}/pods", {"metadata": {
        "name": "floor-scale", "labels": {FLOOR_LABEL: "immortal"}},
        "spec": {"containers": [{"name": "acontainer", "image": "busybox:1.36"}]}})
    made = 0
    out: list[dict[str, Any]] = []

    async def pod(j: int) -> None:
        await b.create_retrying(f"/api/v1/namespaces/{ns_pods}/pods", {
            "metadata": {"name": f"p-{j}", "labels": {"app": "unrelated"}},
            "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "c", "image": "busybox:1.36"}]}})

    async with Floor("immortal", "--namespace", ns) as floor:
        for level in levels:
            log(f"  scale/immortal: {level} unrelated pods")
            created_s = await create_many(b, [pod(j) for j in range(made, level)], 64)
            made = max(made, level)
            running_s = await all_running(b, ns_pods)
            await asyncio.sleep(2)
            settled = await b.operator.settle(timeout=600) if (op_on and b.operator) else 0.0
            lat: dict[str, list[float]] = {"op": [], "floor": []}
            cpu: dict[str, list[float]] = {"op": [], "floor": []}
            audit: Counter[str] = Counter()
            sides = ("op", "floor") if op_on else ("floor",)
            for i in range(events):
                for side in (sides if i % 2 == 0 else tuple(reversed(sides))):
                    proc = b.operator.p if side == "op" and b.operator else floor.p
                    name = "scale-immortalpod" if side == "op" else "floor-scale"
                    created = pods.expect(lambda t, o, _, n=name: t == "ADDED" and o["metadata"]["name"] == n)
                    gone = pods.expect(lambda t, o, _, n=name: t == "DELETED" and o["metadata"]["name"] == n)
                    counted = ics.expect(starts_at(expected["starts"] + 1, "scale")) if side == "op" else None
                    mark = b.a.mark()
                    c0 = proc.cpu_seconds()
                    await b.kube.delete(f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
                    t0 = time.monotonic()
                    t1 = await within(created, 30, f"a new {name}")
                    t0 = await origin(t0, gone)
                    lat[side].append(t1 - t0)
                    if counted is not None:
                        await within(counted, 30, "startTimes to count the restart")
                        ic = await b.kube.get(f"{IC_PATH}/namespaces/{ns}/immortalcontainers/scale")
                        expected["starts"] = int(ic["status"]["startTimes"])
                    await asyncio.sleep(0.05)
                    cpu[side].append(proc.cpu_seconds() - c0)
                    if side == "op":
                        audit.update(b.a.requests(mark, b.a.mark()))
            entry: dict[str, Any] = {"unrelated_pods": level, "pods_created_s": created_s,
                                     "pods_running_after_s": running_s,
                                     "settled_after_s": round(settled, 1)}
            entry["floor"] = {"latency": summary_ms(lat["floor"]), "cpu_per_event": cpu_ms(cpu["floor"]),
                              "rss_mb": floor.p.rss_mb()}
            if op_on and b.operator:
                entry["operator"] = {"latency": summary_ms(lat["op"]), "cpu_per_event": cpu_ms(cpu["op"]),
                                     "api_per_event": api_per_change(audit, events), "rss_mb": b.operator.p.rss_mb()}
            if op_on and b.operator:
                entry["foreign"] = await foreign_pod(b, ns, pods, ics, b.n["scale_foreign_events"])
            out.append(entry)
            log(f"  scale/immortal @{level}: {entry}")
    await pods.stop()
    await ics.stop()
    await b.cleanup([ns, ns_pods], wait=600)
    result: dict[str, Any] = {
        "what": "pod deleted (gracePeriodSeconds=0) -> replacement pod ADDED on a watch, with N unrelated pods "
                "in the cluster; CPU per event: utime+stime of the process from the DELETE until the "
                "operator's status patch (floor: until the re-created pod) + 50 ms",
        "events_per_level": events, "levels": out}
    if op_on:
        result["ratio_top_vs_empty"] = ratios(out)
        result["foreign_ratio_top_vs_empty"] = ratios(out, "foreign")
        api = out[-1]["operator"]["api_per_event"]
        by = api["by_verb_resource"]
        status_patches = sum(v for k, v in by.items() if k.startswith("patch ") and k.endswith("/status"))
        result["requests_target"] = {
            "target": "1 create + at most 1 status patch, 0 reads per pod deleted",
            "creates_pods": by.get("create pods", 0), "status_patches": round(status_patches, 2),
            "reads": api["reads"], "other_writes": round(api["writes"] - by.get("create pods", 0) - status_patches, 2),
            # KWOK may also delete a fresh replacement (a real extra start): up to 10% extra creates allowed
            "pass": 1 <= by.get("create pods", 0) <= 1.1 and status_patches <= 1.1 and api["reads"] == 0}
    else:
        result["operator"] = "not loaded in this run (floor figures only)"
    result["floor_ratio_top_vs_empty"] = ratios(out, "floor")
    return result


HOLD_SECONDS = 5.0  # how long the foreign pod holds the name, its watch open, per sample


async def foreign_pod(b: Bench, ns: str, pods: Watcher, ics: Watcher, samples: int) -> dict[str, Any]:
    """A foreign pod in the way, ``samples`` times: the foreign pod ``fx-immortalpod`` (no label of ours)
    created, then the ImmortalContainer ``fx`` (ForeignPod); the process's CPU over HOLD_SECONDS while it
    follows the foreign pod; the foreign pod deleted (grace 0) -> our pod ADDED (latency, CPU and requests
    until it is counted); the ImmortalContainer deleted and its pod gone before the next sample."""
    assert b.operator is not None
    proc, name = b.operator.p, "fx-immortalpod"
    lat: list[float] = []
    cpu: list[float] = []
    hold_cpu: list[float] = []
    audit: Counter[str] = Counter()
    for _ in range(samples):
        await b.kube.create(f"/api/v1/namespaces/{ns}/pods", {
            "metadata": {"name": name, "labels": {"app": "not-ours"}},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}})
        blocked = ics.expect(lambda t, o, _: o["metadata"]["name"] == "fx" and any(
            c.get("reason") == "ForeignPod" for c in (o.get("status") or {}).get("conditions") or ()))
        await b.kube.create(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
            "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
            "metadata": {"name": "fx"}, "spec": {"image": "busybox:1.36"}})
        await within(blocked, 30, "ForeignPod")
        await asyncio.sleep(0.5)  # the follower's watch is open
        c0 = proc.cpu_seconds()
        await asyncio.sleep(HOLD_SECONDS)
        hold_cpu.append((proc.cpu_seconds() - c0) / HOLD_SECONDS)
        ours = pods.expect(lambda t, o, _: t == "ADDED" and o["metadata"]["name"] == name
                           and bool(o["metadata"].get("ownerReferences")))
        gone = pods.expect(lambda t, o, _: t == "DELETED" and o["metadata"]["name"] == name
                           and not o["metadata"].get("ownerReferences"))
        counted = ics.expect(starts_at(1, "fx"))
        mark = b.a.mark()
        c0 = proc.cpu_seconds()
        await b.kube.delete(f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
        t0 = time.monotonic()
        t1 = await within(ours, 30, "our pod after the foreign pod's deletion")
        t0 = await origin(t0, gone)
        lat.append(t1 - t0)
        await within(counted, 30, "the start counted")
        await asyncio.sleep(0.05)
        cpu.append(proc.cpu_seconds() - c0)
        audit.update(b.a.requests(mark, b.a.mark()))
        ours_gone = pods.expect(lambda t, o, _: t == "DELETED" and o["metadata"]["name"] == name)
        await b.kube.delete(f"{IC_PATH}/namespaces/{ns}/immortalcontainers/fx")
        await within(ours_gone, 60, "our pod garbage-collected")
    return {"latency": summary_ms(lat), "cpu_per_event": cpu_ms(cpu), "api_per_event": api_per_change(audit, samples),
            "cpu_while_following_ms_per_s": cpu_ms(hold_cpu)}


# --- copyrator -----------------------------------------------------------------------------------


async def copyrator(b: Bench) -> dict[str, Any]:
    op_on = b.loaded("copyrator")
    levels = list(b.n["scale_namespaces"])
    events = b.n["scale_events"]
    run_id = b.run
    src = await b.namespace(f"bench-scl-cp-{run_id}")
    await b.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
        "metadata": {"name": "scale-src", "labels": {"bench-scale": run_id}}, "data": {"k": "v"}})
    await b.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
        "metadata": {"name": "floor-scale-src"}, "data": {"k": "v"}})
    op_copies: set[str] = set()
    floor_copies: set[str] = set()

    def tracker(into: set[str]) -> Any:
        def listener(t: str, o: dict[str, Any], _: float) -> None:
            if o["metadata"]["namespace"] == src:
                return
            (into.discard if t == "DELETED" else into.add)(o["metadata"]["namespace"])
        return listener

    op_w = Watcher(b.kube, "/api/v1/configmaps", {"fieldSelector": "metadata.name=scale-src"})
    op_w.listeners.append(tracker(op_copies))
    floor_w = Watcher(b.kube, "/api/v1/configmaps", {"fieldSelector": "metadata.name=floor-scale-copy"})
    floor_w.listeners.append(tracker(floor_copies))
    nss = Watcher(b.kube, "/api/v1/namespaces", {"labelSelector": f"{BENCH_LABEL}={run_id}"})
    for w in (op_w, floor_w, nss):
        await w.start()
    # The article's form: fields at the top level, no namespaceSelector -> every namespace gets a copy.
    await b.kube.create(f"{RULE_PATH}/namespaces/{src}/copyrators", {
        "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "scale"},
        "ruleType": "configmap", "selector": {"bench-scale": run_id}, "namespace": [src]})
    made: list[str] = []  # every namespace of the section (levels and events)
    levelled = 0
    out: list[dict[str, Any]] = []
    base_rss: float | None = None
    memory: dict[str, Any] = {}

    async def converged(timeout: float) -> float:
        """Seconds until every namespace the section made has the operator's copy (if loaded) and the
        floor's. (The rule copies into the cluster's other namespaces too; the floor, started after its
        source, only into new ones.)"""
        t0 = time.monotonic()
        want = set(made)
        while time.monotonic() - t0 < timeout:
            missing = want - floor_copies if not op_on else (want - floor_copies) | (want - op_copies)
            if not missing:
                return round(time.monotonic() - t0, 1)
            await asyncio.sleep(1)
        raise TimeoutError(f"{len(want - op_copies) if op_on else 0} operator and {len(want - floor_copies)} "
                           f"floor copies missing after {timeout}s")

    async with Floor("copyrator", "--source-namespace", src, "--source", "floor-scale-src",
                     "--ns-label", "", "--copy-name", "floor-scale-copy") as floor:
        for level in levels:
            log(f"  scale/copyrator: {level} namespaces")
            names = [f"bench-scl-ns-{run_id}-{j}" for j in range(levelled, level)]
            created_s = await create_many(b, [b.namespace(ns) for ns in names], 32)
            made += names
            levelled = max(levelled, level)
            copies_s = await converged(timeout=max(120, level * 0.5))
            await asyncio.sleep(2)
            settled = await b.operator.settle(timeout=600) if (op_on and b.operator) else 0.0
            lat: dict[str, list[float]] = {"op": [], "floor": []}
            cpu: dict[str, list[float]] = {"op": [], "floor": []}
            audit: Counter[str] = Counter()
            for i in range(events):
                ns = f"bench-scl-ev-{run_id}-{level}-{i}"
                op_done = op_w.expect(lambda t, o, _, ns=ns: o["metadata"]["namespace"] == ns and t != "DELETED")
                fl_done = floor_w.expect(lambda t, o, _, ns=ns: o["metadata"]["namespace"] == ns and t != "DELETED")
                added = nss.expect(lambda t, o, _, ns=ns: t == "ADDED" and o["metadata"]["name"] == ns)
                mark = b.a.mark()
                oc0 = b.operator.p.cpu_seconds() if (op_on and b.operator) else 0.0
                fc0 = floor.p.cpu_seconds()
                await b.namespace(ns)
                t0 = time.monotonic()
                fl_t = await within(fl_done, 60, f"the floor's copy in {ns}")
                op_t = await within(op_done, 60, f"the operator's copy in {ns}") if op_on else None
                t0 = await origin(t0, added)
                await asyncio.sleep(0.05)
                lat["floor"].append(fl_t - t0)
                cpu["floor"].append(floor.p.cpu_seconds() - fc0)
                if op_t is not None and b.operator:
                    lat["op"].append(op_t - t0)
                    cpu["op"].append(b.operator.p.cpu_seconds() - oc0)
                    audit.update(b.a.requests(mark, b.a.mark()))
                made.append(ns)
            entry: dict[str, Any] = {"namespaces": level, "namespaces_created_s": created_s,
                                     "copies_converged_s": copies_s, "settled_after_s": round(settled, 1)}
            entry["floor"] = {"latency": summary_ms(lat["floor"]), "cpu_per_event": cpu_ms(cpu["floor"]),
                              "rss_mb": floor.p.rss_mb()}
            if op_on and b.operator:
                rss = b.operator.p.rss_mb()
                entry["operator"] = {"latency": summary_ms(lat["op"]), "cpu_per_event": cpu_ms(cpu["op"]),
                                     "api_per_event": api_per_change(audit, events), "rss_mb": rss}
                if base_rss is None:
                    base_rss = rss
                if level == b.n["memory_namespaces"]:
                    memory = {"namespaces": level, "rss_mb": rss, "empty_rss_mb": base_rss,
                              "growth_mb": round(rss - base_rss, 1), "target_mb": NS_MEMORY_TARGET_MB,
                              "pass": rss - base_rss <= NS_MEMORY_TARGET_MB}
            out.append(entry)
            log(f"  scale/copyrator @{level}: {entry}")
    for w in (op_w, floor_w, nss):
        await w.stop()
    await b.kube.delete(f"{RULE_PATH}/namespaces/{src}/copyrators/scale")
    await b.gone(f"{RULE_PATH}/namespaces/{src}/copyrators/scale", 300)
    await b.cleanup([src, *made], wait=max(300, len(made) * 0.3))
    result: dict[str, Any] = {
        "what": "namespace created (from the POST response) -> the copy ADDED on a watch, with N namespaces each "
                "holding a copy of the article-form rule's ConfigMap (and one of the floor's); CPU per event: "
                "utime+stime of the process from the POST until both copies were seen + 50 ms",
        "events_per_level": events, "levels": out}
    if op_on:
        result["ratio_top_vs_empty"] = ratios(out)
        result["foreign_ratio_top_vs_empty"] = ratios(out, "foreign")
        api = out[-1]["operator"]["api_per_event"]
        creates = api["by_verb_resource"].get("create configmaps", 0)
        result["requests_target"] = {"target": "1 create per copy, 0 reads per namespace created",
                                     "creates_configmaps": creates, "reads": api["reads"],
                                     "other_writes": round(api["writes"] - creates, 2),
                                     "pass": creates == 1 and api["reads"] == 0}
        result["memory_with_namespaces"] = memory
    else:
        result["operator"] = "not loaded in this run (floor figures only)"
    result["floor_ratio_top_vs_empty"] = ratios(out, "floor")
    return result

