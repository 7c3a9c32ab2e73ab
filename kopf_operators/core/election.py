"""Leader election on a coordination.k8s.io Lease: of the replicas of a release, only the holder acts.

The rules are client-go's (``k8s.io/client-go/tools/leaderelection``), the ones every Go controller
and ``kubectl get lease`` users know: one Lease per release, in the operator's namespace; the holder
renews it every ``retry_period`` and steps down when it has not renewed for ``renew_deadline``; a
candidate takes it over once it has seen no change of it for ``lease_duration``, or at once when it is
released (no holder); one rule is added: a process that has just started leaves a released Lease to a
warm standby (below). Durations are whole seconds and the renew deadline is shorter than the lease
duration: the holder stops acting before anyone may take over, even with a late renewal.

Why not the official client's ``kubernetes.aio.leaderelection`` (kubernetes 37, installed): it has no
release (a rolling update would wait a whole lease duration: 15 s instead of < 3 s); a candidate
counts the lease duration from the poll that saw the last renewal, up to one retry period late, so a
SIGKILLed holder is replaced after 15-19 s instead of at most 15 s; it stamps renewals with the local
time marked as UTC ("Z") whatever the time zone; and it needs a second client stack beside the access
layer (its own configuration loading and connection pool, outside the layer's retries, error model and
metrics). This elector is small, and writes through ``Access`` (the one access layer); a standby's
only writes are its attempts at the Lease (``Access`` lets those through while it refuses the rest).

Timing. A candidate that sees a changed record between two of its polls knows that the change happened
after the earlier one was sent, so it counts the lease duration from there (when the polls were at
most ``retry_period + 1`` s apart; else from the later one, as client-go does). The holder's renewal
was sent before it was applied, and the holder steps down ``renew_deadline`` after sending its last
successful renewal: the candidate takes over at least ``lease_duration - renew_deadline - retry_period
- 1`` = 2 s (defaults) after the holder stopped. With monotonic clocks only: no clock skew matters.

A released Lease goes to a warm standby. When a holder's pod is deleted, its release and the start of
the Deployment's replacement pod race; a replacement that took the Lease would act cold (list all it
watches first) while a warm standby, ready to act, waited for its next look. So only a candidate that
had been watching the Lease for ``retry_period + 1`` s when it first saw it released takes it at once;
one that had not (a process that has just started) waits that long after that first sight, by when
every standby, looking every ``retry_period``, has had its look. Alone, it takes it then.

Where it runs. The election runs on a thread of its own, with its own event loop and connection
(``ElectionThread``): on the process's event loop, a holder busy with a burst (10,000 objects arriving
on a loaded node) sent no renewal for over a minute and lost the Lease for nothing. Fencing does not
depend on that thread being told anything in time either: each successful renewal moves the process's
access layer's fence to its renew deadline (``Access.fence``), and no write is sent after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from kopf_operators.core import metrics
from kopf_operators.core.access import Access, own_connections
from kopf_operators.core.api import LEASE, AlreadyExists, ApiError
from kopf_operators.core.conventions import env_bool

logger = logging.getLogger("kopf_operators.election")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Polls of a candidate at most this much longer apart than ``retry_period`` still bound a change between them.
POLL_SLACK_SECONDS = 1.0


def _env_seconds(env: Mapping[str, str], name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number of seconds") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be at least 1 second")
    return value


@dataclasses.dataclass(frozen=True)
class LeaseSettings:
    """LEADER_ELECTION and the Lease's name, namespace and durations (whole seconds)."""

    enabled: bool = False
    name: str = "kopf-operators"
    namespace: str = "default"
    duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2

    def __post_init__(self) -> None:
        if not self.renew_deadline < self.duration:
            raise ValueError(f"LEASE_RENEW_DEADLINE_SECONDS ({self.renew_deadline}) must be shorter than "
                             f"LEASE_DURATION_SECONDS ({self.duration})")
        if not self.retry_period < self.renew_deadline:
            raise ValueError(f"LEASE_RETRY_PERIOD_SECONDS ({self.retry_period}) must be shorter than "
                             f"LEASE_RENEW_DEADLINE_SECONDS ({self.renew_deadline})")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 service_account_namespace: Path = SERVICE_ACCOUNT_NAMESPACE) -> LeaseSettings:
        env = os.environ if env is None else env
        namespace = (env.get("LEASE_NAMESPACE") or env.get("POD_NAMESPACE") or "").strip()
        if not namespace:
            with contextlib.suppress(OSError):
                namespace = service_account_namespace.read_text().strip()
        return cls(enabled=env_bool(env, "LEADER_ELECTION"),
                   name=(env.get("LEASE_NAME") or "").strip() or cls.name,
                   namespace=namespace or cls.namespace,
                   duration=_env_seconds(env, "LEASE_DURATION_SECONDS", cls.duration),
                   renew_deadline=_env_seconds(env, "LEASE_RENEW_DEADLINE_SECONDS", cls.renew_deadline),
                   retry_period=_env_seconds(env, "LEASE_RETRY_PERIOD_SECONDS", cls.retry_period))


def own_identity() -> str:
    """The pod's name (its hostname) and a unique suffix, as client-go's candidates name themselves."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def micro_time(epoch: float) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Mapping[str, Any]) -> tuple[Any, ...]:
    spec = lease.get("spec") or {}
    return (spec.get("holderIdentity") or "", spec.get("renewTime"), spec.get("acquireTime"),
            spec.get("leaseTransitions"), spec.get("leaseDurationSeconds"))


class Elector:
    """One candidate for the Lease. ``run()`` elects until the process stops (a holder that loses the
    Lease calls ``on_lost`` and returns: the process exits); ``release()`` hands it over at shutdown.

    ``access`` makes the Lease's requests; ``acting`` (``access`` when None) is the process's access
    layer, whose writes the Lease governs: while this replica does not hold the Lease, ``acting.paused``
    is True: it refuses every write but the Lease's, and the controllers' resync loops and timers skip
    their work. While it holds it, ``acting`` is fenced at the renew deadline of the last renewal that
    succeeded (``Access.fence``): no write after that moment, even when the loss has not been
    noticed yet. ``loop``: the event loop that owns ``acting`` and ``on_lost`` when the election runs
    on another one (``ElectionThread``): they are called there, thread-safely."""

    def __init__(self, access: Access, settings: LeaseSettings, on_lost: Callable[[], None],
                 identity: str | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 acting: Access | None = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.access = access
        self.acting = access if acting is None else acting
        self.loop = loop
        self.settings = settings
        self.on_lost = on_lost
        self.identity = identity or own_identity()
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.leading = False
        self.lease: dict[str, Any] | None = None  # the newest version read or written
        self._observed: tuple[Any, ...] | None = None  # the record last seen
        self._observed_at = 0.0  # the earliest the record last seen can have been written (clock)
        self._poll_sent: float | None = None  # when the previous read was sent (clock)
        self._first_read: float | None = None  # when the first read that got an answer was sent (clock)
        self._free_at = 0.0  # when this candidate may take the Lease last seen released (clock)
        self._renewed_at = 0.0  # when this holder's last successful write was sent (clock)
        self._released = False
        self._stopping = False  # the process was told to stop: no attempt after this
        self._wake = asyncio.Event()  # ends a pause between attempts early (set by ``stop()``)
        self._gauge = metrics.LEADER.labels(lease=settings.name)
        self._gauge.set(0)
        self.acting.paused = True

    @property
    def where(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this candidate holds the Lease after it."""
        sent = self.clock()
        lease = await self.access.read(LEASE, self.settings.namespace, self.settings.name)
        if lease is None:
            try:
                self.lease = await self.access.create(LEASE, self._body(None, sent))
            except AlreadyExists:  # another candidate created it first: see it at the next poll
                self._poll_sent = None
                return False
            self._seen(self.lease, sent)
            return True
        received = self.clock()
        record = _record(lease)
        # Polls at most this far apart bound a change between them; watching this long makes a standby warm.
        span = self.settings.retry_period + POLL_SLACK_SECONDS
        if self._first_read is None:
            self._first_read = sent
        if record != self._observed:
            previous = self._poll_sent
            bounded = previous is not None and received - previous <= span
            self._observed = record
            self._observed_at = previous if previous is not None and bounded else received
            self._free_at = sent if sent - self._first_read >= span else sent + span
        self._poll_sent = sent
        self.lease = lease
        if record[0] != self.identity and self.clock() < self.expiry():
            return False
        try:
            answer = await self.access.replace(LEASE, self._body(lease, sent))
        except ApiError as exc:
            if exc.status == 409:  # somebody else wrote it first
                return False
            raise
        if answer is None:  # deleted meanwhile: created again at the next attempt
            return False
        self._seen(answer, sent)
        return True

    def expiry(self) -> float:
        """When this candidate may take the Lease over (clock): when the holder's claim ends if it is not
        renewed; when it is released, at once for a candidate that was watching before, else a retry
        period and a second after this one first saw it released (a warm standby goes first)."""
        if self._observed is not None and not self._observed[0]:
            return self._free_at
        duration = (self._observed or ())[4:5] or (None,)
        return self._observed_at + float(duration[0] or self.settings.duration)

    def _seen(self, answer: dict[str, Any], sent: float) -> None:
        self.lease = answer
        self._observed, self._observed_at = _record(answer), sent

    def _body(self, lease: Mapping[str, Any] | None, sent: float) -> dict[str, Any]:
        now = micro_time(self.wall())
        spec = dict((lease or {}).get("spec") or {})
        mine = spec.get("holderIdentity") == self.identity
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.settings.duration, renewTime=now,
                    acquireTime=spec.get("acquireTime") if mine and spec.get("acquireTime") else now,
                    leaseTransitions=int(spec.get("leaseTransitions") or 0) + (0 if mine or lease is None else 1))
        metadata = dict((lease or {}).get("metadata") or {"name": self.settings.name})
        metadata["namespace"] = self.settings.namespace
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    async def _attempt(self, timeout: float) -> bool:
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), max(timeout, 0.001))
        except (ApiError, TimeoutError) as exc:
            logger.debug("Lease %s: attempt failed: %s", self.where, exc)
            return False

    def stop(self) -> None:
        """The process has been told to stop (SIGTERM, SIGINT): from now on no attempt at the Lease. An
        attempt already sent finishes, but what it wins is never acted on; ``run()`` then releases the
        Lease (when this replica holds it) and returns. Called at the signal, not at Kopf's cleanup:
        a standby that kept campaigning while Kopf wound down could take a Lease that the holder had
        just released, and write on its way out."""
        self._stopping = True
        self._wake.set()

    async def _pause(self, seconds: float) -> None:
        """``sleep(seconds)``, cut short by ``stop()``."""
        if self._stopping:
            return
        sleeping = asyncio.ensure_future(self.sleep(seconds))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((sleeping, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            woken.cancel()

    async def run(self) -> None:
        """Elect until stopped (``stop()``: the Lease is released) or cancelled; a holder that cannot
        renew within the deadline, or finds another holder, stops acting at once, calls ``on_lost``
        and returns."""
        retry = float(self.settings.retry_period)
        while not self._released and not self._stopping:
            if not self.leading:
                sent = self.clock()
                if await self._attempt(self.settings.renew_deadline):
                    self._renewed_at = sent
                    if self._stopping:  # won by an attempt sent before the stop: handed back below
                        break
                    self._acquired()
                    await self._pause(retry)
                else:  # again after a retry period, or as soon as the holder's claim ends
                    await self._pause(min(retry, max(0.0, self.expiry() - self.clock()) + 0.01))
                continue
            sent = self.clock()
            deadline = self._renewed_at + self.settings.renew_deadline
            renewed = await self._attempt(deadline - sent)
            if renewed:
                self._renewed_at = sent
                self.acting.fence.close_at(sent + self.settings.renew_deadline, self.clock)
                await self._pause(retry)
            elif self.clock() >= deadline or (self._observed or ("",))[0] not in ("", self.identity):
                self._lost()
                return
            else:
                await self._pause(min(retry, max(0.0, deadline - self.clock())))
        if self._stopping:
            await self.release()

    def _on_acting_loop(self, call: Callable[..., object], *args: Any) -> None:
        """``call(*args)`` on the loop that owns ``acting``: at once when that is this one."""
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if self.loop is None or self.loop is here:
            call(*args)
        else:
            with contextlib.suppress(RuntimeError):  # that loop is closed: the process is exiting
                self.loop.call_soon_threadsafe(call, *args)

    def _set_paused(self, paused: bool) -> None:
        if paused:  # the fence first, from this thread: no write from now on, whatever that loop does
            self.acting.fence.close_at(-math.inf, self.clock)
        self._on_acting_loop(setattr, self.acting, "paused", paused)

    def _acquired(self) -> None:
        self.leading = True
        self.acting.fence.close_at(self._renewed_at + self.settings.renew_deadline, self.clock)
        self._set_paused(False)
        self._gauge.set(1)
        logger.info("Acting: this replica (%s) holds the Lease %s", self.identity, self.where)

    def _lost(self) -> None:
        self.leading = False
        self._set_paused(True)
        self._gauge.set(0)
        logger.warning("Lost the Lease %s (not renewed within %d s, or taken over): exiting, so that the "
                       "restarted process stands by with fresh state", self.where, self.settings.renew_deadline)
        self._on_acting_loop(self.on_lost)

    async def release(self, timeout: float = 2.0) -> None:
        """Stop acting, then give the Lease up (no holder) so that a standby takes it over at once."""
        self._released = self._stopping = True
        self._wake.set()
        self.leading = False
        self._set_paused(True)
        self._gauge.set(0)
        if not self.holds():
            return
        try:
            if await asyncio.wait_for(self._release(), timeout):
                logger.info("Released the Lease %s", self.where)
        except (ApiError, TimeoutError) as exc:  # a standby takes over when the lease duration ends
            logger.warning("Could not release the Lease %s (%s): a standby takes over within %d s",
                           self.where, exc or type(exc).__name__, self.settings.duration)

    def holds(self) -> bool:
        """Whether the newest version of the Lease this replica read or wrote names it the holder."""
        return self.lease is not None and (self.lease.get("spec") or {}).get("holderIdentity") == self.identity

    async def _release(self) -> bool:
        """True when this replica cleared the holder; False when the Lease is gone or no longer its own."""
        lease = self.lease
        for _ in range(2):  # a renewal in flight when the election was stopped may have moved it on
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return False  # gone, or no longer ours (taken over after a loss): nothing to hand over
            spec = dict(lease.get("spec") or {})
            spec.pop("holderIdentity", None)
            spec.update(leaseDurationSeconds=1, renewTime=micro_time(self.wall()), acquireTime=micro_time(self.wall()))
            try:
                self.lease = await self.access.replace(LEASE, {**lease, "spec": spec})
                return True
            except ApiError as exc:
                if exc.status != 409:
                    raise
            lease = self.lease = await self.access.read(LEASE, self.settings.namespace, self.settings.name)
        raise ApiError(409, "Conflict")


class ElectionThread:
    """An ``Elector`` on a thread of its own, with its own event loop and its own connection to the API
    server (an ``Access`` of its own on the process's client configuration).

    Why: on the process's event loop, the renewals queue behind Kopf's processing. 10,000 objects
    arriving on a loaded 2-core node kept that loop from sending a renewal for over a minute, and the
    holder lost its Lease for nothing. Here a renewal needs only a turn of the interpreter (Python hands
    it to another thread every 5 ms), not a turn of a busy loop. The process's access layer is fenced
    from this thread (``Access.fence``): its writes stop at the renew deadline of the last
    successful renewal, whether or not its loop has run since; being paused and ``on_lost`` reach that
    loop thread-safely.

    Created, started and stopped from the process's event loop."""

    def __init__(self, access: Access, settings: LeaseSettings, on_lost: Callable[[], None],
                 identity: str | None = None) -> None:
        self.process_loop = asyncio.get_running_loop()
        self.loop = asyncio.new_event_loop()
        self.elector = Elector(own_connections(access), settings, on_lost, identity=identity, acting=access,
                               loop=self.process_loop)
        self.done = self.process_loop.create_future()  # set when the thread has finished
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, name=f"lease {settings.name}", daemon=True)

    @property
    def identity(self) -> str:
        return self.elector.identity

    @property
    def where(self) -> str:
        return self.elector.where

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        try:
            self.loop.run_until_complete(self._elect())
        finally:
            self.loop.close()
            with contextlib.suppress(RuntimeError):  # the process's loop is closed: nobody waits
                self.process_loop.call_soon_threadsafe(_set_result, self.done)

    async def _elect(self) -> None:
        self._task = asyncio.current_task()
        try:
            await self.elector.run()
        finally:
            # Stopped: already released. Lost: clears the Lease if nobody has taken it yet (a quicker
            # handover than the lease duration). Cancelled: releases what it holds.
            await self.elector.release()
            await self.elector.access.close()

    def stop(self) -> None:
        """``Elector.stop()``, from any thread: no attempt from now on; the holder releases the Lease."""
        with contextlib.suppress(RuntimeError):  # its loop is closed: the election has ended
            self.loop.call_soon_threadsafe(self.elector.stop)

    async def wait(self, timeout: float) -> bool:
        """Wait (on the process's loop) up to ``timeout`` for the election to end; True when it has."""
        await asyncio.wait({self.done}, timeout=timeout)
        return self.done.done()

    async def close(self, timeout: float) -> None:
        """Stop it and wait up to ``timeout`` for it to release the Lease; cancel it after that (it
        still releases, up to ``Elector.release``'s own timeout)."""
        self.stop()
        if await self.wait(timeout):
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(lambda: self._task.cancel() if self._task is not None else None)
        await self.wait(2.5)


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
