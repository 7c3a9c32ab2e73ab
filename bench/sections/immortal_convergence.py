"""immortal_convergence: m ImmortalContainers created at once -> each has its pod and startTimes 1.
One burst per side; the operator is stopped during the floor's turn (both handle ImmortalContainers)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from bench.harness import IC_PATH, Bench, Floor, collect, convergence, per_change
from bench.kube import Watcher, bounded


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("immortal"):
        return skipped
    m = b.n["ics"]
    op_s, op_extra = await burst(b, "op", m, lambda ns: contextlib.nullcontext())
    b.stop_operator()
    try:
        floor_s, floor_extra = await burst(b, "fl", m, lambda ns: Floor("immortal-cr", "--namespace", ns))
    finally:
        b.start_operator(b.operator_env)
    return convergence(op_s, floor_s, {"operator": op_extra, "floor": floor_extra},
                       f"{m} ImmortalContainers created at once (32 concurrent POSTs) -> every one has "
                       "its pod and status.startTimes 1 (seen on watches)")


async def burst(b: Bench, side: str, m: int,
                runner: Callable[[str], contextlib.AbstractAsyncContextManager[Any]]) -> tuple[float, dict[str, Any]]:
    """Create m ImmortalContainers at once in a fresh namespace, with ``runner(ns)`` (the operator, already
    running, or a floor process) reacting; seconds until every one has its pod and startTimes 1."""
    ns = await b.namespace(f"bench-immc-{side}-{b.run}")
    pods_seen: set[str] = set()
    counted: set[str] = set()
    pods = Watcher(b.kube, f"/api/v1/namespaces/{ns}/pods")
    ics = Watcher(b.kube, f"{IC_PATH}/namespaces/{ns}/immortalcontainers")
    pods.listeners.append(collect(pods_seen, lambda t, o: t != "DELETED"))
    ics.listeners.append(collect(counted, lambda t, o: (o.get("status") or {}).get("startTimes") == 1))
    await pods.start()
    await ics.start()
    done = ics.expect(lambda t, o, _: len(counted) >= m and len(pods_seen) >= m)
    done_pods = pods.expect(lambda t, o, _: len(counted) >= m and len(pods_seen) >= m)
    async with runner(ns):
        mark = b.a.mark()
        t0 = time.monotonic()
        await bounded(32, [b.kube.create(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
            "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
            "metadata": {"name": f"ic-{j}"}, "spec": {"image": "busybox:1.36"}}) for j in range(m)])
        created = time.monotonic() - t0
        finished, _ = await asyncio.wait([done, done_pods], timeout=600, return_when=asyncio.FIRST_COMPLETED)
        if not finished:
            raise TimeoutError(f"{side}: {len(counted)}/{m} counted, {len(pods_seen)}/{m} pods after 600 s")
        elapsed = next(iter(finished)).result() - t0
    extra: dict[str, Any] = {"creates_done_s": round(created, 2)}
    if side == "op":
        extra["api"] = per_change(await b.a.count(mark), m)
    await pods.stop()
    await ics.stop()
    # ImmortalContainers carry no finalizer: they go whether or not an operator runs
    await b.kube.request("DELETE", f"{IC_PATH}/namespaces/{ns}/immortalcontainers")
    await b.cleanup([ns])
    return elapsed, extra
