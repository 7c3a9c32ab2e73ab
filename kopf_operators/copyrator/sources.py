"""Copyrator: source tracking (rules, namespaces and the objects copies are made of, as the watches see them).

- rules: Kopf's ``copyrator-rules`` index, parsed once per version;
- namespaces: Kopf's ``copyrator-namespaces`` index;
- sources: selector-matching objects (per kind, a ``core.controller.Newest`` of their entries: the
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

from kopf_operators.copyrator import decisions as logic
from kopf_operators.core import access as k8s
from kopf_operators.core.access import Access
from kopf_operators.core.controller import Index, KeyedState, Newest, PerKey, first, version_of

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

    def __init__(self, access: Access, options: logic.Options, rules: Index[RuleKey, dict[str, Any]],
                 namespaces: Index[str, logic.NamespaceInfo], state: KeyedState[str]) -> None:
        self.access, self.options = access, options
        self.rules = rules            # Kopf's live index: (namespace, name) -> rule snapshot
        self.namespaces = namespaces  # Kopf's live index: name -> NamespaceInfo
        # kind -> (namespace, name) -> the source entry (the content copies are made of), newest first
        self.store: dict[str, Newest[Place, dict[str, Any]]] = {kind: _source_versions() for kind in KINDS}
        # Push sources (a push annotation, no rule): kind -> (namespace, name) -> their implicit rule.
        self.pushes: dict[str, dict[Place, logic.Rule]] = {"ConfigMap": {}, "Secret": {}}
        self.push_reports: dict[str, str] = {}  # source uid -> the problems last reported on it
        self.deleting: set[str] = set()  # rule uids being deleted: they write nothing any more (never forgotten)
        self._parsed: PerKey[str, tuple[Any, logic.Rule | logic.RuleError]] = state.map()
        # rule uid -> set once this process has listed the rule's sources (``list_sources``)
        self._listed: PerKey[str, asyncio.Event] = state.map()

    # --- rules and namespaces --------------------------------------------------------------------

    def rule(self, snapshot: Mapping[str, Any]) -> logic.Rule | logic.RuleError:
        meta = snapshot["metadata"]
        stamp = (meta.get("uid"), meta.get("generation"), meta.get("resourceVersion"))
        cached = self._parsed.get(str(meta.get("uid")))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            parsed: logic.Rule | logic.RuleError = logic.parse_rule(snapshot)
        except logic.RuleError as exc:
            parsed = exc
        self._parsed[str(meta.get("uid"))] = (stamp, parsed)
        return parsed

    def active_rules(self, kind: str | None = None) -> list[tuple[dict[str, Any], logic.Rule]]:
        """Valid rules not being deleted (of one kind when given), push sources' rules included (their
        "snapshot" is the source entry)."""
        result = [(self.get(k, (r.namespace, r.name)) or {}, r)
                  for k in (KINDS if kind is None else (kind,)) for r in self.pushes[k].values()]
        for key in list(self.rules):
            snapshot = first(self.rules, key)
            if snapshot is None or snapshot["metadata"].get("deletionTimestamp"):
                continue
            rule = self.rule(snapshot)
            if isinstance(rule, logic.Rule) and rule.uid not in self.deleting and (kind is None or rule.kind == kind):
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

    def namespace(self, name: str) -> logic.NamespaceInfo | None:
        return first(self.namespaces, name)

    def all_namespaces(self) -> list[logic.NamespaceInfo]:
        return [info for name in list(self.namespaces) if (info := first(self.namespaces, name)) is not None]

    def targets(self, rule: logic.Rule) -> set[str]:
        return {ns.name for ns in self.all_namespaces() if logic.is_target(rule, ns)}

    # --- the sources index --------------------------------------------------------------------------

    def get(self, kind: str, place: Place) -> dict[str, Any] | None:
        return self.store[kind].seen(place)

    def put(self, kind: str, entry: dict[str, Any]) -> None:
        """A source entry seen (a newer one is kept over an older report)."""
        meta = entry["metadata"]
        self.store[kind].saw((str(meta.get("namespace", "")), str(meta.get("name", ""))), entry,
                             version_of(meta.get("resourceVersion")), meta.get("uid"))

    def drop(self, kind: str, place: Place) -> None:
        self.store[kind].forget(place)

    def clear(self, kind: str) -> None:
        for place, _entry in self.store[kind].held():
            self.store[kind].forget(place)

    def selected(self, rule: logic.Rule) -> Iterator[dict[str, Any]]:
        """The rule's selected objects in the sources index (skipped types included)."""
        for (ns, _name), entry in self.store[rule.kind].held():
            if ns in rule.source_namespaces and logic.selects(rule, rule.kind, entry):
                yield entry

    def winner(self, rule: logic.Rule, name: str) -> dict[str, Any] | None:
        candidates = {}
        for ns in rule.source_namespaces:
            entry = self.get(rule.kind, (ns, name))
            if entry is not None and logic.selects(rule, rule.kind, entry):
                candidates[ns] = entry
        return logic.winner(rule, candidates)  # type: ignore[return-value]

    def source_names(self, rule: logic.Rule) -> set[str]:
        return {entry["metadata"]["name"] for entry in self.selected(rule)}

    def copy_names(self, rule: logic.Rule) -> set[str]:
        """The names the rule's copies get (its sources' names, renamed)."""
        return {logic.copy_name(rule, name) for name in self.source_names(rule)}

    def source_for(self, rule: logic.Rule, name: str) -> tuple[dict[str, Any] | None, str | None]:
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
            names = logic.source_names_for(rule, name, self.source_names(rule))
            found = [(n, w) for n in names if (w := self.winner(rule, n)) is not None]
            if len(found) > 1:
                return None, (f"target.name {name}: {len(found)} sources match ({', '.join(n for n, _ in found)}); "
                              f"one name holds one source (narrow the selector or use namePrefix/nameSuffix)")
            source = found[0][1] if found else None
        if source is None:
            return None, None
        return source, logic.copy_problem(rule, source)

    # --- what the watches and listings report ---------------------------------------------------------

    def listed(self, uid: str) -> asyncio.Event:
        return self._listed.setdefault(uid, asyncio.Event())

    async def list_sources(self, rule: logic.Rule) -> None:
        """The one LIST per rule (create/update/resume): what existed before the rule had no event."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(rule.selector.items()))
        for ns in rule.source_namespaces:
            listed = await self.access.list(KINDS[rule.kind], ns, labels=selector)
            seen = set()
            for obj in listed:
                if logic.is_copy(obj):
                    continue
                seen.add((ns, obj["metadata"]["name"]))
                self.put(rule.kind, logic.source_entry(obj))
            for place in [p for p, entry in self.store[rule.kind].held() if p[0] == ns and p not in seen
                          and logic.selects(rule, rule.kind, entry)]:
                self.drop(rule.kind, place)
        self.listed(rule.uid).set()

    async def older_rules_listed(self, rule: logic.Rule) -> None:
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
            logic.Rule | None, logic.Rule | None]:
        """Keep the push sources current: the source's push rule now (None: it pushes nowhere), and the
        one it stood for before when it pushes no more (to forget). A malformed push annotation is
        reported on the source (a Warning event, once per change)."""
        meta = body.get("metadata") or {}
        place = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event_type == "DELETED":  # nothing more to report on it
            self.push_reports.pop(str(meta.get("uid", "")), None)
        push = None if event_type == "DELETED" or meta.get("deletionTimestamp") else logic.push_rule(body)
        if push is not None and not self.options.push:  # turned off: no push writes or deletes anything
            self.report_push(body, "PushDisabled", f"push annotations are turned off in this cluster "
                                                   f"(COPYRATOR_PUSH=false): {logic.PUSH_TO_ANNOTATION} and "
                                                   f"{logic.PUSH_TO_MATCHING_ANNOTATION} copy nothing")
            push = None
        if isinstance(push, logic.RuleError):
            self.report_push(body, push.reason, str(push))
            push = None
        if push is None:
            return None, self.pushes[kind].pop(place, None)
        self.pushes[kind][place] = push
        return push, None

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
