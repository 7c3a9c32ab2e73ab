"""Kopf's stop, heard at once (``when_stop_requested``): patches nothing in Kopf; watches its stop-flag
checker task and the stop signals, on the tested Kopf only.

Gain: not measured as a figure: the elector stops campaigning and the holder releases the Lease at the
signal, not seconds later at Kopf's cleanup handlers (docs/kopf-patches.md); a loaded replica's loop
took 0.3 s to run Kopf's own signal handler.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from typing import Any

from kopf_operators.core.kopf_patches.door import KOPF_TESTED_VERSION, kopf_version

# The root task Kopf's ``spawn_tasks`` (``kopf._core.reactor.running``) names so: it ends when the process
# is told to stop (SIGINT, SIGTERM, or ``kopf.run``'s stop flag). Kopf then cancels its watchers and runs
# the cleanup handlers only once they have all stopped: seconds later.
STOP_CHECKER_TASK = "stop-flag checker"


def when_stop_requested(callback: Callable[[], object]) -> bool:
    """Call ``callback`` as soon as Kopf is told to stop, not seconds later at its cleanup handlers (Kopf
    has no public hook for this; upstream report in docs/kopf-patches.md). Reads nothing and changes
    nothing in Kopf: it watches the task above, and the signals themselves (``_at_signal``), on the
    tested Kopf only. True when it is watched (a
    running operator on the tested Kopf); False otherwise (the caller falls back to what it has)."""
    if kopf_version() != KOPF_TESTED_VERSION:
        return False
    for task in asyncio.all_tasks():
        if task.get_name() == STOP_CHECKER_TASK:
            task.add_done_callback(lambda _: callback())
            asyncio.get_running_loop().call_soon(_at_signal, callback, SIGNAL_HOOK_TRIES)
            return True
    return False


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SIGNAL_HOOK_TRIES = 40  # 50 ms apart: Kopf adds its signal handlers right after it starts the startup handlers


def _at_signal(callback: Callable[[], object], tries: int) -> None:
    """Also call ``callback`` from the main thread's handler of SIGTERM and SIGINT: at the signal, even
    while the event loop is busy (Kopf's own handler is asyncio's, run by the loop when it gets to it;
    a loaded replica's loop took 0.3 s, while the election's thread goes on at once). Chained in front
    of the handlers Kopf's ``spawn_tasks`` adds (``loop.add_signal_handler``: the loop still gets the
    signal); until they are there, tried again shortly."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = [signal.getsignal(number) for number in STOP_SIGNALS]
    if not all(callable(handler) for handler in current):  # the default: Kopf's are not there yet
        if tries > 0:
            asyncio.get_running_loop().call_later(0.05, _at_signal, callback, tries - 1)
        return
    for number, previous in zip(STOP_SIGNALS, current, strict=True):
        def handler(signum: int, frame: Any, previous: Callable[[int, Any], Any] = previous) -> None:  # type: ignore[assignment]
            callback()
            previous(signum, frame)

        signal.signal(number, handler)
