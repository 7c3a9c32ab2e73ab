"""The one door to Kopf's internals: every use of ``kopf._…`` and every monkeypatch of the process.

Nothing here happens on import. ``install()`` applies the patches, once, and only when the installed
Kopf is the version they were written and tested for (``KOPF_TESTED_VERSION``, equal to the exact pin
in pyproject.toml). On another version it patches nothing, logs one line, and the process runs on
stock Kopf: slower and bigger in a burst (the figures below), correct all the same; with leader
election, a standby is then cold (``warm_standby()``).

``install()`` must run before Kopf's ``spawn_tasks`` binds its event processor
(``functools.partial(processing.process_resource_event, …)`` in ``kopf._core.reactor.running``) and
creates its toggle sets, i.e. before ``kopf run`` starts the operator and after nothing else. The one
place that calls it is the process's entry point, ``kopf-operators run …`` (``python -m
kopf_operators``, ``kopf_operators/__main__.py``): Kopf's own CLI with the patches installed first.
Plain ``kopf run operators/*.py`` still works, unpatched.

The patches (each function's docstring: what it fixes, its measured gain from docs/performance.md, the
upstream issue it stands in for; docs/kopf-patches.md has the text of each upstream report):

- ``wake_gate_waiters_only_on_change``: Kopf's ToggleSet wakes its waiters only on a change of state;
- ``govern_event_processing``: ``governed`` around Kopf's per-event processor (a cap on objects
  processed at once, superseded/echoed/unchanged events skipped, and the Lease's gate);
  A listed object's handlers wait for every index as its raw event, not as a waiting Kopf worker, and
  without its data over ``ELIDE_LISTED_DATA_BYTES`` (``defer_listed``);
- ``lean_watched_bodies``: no ``metadata.managedFields`` in what Kopf lists and streams; ConfigMaps and
  Secrets listed ``BULKY_PAGE`` per page, pages read ahead up to ``READ_AHEAD_BYTES`` of data;
- ``small_tls_read_buffers``: asyncio's TLS read buffer of 64 KiB instead of 256 KiB;
- ``start_allocator_trim``: glibc's ``malloc_trim(0)`` every 10 s (a task, started by the startup handler);
- reads of Kopf's private registries: ``change_detecting_groups``, ``all_handlers``; its loader: ``preload``;
  its stop-flag checker task and its signals: ``when_stop_requested``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import importlib.metadata
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import kopf
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import api, fetching, watching
from kopf._cogs.helpers import loaders
from kopf._core.actions import invocation
from kopf._core.reactor import processing

from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.conventions import data_bytes, elide_data
from kopf_operators.core.echoes import Echo
from kopf_operators.core.runtime import TRIM_SECONDS, glibc_malloc_trim, small_tls_read_buffers, trim_allocator

logger = logging.getLogger("kopf_operators.kopf_patches")

# The Kopf release these patches were written for and tested with: pyproject.toml pins exactly this one
# (tests/unit/test_kopf_patches.py checks that they agree).
KOPF_TESTED_VERSION = "1.45.2"

# Memo keys the patched processor reads (process.py's MemoSlots use these names).
ACCESS_MEMO = "access"
EVENT_POLICY_MEMO = "event_policy"

# A measurement knob, not a setting: the patches named here (comma-separated function names of
# ``PATCHES``) are left out, so that a paired bench run can compare a patch with stock Kopf in the same
# process otherwise (docs/kopf-patches.md, "Measuring a patch"). Unset in production.
SKIP_ENV = "KOPF_PATCHES_SKIP"
PATCHES = ("wake_gate_waiters_only_on_change", "govern_event_processing", "lean_watched_bodies",
           "small_tls_read_buffers", "start_allocator_trim")

_installed = False
_skipped: frozenset[str] = frozenset()


def kopf_version() -> str:
    return importlib.metadata.version("kopf")


def installed() -> bool:
    """Whether ``install()`` has patched this process."""
    return _installed


def skipped_patches(env: Mapping[str, str]) -> frozenset[str]:
    """The patches ``SKIP_ENV`` names; a name that is not one of ``PATCHES`` is refused (a typo would
    otherwise measure the patched process against itself)."""
    names = frozenset(filter(None, (name.strip() for name in env.get(SKIP_ENV, "").split(","))))
    unknown = sorted(names - set(PATCHES))
    if unknown:
        raise ValueError(f"{SKIP_ENV}: no patch named {', '.join(unknown)} (one of {', '.join(PATCHES)})")
    return names


def install(version: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Apply every patch, once, if the installed Kopf (``version``: the installed one when None) is
    ``KOPF_TESTED_VERSION``; else patch nothing and say so in one line. True when patched. The
    patches ``SKIP_ENV`` names (``env``: the process's environment when None) are left out, in one
    line too."""
    global _installed, _skipped
    if _installed:
        return True
    skip = skipped_patches(os.environ if env is None else env)
    version = kopf_version() if version is None else version
    if version != KOPF_TESTED_VERSION:
        logger.warning(f"Kopf {version} is installed, but the patches of kopf_operators.core.kopf_patches were "
                       f"tested with Kopf {KOPF_TESTED_VERSION} only: running on stock Kopf, unpatched (slower and "
                       "bigger in a burst; a standby replica is cold). See docs/kopf-patches.md.")
        return False
    patches: dict[str, Callable[[], None]] = {
        "wake_gate_waiters_only_on_change": wake_gate_waiters_only_on_change,
        "govern_event_processing": govern_event_processing,
        "lean_watched_bodies": lean_watched_bodies,
        "small_tls_read_buffers": small_tls_read_buffers,
    }
    for name, patch in patches.items():
        if name not in skip:
            patch()
    filter_shards_in_process()  # not a measurement knob: sharding on a server without the gate needs it
    if skip:
        logger.warning(f"{SKIP_ENV}: left out {', '.join(sorted(skip))} (a measurement against stock Kopf)")
    _installed, _skipped = True, skip
    return True


def warm_standby() -> bool:
    """Whether a standby replica may run Kopf's watches and indexes while it waits for the Lease: only
    when ``governed`` holds every object's handlers at the Lease's gate (the patched processor)."""
    return _installed and "govern_event_processing" not in _skipped


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


# --- Kopf's ToggleSet: wake waiters only on a change -------------------------------------------------


def wake_gate_waiters_only_on_change() -> None:
    """Make Kopf's toggle sets wake their waiters only when the set's state changes.

    Fixes: Kopf gates every handler on all indexes being filled: during an initial listing each
    object's worker adds a toggle to the operator's one "indexed" set and drops it once its object is
    indexed, then waits on that set. Kopf wakes every waiting worker on each add and each drop, and
    each woken one re-checks and sleeps again: O(N²) wake-ups for N listed objects.

    Gain (docs/performance.md, "A restart in a big cluster"): a restart with 10,000 ImmortalContainers
    and their pods ran for over 6 minutes at 100 % CPU, 70 % of it in those wake-ups, before its first
    handler ran; a start with 5,000 ConfigMaps + 5,000 Secrets in place took 390 s to quiet (386 s
    CPU) before, 12 s (10.9 s CPU) after. 400 wake-ups for 200 objects without it, none with it.
    Re-measured against stock Kopf (paired, docs/kopf-patches.md): no gain shows any more at 2,000
    ConfigMaps (first handler and quiet within noise) while ``defer_listed`` keeps listed objects'
    workers off the gate; it still matters for resources with change handlers and without ``governed``.

    Upstream: not filed yet (docs/kopf-patches.md, "ToggleSet wakes every waiter on every change").

    A waiter waits only for the set's ``is_on()``, so a change that leaves it as it was wakes nobody.
    Kopf's private ``ToggleSet`` (its ``_condition`` and ``_toggles``). Before Kopf creates its toggle
    sets. Idempotent."""
    toggle_set = aiotoggles.ToggleSet
    if getattr(toggle_set, "_wakes_only_on_change", False):
        return

    async def make_toggle(self: aiotoggles.ToggleSet, __val: bool = False, *, name: str | None = None
                          ) -> aiotoggles.Toggle:
        toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
        async with self._condition:
            was_on = self.is_on()
            self._toggles.add(toggle)
            if self.is_on() != was_on:
                self._condition.notify_all()
        return toggle

    async def drop_toggles(self: aiotoggles.ToggleSet, toggles: Iterable[aiotoggles.Toggle]) -> None:
        async with self._condition:
            was_on = self.is_on()
            self._toggles.difference_update(toggles)
            if self.is_on() != was_on:
                self._condition.notify_all()

    async def drop_toggle(self: aiotoggles.ToggleSet, toggle: aiotoggles.Toggle) -> None:
        await drop_toggles(self, (toggle,))

    toggle_set.make_toggle = make_toggle  # type: ignore[method-assign]
    toggle_set.drop_toggle = drop_toggle  # type: ignore[method-assign]
    toggle_set.drop_toggles = drop_toggles  # type: ignore[method-assign]
    toggle_set._wakes_only_on_change = True  # type: ignore[attr-defined]


# --- Kopf's event processor, governed ----------------------------------------------------------------

ProcessEvent = Callable[..., Awaitable[Any]]
# What every index and handler of a resource reads of one object, its version left out.
Fingerprint = Callable[[Mapping[str, Any]], Hashable]


@dataclasses.dataclass(frozen=True)
class EventPolicy:
    """How Kopf's events are processed, outside the API groups that use Kopf's change detection."""

    # API groups with change handlers or daemons (``change_detecting_groups``): left to Kopf. It sleeps
    # inside their processing (retry backoff, consistency waits), where a sleeper would hold a slot,
    # and its change detection needs every event.
    kopf_change_groups: frozenset[str]
    # At most this many objects' events processed at once (None: no cap).
    slots: asyncio.Semaphore | None
    # (group, plural) -> its Fingerprint (``process.skip_unchanged``).
    fingerprints: dict[tuple[str, str], Fingerprint] = dataclasses.field(default_factory=dict)
    # uid -> the fingerprint of that object's newest event, for the fingerprinted resources.
    latest: dict[str, Hashable] = dataclasses.field(default_factory=dict)
    # uid -> Kopf's processing of a listed, indexed object's event, its handlers left until every
    # index is filled (``defer_listed``); uid -> set once those handlers are done, while they run.
    listed: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    handling: dict[str, asyncio.Event] = dataclasses.field(default_factory=dict)
    drainer: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)  # one while it runs

    def unchanged(self, resource: kopf.Resource, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Whether this is a modification that leaves the object's fingerprint as its previous
        event had it. Every event of a fingerprinted resource is remembered (a deletion forgets)."""
        fingerprint = self.fingerprints.get((resource.group, resource.plural))
        uid = (body.get("metadata") or {}).get("uid")
        if fingerprint is None or not uid:
            return False
        if event_type == "DELETED":
            self.latest.pop(uid, None)
            return False
        new, old = fingerprint(body), self.latest.get(uid)
        self.latest[uid] = new
        return event_type == "MODIFIED" and old == new


class ActingGate:
    """Kopf's "every index is filled" gate (its ``operator_indexed`` toggle set, which the processor
    waits on after indexing an object and before its handlers), extended by the Lease: a standby
    indexes such an object's event and holds its handlers here until it acts. The object's later
    events wait in its queue meanwhile (only resources with Kopf's change handlers: few objects, and
    Kopf's change detection compares each body with its own last-handled state)."""

    def __init__(self, indexed: Any, access: Access) -> None:
        self.indexed = indexed
        self.access = access

    async def drop_toggle(self, toggle: Any) -> None:
        await self.indexed.drop_toggle(toggle)

    async def wait_for(self, value: bool) -> None:
        await self.indexed.wait_for(value)
        await self.access.until_acting()


def governed(process: ProcessEvent) -> ProcessEvent:
    """``process`` (Kopf's ``process_resource_event``, one event of one object) with the Lease's gate
    for resources with Kopf's change handlers, and under the operator's ``EventPolicy`` (in its memo)
    for resources that have only indexes and event handlers:

    - resources with Kopf's change handlers, daemons or timers (Kopf writes their progress, finalizers
      and annotations itself): a standby (``Access.paused``) indexes the event and holds its handlers
      until it acts (``ActingGate``). The other resources are indexed and their event handlers run
      as on the holder, every event: their controllers write nothing while paused (the access layer
      refuses it), and make one level-triggered pass over their indexes when the Lease is taken
      (``background.Background.resync``), so the indexes stay current on the standby;
    - a MODIFIED event is skipped when a newer event of the same object is already queued (Kopf sets
      the object's ``stream_pressure`` then): the newer body carries its state forward to the indexes
      and to the level-triggered handlers, as a client-go work queue processes a key once for many
      events. ADDED, DELETED and listing events are never skipped.
    - an event that only echoes a write whose answer its controller kept (``Access.keep_answer``: an
      ImmortalContainer's status patch, its pod's creation) is skipped: the controller already holds
      that version, and its pass would change nothing;
    - an echo its indexes still need (``Access.defer_echo``: a Copyrator copy created or patched) waits
      until the process has no write in flight (at most ``ECHO_DEFER_SECONDS``): the writer holds the
      answer meanwhile, and on one event loop the echoes of a burst slowed the writes still to make;
    - a MODIFIED event that leaves the object's fingerprint unchanged (``skip_unchanged``: a pod's
      binding to a node, for the immortal operator) is skipped: no index or handler would see a change.
    - at most ``slots`` objects' events are processed at once; the rest wait in their queues.

    None of the policy applies to an object while Kopf still waits for it to be indexed in an initial
    listing (its ``resource_indexed`` toggle): Kopf gates every handler until every listed object is
    indexed, so those must neither wait for a slot nor leave their toggle up. Such an object is indexed
    at once and its handlers wait for the other indexes as its raw event (``defer_listed``)."""

    @functools.wraps(process)
    async def governing(**kwargs: Any) -> Any:
        memobase = kwargs["memobase"]
        access = memobase.get(ACCESS_MEMO)
        access = access if isinstance(access, Access) else None
        policy, resource = memobase.get(EVENT_POLICY_MEMO), kwargs["resource"]
        if not isinstance(policy, EventPolicy) or resource.group in policy.kopf_change_groups:
            if access is not None and kwargs.get("operator_indexed") is not None:
                kwargs["operator_indexed"] = ActingGate(kwargs["operator_indexed"], access)
            return await process(**kwargs)
        event_type, body = kwargs["raw_event"].get("type"), kwargs["raw_event"].get("object") or {}
        # Both are asked on every event: each remembers what the object's next event is compared with.
        echo = access.echo(event_type, body) if access is not None else None
        unchanged = policy.unchanged(resource, event_type, body)
        # Kopf passes the listing's toggle with every event of a worker started in the listing, also
        # after the gate opened: only while the gate is closed is the object's event a deferred one.
        gate = kwargs.get("operator_indexed")
        if kwargs.get("resource_indexed") is not None and (gate is None or not gate.is_on()):
            return await defer_listed(process, policy, kwargs)
        if echo is Echo.SKIP or unchanged:
            metrics.event(resource.plural, "echo" if echo is Echo.SKIP else "unchanged")
            return None  # Kopf's processor returns the version it patched: none here
        if echo is Echo.DEFER and access is not None:
            await access.writes_done()
        pressure = kwargs.get("stream_pressure")
        if event_type == "MODIFIED" and pressure is not None and pressure.is_set():
            metrics.event(resource.plural, "superseded")
            return None
        await supersede_listed(policy, resource, body)
        metrics.event(resource.plural, "processed")
        if policy.slots is None:
            return await process(**kwargs)
        async with policy.slots:
            return await process(**kwargs)

    governing._governed = True  # type: ignore[attr-defined]
    return governing


# Listed objects whose handlers run at once once every index is filled (``drain_listed``).
LISTED_HANDLERS_AT_ONCE = 32
# A listed object's data and binaryData larger than this are not kept for its handlers (``defer_listed``).
ELIDE_LISTED_DATA_BYTES = 16 * 1024


async def defer_listed(process: ProcessEvent, policy: EventPolicy, kwargs: dict[str, Any]) -> Any:
    """One object's event of an initial listing: indexed at once; its handlers once every index is
    filled (Kopf's gate, ``operator_indexed``), as Kopf does it, but without a worker waiting for it.

    Fixes: Kopf indexes a listed object and then waits for the gate in that object's worker, holding
    its task, queue, and everything it built for the handlers (the body's wrappers, a patch, three
    loggers, an error throttler). Every listed object of every resource waits so until the last one is
    indexed: a start over N ConfigMaps peaked at ~20 KB per object, 889 MB and rising for 50,000.
    Here Kopf processes the event with the indexing handlers only (no handler of another kind, so
    nothing waits and nothing is written); the worker is then done, and only the processor's
    arguments (the raw event, shared objects) are kept, by uid, for ``drain_listed``.

    Gain (docs/performance.md, "A restart over many objects"): the figures there.

    Upstream: not filed yet (docs/kopf-patches.md, "Listed objects wait for the indexes in their workers").

    A kept ConfigMap's or Secret's data and binaryData over ``ELIDE_LISTED_DATA_BYTES`` are not kept: its
    handlers get its body without them (``conventions.DATA_ELIDED`` says so) and read the object if they
    need them. Kept, a tenant's 700 ConfigMaps of 1 MiB would all be held at once at every start.

    The object's events stay in order: a later event of it waits for its listed handlers while they
    run, and supersedes them when they have not run yet (``supersede_listed``), as a newer event
    supersedes a queued modification (``governed``)."""
    gate, registry = kwargs.get("operator_indexed"), kwargs.get("registry")
    uid = ((kwargs["raw_event"].get("object") or {}).get("metadata") or {}).get("uid")
    if gate is None or not uid or not isinstance(registry, kopf.OperatorRegistry):
        return await process(**kwargs)
    indexing, handling = split_registry(registry)
    await process(**{**kwargs, "registry": indexing, "operator_indexed": _NoWait(gate)})
    # Indexed with its data; kept for its handlers without them when they are large (``elide_data``).
    raw_event = kwargs["raw_event"]
    kept = {**raw_event, "object": elide_data(raw_event.get("object") or {}, ELIDE_LISTED_DATA_BYTES)}
    policy.listed[uid] = {**kwargs, "raw_event": kept, "registry": handling, "resource_indexed": None,
                          "operator_indexed": None, "stream_pressure": None}
    if not policy.drainer:
        policy.drainer.append(asyncio.create_task(drain_listed(process, policy, gate), name="listed handlers"))
    return None


async def drain_listed(process: ProcessEvent, policy: EventPolicy, gate: Any) -> None:
    """Once every index is filled, the deferred listed objects' handlers, ``LISTED_HANDLERS_AT_ONCE``
    objects at a time (and within the policy's ``slots``); a failure is logged, as Kopf's worker
    would, and the others go on."""
    await gate.wait_for(True)
    logger.info(f"Every index is filled: the handlers of {len(policy.listed)} listed objects run now")

    async def one_at_a_time() -> None:
        while policy.listed:
            uid, kwargs = policy.listed.popitem()  # the last first: O(1), and objects are independent
            done = policy.handling[uid] = asyncio.Event()
            try:
                if policy.slots is None:
                    await process(**kwargs)
                else:
                    async with policy.slots:
                        await process(**kwargs)
            except Exception:
                logger.exception(f"Processing the listed object {uid} failed")
            finally:
                del policy.handling[uid]
                done.set()

    while policy.listed:  # one deferred while the last few ran is taken too
        await asyncio.gather(*(one_at_a_time() for _ in range(LISTED_HANDLERS_AT_ONCE)))
    policy.drainer.clear()  # no await since the last check: nothing deferred is left without a drainer


async def supersede_listed(policy: EventPolicy, resource: kopf.Resource, body: Mapping[str, Any]) -> None:
    """Before a later event of a listed object is processed: its listed handlers, not run yet, are
    superseded (this event carries its state forward); running, they are waited for."""
    uid = (body.get("metadata") or {}).get("uid")
    if not uid:
        return
    if policy.listed.pop(uid, None) is not None:
        metrics.event(resource.plural, "superseded")
    running = policy.handling.get(uid)
    if running is not None:
        await running.wait()


class _NoWait:
    """Kopf's gate as its processor sees it while indexing a listed object: the object's toggle is
    dropped from the real gate; the wait is left to ``index_then_wait_light``."""

    def __init__(self, gate: Any) -> None:
        self.gate = gate

    async def drop_toggle(self, toggle: Any) -> None:
        await self.gate.drop_toggle(toggle)

    async def wait_for(self, value: bool) -> None:
        return None


_split: dict[int, tuple[kopf.OperatorRegistry, kopf.OperatorRegistry, kopf.OperatorRegistry]] = {}


def split_registry(registry: kopf.OperatorRegistry) -> tuple[kopf.OperatorRegistry, kopf.OperatorRegistry]:
    """(a registry with ``registry``'s indexing handlers only, one with all its handlers but those),
    made once per registry. Kopf's private per-kind registries are shared, not copied."""
    cached = _split.get(id(registry))
    if cached is None or cached[0] is not registry:
        indexing, handling = kopf.OperatorRegistry(), kopf.OperatorRegistry()
        indexing._indexing = registry._indexing
        for kind in HANDLER_KINDS:
            if kind != "_indexing":
                setattr(handling, kind, getattr(registry, kind))
        cached = _split[id(registry)] = (registry, indexing, handling)
    return cached[1], cached[2]


def govern_event_processing() -> None:
    """Put ``governed`` around Kopf's processing of each event.

    Fixes: in a burst (1,000 ImmortalContainers created at once) Kopf processed every event of every
    object, and all objects at once. Kopf's own cap, ``settings.queueing.worker_limit``, cannot be
    used with indexes: a worker keeps its slot while it waits for every index to be filled, so a kind
    with more objects than the cap never finishes its listing. This cap is taken inside the worker,
    around one event, and never by an object Kopf is still waiting to index. Also the warm standby's
    gate (``ActingGate``): Kopf has no way to hold handlers while indexing goes on.

    Gain (docs/performance.md, "Day-2 levers"): at 10,000 ImmortalContainers at once the RSS peak was
    657 MB with the cap against 723.5 MB with ``CONCURRENT_EVENTS=0``; no measurable gain at 1,000.
    The skipped echoes and superseded events: no measurable CPU change per object in that burst.
    Not re-measurable with the bench's start section (it waits for the drainer's log line); kept as the
    warm standby's gate in any case.

    Upstream: nolar/kopf#1243 (worker_limit deadlocks with indexes); the Lease gate stands in for a
    leader-election hook in Kopf (docs/kopf-patches.md, "Pause handlers, keep indexing").

    Kopf binds ``process_resource_event`` when ``spawn_tasks`` starts: install before. Idempotent."""
    if not getattr(processing.process_resource_event, "_governed", False):
        processing.process_resource_event = governed(processing.process_resource_event)  # type: ignore[assignment]


# --- Kopf's listing and watch stream, lean ------------------------------------------------------------


def drop_managed_fields(body: Any) -> None:
    """Remove ``metadata.managedFields`` from a decoded object, in place."""
    metadata = body.get("metadata") if isinstance(body, dict) else None
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)


def lean_stream(stream: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """``stream`` (Kopf's ``api.stream``: watch events) with each event's object lean."""

    @functools.wraps(stream)
    async def lean(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for event in stream(*args, **kwargs):
            if isinstance(event, dict):
                drop_managed_fields(event.get("object"))
            yield event

    lean._lean = True  # type: ignore[attr-defined]
    return lean


# ConfigMaps and Secrets (core/v1) hold up to 1 MiB each, and a tenant writes them: listed this many
# per page (a page of 1 MiB objects is then ~100 MiB, decoded), and pages read ahead only up to
# READ_AHEAD_BYTES of their data.
BULKY_PLURALS = frozenset({"configmaps", "secrets"})
BULKY_PAGE = 100
READ_AHEAD_BYTES = 64 * 1024 * 1024


def lean_listing(fetch_objs: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """``fetch_objs`` (Kopf's ``fetching.fetch_objs``: pages of a listing) with each item lean, and
    every page read before the first is handed on, unless the pages read hold more than
    ``READ_AHEAD_BYTES`` of data (ConfigMaps and Secrets, listed ``BULKY_PAGE`` per page): then the
    oldest are handed on meanwhile.

    Kopf asks for the next page only once it has processed the objects of the previous one. The API
    server keeps a listing's ``continue`` token for 5 minutes (its compaction interval): a start over
    50,000 ConfigMaps on a busy node took longer, the next page failed with 410 ("The provided continue
    parameter is too old"), and Kopf stopped the operator. Read at once, the pages take seconds; the
    objects cost no more memory than Kopf's processing of them keeps until every index is filled.
    Large objects are few for their bytes, so processed fast: reading them all ahead is what would cost
    (a tenant's 700 ConfigMaps of 1 MiB: 700 MiB at once, over the chart's memory limit)."""

    @functools.wraps(fetch_objs)
    async def lean(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        resource, settings = kwargs.get("resource"), kwargs.get("settings")
        if getattr(resource, "group", None) == "" and getattr(resource, "plural", None) in BULKY_PLURALS \
                and settings is not None and (settings.watching.chunk_size or BULKY_PAGE + 1) > BULKY_PAGE:
            kwargs["settings"] = dataclasses.replace(settings, watching=dataclasses.replace(
                settings.watching, chunk_size=BULKY_PAGE))
        pages: collections.deque[tuple[Any, Any]] = collections.deque()
        held = 0
        async for items, resource_version in fetch_objs(*args, **kwargs):
            for item in items:
                drop_managed_fields(item)
            pages.append((items, resource_version))
            held += sum(data_bytes(item) for item in items)
            while held > READ_AHEAD_BYTES and pages:  # few objects for their bytes: processed fast
                items, resource_version = pages.popleft()
                held -= sum(data_bytes(item) for item in items)
                yield items, resource_version
        while pages:
            yield pages.popleft()

    return lean


def lean_watched_bodies() -> None:
    """Drop ``metadata.managedFields`` from every object Kopf lists or streams, as it is decoded.

    Fixes: no handler reads them, and they are the largest part of most bodies (a running pod's has an
    entry per manager). Kopf queues each object's events until its worker gets to them, so in a burst
    the decoded bodies waiting in the queues are the process's peak, and the allocator keeps it.

    Gain (docs/performance.md, "Day-2 levers"): 1,000 ImmortalContainers created at once left RSS
    +68/+74 MB at rest with them, +60/+61 MB without; a restart with 1,000 in place peaked at 137 MB
    with them, 127-129 MB without. CPU per object: no change beyond the noise.
    Re-measured against stock Kopf (paired, docs/kopf-patches.md): a start over 2,000 ConfigMaps
    peaks 2.6-2.9 MB higher without it, and rests 2.4-2.5 MB higher.

    Upstream: not filed yet (docs/kopf-patches.md, "An option to drop managedFields").

    Kopf's watcher calls ``fetching.fetch_objs`` and ``api.stream`` by module attribute. Idempotent."""
    if not getattr(api.stream, "_lean", False):
        api.stream = lean_stream(api.stream)
        fetching.fetch_objs = lean_listing(fetching.fetch_objs)


# --- Hash shards filtered by the process itself (a server without ShardedListAndWatch) -----------------

# Kopf's ``settings.watching`` holds the shard membership (a callable of a namespace) under this name
# when the process filters: it travels with the settings Kopf passes to every watch.
SHARD_MEMBERSHIP_ATTR = "kopf_operators_serves_namespace"


def serve_shard_in_process(settings: kopf.OperatorSettings, serves: Callable[[str | None], bool]) -> None:
    setattr(settings.watching, SHARD_MEMBERSHIP_ATTR, serves)


def shard_filtered(watch: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """``watch`` (Kopf's ``continuous_watch``: a resource's listing, then its stream) without the events
    of other shards' objects when the process filters (the earliest place: such an object gets no
    worker, queue, index entry or handler, as if the server had filtered it)."""

    @functools.wraps(watch)
    async def filtering(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        serves = getattr(kwargs["settings"].watching, SHARD_MEMBERSHIP_ATTR, None)
        async for event in watch(*args, **kwargs):
            metadata = (event.get("object") or {}).get("metadata") or {} if isinstance(event, dict) else {}
            if serves is None or serves(metadata.get("namespace")):
                yield event

    filtering._shard_filtered = True  # type: ignore[attr-defined]
    return filtering


def filter_shards_in_process() -> None:
    """Idempotent; filters nothing until ``serve_shard_in_process`` names a shard."""
    if not shard_filter_installed():  # Kopf's watcher calls it by module attribute
        watching.continuous_watch = shard_filtered(watching.continuous_watch)


def shard_filter_installed() -> bool:
    return bool(getattr(watching.continuous_watch, "_shard_filtered", False))


# --- asyncio and glibc: process-wide (their code: core/runtime.py) --------------------------------


def start_allocator_trim() -> asyncio.Task[None] | None:
    """glibc's ``malloc_trim(0)`` every ``TRIM_SECONDS``, as a task of the running loop (it ends with
    the loop); None when not installed or where the C library has no such call.

    Fixes: glibc keeps the pages a burst freed in its heaps (and the worker threads' arenas).

    Gain (docs/performance.md, "Memory per object at rest"): at rest it returned 3-5 MB of the growth
    for 5,000 ConfigMaps/Secrets (+16.9-18.3 MB with idle workers of 0.5 s alone, +14.9 MB with the
    trim), and 0.8-20 MB after 1,000 ImmortalContainers (not repeatable enough to claim more).
    Re-measured (paired, docs/kopf-patches.md): 1.6-2.8 MB less at rest after a start over 2,000
    ConfigMaps.

    Upstream: none (the allocator's, not Kopf's; docs/kopf-patches.md, "malloc_trim")."""
    trim = glibc_malloc_trim()
    if not _installed or "start_allocator_trim" in _skipped or trim is None:
        return None
    return asyncio.create_task(trim_allocator(trim, TRIM_SECONDS), name="allocator trim")


# --- Kopf's registries and loader: reads only ---------------------------------------------------------

# Kopf's private handler registries of an OperatorRegistry, by kind.
HANDLER_KINDS = ("_activities", "_indexing", "_watching", "_spawning", "_changing", "_webhooks")


def change_detecting_groups(registry: kopf.OperatorRegistry) -> frozenset[str] | None:
    """The API groups of the handlers that use Kopf's change detection (on.create/update/resume/delete,
    daemons, timers: Kopf's private ``_changing`` and ``_spawning`` registries). None when a selector
    names no group, or when not installed (then every group is treated as one that does)."""
    if not _installed:
        return None
    groups: set[str] = set()
    for handler in [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers()]:
        group = handler.selector.group if handler.selector is not None else None
        if group is None:
            return None
        groups.add(group)
    return frozenset(groups)


def all_handlers(registry: kopf.OperatorRegistry) -> dict[str, list[Any]]:
    """Every registered handler by Kopf's registry kind (tests and tools: what ``kopf run`` would run)."""
    return {kind: list(getattr(registry, kind).get_all_handlers()) for kind in HANDLER_KINDS}


def is_async_handler(handler: Any) -> bool:
    """Whether Kopf runs this handler on the event loop (an ``async def``), not in a thread."""
    return bool(invocation.is_async_fn(handler.fn))


def preload(paths: Sequence[str]) -> None:
    """Import handler files the way ``kopf run`` does (Kopf's loader)."""
    loaders.preload(list(paths), [])

