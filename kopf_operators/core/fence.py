"""The fence of a holder's writes: none once the Lease may have passed to another replica.

``core.election`` moves it on from the thread that renews the Lease; ``core.access`` checks it before
every attempt of a write (controller-runtime's leader election has no such fence: a deposed leader
exits).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kopf_operators.core.api import Paused

T = TypeVar("T")


class Fence:
    """The writes of a holder whose renewals run on a thread of their own (``core.election``): none from
    ``until`` (``clock``'s time) on, set from whichever thread (``close_at``), checked before each
    attempt of a write. It holds even while the event loop is too busy to be told of a lost Lease,
    and a write that waited (for the loop, or a retry's backoff) past it is not sent."""

    def __init__(self) -> None:
        self.until = math.inf
        self.clock: Callable[[], float] = time.monotonic

    def close_at(self, until: float, clock: Callable[[], float] = time.monotonic) -> None:
        """No write from ``until`` on: ``-math.inf`` closes at once, ``math.inf`` never."""
        self.clock, self.until = clock, until

    def closed(self) -> bool:
        return self.clock() >= self.until

    async def send(self, fenced: bool, attempt: Callable[[], Awaitable[T]]) -> T:
        if fenced and self.closed():
            raise Paused()
        return await attempt()
