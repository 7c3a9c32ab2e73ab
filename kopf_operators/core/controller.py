"""The controller toolkit: the machinery every controller needs outside Kopf's own handlers.

Kopf retries its handlers itself, but a controller also acts from its own timers (a retry, a crash
backoff's end, a burst's status flush) and from a periodic resync. Those live here, once:

- ``first(index, key)`` / ``values(index, key)``: one entry of a Kopf index (or of a plain dict in tests);
- ``backoff_delay``: the one backoff formula (doubling from ``first`` to ``cap``, with ±20 % jitter so
  that keys failing together do not retry together), and ``Backoff`` counting failures per key;
- ``Background``: the controller's tasks (referenced until done), its keyed timers (``KeyedTimers``:
  at most one pending per key; when one fires, its coroutine runs as a task) and its resync loop
  (jittered, skipped while the process stands by, run at once when it starts to act); ``stop()``
  cancels all of them and waits;
- ``MemoSlot``: one typed entry of Kopf's ``memo`` (handlers reach their controller as ``SLOT(memo)``,
  so mypy checks every call from a handler into a controller; ``memo.x`` would be ``Any``).

The one reconcile shape (a pass is observe -> decide -> act) rests on three more pieces:
- ``KeyedState``: everything a controller keeps per key, registered once, so that one ``forget(key)``
  drops all of it when the object goes (maps, sets, backoffs, timers, newest versions);
- ``Newest``: the newest known version of each key's object, where the watch lags behind: the answers
  to our own writes (and tombstones of our deletes) until the watch catches up, or the newest of
  several reports that may arrive out of order;
- ``GuardedPass``: one pass for one key outside Kopf's retrying handlers: skipped while paused, a
  failure counted, said in the log and retried with backoff (never hot), a success resets the backoff;
  with a ``FairLimit``, each pass holds a slot of its key's group, and an event's pass that must wait
  for one is handed over to a task (``submit``) so that the event returns at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import random
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Hashable,
    Mapping,
    MutableMapping,
)
from typing import Any, Generic, Literal, Protocol, TypeVar

from kopf_operators.core import metrics
from kopf_operators.core.access import ApiError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")

# What a controller reads a Kopf index as: Kopf's ``kopf.Index[K, V]`` is a Mapping from a key to a
# store (a collection) of values; a plain ``dict[K, list[V]]`` is one too (unit tests).
Index = Mapping[K, Collection[V]]

logger = logging.getLogger("kopf_operators.controller")

# ±20 % on every delay: retries, backoffs and resyncs of many keys (or replicas) spread out.
JITTER = (0.8, 1.2)


def first(index: Mapping[K, Collection[V]] | None, key: K) -> V | None:
    """The one value an index holds under ``key`` (None when absent)."""
    for value in (index or {}).get(key) or ():
        return value
    return None


def values(index: Mapping[K, Collection[V]] | None, key: K) -> list[V]:
    """Every value an index holds under ``key``."""
    return list((index or {}).get(key) or ())


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


class MemoSlot(Generic[T]):
    """One typed entry of Kopf's ``memo`` (a dict with attribute access, shared by all handlers)."""

    def __init__(self, name: str, kind: type[T]) -> None:
        self.name, self.kind = name, kind

    def set(self, memo: MutableMapping[str, Any], value: T) -> T:
        memo[self.name] = value
        return value

    def __call__(self, memo: Mapping[str, Any]) -> T:
        value = memo.get(self.name)
        if not isinstance(value, self.kind):
            raise RuntimeError(f"memo.{self.name} is not a {self.kind.__name__}: its startup handler has not run")
        return value

    def present(self, memo: Mapping[str, Any]) -> bool:
        return isinstance(memo.get(self.name), self.kind)


# --- the one reconcile shape ---------------------------------------------------------------------


class Forgetful(Protocol):
    """A part of a controller's per-key state."""

    def forget(self, key: Any) -> None: ...


class PerKey(dict[K, V]):
    """A map of per-key state that a ``KeyedState`` forgets."""

    def forget(self, key: K) -> None:
        self.pop(key, None)


class PerKeySet(set[K]):
    """A set of keys that a ``KeyedState`` forgets."""

    def forget(self, key: K) -> None:
        self.discard(key)


P = TypeVar("P", bound=Forgetful)


class KeyedState(Generic[K]):
    """Everything a controller keeps per key, registered where it is made: one ``forget(key)`` drops
    all of it, so nothing is left behind (or fires later) for an object that is gone, and a new piece
    of state cannot be forgotten by the cleanup."""

    def __init__(self) -> None:
        self._parts: list[Forgetful] = []
        self._hooks: list[Callable[[K], None]] = []

    def track(self, part: P) -> P:
        self._parts.append(part)
        return part

    def map(self) -> PerKey[K, Any]:
        """A new per-key map (typed by the caller: ``self.x: PerKey[Key, int] = state.map()``)."""
        return self.track(PerKey())

    def set(self) -> PerKeySet[K]:
        return self.track(PerKeySet())

    def on_forget(self, hook: Callable[[K], None]) -> None:
        """Cleanup that is more than dropping an entry (say, giving back a reserved token)."""
        self._hooks.append(hook)

    def forget(self, key: K) -> None:
        for hook in self._hooks:
            hook(key)
        for part in self._parts:
            part.forget(key)


@dataclasses.dataclass(frozen=True)
class _Known(Generic[V]):
    version: int
    identity: Hashable
    value: V | None  # None: gone at this version (a tombstone)


def version_of(resource_version: Any) -> int:
    """A resourceVersion as a number to compare (0 when absent or not a number)."""
    try:
        return int(resource_version or 0)
    except (TypeError, ValueError):
        return 0


class Newest(Generic[K, V]):
    """The newest known version of each key's object, where Kopf's watch lags behind.

    Two uses, one per instance:
    - an overlay of our own writes on an index (``remember``/``remember_gone`` then ``current(key,
      indexed)``): the answer to our write is newer than the index until the watch delivers that
      version (same identity, version at least ours), then the index is the truth again;
    - the newest of reports that may arrive out of order (``saw`` then ``seen``): an older report never
      replaces a newer one, and a deletion is remembered as "gone at that version".

    ``version(value)`` orders the versions of one object; ``identity(value)`` tells objects of the same
    key apart (a uid: a deleted and re-created object is another one). ``ours_until_seen``: we create
    these objects, so a written value the index does not hold yet (or holds as another object) stays
    the newest; without it the index is the authority on existence (an object gone from it, or
    replaced, drops what we wrote to the old one).

    Where each operator uses it:
    - immortal: an overlay of ImmortalContainers (``remember`` after a status patch, then
      ``newer(ic, event body)``) and the newest report of its pod (``saw`` for every indexed pod, the
      pod event, None when DELETED, and our create's answer; then ``seen``);
    - Copyrator: an overlay of copies with ``ours_until_seen`` (we create them; ``remember_gone``
      after our delete), and the newest report of each source;
    - the re-roller: an overlay of WorkloadViews, then ``newer(view, event_view)``;
    - Blackadder's ledgers: ``ours_until_seen`` with no index (we are the ledger's only writer):
      ``remember`` after our read and after every write.
    """

    def __init__(self, version: Callable[[V], int], identity: Callable[[V], Hashable], *,
                 ours_until_seen: bool = False) -> None:
        self.version, self.identity = version, identity
        self.ours_until_seen = ours_until_seen
        self._known: dict[K, _Known[V]] = {}

    def __len__(self) -> int:
        return len(self._known)

    def remember(self, key: K, value: V) -> None:
        """The answer to our own write (or our own read): the newest version there is."""
        self._known[key] = _Known(self.version(value), self.identity(value), value)

    def remember_gone(self, key: K, identity: Hashable) -> None:
        """We deleted the object ``identity``: absent until the watch no longer holds it."""
        self._known[key] = _Known(0, identity, None)

    def current(self, key: K, indexed: V | None = None) -> V | None:
        """The newest of what we remember and ``indexed`` (the index's value, None when it holds none);
        what we remember is dropped once the index has caught up with it."""
        known = self._known.get(key)
        if known is None:
            return indexed
        same = indexed is not None and self.identity(indexed) == known.identity
        if known.value is None:  # our delete
            if same:
                return None  # the watch has not delivered the deletion yet
        elif same:
            if indexed is not None and self.version(indexed) < known.version:
                return known.value
        elif self.ours_until_seen:
            return known.value  # our create (or re-create) the watch has not delivered yet
        del self._known[key]
        return indexed

    def newer(self, known: V | None, reported: V | None) -> V | None:
        """The newer of what is known and what an event just reported (not remembered): the report
        when it is another object or not older (a resourceVersion is a global order, and the same
        version is the same state)."""
        if reported is None:
            return known
        if known is None or self.identity(reported) != self.identity(known):
            return reported
        return reported if self.version(reported) >= self.version(known) else known

    def saw(self, key: K, value: V | None, version: int, identity: Hashable = None) -> None:
        """A report of the object at ``version`` (None: deleted at that version): kept unless an older
        one; a report of the same version replaces the one held (the same state)."""
        known = self._known.get(key)
        if known is None or version >= known.version:
            self._known[key] = _Known(version, identity, value)

    def seen(self, key: K) -> V | None:
        """The newest reported value (None: nothing reported, or gone)."""
        known = self._known.get(key)
        return None if known is None else known.value

    def held(self) -> list[tuple[K, V]]:
        """Every value remembered (tombstones left out)."""
        return [(key, known.value) for key, known in self._known.items() if known.value is not None]

    def forget(self, key: K) -> None:
        self._known.pop(key, None)


# What a pass may answer: False asks for another try with backoff (say, something in the way that no
# watch reports); anything else is done (the key's backoff starts afresh).
RETRY = False


class _Hold:
    def __repr__(self) -> str:
        return "HOLD"


# What a pass may answer when something else it started will run it again (a watch of the thing in the
# way): no retry now, and the key's backoff stays as it is (so a fallback that keeps failing still doubles).
HOLD: Any = _Hold()


class GuardedPass(Generic[K]):
    """One pass for one key outside Kopf's retrying handlers (an event the controller handles itself,
    a timer, the resync, a daemon's cycle). ``run(key, trigger, *args)`` is the pass.

    - Nothing while ``paused()`` (Kopf has paused this process: a standby writes nothing).
    - A failure (``catch``) is counted as ``errors_total{kind=error_kind}``, said in one log line
      (``say(key, trigger, exc, delay)``; ``traceback``: with the traceback, for a crash) and, when
      ``retry`` is (first, cap) and ``retried(exc)``, tried again as ``run(key, "retry")`` after a
      backoff that doubles per failure in a row (one pending retry per key, ``if_pending`` as in
      ``KeyedTimers.start``). Never hot.
    - A pass answering ``RETRY`` (False) is tried again the same way, without a log line (it says why
      itself); ``HOLD`` neither retries nor resets; any other answer resets the key's backoff.
    - ``limit``: at most this many passes at once (over all keys), or a ``FairLimit`` shared by the
      keys' ``group``s (a namespace): each pass holds a slot of its group while it runs.
    - ``later(key, delay)``: run the pass again after ``delay`` (the retry's timer: one per key).
    - ``submit(key, trigger, report)``: an event's pass. It runs now when its group may take a slot;
      otherwise it is handed over to a task that waits for the group's turn, so that the event returns
      at once. One handed-over pass per key: later events only ``merge`` their report into the one it
      will run with. A handed-over pass that crashes has no caller to raise to: it is logged.
    """

    def __init__(self, operator: str, background: Background, run: Callable[..., Awaitable[Any]], *,
                 say: Callable[[K, str, Exception, float | None], str],
                 paused: Callable[[], bool] = lambda: False, retry: tuple[float, float] | None = None,
                 if_pending: IfPending = "keep", catch: tuple[type[Exception], ...] = (ApiError,),
                 retried: Callable[[Exception], bool] = lambda exc: True, error_kind: str = "api",
                 traceback: bool = False, limit: int | FairLimit | None = None,
                 group: Callable[[K], Hashable] = lambda key: None,
                 merge: Callable[[Any, Any], Any] = lambda held, report: report,
                 retry_trigger: str = "retry", log: logging.Logger | None = None,
                 on_failure: Callable[[K, Exception], None] | None = None) -> None:
        self.operator, self.run, self.say = operator, run, say
        self.paused, self.catch, self.retried = paused, catch, retried
        self.error_kind, self.traceback, self.if_pending = error_kind, traceback, if_pending
        self.on_failure, self.retry_trigger, self.log = on_failure, retry_trigger, log or logger
        self.backoff: Backoff[K] | None = None if retry is None else Backoff(*retry)
        self.background = background
        self.timers: KeyedTimers[K] = background.timers()
        self.limit = FairLimit(limit) if isinstance(limit, int) else limit
        self.group, self.merge = group, merge
        self._handed: dict[K, Any] = {}  # key -> the report its handed-over pass runs with (``submit``)

    async def submit(self, key: K, trigger: str, report: Any = None) -> None:
        """An event's pass, run now or handed over to wait for a slot (see the class)."""
        if self.paused():
            return
        if key in self._handed:
            self._handed[key] = self.merge(self._handed[key], report)
        elif self.limit is None or self.limit.may_take(self.group(key)):
            await self(key, trigger, report)
        else:
            self._handed[key] = report
            self.background.spawn(self._handed_pass(key, trigger))

    async def _handed_pass(self, key: K, trigger: str) -> None:
        try:
            await self(key, trigger, handed=True)
        except Exception as exc:
            self.log.error(self.say(key, trigger, exc, None), exc_info=exc)  # no handler to say it

    async def __call__(self, key: K, trigger: str, *args: Any,
                       log: logging.Logger | logging.LoggerAdapter[Any] | None = None, handed: bool = False) -> bool:
        """One pass; True when it is done (no retry due). ``handed``: the pass ``submit`` handed over
        (it runs with the newest report once it holds its slot; nothing when its key was forgotten)."""
        if self.paused():
            if handed:
                self._handed.pop(key, None)
            return False
        try:
            if self.limit is None:
                answer = await self.run(key, trigger, *args)
            else:
                async with self.limit.hold(self.group(key)):
                    if handed:
                        if key not in self._handed:
                            return True  # forgotten meanwhile (the object is gone)
                        args = (self._handed.pop(key),)
                    answer = await self.run(key, trigger, *args)
        except asyncio.CancelledError:
            raise
        except self.catch as exc:
            metrics.error(self.operator, self.error_kind)
            if self.on_failure is not None:
                self.on_failure(key, exc)
            if self.retried(exc):
                delay = self.retry_later(key, if_pending=self.if_pending)
            else:  # refused: counted (``failures``: say it once), retried only by the next change
                delay = None
                if self.backoff is not None:
                    self.backoff.next_delay(key)
            message = self.say(key, trigger, exc, delay)
            if message:
                (log or self.log).log(logging.WARNING if not self.traceback else logging.ERROR, message,
                                    exc_info=self.traceback)
            return False
        if answer is RETRY:
            self.retry_later(key, if_pending=self.if_pending)
            return False
        if answer is HOLD:
            return True
        if self.backoff is not None:
            self.backoff.reset(key)
        return True

    def retry_later(self, key: K, *, if_pending: IfPending = "keep") -> float | None:
        """Try ``key`` again after its backoff; the seconds until it is tried (None: no retries, or one
        already pending is kept). An earlier look kept under ``"earlier"`` is when it is tried: the
        failure's log line says that, not the backoff's longer delay."""
        if self.backoff is None or (if_pending == "keep" and self.timers.pending(key)):
            return None
        delay = self.backoff.next_delay(key)
        if not self.later(key, delay, if_pending=if_pending):
            return self.timers.due_in(key)
        return delay

    def later(self, key: K, delay: float, *, if_pending: IfPending = "earlier") -> bool:
        """Run the pass of ``key`` (as ``retry_trigger``) after ``delay``: a look again that a decision
        asks for shares the retry's one timer per key. False: a pending one was kept."""
        return self.timers.start(key, delay, lambda: self._retry(key), if_pending=if_pending)

    async def _retry(self, key: K) -> None:
        await self(key, self.retry_trigger)

    def failures(self, key: K) -> int:
        return 0 if self.backoff is None else self.backoff.failures(key)

    def forget(self, key: K) -> None:
        if self.backoff is not None:
            self.backoff.reset(key)
        self.timers.cancel(key)
        self._handed.pop(key, None)
