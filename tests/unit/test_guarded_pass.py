"""The guarded pass (kopf_operators/core/controller.py): what each result of a pass leads to (done, again
after N seconds, retry with backoff, a terminal error, waiting on a watch), failures caught and counted,
a standby running nothing, and an event's pass handed over while its group waits for a slot."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from kopf_operators.core import metrics
from kopf_operators.core.api import ApiError
from kopf_operators.core.background import Background, FairLimit
from kopf_operators.core.controller import (
    DONE,
    RETRY,
    WAITING,
    Done,
    GuardedPass,
    PassSettings,
    RequeueAfter,
    Requeues,
    Result,
    Retry,
    Terminal,
    Waiting,
)


def _say(key: str, trigger: str, exc: Exception, delay: float | None) -> str:
    return f"[{key}] {trigger}: {exc}; retrying in {delay}s"


def settings(**options: Any) -> PassSettings[str]:
    return PassSettings("guard-test", **{"say": _say, **options})


def errors_counted(kind: str) -> float:
    return float(metrics.ERRORS.labels(operator="guard-test", kind=kind)._value.get())


# --- each result kind ----------------------------------------------------------------------------------


def test_done_resets_the_keys_backoff_and_runs_nothing_later(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: 1.0)

    async def scenario() -> tuple[Result | None, int, int, int]:
        background = Background("test")
        answers: list[Result] = [RETRY, DONE]

        async def run(key: str, trigger: str) -> Result:
            return answers.pop(0)

        guard: GuardedPass[str] = GuardedPass(background, run, settings(retry=(30.0, 60.0)))
        await guard("k", "event")
        failures_after_retry = guard.failures("k")
        guard.timers.cancel_all()
        result = await guard("k", "event")
        pending = len(guard.timers)
        await background.stop()
        return result, failures_after_retry, guard.failures("k"), pending

    result, failures_after_retry, failures, pending = asyncio.run(scenario())
    assert isinstance(result, Done)
    assert failures_after_retry == 1 and failures == 0
    assert pending == 0


def test_requeue_after_runs_the_pass_again_after_that_long_and_the_earlier_look_wins() -> None:
    async def scenario() -> tuple[list[str], float | None, float | None]:
        background = Background("test")
        runs: list[str] = []
        answers: list[Result] = [RequeueAfter(60.0), RequeueAfter(0.01), RequeueAfter(30.0), DONE]

        async def run(key: str, trigger: str) -> Result:
            runs.append(trigger)
            return answers.pop(0)

        guard: GuardedPass[str] = GuardedPass(background, run, settings(retry=(30.0, 60.0), retry_trigger="timer"))
        await guard("k", "event")
        first_due = guard.timers.due_in("k")
        await guard("k", "event")  # asks for 0.01 s: earlier than the pending 60 s, so it replaces it
        while len(runs) < 3:
            await asyncio.sleep(0.01)
        after_timer = guard.timers.due_in("k")  # the timer's pass asked for 30 s
        await background.stop()
        return runs, first_due, after_timer

    runs, first_due, after_timer = asyncio.run(scenario())
    assert runs == ["event", "event", "timer"]
    assert first_due is not None and 59 < first_due <= 60
    assert after_timer is not None and 29 < after_timer <= 30


def test_retry_runs_the_pass_again_after_a_doubling_backoff_and_logs_nothing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: 1.0)

    async def scenario() -> tuple[list[str], list[float | None], int]:
        background = Background("test")
        runs: list[str] = []
        due: list[float | None] = []

        async def run(key: str, trigger: str) -> Result:
            runs.append(trigger)
            return RETRY if len(runs) < 3 else DONE

        guard: GuardedPass[str] = GuardedPass(background, run, settings(retry=(0.01, 1.0)))
        result = await guard("k", "event")
        assert isinstance(result, Retry)
        due.append(guard.timers.due_in("k"))
        while len(runs) < 3:
            await asyncio.sleep(0.005)
        await background.stop()
        return runs, due, guard.failures("k")

    before = errors_counted("api")
    with caplog.at_level(logging.DEBUG, logger="kopf_operators.controller"):
        runs, due, failures = asyncio.run(scenario())
    assert runs == ["event", "retry", "retry"]
    assert due[0] is not None and due[0] <= 0.01
    assert failures == 0  # the third pass was done: the backoff starts afresh
    assert errors_counted("api") == before  # asking for a retry is no error
    assert caplog.records == []  # the pass says why itself


def test_a_terminal_error_is_counted_and_said_once_and_not_retried() -> None:
    async def scenario() -> tuple[list[str], list[float | None], Result | None, int, int]:
        background = Background("test")
        runs: list[str] = []
        said: list[float | None] = []
        refused = ApiError(422, "Invalid")

        async def run(key: str, trigger: str) -> Result:
            runs.append(trigger)
            return Terminal(refused)

        def say(key: str, trigger: str, exc: Exception, delay: float | None) -> str:
            assert exc is refused
            said.append(delay)
            return ""

        failed: list[str] = []
        guard: GuardedPass[str] = GuardedPass(background, run, settings(
            retry=(0.01, 1.0), say=say, on_failure=lambda key, exc: failed.append(key)))
        result = await guard("k", "event")
        await asyncio.sleep(0.05)
        assert failed == ["k"]
        pending = len(guard.timers)
        await background.stop()
        return runs, said, result, pending, guard.failures("k")

    before = errors_counted("api")
    runs, said, result, pending, failures = asyncio.run(scenario())
    assert runs == ["event"] and pending == 0  # not retried
    assert said == [None]  # no retry due
    assert isinstance(result, Terminal) and result.error.status == 422  # type: ignore[attr-defined]
    assert failures == 1  # counted, so that the caller can say it once
    assert errors_counted("api") == before + 1


def test_waiting_neither_retries_nor_resets_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch the pass started runs the key again: nothing is due, and a fallback that keeps failing
    still doubles (the failures in a row are kept)."""
    monkeypatch.setattr(random, "uniform", lambda low, high: 1.0)

    async def scenario() -> tuple[Result | None, int, int, float | None]:
        background = Background("test")

        async def run(key: str, trigger: str) -> Result:
            return WAITING

        guard: GuardedPass[str] = GuardedPass(background, run, settings(retry=(1.0, 60.0)))
        guard.retry_later("k")  # the fallback failed once: 1 s
        guard.timers.cancel_all()
        result = await guard("k", "event")
        pending = len(guard.timers)
        failures = guard.failures("k")
        delay = guard.retry_later("k")  # the fallback fails again: doubled
        await background.stop()
        return result, pending, failures, delay

    result, pending, failures, delay = asyncio.run(scenario())
    assert isinstance(result, Waiting)
    assert pending == 0 and failures == 1
    assert delay == 2.0


# --- failures raised by a pass -------------------------------------------------------------------------


def test_a_failed_pass_is_counted_said_once_and_retried_with_backoff(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: 1.0)
    before = errors_counted("api")

    async def scenario() -> tuple[list[str], int]:
        background = Background("test")
        runs: list[str] = []

        async def run(key: str, trigger: str) -> Result:
            runs.append(trigger)
            if len(runs) < 3:
                raise ApiError(503, "Unavailable")
            return DONE

        guard: GuardedPass[str] = GuardedPass(background, run, settings(retry=(0.01, 1.0)))
        assert isinstance(await guard("k", "event"), Retry)
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
    assert errors_counted("api") - before == 2
    assert [r.getMessage() for r in caplog.records] == [
        "[k] event: HTTP 503 Unavailable; retrying in 0.01s", "[k] retry: HTTP 503 Unavailable; retrying in 0.02s"]


def test_a_failure_with_an_earlier_look_pending_says_when_that_look_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``if_pending="earlier"``: a look asked for in 0.5 s stays when the backoff would say 30 s, and the
    failure's line says the 0.5 s, when the key is really tried again."""
    monkeypatch.setattr(random, "uniform", lambda low, high: 1.0)

    async def scenario() -> list[float | None]:
        background = Background("test")
        delays: list[float | None] = []
        answers: list[Result] = [RequeueAfter(0.5)]

        async def run(key: str, trigger: str) -> Result:
            if answers:
                return answers.pop()
            raise ApiError(503, "Unavailable")

        def say(key: str, trigger: str, exc: Exception, delay: float | None) -> str:
            delays.append(delay)
            return ""

        guard: GuardedPass[str] = GuardedPass(background, run, settings(retry=(30.0, 60.0), if_pending="earlier",
                                                                        say=say))
        await guard("k", "event")  # asks to look again in 0.5 s
        await guard("k", "event")  # fails
        due = guard.timers.due_in("k")
        guard.forget("k")
        await guard("k", "event")  # nothing pending: the backoff's own delay
        await background.stop()
        assert due is not None and 0.4 < due <= 0.5
        return delays

    [kept, backoff] = asyncio.run(scenario())
    assert kept is not None and 0.4 < kept <= 0.5
    assert backoff == 30.0


def test_a_refused_pass_is_terminal_and_a_paused_process_runs_nothing() -> None:
    async def scenario() -> tuple[list[str], list[float | None], int, list[Result | None]]:
        background = Background("test")
        runs: list[str] = []
        delays: list[float | None] = []
        paused = True

        async def run(key: str, trigger: str) -> Result:
            runs.append(trigger)
            raise ApiError(422, "Invalid")

        def say(key: str, trigger: str, exc: Exception, delay: float | None) -> str:
            delays.append(delay)
            return ""

        guard: GuardedPass[str] = GuardedPass(background, run, settings(
            retry=(0.01, 1.0), paused=lambda: paused, say=say,
            retried=lambda exc: isinstance(exc, ApiError) and exc.transient))
        results = [await guard("k", "event")]
        paused = False
        results += [await guard("k", "event"), await guard("k", "event")]
        await asyncio.sleep(0.05)
        pending = len(guard.timers)
        failures = guard.failures("k")
        await background.stop()
        assert pending == 0
        return runs, delays, failures, results

    runs, delays, failures, results = asyncio.run(scenario())
    assert runs == ["event", "event"]  # nothing while paused; no retry of a refusal
    assert delays == [None, None]
    assert failures == 2  # counted, so that the caller can say it once
    assert results[0] is None and all(isinstance(result, Terminal) for result in results[1:])


def test_a_crash_is_logged_with_its_traceback_in_the_callers_log(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[str]:
        background = Background("test")
        runs: list[str] = []

        async def run(key: str, trigger: str, *args: Any) -> Result:
            runs.append(trigger)
            raise ValueError("a bug")

        guard: GuardedPass[str] = GuardedPass(background, run, settings(
            catch=(Exception,), error_kind="crash", traceback=True,
            say=lambda key, trigger, exc, delay: f"pass crashed: {exc}"))
        assert isinstance(await guard("k", "crash", "an argument", log=logging.getLogger("agent")), Terminal)
        await background.stop()
        return runs

    with caplog.at_level(logging.WARNING):
        runs = asyncio.run(scenario())
    assert runs == ["crash"]
    crash = [r for r in caplog.records if r.name == "agent"]
    assert len(crash) == 1 and crash[0].getMessage() == "pass crashed: a bug" and crash[0].exc_info
    assert crash[0].levelno == logging.ERROR


def test_an_events_pass_that_must_wait_for_a_slot_is_handed_over_once_per_key_with_the_newest_report(
        caplog: pytest.LogCaptureFixture) -> None:
    """Its group's slot is held: ``submit`` returns at once and one task per key runs the pass, with the
    reports merged, once the slot is free; a key forgotten meanwhile runs nothing; a handed-over pass
    that crashes is logged (no caller to raise to)."""
    async def scenario() -> tuple[list[tuple[str, Any]], int]:
        background = Background("test")
        limit = FairLimit(1)
        runs: list[tuple[str, Any]] = []

        async def run(key: str, trigger: str, report: Any = None) -> Result:
            runs.append((key, report))
            if report == "bug":
                raise ValueError("a bug")
            return DONE

        guard: GuardedPass[str] = GuardedPass(background, run, settings(
            limit=limit, group=lambda key: "ns", merge=max,
            say=lambda key, trigger, exc, delay: f"{key} {trigger}: failed"))
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


def test_the_settings_are_one_frozen_object() -> None:
    options = settings(retry=(1.0, 2.0))
    with pytest.raises(AttributeError):
        options.retry = None  # type: ignore[misc]


def test_a_pass_that_asks_to_look_again_returns_the_earliest_and_a_failed_one_asks_nothing() -> None:
    async def scenario() -> list[Result]:
        requeues: Requeues[str] = Requeues()
        fail = False

        async def run(key: str, trigger: str) -> None:
            requeues.after(key, 30.0)
            requeues.after(key, 5.0)
            requeues.after(key, 60.0)
            if fail:
                raise ApiError(503, "Unavailable")

        passes = requeues.returned(run)
        results = [await passes("k", "event")]
        fail = True
        with pytest.raises(ApiError):
            await passes("k", "event")

        async def nothing(key: str, trigger: str) -> None:
            return None

        results.append(await requeues.returned(nothing)("k", "event"))  # the failed pass left nothing
        requeues.after("k", 1.0)
        requeues.forget("k")  # the key is gone: nothing it asked for is left
        results.append(await requeues.returned(nothing)("k", "event"))
        return results

    assert asyncio.run(scenario()) == [RequeueAfter(5.0), DONE, DONE]
