"""What a controller knows: its place in Kopf's memo, its indexes, and everything it keeps per key.

- ``MemoSlot``: one typed entry of Kopf's ``memo`` (handlers reach their controller as ``SLOT(memo)``,
  so mypy checks every call from a handler into a controller; ``memo.x`` would be ``Any``);
- ``Index``, ``first(index, key)`` / ``values(index, key)``: one entry of a Kopf index (or of a plain
  dict in tests): controller-runtime's informer cache and its indexers;
- ``KeyedState``: everything a controller keeps per key, registered once, so that one ``forget(key)``
  drops all of it when the object goes (maps, sets, backoffs, timers, newest versions);
- ``Newest``: the newest known version of each key's object, where the watch lags behind: the answers
  to our own writes (and tombstones of our deletes) until the watch catches up, or the newest of
  several reports that may arrive out of order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Hashable, Mapping, MutableMapping
from typing import Any, Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")

# What a controller reads a Kopf index as: Kopf's ``kopf.Index[K, V]`` is a Mapping from a key to a
# store (a collection) of values; a plain ``dict[K, list[V]]`` is one too (unit tests).
Index = Mapping[K, Collection[V]]


def first(index: Mapping[K, Collection[V]] | None, key: K) -> V | None:
    """The one value an index holds under ``key`` (None when absent)."""
    for value in (index or {}).get(key) or ():
        return value
    return None


def values(index: Mapping[K, Collection[V]] | None, key: K) -> list[V]:
    """Every value an index holds under ``key``."""
    return list((index or {}).get(key) or ())


class MemoSlot(Generic[T]):
    """One typed entry of Kopf's ``memo`` (a dict with attribute access, shared by all handlers)."""

    def __init__(self, name: str, kind: type[T]) -> None:
        self.name, self.kind = name, kind

    def set(self, memo: MutableMapping[str, Any], value: T) -> T:
        memo[self.name] = value
        return value

    def __call__(self, memo: Mapping[str, Any]) -> T:
        value = memo.get(self.name)
        if not isinstance(value, self.kind):
            raise RuntimeError(f"memo.{self.name} is not a {self.kind.__name__}: its startup handler has not run")
        return value

    def present(self, memo: Mapping[str, Any]) -> bool:
        return isinstance(memo.get(self.name), self.kind)


class Forgetful(Protocol):
    """A part of a controller's per-key state."""

    def forget(self, key: Any) -> None: ...


class PerKey(dict[K, V]):
    """A map of per-key state that a ``KeyedState`` forgets."""

    def forget(self, key: K) -> None:
        self.pop(key, None)


class PerKeySet(set[K]):
    """A set of keys that a ``KeyedState`` forgets."""

    def forget(self, key: K) -> None:
        self.discard(key)


P = TypeVar("P", bound=Forgetful)


class KeyedState(Generic[K]):
    """Everything a controller keeps per key, registered where it is made: one ``forget(key)`` drops
    all of it, so nothing is left behind (or fires later) for an object that is gone, and a new piece
    of state cannot be forgotten by the cleanup."""

    def __init__(self) -> None:
        self._parts: list[Forgetful] = []
        self._hooks: list[Callable[[K], None]] = []

    def track(self, part: P) -> P:
        self._parts.append(part)
        return part

    def map(self) -> PerKey[K, Any]:
        """A new per-key map (typed by the caller: ``self.x: PerKey[Key, int] = state.map()``)."""
        return self.track(PerKey())

    def set(self) -> PerKeySet[K]:
        return self.track(PerKeySet())

    def on_forget(self, hook: Callable[[K], None]) -> None:
        """Cleanup that is more than dropping an entry (say, giving back a reserved token)."""
        self._hooks.append(hook)

    def forget(self, key: K) -> None:
        for hook in self._hooks:
            hook(key)
        for part in self._parts:
            part.forget(key)


@dataclasses.dataclass(frozen=True)
class _Known(Generic[V]):
    version: int
    identity: Hashable
    value: V | None  # None: gone at this version (a tombstone)


def version_of(resource_version: Any) -> int:
    """A resourceVersion as a number to compare (0 when absent or not a number)."""
    try:
        return int(resource_version or 0)
    except (TypeError, ValueError):
        return 0


class Newest(Generic[K, V]):
    """The newest known version of each key's object, where Kopf's watch lags behind.

    Two uses, one per instance:
    - an overlay of our own writes on an index (``remember``/``remember_gone`` then ``current(key,
      indexed)``): the answer to our write is newer than the index until the watch delivers that
      version (same identity, version at least ours), then the index is the truth again;
    - the newest of reports that may arrive out of order (``saw`` then ``seen``): an older report never
      replaces a newer one, and a deletion is remembered as "gone at that version".

    ``version(value)`` orders the versions of one object; ``identity(value)`` tells objects of the same
    key apart (a uid: a deleted and re-created object is another one). ``ours_until_seen``: we create
    these objects, so a written value the index does not hold yet (or holds as another object) stays
    the newest; without it the index is the authority on existence (an object gone from it, or
    replaced, drops what we wrote to the old one).

    Where each operator uses it:
    - immortal: an overlay of ImmortalContainers (``remember`` after a status patch, then
      ``newer(ic, event body)``) and the newest report of its pod (``saw`` for every indexed pod, the
      pod event, None when DELETED, and our create's answer; then ``seen``);
    - Copyrator: an overlay of copies with ``ours_until_seen`` (we create them; ``remember_gone``
      after our delete), and the newest report of each source;
    - the re-roller: an overlay of WorkloadViews, then ``newer(view, event_view)``;
    - Blackadder's ledgers: ``ours_until_seen`` with no index (we are the ledger's only writer):
      ``remember`` after our read and after every write.
    """

    def __init__(self, version: Callable[[V], int], identity: Callable[[V], Hashable], *,
                 ours_until_seen: bool = False) -> None:
        self.version, self.identity = version, identity
        self.ours_until_seen = ours_until_seen
        self._known: dict[K, _Known[V]] = {}

    def __len__(self) -> int:
        return len(self._known)

    def remember(self, key: K, value: V) -> None:
        """The answer to our own write (or our own read): the newest version there is."""
        self._known[key] = _Known(self.version(value), self.identity(value), value)

    def remember_gone(self, key: K, identity: Hashable) -> None:
        """We deleted the object ``identity``: absent until the watch no longer holds it."""
        self._known[key] = _Known(0, identity, None)

    def current(self, key: K, indexed: V | None = None) -> V | None:
        """The newest of what we remember and ``indexed`` (the index's value, None when it holds none);
        what we remember is dropped once the index has caught up with it."""
        known = self._known.get(key)
        if known is None:
            return indexed
        same = indexed is not None and self.identity(indexed) == known.identity
        if known.value is None:  # our delete
            if same:
                return None  # the watch has not delivered the deletion yet
        elif same:
            if indexed is not None and self.version(indexed) < known.version:
                return known.value
        elif self.ours_until_seen:
            return known.value  # our create (or re-create) the watch has not delivered yet
        del self._known[key]
        return indexed

    def newer(self, known: V | None, reported: V | None) -> V | None:
        """The newer of what is known and what an event just reported (not remembered): the report
        when it is another object or not older (a resourceVersion is a global order, and the same
        version is the same state)."""
        if reported is None:
            return known
        if known is None or self.identity(reported) != self.identity(known):
            return reported
        return reported if self.version(reported) >= self.version(known) else known

    def saw(self, key: K, value: V | None, version: int, identity: Hashable = None) -> None:
        """A report of the object at ``version`` (None: deleted at that version): kept unless an older
        one; a report of the same version replaces the one held (the same state)."""
        known = self._known.get(key)
        if known is None or version >= known.version:
            self._known[key] = _Known(version, identity, value)

    def seen(self, key: K) -> V | None:
        """The newest reported value (None: nothing reported, or gone)."""
        known = self._known.get(key)
        return None if known is None else known.value

    def held(self) -> list[tuple[K, V]]:
        """Every value remembered (tombstones left out)."""
        return [(key, known.value) for key, known in self._known.items() if known.value is not None]

    def forget(self, key: K) -> None:
        self._known.pop(key, None)
