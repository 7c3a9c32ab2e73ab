"""Copyrator: source tracking (rules, namespaces and the objects copies are made of, as the watches see them).

- rules: Kopf's ``copyrator-rules`` index, parsed once per version;
- namespaces: Kopf's ``copyrator-namespaces`` index;
- sources: selector-matching objects (per kind, a ``core.state.Newest`` of their entries: the
  ConfigMap/Secret events and each rule's one LIST may report them out of order), fed by
  ``saw_event`` and ``list_sources``;
- push sources: objects with a push annotation, and the implicit rule each stands for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from kopf_operators.copyrator.copies import CopyView
from kopf_operators.copyrator.rules import (
    PUSH_TO_ANNOTATION,
    PUSH_TO_MATCHING_ANNOTATION,
    NamespaceInfo,
    Options,
    Rule,
    RuleError,
    consent,
    copy_name,
    copy_problem,
    is_copy,
    is_lean,
    is_target,
    needs_consent,
    parse_rule,
    push_rule,
    selects,
    source_entry,
    source_names_for,
    target_refusal,
    too_large,
    winner,
)
from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.state import Index, KeyedState, Newest, PerKey, first, version_of

KINDS = {"ConfigMap": k8s.CONFIGMAP, "Secret": k8s.SECRET}
RuleKey = tuple[str, str]  # (namespace, name) of a rule
Place = tuple[str, str]  # (namespace, name) of an object
# A new rule waits at most this long for the sources of older rules of its kind to be listed (their
# handlers run concurrently) before it claims a free target name; then it goes ahead.
OLDER_LISTINGS_SECONDS = 10.0

logger = logging.getLogger("kopf_operators.copyrator")


def _source_versions() -> Newest[Place, dict[str, Any]]:
    return Newest(lambda e: version_of(e["metadata"].get("resourceVersion")), lambda e: e["metadata"].get("uid"))


class Sources:
    """What a rule copies from, and where to (read from the watches; never a read per event)."""

    def __init__(self, access: Access, options: Options, rules: Index[RuleKey, dict[str, Any]],
                 namespaces: Index[str, NamespaceInfo], state: KeyedState[str]) -> None:
        self.access, self.options = access, options
        self.rules = rules            # Kopf's live index: (namespace, name) -> rule snapshot
        self.namespaces = namespaces  # Kopf's live index: name -> NamespaceInfo
        # kind -> (namespace, name) -> the source entry (the content copies are made of), newest first
        self.store: dict[str, Newest[Place, dict[str, Any]]] = {kind: _source_versions() for kind in KINDS}
        # Push sources (a push annotation, no rule): kind -> (namespace, name) -> their implicit rule.
        self.pushes: dict[str, dict[Place, Rule]] = {"ConfigMap": {}, "Secret": {}}
        self.push_reports: dict[str, str] = {}  # source uid -> the problems last reported on it
        self.deleting: set[str] = set()  # rule uids being deleted: they write nothing any more (never forgotten)
        self.oversized: set[tuple[str, Place]] = set()  # (kind, place) of the sources over the size cap
        self._parsed: PerKey[str, tuple[Any, Rule | RuleError]] = state.map()
        # rule uid -> set once this process has listed the rule's sources (``list_sources``)
        self._listed: PerKey[str, asyncio.Event] = state.map()

    # --- rules and namespaces --------------------------------------------------------------------

    def rule(self, snapshot: Mapping[str, Any]) -> Rule | RuleError:
        meta = snapshot["metadata"]
        stamp = (meta.get("uid"), meta.get("generation"), meta.get("resourceVersion"))
        cached = self._parsed.get(str(meta.get("uid")))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            parsed: Rule | RuleError = parse_rule(snapshot)
        except RuleError as exc:
            parsed = exc
        self._parsed[str(meta.get("uid"))] = (stamp, parsed)
        return parsed

    def active_rules(self, kind: str | None = None) -> list[tuple[dict[str, Any], Rule]]:
        """Valid rules not being deleted (of one kind when given), push sources' rules included (their
        "snapshot" is the source entry)."""
        result = [(self.get(k, (r.namespace, r.name)) or {}, r)
                  for k in (KINDS if kind is None else (kind,)) for r in self.pushes[k].values()]
        for key in list(self.rules):
            snapshot = first(self.rules, key)
            if snapshot is None or snapshot["metadata"].get("deletionTimestamp"):
                continue
            rule = self.rule(snapshot)
            if isinstance(rule, Rule) and rule.uid not in self.deleting and (kind is None or rule.kind == kind):
                result.append((snapshot, rule))
        return result

    def live_rule_uids(self) -> set[str]:
        """The uids of the rules in the index that are not being deleted."""
        live = set()
        for key in list(self.rules):
            snapshot = first(self.rules, key)
            if snapshot is not None and not snapshot["metadata"].get("deletionTimestamp"):
                live.add(str(snapshot["metadata"].get("uid")))
        return live

    def namespace(self, name: str) -> NamespaceInfo | None:
        return first(self.namespaces, name)

    def all_namespaces(self) -> list[NamespaceInfo]:
        return [info for name in list(self.namespaces) if (info := first(self.namespaces, name)) is not None]

    def targets(self, rule: Rule) -> set[str]:
        return {ns.name for ns in self.all_namespaces() if is_target(rule, ns, self.options.by_name_only)}

    # --- the sources index --------------------------------------------------------------------------

    def get(self, kind: str, place: Place) -> dict[str, Any] | None:
        return self.store[kind].seen(place)

    def put(self, kind: str, entry: dict[str, Any]) -> None:
        """A source entry seen (a newer one is kept over an older report; of one version, the one with
        its data over a lean one)."""
        meta = entry["metadata"]
        place = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        held = self.get(kind, place)
        if held is not None and is_lean(entry) and not is_lean(held) \
                and held["metadata"].get("uid") == meta.get("uid") \
                and held["metadata"].get("resourceVersion") == meta.get("resourceVersion"):
            return
        self.store[kind].saw(place, entry, version_of(meta.get("resourceVersion")), meta.get("uid"))
        self._oversized(kind, place)

    def drop(self, kind: str, place: Place) -> None:
        self.store[kind].forget(place)
        self._oversized(kind, place)

    def clear(self, kind: str) -> None:
        for place, _entry in self.store[kind].held():
            self.drop(kind, place)

    def _oversized(self, kind: str, place: Place) -> None:
        """The gauge of sources refused for their size, as they come and go."""
        held = self.get(kind, place)
        count = len(self.oversized)
        if held is not None and too_large(held):
            self.oversized.add((kind, place))
        else:
            self.oversized.discard((kind, place))
        if len(self.oversized) != count:
            metrics.sources_too_large(len(self.oversized))

    # --- what is held of a source: its data only where some target accepts its copies --------------------

    def accepted(self, rule: Rule) -> bool:
        """Whether some target namespace accepts the rule's copies (a rule that needs no target consent:
        always). O(namespaces) for a push, or a rule under COPYRATOR_RULES_NEED_TARGET_CONSENT."""
        if not rule.push and not self.options.rules_need_target_consent:
            return True
        return any(is_target(rule, ns, self.options.by_name_only)
                   and target_refusal(rule, ns, self.options) is None for ns in self.all_namespaces())

    def entry(self, body: Mapping[str, Any], rules: list[Rule],
              accepted: Mapping[str, bool] | None = None) -> dict[str, Any]:
        """What is held of a selected object (``rules.source_entry``): its data only when one of the
        ``rules`` selecting it may copy it somewhere (a target accepts, the source consents); else a
        digest, read in full once a target accepts (``hydrate``). Never the data of one over the cap.
        ``accepted``: rule uid -> ``accepted(rule)``, when already known (a listing asks once per rule)."""
        namespace = str((body.get("metadata") or {}).get("namespace", ""))
        # (A listed body handed on without its data, ``DATA_ELIDED``, is held lean: read when needed.)
        keep = any((not needs_consent(rule, namespace, self.options) or consent(body) is not None)
                   and (accepted[rule.uid] if accepted is not None else self.accepted(rule)) for rule in rules)
        return source_entry(body, keep_data=keep, max_bytes=self.options.max_source_bytes)

    async def hydrate(self, kind: str, entry: Mapping[str, Any]) -> None:
        """A lean source a copy is now to be made of: read it (one GET, once: concurrent callers wait for
        the first) and hold it with its data. Gone or replaced meanwhile: its watch event says so."""
        meta = entry["metadata"]
        place = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        async with self.access.serialised(("copyrator-source", kind, *place)):
            held = self.get(kind, place)
            if held is None or not is_lean(held) or too_large(held) \
                    or held["metadata"].get("uid") != meta.get("uid"):
                return
            obj = await self.access.read(KINDS[kind], *place)
            if obj is None or (obj.get("metadata") or {}).get("uid") != meta.get("uid"):
                return
            self.put(kind, source_entry({**obj, "kind": kind}, max_bytes=self.options.max_source_bytes))
            logger.debug(f"Copyrator: read the source {kind} {place[0]}/{place[1]}: a target accepts its copies")

    async def hydrate_accepted(self, rule: Rule) -> None:
        """The rule's sources held without their data, read once some target accepts its copies."""
        lean = [e for e in self.selected(rule) if is_lean(e) and not too_large(e)]
        if lean and self.accepted(rule):
            await asyncio.gather(*(self.hydrate(rule.kind, entry) for entry in lean))

    async def push_gone(self, kind: str, view: CopyView) -> bool:
        """Whether the source that pushed ``view`` pushes no more: a source outside this process's view
        (another shard's namespace) is read once to confirm it (a suspect only; no read when idle)."""
        source_ns, _, source_name = view.source.partition("/")
        if self.get(kind, (source_ns, source_name)) is not None or self.namespace(source_ns) is None:
            return True  # in view and not pushing (or its namespace is gone)
        source = await self.access.read(KINDS[kind], source_ns, source_name)
        return (source is None or source["metadata"].get("uid") != view.rule_uid
                or not isinstance(push_rule(source), Rule))

    def selected(self, rule: Rule) -> Iterator[dict[str, Any]]:
        """The rule's selected objects in the sources index (skipped types included). A push selects
        its own source only: looked up, not searched for (every push's status asks for every other
        push's sources; 700 pushes searching 700 sources each kept a core busy)."""
        if rule.push:
            entry = self.get(rule.kind, (rule.namespace, rule.name))
            if entry is not None and selects(rule, rule.kind, entry):
                yield entry
            return
        for (ns, _name), entry in self.store[rule.kind].held():
            if ns in rule.source_namespaces and selects(rule, rule.kind, entry):
                yield entry

    def winner(self, rule: Rule, name: str) -> dict[str, Any] | None:
        candidates = {}
        for ns in rule.source_namespaces:
            entry = self.get(rule.kind, (ns, name))
            if entry is not None and selects(rule, rule.kind, entry):
                candidates[ns] = entry
        return winner(rule, candidates)  # type: ignore[return-value]

    def source_names(self, rule: Rule) -> set[str]:
        return {entry["metadata"]["name"] for entry in self.selected(rule)}

    def copy_names(self, rule: Rule) -> set[str]:
        """The names the rule's copies get (its sources' names, renamed)."""
        return {copy_name(rule, name) for name in self.source_names(rule)}

    def source_for(self, rule: Rule, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """The source this rule copies under ``name``, and why it copies none there although some
        source maps to it (several sources renamed to one target.name, or a copy it cannot make)."""
        if rule.target_name is None:
            prefix, suffix = rule.name_prefix, rule.name_suffix
            if not (name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix) + len(suffix)):
                return None, None
            source = self.winner(rule, name[len(prefix):len(name) - len(suffix)])
        elif name != rule.target_name:
            return None, None
        else:
            names = source_names_for(rule, name, self.source_names(rule))
            found = [(n, w) for n in names if (w := self.winner(rule, n)) is not None]
            if len(found) > 1:
                return None, (f"target.name {name}: {len(found)} sources match ({', '.join(n for n, _ in found)}); "
                              f"one name holds one source (narrow the selector or use namePrefix/nameSuffix)")
            source = found[0][1] if found else None
        if source is None:
            return None, None
        return source, copy_problem(rule, source)

    # --- what the watches and listings report ---------------------------------------------------------

    def listed(self, uid: str) -> asyncio.Event:
        return self._listed.setdefault(uid, asyncio.Event())

    async def list_sources(self, rule: Rule) -> None:
        """The one LIST per rule (create/update/resume): what existed before the rule had no event."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(rule.selector.items()))
        accepted = {rule.uid: self.accepted(rule)}
        for ns in rule.source_namespaces:
            listed = await self.access.list(KINDS[rule.kind], ns, labels=selector)
            seen = set()
            for obj in listed:
                if is_copy(obj):
                    continue
                seen.add((ns, obj["metadata"]["name"]))
                self.put(rule.kind, self.entry(obj, [rule], accepted))
                self.refuse_too_large(obj, [rule])
            for place in [p for p, entry in self.store[rule.kind].held() if p[0] == ns and p not in seen
                          and selects(rule, rule.kind, entry)]:
                self.drop(rule.kind, place)
        self.listed(rule.uid).set()

    async def older_rules_listed(self, rule: Rule) -> None:
        """Wait (at most OLDER_LISTINGS_SECONDS) until the sources of every older rule of the kind are
        listed. Two rules created together that want one free target name: the older gets it, and
        until the older's sources are listed the newer one cannot see that the older wants it."""
        older = [self.listed(other.uid) for _snapshot, other in self.active_rules(rule.kind)
                 if not other.push and other.claim < rule.claim]
        pending = [listed for listed in older if not listed.is_set()]
        if pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(listed.wait() for listed in pending)),
                                       OLDER_LISTINGS_SECONDS)

    def stale(self, kind: str, body: Mapping[str, Any]) -> bool:
        """A late event of a deleted predecessor with the same name (Kopf handles each uid on its own):
        it must not overwrite (or, deleted, remove) its successor's newer entry."""
        meta = body.get("metadata") or {}
        old = self.get(kind, (str(meta.get("namespace", "")), str(meta.get("name", ""))))
        return old is not None and old["metadata"].get("uid") != meta.get("uid") and \
            version_of(old["metadata"].get("resourceVersion")) > version_of(meta.get("resourceVersion"))

    def push_changed(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> tuple[
            Rule | None, Rule | None]:
        """Keep the push sources current: the source's push rule now (None: it pushes nowhere), and the
        one it stood for before when it pushes no more (to forget). A malformed push annotation is
        reported on the source (a Warning event, once per change)."""
        meta = body.get("metadata") or {}
        place = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event_type == "DELETED":  # nothing more to report on it
            self.push_reports.pop(str(meta.get("uid", "")), None)
        push = None if event_type == "DELETED" or meta.get("deletionTimestamp") else push_rule(body)
        if push is not None and not self.options.push:  # turned off: no push writes or deletes anything
            self.report_push(body, "PushDisabled", f"push annotations are turned off in this cluster "
                                                   f"(COPYRATOR_PUSH=false): {PUSH_TO_ANNOTATION} and "
                                                   f"{PUSH_TO_MATCHING_ANNOTATION} copy nothing")
            push = None
        if isinstance(push, RuleError):
            self.report_push(body, push.reason, str(push))
            push = None
        if push is None:
            return None, self.pushes[kind].pop(place, None)
        self.pushes[kind][place] = push
        return push, None

    def refuse_too_large(self, body: Mapping[str, Any], rules: list[Rule]) -> None:
        """A source over the size cap that a rule selects: a Warning on it (a push's comes with its
        other problems, ``decide_push``)."""
        if any(not rule.push for rule in rules):
            refused = too_large(self.get(str(body.get("kind") or rules[0].kind), (
                str((body.get("metadata") or {}).get("namespace", "")),
                str((body.get("metadata") or {}).get("name", "")))) or {})
            if refused:
                self.report_push(body, "SourceTooLarge", refused)

    def report_push(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        """A push source's problems, as a Warning event on the source when they change (a push has no
        status of its own)."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if self.push_reports.get(uid, "") == message:
            return
        self.push_reports[uid] = message
        if not message:
            return
        logger.warning(f"Copyrator push {meta.get('namespace')}/{meta.get('name')}: {reason}: {message}")
        involved = {"apiVersion": "v1", "kind": body.get("kind"),
                    "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")}}
        self.access.event(involved, "Warning", reason, message)
