"""Copyrator: the controller (state from watches, decisions in ``copyrator.rules``, ``copies`` and ``tally``, API
via ``core.access``).

What it decides on, and where that comes from (never a read per event):
- rules: Kopf's ``copyrator-rules`` index (fields, uid, generation, status);
- namespaces: Kopf's ``copyrator-namespaces`` index (name -> labels, active);
- copies: Kopf's ``copyrator-configmap-copies`` / ``copyrator-secret-copies`` indexes (objects
  carrying the rule-uid label, reduced to a ``CopyView``: uid, resourceVersion, content hashes);
- sources: the controller's own sources index (selector-matching objects, the content copies are
  built from), fed by the ConfigMap/Secret events and, for a rule created, updated or resumed, by
  one labelled LIST per source namespace (objects that existed before the rule have no event).

``CopyratorController`` is the facade the handlers call: it turns each trigger into passes over the
places it touches. The parts, one module each:
- ``sources.Sources``: source tracking (rules, namespaces, sources, push sources);
- ``places.Places``: the copies as known (the indexes with our newer writes over them, a
  ``core.state.Newest``), objects in the way, failing and refused copies;
- ``claims.Claims``: what a rule wants at a place, and which rule gets a free name;
- ``writer.CopyWriter``: the copy writer (one write per copy, ``copies.decide``; a sweep's places
  decided in one call); it returns what it did at each place (a ``places.Outcome``), which the
  controller hands to ``Places.record`` and ``StatusReporter.record`` (no part changes another's
  state);
- ``status.StatusReporter``: each rule's ledger, status and Events (a push's on its source).

A namespace event syncs the copies of that namespace only; a source event the copies of that source
only; a copy edited or deleted by hand only itself. Per-rule state lives in a ``KeyedState`` (one
``forget`` when the rule or push goes); a rule's pass outside Kopf's handlers (a retry, the resync) is
a ``GuardedPass``: failures retry with backoff, never hot.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from typing import Any

from kopf_operators.copyrator import tally
from kopf_operators.copyrator.claims import Claims
from kopf_operators.copyrator.copies import Action, CopyView, Place, copy_view
from kopf_operators.copyrator.places import CopiesIndex, CopyKey, Outcome, Places
from kopf_operators.copyrator.rules import (
    NamespaceInfo,
    Options,
    Rule,
    RuleError,
    copy_name,
    is_copy,
    namespace_info,
    selects,
)
from kopf_operators.copyrator.sources import KINDS, RuleKey, Sources
from kopf_operators.copyrator.status import RULE, StatusReporter, said_once
from kopf_operators.copyrator.writer import CopyWriter
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.background import Background
from kopf_operators.core.controller import DONE, RETRY, GuardedPass, PassSettings, Result
from kopf_operators.core.state import Index, KeyedState, MemoSlot, first, values

__all__ = ["CONTROLLER", "COPIES_INDEXES", "NAMESPACES_INDEX", "RULES_INDEX", "CopyratorController"]

OPERATOR = "copyrator"
RULES_INDEX = "copyrator-rules"
NAMESPACES_INDEX = "copyrator-namespaces"
COPIES_INDEXES = {"ConfigMap": "copyrator-configmap-copies", "Secret": "copyrator-secret-copies"}
# A failed pass outside Kopf's retrying handlers: try the rule again after this long (doubling, capped).
RETRY_SECONDS = (2.0, 300.0)

logger = logging.getLogger("kopf_operators.copyrator")
Work = list[tuple[Mapping[str, Any], Rule, list[Awaitable[Outcome]]]]


async def gathered(jobs: Iterable[Awaitable[Outcome]]) -> tuple[int, list[ApiError]]:
    """Independent copies at once (``CopyWriter.sync_copy`` bounds how many write at a time): the writes
    made, and the failures."""
    results = await asyncio.gather(*jobs, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, ApiError):
            raise r
    outcomes = [r for r in results if isinstance(r, Outcome)]
    errors = [r for r in results if isinstance(r, ApiError)] + [o.error for o in outcomes if o.error is not None]
    return sum(o.writes for o in outcomes if o.error is None), errors


class CopyratorController:
    def __init__(self, access: Access, options: Options, rules: Index[RuleKey, dict[str, Any]],
                 namespaces: Index[str, NamespaceInfo], copies: Mapping[str, CopiesIndex]) -> None:
        self.access, self.options = access, options
        self.background = Background(OPERATOR)
        self.state: KeyedState[str] = KeyedState()  # per rule uid (a push: its source's uid)
        self.by_rule: KeyedState[RuleKey] = KeyedState()  # per rule (namespace, name): its timers
        self.sources = Sources(access, options, rules, namespaces, self.state)
        self.places = Places(copies, self.state)
        self.claims = Claims(options, self.sources, self.places)
        self.status = StatusReporter(access, options, self.sources, self.claims, self.places, self.background,
                                     self.state, self.by_rule)
        self.writer = CopyWriter(access, options, self.sources, self.places, self.claims)
        self.passes: GuardedPass[RuleKey] = self.by_rule.track(GuardedPass(self.background, self._pass, PassSettings(
            OPERATOR, say=self._say, paused=lambda: self.access.paused, retry=RETRY_SECONDS, error_kind="status")))
        # Set by the first handled event: Kopf calls handlers only once every index is filled.
        self._indexed = asyncio.Event()

    # --- rules ----------------------------------------------------------------------------------------

    async def rule_changed(self, body: Mapping[str, Any], trigger: str) -> None:
        """A rule created, updated or resumed: list its sources once, then converge all its copies.
        A copy the API server refuses (a quota, a policy) or fails is in the rule's status and is
        retried here with backoff, as outside Kopf's handlers: handed to Kopf, a refusal (403, 422)
        failed the handler "permanently" with an ERROR line while the status said it would be retried.
        Raises ApiError when listing the sources or writing the status fails (Kopf retries the handler).
        On a standby it waits until this replica acts: its writes would be refused, and Kopf would log
        each refusal as an error and retry it."""
        if self.access.paused:
            await self.access.until_acting()
        snapshot = tally.rule_snapshot(body)
        rule = await self.status.valid_rule(snapshot)
        if rule is None:
            return
        await self.sources.list_sources(rule)
        await self.sources.older_rules_listed(rule)
        errors = await self.sweep(rule, trigger)
        await self.status.flush_status(snapshot)
        self._retry_or_reset(rule, errors)

    async def _pass(self, key: RuleKey, trigger: str) -> Result:
        """One rule's sweep outside Kopf's handlers (retries, resync): observe the indexes, let each copy
        decide its write, act, then the status. Some copies failed: RETRY (with backoff)."""
        snapshot = first(self.sources.rules, key)
        if snapshot is None or snapshot["metadata"].get("deletionTimestamp"):
            return DONE
        rule = self.sources.rule(snapshot)
        if isinstance(rule, RuleError) or rule.uid in self.sources.deleting:
            return DONE
        errors = await self.sweep(rule, trigger)
        await self.status.flush_status(snapshot)
        return RETRY if errors else DONE

    @staticmethod
    def _say(key: RuleKey, trigger: str, exc: Exception, _delay: float | None) -> str:
        return f"Copyrator {key[0]}/{key[1]}: {trigger}: {exc}; retrying with backoff"

    def _retry_or_reset(self, rule: Rule, errors: list[ApiError]) -> None:
        key = (rule.namespace, rule.name)
        if errors:
            self.passes.retry_later(key)
        elif self.passes.backoff is not None:
            self.passes.backoff.reset(key)

    async def rule_deleted(self, body: Mapping[str, Any]) -> int:
        """Prune every copy of a rule deleted or being deleted (from the copies index). Raises ApiError.
        Idempotent: copies already pruned are not in the index any more (or are remembered as gone)."""
        meta = body["metadata"]
        uid = str(meta.get("uid"))
        self.sources.deleting.add(uid)
        # A sync that started before the deletion may still create a copy: let it finish first.
        for _ in range(600):
            if not self.writer.inflight.get(uid):
                break
            await asyncio.sleep(0.05)
        key = (str(meta.get("namespace")), str(meta.get("name")))
        self.by_rule.forget(key)
        count = await self.prune(uid, f"{key[0]}/{key[1]}", "rule deleted")
        self.state.forget(uid)
        return count

    async def rule_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Any rule event. Rules carry no finalizer (deleting one never waits for this operator): a
        rule deleted, or held in deletion by someone else's finalizer, has its copies pruned here; if
        that fails, or the operator was down, the orphan sweep prunes them."""
        self._indexed.set()
        meta = body.get("metadata") or {}
        if event_type != "DELETED" and not meta.get("deletionTimestamp"):
            return
        await said_once(self.rule_deleted(body), meta, "prune", "pruning the copies of the deleted rule failed",
                        "the periodic sweep retries")

    async def prune_orphans(self) -> int:
        """Copies whose rule is gone (deleted while the operator was down, or a prune that failed).
        Suspects come from the indexes (no request when there are none); each suspect rule is confirmed
        gone by one listing of its name in its namespace before its copies are deleted. A copy that does
        not say where its rule is, or a listing that fails, is left alone. Nothing while Kopf has paused
        this process (a standby: ``Access.paused``)."""
        if self.access.paused:
            return 0
        live = self.sources.live_rule_uids()
        by_rule: dict[str, list[CopyView]] = collections.defaultdict(list)
        for kind in KINDS:
            index = self.places.index[kind]
            for copy_key in list(index):
                if copy_key[0] == "rule" and copy_key[1] not in live:  # pushed copies: _resync_pushes prunes them
                    by_rule[copy_key[1]].extend(v for v in values(index, copy_key) if not v.pushed)
        by_rule = {uid: views for uid, views in by_rule.items() if views}
        count = 0
        for uid, rule_key in tally.orphan_suspects(by_rule, live).items():
            place = tally.split_rule_key(rule_key)
            try:
                if uid not in self.sources.deleting:  # a deletion seen here needs no confirmation
                    if place is None:
                        logger.debug(f"Copyrator: copies of rule uid {uid} do not name their rule; left alone")
                        continue
                    listed = await self.access.list(RULE, place[0], fields=f"metadata.name={place[1]}")
                    if not tally.rule_gone(uid, listed):
                        continue  # alive outside this process's view (another shard, an unwatched namespace)
                    self.sources.deleting.add(uid)
                count += await self.prune(uid, rule_key or uid, "rule gone")
            except ApiError as exc:
                metrics.error(OPERATOR, "prune")
                logger.warning(f"Copyrator {rule_key or uid}: pruning the copies of a gone rule failed ({exc}); "
                               f"the next sweep retries")
        return count

    # --- namespaces, sources and copies -------------------------------------------------------------

    async def namespace_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A namespace added or relabelled: only that namespace's copies, for each rule. (Any event,
        deleted or terminating too, makes the rules' ledgers judge its places again.)"""
        info = namespace_info(body)
        self.status.namespace_touched(info.name)
        if event_type == "DELETED" or not info.active:  # nothing fails in it any more
            self.places.settled_in(info.name)
        if event_type not in ("ADDED", "MODIFIED") or not info.active:
            return  # its copies go with it (and the initial listing: the rules' resume converges)
        trigger = f"namespace {event_type.lower()}"
        sync = self._sync
        await self._run(trigger, [
            (snapshot, rule, [sync(rule, info.name, name) for name in sorted(
                self.sources.copy_names(rule)
                | {v.name for v in self.places.copies_of(rule.uid, rule.kind, namespace=info.name)})])
            for snapshot, rule in self.sources.active_rules() if info.name not in rule.source_namespaces]
            + [(snapshot, rule, []) for snapshot, rule in self.sources.active_rules()
               if info.name in rule.source_namespaces])

    async def object_event(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A ConfigMap/Secret event: a copy (deleted or edited by hand), a source, or an object that
        was in a copy's way."""
        self._indexed.set()
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        key: CopyKey = (kind, namespace, name)
        self.status.touched(kind, namespace, name, event=True)
        if is_copy(body):
            await self._copy_event(kind, event_type, body)
            return
        if event_type == "DELETED" and self.places.cleared(key, str(meta.get("uid", ""))):
            await self._place_freed(kind, namespace, name, "conflict cleared")
        old = self.sources.get(kind, (namespace, name))
        if self.sources.stale(kind, body):
            return
        rules = self.sources.active_rules(kind)
        now = [(s, r) for s, r in rules if event_type != "DELETED" and not r.push and selects(r, kind, body)]
        push, gone = self.sources.push_changed(kind, event_type, body)
        if gone is not None:
            self.state.forget(gone.uid)
        entry = self.sources.entry(body, [r for _s, r in now] + ([push] if push is not None else []))
        if push is not None:
            now.append((entry, push))
        if now:
            self.sources.put(kind, entry)
            self.sources.refuse_too_large({**body, "kind": kind}, [r for _s, r in now])
        elif old is not None:
            self.sources.drop(kind, (namespace, name))
        if event_type is None and push is None:
            return  # the initial listing: the rules' resume converges
        # Each rule once: the rules selecting it now, and those that selected it before (to prune).
        affected = {r.uid: (s, r) for s, r in rules if old is not None and selects(r, kind, old)}
        affected.update({r.uid: (s, r) for s, r in now})
        if not affected:
            return
        trigger = f"source {(event_type or 'listed').lower()}"
        await self._run(trigger, [(s, r, self._source_jobs(r, name)) for s, r in affected.values()])

    def _source_jobs(self, rule: Rule, source_name: str) -> list[Awaitable[Outcome]]:
        name = copy_name(rule, source_name)
        places = self.sources.targets(rule) | {v.namespace for v in self.places.copies_of(rule.uid, rule.kind,
                                                                                           name=name)}
        return [self._sync(rule, ns, name) for ns in sorted(places)]

    async def _copy_event(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        view = copy_view(body, kind)
        key: CopyKey = (kind, view.namespace, view.name)
        self.places.cleared(key)  # a copy: no object in the way there
        if event_type == "DELETED":
            self.places.deleted(key, view.uid)
            await self._place_freed(kind, view.namespace, view.name, "copy deleted")
            return
        self.places.copy(kind, view.namespace, view.name)  # drops our pending write once the watch caught up
        if event_type is None or not view.drifted:
            return  # our own write echoing back (or the initial listing: the resume handles it)
        for snapshot, rule in self.sources.active_rules(kind):
            if rule.uid == view.rule_uid:
                await self._run("copy edited", [(snapshot, rule, [self._sync(rule, view.namespace, view.name)])])

    async def _place_freed(self, kind: str, namespace: str, name: str, trigger: str) -> None:
        """An object left a place: every rule that wants a copy there gets it (or keeps it absent)."""
        wanted = [(s, r) for s, r in self.sources.active_rules(kind) if self.sources.source_for(r, name)[0] is not None]
        await self._run(trigger, [(s, r, [self._sync(r, namespace, name)]) for s, r in wanted])
        for snapshot, rule in wanted:
            # A renamed copy may have waited for this place: it goes now that its replacement is made
            # (from the indexes: deletes only, no reads).
            stale = [v for v in self.places.copies_of(rule.uid, kind, namespace=namespace)
                     if v.name not in self.sources.copy_names(rule)]
            if stale:
                await self._run(trigger, [(snapshot, rule, [self._sync(rule, namespace, v.name) for v in stale])])

    async def _run(self, trigger: str, work: Work) -> None:
        """Event-driven passes: failures are logged once and the rule is retried with backoff. None on a
        standby (``Access.paused``): it would write nothing, and the pass it takes over with covers them."""
        if self.access.paused:
            for _snapshot, _rule, jobs in work:
                for job in jobs:
                    if isinstance(job, Coroutine):
                        job.close()  # never started
            return
        if not work:
            return
        started = time.perf_counter()
        results = await asyncio.gather(*(gathered(jobs) for _s, _r, jobs in work))
        if any(writes for writes, _errors in results):
            metrics.REACTION.labels(operator=OPERATOR, trigger=trigger.split()[0]).observe(
                time.perf_counter() - started)
        for (snapshot, rule, _jobs), (writes, errors) in zip(work, results, strict=True):
            if rule.push:  # no status object: problems go to the source; the resync retries failures
                self.status.check_push(snapshot, rule)
                if errors:
                    logger.warning(f"Copyrator {rule.key}: {trigger}: {len(errors)} copy operation(s) failed "
                                   f"({errors[0]}); the next resync retries")
                continue
            if writes:
                self.status.triggers[rule.uid] = trigger
            self.status.schedule_status(snapshot)  # once per burst; written only when it changed
            if errors:
                logger.warning(f"Copyrator {rule.key}: {trigger}: {len(errors)} copy operation(s) failed "
                               f"({errors[0]}); retrying with backoff")
                self.passes.retry_later((rule.namespace, rule.name))

    # --- the writes, and what they did ---------------------------------------------------------------------

    async def _sync(self, rule: Rule, namespace: str, name: str, kind: str | None = None,
                    planned: tuple[Place, Action] | None = None) -> Outcome:
        """One place's pass (``CopyWriter.sync_copy``), its outcome recorded before any other pass at that
        place observes it (nothing is awaited between the writer's answer and the record)."""
        outcome = await self.writer.sync_copy(rule, namespace, name, kind, planned)
        self._record(outcome)
        return outcome

    def _record(self, outcome: Outcome) -> None:
        self.places.record(outcome)
        self.status.record(outcome)

    async def sweep(self, rule: Rule, trigger: str) -> list[ApiError]:
        """Every copy of one rule, from the indexes: writes only what differs."""
        await self.sources.hydrate_accepted(rule)
        targets = sorted(self.sources.targets(rule))
        wanted = self.sources.copy_names(rule)
        names = wanted | {v.name for v in self.places.copies_of(rule.uid, rule.kind)}
        visited: set[CopyKey] = set()
        # Places the ledger sees holding the rule's copy in sync: ``sync_copy`` would write nothing there
        # (an idle sweep of many copies then costs a count, not a pass per copy).
        copied = self.status.copied(rule)

        def jobs_for(selected: Iterable[str], others: Iterable[CopyKey] = ()) -> list[Awaitable[Outcome]]:
            """Observe the places, decide them in one call, and the writes to make (each under its lock)."""
            keys: list[CopyKey] = []
            for name in sorted(selected):
                places = set(targets) | {v.namespace for v in self.places.copies_of(rule.uid, rule.kind, name=name)}
                visited.update((rule.kind, ns, name) for ns in places)
                keys.extend((rule.kind, ns, name) for ns in sorted(places) if (ns, name) not in copied)
            keys.extend(others)
            visited.update(others)
            decided = self.writer.decide(rule, keys)
            done = set(decided.settled)  # nothing to write there, so nothing fails there either
            self.places.settled(rule.uid, lambda key: key in done)
            return [self._sync(rule, place.key[1], place.key[2], kind=place.key[0], planned=(place, action))
                    for place, action in decided.writes]

        started = time.perf_counter()
        # First the names the rule wants, then the copies under names it no longer uses (a renamed
        # target): each of those goes only once its replacement is in sync.
        writes, errors = await gathered(jobs_for(wanted))
        # (Decided after the first round: whether an old copy stays depends on its replacement.)
        other_kinds = [(kind, view.namespace, view.name) for kind in KINDS if kind != rule.kind
                       for view in self.places.copies_of(rule.uid, kind)]  # the rule's type changed: they go
        more, more_errors = await gathered(jobs_for(names - wanted, other_kinds))
        # No longer places of the rule, or in sync: nothing fails there.
        self.places.settled(rule.uid, lambda key: key not in visited or (key[0] == rule.kind and key[1:] in copied))
        writes, errors = writes + more, errors + more_errors
        if writes:  # a reaction is an event that caused writes; no-op passes are not timed
            metrics.REACTION.labels(operator=OPERATOR, trigger=trigger.split()[0]).observe(
                time.perf_counter() - started)
        logger.debug(f"Copyrator {rule.key}: reconciled (trigger={trigger}): {len(names)} name(s), "
                     f"{len(targets)} target(s), {writes} write(s)")
        if errors:
            logger.warning(f"Copyrator {rule.key}: {len(errors)} copy operation(s) failed ({errors[0]}); "
                           f"retrying")
        return errors

    async def prune(self, uid: str, rule_key: str, why: str) -> int:
        """Delete the copies carrying this rule uid (each with its uid as a precondition)."""
        count = 0
        for kind in KINDS:
            for view in self.places.copies_of(uid, kind):
                self._record(await self.writer.delete_copy(kind, view))
                count += 1
                logger.info(f"Copyrator {rule_key}: pruned {kind} {view.namespace}/{view.name} ({why})")
        if count:
            metrics.action(OPERATOR, "deleted", count)
        return count

    # --- the periodic sweep -----------------------------------------------------------------------------

    def start_resync(self) -> None:
        """Level-triggered: a sweep over the indexes, no request unless something must change. The
        orphan sweep runs at start (once the indexes are filled) and after every pass."""
        self.background.resync(self.options.resync_seconds, self._resync, paused=lambda: self.access.paused,
                               until_acting=self.access.until_acting,
                               initial=self._initial_sweep)

    async def _initial_sweep(self) -> None:
        # No event within a period: the indexes may be partial, which only makes the sweep find less.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._indexed.wait(), timeout=self.options.resync_seconds)
        await self._resync_pushes()
        await self.prune_orphans()

    async def _resync(self) -> None:
        metrics.action(OPERATOR, "resync")  # the sweep itself: idle, it writes nothing else to show it runs
        # Every resync counts each rule's places from scratch (level-triggered, like its writes).
        self.status.recount()
        for key in list(self.sources.rules):
            await self.passes(key, "resync")
        await self._resync_pushes()
        await self.prune_orphans()

    async def _resync_pushes(self) -> None:
        """Push sources' copies, like a rule's; and copies made by a push whose source is gone or
        pushes no more (deleted while the operator was down): they are ours (marker and push mark).
        Nothing while Kopf has paused this process (a standby writes nothing)."""
        if getattr(self.access, "paused", False) or not self.options.push:
            return  # push turned off: copies pushed before stay as they are
        live = set()
        for kind in KINDS:
            for place, rule in list(self.sources.pushes[kind].items()):
                live.add(rule.uid)
                try:
                    errors = await self.sweep(rule, "resync")
                except ApiError as exc:
                    errors = [exc]
                if errors:
                    logger.warning(f"Copyrator {rule.key}: resync: {errors[0]}; the next resync retries")
                self.status.check_push(self.sources.get(kind, place) or {}, rule)
        for kind in KINDS:
            for key in list(self.places.index[kind]):
                if key[0] != "rule" or key[1] in live:
                    continue
                for view in self.places.copies_of(key[1], kind):
                    if not view.pushed:
                        continue
                    try:
                        if not await self.sources.push_gone(kind, view):
                            continue
                        self._record(await self.writer.delete_copy(kind, view))
                    except ApiError as exc:
                        logger.warning(f"Copyrator: pruning the pushed copy {view.namespace}/{view.name} failed "
                                       f"({exc}); the next resync retries")
                        continue
                    metrics.action(OPERATOR, "deleted")
                    logger.info(f"Copyrator push {view.source}: pruned {kind} {view.namespace}/{view.name} "
                                f"(the source pushes no more)")

    async def stop(self) -> None:
        await self.background.stop()


# The controller in Kopf's memo, typed: operators/copyrator.py reaches it as ``CONTROLLER(memo)``.
CONTROLLER = MemoSlot("copyrator", CopyratorController)
