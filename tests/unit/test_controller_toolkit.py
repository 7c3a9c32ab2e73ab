"""The controller toolkit (kopf_operators/core/controller.py): backoff, keyed timers, resync, stop, and the
one reconcile shape: per-key state, the newest known version, the guarded pass."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from kopf_operators.core import controller as toolkit
from kopf_operators.core import metrics
from kopf_operators.core.access import ApiError
from kopf_operators.core.controller import (
    RETRY,
    Background,
    Backoff,
    GuardedPass,
    KeyedState,
    MemoSlot,
    Newest,
    PerKey,
    backoff_delay,
    first,
    values,
    version_of,
)


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


# --- per-key state ---------------------------------------------------------------------------------


def test_one_forget_drops_every_piece_of_a_keys_state() -> None:
    async def scenario() -> tuple[list[str], bool, bool]:
        background = Background("test")
        state: KeyedState[str] = KeyedState()
        seen: PerKey[str, int] = state.map()
        flagged = state.set()
        backoff: Backoff[str] = state.track(Backoff(1.0, 10.0))
        timers = state.track(background.timers())
        newest: Newest[str, dict[str, Any]] = state.track(
            Newest(lambda v: v["rv"], lambda v: v["uid"], ours_until_seen=True))
        released: list[str] = []
        state.on_forget(released.append)
        fired: list[str] = []

        async def fire() -> None:
            fired.append("fired")

        for key in ("a", "b"):
            seen[key] = 1
            flagged.add(key)
            backoff.next_delay(key)
            timers.start(key, 0.05, fire)
            newest.remember(key, {"rv": 1, "uid": key})
        state.forget("a")
        assert "a" not in seen and "a" not in flagged and backoff.failures("a") == 0
        assert not timers.pending("a") and [key for key, _ in newest.held()] == ["b"]
        # the other key keeps all of it
        assert seen["b"] == 1 and "b" in flagged and backoff.failures("b") == 1 and timers.pending("b")
        assert newest.current("b") == {"rv": 1, "uid": "b"}
        await asyncio.sleep(0.1)
        await background.stop()
        return released, timers.pending("a"), len(fired) == 1

    released, pending, one_fired = asyncio.run(scenario())
    assert released == ["a"]
    assert not pending and one_fired  # only b's timer fired


# --- the newest known version ------------------------------------------------------------------------


def view(uid: str, rv: int) -> dict[str, Any]:
    return {"uid": uid, "rv": rv}


def overlay(*, ours_until_seen: bool = False) -> Newest[str, dict[str, Any]]:
    return Newest(lambda v: int(v["rv"]), lambda v: v["uid"], ours_until_seen=ours_until_seen)


def test_our_write_is_newer_than_the_index_until_the_watch_catches_up() -> None:
    known = overlay()
    assert known.current("k", view("u", 5)) == view("u", 5)  # nothing written: the index
    known.remember("k", view("u", 7))
    assert known.current("k", view("u", 5)) == view("u", 7)  # the index lags behind our write
    assert known.current("k", view("u", 7)) == view("u", 7)  # caught up: the index again
    assert len(known) == 0
    known.remember("k", view("u", 9))
    assert known.current("k", view("u", 12)) == view("u", 12)  # someone wrote after us


def test_without_ours_until_seen_the_index_says_whether_the_object_exists() -> None:
    known = overlay()
    known.remember("k", view("u", 7))
    assert known.current("k", None) is None  # gone from the index: gone
    known.remember("k", view("u", 7))
    assert known.current("k", view("other", 3)) == view("other", 3)  # replaced: our write was to the old one
    assert len(known) == 0


def test_with_ours_until_seen_our_create_and_our_delete_hold_until_the_watch_sees_them() -> None:
    known = overlay(ours_until_seen=True)
    known.remember("k", view("new", 2))
    assert known.current("k", None) == view("new", 2)  # created: the watch has not delivered it yet
    assert known.current("k", view("old", 9)) == view("new", 2)  # re-created over an older object
    assert known.current("k", view("new", 2)) == view("new", 2)
    assert len(known) == 0
    known.remember_gone("k", "new")
    assert known.current("k", view("new", 2)) is None  # deleted: the watch still holds it
    assert known.current("k", None) is None
    known.remember_gone("k", "new")
    assert known.current("k", view("newer", 4)) == view("newer", 4)  # someone made another one since
    assert known.held() == []


def test_an_events_body_replaces_what_is_known_unless_older() -> None:
    known = overlay()
    assert known.newer(view("u", 5), None) == view("u", 5)
    assert known.newer(None, view("u", 5)) == view("u", 5)
    assert known.newer(view("u", 5), view("u", 4)) == view("u", 5)  # a late event of an older version
    assert known.newer(view("u", 5), view("u", 5)) == view("u", 5)
    assert known.newer(view("u", 5), view("v", 2)) == view("v", 2)  # another object: the event's


def test_the_newest_report_wins_and_a_deletion_is_remembered() -> None:
    reports: Newest[str, str] = Newest(len, lambda v: v)
    assert reports.seen("k") is None
    reports.saw("k", "at 5", 5)
    reports.saw("k", "at 3", 3)  # an older report arriving late
    assert reports.seen("k") == "at 5"
    reports.saw("k", None, 8)  # deleted at 8
    reports.saw("k", "at 6", 6)  # the deleted object's late event does not bring it back
    assert reports.seen("k") is None
    reports.saw("k", "at 9", 9)
    assert reports.seen("k") == "at 9"
    assert reports.held() == [("k", "at 9")]


def test_version_of_reads_a_resource_version() -> None:
    assert version_of("42") == 42
    assert version_of(None) == 0 and version_of("") == 0 and version_of("x1") == 0


# --- the guarded pass --------------------------------------------------------------------------------


def test_a_failed_pass_is_counted_said_once_and_retried_with_backoff(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)
    errors = metrics.ERRORS.labels(operator="guard-test", kind="api")
    before = errors._value.get()

    async def scenario() -> tuple[list[str], int]:
        background = Background("test")
        runs: list[str] = []

        async def run(key: str, trigger: str) -> None:
            runs.append(trigger)
            if len(runs) < 3:
                raise ApiError(503, "Unavailable")

        guard: GuardedPass[str] = GuardedPass(
            "guard-test", background, run, retry=(0.01, 1.0),
            say=lambda key, trigger, exc, delay: f"[{key}] {trigger}: {exc}; retrying in {delay}s")
        assert not await guard("k", "event")
        while len(runs) < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)
        failures = guard.failures("k")
        await background.stop()
        return runs, failures

    with caplog.at_level(logging.WARNING, logger="kopf_operators.controller"):
        runs, failures = asyncio.run(scenario())
    assert runs == ["event", "retry", "retry"]
    assert failures == 0  # the third pass succeeded: the backoff starts afresh
    assert errors._value.get() - before == 2
    assert [r.getMessage() for r in caplog.records] == [
        "[k] event: HTTP 503 Unavailable; retrying in 0.01s", "[k] retry: HTTP 503 Unavailable; retrying in 0.02s"]


def test_a_failure_with_an_earlier_look_pending_says_when_that_look_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``if_pending="earlier"``: a look asked for in 0.5 s stays when the backoff would say 30 s, and the
    failure's line says the 0.5 s, when the key is really tried again."""
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)

    async def scenario() -> list[float | None]:
        background = Background("test")
        delays: list[float | None] = []

        async def run(key: str, trigger: str) -> None:
            raise ApiError(503, "Unavailable")

        def say(key: str, trigger: str, exc: Exception, delay: float | None) -> str:
            delays.append(delay)
            return ""

        guard: GuardedPass[str] = GuardedPass("guard-test", background, run, retry=(30.0, 60.0),
                                              if_pending="earlier", say=say)
        guard.later("k", 0.5)
        await guard("k", "event")
        due = guard.timers.due_in("k")
        guard.forget("k")
        await guard("k", "event")  # nothing pending: the backoff's own delay
        await background.stop()
        assert due is not None and 0.4 < due <= 0.5
        return delays

    [kept, backoff] = asyncio.run(scenario())
    assert kept is not None and 0.4 < kept <= 0.5
    assert backoff == 30.0


def test_a_refused_pass_is_not_retried_and_a_paused_process_runs_nothing() -> None:
    async def scenario() -> tuple[list[str], list[float | None], int]:
        background = Background("test")
        runs: list[str] = []
        delays: list[float | None] = []
        paused = True

        async def run(key: str, trigger: str) -> None:
            runs.append(trigger)
            raise ApiError(422, "Invalid")

        def say(key: str, trigger: str, exc: Exception, delay: float | None) -> str:
            delays.append(delay)
            return ""

        guard: GuardedPass[str] = GuardedPass(
            "guard-test", background, run, retry=(0.01, 1.0), paused=lambda: paused, say=say,
            retried=lambda exc: isinstance(exc, ApiError) and exc.transient)
        assert not await guard("k", "event")
        paused = False
        await guard("k", "event")
        await guard("k", "event")
        await asyncio.sleep(0.05)
        pending = len(guard.timers)
        failures = guard.failures("k")
        await background.stop()
        assert pending == 0
        return runs, delays, failures

    runs, delays, failures = asyncio.run(scenario())
    assert runs == ["event", "event"]  # nothing while paused; no retry of a refusal
    assert delays == [None, None]
    assert failures == 2  # counted, so that the caller can say it once


def test_a_pass_asking_for_retry_is_retried_and_a_crash_is_logged_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[str]:
        background = Background("test")
        runs: list[str] = []

        async def run(key: str, trigger: str, *args: Any) -> bool:
            runs.append(trigger)
            if trigger == "crash":
                raise ValueError("a bug")
            return RETRY if len(runs) < 2 else True

        guard: GuardedPass[str] = GuardedPass(
            "guard-test", background, run, retry=(0.01, 1.0), catch=(Exception,), error_kind="crash",
            traceback=True, say=lambda key, trigger, exc, delay: f"pass crashed: {exc}")
        assert not await guard("k", "event")
        while len(runs) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)
        assert guard.failures("k") == 0
        guard.timers.cancel_all()
        assert not await guard("k", "crash", "an argument", log=logging.getLogger("agent"))
        await background.stop()
        return runs

    with caplog.at_level(logging.WARNING):
        runs = asyncio.run(scenario())
    assert runs == ["event", "retry", "crash"]
    crash = [r for r in caplog.records if r.name == "agent"]
    assert len(crash) == 1 and crash[0].getMessage() == "pass crashed: a bug" and crash[0].exc_info


def test_an_events_pass_that_must_wait_for_a_slot_is_handed_over_once_per_key_with_the_newest_report(
        caplog: pytest.LogCaptureFixture) -> None:
    """Its group's slot is held: ``submit`` returns at once and one task per key runs the pass, with the
    reports merged, once the slot is free; a key forgotten meanwhile runs nothing; a handed-over pass
    that crashes is logged (no caller to raise to)."""
    async def scenario() -> tuple[list[tuple[str, Any]], int]:
        background = Background("test")
        limit = toolkit.FairLimit(1)
        runs: list[tuple[str, Any]] = []

        async def run(key: str, trigger: str, report: Any = None) -> None:
            runs.append((key, report))
            if report == "bug":
                raise ValueError("a bug")

        guard: GuardedPass[str] = GuardedPass(
            "guard-test", background, run, limit=limit, group=lambda key: "ns", merge=max,
            say=lambda key, trigger, exc, delay: f"{key} {trigger}: failed")
        await guard.submit("free", "event", 1)  # a slot is free: it runs now
        async with limit.hold("ns"):
            for report in (2, 4, 3):
                await asyncio.wait_for(guard.submit("web", "event", report), 1)
            await guard.submit("gone", "event", 1)
            await guard.submit("crashes", "event", "bug")
            guard.forget("gone")
            handed = len(background.tasks)
            assert runs == [("free", 1)]
        await asyncio.gather(*background.tasks)
        await background.stop()
        return runs, handed

    with caplog.at_level(logging.ERROR, logger="kopf_operators.controller"):
        runs, handed = asyncio.run(scenario())
    assert handed == 3
    assert runs == [("free", 1), ("web", 4), ("crashes", "bug")]
    [crash] = caplog.records
    assert crash.getMessage() == "crashes event: failed" and crash.exc_info

class Holders:
    """Holders of a ``FairLimit``'s slots: each notes its name in ``served`` when it gets its slot, and
    holds it until ``release_all``."""

    def __init__(self, limit: toolkit.FairLimit) -> None:
        self.limit = limit
        self.served: list[str] = []
        self.tasks: list[asyncio.Future[None]] = []
        self.gate = asyncio.Event()

    def start(self, group: str, *names: str) -> asyncio.Future[None]:
        for name in names:
            self.tasks.append(asyncio.ensure_future(self._hold(group, name)))
        return self.tasks[-1]

    async def _hold(self, group: str, name: str) -> None:
        async with self.limit.hold(group):
            self.served.append(name)
            await self.gate.wait()

    async def release_all(self) -> list[str]:
        self.gate.set()
        await asyncio.gather(*(task for task in self.tasks if not task.cancelled()))
        return self.served


def test_a_fair_limit_serves_groups_round_robin_and_passes_on_a_cancelled_turn() -> None:
    async def scenario() -> list[str]:
        limit = toolkit.FairLimit(1)
        holders = Holders(limit)
        holders.start("flood", *(f"f{i}" for i in range(5)))
        await asyncio.sleep(0)
        holders.start("quiet", "q0")
        cancelled = holders.start("other", "o0")
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        served = await holders.release_all()
        assert limit.free == 1 and not limit.waiting
        return served

    served = asyncio.run(scenario())
    # f0 held the slot; the quiet group's first waiter waited one release (f1, whose turn came first),
    # not four (a plain semaphore: f1-f4 first).
    assert served == ["f0", "f1", "q0", "f2", "f3", "f4"]
    assert "o0" not in served


def test_a_fair_limit_keeps_its_reserve_for_a_group_that_holds_no_slot() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        limit = toolkit.FairLimit(3, reserve=1)
        holders = Holders(limit)
        holders.start("flood", *(f"f{i}" for i in range(5)))
        await asyncio.sleep(0)
        # While the flood waits, the reserved slot is free for another group (its pass may run at once).
        assert limit.waiting and limit.may_take("quiet") and not limit.may_take("flood")
        holders.start("quiet", "q0")
        holders.start("quiet", "q1")  # its group now holds one: it waits
        await asyncio.sleep(0)
        before_any_release = list(holders.served)
        served = await holders.release_all()
        assert limit.free == 3 and not limit.waiting and not limit.held
        return before_any_release, served

    before_any_release, served = asyncio.run(scenario())
    # The flood holds at most two of the three slots; the quiet group's first holder takes the third at
    # once, without waiting for a flood holder to finish (a plain limit: after all five of the flood).
    assert before_any_release == ["f0", "f1", "q0"]
    assert sorted(served) == sorted(["f0", "f1", "f2", "f3", "f4", "q0", "q1"])
