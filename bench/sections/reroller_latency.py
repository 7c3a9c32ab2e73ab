"""reroller_latency: ConfigMap data edited -> the Deployment's pod template changed, operator and floor
alternating; reroller_latency_defaults: the same with the shipped debounce (2 s) and minimum interval."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.harness import FLOOR_LABEL, RR, Bench, Floor, deployment, latency, log, timed_change
from bench.kube import Watcher


def template_annotations(o: dict[str, Any]) -> dict[str, str]:
    return dict(((o.get("spec") or {}).get("template") or {}).get("metadata", {}).get("annotations") or {})


def template_changed(name: str, last: dict[str, Any]) -> Callable[[str, dict[str, Any], float], bool]:
    """True once Deployment ``name``'s pod-template annotations differ from the last seen (any key, so the
    figure does not depend on the annotation a re-roller writes)."""
    def check(t: str, o: dict[str, Any], _: float) -> bool:
        if o["metadata"]["name"] != name or t == "DELETED":
            return False
        ann = template_annotations(o)
        if ann != last.get(name):
            last[name] = ann
            return True
        return False
    return check


async def baseline(b: Bench, deps: Watcher, name: str, timeout: float = 60) -> None:
    """Wait for the re-roller's first sighting of an opted-in Deployment (its observed-hash annotation);
    a re-roller that records no such annotation gets the operator's quiet instead."""
    seen = deps.expect(lambda t, o, _: o["metadata"]["name"] == name
                       and f"{RR}/observed-hash" in (o["metadata"].get("annotations") or {}))
    try:
        await asyncio.wait_for(seen, timeout)
    except TimeoutError:
        log(f"  no {RR}/observed-hash on {name} after {timeout}s: waiting for the operator's quiet instead")
        assert b.operator
        await b.operator.settle()


async def run(b: Bench, n: int | None = None, label: str = "", pause: float = 0.0) -> dict[str, Any]:
    if skipped := b.not_loaded("reroller"):
        return skipped
    n = n or b.n["events"]
    ns = await b.namespace(f"bench-rrl{label}-{b.run}")
    for cm in ("lat-cfg", "floor-cfg"):
        await b.kube.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": cm}, "data": {"v": "0"}})
    deps = await Watcher(b.kube, f"/apis/apps/v1/namespaces/{ns}/deployments").start()
    cms = await Watcher(b.kube, f"/api/v1/namespaces/{ns}/configmaps").start()
    await b.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment("lat", "lat-cfg", True))
    floor_dep = deployment("floor-lat", "floor-cfg", False)
    floor_dep["metadata"]["labels"] = {FLOOR_LABEL: "reroller"}
    await b.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", floor_dep)
    await baseline(b, deps, "lat")
    op_lat: list[float] = []
    floor_lat: list[float] = []
    audit: Counter[str] = Counter()
    last: dict[str, Any] = {}
    for name in ("lat", "floor-lat"):
        dep = await b.kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
        last[name] = template_annotations(dep)
    async with Floor("reroller", "--namespace", ns, "--source", "floor-cfg",
                     "--workload-label", f"{FLOOR_LABEL}=reroller"):
        await asyncio.sleep(1)
        for i in range(1, n + 1):
            for side in (("op", "floor") if i % 2 else ("floor", "op")):
                dep_name, cm = ("lat", "lat-cfg") if side == "op" else ("floor-lat", "floor-cfg")
                done = deps.expect(template_changed(dep_name, last))
                edited = cms.expect(lambda t, o, _, cm=cm, v=str(i): o["metadata"]["name"] == cm
                                    and (o.get("data") or {}).get("v") == v)
                await timed_change(b, b.kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/{cm}",
                                                         {"data": {"v": str(i)}}),
                                   done, edited, f"{dep_name}'s pod template to change",
                                   op_lat if side == "op" else floor_lat, audit if side == "op" else None)
            await asyncio.sleep(pause)
    await deps.stop()
    await cms.stop()
    await b.cleanup([ns])
    return latency(op_lat, floor_lat, audit, n,
                   "ConfigMap data edited (from the PATCH response) -> the Deployment's pod template annotations "
                   "changed, seen on a watch")


async def run_defaults(b: Bench) -> dict[str, Any]:
    """With the shipped defaults (debounce 2 s, min interval 10 s), edits 11 s apart."""
    if skipped := b.not_loaded("reroller"):
        return skipped
    b.restart_operator(env={})
    try:
        result = await run(b, n=b.n["default_events"], label="d", pause=11.0)
    finally:
        b.restart_operator()
    result["note"] = ("operator with the defaults REROLLER_DEBOUNCE_SECONDS=2, REROLLER_MIN_INTERVAL_SECONDS=10; "
                      "edits 11 s apart so that the minimum interval does not add to the figure")
    return result
