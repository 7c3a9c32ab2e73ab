"""restart_configmaps: a tenant's n ConfigMaps in place (one namespace, no quota), then a new operator
process starts over them (a restart, an upgrade, a takeover): its high-water mark (VmHWM) against the
chart's memory limit, seconds until its handlers run (Kopf runs none until every index is filled:
every operator is blind until then), seconds until it is quiet, and its RSS at rest. The process
serves everybody, so this is what one tenant can do to all the others. The operator is stopped while
the ConfigMaps are created (64 requests in flight): only the start over them is measured.

``--set restart_ics=K`` (default 0) puts K ImmortalContainers in place first, created while the operator
runs (their pods exist): at the start their Kopf workers wait on the "every index is filled" gate while
the ConfigMaps are indexed, the case Kopf's ToggleSet wakes every waiter for on every change (the
``wake_gate_waiters_only_on_change`` patch; compare with ``KOPF_PATCHES_SKIP``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness import IC_PATH, Bench, log
from bench.kube import bounded
from bench.sections.memory import CHART_LIMIT_MB

# The line the patched processor logs once every index is filled (kopf_patches.governed.drain_listed).
INDEXED_LINE = "Every index is filled"


async def run(b: Bench) -> dict[str, Any]:
    n, k = b.n["restart_configmaps"], b.n["restart_ics"]
    b.restart_operator()
    assert b.operator
    await b.operator.settle()
    idle = b.operator.status()
    ns = await b.namespace(f"bench-rcm-{b.run}")
    if k:
        await bounded(16, [b.create_retrying(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
            "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
            "metadata": {"name": f"ic-{j}"}, "spec": {"image": "busybox:1.36"}}) for j in range(k)])
        await b.operator.settle(timeout=600)
        log(f"  {k} ImmortalContainers in place")
    b.stop_operator()
    t0 = time.monotonic()

    async def cm(j: int) -> None:
        await b.create_retrying(f"/api/v1/namespaces/{ns}/configmaps",
                                {"metadata": {"name": f"cm-{j}"}, "data": {"key": f"value-{j}" * 8}})

    await bounded(64, [cm(j) for j in range(n)])
    created_s = time.monotonic() - t0
    log(f"  {n} ConfigMaps created in {created_s:.0f} s")
    offset = b.operator.log_size()
    started = time.monotonic()
    b.start_operator(b.operator_env)
    first_handler_s = None
    while first_handler_s is None and time.monotonic() - started < 900:
        if any(INDEXED_LINE in line for line in b.operator.log_lines_since(offset)):
            first_handler_s = time.monotonic() - started
        else:
            await asyncio.sleep(1)
    await b.operator.settle(timeout=900)
    quiet_after = time.monotonic() - started
    start = b.operator.status()
    await asyncio.sleep(15)  # the allocator's trim runs every 10 s
    steady = b.operator.status()
    await b.cleanup([ns], wait=600)
    hwm = start["VmHWM"] / 1024
    return {
        "what": (f"{n} ConfigMaps of ~90 bytes" + (f" and {k} ImmortalContainers" if k else "") + " in one "
                 "namespace; a new operator process (all operators, the chart's defaults) starts over them"),
        "configmaps": n, "immortalcontainers": k, "created_s": round(created_s, 1),
        "idle_rss_mb": round(idle["VmRSS"] / 1024, 1),
        "start_first_handler_s": None if first_handler_s is None else round(first_handler_s, 1),
        "start_quiet_after_s": round(quiet_after, 1),
        "start_rss_mb": round(start["VmRSS"] / 1024, 1), "start_hwm_mb": round(hwm, 1),
        "steady_rss_mb": round(steady["VmRSS"] / 1024, 1),
        "chart_limit_mb": CHART_LIMIT_MB, "within_limit": hwm <= CHART_LIMIT_MB,
    }
