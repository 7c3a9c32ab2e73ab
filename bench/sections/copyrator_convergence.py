"""copyrator_convergence: one CopyratorRule created -> its ConfigMap copied into m existing namespaces
(floor: its source ConfigMap created -> the same copies under another name).
BENCH_PYSPY=<file>: record the operator until its copies are seen (``harness.py_spy``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness import RULE_PATH, Bench, Floor, collect, convergence, per_change, py_spy, py_spy_stop, within
from bench.kube import Watcher, bounded


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("copyrator"):
        return skipped
    m = b.n["namespaces"]
    run_id = b.run
    src = await b.namespace(f"bench-cpc-{run_id}")
    await b.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
        "metadata": {"name": "conv-src", "labels": {"bench-conv": run_id}}, "data": {"k": "v"}})
    targets = [f"bench-cpc-{run_id}-{j}" for j in range(m)]
    t_ns = time.monotonic()
    await bounded(32, [b.namespace(ns, {"bench-cpc-target": run_id}) for ns in targets])
    ns_created = time.monotonic() - t_ns
    await asyncio.sleep(2)
    if b.operator:
        await b.operator.settle()
    results: dict[str, Any] = {"namespaces_created_s": round(ns_created, 2)}
    timings: dict[str, float] = {}
    for side, copy_name in (("op", "conv-src"), ("floor", "floor-conv-src")):
        seen: set[str] = set()
        watcher = Watcher(b.kube, "/api/v1/configmaps", {"fieldSelector": f"metadata.name={copy_name}"})
        watcher.listeners.append(collect(seen, lambda t, o: o["metadata"]["namespace"] != src
                                         and t != "DELETED", key="namespace"))
        await watcher.start()
        done = watcher.expect(lambda t, o, _, seen=seen: len(seen) >= m)
        mark = b.a.mark()
        if side == "op":
            spy = await py_spy(b.operator.p.pid) if b.operator else None
            t0 = time.monotonic()
            await b.kube.create(f"{RULE_PATH}/namespaces/{src}/copyrators", {
                "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "conv"},
                "spec": {"ruleType": "configmap", "selector": {"bench-conv": run_id}, "namespace": [src],
                         "namespaceSelector": {"matchLabels": {"bench-cpc-target": run_id}}}})
            timings[side] = await within(done, 600, f"{m} copies") - t0
            await py_spy_stop(spy)
            results["api"] = per_change(await b.a.count(mark), m)
        else:
            async with Floor("copyrator", "--source-namespace", src, "--source", "floor-conv-src",
                             "--ns-label", f"bench-cpc-target={run_id}", "--copy-name", "floor-conv-src"):
                t0 = time.monotonic()
                await b.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
                    "metadata": {"name": "floor-conv-src"}, "data": {"k": "v"}})
                timings[side] = await within(done, 600, f"{m} floor copies") - t0
        await watcher.stop()
    await b.kube.delete(f"{RULE_PATH}/namespaces/{src}/copyrators/conv")
    await b.gone(f"{RULE_PATH}/namespaces/{src}/copyrators/conv", 300)
    await b.cleanup([src, *targets], wait=300)
    return {**convergence(timings["op"], timings["floor"], {},
                          f"one CopyratorRule created -> its ConfigMap copied into {m} existing namespaces "
                          "(floor: the source ConfigMap created -> the same copies; writes 16 at a time)"),
            **results}
