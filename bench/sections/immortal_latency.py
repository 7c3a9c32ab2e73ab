"""immortal_latency: pod deleted -> replacement pod ADDED, operator and floor alternating event by event."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.harness import FLOOR_LABEL, IC_PATH, Bench, Floor, latency, origin, within
from bench.kube import Watcher


def starts_at(k: int, name: str = "lat") -> Callable[[str, dict[str, Any], float], bool]:
    # At least k: KWOK sometimes also deletes the fresh same-name replacement (a real extra start, which
    # the operator counts too), so the count may jump past k.
    return lambda t, o, _: (o["metadata"]["name"] == name
                            and ((o.get("status") or {}).get("startTimes") or 0) >= k)


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("immortal"):
        return skipped
    n = b.n["events"]
    ns = await b.namespace(f"bench-imml-{b.run}")
    pods = await Watcher(b.kube, f"/api/v1/namespaces/{ns}/pods").start()
    ics = await Watcher(b.kube, f"{IC_PATH}/namespaces/{ns}/immortalcontainers").start()
    expected = {"starts": 1}
    ready = ics.expect(starts_at(1))
    await b.kube.create(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
        "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
        "metadata": {"name": "lat"}, "spec": {"image": "busybox:1.36"}})
    await b.kube.create(f"/api/v1/namespaces/{ns}/pods", {"metadata": {
        "name": "floor-lat", "labels": {FLOOR_LABEL: "immortal"}},
        "spec": {"containers": [{"name": "acontainer", "image": "busybox:1.36"}]}})
    await within(ready, 60, "the ImmortalContainer's first pod")
    op_lat: list[float] = []
    floor_lat: list[float] = []
    audit_total: Counter[str] = Counter()
    async with Floor("immortal", "--namespace", ns):
        await asyncio.sleep(1)
        spans: list[tuple[int, int]] = []
        for i in range(n):
            for side in (("op", "floor") if i % 2 == 0 else ("floor", "op")):
                pod = "lat-immortalpod" if side == "op" else "floor-lat"
                mark = b.a.mark()
                created = pods.expect(lambda t, o, _, pod=pod: t == "ADDED" and o["metadata"]["name"] == pod)
                counted = ics.expect(starts_at(expected["starts"] + 1)) if side == "op" else None
                gone = pods.expect(lambda t, o, _, pod=pod: t == "DELETED" and o["metadata"]["name"] == pod)
                await b.kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod}", {"gracePeriodSeconds": 0})
                t0 = time.monotonic()
                t1 = await within(created, 30, f"a new {pod}")
                t0 = await origin(t0, gone)
                (op_lat if side == "op" else floor_lat).append(t1 - t0)
                if counted is not None:
                    await within(counted, 30, "startTimes to count the restart")
                    ic = await b.kube.get(f"{IC_PATH}/namespaces/{ns}/immortalcontainers/lat")
                    expected["starts"] = int(ic["status"]["startTimes"])
                    await asyncio.sleep(0.05)
                    spans.append((mark, b.a.mark()))
        # the operator's requests during its own iterations only
        await asyncio.sleep(1.0)
        for start, end in spans:
            audit_total.update(b.a.requests(start, end))
    await pods.stop()
    await ics.stop()
    await b.cleanup([ns])
    return latency(op_lat, floor_lat, audit_total, n,
                   "pod deleted (gracePeriodSeconds=0, from the DELETE response) -> replacement pod ADDED on a watch")
