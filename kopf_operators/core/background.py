"""A controller's own time: the machinery that runs its work outside Kopf's handlers.

Kopf retries its handlers itself, but a controller also acts from its own timers (a retry, a crash
backoff's end, a burst's status flush) and from a periodic resync. Those live here, once:

- ``backoff_delay``: the one backoff formula (doubling from ``first`` to ``cap``, with ±20 % jitter so
  that keys failing together do not retry together), and ``Backoff`` counting failures per key
  (controller-runtime: the workqueue's per-item exponential rate limiter);
- ``KeyedTimers``: one-shot timers, at most one pending per key (the workqueue's ``AddAfter``);
- ``FairLimit``: at most so many holders at once, served round-robin by group (a namespace);
- ``Background``: the controller's tasks (referenced until done), its keyed timers and its resync loop
  (jittered, skipped while the process stands by, run at once when it starts to act); ``stop()``
  cancels all of them and waits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, Literal, TypeVar

K = TypeVar("K", bound=Hashable)

logger = logging.getLogger("kopf_operators.controller")

# ±20 % on every delay: retries, backoffs and resyncs of many keys (or replicas) spread out.
JITTER = (0.8, 1.2)


def jittered(seconds: float) -> float:
    return seconds * random.uniform(*JITTER)


def backoff_delay(failures: int, first: float, cap: float) -> float:
    """The delay before the next try after ``failures`` failures in a row (0: the first retry)."""
    return jittered(min(cap, first * 2 ** min(failures, 16)))


class Backoff(Generic[K]):
    """Failures in a row per key, and the delay they call for."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap = first, cap
        self._failures: dict[K, int] = {}

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def next_delay(self, key: K) -> float:
        """Count one more failure of ``key``; the delay before trying it again."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return backoff_delay(failures, self.first, self.cap)

    def reset(self, key: K) -> None:
        self._failures.pop(key, None)

    forget = reset  # a KeyedState part


# When a timer is asked for while one is pending for the same key: keep the pending one, keep
# whichever fires earlier, or replace it.
IfPending = Literal["keep", "earlier", "replace"]


class KeyedTimers(Generic[K]):
    """One-shot timers, at most one pending per key. A timer that fires runs its coroutine as a task
    of its ``Background`` (so ``stop()`` cancels and awaits it)."""

    def __init__(self, background: Background) -> None:
        self._background = background
        self._handles: dict[K, tuple[float, asyncio.TimerHandle]] = {}

    def pending(self, key: K) -> bool:
        return key in self._handles

    def __len__(self) -> int:
        return len(self._handles)

    def due_in(self, key: K) -> float | None:
        """Seconds until the pending timer of ``key`` fires (None: none pending)."""
        pending = self._handles.get(key)
        return None if pending is None else pending[0] - asyncio.get_running_loop().time()

    def start(self, key: K, delay: float, run: Callable[[], Coroutine[Any, Any, None]], *,
              if_pending: IfPending = "keep") -> bool:
        """Run ``run()`` in ``delay`` seconds; False when a pending timer was kept instead."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay)
        pending = self._handles.get(key)
        if pending is not None:
            if if_pending == "keep" or (if_pending == "earlier" and pending[0] <= when):
                return False
            pending[1].cancel()

        def fire() -> None:
            self._handles.pop(key, None)
            self._background.spawn(run())

        self._handles[key] = (when, loop.call_at(when, fire))
        return True

    def cancel(self, key: K) -> None:
        pending = self._handles.pop(key, None)
        if pending is not None:
            pending[1].cancel()

    forget = cancel  # a KeyedState part

    def cancel_all(self) -> None:
        for _, handle in self._handles.values():
            handle.cancel()
        self._handles.clear()


class FairLimit:
    """At most ``slots`` holders at once, the waiters served round-robin by group (a namespace): a
    group with hundreds of waiters delays another group's first waiter by at most one release, where
    a plain semaphore would serve them in arrival order.

    ``reserve``: the last free slots go only to a group that holds none. A slot is released only when
    its holder's write is answered, and under a flood every slot may be held by the flooding group's
    writes, each as slow as the loaded API server (hundreds of ms): without a reserve another group's
    first write waits for one of them; with it, that write starts at once (the flooding group keeps
    ``slots - reserve``)."""

    def __init__(self, slots: int, reserve: int = 0) -> None:
        self.free = slots
        self.reserve = reserve
        self.held: dict[Hashable, int] = {}  # group -> slots it holds
        self.waiting: dict[Hashable, collections.deque[asyncio.Future[None]]] = {}  # order: whose turn

    def may_take(self, group: Hashable) -> bool:
        """Whether ``hold(group)`` would take a slot at once, without waiting."""
        return self.free > (self.reserve if self.held.get(group) else 0)

    def _take(self, group: Hashable) -> None:
        self.free -= 1
        self.held[group] = self.held.get(group, 0) + 1

    @contextlib.asynccontextmanager
    async def hold(self, group: Hashable) -> AsyncIterator[None]:
        # Waiters are left only while none of them may take a slot (``_release`` hands them on).
        if self.may_take(group):
            self._take(group)
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting.setdefault(group, collections.deque()).append(turn)
            try:
                await turn  # the slot was taken for it (``_release``)
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release(group)  # handed a slot just as it was cancelled: pass it on
                else:
                    self._forget(group, turn)
                raise
        try:
            yield
        finally:
            self._release(group)

    def _forget(self, group: Hashable, turn: asyncio.Future[None]) -> None:
        queue = self.waiting.get(group)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self.waiting[group]

    def _release(self, group: Hashable) -> None:
        self.free += 1
        left = self.held.get(group, 0) - 1
        if left > 0:
            self.held[group] = left
        else:
            self.held.pop(group, None)
        for waiter in list(self.waiting):  # the first group in the round that may take it
            if not self.may_take(waiter):
                continue
            queue = self.waiting.pop(waiter)
            while queue and queue[0].done():  # cancelled meanwhile
                queue.popleft()
            if queue:
                turn = queue.popleft()
                if queue:
                    self.waiting[waiter] = queue  # served: to the back of the round
                self._take(waiter)
                turn.set_result(None)
                return


class Background:
    """A controller's own tasks, timers and resync loop, with one ``stop()``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()  # referenced until done (asyncio keeps weak refs only)
        self._timers: list[KeyedTimers[Any]] = []

    def spawn(self, coro: Awaitable[Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        if name:
            task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def timers(self) -> KeyedTimers[Any]:
        timers: KeyedTimers[Any] = KeyedTimers(self)
        self._timers.append(timers)
        return timers

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        return frozenset(self._tasks)

    def resync(self, period: float, sweep: Callable[[], Awaitable[None]], *, paused: Callable[[], bool],
               until_acting: Callable[[], Awaitable[object]] | None = None,
               initial: Callable[[], Awaitable[None]] | None = None) -> asyncio.Task[Any]:
        """Every ``period`` (jittered) run ``sweep()``, skipped while ``paused()`` (a standby replica);
        ``initial()`` once first. With ``until_acting`` (``Access.until_acting``), a standby sweeps at
        once when it starts to act: its event handlers did nothing while it stood by, so the sweep is
        the takeover's pass over everything its indexes hold. A sweep that fails unexpectedly is
        logged and the loop goes on."""

        async def loop() -> None:
            if initial is not None:
                await self._survive(initial)
            while True:
                if paused() and until_acting is not None:
                    await until_acting()
                    await self._survive(sweep)
                await asyncio.sleep(jittered(period))
                if not paused():
                    await self._survive(sweep)

        return self.spawn(loop(), name=f"{self.name} resync")

    async def _survive(self, sweep: Callable[[], Awaitable[None]]) -> None:
        try:
            await sweep()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception(f"{self.name}: resync failed; the next one tries again")

    async def stop(self) -> None:
        """Cancel every timer, the resync loop and every task in flight, and wait until they are done."""
        for timers in self._timers:
            timers.cancel_all()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
