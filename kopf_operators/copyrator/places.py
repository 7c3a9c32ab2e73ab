"""Copyrator: the places copies go to, as known (the copies indexes with our own newer writes over them,
objects in the way, and the copies that fail or are refused per rule)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Literal

from kopf_operators.copyrator import decisions as logic
from kopf_operators.core.state import Index, KeyedState, Newest, PerKey, first, values

CopyKey = tuple[str, str, str]  # (kind, namespace, name)
# A copies index answers four lookups, so it holds each copy under four key shapes (one indexer per
# watched kind: Kopf calls every indexer on every event of its resource):
CopyAt = tuple[Literal["at"], str, str]               # ("at", namespace, name): the copy at a place
CopiesOf = tuple[Literal["rule"], str]                # ("rule", rule uid): all of a rule's copies
CopiesNamed = tuple[Literal["rule-name"], str, str]   # ("rule-name", rule uid, name)
CopiesIn = tuple[Literal["rule-ns"], str, str]        # ("rule-ns", rule uid, namespace)
CopyIndexKey = CopyAt | CopiesOf | CopiesNamed | CopiesIn
CopiesIndex = Index[CopyIndexKey, logic.CopyView]


def copy_index_keys(view: logic.CopyView) -> dict[CopyIndexKey, logic.CopyView]:
    """The keys of one copy in its copies index: by place, by rule, by rule and name, by rule and
    namespace (each a lookup some trigger needs)."""
    return {("at", view.namespace, view.name): view, ("rule", view.rule_uid): view,
            ("rule-name", view.rule_uid, view.name): view, ("rule-ns", view.rule_uid, view.namespace): view}


class Places:
    """The copies as the indexes see them, with the answers to our own writes until the watch catches up
    (a ``Newest`` with ``ours_until_seen``: we create copies), so a burst never writes twice."""

    def __init__(self, copies: Mapping[str, CopiesIndex], state: KeyedState[str]) -> None:
        self.index = copies  # kind -> Kopf's live index of copies (see copy_index_keys)
        self.written: Newest[CopyKey, logic.CopyView] = Newest(lambda v: v.rv, lambda v: v.uid,
                                                                ours_until_seen=True)
        self.foreign: dict[CopyKey, str] = {}  # objects in the way that are nobody's copy: uid (from a 409)
        self.failed: PerKey[str, set[CopyKey]] = state.map()  # rule uid -> failing copies
        # rule uid -> copies the API server refuses (400/422: the source's content, e.g. annotations
        # over 256 KiB with copyAnnotations) -> why. Not retried with backoff: the source must change.
        self.rejected: PerKey[str, dict[CopyKey, str]] = state.map()
        self.done: PerKey[str, collections.Counter[str]] = state.map()  # rule uid -> writes since the last Synced

    def copy(self, kind: str, namespace: str, name: str) -> logic.CopyView | None:
        """The copy at a place: the index, or the answer to our own newer write."""
        indexed: logic.CopyView | None = first(self.index[kind], ("at", namespace, name))
        return self.written.current((kind, namespace, name), indexed)

    def copies_of(self, rule_uid: str, kind: str, *, name: str | None = None,
                  namespace: str | None = None) -> list[logic.CopyView]:
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
