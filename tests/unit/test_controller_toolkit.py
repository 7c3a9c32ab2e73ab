"""The controller toolkit (kopf_operators/core/controller.py): backoff, keyed timers, resync, stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from kopf_operators.core import controller as toolkit
from kopf_operators.core.controller import Background, Backoff, MemoSlot, backoff_delay, first, values


def test_first_and_values_read_a_kopf_index_or_a_plain_dict() -> None:
    index = {("ns", "a"): ["one", "two"], ("ns", "b"): []}
    assert first(index, ("ns", "a")) == "one"
    assert first(index, ("ns", "b")) is None
    assert first(index, ("ns", "missing")) is None
    assert first(None, ("ns", "a")) is None
    assert values(index, ("ns", "a")) == ["one", "two"]
    assert values(index, ("ns", "missing")) == []


def test_backoff_doubles_up_to_the_cap_with_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)
    assert [backoff_delay(n, 1.0, 10.0) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff_delay(10_000, 1.0, 300.0) == 300.0  # no overflow for a key failing forever


def test_jitter_stays_within_twenty_percent() -> None:
    delays = {backoff_delay(2, 1.0, 300.0) for _ in range(200)}
    assert all(3.2 <= d <= 4.8 for d in delays)
    assert len(delays) > 1  # jittered, so keys failing together do not retry together


def test_backoff_counts_failures_per_key_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)
    backoff: Backoff[str] = Backoff(2.0, 300.0)
    assert [backoff.next_delay("a") for _ in range(3)] == [2.0, 4.0, 8.0]
    assert backoff.next_delay("b") == 2.0  # keys are independent
    assert backoff.failures("a") == 3
    backoff.reset("a")
    assert backoff.failures("a") == 0 and backoff.next_delay("a") == 2.0


def test_a_keyed_timer_keeps_replaces_or_takes_the_earlier_one() -> None:
    async def scenario() -> list[str]:
        background = Background("test")
        timers = background.timers()
        ran: list[str] = []

        def run(label: str) -> Callable[[], Coroutine[Any, Any, None]]:
            async def go() -> None:
                ran.append(label)
            return go

        assert timers.start("k", 0.01, run("first"))
        assert not timers.start("k", 0.0, run("kept-out"))  # "keep": the pending one stays
        assert timers.start("e", 0.05, run("late"))
        assert timers.start("e", 0.01, run("early"), if_pending="earlier")
        assert not timers.start("e", 0.5, run("later"), if_pending="earlier")
        assert timers.start("r", 0.5, run("replaced"))
        assert timers.start("r", 0.01, run("replacement"), if_pending="replace")
        while len(timers) or background.tasks:
            await asyncio.sleep(0.01)
        await background.stop()
        return sorted(ran)

    assert asyncio.run(scenario()) == ["early", "first", "replacement"]


def test_stop_cancels_timers_and_tasks_and_waits_for_them() -> None:
    async def scenario() -> tuple[list[str], bool]:
        background = Background("test")
        timers = background.timers()
        log: list[str] = []
        started = asyncio.Event()

        async def slow() -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                await asyncio.sleep(0.01)  # cleanup that takes a while: stop() must wait for it
                log.append("slow cleaned up")

        async def never() -> None:
            log.append("timer fired")

        background.spawn(slow())
        timers.start("k", 60, never)
        await started.wait()
        await background.stop()
        return log, timers.pending("k")

    log, pending = asyncio.run(scenario())
    assert log == ["slow cleaned up"]  # the task finished its cleanup before stop() returned
    assert not pending


def test_the_resync_runs_periodically_and_skips_while_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)

    async def scenario() -> tuple[int, int, int]:
        background = Background("test")
        paused = True
        sweeps = 0
        initial = 0

        async def first_pass() -> None:
            nonlocal initial
            initial += 1

        async def sweep() -> None:
            nonlocal sweeps
            sweeps += 1
            if sweeps == 1:
                raise RuntimeError("a bug in one sweep does not end the loop")

        background.resync(0.01, sweep, paused=lambda: paused, initial=first_pass)
        await asyncio.sleep(0.1)
        while_paused = sweeps
        paused = False
        while sweeps < 3:
            await asyncio.sleep(0.01)
        await background.stop()
        return initial, while_paused, sweeps

    initial, while_paused, sweeps = asyncio.run(scenario())
    assert initial == 1
    assert while_paused == 0
    assert sweeps >= 3


def test_a_standby_sweeps_at_once_when_it_starts_to_act() -> None:
    """Its event handlers did nothing while it stood by: the takeover's sweep does not wait a period."""

    async def scenario() -> float:
        background = Background("test")
        acting = asyncio.Event()
        swept = asyncio.Event()

        async def sweep() -> None:
            swept.set()

        background.resync(3600, sweep, paused=lambda: not acting.is_set(), until_acting=acting.wait)
        await asyncio.sleep(0.05)
        assert not swept.is_set()
        loop = asyncio.get_running_loop()
        started = loop.time()
        acting.set()
        await asyncio.wait_for(swept.wait(), 5)
        took = loop.time() - started
        await background.stop()
        return took

    assert asyncio.run(scenario()) < 1.0


def test_a_memo_slot_hands_out_its_typed_value_and_says_when_it_is_missing() -> None:
    slot = MemoSlot("thing", Background)
    memo: dict[str, object] = {}
    assert not slot.present(memo)
    with pytest.raises(RuntimeError, match="startup handler"):
        slot(memo)
    value = slot.set(memo, Background("x"))
    assert slot(memo) is value
    memo["thing"] = "something else"
    with pytest.raises(RuntimeError):
        slot(memo)
