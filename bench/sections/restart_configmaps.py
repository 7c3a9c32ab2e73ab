"""restart_configmaps: a tenant's n ConfigMaps in place (one namespace, no quota), then a new operator
process starts over them (a restart, an upgrade, a takeover): seconds until it is quiet and its
high-water mark (VmHWM) against the chart's memory limit. The process serves everybody, so this is
what one tenant can do to all the others."""

from __future__ import annotations

import time
from typing import Any

from bench.harness import Bench, log
from bench.kube import bounded
from bench.sections.memory import CHART_LIMIT_MB


async def run(b: Bench) -> dict[str, Any]:
    n = b.n["restart_configmaps"]
    b.restart_operator()
    assert b.operator
    await b.operator.settle()
    idle = b.operator.status()
    ns = await b.namespace(f"bench-rcm-{b.run}")
    t0 = time.monotonic()

    async def cm(j: int) -> None:
        await b.create_retrying(f"/api/v1/namespaces/{ns}/configmaps",
                                {"metadata": {"name": f"cm-{j}"}, "data": {"key": f"value-{j}" * 8}})

    await bounded(64, [cm(j) for j in range(n)])
    created_s = time.monotonic() - t0
    log(f"  {n} ConfigMaps created in {created_s:.0f} s")
    await b.operator.settle(timeout=600)
    running = b.operator.status()
    quiet_after, start = await b.start_with_objects_in_place(timeout=900)
    await b.cleanup([ns], wait=600)
    hwm = start["VmHWM"] / 1024
    return {
        "what": (f"{n} ConfigMaps of ~90 bytes in one namespace; a new operator process (all operators, the "
                 "chart's defaults) starts over them"),
        "configmaps": n, "created_s": round(created_s, 1),
        "idle_rss_mb": round(idle["VmRSS"] / 1024, 1),
        "running_rss_mb": round(running["VmRSS"] / 1024, 1), "running_hwm_mb": round(running["VmHWM"] / 1024, 1),
        "start_quiet_after_s": round(quiet_after, 1),
        "start_rss_mb": round(start["VmRSS"] / 1024, 1), "start_hwm_mb": round(hwm, 1),
        "chart_limit_mb": CHART_LIMIT_MB, "within_limit": hwm <= CHART_LIMIT_MB,
    }
