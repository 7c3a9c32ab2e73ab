"""immortal_convergence: m ImmortalContainers created at once -> each has its pod and startTimes 1.
One burst per side; the operator is stopped during the floor's turn (both handle ImmortalContainers).
Per side also: CPU per object (utime+stime of the reacting process over the burst, until it is quiet
again), RSS before, at the end of the burst, at rest with the m objects in place, the high-water mark,
and (operator) of a restart with the m objects in place and once the objects are deleted again.
BENCH_PYSPY=<file>: record the operator's burst (``harness.py_spy``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from bench.harness import IC_PATH, Bench, Floor, Proc, collect, convergence, log, per_change, py_spy, py_spy_stop
from bench.kube import ApiError, Watcher, bounded
from testsupport.launcher import counter


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
    async with runner(ns) as reacting:
        proc: Proc = reacting.p if reacting is not None else b.operator.p  # type: ignore[union-attr]
        await proc.settle()
        rss_before, cpu_before, loop_before = proc.status(), proc.cpu_seconds(), proc.main_thread_cpu_seconds()
        spy = await py_spy(proc.pid) if side == "op" else None
        events_before = _events(b) if side == "op" else {}
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
        rss_burst = proc.status()
        await py_spy_stop(spy)
        await proc.settle()
        cpu = proc.cpu_seconds() - cpu_before
        loop_cpu = proc.main_thread_cpu_seconds() - loop_before
        rest = proc.status()
    extra: dict[str, Any] = {
        "creates_done_s": round(created, 2),
        "cpu_ms_per_object": round(cpu * 1000 / m, 2),
        "main_thread_cpu_ms_per_object": round(loop_cpu * 1000 / m, 2),  # the event loop's share
        "rss_mb": {"before": round(rss_before["VmRSS"] / 1024, 1), "burst_end": round(rss_burst["VmRSS"] / 1024, 1),
                   "at_rest": round(rest["VmRSS"] / 1024, 1), "hwm": round(rest["VmHWM"] / 1024, 1)},
        "rss_growth_mb_per_1000": {"burst_end": round((rss_burst["VmRSS"] - rss_before["VmRSS"]) / 1024 * 1000 / m, 1),
                                   "at_rest": round((rest["VmRSS"] - rss_before["VmRSS"]) / 1024 * 1000 / m, 1)},
    }
    if side == "op":
        extra["api"] = per_change(await b.a.count(mark), m)
        extra["watch_events_per_object"] = {key: round((count - events_before.get(key, 0)) / m, 2)
                                            for key, count in _events(b).items()}
        extra["rss_mb"]["restart_with_objects"] = await _restart_rss(b, m)
    await pods.stop()
    await ics.stop()
    # ImmortalContainers carry no finalizer: they go whether or not an operator runs. A collection of
    # thousands outlasts the API server's request timeout (it then hangs up): the namespace's
    # deletion finishes the job.
    try:
        await b.kube.request("DELETE", f"{IC_PATH}/namespaces/{ns}/immortalcontainers")
    except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
        log(f"  deleting the ImmortalContainers of {ns}: {type(exc).__name__}: {exc}")
    await b.cleanup([ns], wait=max(180, m / 20))
    if side == "op" and b.operator is not None:  # what stays once the objects are gone: not live data
        await b.operator.settle()
        extra["rss_mb"]["after_delete"] = b.operator.p.rss_mb()
    return elapsed, extra


def _events(b: Bench) -> dict[str, float]:
    """The operator's watch events of ImmortalContainers and pods so far, by resource and outcome
    (kopf_operators_events_total: processed, or skipped and why)."""
    text = b.operator.metrics() if b.operator is not None else ""
    return {f"{resource} {outcome}": counter(text, "kopf_operators_events_total", resource=resource, outcome=outcome)
            for resource in ("immortalcontainers", "pods")
            for outcome in ("processed", "superseded", "echo", "unchanged")}


async def _restart_rss(b: Bench, m: int) -> dict[str, float]:
    """Whether a pod OOM-killed in a burst comes back, or dies again on its own listing (a crash loop)."""
    _, listed = await b.start_with_objects_in_place()
    return {"objects": m, "at_rest": round(listed["VmRSS"] / 1024, 1), "hwm": round(listed["VmHWM"] / 1024, 1)}
