"""The process the four operators share: Kopf's settings, ``memo``, quiet logs, the metrics endpoint.

Importing this module registers exactly one Kopf startup handler (``shared-settings``), the only place
where process-wide ``kopf.OperatorSettings`` are changed (an operator may add a server-side watch
selector for a resource that only it watches, in its own startup handler), and one cleanup handler
(``shared-cleanup``: the access layer's connections are closed). Every handler file in
``operators/`` imports this module, and Python imports a module once, so it registers once whatever
subset of operator files ``kopf run`` is given.

Handlers reach shared things through Kopf's ``memo``: ``memo.config`` (conventions.Config) and
``memo.access`` (the access layer); each operator keeps its controller there too.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import concurrent.futures
import ctypes
import dataclasses
import functools
import logging
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Mapping
from typing import Any

import kopf
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import api, fetching
from kopf._core.reactor import processing

from kopf_operators.core import metrics
from kopf_operators.core.access import Access, Echo
from kopf_operators.core.controller import MemoSlot
from kopf_operators.core.conventions import Config, shard_selector

logger = logging.getLogger("kopf_operators")

# Threads for blocking calls, in Kopf's pool (sync handlers: none of ours) and asyncio's (to_thread:
# Blackadder's pykube-ng listings) alike. The access layer's own requests need none.
WORKER_THREADS = 16

# Kopf keeps one worker (a task, its queue, and the last event's whole body) per object that had an
# event, until it has been idle this long (Kopf's default: 5 s). In a burst (thousands of objects
# created or listed at once) those idle workers were most of the process's peak, and the allocator
# keeps its peak: 5,000 ConfigMaps/Secrets left RSS +33-37 MB at rest with 5 s, +16-18 MB with 0.5 s
# (docs/performance.md, "Memory per object at rest"). A later event just starts a new worker.
IDLE_WORKER_SECONDS = 0.5

# Events posted at once (docs/performance.md, "Fewer passes, no threads").
POSTING_WORKERS = 16
POSTING_IDLE_SECONDS = 0.1

# asyncio gives every TLS connection a 256 KiB read buffer, zeroed (so resident) at once: with the
# watches, Kopf's posters and the access layer's pool, 40-50 connections. A TLS record carries at most
# 16 KiB, so a smaller buffer only means more reads of a large listing: 64 KiB took ~6 MB off the idle
# process and ~6 MB off the growth per 1,000 ImmortalContainers (docs/performance.md, "Fewer bytes
# per kept object"). It applies to connections opened after the start-up handlers: all of Kopf's
# watches and the access layer's.
TLS_READ_BUFFER_BYTES = 64 * 1024

# glibc keeps the pages a burst freed in its heaps (and the worker threads' arenas) until told
# otherwise: at rest after 1,000 ImmortalContainers, malloc_trim(0) gave back ~20 MB of ~80 MB.
# A trim of a ~150 MB heap takes a few milliseconds of one thread.
TRIM_SECONDS = 10.0

# Kopf's bookkeeping at INFO: one line per handler run, per index update and per processed event,
# even when nothing changed. Without --verbose they are dropped: the log keeps one line per action the operators take.
_BOOKKEEPING = re.compile(r"^((Handler|Indexer) '.*' succeeded\.|.* is processed: \d+ succeeded; \d+ failed\.)$")


# Kopf's peering (docs/deploy.md, "High availability"): a replica whose entry in the ClusterKopfPeering
# is older than this is dead to the others. Kopf renews it every lifetime-(5..10) s (at least every
# 1 s), so a standby acts at most this long after the active replica's last renewal, plus its listing.
PEERING_LIFETIME_SECONDS = 10


def exit_gracefully() -> None:
    """Ask Kopf to stop as on SIGTERM: its cleanup handlers run, and it says goodbye in the peering."""
    signal.raise_signal(signal.SIGTERM)


class PeeringState(logging.Filter):
    """Kopf's peering pause, mirrored onto ``Access.paused``: Kopf pauses its own handlers, daemons
    and watches, but not the operators' own resync loops and timers, nor its Event poster.

    A process that has acted and is then paused exits (``on_lost_role``), as a controller-runtime
    manager does when it loses its lease: on resuming, Kopf re-lists but keeps in its indexes the
    objects deleted while it was paused, and the controllers' timers and memories would be as old as
    the pause. A restart stands by from a clean start (Kopf starts a peered process paused, and its
    handlers wait for every initial listing), so only a process that never acted on stale state acts.

    Kopf keeps the pause in a private toggle; its peering logger reports every change of it (the
    messages below, tested against the installed Kopf in tests/unit/test_peering.py). A filter sees
    each record first; the INFO ones are created even under --quiet, and shown only at the level the
    user asked for."""

    LOGGER = "kopf._core.engines.peering"
    PAUSING = ("Pausing operations in favour of", "Pausing all operators, including self")
    RESUMING = "Resuming operations after the pause"
    LOST_ROLE = "Another replica outranks this one, which has acted: exiting"

    def __init__(self, access: Access, shown_level: int, on_lost_role: Callable[[], None]) -> None:
        super().__init__()
        self.access = access
        self.shown_level = shown_level
        self.on_lost_role = on_lost_role

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(self.PAUSING):
            was_acting = not self.access.paused
            self.access.paused = True
            if was_acting:
                logger.warning(f"{self.LOST_ROLE}, so that the restarted process stands by with a fresh "
                               "listing instead of stale state")
                self.on_lost_role()
        elif message.startswith(self.RESUMING):
            self.access.paused = False
        return record.levelno >= self.shown_level

    @classmethod
    def follow(cls, settings: kopf.OperatorSettings, access: Access,
               on_lost_role: Callable[[], None] = exit_gracefully) -> None:
        # `--peering NAME` (the chart) starts paused until the first look at the peers; auto-detected
        # peering (`make run`) starts acting; --standalone never pauses.
        access.paused = bool(settings.peering.mandatory and not settings.peering.standalone)
        peering_logger = logging.getLogger(cls.LOGGER)
        for old in [f for f in peering_logger.filters if isinstance(f, cls)]:
            peering_logger.removeFilter(old)
        peering_logger.addFilter(cls(access, peering_logger.getEffectiveLevel(), on_lost_role))
        if peering_logger.getEffectiveLevel() > logging.INFO:
            peering_logger.setLevel(logging.INFO)


class DiffBaseWhereUsed(kopf.DiffBaseStorage):
    """Kopf's diff base only for the API groups whose handlers use it (on.create/update/resume/delete,
    daemons, timers). Kopf builds it on every event of every watched resource, a deep copy of the
    body, even for resources that have only indexes and on.event handlers (pods, ConfigMaps,
    ImmortalContainers, ...): for those it is skipped. ``groups`` None: every group uses it."""

    def __init__(self, inner: kopf.DiffBaseStorage, groups: frozenset[str] | None) -> None:
        super().__init__()
        self.inner = inner
        self.groups = groups

    def used(self, body: kopf.Body) -> bool:
        api_version = str(body.get("apiVersion") or "")
        return self.groups is None or (api_version.rpartition("/")[0] in self.groups)

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return self.inner.build(body=body, extra_fields=extra_fields) if self.used(body) else kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return self.inner.fetch(body=body) if self.used(body) else None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self.inner.store(body=body, patch=patch, essence=essence)

    @staticmethod
    def groups_of(registry: kopf.OperatorRegistry) -> frozenset[str] | None:
        """The API groups of the handlers that use the diff base (Kopf's private registries: tested
        against the installed Kopf in tests/unit/test_process.py). None when a selector names no group."""
        groups: set[str] = set()
        for handler in [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers()]:
            group = handler.selector.group if handler.selector is not None else None
            if group is None:
                return None
            groups.add(group)
        return frozenset(groups)


def wake_gate_waiters_only_on_change() -> None:
    """Make Kopf's toggle sets wake their waiters only when the set's state changes.

    Kopf gates every handler on all indexes being filled: during an initial listing each object's
    worker adds a toggle to the operator's one "indexed" set and drops it once its object is indexed,
    then waits on that set. Kopf wakes every waiting worker on each add and each drop, and each woken
    one re-checks and sleeps again: O(N²) wake-ups for N listed objects. A restart with 10,000
    ImmortalContainers and their pods ran for over 6 minutes at 100 % CPU, 70 % of it in those
    wake-ups, before its first handler ran (docs/performance.md, "A restart in a big cluster"). A waiter waits
    only for the set's ``is_on()``, so a change that leaves it as it was wakes nobody. Kopf's private
    ``ToggleSet`` (its ``_condition`` and ``_toggles``), pinned against the installed Kopf in
    tests/unit/test_process.py. Idempotent."""
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


# Before Kopf creates its toggle sets: every operator file imports this module before `kopf run` starts.
wake_gate_waiters_only_on_change()


ProcessEvent = Callable[..., Awaitable[Any]]
# What every index and handler of a resource reads of one object, its version left out.
Fingerprint = Callable[[Mapping[str, Any]], Hashable]


@dataclasses.dataclass(frozen=True)
class EventPolicy:
    """How Kopf's events are processed, outside the API groups that use Kopf's change detection."""

    # API groups with change handlers or daemons (DiffBaseWhereUsed.groups_of): left to Kopf. It sleeps
    # inside their processing (retry backoff, consistency waits), where a sleeper would hold a slot,
    # and its change detection needs every event.
    kopf_change_groups: frozenset[str]
    # At most this many objects' events processed at once (None: no cap).
    slots: asyncio.Semaphore | None
    # (group, plural) -> its Fingerprint (``skip_unchanged``).
    fingerprints: dict[tuple[str, str], Fingerprint] = dataclasses.field(default_factory=dict)
    # uid -> the fingerprint of that object's newest event, for the fingerprinted resources.
    latest: dict[str, Hashable] = dataclasses.field(default_factory=dict)

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


def governed(process: ProcessEvent) -> ProcessEvent:
    """``process`` (Kopf's ``process_resource_event``, one event of one object) under the operator's
    ``EventPolicy`` (in its memo), for resources that have only indexes and event handlers:

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

    None of this applies to an object while Kopf still waits for it to be indexed in an initial
    listing (its ``resource_indexed`` toggle): Kopf gates every handler until every listed object is
    indexed, so those must neither wait for a slot nor leave their toggle up."""

    @functools.wraps(process)
    async def governing(**kwargs: Any) -> Any:
        policy, resource = kwargs["memobase"].get(EVENT_POLICY.name), kwargs["resource"]
        if not isinstance(policy, EventPolicy) or resource.group in policy.kopf_change_groups:
            return await process(**kwargs)
        event_type, body = kwargs["raw_event"].get("type"), kwargs["raw_event"].get("object") or {}
        # Both are asked on every event: each remembers what the object's next event is compared with.
        access = kwargs["memobase"].get(ACCESS.name)
        echo = access.echo(event_type, body) if isinstance(access, Access) else None
        unchanged = policy.unchanged(resource, event_type, body)
        if kwargs.get("resource_indexed") is not None:
            return await process(**kwargs)
        if echo is Echo.SKIP or unchanged:
            metrics.event(resource.plural, "echo" if echo is Echo.SKIP else "unchanged")
            return None  # Kopf's processor returns the version it patched: none here
        if echo is Echo.DEFER and isinstance(access, Access):
            await access.writes_done()
        pressure = kwargs.get("stream_pressure")
        if event_type == "MODIFIED" and pressure is not None and pressure.is_set():
            metrics.event(resource.plural, "superseded")
            return None
        metrics.event(resource.plural, "processed")
        if policy.slots is None:
            return await process(**kwargs)
        async with policy.slots:
            return await process(**kwargs)

    governing._governed = True  # type: ignore[attr-defined]
    return governing


def govern_event_processing() -> None:
    """Put ``governed`` around Kopf's processing of each event.

    In a burst (1,000 ImmortalContainers created at once) Kopf processed every event of every object,
    and all objects at once: a pod's creation, scheduling and start were three passes each, and every
    object held its body wrappers, loggers, handler kwargs and pending API call while 16 threads
    served them. Kopf's own cap, ``settings.queueing.worker_limit``, cannot be used with indexes: a
    worker keeps its slot while it waits for every index to be filled, so a kind with more objects
    than the cap never finishes its listing (nolar/kopf#1243); this cap is taken inside the worker,
    around one event, and never by an object Kopf is still waiting to index. Kopf binds
    ``process_resource_event`` when ``kopf run`` starts, after the operator files are imported
    (pinned in tests/unit/test_process.py). Idempotent."""
    if not getattr(processing.process_resource_event, "_governed", False):
        processing.process_resource_event = governed(processing.process_resource_event)  # type: ignore[assignment]


# Before `kopf run` binds the processor: every operator file imports this module.
govern_event_processing()


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


def lean_listing(fetch_objs: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """``fetch_objs`` (Kopf's ``fetching.fetch_objs``: pages of a listing) with each item lean."""

    @functools.wraps(fetch_objs)
    async def lean(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for items, resource_version in fetch_objs(*args, **kwargs):
            for item in items:
                drop_managed_fields(item)
            yield items, resource_version

    return lean


def lean_watched_bodies() -> None:
    """Drop ``metadata.managedFields`` from every object Kopf lists or streams, as it is decoded.

    No handler reads them, and they are the largest part of most bodies (a running pod's has an entry
    per manager: its creator, the scheduler, the kubelet). Kopf queues each object's events until its
    worker gets to them, so in a burst the decoded bodies waiting in the queues are the process's
    peak, and the allocator keeps that peak: 1,000 ImmortalContainers created at once left RSS
    +68/+74 MB at rest with them, +60/+61 MB without (docs/performance.md, "Day-2 levers"). Kopf's
    watcher calls ``fetching.fetch_objs`` and ``api.stream`` by module attribute; pinned in
    tests/unit/test_process.py. Idempotent."""
    if not getattr(api.stream, "_lean", False):
        api.stream = lean_stream(api.stream)
        fetching.fetch_objs = lean_listing(fetching.fetch_objs)


# Before Kopf's first listing: every operator file imports this module.
lean_watched_bodies()


def glibc_malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    try:
        return functools.partial(ctypes.CDLL("libc.so.6").malloc_trim, 0)
    except (OSError, AttributeError):
        return None


async def trim_allocator(trim: Callable[[], object], period: float) -> None:
    """Every ``period`` seconds, give the allocator's free pages back to the system (forever)."""
    while True:
        await asyncio.sleep(period)
        trim()


class QuietBookkeeping(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or logging.getLogger().level <= logging.DEBUG:
            return True
        return not _BOOKKEEPING.match(record.getMessage())


CONFIG = MemoSlot("config", Config)
ACCESS = MemoSlot("access", Access)
TRIMMER = MemoSlot("allocator_trim", asyncio.Task)
EVENT_POLICY = MemoSlot("event_policy", EventPolicy)


def event_policy(memo: kopf.Memo) -> EventPolicy | None:
    """The process's EventPolicy, created on first use; None when a handler with change detection
    names no API group (then every event is left to Kopf)."""
    if not EVENT_POLICY.present(memo):
        changing_groups = DiffBaseWhereUsed.groups_of(kopf.get_default_registry())
        if changing_groups is None:
            return None
        config, _ = shared(memo)
        slots = asyncio.Semaphore(config.concurrent_events) if config.concurrent_events else None
        EVENT_POLICY.set(memo, EventPolicy(changing_groups, slots))
    return EVENT_POLICY(memo)


def skip_unchanged(memo: kopf.Memo, group: str, plural: str, fingerprint: Fingerprint) -> None:
    """Skip a modification of a ``group``/``plural`` object that leaves ``fingerprint(body)`` as it
    was: it must cover every field that any index or handler of that resource, in any operator of
    the process, reads (tests/unit/test_process.py checks who watches each fingerprinted resource)."""
    policy = event_policy(memo)
    if policy is not None:
        policy.fingerprints[(group, plural)] = fingerprint


def shared(memo: kopf.Memo) -> tuple[Config, Access]:
    """The shared configuration and access layer, created on first use (startup handlers of the
    operators may run before or after ``configure``)."""
    if not CONFIG.present(memo):
        CONFIG.set(memo, Config.from_env())  # fails fast on a malformed environment variable
    if not ACCESS.present(memo):
        ACCESS.set(memo, Access.from_environment())
    return CONFIG(memo), ACCESS(memo)


async def serve_one_shard(settings: kopf.OperatorSettings, config: Config, access: Access) -> None:
    """Hash shards by namespace (docs/sharding.md): the API server streams this process only the
    namespaced objects of its shard. Cluster-scoped ones (Namespaces, ChaosAgents, peerings) stay
    whole: Copyrator needs every namespace, and the chart loads Blackadder in shard 0 only."""
    if not await access.honours_shard_selectors():
        raise kopf.PermanentError(
            f"SHARD_COUNT={config.shard_count} needs the API server's ShardedListAndWatch feature gate "
            "(alpha in Kubernetes 1.36); without it every shard would act on every object. Run one "
            "shard, or enable the gate.")
    selector = shard_selector(config.shard_index, config.shard_count)
    settings.watching.shard_selectors[lambda resource: bool(resource.namespaced)] = selector
    logger.info("Serving shard %d of %d: %s", config.shard_index, config.shard_count, selector)


@kopf.on.startup(id="shared-settings")
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config, _access = shared(memo)
    # Re-establish watches regularly: a silently dead stream then heals within minutes.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    # The initial listings (a restart in a big cluster) arrive in pages, not as one huge response.
    settings.watching.chunk_size = 500
    # Blocking calls run in thread pools; keep them bounded, and give asyncio.to_thread as many
    # threads as Kopf's sync handlers get (asyncio's default is 6 on a 2-core node).
    settings.execution.max_workers = WORKER_THREADS
    settings.queueing.idle_timeout = IDLE_WORKER_SECONDS
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES
    # Groups whose handlers use Kopf's change detection (None: a handler names no group, so any may).
    changing_groups = DiffBaseWhereUsed.groups_of(kopf.get_default_registry())
    event_policy(memo)
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="kopf-operators"))
    # Two replicas: only one acts (peering CRDs in manifests/crds). `--peering NAME` and
    # `--standalone` on the command line win; this only replaces Kopf's generic default name.
    if settings.peering.name == "default":
        settings.peering.name = "kopf-operators"
    # A shard (`--namespace` globs) keeps one ClusterKopfPeering of its own instead of a KopfPeering
    # in each namespace it serves: namespaces come and go, and a standby must see its shard as a whole.
    settings.peering.clusterwide = True
    # Replicas started by the chart get no --priority: equal priorities would pause them all. The
    # oldest process outranks the newer ones, so a replacement pod stands by instead of taking over,
    # and an explicit --priority (or --dev, 666) outranks them all.
    if settings.peering.priority == 0:
        settings.peering.priority = -(time.time_ns() // 1000)
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS
    PeeringState.follow(settings, _access)
    if not settings.peering.standalone:
        logger.info("Peering %r: priority %d, lifetime %d s", settings.peering.name, settings.peering.priority,
                    settings.peering.lifetime)
    if config.shard_count > 1:
        await serve_one_shard(settings, config, _access)
    # Deleting a resource with a timer or daemon: Kopf re-checks whether it has exited this often
    # before releasing the finalizer (the default, 60 s, held deletions for a minute).
    settings.background.cancellation_polling = 1
    # No diff base (a deep copy of every body, on every event) where no handler uses it.
    if not isinstance(settings.persistence.diffbase_storage, DiffBaseWhereUsed):
        settings.persistence.diffbase_storage = DiffBaseWhereUsed(
            settings.persistence.diffbase_storage, changing_groups)
    # Log lines stay log lines; Events are posted explicitly (access.event) where a user needs them.
    settings.posting.loggers = False
    # Kopf posts each object's Events from a worker of its own, all objects at once, on its unbounded
    # connection pool: a burst of 1,000 ImmortalContainers opened ~70 TLS connections (a handshake
    # and a 256 KiB buffer each). At most POSTING_WORKERS at a time, each gone once its object's
    # Events are out (Kopf's default keeps it 1 s, which would hold a slot).
    settings.posting.worker_limit = POSTING_WORKERS
    settings.posting.idle_timeout = POSTING_IDLE_SECONDS
    settings.posting.level = logging.INFO
    logging.getLogger("kopf.objects").addFilter(QuietBookkeeping())
    if logging.getLogger().level > logging.DEBUG:  # one access line per liveness probe is noise
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # The trimming task ends with the event loop (asyncio cancels what is left at exit).
    trim = glibc_malloc_trim()
    if trim is not None and not TRIMMER.present(memo):
        TRIMMER.set(memo, asyncio.create_task(trim_allocator(trim, TRIM_SECONDS), name="allocator trim"))
    if config.metrics_port:
        metrics.serve(config.metrics_port)
        logger.info("Serving Prometheus metrics on :%d/metrics", config.metrics_port)


@kopf.on.cleanup(id="shared-cleanup")
async def close_connections(memo: kopf.Memo, **_: Any) -> None:
    # A request after this (another cleanup handler's) opens a new pool.
    if ACCESS.present(memo):
        await ACCESS(memo).close()
