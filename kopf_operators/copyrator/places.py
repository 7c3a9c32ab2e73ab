"""Copyrator: the places copies go to, as known (the copies indexes with our own newer writes over them,
objects in the way, and the copies that fail or are refused per rule), and what a pass did at one place
(an ``Outcome``: the writer returns it, the controller hands it to ``Places.record`` and the status
reporter)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Literal

from kopf_operators.copyrator.copies import CopyView
from kopf_operators.core.api import ApiError
from kopf_operators.core.state import Index, KeyedState, Newest, PerKey, first, values

CopyKey = tuple[str, str, str]  # (kind, namespace, name)
# A copies index answers four lookups, so it holds each copy under four key shapes (one indexer per
# watched kind: Kopf calls every indexer on every event of its resource):
CopyAt = tuple[Literal["at"], str, str]               # ("at", namespace, name): the copy at a place
CopiesOf = tuple[Literal["rule"], str]                # ("rule", rule uid): all of a rule's copies
CopiesNamed = tuple[Literal["rule-name"], str, str]   # ("rule-name", rule uid, name)
CopiesIn = tuple[Literal["rule-ns"], str, str]        # ("rule-ns", rule uid, namespace)
CopyIndexKey = CopyAt | CopiesOf | CopiesNamed | CopiesIn
CopiesIndex = Index[CopyIndexKey, CopyView]


def copy_index_keys(view: CopyView) -> dict[CopyIndexKey, CopyView]:
    """The keys of one copy in its copies index: by place, by rule, by rule and name, by rule and
    namespace (each a lookup some trigger needs)."""
    return {("at", view.namespace, view.name): view, ("rule", view.rule_uid): view,
            ("rule-name", view.rule_uid, view.name): view, ("rule-ns", view.rule_uid, view.namespace): view}


class Result(enum.Enum):
    """What a pass left at a place, as the failures kept per rule see it."""

    DONE = "done"            # nothing fails there now: in sync (written, or nothing to write), or its namespace gone
    FAILED = "failed"        # a write failed: the rule is retried with backoff
    REFUSED = "refused"      # the API server refuses the copy (400/422), a new reason: not retried until it changes
    UNCHANGED = "unchanged"  # as it was: blocked, the rule being deleted, the namespace terminating, a prune


@dataclasses.dataclass(frozen=True)
class Seen:
    """What a pass learned at a place first-hand: the copy there (our write's answer, or a read), or
    none, after our delete of the copy ``uid``."""

    view: CopyView | None
    uid: str = ""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one pass did at one place."""

    rule_uid: str
    key: CopyKey
    result: Result = Result.UNCHANGED
    writes: int = 0                # requests that changed something, for the reaction metric and the log
    seen: tuple[Seen, ...] = ()    # in the order learned: newer than the watch until it catches up
    counted: tuple[str, ...] = ()  # "created", "updated", "deleted": for the rule's next Synced Event
    foreign: str | None = None     # the uid of an object in the way that is nobody's copy (a 409 on create)
    refusal: str = ""              # REFUSED: why (the server's field-level reason, never values)
    error: ApiError | None = None  # FAILED


def overlay() -> Newest[CopyKey, CopyView]:
    """Our own writes over a copies index (we create copies: ``ours_until_seen``)."""
    return Newest(lambda v: v.rv, lambda v: v.uid, ours_until_seen=True)


class Places:
    """The copies as the indexes see them, with the answers to our own writes until the watch catches up
    (a ``Newest`` with ``ours_until_seen``: we create copies), so a burst never writes twice."""

    def __init__(self, copies: Mapping[str, CopiesIndex], state: KeyedState[str]) -> None:
        self.index = copies  # kind -> Kopf's live index of copies (see copy_index_keys)
        self.written = overlay()
        self.foreign: dict[CopyKey, str] = {}  # objects in the way that are nobody's copy: uid (from a 409)
        self.failed: PerKey[str, set[CopyKey]] = state.map()  # rule uid -> failing copies
        # rule uid -> copies the API server refuses (400/422: the source's content, e.g. annotations
        # over 256 KiB with copyAnnotations) -> why. Not retried with backoff: the source must change.
        self.rejected: PerKey[str, dict[CopyKey, str]] = state.map()

    def copy(self, kind: str, namespace: str, name: str, ours: Seen | None = None) -> CopyView | None:
        """The copy at a place: the index, or the answer to our own newer write. ``ours``: what a pass
        running there has just learned itself (not recorded yet), over the index the same way."""
        key = (kind, namespace, name)
        indexed: CopyView | None = first(self.index[kind], ("at", namespace, name))
        if ours is None:
            return self.written.current(key, indexed)
        learned = overlay()
        if ours.view is None:
            learned.remember_gone(key, ours.uid)
        else:
            learned.remember(key, ours.view)
        return learned.current(key, indexed)

    def refusal(self, rule_uid: str, key: CopyKey) -> str | None:
        """Why the API server refuses the rule's copy at ``key``, as last reported (None: it does not)."""
        return (self.rejected.get(rule_uid) or {}).get(key)

    def record(self, outcome: Outcome) -> None:
        """What a pass did at a place: the answers to our writes (until the watch catches up), an object
        in the way, and whether the copy there fails, is refused or is done with."""
        key, uid = outcome.key, outcome.rule_uid
        for seen in outcome.seen:
            if seen.view is None:
                self.written.remember_gone(key, seen.uid)
            else:
                self.written.remember(key, seen.view)
        if outcome.foreign is not None:
            self.foreign[key] = outcome.foreign
        if outcome.result is Result.FAILED:
            self.failed.setdefault(uid, set()).add(key)
        elif outcome.result is Result.REFUSED:
            self.rejected.setdefault(uid, {})[key] = outcome.refusal
            self.failed.get(uid, set()).discard(key)
        elif outcome.result is Result.DONE:
            self.settled(uid, lambda failed: failed == key)

    def cleared(self, key: CopyKey, uid: str | None = None) -> bool:
        """The object in the way at ``key`` is gone (``uid``: only if it is that object): the rules'
        copies may go there now. Whether one was."""
        if key not in self.foreign or uid not in (None, self.foreign[key]):
            return False
        del self.foreign[key]
        return True

    def copies_of(self, rule_uid: str, kind: str, *, name: str | None = None,
                  namespace: str | None = None) -> list[CopyView]:
        """A rule's copies (all, or of one name, or in one namespace), our pending writes included."""
        if name is not None:
            key: CopyIndexKey = ("rule-name", rule_uid, name)
        elif namespace is not None:
            key = ("rule-ns", rule_uid, namespace)
        else:
            key = ("rule", rule_uid)
        places = {(v.namespace, v.name) for v in values(self.index[kind], key)}
        for (k, ns, nm), written in self.written.held():
            if k == kind and written.rule_uid == rule_uid and name in (None, nm) and namespace in (None, ns):
                places.add((ns, nm))
        return [view for ns, nm in sorted(places)
                if (view := self.copy(kind, ns, nm)) is not None and view.rule_uid == rule_uid]

    def deleted(self, key: CopyKey, uid: str) -> None:
        """The watch reports the copy ``uid`` deleted: what we wrote to it is past."""
        if (known := self.written.current(key)) is not None and known.uid == uid:
            self.written.forget(key)

    def settled(self, rule_uid: str, done: Callable[[CopyKey], bool]) -> None:
        """Failed and refused copies of the rule that are ``done`` with (their place is gone, or no
        place of the rule any more) stop counting."""
        failed, rejected = self.failed.get(rule_uid) or set(), self.rejected.get(rule_uid) or {}
        for key in [k for k in failed if done(k)]:
            failed.discard(key)
        for key in [k for k in rejected if done(k)]:
            rejected.pop(key, None)

    def settled_in(self, namespace: str) -> None:
        """A namespace gone or terminating: nothing fails in it any more."""
        for uid in set(self.failed) | set(self.rejected):
            self.settled(uid, lambda key: key[1] == namespace)
