"""The controller toolkit (kopf_operators/core/background.py and state.py): backoff, keyed timers, resync,
stop, fair limits; per-key state and the newest known version. The guarded pass: test_guarded_pass.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from kopf_operators.core import background as toolkit
from kopf_operators.core.background import Background, Backoff, backoff_delay
from kopf_operators.core.state import KeyedState, MemoSlot, Newest, PerKey, first, values, version_of


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
