"""The process the four operators share: Kopf's settings, ``memo``, quiet logs, the metrics endpoint.

Importing this module registers exactly one Kopf startup handler (``shared-settings``), the only place
where process-wide ``kopf.OperatorSettings`` are changed (an operator may add a server-side watch
selector for a resource that only it watches, in its own startup handler), and one cleanup handler
(``shared-cleanup``: the Lease is released and the access layer's connections are closed). Every
handler file in ``operators/`` imports this module, and Python imports a module once, so it registers
once whatever subset of operator files ``kopf run`` is given. Importing it changes nothing in Kopf:
Kopf's internals are patched only by ``kopf_patches.door.install()``, from the entry point
(``kopf-operators run``).

Kopf's own peering is always off: with LEADER_ELECTION the replicas elect a holder on a Lease
(``core.election``), and only the holder acts; without it (``make run``) the process acts at once.

Handlers reach shared things through Kopf's ``memo``: ``memo.config`` (conventions.Config) and
``memo.access`` (the access layer); each operator keeps its controller there too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import re
import signal
from typing import Any

import kopf

from kopf_operators.core import diagnostics, metrics
from kopf_operators.core.access import Access
from kopf_operators.core.conventions import Config, serves_namespace, shard_selector
from kopf_operators.core.election import ElectionThread, LeaseSettings
from kopf_operators.core.kopf_patches.allocator import start_allocator_trim
from kopf_operators.core.kopf_patches.door import KOPF_TESTED_VERSION, change_detecting_groups, warm_standby
from kopf_operators.core.kopf_patches.governed import ACCESS_MEMO, EVENT_POLICY_MEMO, EventPolicy, Fingerprint
from kopf_operators.core.kopf_patches.shards import serve_shard_in_process, shard_filter_installed
from kopf_operators.core.kopf_patches.stop import when_stop_requested
from kopf_operators.core.state import MemoSlot

logger = logging.getLogger("kopf_operators")

# Threads for blocking calls, in Kopf's pool (sync handlers: none of ours) and asyncio's (to_thread:
# Blackadder's pykube-ng listings, to the API server only) alike. The access layer's own requests need
# none, nor does HTTP to other hosts (checks, webhooks, alerts: core.http, on the loop): no host a
# tenant names can hold one of these threads.
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

# At cleanup, how long the election may take to finish an attempt in flight and release the Lease.
RELEASE_SECONDS = 3.0

# Kopf's bookkeeping at INFO: one line per handler run, per index update and per processed event,
# even when nothing changed. Without --verbose they are dropped: the log keeps one line per action the operators take.
_BOOKKEEPING = re.compile(r"^((Handler|Indexer) '.*' succeeded\.|.* is processed: \d+ succeeded; \d+ failed\.)$")


def exit_gracefully() -> None:
    """Ask Kopf to stop as on SIGTERM: its cleanup handlers run."""
    signal.raise_signal(signal.SIGTERM)


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


class QuietBookkeeping(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or logging.getLogger().level <= logging.DEBUG:
            return True
        return not _BOOKKEEPING.match(record.getMessage())


CONFIG = MemoSlot("config", Config)
ACCESS = MemoSlot(ACCESS_MEMO, Access)
TRIMMER = MemoSlot("allocator_trim", asyncio.Task)
LOOP_LAG = MemoSlot("event_loop_lag", asyncio.Task)
EVENT_POLICY = MemoSlot(EVENT_POLICY_MEMO, EventPolicy)
ELECTOR = MemoSlot("elector", ElectionThread)
DIAGNOSTICS = MemoSlot("diagnostics", asyncio.Task)


def event_policy(memo: kopf.Memo) -> EventPolicy | None:
    """The process's EventPolicy, created on first use; None when a handler with change detection
    names no API group, or Kopf is not patched (then every event is left to Kopf)."""
    if not EVENT_POLICY.present(memo):
        changing_groups = change_detecting_groups(kopf.get_default_registry())
        if changing_groups is None:
            return None
        config, _ = shared(memo)
        slots = asyncio.Semaphore(config.concurrent_events) if config.concurrent_events else None
        EVENT_POLICY.set(memo, EventPolicy(changing_groups, slots))
    return EVENT_POLICY(memo)


def skip_unchanged(memo: kopf.Memo, group: str, plural: str, fingerprint: Fingerprint) -> None:
    """Skip a modification of a ``group``/``plural`` object that leaves ``fingerprint(body)`` as it
    was: it must cover every field that any index or handler of that resource, in any operator of
    the process, reads (tests/unit/test_kopf_patches_door.py checks who watches each fingerprinted resource)."""
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
    """Hash shards by namespace (docs/sharding.md): this process acts only on the namespaced objects of
    its shard. Cluster-scoped ones (Namespaces, ChaosAgents, peerings) stay whole: Copyrator needs
    every namespace, and the chart loads Blackadder in shard 0 only.

    The API server filters the watches when it honours the shard selector (ShardedListAndWatch, alpha
    in 1.36); a server without it silently drops the selector, so the process filters instead: every
    event reaches it, and the other shards' are dropped before Kopf queues them. Either way the
    membership is ``serves_namespace``'s, and the mode is said once and kept in a gauge."""
    index, count, wanted = config.shard_index, config.shard_count, config.shard_filtering
    honoured = wanted != "client" and await access.honours_shard_selectors()
    if wanted == "server" and not honoured:
        raise kopf.PermanentError(
            "SHARD_FILTERING=server needs the API server's ShardedListAndWatch feature gate (alpha in "
            "Kubernetes 1.36), and this server ignores shard selectors. Leave SHARD_FILTERING at auto "
            "to filter in the process.")
    if honoured:
        selector = shard_selector(index, count)
        settings.watching.shard_selectors[lambda resource: bool(resource.namespaced)] = selector
        metrics.shard(index, count, "server")
        logger.info("Serving shard %d of %d, filtered by the API server: %s", index, count, selector)
        return
    if not shard_filter_installed():
        raise kopf.PermanentError(
            f"SHARD_COUNT={count}: the API server ignores shard selectors (no ShardedListAndWatch feature "
            f"gate), and filtering in the process needs kopf_operators' Kopf patches (Kopf "
            f"{KOPF_TESTED_VERSION}), which are not installed. Run one shard.")
    serve_shard_in_process(settings, functools.partial(serves_namespace, index=index, count=count))
    metrics.shard(index, count, "client")
    logger.warning("Serving shard %d of %d, filtered by this process: the API server %s shard "
                   "selectors, so every shard receives every namespaced event and drops the other "
                   "shards' (docs/sharding.md)", index, count,
                   "ignores" if wanted == "auto" else "is not asked (SHARD_FILTERING=client) to apply")


@kopf.on.startup(id="shared-settings")
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
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
    # Groups whose handlers use Kopf's change detection (None: a handler names no group, so any may).
    changing_groups = change_detecting_groups(kopf.get_default_registry())
    event_policy(memo)
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="kopf-operators"))
    # Kopf's peering is off: replicas elect a holder on a Lease instead (``elect``).
    settings.peering.standalone = True
    settings.peering.mandatory = False  # `--peering NAME` would otherwise hold every watch until Kopf's CRD exists
    await elect(memo, LeaseSettings.from_env(), _access)
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
    if not TRIMMER.present(memo):
        trimmer = start_allocator_trim()
        if trimmer is not None:
            TRIMMER.set(memo, trimmer)
    # Measured on standbys too: a held loop would delay a standby's takeover as much as a holder's work.
    if not LOOP_LAG.present(memo):
        LOOP_LAG.set(memo, metrics.watch_event_loop())
    if config.metrics_port:
        metrics.serve(config.metrics_port)
        logger.info("Serving Prometheus metrics on :%d/metrics", config.metrics_port)
    if config.diagnostics_file and not DIAGNOSTICS.present(memo):
        # Kopf hands every index to startup handlers as a kwarg named by its id (empty until filled).
        indexes = {name: value for name, value in kwargs.items() if isinstance(value, kopf.Index)}
        DIAGNOSTICS.set(memo, diagnostics.start(config.diagnostics_file, config.diagnostics_seconds, memo, indexes))


async def elect(memo: kopf.Memo, lease: LeaseSettings, access: Access) -> None:
    """With LEADER_ELECTION, stand by until this replica holds the Lease (``core.election``).

    Warm when Kopf is patched: Kopf lists, watches and indexes as usual, and the patched processor
    holds every object's handlers (``kopf_patches.governed.ActingGate``) until the Lease is held: a takeover
    acts at once, on indexes already filled. Cold on stock Kopf: this startup handler waits for the
    Lease, so Kopf starts nothing (no watch, no handler) until then, and lists everything on takeover.
    The controllers' own resync loops and timers, and Event posting, check ``Access.paused``."""
    if not lease.enabled:
        logger.info("Leader election off (LEADER_ELECTION): this process acts at once, alone")
        # It acts: the gauge says so, so that "no replica acts" alerts stay silent for it.
        metrics.LEADER.labels(lease=lease.name).set(1)
        return
    if ELECTOR.present(memo):
        return
    # On a thread of its own (its own loop and connection): renewals never wait for Kopf's processing.
    elector = ELECTOR.set(memo, ElectionThread(access, lease, on_lost=exit_gracefully))
    elector.start()
    # No attempt at the Lease once the process is told to stop, and the holder hands it over at once:
    # a standby still campaigning while Kopf winds down could take the Lease the holder just released.
    when_stop_requested(elector.stop)
    warm = warm_standby()
    logger.info("Leader election on the Lease %s as %s (%s standby until it holds it; duration %d s, renew "
                "deadline %d s, retry %d s)", elector.where, elector.identity, "a warm" if warm else "a cold",
                lease.duration, lease.renew_deadline, lease.retry_period)
    if not warm:
        try:
            await access.until_acting()
        except asyncio.CancelledError:  # told to stop while standing by: Kopf cancels its startup handlers
            elector.stop()
            raise


@kopf.on.cleanup(id="shared-cleanup")
async def close_connections(memo: kopf.Memo, **_: Any) -> None:
    # The Lease first: a standby takes over at once (this replica writes nothing after it).
    if ELECTOR.present(memo):
        # Stopped at the signal already when Kopf is patched (it then released the Lease).
        await ELECTOR(memo).close(RELEASE_SECONDS)
    # Kopf waits up to 5 s at exit for tasks that are still running: the trim loop never ends by itself.
    if TRIMMER.present(memo):
        TRIMMER(memo).cancel()
    if LOOP_LAG.present(memo):
        LOOP_LAG(memo).cancel()
    if DIAGNOSTICS.present(memo):
        DIAGNOSTICS(memo).cancel()
    # A request after this (another cleanup handler's) opens a new pool.
    if ACCESS.present(memo):
        await ACCESS(memo).close()
