"""The event loop's lag (core.metrics.LoopLag): a held loop reads as late while it is held and after,
a free one near zero, a stopped monitor zero."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import REGISTRY

from kopf_operators.core import metrics


def gauge() -> float | None:
    return REGISTRY.get_sample_value("kopf_operators_event_loop_lag_seconds")


def test_a_held_loop_reads_late_while_held_and_for_the_window_after() -> None:
    async def scenario() -> tuple[float, float, float, float | None, float | None]:
        lag = metrics.LoopLag(interval=0.01, window=60.0)
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.05)
        free = lag.value()
        time.sleep(0.6)  # a handler holding the loop (what a backtracking regex did, for days)
        held = lag.value()  # as the metrics thread reads it meanwhile
        await asyncio.sleep(0.05)
        after, scraped = lag.value(), gauge()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return free, held, after, scraped, gauge()

    free, held, after, scraped, stopped = asyncio.run(scenario())
    assert free < 0.5 <= held  # generous: the test machine is shared
    assert after >= 0.5 and scraped is not None and scraped >= 0.5
    assert stopped == 0.0


def test_old_lags_leave_the_window() -> None:
    clock = [100.0]
    lag = metrics.LoopLag(window=10.0, clock=lambda: clock[0])
    lag.record(100.0, 3.0)
    assert lag.value() == 3.0
    clock[0] = 111.0
    lag.record(111.0, 0.01)
    assert lag.value() == 0.01 and len(lag.recent) == 1
