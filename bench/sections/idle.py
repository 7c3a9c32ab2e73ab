"""idle: steady state with one object per operator, then a quiet window; every request in it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness import Bench


async def run(b: Bench) -> dict[str, Any]:
    assert b.operator
    ns = await b.steady_state("idle")
    await asyncio.sleep(5)
    settle = await b.operator.settle()
    mem = b.operator.status()
    start = b.a.mark()
    t0 = time.monotonic()
    await asyncio.sleep(b.n["idle"])
    counts = await b.a.count(start)  # (waits 1 s for the audit flush: part of the window)
    seconds = time.monotonic() - t0
    result = {"window_seconds": round(seconds, 1), "settled_after_s": round(settle, 1),
              "requests": counts, "writes": counts["writes"],
              "requests_per_minute": round(counts["total"] * 60 / seconds, 1),
              "rss_mb": round(mem["VmRSS"] / 1024, 1), "hwm_mb": round(mem["VmHWM"] / 1024, 1)}
    await b.end_steady_state(ns)
    return result
