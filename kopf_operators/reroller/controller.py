"""Re-roller: the controller (state from watches, decisions in ``reroller.decisions``, API via ``core.access``).

State comes from Kopf indexes, never from a read per event:
- ``reroller-configmaps`` / ``reroller-secrets``: (kind, namespace, name) -> SourceView (a data hash,
  the resourceVersion and the ignore/match/selector flags; never the data);
- ``reroller-<kind>s`` per workload kind: the reverse lookup (source kind, namespace, source name)
  -> workload key, and ("view", kind, namespace, name) -> WorkloadView (baseline, resourceVersion);
- ``reroller-namespaces``: namespace -> labels (for REROLLER_NAMESPACE_SELECTOR).

A source event costs one write per affected workload (a merge patch carrying the resourceVersion
known from the index, or from the answer to our own last write); a 409 re-reads that one workload
and decides again. The first sighting of a workload records its baseline at once. A pass is observe
(the newest view: the index, the answers to our writes via ``core.state.Newest``, the event's
body; its sources from the indexes) -> decide (one call: ``decisions.decide``) -> act (the pacing,
the write); everything kept per workload is in one ``KeyedState``. Rollouts are
paced: the first change rolls at once (leading edge), changes within the window after it merge into
one more rollout, and a cluster-wide token bucket spreads out mass rollouts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.background import Background, FairLimit
from kopf_operators.core.controller import GuardedPass, PassSettings, Requeues
from kopf_operators.core.conventions import REROLLER_PENDING
from kopf_operators.core.state import Index, KeyedState, MemoSlot, Newest, PerKey, first
from kopf_operators.reroller import decisions, pacing, patches, plans, settings, views, waves, windows
from kopf_operators.reroller.alerts import Alert, Alerts, AlertSettings
from kopf_operators.reroller.history import History
from kopf_operators.reroller.notices import Notices
from kopf_operators.reroller.progressions import Progressions
from kopf_operators.reroller.views import ref_of
from kopf_operators.reroller.waves import HALTED

OPERATOR = "reroller"
SOURCE_INDEXES = {"ConfigMap": "reroller-configmaps", "Secret": "reroller-secrets"}
WORKLOAD_INDEXES = {"Deployment": "reroller-deployments", "StatefulSet": "reroller-statefulsets",
                    "DaemonSet": "reroller-daemonsets", "CronJob": "reroller-cronjobs", "Job": "reroller-jobs",
                    "Rollout": "reroller-rollouts"}
NAMESPACES_INDEX = "reroller-namespaces"
TERMINATING_INDEX = "reroller-terminating-namespaces"
INDEXES = (*SOURCE_INDEXES.values(), *WORKLOAD_INDEXES.values(), NAMESPACES_INDEX, TERMINATING_INDEX)
ROLLOUT = k8s.Kind("argoproj.io/v1alpha1", "rollouts", "Rollout")  # Argo Rollouts (REROLLER_ARGO_ROLLOUTS)
KINDS = {"Deployment": k8s.DEPLOYMENT, "StatefulSet": k8s.STATEFULSET, "DaemonSet": k8s.DAEMONSET,
         "CronJob": k8s.CRONJOB, "Job": k8s.JOB, "Rollout": ROLLOUT}
# A failed pass outside Kopf's retries: look again after this long (doubling, capped).
RETRY_SECONDS = (1.0, 300.0)
CONFLICT_ATTEMPTS = 3
CONCURRENCY = 16  # writes in flight for one source event (independent workloads)
# The installation's key for Secrets' digests on workloads (``plans.keyed_digest``): in the operator's
# namespace, created by the first replica that acts (a standby writes nothing), kept across upgrades.
# Deleted, a new one is made: every workload watching a Secret then adopts its new digests, rolling nothing.
DIGEST_KEY_SECRET = "kopf-operators-reroller-digest-key"
DIGEST_KEY_BYTES = 32

logger = logging.getLogger("kopf_operators.reroller")
Key = settings.WorkloadKey
# The indexes' keys and values (Kopf hands them over as kwargs, untyped: their types are stated here).
SourceKey = tuple[str, str, str]  # (source kind, namespace, name) in a sources index
# A workload index holds two shapes, told apart by their length: the reverse lookup
# (source kind, namespace, source name or "*") -> workload key, and ("view", *workload key) -> its view.
ViewKey = tuple[Literal["view"], str, str, str]
WorkloadIndex = Index[SourceKey | ViewKey, Key | views.WorkloadView]


class RerollerController:
    def __init__(self, access: Access, options: settings.Options, indexes: Mapping[str, Index[Any, Any]],
                 alerts: AlertSettings | None = None, key_namespace: str = "") -> None:
        self.access = access
        self.options = options
        # Where the digest key lives ("": nowhere, such as `make run` without OPERATOR_NAMESPACE: Secrets'
        # digests unkeyed); read, or created, by the first pass, which runs only while this replica acts.
        self.key_namespace = key_namespace
        self._digest_key: bytes | None = None
        self._key_lock = asyncio.Lock()
        self.alerts = Alerts(alerts or AlertSettings())
        self.history = History(access, options.history)  # sources' snapshots and restores
        self.sources: dict[str, Index[SourceKey, views.SourceView]] = {
            kind: indexes[index_id] for kind, index_id in SOURCE_INDEXES.items()}
        # The Rollout index exists only with REROLLER_ARGO_ROLLOUTS (its handlers are registered then).
        self.workloads: dict[str, WorkloadIndex] = {
            kind: indexes[index_id] for kind, index_id in WORKLOAD_INDEXES.items() if index_id in indexes}
        self.namespaces: Index[str, Mapping[str, str]] = indexes[NAMESPACES_INDEX]  # name -> labels
        # Namespaces being deleted: their objects go in any order, so a source gone first is no news.
        # (``get(id, {})``, never ``get(id) or {}``: Kopf's index is empty, so false, when the startup handler
        # gets it, and ``or`` would swap the live index for a dict that never fills.)
        self.terminating: Index[str, bool] = indexes.get(TERMINATING_INDEX, {})
        self.namespace_selector = settings.parse_selector(options.namespace_selector)
        self.resource_selector = settings.parse_selector(options.resource_label_selector)
        self.bucket = pacing.TokenBucket(options.cluster_rate, options.cluster_burst, time.monotonic())
        self.background = Background(OPERATOR)
        # Per workload, all of it dropped by one ``forget``:
        self.state: KeyedState[Key] = KeyedState()
        # the answers to our writes, newer than the index until the watch catches up (identity: uid)
        self.known: Newest[Key, views.WorkloadView] = self.state.track(Newest(lambda v: v.rv, lambda v: v.uid))
        self._sightings: PerKey[Key, decisions.FirstSighting] = self.state.map()  # first sightings, baseline unwritten
        self._last_roll: PerKey[Key, float] = self.state.map()  # monotonic time of its last rollout
        # The Warnings said once per problem (none for a namespace being deleted).
        self.notices = Notices(self.state, access, lambda namespace: namespace in self.terminating)
        self.state.on_forget(self._release)  # no longer waiting for a rollout slot
        # Fair between namespaces, like the bucket: a flood of rollouts in one namespace, slower to write
        # than the budget allows, must not queue another namespace's pass behind it (and one slot is
        # kept for a namespace that holds none, so its first write need not wait for the flood's).
        self._limit = FairLimit(CONCURRENCY, reserve=1)
        # Every pass (an event's, a look again, a retry, the resync) holds a write slot of its namespace;
        # a failure is retried with backoff on the same timer as the next look (earliest wins). An event's
        # pass that must wait for a slot is handed over (``submit``) with the newest view reported for it.
        self.requeues: Requeues[Key] = self.state.track(Requeues())  # each pass's look again: its result
        self.passes: GuardedPass[Key] = self.state.track(GuardedPass(
            self.background, self.requeues.returned(self.reconcile), PassSettings(
                OPERATOR, say=self._say, paused=lambda: self.access.paused, retry=RETRY_SECONDS, if_pending="earlier",
                retried=lambda exc: isinstance(exc, ApiError) and (exc.transient or exc.status == 409),
                limit=self._limit, group=lambda key: key[1], merge=self.known.newer, retry_trigger="timer",
                log=logger, on_failure=lambda key, _exc: self._count(key, "failed"))))
        # Sources whose data differs from their data stamp (a copy edited by hand, about to be put back
        # by its writer) -> when that was first seen (monotonic); see ``decisions.drift_held``.
        self._drift_since: dict[SourceKey, float] = {}
        # Workloads this process has looked at (REROLLER_SYNC_AFTER_RESTART=false: the first look absorbs
        # a change made while the operator was down); kept while the workload exists.
        self._looked: set[Key] = set()
        # Progressive rollouts: the gate of each rollout of a progressive source's change.
        self.progressions = Progressions(self.state, self.requeues, self.passes.look_in, self.access, options,
                                         self.sources, self.current, self.lookup, self.affected, self._sightings)

    # --- state ---------------------------------------------------------------------------------------

    def current(self, key: Key, event_view: views.WorkloadView | None = None) -> views.WorkloadView | None:
        """The newest known view: the index, our own last write's answer, or the event's body."""
        indexed = first(self.workloads.get(key[0]), ("view", *key))
        view = self.known.current(key, indexed if isinstance(indexed, views.WorkloadView) else None)
        return self.known.newer(view, event_view)

    def lookup(self, view: views.WorkloadView) -> dict[tuple[str, str], views.SourceView]:
        """(kind, name) -> SourceView of the existing sources the workload may watch."""
        result: dict[tuple[str, str], views.SourceView] = {}
        for source in (*view.sources, *view.search):
            found = first(self.sources[source.kind], (source.kind, view.namespace, source.name))
            if found is not None:
                result[(source.kind, source.name)] = found
        for source_kind in {kind for kind, _ in view.patterns}:
            # Patterns: every source of the kind in the namespace (a scan; only for pattern users).
            for (kind, namespace, name) in list(self.sources[source_kind].keys()):
                if namespace == view.namespace:
                    found = first(self.sources[source_kind], (kind, namespace, name))
                    if found is not None:
                        result[(kind, name)] = found
        return result

    def affected(self, kind: str, namespace: str, name: str) -> set[Key]:
        keys: set[Key] = set()
        for index in self.workloads.values():
            for ref in ((kind, namespace, name), (kind, namespace, "*")):
                keys.update(key for key in index.get(ref) or () if isinstance(key, tuple))
        return keys

    def namespace_selected(self, namespace: str) -> bool:
        if not self.namespace_selector:
            return True
        return settings.selector_matches(self.namespace_selector, first(self.namespaces, namespace))

    def _count(self, key: Key, outcome: str) -> None:
        if self.options.metrics_by_namespace:
            metrics.reload_by_namespace(key[1], key[0], outcome)

    def forget(self, key: Key) -> None:
        self.state.forget(key)

    def namespace_deleted(self, namespace: str) -> None:
        """Its per-namespace series go with it (its workloads are forgotten by their own deletions)."""
        if self.options.metrics_by_namespace:
            metrics.forget_namespace(namespace)

    def _release(self, key: Key) -> None:
        self.bucket.cancel(key[1], key)  # no longer waiting for a rollout slot

    # --- triggers ------------------------------------------------------------------------------------

    async def source_event(self, kind: str, namespace: str, name: str) -> None:
        """A ConfigMap/Secret changed (its index entry is already updated): look at its workloads."""
        found = first(self.sources[kind], (kind, namespace, name))
        if found is None:
            self.progressions.source_gone((kind, namespace, name))
        if found is not None and found.drifted:
            self._drift_since.setdefault((kind, namespace, name), time.monotonic())
        else:
            self._drift_since.pop((kind, namespace, name), None)
        keys = self.affected(kind, namespace, name)
        if keys:
            await asyncio.gather(*(self.submit(key, f"{kind.lower()} event") for key in keys))

    async def workload_event(self, key: Key, event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type == "DELETED":
            self.forget(key)
            self._looked.discard(key)
            return
        view = views.workload_view(key[0], body, self.options)
        self.progressions.wake(key)
        if view is None:
            self.forget(key)  # not (or no longer) opted in
            return
        await self.submit(key, "workload event", view)

    async def submit(self, key: Key, trigger: str, event_view: views.WorkloadView | None = None) -> None:
        """An event's pass: run now while a write slot is free; otherwise handed over to a task that
        waits for its namespace's turn, so that the event gives Kopf's event slot back at once. (Kopf
        processes at most ``CONCURRENT_EVENTS`` events at once: a flood's events each waiting for a
        write slot would hold them all, and another namespace's ConfigMap event would wait for one.)
        One handed-over pass per key; later events only bring it a newer view. It is in memory only,
        like a timer: after a restart the first look compares the stored baseline with the data."""
        await self.passes.submit(key, trigger, event_view)

    async def guarded(self, key: Key, trigger: str, event_view: views.WorkloadView | None = None) -> None:
        """One pass outside Kopf's retrying handlers (a failure is retried later with backoff, never
        hot; nothing on a standby), holding a write slot of its namespace."""
        await self.passes(key, trigger, event_view)

    def _say(self, key: Key, trigger: str, exc: Exception, delay: float | None) -> str:
        where = f"{key[0]} {key[1]}/{key[2]}: {trigger}"
        if not isinstance(exc, ApiError):
            return f"{where}: failed"  # a handed-over pass's crash (no handler to say it)
        if delay is None:
            # Refused (403, 422: say, annotations over the size limit): retrying will not help; said
            # once, and the next change of the workload or its sources (or the sweep) retries.
            if self.passes.failures(key) == 1:
                logger.warning(f"{where}: {exc}; not retrying until it changes")
        else:
            logger.warning(f"{where}: {exc}; retrying in {delay:.1f}s")
        return ""  # said here, in this operator's logger

    # --- one level-triggered pass ----------------------------------------------------------------------

    async def reconcile(self, key: Key, trigger: str, event_view: views.WorkloadView | None = None) -> None:
        started = time.perf_counter()
        async with self.access.serialised(key):
            view = self.current(key, event_view)
            if view is None or view.deleting:
                self.forget(key)
                return
            if not self.namespace_selected(view.namespace):
                return
            first_look = key not in self._looked  # until a pass has been decided and done
            for _attempt in range(CONFLICT_ATTEMPTS):
                try:
                    wrote = await self._pass(view, first_look)
                except k8s.Conflict:
                    # The workload changed since the version we know: read that one, decide again.
                    metrics.error(OPERATOR, "conflict")
                    fresh = await self.access.read(KINDS[key[0]], key[1], key[2])
                    view = views.workload_view(key[0], fresh, self.options) if fresh else None
                    if view is None or view.deleting:
                        self.forget(key)
                        return
                    self.known.remember(key, view)
                    continue
                self._looked.add(key)
                if wrote:
                    metrics.REACTION.labels(operator=OPERATOR, trigger=trigger).observe(
                        time.perf_counter() - started)
                return
            raise ApiError(409, "Conflict", "the workload kept changing")

    async def _pass(self, view: views.WorkloadView, first_look: bool = False) -> bool:
        """Observe, decide (one call: ``decisions.decide_pass``), act; True when something was written.
        ``first_look``: this process has not looked at the workload before (REROLLER_SYNC_AFTER_RESTART)."""
        key = view.key
        wall, now = time.time(), time.monotonic()
        drift_since = {(kind, name): since for (kind, namespace, name), since in self._drift_since.items()
                       if namespace == view.namespace}
        digest_key = await self.digest_key()
        step = decisions.decide_pass(view, self.lookup(view), self.options, self._sightings.get(key),
                                     self._last_roll.get(key), now, wall, drift_since=drift_since,
                                     first_look=first_look, digest_key=digest_key)
        self.notices.refused(view)
        if step.do is decisions.Do.UNPAUSE:
            return await self._unpause(view)
        self._sightings.pop(key, None)
        if step.sighting is not None:
            self._sightings[key] = step.sighting
        for delay in step.look_in:
            self.requeues.after(key, delay)
        if step.release:
            self._release(key)
        if step.decision is not None and step.decision.plan is not None:
            self.notices.missing(view, step.plan)
        if step.decision is None or step.decision.plan is None or step.plan.action is not plans.Action.ROLL:
            self.progressions.not_held(key)  # no rollout due: nothing held
        if step.do is decisions.Do.NOTHING:
            return False
        if step.do is decisions.Do.SUSPENDED:
            return await self._record_suspended(view, step.plan, step.snap)
        if step.do is decisions.Do.PEND:
            wrote, answer = await pend(self.access, view, step.held)
            if wrote:
                self._after_write(view, answer)
            return wrote
        if step.do is decisions.Do.BASELINE:
            # A Job's status changes all the time and only we write these keys (serialised per
            # workload); its rollout is a uid-guarded delete: no resourceVersion, so no 409 and no read.
            rv = None if view.kind == "Job" else view.rv
            answer = await self.access.patch(KINDS[view.kind], view.namespace, view.name,
                                             patches.metadata_patch(step.plan, step.snap, rv,
                                                                    pending=view.pending is not None))
            self._after_write(view, answer)
            self._sightings.pop(key, None)
            metrics.action(OPERATOR, "baseline")
            logger.debug(f"{view.kind} {view.namespace}/{view.name}: baseline {step.plan.new_hash} recorded")
            return True
        # A rollout, past its per-workload interval. In a progression, only when its wave's turn has come.
        verdict = None if self.alerts.settings.notify_only else await self.progressions.decide(
            view, step.plan, wall, digest_key)
        if verdict is not None and verdict.gate is not waves.Gate.GO:
            self._release(key)  # no rollout token while it waits
            held = self.progressions.hold(view, step.plan, verdict)
            if held is None:
                return False
            wrote, answer = await pend(self.access, view, held)
            if wrote:
                self._after_write(view, answer)
            return wrote
        self.progressions.not_held(key)
        # The cluster-wide budget, fair between namespaces (asked again when due).
        wait = self.bucket.ask(key[1], key, now)
        if wait > 0:
            self.requeues.after(key, wait)
            return False
        if self.alerts.settings.notify_only:
            await self._notify_only(view, step.plan, step.snap)
        else:
            rolled = waves.rolled_value(step.plan.new_hash, wall) if verdict is not None else None
            await self._roll(view, step.plan, step.snap, wall, rolled)
        self._sightings.pop(key, None)
        return True

    async def digest_key(self) -> bytes | None:
        """The installation's digest key, read (or created) once, by the first pass that needs it."""
        if self._digest_key is None and self.key_namespace:
            async with self._key_lock:
                if self._digest_key is None:
                    self._digest_key = await load_digest_key(self.access, self.key_namespace)
        return self._digest_key

    # --- the writes ----------------------------------------------------------------------------------

    def _after_write(self, view: views.WorkloadView, answer: Mapping[str, Any] | None) -> None:
        if answer is None:  # gone meanwhile
            self.forget(view.key)
            return
        written = views.workload_view(view.kind, answer, self.options)
        if written is not None:
            self.known.remember(view.key, written)

    async def _roll(self, view: views.WorkloadView, plan: plans.Plan, snap: plans.Snapshot, wall: float,
                    rolled: str | None = None) -> None:
        """``rolled``: a progressive rollout's ``ROLLED`` value, written with it (templated kinds)."""
        kind = KINDS[view.kind]
        if view.kind in settings.TEMPLATED and self.options.env_vars:
            answer = await self.access.patch(kind, view.namespace, view.name,
                                             patches.env_vars_patch(view, plan, snap, wall, view.rv, rolled),
                                             json_patch=True)
            self._after_write(view, answer)
            if answer is None:
                return
            how = "STAKATER_ variable set"
        elif view.kind in settings.TEMPLATED:
            answer = await self.access.patch(kind, view.namespace, view.name,
                                             patches.roll_patch(view, plan, snap, wall, view.rv, rolled))
            self._after_write(view, answer)
            if answer is None:
                return
            how = "pod template annotated"
        elif view.kind == "CronJob":
            answer, how = await roll_cronjob(self.access, view, plan, snap, windows.cronjob_mode(view, self.options),
                                             wall)
            self._after_write(view, answer)
            if answer is None:
                return
        else:  # Job: recreated with the new baseline
            self._after_write(view, await recreate_job(self.access, view, plan, snap))
            how = "recreated"
        message = patches.rollout_message(view.kind, view.name, plan.changed)
        self._done(view, plan, message, ("rollout", "rolled", "Rerolled"), how)
        if view.kind == "Deployment" and view.pause_period:
            self.requeues.after(view.key, view.pause_period)

    async def _notify_only(self, view: views.WorkloadView, plan: plans.Plan, snap: plans.Snapshot) -> None:
        """REROLLER_NOTIFY_ONLY: the change is recorded as the baseline and alerted, nothing rolls
        (paced like a rollout, so a flapping source alerts at most once per interval)."""
        patch = patches.metadata_patch(plan, snap, None if view.kind == "Job" else view.rv,
                                       pending=view.pending is not None)
        answer = await self.access.patch(KINDS[view.kind], view.namespace, view.name, patch)
        self._after_write(view, answer)
        if answer is None:
            return
        self._done(view, plan, patches.notify_only_message(view.kind, view.name, plan.changed),
                   ("notify-only", "notified", "ChangeNotified"))

    def _done(self, view: views.WorkloadView, plan: plans.Plan, message: str, names: tuple[str, str, str],
              how: str = "") -> None:
        """A rollout is done: paced, counted, logged, an Event, alerted. ``names``: (action, outcome, reason)."""
        action, outcome, reason = names
        self._last_roll[view.key] = time.monotonic()
        metrics.action(OPERATOR, action)
        self._count(view.key, outcome)
        logger.info(f"{view.kind} {view.namespace}/{view.name}: {message}" + (f" ({how})" if how else ""))
        self.access.event(ref_of(view), "Normal", reason, message)
        self.alerts.notify(Alert(view.kind, view.namespace, view.name, plan.changed, outcome, message))

    async def _record_suspended(self, view: views.WorkloadView, plan: plans.Plan, snap: plans.Snapshot) -> bool:
        """A suspended CronJob: the change becomes its baseline (with the resourceVersion: a resume
        meanwhile conflicts and is decided again), no Job; said once, as an Event."""
        answer = await self.access.patch(KINDS[view.kind], view.namespace, view.name,
                                         patches.metadata_patch(plan, snap, view.rv, pending=view.pending is not None))
        self._after_write(view, answer)
        self._release(view.key)
        self._sightings.pop(view.key, None)
        if answer is not None:
            message = patches.suspended_message(view.name, plan.changed)
            metrics.action(OPERATOR, "skip-suspended")
            self._count(view.key, "suspended")
            logger.info(f"{view.kind} {view.namespace}/{view.name}: {message}")
            self.access.event(ref_of(view), "Normal", "RerollSkipped", message)
        return True

    async def _unpause(self, view: views.WorkloadView) -> bool:
        answer = await self.access.patch(KINDS[view.kind], view.namespace, view.name, patches.unpause_patch(view.rv))
        self._after_write(view, answer)
        if answer is not None:
            metrics.action(OPERATOR, "resume")
            logger.info(f"{view.kind} {view.namespace}/{view.name}: pause period over, rollout resumed")
        return True

    # --- the periodic sweep ----------------------------------------------------------------------------

    def start_resync(self) -> None:
        self.background.resync(self.options.resync_seconds, self._resync, paused=lambda: self.access.paused,
                               until_acting=self.access.until_acting)
        self.alerts.start()

    async def _resync(self) -> None:
        for kind, index in self.workloads.items():
            for entry in list(index.keys()):
                if len(entry) == 4 and entry[0] == "view":
                    _, _kind, namespace, name = entry
                    await self.guarded((kind, namespace, name), "resync")
        await self.history.sweep(self.sources)

    async def stop(self) -> None:
        await self.alerts.stop()
        await self.background.stop()


# --- held rollouts and CronJob modes (module functions: they need no per-workload state) ----------------


async def load_digest_key(access: Access, namespace: str) -> bytes:
    """The digest key from its Secret; created with random bytes when absent (of two replicas racing
    to create it, the second reads the first's)."""
    for _attempt in range(3):
        found = await access.read(k8s.SECRET, namespace, DIGEST_KEY_SECRET)
        if found is None:
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": DIGEST_KEY_SECRET, "namespace": namespace},
                    "data": {"key": base64.b64encode(secrets.token_bytes(DIGEST_KEY_BYTES)).decode()}}
            try:
                found = await access.create(k8s.SECRET, body)
            except k8s.AlreadyExists:
                continue  # another replica made it meanwhile: read that one
            logger.info(f"Secret {namespace}/{DIGEST_KEY_SECRET} created: the key of Secrets' digests on workloads")
        key = base64.b64decode(str((found.get("data") or {}).get("key") or ""))
        if len(key) < 16:
            raise ApiError(422, "Invalid", f"Secret {namespace}/{DIGEST_KEY_SECRET} holds no key of 16 bytes or more")
        return key
    raise ApiError(409, "Conflict", f"Secret {namespace}/{DIGEST_KEY_SECRET} kept vanishing")


async def pend(access: Access, view: views.WorkloadView, held: windows.Hold | None
               ) -> tuple[bool, Mapping[str, Any] | None]:
    """Say on the workload that its rollout is held (``held``), or that a held one is no longer due
    (None: its change was reverted). Written, counted and announced once per new state: after a
    restart the same pending state writes nothing. (wrote, the answer)."""
    value = held.pending if held is not None else None
    if view.pending == value:
        return False, None
    patch = {"metadata": {"annotations": {REROLLER_PENDING: value}, "resourceVersion": str(view.rv)}}
    answer = await access.patch(KINDS[view.kind], view.namespace, view.name, patch)
    if answer is None:
        return True, None
    where = f"{view.kind} {view.namespace}/{view.name}"
    if held is None:
        message = f"Pending rollout of {view.kind} {view.name} dropped: its sources are back to what it runs"
        logger.info(f"{where}: {message}")
        access.event(ref_of(view), "Normal", "RerollDropped", message)
    elif held.reason == HALTED:
        metrics.skipped(held.reason)
        logger.warning(f"{where}: {held.message}"[:1000])
        access.event(ref_of(view), "Warning", "RerollHalted", held.message)
    elif held.reason == "invalid":
        metrics.skipped(held.reason)
        logger.warning(f"{where}: {held.message}"[:1000])
        access.event(ref_of(view), "Warning", "RerollBlocked", held.message)
    else:
        metrics.skipped(held.reason)
        logger.info(f"{where}: {held.message}")
        access.event(ref_of(view), "Normal", "RerollDeferred", held.message)
    return True, answer


async def recreate_job(access: Access, view: views.WorkloadView, plan: plans.Plan, snap: plans.Snapshot
                       ) -> dict[str, Any]:
    """A Job's rollout: deleted (uid-guarded), then created again with the new baseline."""
    await access.delete(k8s.JOB, view.namespace, view.name, uid=view.uid, propagation="Background")
    job = patches.recreated_job(view, patches.baseline_annotations(plan, snap))
    for delay in (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2):
        try:
            return await access.create(k8s.JOB, job)
        except k8s.AlreadyExists:
            await asyncio.sleep(delay)  # the old Job is still being removed
    raise ApiError(409, "Conflict", "the old Job is still there")


async def roll_cronjob(access: Access, view: views.WorkloadView, plan: plans.Plan, snap: plans.Snapshot,
                       mode: str, wall: float) -> tuple[dict[str, Any] | None, str]:
    """A CronJob's rollout in its mode; the baseline is written first, with the resourceVersion (a
    conflict decides again). (The answer to that write, how it rolled)."""
    if mode == "next-run":
        answer = await access.patch(k8s.CRONJOB, view.namespace, view.name,
                                    patches.cronjob_template_patch(view, plan, snap, wall, view.rv))
        return answer, "jobTemplate annotated: the next scheduled Job runs the new configuration"
    answer = await access.patch(k8s.CRONJOB, view.namespace, view.name,
                                patches.metadata_patch(plan, snap, view.rv, pending=view.pending is not None))
    if answer is None:
        return None, ""
    if mode == "restart-active":
        # The pods of its unfinished Jobs: each Job starts a new pod in place of its deleted one.
        deleted = []
        for job in await access.list(k8s.JOB, view.namespace):
            if not patches.active_job(job, view.uid):
                continue
            uid = job["metadata"]["uid"]
            for pod in await access.list(k8s.POD, view.namespace, labels=f"batch.kubernetes.io/controller-uid={uid}"):
                meta = pod["metadata"]
                if not meta.get("deletionTimestamp") and await access.delete(
                        k8s.POD, view.namespace, meta["name"], uid=meta.get("uid")):
                    deleted.append(meta["name"])
        return answer, (f"pod(s) {', '.join(deleted)} of its active Jobs deleted" if deleted
                        else "no active Job: nothing to restart")
    job = patches.cronjob_job(view, uuid.uuid4().hex[:5], {})
    with contextlib.suppress(k8s.AlreadyExists):  # a random suffix: taken only by a Job of ours
        await access.create(k8s.JOB, job)
    return answer, f"Job {job['metadata']['name']} created from its template"


# The controller in Kopf's memo, typed: operators/reroller.py reaches it as ``CONTROLLER(memo)``.
CONTROLLER = MemoSlot("reroller", RerollerController)
