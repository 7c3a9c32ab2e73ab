"""Kopf's stop, heard at once (core/kopf_patches/stop.py)."""

from __future__ import annotations

import asyncio
import inspect
import signal
import time

from kopf._core.reactor import running

from kopf_operators.core.kopf_patches.stop import STOP_CHECKER_TASK, when_stop_requested


def test_the_stop_is_seen_when_kopfs_stop_flag_checker_ends() -> None:
    async def scenario() -> None:
        told = asyncio.Event()
        flag = asyncio.Event()
        checker = asyncio.create_task(flag.wait(), name=STOP_CHECKER_TASK)
        assert when_stop_requested(told.set)
        await asyncio.sleep(0.01)
        assert not told.is_set()
        flag.set()  # SIGTERM: Kopf's checker returns
        await asyncio.wait_for(told.wait(), 1)
        await checker

    asyncio.run(scenario())
    # The name is Kopf's (its spawn_tasks names the task so), on the tested version.
    assert f'name="{STOP_CHECKER_TASK}"' in inspect.getsource(running.spawn_tasks)


def test_the_stop_is_seen_at_the_signal_while_the_loop_is_busy() -> None:
    """The election runs on a thread of its own: it must hear of SIGTERM at the signal, not when a busy
    loop gets to Kopf's handler (a standby's thread could take the Lease the holder released meanwhile)."""
    async def scenario() -> None:
        told: list[float] = []
        flag = asyncio.Event()
        loop = asyncio.get_running_loop()
        # As Kopf's spawn_tasks does, for both signals: the hook chains in front of both, so it must not
        # depend on how the test process left SIGINT (a worker process of pytest-xdist may not have
        # Python's handler there).
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, flag.set)
        checker = asyncio.create_task(flag.wait(), name=STOP_CHECKER_TASK)
        try:
            assert when_stop_requested(lambda: told.append(time.monotonic()))
            await asyncio.sleep(0.01)
            sent = time.monotonic()
            signal.raise_signal(signal.SIGTERM)
            time.sleep(0.3)  # the loop is busy: Kopf's handler has not run yet
            assert told and told[0] - sent < 0.1 and not flag.is_set()
            await asyncio.wait_for(flag.wait(), 1)  # and Kopf's own handler still runs
            await checker
        finally:
            for number in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(number)

    asyncio.run(scenario())


def test_no_stop_hook_outside_a_running_operator() -> None:
    async def scenario() -> None:
        assert not when_stop_requested(lambda: None)

    asyncio.run(scenario())
