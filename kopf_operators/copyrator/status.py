"""Copyrator: status and Events of rules (and the problems of push sources, reported on the source).

Status and the Normal ``Synced`` Event of a rule are written after a short delay, once per burst;
Warning Events (``Conflict``, ``Refused``, ``Invalid``) when what they report changes. The counts come
from each rule's ledger (``tally.Ledger``): events mark the places they touch, a flush judges only
those again, so a status costs O(places changed), not O(copies); it is rebuilt from the indexes when
the rule, its sources or another rule of its kind change, and at every resync.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from kopf_operators.copyrator import copies, rules
from kopf_operators.copyrator.claims import Claims
from kopf_operators.copyrator.places import Outcome, Places
from kopf_operators.copyrator.sources import RuleKey, Sources
from kopf_operators.copyrator.tally import (
    Judgement,
    Ledger,
    Standing,
    Tally,
    build_status,
    decide_push,
    decide_status,
    ledger_tally,
    standing,
    status_changed,
)
from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.background import Background, KeyedTimers
from kopf_operators.core.conventions import stall_event
from kopf_operators.core.state import KeyedState, PerKey, first

OPERATOR = "copyrator"
RULE = k8s.Kind(rules.API_VERSION, rules.PLURAL, rules.KIND)
Judged = Mapping[str, tuple[dict[str, Any], str, str | None]]

logger = logging.getLogger("kopf_operators.copyrator")


async def said_once(work: Awaitable[Any], meta: Mapping[str, Any], kind: str, failed: str, retry: str) -> None:
    """``work`` outside Kopf's retrying handlers: an API failure is counted and logged once (``retry``
    says who tries again)."""
    try:
        await work
    except ApiError as exc:
        metrics.error(OPERATOR, kind)
        logger.warning(f"Copyrator {meta.get('namespace')}/{meta.get('name')}: {failed} ({exc}); {retry}")


class StatusReporter:
    """Each rule's ledger, tally, status and Events."""

    def __init__(self, access: Access, options: rules.Options, sources: Sources, claims: Claims, places: Places,
                 background: Background, state: KeyedState[str], by_rule: KeyedState[RuleKey]) -> None:
        self.access, self.options = access, options
        self.sources, self.claims, self.places = sources, claims, places
        self.flush: KeyedTimers[RuleKey] = by_rule.track(background.timers())  # a rule's status, once per burst
        self.triggers: PerKey[str, str] = state.map()
        self.written: PerKey[str, dict[str, Any]] = state.map()  # rule uid -> the status we wrote last
        self.target_reports: PerKey[str, str] = state.map()  # rule uid -> the targets' refusals last reported
        # rule uid (a push: its source's) -> copies kept without consent
        self.unconsented: dict[str, int] = {}
        state.on_forget(lambda uid: self.kept(uid, 0))
        # rule uid (a push: its source's uid) -> its places and their counts, kept as events touch them
        # (status in O(places changed), not O(copies)); rebuilt from the indexes at start and whenever
        # the rule, its sources or another rule of its kind changed, and at every resync.
        self.ledgers: PerKey[str, Ledger] = state.map()
        self.ledger_keys: PerKey[str, RuleKey] = state.map()  # rule uid -> where its status is (none for a push)
        self.done: PerKey[str, collections.Counter[str]] = state.map()  # rule uid -> writes since the last Synced

    # --- the ledgers ------------------------------------------------------------------------------------

    def tally(self, rule: rules.Rule) -> Tally:
        """The rule's copies as the indexes see them (from its ledger: see ``ledger``)."""
        judged = self._judged(rule)
        ledger = self.ledger(rule, judged)
        sources = {source_name: (source, blocked) for source_name, (source, _name, blocked) in judged.items()}
        tally = ledger_tally(rule, ledger, sources, self.options)
        tally.failed = len(self.places.failed.get(rule.uid, ()))
        tally.rejected = list((self.places.rejected.get(rule.uid) or {}).values())
        for ns_name in rule.source_namespaces:
            if self.sources.namespace(ns_name) is None and rules.needs_consent(rule, ns_name, self.options):
                tally.refusals.append(f"source namespace {ns_name} does not exist: nothing there consents "
                                      f"to this rule ({rules.ALLOWED_NAMESPACES_ANNOTATION})")
        tally.skipped = sum(1 for e in self.sources.selected(rule) if rules.skip_reason(rule, e) is not None)
        return tally

    def _judged(self, rule: rules.Rule) -> dict[str, tuple[dict[str, Any], str, str | None]]:
        """The rule's sources: source name -> (the source it copies, the copy's name, why it cannot
        copy it as configured or None)."""
        judged = {}
        for source_name in self.sources.source_names(rule):
            source = self.sources.winner(rule, source_name)
            if source is not None:
                name = rules.copy_name(rule, source_name)
                judged[source_name] = (source, name, self.sources.source_for(rule, name)[1])
        return judged

    def _basis(self, rule: rules.Rule) -> tuple[Any, ...]:
        """What every place of ``rule`` is judged from besides the place itself (its namespace, what is
        at it): the rule, its sources, and the other rules of its kind (they may claim its names)."""
        def sources(r: rules.Rule) -> tuple[tuple[str, ...], ...]:
            return tuple(sorted(tuple(str(e["metadata"].get(k, "")) for k in ("namespace", "name", "uid",
                                                                                 "resourceVersion"))
                                for e in self.sources.selected(r)))
        others = sorted(((r.uid, r, sources(r)) for _s, r in self.sources.active_rules(rule.kind)
                         if r.uid != rule.uid), key=lambda other: other[0])
        return rule, sources(rule), others

    def ledger(self, rule: rules.Rule, judged: Judged | None = None) -> Ledger:
        """The rule's ledger, brought up to date: re-built when its basis changed (O(copies), as often as
        a write to every copy is due anyway), else only the places events touched are judged again."""
        judged = self._judged(rule) if judged is None else judged
        basis = self._basis(rule)
        ledger = self.ledgers.get(rule.uid)
        wanted: dict[str, dict[str, Any] | None] = {}

        def judge(source_name: str, namespace: str) -> None:
            source, name, blocked = judged[source_name]
            if source_name not in wanted:
                # (A source held without its data is read before any copy of it is written.)
                wanted[source_name] = (None if blocked or rules.is_lean(source)
                                       else copies.desired_copy(rule, source, ""))
            assert ledger is not None
            ledger.judge(source_name, namespace, self._standing(rule, source, namespace, name, wanted[source_name]))

        if ledger is None or ledger.basis != basis:
            ledger = self.ledgers[rule.uid] = Ledger(kind=rule.kind, basis=basis)
            if not rule.push:
                self.ledger_keys[rule.uid] = (rule.namespace, rule.name)
            ledger.names = {name: source_name for source_name, (_s, name, _b) in judged.items()}
            ledger.targets = self.sources.targets(rule)
            for namespace in ledger.targets:
                for source_name in judged:
                    judge(source_name, namespace)
            return ledger
        dirty_namespaces, ledger.dirty_namespaces = ledger.dirty_namespaces, set()
        dirty_places, ledger.dirty_places = ledger.dirty_places, set()
        for namespace in dirty_namespaces:
            info = self.sources.namespace(namespace)
            if info is not None and rules.is_target(rule, info, self.options.by_name_only):
                ledger.targets.add(namespace)
                for source_name in judged:
                    judge(source_name, namespace)
            else:
                ledger.targets.discard(namespace)
                for source_name in judged:
                    ledger.judge(source_name, namespace, None)
        for namespace, name in dirty_places - {(ns, n) for ns in dirty_namespaces for n in ledger.names}:
            owner = ledger.names.get(name)
            if owner is not None and namespace in ledger.targets:
                judge(owner, namespace)
        return ledger

    def copied(self, rule: rules.Rule) -> set[tuple[str, str]]:
        """(namespace, copy name) of the places that hold the rule's copy in sync, as its ledger sees them."""
        ledger = self.ledger(rule)
        return {(namespace, name) for name, source_name in ledger.names.items()
                for namespace, (standing, _text) in (ledger.places.get(source_name) or {}).items()
                if standing is Standing.COPIED}

    def _standing(self, rule: rules.Rule, source: Mapping[str, Any], namespace: str, name: str,
                  wanted: Mapping[str, Any] | None) -> Judgement:
        allowed = rules.allowed_into(rule, source, namespace, self.options)
        info = self.sources.namespace(namespace)
        refusal = None if info is None else rules.target_refusal(rule, info, self.options)
        view = self.places.copy(rule.kind, namespace, name)
        foreign = (rule.kind, namespace, name) in self.places.foreign
        # Who else wants a free name is asked only where it matters (O(rules)).
        claimant = self.claims.claimed(rule, rule.kind, namespace, name) \
            if allowed and refusal is None and wanted is not None and view is None and not foreign else None
        return standing(rule, namespace, name, allowed=allowed, view=view, wanted=wanted, foreign=foreign,
                        claimant=claimant, refusal=refusal)

    def touched(self, kind: str, namespace: str, name: str, *, event: bool = False) -> None:
        """Something at a place changed (its object, our write, an object in the way): the ledgers
        judge it again. On an event, a rule whose place it is writes its status (once per burst)."""
        for uid, ledger in self.ledgers.items():
            if ledger.kind == kind and name in ledger.names:
                ledger.dirty_places.add((namespace, name))
                if event and (key := self.ledger_keys.get(uid)) is not None:
                    self.schedule(key)

    def record(self, outcome: Outcome) -> None:
        """What a pass did at a place: its writes count towards the rule's next ``Synced``; a place it
        changed (our write, a read, an object in the way) is judged again."""
        if outcome.seen or outcome.foreign is not None:
            self.touched(*outcome.key)
        for what in outcome.counted:
            self.done.setdefault(outcome.rule_uid, collections.Counter())[what] += 1

    def namespace_touched(self, namespace: str) -> None:
        """A namespace added, relabelled, terminating or deleted: the ledgers judge its places again; a
        rule it was a target of writes its status (once per burst)."""
        for uid, ledger in self.ledgers.items():
            ledger.dirty_namespaces.add(namespace)
            if namespace in ledger.targets and (key := self.ledger_keys.get(uid)) is not None:
                self.schedule(key)

    def recount(self) -> None:
        """Every rule's places counted from scratch at the next status (level-triggered, like its writes)."""
        self.ledgers.clear()
        self.ledger_keys.clear()

    def kept(self, uid: str, count: int) -> None:
        """The metric of copies kept without their namespace's consent, as the rules' counts change."""
        if self.unconsented.get(uid, 0) != count:
            if count:
                self.unconsented[uid] = count
            else:
                self.unconsented.pop(uid, None)
            metrics.unconsented_copies(sum(self.unconsented.values()))

    # --- pushes: no status object, problems go to the source --------------------------------------------

    def check_push(self, entry: Mapping[str, Any], rule: rules.Rule) -> None:
        """A push's problems: observe (its tally, its source), decide (``tally.decide_push``), act (a
        Warning on the source when they change)."""
        tally = self.tally(rule)
        self.kept(rule.uid, len(tally.kept))
        source = self.sources.get(rule.kind, (rule.namespace, rule.name)) or {}
        reason, message = decide_push(rule, tally, source)
        self.sources.report_push(entry, reason, message)

    # --- a rule's status ----------------------------------------------------------------------------------

    def schedule_status(self, snapshot: Mapping[str, Any]) -> None:
        """Write the rule's status (and its Synced event) once per burst of changes."""
        self.schedule((snapshot["metadata"]["namespace"], snapshot["metadata"]["name"]))

    def schedule(self, key: RuleKey) -> None:
        self.flush.start(key, self.options.status_delay_seconds, lambda: self._flush_due(key))

    async def _flush_due(self, key: RuleKey) -> None:
        current = first(self.sources.rules, key)
        if current is not None and not self.access.paused:
            await said_once(self.flush_status(current), current["metadata"], "status", "status not written",
                            "the next pass retries")

    def _previous(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        uid = snapshot["metadata"].get("uid")
        return dict(self.written.get(str(uid)) or snapshot.get("status") or {})

    async def valid_rule(self, snapshot: Mapping[str, Any]) -> rules.Rule | None:
        """The rule, or None when it is being deleted or invalid (an invalid rule's problem is reported
        in its status)."""
        if snapshot["metadata"].get("deletionTimestamp"):
            return None
        rule = self.sources.rule(snapshot)
        if isinstance(rule, rules.RuleError):
            await self._report_problem(snapshot, rule)
            return None
        return rule

    async def flush_status(self, snapshot: Mapping[str, Any]) -> None:
        """A rule's status pass: observe (the status written last, the tally, the writes done since the
        last ``Synced``), decide (``tally.decide_status``: one call), act (Events, log lines, the status)."""
        rule = await self.valid_rule(snapshot)
        if rule is None or rule.uid in self.sources.deleting:
            return
        previous = self._previous(snapshot)
        tally = self.tally(rule)
        decision = decide_status(rule, previous, tally, done=self.done.pop(rule.uid, None),
                                 trigger=self.triggers.pop(rule.uid, ""),
                                 told_refusals=self.target_reports.get(rule.uid, ""))
        self.kept(rule.uid, len(tally.kept))
        if decision.target_refusals != self.target_reports.get(rule.uid, ""):
            self.target_reports[rule.uid] = decision.target_refusals
        for line, event in decision.said:
            if line is not None:
                logger.warning(line)
            self.access.event(snapshot, *event)
        await self._write_status(snapshot, previous, decision.status)

    async def _write_status(self, snapshot: Mapping[str, Any], previous: Mapping[str, Any],
                            status: dict[str, Any]) -> None:
        if not status_changed(previous, status):
            return
        meta = snapshot["metadata"]
        answer = await self.access.patch_status(RULE, meta["namespace"], meta["name"], status)
        if answer is not None:
            self.written[str(meta.get("uid"))] = {**previous, **status}
            stalled = stall_event(previous.get("conditions"), status.get("conditions"))
            if stalled:  # one uniform Event per Stalled transition, for every kind (docs/observability.md)
                self.access.event(snapshot, *stalled)

    async def _report_problem(self, snapshot: Mapping[str, Any], problem: rules.RuleError) -> None:
        meta = snapshot["metadata"]
        previous = self._previous(snapshot)
        placeholder = rules.Rule(namespace=meta["namespace"], name=meta["name"], uid=str(meta.get("uid", "")),
                                 generation=int(meta.get("generation") or 0), rule_type="configmap",
                                 selector={}, source_namespaces=())
        status = build_status(placeholder, previous, problem=problem)
        status.pop("ruleType", None)
        status.pop("sourceNamespaces", None)
        ready: Mapping[str, Any] = next((c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), {})
        if ready.get("message") != str(problem) or ready.get("observedGeneration") != status["observedGeneration"]:
            logger.warning(f"Copyrator {meta['namespace']}/{meta['name']}: {problem.reason}: {problem}")
            self.access.event(snapshot, "Warning", problem.reason, str(problem))
        await self._write_status(snapshot, previous, status)
