"""reroller_convergence: one ConfigMap used by m Deployments edited -> all m pod templates patched."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness import FLOOR_LABEL, RR, Bench, Floor, convergence, deployment, log, per_change, within
from bench.kube import Watcher, bounded
from bench.sections.reroller_latency import template_annotations


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("reroller"):
        return skipped
    m = b.n["deployments"]
    ns = await b.namespace(f"bench-rrc-{b.run}")
    for cm in ("conv-cfg", "floor-cfg"):
        await b.kube.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": cm}, "data": {"v": "0"}})
    baselined: set[str] = set()
    current: dict[str, dict[str, str]] = {}
    before: dict[str, dict[str, str]] = {}
    rolled: dict[str, set[str]] = {"op": set(), "floor": set()}

    def listener(t: str, o: dict[str, Any], _: float) -> None:
        name = o["metadata"]["name"]
        if f"{RR}/observed-hash" in (o["metadata"].get("annotations") or {}):
            baselined.add(name)
        current[name] = template_annotations(o)
        if name in before and current[name] != before[name]:
            rolled["op" if name.startswith("op-") else "floor"].add(name)

    deps = Watcher(b.kube, f"/apis/apps/v1/namespaces/{ns}/deployments")
    deps.listeners.append(listener)
    await deps.start()
    base = deps.expect(lambda t, o, _: len(baselined) >= m)
    floor_deps = []
    for j in range(m):
        d = deployment(f"floor-{j}", "floor-cfg", False)
        d["metadata"]["labels"] = {FLOOR_LABEL: "reroller"}
        floor_deps.append(d)
    await bounded(32, [b.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                                     deployment(f"op-{j}", "conv-cfg", True)) for j in range(m)]
                  + [b.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", d) for d in floor_deps])
    try:
        await within(base, 300, f"the re-roller's baseline on {m} Deployments")
    except TimeoutError:
        log(f"  {len(baselined)}/{m} Deployments carry {RR}/observed-hash: waiting for the operator's quiet")
    assert b.operator
    await b.operator.settle()
    before.update({k: dict(v) for k, v in current.items()})
    timings: dict[str, float] = {}
    results: dict[str, Any] = {}
    for side, cm in (("op", "conv-cfg"), ("floor", "floor-cfg")):
        done = deps.expect(lambda t, o, _, side=side: len(rolled[side]) >= m)
        mark = b.a.mark()
        if side == "op":
            await b.kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/{cm}", {"data": {"v": "1"}})
            t0 = time.monotonic()
            timings[side] = await within(done, 600, f"{m} op rollouts") - t0
            await asyncio.sleep(1)
            results["api"] = per_change(await b.a.count(mark), m)
        else:
            async with Floor("reroller", "--namespace", ns, "--source", cm,
                             "--workload-label", f"{FLOOR_LABEL}=reroller"):
                await b.kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/{cm}", {"data": {"v": "1"}})
                t0 = time.monotonic()
                timings[side] = await within(done, 600, f"{m} floor rollouts") - t0
    await deps.stop()
    await b.cleanup([ns], wait=300)
    return {**convergence(timings["op"], timings["floor"], {},
                          f"one ConfigMap used by {m} Deployments edited -> all {m} pod templates patched "
                          "(operator: REROLLER_DEBOUNCE_SECONDS=0, REROLLER_MIN_INTERVAL_SECONDS=0, "
                          "REROLLER_CLUSTER_ROLLOUTS_PER_SECOND=0)"),
            **results}
