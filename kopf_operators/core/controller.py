"""The one reconcile shape: a pass for one key, outside Kopf's retrying handlers.

A pass is observe -> decide -> act, for one key (an object), and it returns what should happen next,
in controller-runtime's words (docs/architecture.md, "Glossary"):

- ``Done()``: the key is done; its backoff starts afresh (``reconcile.Result{}``);
- ``RequeueAfter(seconds)``: done, and run the pass again after ``seconds`` (``Result{RequeueAfter}``);
  an earlier pending run of the key is kept;
- ``Retry()``: run it again after the key's backoff, which doubles per retry in a row
  (``Result{Requeue: true}``, the rate limiter's ``AddRateLimited``); no log line: the pass says why;
- ``Terminal(error)``: a terminal error (``reconcile.TerminalError``): counted and said in one log line,
  not retried; the next change of the object (or the resync) runs the pass again;
- ``Waiting()``: nothing to do now: a watch the pass started runs the key again when what it waits for
  happens. The backoff stays as it is, so a fallback that keeps failing still doubles (controller-runtime
  has no such result: there a watch of another object is set up once, by the controller's builder).

A pass that raises one of ``PassSettings.catch`` is a failure: counted, said, and retried with backoff
when ``PassSettings.retried(exc)``; otherwise it is a ``Terminal`` one. ``GuardedPass`` runs the passes
(controller-runtime's ``Reconciler`` and the workqueue before it): skipped while paused (a standby),
at most so many at once (``FairLimit``), an event's pass that must wait for a slot handed over to a task
(``submit``) so that the event returns at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from kopf_operators.core import metrics
from kopf_operators.core.api import ApiError
from kopf_operators.core.background import Background, Backoff, FairLimit, IfPending, KeyedTimers

K = TypeVar("K", bound=Hashable)

logger = logging.getLogger("kopf_operators.controller")


# --- what a pass returns ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Done:
    """The key is done: its backoff starts afresh (controller-runtime: ``reconcile.Result{}``)."""


@dataclasses.dataclass(frozen=True)
class RequeueAfter:
    """Done, and run the pass again after ``seconds`` (``Result{RequeueAfter: …}``); the key's one timer
    is shared with its retries, and the earlier of the two is kept."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class Retry:
    """Run the pass again after the key's backoff (``Result{Requeue: true}``): something is in the way
    that no watch reports. The pass has said why; ``GuardedPass`` logs nothing."""


@dataclasses.dataclass(frozen=True)
class Terminal:
    """A terminal error (``reconcile.TerminalError``): counted, said in one log line, not retried; the next
    change of the object, or the resync, runs the pass again."""

    error: Exception


@dataclasses.dataclass(frozen=True)
class Waiting:
    """Nothing to do now: a watch this pass started runs the key again. Neither a retry nor a reset of
    the key's backoff (a fallback that keeps failing still doubles)."""


Result = Done | RequeueAfter | Retry | Terminal | Waiting

# The results without a field, made once.
DONE, RETRY, WAITING = Done(), Retry(), Waiting()


def _always(exc: Exception) -> bool:
    return True


def _no_group(key: Any) -> Hashable:
    return None


def _newest(held: Any, report: Any) -> Any:
    return report


@dataclasses.dataclass(frozen=True)
class PassSettings(Generic[K]):
    """How a ``GuardedPass`` runs its passes: one typed object, made where the controller is."""

    operator: str  # the ``operator`` label of ``errors_total``
    # The failure's one log line: ``say(key, trigger, exc, delay)`` (delay: seconds until the retry, None
    # when none is due); "" when it has said it itself.
    say: Callable[[K, str, Exception, float | None], str]
    paused: Callable[[], bool] = lambda: False  # a standby: no pass at all
    retry: tuple[float, float] | None = None  # the backoff (first, cap); None: no retries
    if_pending: IfPending = "keep"  # a retry while the key's timer is pending (``KeyedTimers.start``)
    catch: tuple[type[Exception], ...] = (ApiError,)  # what a failure of a pass is; anything else raises
    retried: Callable[[Exception], bool] = _always  # a caught failure to retry; else it is ``Terminal``
    error_kind: str = "api"  # the ``kind`` label of ``errors_total``
    traceback: bool = False  # log a failure with its traceback, as an error (a crash)
    # At most this many passes at once (over all keys), or a ``FairLimit`` shared by the keys' ``group``s.
    limit: int | FairLimit | None = None
    group: Callable[[K], Hashable] = _no_group
    merge: Callable[[Any, Any], Any] = _newest  # a handed-over pass's report and a later event's
    retry_trigger: str = "retry"  # the trigger of a pass its timer runs
    log: logging.Logger | None = None  # the failures' logger (None: this module's)
    on_failure: Callable[[K, Exception], None] | None = None  # each failure, caught or returned


class Requeues(Generic[K]):
    """The earliest look again each key's running pass asked for, returned as its result: for a pass that
    finds several reasons to look again as it goes (a rollout's interval, a pause's end, a budget's turn).
    A ``KeyedState`` part."""

    def __init__(self) -> None:
        self._due: dict[K, float] = {}

    def after(self, key: K, seconds: float) -> None:
        self._due[key] = min(seconds, self._due.get(key, seconds))

    def returned(self, run: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[Result]]:
        """``run`` (a pass that asks with ``after``), returning ``RequeueAfter`` the earliest it asked
        for, or ``Done``. A pass that fails asks for nothing: its retry looks again."""

        async def requeued(key: K, *args: Any) -> Result:
            try:
                await run(key, *args)
            except BaseException:
                self._due.pop(key, None)
                raise
            due = self._due.pop(key, None)
            return DONE if due is None else RequeueAfter(due)

        return requeued

    def forget(self, key: K) -> None:
        self._due.pop(key, None)


class GuardedPass(Generic[K]):
    """The passes of one controller, one key at a time, outside Kopf's retrying handlers (an event the
    controller handles itself, a timer, the resync, a daemon's cycle). ``run(key, trigger, *args)`` is
    the pass, and returns its ``Result``.

    - Nothing while ``paused()`` (Kopf has paused this process: a standby writes nothing).
    - A failure (``catch``, or a ``Terminal`` result) is counted as ``errors_total{kind=error_kind}``,
      said in one log line (``say``; with the traceback when ``traceback``) and, when the settings have a
      ``retry`` and ``retried(exc)``, tried again as ``run(key, retry_trigger)`` after a backoff that
      doubles per failure in a row (one pending timer per key). Never hot.
    - ``limit``: each pass holds a slot of its key's ``group`` while it runs.
    - ``submit(key, trigger, report)``: an event's pass. It runs now when its group may take a slot;
      otherwise it is handed over to a task that waits for the group's turn, so that the event returns
      at once. One handed-over pass per key: later events only ``merge`` their report into the one it
      will run with. A handed-over pass that crashes has no caller to raise to: it is logged.
    - ``retry_later(key)``: the retry of a failure seen outside a pass (a Kopf handler's, a watch's).
    """

    def __init__(self, background: Background, run: Callable[..., Awaitable[Result]],
                 settings: PassSettings[K]) -> None:
        self.run, self.settings, self.background = run, settings, background
        self.log = settings.log or logger
        self.backoff: Backoff[K] | None = None if settings.retry is None else Backoff(*settings.retry)
        self.timers: KeyedTimers[K] = background.timers()
        self.limit = FairLimit(settings.limit) if isinstance(settings.limit, int) else settings.limit
        self._handed: dict[K, Any] = {}  # key -> the report its handed-over pass runs with (``submit``)

    async def submit(self, key: K, trigger: str, report: Any = None) -> None:
        """An event's pass, run now or handed over to wait for a slot (see the class)."""
        if self.settings.paused():
            return
        if key in self._handed:
            self._handed[key] = self.settings.merge(self._handed[key], report)
        elif self.limit is None or self.limit.may_take(self.settings.group(key)):
            await self(key, trigger, report)
        else:
            self._handed[key] = report
            self.background.spawn(self._handed_pass(key, trigger))

    async def _handed_pass(self, key: K, trigger: str) -> None:
        try:
            await self(key, trigger, handed=True)
        except Exception as exc:
            self.log.error(self.settings.say(key, trigger, exc, None), exc_info=exc)  # no handler to say it

    async def __call__(self, key: K, trigger: str, *args: Any,
                       log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
                       handed: bool = False) -> Result | None:
        """One pass, and what came of it (a caught failure: ``Retry`` or ``Terminal``); None while
        paused. ``handed``: the pass ``submit`` handed over (it runs with the newest report once it
        holds its slot; ``Done`` at once when its key was forgotten meanwhile)."""
        if self.settings.paused():
            if handed:
                self._handed.pop(key, None)
            return None
        try:
            if self.limit is None:
                result = await self.run(key, trigger, *args)
            else:
                async with self.limit.hold(self.settings.group(key)):
                    if handed:
                        if key not in self._handed:
                            return DONE  # forgotten meanwhile (the object is gone)
                        args = (self._handed.pop(key),)
                    result = await self.run(key, trigger, *args)
        except asyncio.CancelledError:
            raise
        except self.settings.catch as exc:
            return self._failed(key, trigger, exc, retried=self.settings.retried(exc), log=log)
        return self._after(key, trigger, result, log)

    def _after(self, key: K, trigger: str, result: Result,
               log: logging.Logger | logging.LoggerAdapter[Any] | None) -> Result:
        if isinstance(result, Retry):
            self.retry_later(key, if_pending=self.settings.if_pending)
        elif isinstance(result, Terminal):
            return self._failed(key, trigger, result.error, retried=False, log=log)
        elif isinstance(result, Done | RequeueAfter):
            if self.backoff is not None:
                self.backoff.reset(key)
            if isinstance(result, RequeueAfter):
                self.timers.start(key, result.seconds, lambda: self._retry(key), if_pending="earlier")
        return result

    def _failed(self, key: K, trigger: str, exc: Exception, *, retried: bool,
                log: logging.Logger | logging.LoggerAdapter[Any] | None) -> Result:
        """A failure: counted, said once, retried with backoff or (terminal) only counted in the backoff."""
        metrics.error(self.settings.operator, self.settings.error_kind)
        if self.settings.on_failure is not None:
            self.settings.on_failure(key, exc)
        if retried:
            delay = self.retry_later(key, if_pending=self.settings.if_pending)
        else:  # terminal: counted (``failures``: say it once), retried only by the next change
            delay = None
            if self.backoff is not None:
                self.backoff.next_delay(key)
        message = self.settings.say(key, trigger, exc, delay)
        if message:
            (log or self.log).log(logging.ERROR if self.settings.traceback else logging.WARNING, message,
                                  exc_info=exc if self.settings.traceback else None)
        return RETRY if retried and self.backoff is not None else Terminal(exc)

    def retry_later(self, key: K, *, if_pending: IfPending = "keep") -> float | None:
        """Try ``key`` again after its backoff; the seconds until it is tried (None: no retries, or one
        already pending is kept). An earlier look kept under ``"earlier"`` is when it is tried: the
        failure's log line says that, not the backoff's longer delay."""
        if self.backoff is None or (if_pending == "keep" and self.timers.pending(key)):
            return None
        delay = self.backoff.next_delay(key)
        if not self.timers.start(key, delay, lambda: self._retry(key), if_pending=if_pending):
            return self.timers.due_in(key)
        return delay

    def look_in(self, key: K, seconds: float) -> None:
        """Look at ``key`` again after ``seconds`` (an earlier pending look wins), asked from outside its
        pass: another key's event that changes what its pass would decide. (A pass asks with its
        result, ``RequeueAfter``.)"""
        self.timers.start(key, seconds, lambda: self._retry(key), if_pending="earlier")

    async def _retry(self, key: K) -> None:
        await self(key, self.settings.retry_trigger)

    def failures(self, key: K) -> int:
        return 0 if self.backoff is None else self.backoff.failures(key)

    def forget(self, key: K) -> None:
        if self.backoff is not None:
            self.backoff.reset(key)
        self.timers.cancel(key)
        self._handed.pop(key, None)
