"""Copyrator: the controller (state from watches, decisions in ``copyrator.decisions``, API via ``core.access``).

What it decides on, and where that comes from (never a read per event):
- rules: Kopf's ``copyrator-rules`` index (fields, uid, generation, status);
- namespaces: Kopf's ``copyrator-namespaces`` index (name -> labels, active);
- copies: Kopf's ``copyrator-configmap-copies`` / ``copyrator-secret-copies`` indexes (objects
  carrying the rule-uid label, reduced to a ``CopyView``: uid, resourceVersion, content hashes);
- sources: the controller's own sources index (selector-matching objects, the content copies are
  built from), fed by the ConfigMap/Secret events and, for a rule created, updated or resumed, by
  one labelled LIST per source namespace (objects that existed before the rule have no event).

The unit of work is one copy, (kind, namespace, name) for one rule: ``sync_copy`` asks
``copyrator.decide`` and makes at most one write (create, JSON patch, delete; a Secret type change
or an immutable copy is delete + create). A namespace event syncs the copies of that namespace only;
a source event the copies of that source only; a copy edited or deleted by hand only itself. A
foreign object in the way is learned from the 409 on create (then that one object is read). The
answers to our own writes are kept until the watch catches up, so a burst never writes twice.

Status and the Normal ``Synced`` Event of a rule are written after a short delay, once per burst;
Warning Events (``Conflict``, ``Refused``, ``Invalid``) when what they report changes. The counts come
from each rule's ledger (``copyrator.Ledger``): events mark the places they touch, a flush judges only
those again, so a status costs O(places changed), not O(copies); it is rebuilt from the indexes when
the rule, its sources or another rule of its kind change, and at every resync.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from kopf_operators.copyrator import decisions as logic
from kopf_operators.core import access as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access, ApiError
from kopf_operators.core.controller import Background, Backoff, Index, KeyedTimers, MemoSlot, first, values
from kopf_operators.core.conventions import stall_event

OPERATOR = "copyrator"
RULES_INDEX = "copyrator-rules"
NAMESPACES_INDEX = "copyrator-namespaces"
COPIES_INDEXES = {"ConfigMap": "copyrator-configmap-copies", "Secret": "copyrator-secret-copies"}
RULE = k8s.Kind(logic.API_VERSION, logic.PLURAL, logic.KIND)
KINDS = {"ConfigMap": k8s.CONFIGMAP, "Secret": k8s.SECRET}
# A failed pass outside Kopf's retrying handlers: try the rule again after this long (doubling, capped).
RETRY_SECONDS = (2.0, 300.0)
# A new rule waits at most this long for the sources of older rules of its kind to be listed (their
# handlers run concurrently) before it claims a free target name; then it goes ahead.
OLDER_LISTINGS_SECONDS = 10.0

logger = logging.getLogger("kopf_operators.copyrator")
CopyKey = tuple[str, str, str]  # (kind, namespace, name)
RuleKey = tuple[str, str]  # (namespace, name) of a rule
# A copies index answers four lookups, so it holds each copy under four key shapes (one indexer per
# watched kind: Kopf calls every indexer on every event of its resource):
CopyAt = tuple[Literal["at"], str, str]               # ("at", namespace, name): the copy at a place
CopiesOf = tuple[Literal["rule"], str]                # ("rule", rule uid): all of a rule's copies
CopiesNamed = tuple[Literal["rule-name"], str, str]   # ("rule-name", rule uid, name)
CopiesIn = tuple[Literal["rule-ns"], str, str]        # ("rule-ns", rule uid, namespace)
CopyIndexKey = CopyAt | CopiesOf | CopiesNamed | CopiesIn
CopiesIndex = Index[CopyIndexKey, logic.CopyView]


@dataclasses.dataclass(frozen=True)
class Gone:
    """A copy we deleted, until the watch shows it gone (or replaced by another uid)."""

    uid: str


def copy_index_keys(view: logic.CopyView) -> dict[CopyIndexKey, logic.CopyView]:
    """The keys of one copy in its copies index: by place, by rule, by rule and name, by rule and
    namespace (each a lookup some trigger needs)."""
    return {("at", view.namespace, view.name): view, ("rule", view.rule_uid): view,
            ("rule-name", view.rule_uid, view.name): view, ("rule-ns", view.rule_uid, view.namespace): view}


def _rv(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


async def _said_once(work: Awaitable[Any], meta: Mapping[str, Any], kind: str, failed: str, retry: str) -> None:
    """``work`` outside Kopf's retrying handlers: an API failure is counted and logged once (``retry``
    says who tries again)."""
    try:
        await work
    except ApiError as exc:
        metrics.error(OPERATOR, kind)
        logger.warning(f"Copyrator {meta.get('namespace')}/{meta.get('name')}: {failed} ({exc}); {retry}")


class CopyratorController:
    def __init__(self, access: Access, options: logic.Options, rules: Index[RuleKey, dict[str, Any]],
                 namespaces: Index[str, logic.NamespaceInfo], copies: Mapping[str, CopiesIndex]) -> None:
        self.access = access
        self.options = options
        self.rules = rules            # Kopf's live index: (namespace, name) -> rule snapshot
        self.namespaces = namespaces  # Kopf's live index: name -> NamespaceInfo
        self.copies = copies          # kind -> Kopf's live index of copies (see copy_index_keys)
        # The sources index: kind -> (namespace, name) -> source entry (the content copies are made of).
        self.sources: dict[str, dict[tuple[str, str], dict[str, Any]]] = {"ConfigMap": {}, "Secret": {}}
        self._written: dict[CopyKey, logic.CopyView | Gone] = {}  # our writes, until the watch catches up
        self._foreign: dict[CopyKey, str] = {}  # objects in the way that are nobody's copy: uid (from a 409)
        self._failed: dict[str, set[CopyKey]] = collections.defaultdict(set)  # rule uid -> failing copies
        # rule uid -> copies the API server refuses (400/422: the source's content, e.g. annotations
        # over 256 KiB with copyAnnotations) -> why. Not retried with backoff: the source must change.
        self._rejected: dict[str, dict[CopyKey, str]] = collections.defaultdict(dict)
        self._done: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._triggers: dict[str, str] = {}
        self._status: dict[str, dict[str, Any]] = {}  # rule uid -> the status we wrote last
        self._deleting: set[str] = set()  # rule uids being deleted: they write nothing any more
        self._inflight: collections.Counter[str] = collections.Counter()  # rule uid -> syncs running
        self._parsed: dict[str, tuple[Any, logic.Rule | logic.RuleError]] = {}
        # rule uid -> set once this process has listed the rule's sources (``_list_sources``)
        self._sources_listed: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.background = Background(OPERATOR)
        self._flush: KeyedTimers[RuleKey] = self.background.timers()  # a rule's status, once per burst
        self._retry: KeyedTimers[RuleKey] = self.background.timers()
        self._backoff: Backoff[RuleKey] = Backoff(*RETRY_SECONDS)
        # Set by the first handled event: Kopf calls handlers only once every index is filled.
        self._indexed = asyncio.Event()
        self._limit = asyncio.Semaphore(options.write_concurrency)
        # Push sources (a push annotation, no rule): kind -> (namespace, name) -> their implicit rule.
        self.pushes: dict[str, dict[tuple[str, str], logic.Rule]] = {"ConfigMap": {}, "Secret": {}}
        self._push_reports: dict[str, str] = {}  # source uid -> the problems last reported on it
        # rule uid (a push: its source's uid) -> its places and their counts, kept as events touch them
        # (status in O(places changed), not O(copies)); rebuilt from the indexes at start and whenever
        # the rule, its sources or another rule of its kind changed, and at every resync.
        self._ledgers: dict[str, logic.Ledger] = {}
        self._ledger_keys: dict[str, RuleKey] = {}  # rule uid -> where its status is (none for a push)

    # --- state from the indexes ----------------------------------------------------------------

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
        result = [(self.sources[k].get((r.namespace, r.name)) or {}, r)
                  for k in (KINDS if kind is None else (kind,)) for r in self.pushes[k].values()]
        for key in list(self.rules):
            snapshot = first(self.rules, key)
            if snapshot is None or snapshot["metadata"].get("deletionTimestamp"):
                continue
            rule = self.rule(snapshot)
            if isinstance(rule, logic.Rule) and rule.uid not in self._deleting and (kind is None or rule.kind == kind):
                result.append((snapshot, rule))
        return result

    def namespace(self, name: str) -> logic.NamespaceInfo | None:
        return first(self.namespaces, name)

    def all_namespaces(self) -> list[logic.NamespaceInfo]:
        return [info for name in list(self.namespaces) if (info := first(self.namespaces, name)) is not None]

    def copy(self, kind: str, namespace: str, name: str) -> logic.CopyView | None:
        """The copy at a place: the index, or the answer to our own newer write."""
        indexed: logic.CopyView | None = first(self.copies[kind], ("at", namespace, name))
        key = (kind, namespace, name)
        written = self._written.get(key)
        if written is None:
            return indexed
        if isinstance(written, Gone):
            if indexed is not None and indexed.uid == written.uid:
                return None  # the watch has not seen our delete yet
            self._written.pop(key, None)
            return indexed
        if indexed is not None and indexed.uid == written.uid and indexed.rv >= written.rv:
            self._written.pop(key, None)  # the watch caught up
            return indexed
        return written

    def copies_of(self, rule_uid: str, kind: str, *, name: str | None = None,
                  namespace: str | None = None) -> list[logic.CopyView]:
        """A rule's copies (all, or of one name, or in one namespace), our pending writes included."""
        if name is not None:
            key: CopyIndexKey = ("rule-name", rule_uid, name)
        elif namespace is not None:
            key = ("rule-ns", rule_uid, namespace)
        else:
            key = ("rule", rule_uid)
        places = {(v.namespace, v.name) for v in values(self.copies[kind], key)}
        for (k, ns, nm), written in list(self._written.items()):
            if k == kind and isinstance(written, logic.CopyView) and written.rule_uid == rule_uid \
                    and name in (None, nm) and namespace in (None, ns):
                places.add((ns, nm))
        return [view for ns, nm in sorted(places)
                if (view := self.copy(kind, ns, nm)) is not None and view.rule_uid == rule_uid]

    def selected(self, rule: logic.Rule) -> Iterator[dict[str, Any]]:
        """The rule's selected objects in the sources index (skipped types included)."""
        for (ns, _name), entry in self.sources[rule.kind].items():
            if ns in rule.source_namespaces and logic.selects(rule, rule.kind, entry):
                yield entry

    def winner(self, rule: logic.Rule, name: str) -> dict[str, Any] | None:
        candidates = {}
        for ns in rule.source_namespaces:
            entry = self.sources[rule.kind].get((ns, name))
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

    # --- one copy ---------------------------------------------------------------------------------

    def desired(self, rule: logic.Rule, name: str,
                ns: logic.NamespaceInfo | None) -> tuple[dict[str, Any] | None, bool]:
        """What the rule wants at ``ns``/``name``, and whether it is blocked from writing there (a
        source it cannot copy as configured: whatever is there stays)."""
        if ns is None or not logic.is_target(rule, ns):
            return None, False
        source, problem = self.source_for(rule, name)
        if problem:
            return None, True
        if source is None or not logic.allowed_into(rule, source, ns.name, self.options):
            return None, False
        return logic.desired_copy(rule, source, ns.name), False

    def wants(self, rule: logic.Rule, kind: str, namespace: str, name: str) -> bool:
        """Whether ``rule`` would copy something to this place (as ``desired``, without building it)."""
        ns = self.namespace(namespace)
        if rule.kind != kind or ns is None or not logic.is_target(rule, ns):
            return False
        source, problem = self.source_for(rule, name)
        return source is not None and not problem and logic.allowed_into(rule, source, namespace, self.options)

    def claimed(self, rule: logic.Rule, kind: str, namespace: str, name: str) -> logic.Rule | None:
        """Another rule that gets this free target name before ``rule`` (the older one), if any."""
        others = [r for _s, r in self.active_rules(kind) if r.uid != rule.uid and self.wants(r, kind, namespace, name)]
        first = logic.first_claim([rule, *others])
        return first if first is not None and first.uid != rule.uid else None

    def superseded_pending(self, rule: logic.Rule, view: logic.CopyView) -> bool:
        """An unwanted copy of ``rule`` whose source the rule now copies under another name into the
        same namespace, and that new copy is not in sync yet: the old one stays until it is."""
        source_ns, _, source_name = view.source.partition("/")
        source = self.winner(rule, source_name)
        ns = self.namespace(view.namespace)
        if source is None or source["metadata"].get("namespace") != source_ns or ns is None:
            return False
        new_name = logic.copy_name(rule, source_name)
        if new_name == view.name:
            return False
        desired, _blocked = self.desired(rule, new_name, ns)
        if desired is None:
            return False
        replacement = self.copy(rule.kind, view.namespace, new_name)
        return not (replacement is not None and replacement.rule_uid == rule.uid
                    and logic.in_sync(replacement, desired))

    async def sync_copy(self, rule: logic.Rule, namespace: str, name: str, kind: str | None = None) -> int:
        """Make one place hold what ``rule`` wants there; returns the number of writes made."""
        kind = kind or rule.kind
        key: CopyKey = (kind, namespace, name)
        async with self._limit, self.access.serialised(("copyrator", *key)):
            if rule.uid in self._deleting:
                return 0
            self._inflight[rule.uid] += 1
            try:
                return await self._sync_locked(rule, key)
            finally:
                self._inflight[rule.uid] -= 1
                if not self._inflight[rule.uid]:
                    del self._inflight[rule.uid]

    async def _sync_locked(self, rule: logic.Rule, key: CopyKey) -> int:
        """(The place's lock is held.)"""
        kind, namespace, name = key
        ns = self.namespace(namespace)
        if ns is None or not ns.active:
            self._settled(rule.uid, lambda failed: failed == key)
            return 0  # gone or terminating: its copies go with it
        desired, blocked = self.desired(rule, name, ns) if kind == rule.kind else (None, False)
        if blocked:
            return 0  # reported in status; what is there stays
        try:
            writes = await self._apply(rule, key, desired)
        except ApiError as exc:
            if exc.namespace_terminating:
                return 0
            if exc.status in (400, 422):
                self._reject(rule, key, exc)
                return 0
            self._failed[rule.uid].add(key)
            metrics.error(OPERATOR, "write")
            raise
        self._failed[rule.uid].discard(key)
        self._rejected[rule.uid].pop(key, None)
        return writes

    def _settled(self, rule_uid: str, done: Callable[[CopyKey], bool]) -> None:
        """Failed and refused copies of the rule that are ``done`` with (their place is gone, or no
        place of the rule any more) stop counting."""
        failed, rejected = self._failed.get(rule_uid) or set(), self._rejected.get(rule_uid) or {}
        for key in [k for k in failed if done(k)]:
            failed.discard(key)
        for key in [k for k in rejected if done(k)]:
            rejected.pop(key, None)

    def _reject(self, rule: logic.Rule, key: CopyKey, exc: ApiError) -> None:
        """A copy the API server refuses: reported (status, one log line and Event when it starts),
        not retried with backoff. The message is the server's field-level reason (never values)."""
        kind, namespace, name = key
        # The server's reason names fields, not values; still, for a Secret only the status is kept.
        detail = f" ({exc.message})" if exc.message and kind == "ConfigMap" else ""
        why = f"{kind} {namespace}/{name}: {exc}{detail}"
        if self._rejected[rule.uid].get(key) == why:
            return
        self._rejected[rule.uid][key] = why
        self._failed[rule.uid].discard(key)
        metrics.error(OPERATOR, "copy-refused")
        logger.warning(f"Copyrator {rule.key}: the API server refuses the copy {why}")
        snapshot = None if rule.push else first(self.rules, (rule.namespace, rule.name))  # a push: on its source
        if snapshot is not None:
            self.access.event(snapshot, "Warning", "CopyRefused", f"the API server refuses the copy {why}")

    async def _apply(self, rule: logic.Rule, key: CopyKey, desired: dict[str, Any] | None) -> int:
        kind, namespace, name = key
        api_kind = KINDS[kind]
        view = self.copy(kind, namespace, name)
        claimed = view is None and desired is not None and self.claimed(rule, kind, namespace, name) is not None
        keep = desired is None and view is not None and view.rule_uid == rule.uid and kind == rule.kind \
            and self.superseded_pending(rule, view)
        action = logic.decide(rule.uid, desired, view, foreign=key in self._foreign, claimed=claimed, keep=keep)
        where = f"Copyrator {rule.key}:"
        if action is logic.Action.NONE or action is logic.Action.CONFLICT:
            return 0
        if action is logic.Action.DELETE and view is not None:
            await self.access.delete(api_kind, namespace, name, uid=view.uid)
            self._remember(key, Gone(view.uid))
            self._count(rule, "deleted")
            logger.info(f"{where} pruned {kind} {namespace}/{name}")
            return 1
        assert desired is not None
        source = desired["metadata"]["annotations"][logic.SOURCE_ANNOTATION]
        recreate = action is logic.Action.RECREATE and view is not None
        if recreate or action is logic.Action.CREATE:
            if recreate and view is not None:
                await self.access.delete(api_kind, namespace, name, uid=view.uid)
                self._remember(key, Gone(view.uid))
            try:
                created = await self.access.create(api_kind, desired)
            except k8s.AlreadyExists:
                return 1 + await self._in_the_way(rule, key, desired)
            self._remember(key, logic.copy_view(created, kind), created)
            if recreate:
                self._count(rule, "updated")
                logger.info(f"{where} updated {kind} {namespace}/{name} (re-created: type or immutability)")
                return 2
            self._count(rule, "created")
            logger.info(f"{where} copied {kind} {source} into {namespace}")
            return 1
        assert view is not None  # PATCH
        try:
            answer = await self.access.patch(api_kind, namespace, name, logic.patch_ops(view, desired),
                                             json_patch=True)
        except k8s.Conflict:
            # Changed since the index saw it (edited meanwhile): read that one object, try once more.
            fresh = await self.access.read(api_kind, namespace, name)
            if fresh is None:
                self._remember(key, Gone(view.uid))
                return 1 + await self._apply(rule, key, desired)
            fresh_view = logic.copy_view(fresh, kind)
            self._remember(key, fresh_view)
            if logic.decide(rule.uid, desired, fresh_view) is not logic.Action.PATCH:
                return 1 + await self._apply(rule, key, desired)
            answer = await self.access.patch(api_kind, namespace, name, logic.patch_ops(fresh_view, desired),
                                              json_patch=True)
        if answer is None:  # deleted meanwhile: create it
            self._remember(key, Gone(view.uid))
            return 1 + await self._apply(rule, key, desired)
        self._remember(key, logic.copy_view(answer, kind), answer)
        self._count(rule, "updated")
        logger.info(f"{where} updated {kind} {namespace}/{name}" + (" (edited by hand)" if view.drifted else ""))
        return 1

    async def _in_the_way(self, rule: logic.Rule, key: CopyKey, desired: dict[str, Any]) -> int:
        """A 409 on create: read that one object. Ours (the watch is behind): carry on from it;
        anybody else's: a conflict, left untouched."""
        kind, namespace, name = key
        existing = await self.access.read(KINDS[kind], namespace, name)
        if existing is None:  # gone again meanwhile: the next event or sweep creates the copy
            return 1
        if logic.is_copy(existing):
            view = logic.copy_view(existing, kind)
            self._remember(key, view)
            if view.rule_uid == rule.uid:
                return 1 + await self._apply(rule, key, desired)
            return 1
        self._foreign[key] = str(existing["metadata"].get("uid", ""))
        self._touched(*key)
        return 1

    def _remember(self, key: CopyKey, written: logic.CopyView | Gone,
                  answer: Mapping[str, Any] | None = None) -> None:
        """Our write's answer, until the watch catches up (``copy``). Its echo (``answer``) is indexed
        once the writes in flight are done (``Access.defer_echo``): in a burst, writes come first."""
        self._written[key] = written
        self._touched(*key)
        if answer is not None:
            self.access.defer_echo(answer)

    def _count(self, rule: logic.Rule, what: str) -> None:
        metrics.action(OPERATOR, what)
        self._done[rule.uid][what] += 1

    async def _bounded(self, jobs: Iterable[Awaitable[int]]) -> tuple[int, list[ApiError]]:
        """Independent copies at once (``sync_copy`` bounds how many write at a time)."""
        results = await asyncio.gather(*jobs, return_exceptions=True)
        errors = [r for r in results if isinstance(r, ApiError)]
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, ApiError):
                raise r
        return sum(r for r in results if isinstance(r, int)), errors

    # --- triggers -----------------------------------------------------------------------------------

    async def rule_changed(self, body: Mapping[str, Any], trigger: str) -> None:
        """A rule created, updated or resumed: list its sources once, then converge all its copies.
        A copy the API server refuses (a quota, a policy) or fails is in the rule's status and is
        retried here with backoff, as outside Kopf's handlers: handed to Kopf, a refusal (403, 422)
        failed the handler "permanently" with an ERROR line while the status said it would be retried.
        Raises ApiError when listing the sources or writing the status fails (Kopf retries the handler)."""
        snapshot = logic.rule_snapshot(body)
        rule = await self._valid_rule(snapshot)
        if rule is None:
            return
        await self._list_sources(rule)
        await self._older_rules_listed(rule)
        errors = await self._sweep(rule, trigger)
        await self.flush_status(snapshot)
        if errors:
            self._retry_later(rule)
        else:
            self._backoff.reset((rule.namespace, rule.name))

    async def _older_rules_listed(self, rule: logic.Rule) -> None:
        """Wait (at most OLDER_LISTINGS_SECONDS) until the sources of every older rule of the kind are
        listed. Two rules created together that want one free target name: the older gets it, and
        until the older's sources are listed the newer one cannot see that the older wants it."""
        older = [self._sources_listed[other.uid] for _snapshot, other in self.active_rules(rule.kind)
                 if not other.push and other.claim < rule.claim]
        pending = [listed for listed in older if not listed.is_set()]
        if pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(listed.wait() for listed in pending)),
                                       OLDER_LISTINGS_SECONDS)

    async def _list_sources(self, rule: logic.Rule) -> None:
        """The one LIST per rule (create/update/resume): what existed before the rule had no event."""
        store = self.sources[rule.kind]
        selector = ",".join(f"{k}={v}" for k, v in sorted(rule.selector.items()))
        for ns in rule.source_namespaces:
            listed = await self.access.list(KINDS[rule.kind], ns, labels=selector)
            seen = set()
            for obj in listed:
                if logic.is_copy(obj):
                    continue
                key = (ns, obj["metadata"]["name"])
                seen.add(key)
                old = store.get(key)
                newer = _rv(obj["metadata"].get("resourceVersion"))
                if old is None or _rv(old["metadata"].get("resourceVersion")) <= newer:
                    store[key] = logic.source_entry(obj)
            for key in [k for k, entry in store.items() if k[0] == ns and k not in seen
                        and logic.selects(rule, rule.kind, entry)]:
                store.pop(key, None)
        self._sources_listed[rule.uid].set()

    async def _sweep(self, rule: logic.Rule, trigger: str) -> list[ApiError]:
        """Every copy of one rule, from the indexes: writes only what differs."""
        namespaces = self.all_namespaces()
        targets = [ns.name for ns in namespaces if logic.is_target(rule, ns)]
        wanted = self.copy_names(rule)
        names = wanted | {v.name for v in self.copies_of(rule.uid, rule.kind)}
        visited: set[CopyKey] = set()
        # Places the ledger sees holding the rule's copy in sync: ``sync_copy`` would write nothing there
        # (an idle sweep of many copies then costs a count, not a pass per copy).
        copied = self._copied(rule)

        def jobs_for(selected: Iterable[str]) -> list[Awaitable[int]]:
            jobs: list[Awaitable[int]] = []
            for name in sorted(selected):
                places = set(targets) | {v.namespace for v in self.copies_of(rule.uid, rule.kind, name=name)}
                visited.update((rule.kind, ns, name) for ns in places)
                jobs.extend(self.sync_copy(rule, ns, name) for ns in sorted(places) if (ns, name) not in copied)
            return jobs

        started = time.perf_counter()
        # First the names the rule wants, then the copies under names it no longer uses (a renamed
        # target): each of those goes only once its replacement is in sync.
        writes, errors = await self._bounded(jobs_for(wanted))
        later: list[Awaitable[int]] = jobs_for(names - wanted)
        for kind in KINDS:  # the rule's type changed: its copies of the other kind go
            if kind != rule.kind:
                for view in self.copies_of(rule.uid, kind):
                    visited.add((kind, view.namespace, view.name))
                    later.append(self.sync_copy(rule, view.namespace, view.name, kind=kind))
        more, more_errors = await self._bounded(later)
        # No longer places of the rule, or in sync: nothing fails there.
        self._settled(rule.uid, lambda key: key not in visited or (key[0] == rule.kind and key[1:] in copied))
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

    async def rule_deleted(self, body: Mapping[str, Any]) -> int:
        """Prune every copy of a rule deleted or being deleted (from the copies index). Raises ApiError.
        Idempotent: copies already pruned are not in the index any more (or are remembered as Gone)."""
        meta = body["metadata"]
        uid = str(meta.get("uid"))
        self._deleting.add(uid)
        # A sync that started before the deletion may still create a copy: let it finish first.
        for _ in range(600):
            if not self._inflight.get(uid):
                break
            await asyncio.sleep(0.05)
        key = (str(meta.get("namespace")), str(meta.get("name")))
        for timers in (self._flush, self._retry):
            timers.cancel(key)
        count = await self._prune(uid, f"{key[0]}/{key[1]}", "rule deleted")
        for store in (self._failed, self._rejected, self._done, self._status, self._parsed, self._triggers,
                      self._sources_listed):
            store.pop(uid, None)
        self._forget(uid)
        return count

    async def _prune(self, uid: str, rule_key: str, why: str) -> int:
        """Delete the copies carrying this rule uid (each with its uid as a precondition)."""
        count = 0
        for kind, api_kind in KINDS.items():
            for view in self.copies_of(uid, kind):
                async with self.access.serialised(("copyrator", kind, view.namespace, view.name)):
                    await self.access.delete(api_kind, view.namespace, view.name, uid=view.uid)
                    self._remember((kind, view.namespace, view.name), Gone(view.uid))
                count += 1
                logger.info(f"Copyrator {rule_key}: pruned {kind} {view.namespace}/{view.name} ({why})")
        if count:
            metrics.action(OPERATOR, "deleted", count)
        return count

    async def rule_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Any rule event. Rules carry no finalizer (deleting one never waits for this operator): a
        rule deleted, or held in deletion by someone else's finalizer, has its copies pruned here; if
        that fails, or the operator was down, the orphan sweep prunes them."""
        self._indexed.set()
        meta = body.get("metadata") or {}
        if event_type != "DELETED" and not meta.get("deletionTimestamp"):
            return
        await _said_once(self.rule_deleted(body), meta, "prune", "pruning the copies of the deleted rule failed",
                         "the periodic sweep retries")

    async def prune_orphans(self) -> int:
        """Copies whose rule is gone (deleted while the operator was down, or a prune that failed).
        Suspects come from the indexes (no request when there are none); each suspect rule is confirmed
        gone by one listing of its name in its namespace before its copies are deleted. A copy that does
        not say where its rule is, or a listing that fails, is left alone. Nothing while Kopf has paused
        this process (a standby: ``Access.paused``)."""
        if self.access.paused:
            return 0
        live = set()
        for key in list(self.rules):
            snapshot = first(self.rules, key)
            if snapshot is not None and not snapshot["metadata"].get("deletionTimestamp"):
                live.add(str(snapshot["metadata"].get("uid")))
        by_rule: dict[str, list[logic.CopyView]] = collections.defaultdict(list)
        for kind in KINDS:
            for copy_key in list(self.copies[kind]):
                if copy_key[0] == "rule" and copy_key[1] not in live:  # pushed copies: _resync_pushes prunes them
                    by_rule[copy_key[1]].extend(v for v in values(self.copies[kind], copy_key) if not v.pushed)
        by_rule = {uid: views for uid, views in by_rule.items() if views}
        count = 0
        for uid, rule_key in logic.orphan_suspects(by_rule, live).items():
            place = logic.split_rule_key(rule_key)
            try:
                if uid not in self._deleting:  # a deletion seen here needs no confirmation
                    if place is None:
                        logger.debug(f"Copyrator: copies of rule uid {uid} do not name their rule; left alone")
                        continue
                    listed = await self.access.list(RULE, place[0], fields=f"metadata.name={place[1]}")
                    if not logic.rule_gone(uid, listed):
                        continue  # alive outside this process's view (another shard, an unwatched namespace)
                    self._deleting.add(uid)
                count += await self._prune(uid, rule_key or uid, "rule gone")
            except ApiError as exc:
                metrics.error(OPERATOR, "prune")
                logger.warning(f"Copyrator {rule_key or uid}: pruning the copies of a gone rule failed ({exc}); "
                               f"the next sweep retries")
        return count

    async def namespace_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A namespace added or relabelled: only that namespace's copies, for each rule. (Any event,
        deleted or terminating too, makes the rules' ledgers judge its places again.)"""
        info = logic.namespace_info(body)
        self._namespace_touched(info.name)
        if event_type == "DELETED" or not info.active:  # nothing fails in it any more
            for uid in set(self._failed) | set(self._rejected):
                self._settled(uid, lambda key: key[1] == info.name)
        if event_type not in ("ADDED", "MODIFIED") or not info.active:
            return  # its copies go with it (and the initial listing: the rules' resume converges)
        trigger = f"namespace {event_type.lower()}"
        await self._run(trigger, [
            (snapshot, rule, [self.sync_copy(rule, info.name, name) for name in sorted(
                self.copy_names(rule) | {v.name for v in self.copies_of(rule.uid, rule.kind, namespace=info.name)})])
            for snapshot, rule in self.active_rules() if info.name not in rule.source_namespaces]
            + [(snapshot, rule, []) for snapshot, rule in self.active_rules() if info.name in rule.source_namespaces])

    async def object_event(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A ConfigMap/Secret event: a copy (deleted or edited by hand), a source, or an object that
        was in a copy's way."""
        self._indexed.set()
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        key: CopyKey = (kind, namespace, name)
        self._touched(kind, namespace, name, event=True)
        if logic.is_copy(body):
            await self._copy_event(kind, event_type, body)
            return
        if event_type == "DELETED" and self._foreign.get(key) == meta.get("uid"):
            del self._foreign[key]  # the object in the way is gone: the copies may go there now
            await self._place_freed(kind, namespace, name, "conflict cleared")
        store = self.sources[kind]
        old = store.get((namespace, name))
        if old is not None and old["metadata"].get("uid") != meta.get("uid") and \
                _rv(old["metadata"].get("resourceVersion")) > _rv(meta.get("resourceVersion")):
            # Kopf handles each uid on its own: a late event of a deleted predecessor with the same
            # name must not overwrite (or, deleted, remove) its successor's newer entry.
            return
        rules = self.active_rules(kind)
        now = [(s, r) for s, r in rules
               if event_type != "DELETED" and not r.push and logic.selects(r, kind, body)]
        push = self._push_changed(kind, event_type, body)
        entry = logic.source_entry(body)
        if push is not None:
            now.append((entry, push))
        if now:
            store[(namespace, name)] = entry
        elif old is not None:
            store.pop((namespace, name), None)
        if event_type is None and push is None:
            return  # the initial listing: the rules' resume converges
        # Each rule once: the rules selecting it now, and those that selected it before (to prune).
        affected = {r.uid: (s, r) for s, r in rules if old is not None and logic.selects(r, kind, old)}
        affected.update({r.uid: (s, r) for s, r in now})
        if not affected:
            return
        trigger = f"source {(event_type or 'listed').lower()}"
        await self._run(trigger, [(s, r, self._source_jobs(r, name)) for s, r in affected.values()])

    def _push_changed(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> logic.Rule | None:
        """Keep the push sources current; the source's push rule now (None: it pushes nowhere). A
        malformed push annotation is reported on the source (a Warning event, once per change)."""
        meta = body.get("metadata") or {}
        place = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        push = None if event_type == "DELETED" or meta.get("deletionTimestamp") else logic.push_rule(body)
        if isinstance(push, logic.RuleError):
            self._report_push(body, push.reason, str(push))
            push = None
        if push is None:
            if (gone := self.pushes[kind].pop(place, None)) is not None:
                self._forget(gone.uid)
        else:
            self.pushes[kind][place] = push
        return push

    def _report_push(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        """A push source's problems, as a Warning event on the source when they change (a push has no
        status of its own)."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if self._push_reports.get(uid, "") == message:
            return
        self._push_reports[uid] = message
        if not message:
            return
        logger.warning(f"Copyrator push {meta.get('namespace')}/{meta.get('name')}: {reason}: {message}")
        involved = {"apiVersion": "v1", "kind": body.get("kind"),
                    "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")}}
        self.access.event(involved, "Warning", reason, message)

    def _check_push(self, entry: Mapping[str, Any], rule: logic.Rule) -> None:
        tally = self.tally(rule)
        status = logic.build_status(rule, {}, tally)
        _ready, stalled, reason, message = logic.readiness(tally, status)
        if tally.skipped and not stalled:  # a token or a Helm release: never copied, and the owner is told
            source = self.sources[rule.kind].get((rule.namespace, rule.name)) or {}
            reason, message, stalled = "Skipped", str(logic.skip_reason(rule, source)), True
        self._report_push(entry, reason, message if stalled else "")

    def _source_jobs(self, rule: logic.Rule, source_name: str) -> list[Awaitable[int]]:
        name = logic.copy_name(rule, source_name)
        places = {ns.name for ns in self.all_namespaces() if logic.is_target(rule, ns)}
        places |= {v.namespace for v in self.copies_of(rule.uid, rule.kind, name=name)}
        return [self.sync_copy(rule, ns, name) for ns in sorted(places)]

    async def _copy_event(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        view = logic.copy_view(body, kind)
        key: CopyKey = (kind, view.namespace, view.name)
        self._foreign.pop(key, None)
        written = self._written.get(key)
        if event_type == "DELETED":
            if written is not None and written.uid == view.uid:
                del self._written[key]
            await self._place_freed(kind, view.namespace, view.name, "copy deleted")
            return
        self.copy(kind, view.namespace, view.name)  # drops our pending write once the watch caught up
        if event_type is None or not view.drifted:
            return  # our own write echoing back (or the initial listing: the resume handles it)
        for snapshot, rule in self.active_rules(kind):
            if rule.uid == view.rule_uid:
                await self._run("copy edited", [(snapshot, rule, [self.sync_copy(rule, view.namespace, view.name)])])

    async def _place_freed(self, kind: str, namespace: str, name: str, trigger: str) -> None:
        """An object left a place: every rule that wants a copy there gets it (or keeps it absent)."""
        wanted = [(s, r) for s, r in self.active_rules(kind) if self.source_for(r, name)[0] is not None]
        await self._run(trigger, [(s, r, [self.sync_copy(r, namespace, name)]) for s, r in wanted])
        for snapshot, rule in wanted:
            # A renamed copy may have waited for this place: it goes now that its replacement is made
            # (from the indexes: deletes only, no reads).
            stale = [v for v in self.copies_of(rule.uid, kind, namespace=namespace)
                     if v.name not in self.copy_names(rule)]
            if stale:
                await self._run(trigger, [(snapshot, rule, [self.sync_copy(rule, namespace, v.name) for v in stale])])

    async def _run(self, trigger: str, work: list[tuple[dict[str, Any], logic.Rule, list[Awaitable[int]]]]) -> None:
        """Event-driven passes: failures are logged once and the rule is retried with backoff."""
        if not work:
            return
        started = time.perf_counter()
        results = await asyncio.gather(*(self._bounded(jobs) for _s, _r, jobs in work))
        if any(writes for writes, _errors in results):
            metrics.REACTION.labels(operator=OPERATOR, trigger=trigger.split()[0]).observe(
                time.perf_counter() - started)
        for (snapshot, rule, _jobs), (writes, errors) in zip(work, results, strict=True):
            if rule.push:  # no status object: problems go to the source; the resync retries failures
                self._check_push(snapshot, rule)
                if errors:
                    logger.warning(f"Copyrator {rule.key}: {trigger}: {len(errors)} copy operation(s) failed "
                                   f"({errors[0]}); the next resync retries")
                continue
            if writes:
                self._triggers[rule.uid] = trigger
            self.schedule_status(snapshot)  # once per burst; written only when it changed
            if errors:
                logger.warning(f"Copyrator {rule.key}: {trigger}: {len(errors)} copy operation(s) failed "
                               f"({errors[0]}); retrying with backoff")
                self._retry_later(rule)

    # --- retries and the periodic sweep ---------------------------------------------------------------

    def _retry_later(self, rule: logic.Rule) -> None:
        key = (rule.namespace, rule.name)
        if not self._retry.pending(key):
            self._retry.start(key, self._backoff.next_delay(key), lambda: self._guarded(key, "retry"))

    async def _guarded(self, key: tuple[str, str], trigger: str) -> None:
        """One rule's sweep outside Kopf's handlers (retries, resync): failures retry with backoff.
        Nothing while Kopf has paused this process (a standby)."""
        if self.access.paused:
            return
        snapshot = first(self.rules, key)
        if snapshot is None or snapshot["metadata"].get("deletionTimestamp"):
            return
        rule = self.rule(snapshot)
        if isinstance(rule, logic.RuleError) or rule.uid in self._deleting:
            return
        try:
            errors = await self._sweep(rule, trigger)
            await self.flush_status(snapshot)
        except ApiError as exc:
            errors = [exc]
            logger.warning(f"Copyrator {rule.key}: {trigger}: {exc}; retrying with backoff")
        if errors:
            self._retry_later(rule)
        else:
            self._backoff.reset(key)

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
        # Every resync counts each rule's places from scratch (level-triggered, like its writes).
        self._ledgers.clear()
        self._ledger_keys.clear()
        for key in list(self.rules):
            await self._guarded(key, "resync")
        await self._resync_pushes()
        await self.prune_orphans()

    async def _resync_pushes(self) -> None:
        """Push sources' copies, like a rule's; and copies made by a push whose source is gone or
        pushes no more (deleted while the operator was down): they are ours (marker and push mark).
        Nothing while Kopf has paused this process (a standby writes nothing)."""
        if getattr(self.access, "paused", False):
            return
        live = set()
        for kind in KINDS:
            for place, rule in list(self.pushes[kind].items()):
                live.add(rule.uid)
                try:
                    errors = await self._sweep(rule, "resync")
                except ApiError as exc:
                    errors = [exc]
                if errors:
                    logger.warning(f"Copyrator {rule.key}: resync: {errors[0]}; the next resync retries")
                self._check_push(self.sources[kind].get(place) or {}, rule)
        for kind, api_kind in KINDS.items():
            for key in list(self.copies[kind]):
                if key[0] != "rule" or key[1] in live:
                    continue
                for view in self.copies_of(key[1], kind):
                    if not view.pushed:
                        continue
                    try:
                        if not await self._push_gone(kind, view):
                            continue
                        async with self.access.serialised(("copyrator", kind, view.namespace, view.name)):
                            await self.access.delete(api_kind, view.namespace, view.name, uid=view.uid)
                            self._remember((kind, view.namespace, view.name), Gone(view.uid))
                    except ApiError as exc:
                        logger.warning(f"Copyrator: pruning the pushed copy {view.namespace}/{view.name} failed "
                                       f"({exc}); the next resync retries")
                        continue
                    metrics.action(OPERATOR, "deleted")
                    logger.info(f"Copyrator push {view.source}: pruned {kind} {view.namespace}/{view.name} "
                                f"(the source pushes no more)")

    async def _push_gone(self, kind: str, view: logic.CopyView) -> bool:
        """Whether the source that pushed ``view`` pushes no more: a source outside this process's view
        (another shard's namespace) is read once to confirm it (a suspect only; no read when idle)."""
        source_ns, _, source_name = view.source.partition("/")
        if (source_ns, source_name) in self.sources[kind] or self.namespace(source_ns) is None:
            return True  # in view and not pushing (or its namespace is gone)
        source = await self.access.read(KINDS[kind], source_ns, source_name)
        return (source is None or source["metadata"].get("uid") != view.rule_uid
                or not isinstance(logic.push_rule(source), logic.Rule))

    async def stop(self) -> None:
        await self.background.stop()

    # --- status and events ---------------------------------------------------------------------------

    def tally(self, rule: logic.Rule) -> logic.Tally:
        """The rule's copies as the indexes see them (from its ledger: see ``ledger``)."""
        judged = self._judged(rule)
        ledger = self.ledger(rule, judged)
        sources = {source_name: (source, blocked) for source_name, (source, _name, blocked) in judged.items()}
        tally = logic.ledger_tally(rule, ledger, sources, self.options)
        tally.failed = len(self._failed.get(rule.uid, ()))
        tally.rejected = list((self._rejected.get(rule.uid) or {}).values())
        for ns_name in rule.source_namespaces:
            if self.namespace(ns_name) is None and logic.needs_consent(rule, ns_name, self.options):
                tally.refusals.append(f"source namespace {ns_name} does not exist: nothing there consents "
                                      f"to this rule ({logic.ALLOWED_NAMESPACES_ANNOTATION})")
        tally.skipped = sum(1 for e in self.selected(rule) if logic.skip_reason(rule, e) is not None)
        return tally

    def _judged(self, rule: logic.Rule) -> dict[str, tuple[dict[str, Any], str, str | None]]:
        """The rule's sources: source name -> (the source it copies, the copy's name, why it cannot
        copy it as configured or None)."""
        judged = {}
        for source_name in self.source_names(rule):
            source = self.winner(rule, source_name)
            if source is not None:
                name = logic.copy_name(rule, source_name)
                judged[source_name] = (source, name, self.source_for(rule, name)[1])
        return judged

    def _basis(self, rule: logic.Rule) -> tuple[Any, ...]:
        """What every place of ``rule`` is judged from besides the place itself (its namespace, what is
        at it): the rule, its sources, and the other rules of its kind (they may claim its names)."""
        def sources(r: logic.Rule) -> tuple[tuple[str, ...], ...]:
            return tuple(sorted(tuple(str(e["metadata"].get(k, "")) for k in ("namespace", "name", "uid",
                                                                                 "resourceVersion"))
                                for e in self.selected(r)))
        others = sorted(((r.uid, r, sources(r)) for _s, r in self.active_rules(rule.kind) if r.uid != rule.uid),
                        key=lambda other: other[0])
        return rule, sources(rule), others

    def ledger(self, rule: logic.Rule,
               judged: Mapping[str, tuple[dict[str, Any], str, str | None]] | None = None) -> logic.Ledger:
        """The rule's ledger, brought up to date: re-built when its basis changed (O(copies), as often as
        a write to every copy is due anyway), else only the places events touched are judged again."""
        judged = self._judged(rule) if judged is None else judged
        basis = self._basis(rule)
        ledger = self._ledgers.get(rule.uid)
        wanted: dict[str, dict[str, Any] | None] = {}

        def judge(source_name: str, namespace: str) -> None:
            source, name, blocked = judged[source_name]
            if source_name not in wanted:
                wanted[source_name] = None if blocked else logic.desired_copy(rule, source, "")
            assert ledger is not None
            ledger.judge(source_name, namespace, self._standing(rule, source, namespace, name, wanted[source_name]))

        if ledger is None or ledger.basis != basis:
            ledger = self._ledgers[rule.uid] = logic.Ledger(kind=rule.kind, basis=basis)
            if not rule.push:
                self._ledger_keys[rule.uid] = (rule.namespace, rule.name)
            ledger.names = {name: source_name for source_name, (_s, name, _b) in judged.items()}
            ledger.targets = {ns.name for ns in self.all_namespaces() if logic.is_target(rule, ns)}
            for namespace in ledger.targets:
                for source_name in judged:
                    judge(source_name, namespace)
            return ledger
        dirty_namespaces, ledger.dirty_namespaces = ledger.dirty_namespaces, set()
        dirty_places, ledger.dirty_places = ledger.dirty_places, set()
        for namespace in dirty_namespaces:
            info = self.namespace(namespace)
            if info is not None and logic.is_target(rule, info):
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

    def _copied(self, rule: logic.Rule) -> set[tuple[str, str]]:
        """(namespace, copy name) of the places that hold the rule's copy in sync, as its ledger sees them."""
        ledger = self.ledger(rule)
        return {(namespace, name) for name, source_name in ledger.names.items()
                for namespace, (standing, _text) in (ledger.places.get(source_name) or {}).items()
                if standing is logic.Standing.COPIED}

    def _standing(self, rule: logic.Rule, source: Mapping[str, Any], namespace: str, name: str,
                  wanted: Mapping[str, Any] | None) -> logic.Judgement:
        allowed = logic.allowed_into(rule, source, namespace, self.options)
        view = self.copy(rule.kind, namespace, name)
        foreign = (rule.kind, namespace, name) in self._foreign
        # Who else wants a free name is asked only where it matters (O(rules)).
        claimant = self.claimed(rule, rule.kind, namespace, name) \
            if allowed and wanted is not None and view is None and not foreign else None
        return logic.standing(rule, namespace, name, allowed=allowed, view=view, wanted=wanted, foreign=foreign,
                              claimant=claimant)

    def _touched(self, kind: str, namespace: str, name: str, *, event: bool = False) -> None:
        """Something at a place changed (its object, our write, an object in the way): the ledgers
        judge it again. On an event, a rule whose place it is writes its status (once per burst)."""
        for uid, ledger in self._ledgers.items():
            if ledger.kind == kind and name in ledger.names:
                ledger.dirty_places.add((namespace, name))
                if event and (key := self._ledger_keys.get(uid)) is not None:
                    self._schedule(key)

    def _namespace_touched(self, namespace: str) -> None:
        """A namespace added, relabelled, terminating or deleted: the ledgers judge its places again; a
        rule it was a target of writes its status (once per burst)."""
        for uid, ledger in self._ledgers.items():
            ledger.dirty_namespaces.add(namespace)
            if namespace in ledger.targets and (key := self._ledger_keys.get(uid)) is not None:
                self._schedule(key)

    def _forget(self, uid: str) -> None:
        self._ledgers.pop(uid, None)
        self._ledger_keys.pop(uid, None)

    def schedule_status(self, snapshot: Mapping[str, Any]) -> None:
        """Write the rule's status (and its Synced event) once per burst of changes."""
        self._schedule((snapshot["metadata"]["namespace"], snapshot["metadata"]["name"]))

    def _schedule(self, key: RuleKey) -> None:
        self._flush.start(key, self.options.status_delay_seconds, lambda: self._flush_due(key))

    async def _flush_due(self, key: RuleKey) -> None:
        current = first(self.rules, key)
        if current is not None:
            await self._flush_guarded(current)

    async def _flush_guarded(self, snapshot: Mapping[str, Any]) -> None:
        if self.access.paused:
            return
        await _said_once(self.flush_status(snapshot), snapshot["metadata"], "status", "status not written",
                         "the next pass retries")

    def _previous(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        uid = snapshot["metadata"].get("uid")
        return dict(self._status.get(str(uid)) or snapshot.get("status") or {})

    async def _valid_rule(self, snapshot: Mapping[str, Any]) -> logic.Rule | None:
        """The rule, or None when it is being deleted or invalid (an invalid rule's problem is reported
        in its status)."""
        if snapshot["metadata"].get("deletionTimestamp"):
            return None
        rule = self.rule(snapshot)
        if isinstance(rule, logic.RuleError):
            await self._report_problem(snapshot, rule)
            return None
        return rule

    async def flush_status(self, snapshot: Mapping[str, Any]) -> None:
        rule = await self._valid_rule(snapshot)
        if rule is None or rule.uid in self._deleting:
            return
        previous = self._previous(snapshot)
        status = logic.build_status(rule, previous, self.tally(rule))
        done = self._done.pop(rule.uid, None)
        trigger = self._triggers.pop(rule.uid, "")
        if done:
            summary = ", ".join(f"{what} {count}" for what, count in sorted(done.items()))
            self.access.event(snapshot, "Normal", "Synced", f"{summary} ({trigger})" if trigger else summary)
        if status["conflicts"] and status["conflicts"] != (previous.get("conflicts") or []):
            message = (f"{status['conflicted']} object(s) in the way are not owned by this rule and were left "
                       f"untouched: {', '.join(status['conflicts'])}")
            logger.warning(f"Copyrator {rule.key}: {message}")
            self.access.event(snapshot, "Warning", "Conflict", message)
        if status["refused"] and status["refused"] != (previous.get("refused") or []):
            message = "; ".join(status["refused"])
            logger.warning(f"Copyrator {rule.key}: {message}")
            self.access.event(snapshot, "Warning", "Refused", message)
        await self._write_status(snapshot, previous, status)

    async def _write_status(self, snapshot: Mapping[str, Any], previous: Mapping[str, Any],
                            status: dict[str, Any]) -> None:
        if not logic.status_changed(previous, status):
            return
        meta = snapshot["metadata"]
        answer = await self.access.patch_status(RULE, meta["namespace"], meta["name"], status)
        if answer is not None:
            self._status[str(meta.get("uid"))] = {**previous, **status}
            stalled = stall_event(previous.get("conditions"), status.get("conditions"))
            if stalled:  # one uniform Event per Stalled transition, for every kind (docs/observability.md)
                self.access.event(snapshot, *stalled)

    async def _report_problem(self, snapshot: Mapping[str, Any], problem: logic.RuleError) -> None:
        meta = snapshot["metadata"]
        previous = self._previous(snapshot)
        placeholder = logic.Rule(namespace=meta["namespace"], name=meta["name"], uid=str(meta.get("uid", "")),
                                 generation=int(meta.get("generation") or 0), rule_type="configmap",
                                 selector={}, source_namespaces=())
        status = logic.build_status(placeholder, previous, problem=problem)
        status.pop("ruleType", None)
        status.pop("sourceNamespaces", None)
        ready: Mapping[str, Any] = next((c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), {})
        if ready.get("message") != str(problem) or ready.get("observedGeneration") != status["observedGeneration"]:
            logger.warning(f"Copyrator {meta['namespace']}/{meta['name']}: {problem.reason}: {problem}")
            self.access.event(snapshot, "Warning", problem.reason, str(problem))
        await self._write_status(snapshot, previous, status)


# The controller in Kopf's memo, typed: operators/copyrator.py reaches it as ``CONTROLLER(memo)``.
CONTROLLER = MemoSlot("copyrator", CopyratorController)
