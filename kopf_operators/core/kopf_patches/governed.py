"""Kopf's event processor, governed (``govern_event_processing``): the operator's ``EventPolicy`` around
Kopf's processing of each event, the Lease's gate for a warm standby, and listed objects' handlers
deferred until every index is filled (``defer_listed``).

Gain: the RSS peak at 10,000 ImmortalContainers at once, 657 MB with the cap against 723.5 MB without
(docs/performance.md, "Day-2 levers"); ``defer_listed``: a start over 5,000 ConfigMaps peaked at 94 MB
instead of 153 MB ("What keeps it fast"). The skipped echoes and superseded events: no measurable CPU
change per object. It is also the warm standby's gate: a correctness piece, not only a speed-up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any

import kopf
from kopf._core.reactor import processing

from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.conventions import elide_data
from kopf_operators.core.echoes import Echo
from kopf_operators.core.kopf_patches.registries import HANDLER_KINDS

logger = logging.getLogger("kopf_operators.kopf_patches")

# Memo keys the patched processor reads (process.py's MemoSlots use these names).
ACCESS_MEMO = "access"
EVENT_POLICY_MEMO = "event_policy"

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
