"""Re-roller: the history of a source, and a restore (docs/reroller.md, "History and restore").

A ConfigMap or Secret annotated ``history: "N"`` keeps its last N versions of data as immutable
snapshots beside it: same kind (a Secret's are Secrets of its type), same namespace, owned by it (they
go with it), labelled ``snapshot-of: <source>`` and named after the source and the data hash (the same
data is the same snapshot: a restart mid-work makes no second one). ``restore: <hash|previous>`` puts a
snapshot's data back in one write, which then rolls the source's users as any change does.

The pure decisions (parsing, names, what to prune, what to restore) are module functions; ``History``
makes the calls through ``core.access``. It never keeps data: what it remembers per source is a hash;
a snapshot's or a source's data is held only within the call that copies it, and never logged or put
in an Event.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.core import api as k8s
from kopf_operators.core.access import Access
from kopf_operators.core.api import AlreadyExists, ApiError, Conflict, Paused
from kopf_operators.core.conventions import DATA_ELIDED, DATA_STAMP, data_hash
from kopf_operators.core.state import Index, first
from kopf_operators.reroller.settings import (
    HISTORY,
    RESTORE,
    SNAPSHOT_HASH,
    SNAPSHOT_OF,
    SNAPSHOT_VERSION,
)
from kopf_operators.reroller.views import SourceView

logger = logging.getLogger("kopf_operators.reroller")

MAX_HISTORY = 20     # the most versions one source may keep (each is a whole copy of its data)
NAME_LIMIT = 253     # a ConfigMap's or Secret's name
LABEL_LIMIT = 63     # a label's value
PREVIOUS = "previous"
MIN_PREFIX = 7       # a restore may name a hash by a unique prefix this long (as git does)
KINDS = {"ConfigMap": k8s.CONFIGMAP, "Secret": k8s.SECRET}
SourceKey = tuple[str, str, str]  # (kind, namespace, name)
_FIELDS = {"ConfigMap": ("data", "binaryData"), "Secret": ("data",)}  # what a version of each holds


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A snapshot of ours as the decisions see it: never its data."""

    name: str
    uid: str
    hash: str
    version: int  # the source's resourceVersion when this data was last its data: orders the history


# --- pure decisions ---------------------------------------------------------------------------------


def parse_limit(value: str) -> tuple[int | None, str]:
    """The history annotation: (the count, "") or (None, why it is refused)."""
    text = str(value).strip()
    if not text.isdigit():
        return None, f"{HISTORY}: {text[:40]!r} is not a number of versions (1 to {MAX_HISTORY}): no history kept"
    count = int(text)
    if not 1 <= count <= MAX_HISTORY:
        return None, f"{HISTORY}: {count} is not between 1 and {MAX_HISTORY}: no history kept"
    return count, ""


def snapshot_name(source: str, digest: str) -> str:
    """``<source>-<hash>``; a name too long for that keeps a prefix of the source's name and a digest of
    all of it (two long names with one prefix never share a snapshot name)."""
    suffix = f"-{digest}"
    if len(source) + len(suffix) <= NAME_LIMIT:
        return source + suffix
    whole = hashlib.sha256(source.encode()).hexdigest()[:8]
    prefix = source[:NAME_LIMIT - len(suffix) - len(whole) - 1].rstrip(".-")
    return f"{prefix}-{whole}{suffix}"


def snapshot_label(source: str) -> str:
    """The ``snapshot-of`` label's value: the source's name, or, longer than a label value may be (63),
    a prefix of it and a digest of all of it."""
    if len(source) <= LABEL_LIMIT:
        return source
    whole = hashlib.sha256(source.encode()).hexdigest()[:8]
    return f"{source[:LABEL_LIMIT - len(whole) - 1].rstrip('.-')}-{whole}"


def _version(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def snapshot_of(body: Mapping[str, Any], source: str, source_uid: str) -> Snapshot | None:
    """A listed object as a snapshot of this source, or None: only an object with our label naming the
    source AND an ownerReference to the source's uid is ours (nothing else is pruned or restored from)."""
    meta = body.get("metadata") or {}
    if (meta.get("labels") or {}).get(SNAPSHOT_OF) != snapshot_label(source):
        return None
    if not any(ref.get("uid") == source_uid for ref in meta.get("ownerReferences") or ()):
        return None
    annotations = meta.get("annotations") or {}
    return Snapshot(name=str(meta.get("name")), uid=str(meta.get("uid") or ""),
                    hash=str(annotations.get(SNAPSHOT_HASH) or ""),
                    version=_version(annotations.get(SNAPSHOT_VERSION) or 0))


def newest_first(snapshots: Iterable[Snapshot]) -> list[Snapshot]:
    return sorted(snapshots, key=lambda s: (s.version, s.name), reverse=True)


def to_prune(snapshots: Iterable[Snapshot], limit: int, current: str) -> list[Snapshot]:
    """The snapshots beyond the ``limit`` newest (the current data's is always kept)."""
    ordered = newest_first(snapshots)
    ordered.sort(key=lambda s: s.hash != current)  # stable: the current data's first, then newest first
    return ordered[limit:]


def resolve_restore(value: str, current: str, snapshots: Iterable[Snapshot]) -> tuple[Snapshot | None, str]:
    """The snapshot a restore annotation names: (it, "") or (None, why not). ``previous`` is the newest
    snapshot of other data than the current; else a hash, or a unique prefix of at least MIN_PREFIX."""
    wanted = str(value).strip().lower()
    ordered = newest_first(snapshots)
    if wanted == PREVIOUS:
        older = [s for s in ordered if s.hash != current]
        if not older:
            return None, f"{RESTORE}: no previous version is kept: nothing restored"
        return older[0], ""
    found = [s for s in ordered if s.hash == wanted]
    if not found and len(wanted) >= MIN_PREFIX:
        found = [s for s in ordered if s.hash.startswith(wanted)]
    if len({s.hash for s in found}) == 1:
        return found[0], ""
    known = ", ".join(s.hash for s in ordered) or "none"
    if found:
        return None, f"{RESTORE}: {wanted[:40]!r} matches more than one kept version ({known}): nothing restored"
    return None, f"{RESTORE}: no kept version has hash {wanted[:40]!r} (kept: {known}): nothing restored"


def snapshot_body(kind: str, source: Mapping[str, Any], digest: str, version: int) -> dict[str, Any]:
    """The snapshot of ``source``'s data: immutable, owned by the source, labelled and annotated; of the
    source's own annotations and labels, none (a snapshot must not be a source of history itself)."""
    meta = source.get("metadata") or {}
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": kind, "immutable": True,
        "metadata": {
            "name": snapshot_name(str(meta["name"]), digest), "namespace": meta["namespace"],
            "labels": {SNAPSHOT_OF: snapshot_label(str(meta["name"]))},
            "annotations": {SNAPSHOT_HASH: digest, SNAPSHOT_VERSION: str(version)},
            "ownerReferences": [{"apiVersion": "v1", "kind": kind, "name": meta["name"], "uid": meta["uid"]}],
        },
    }
    if kind == "Secret":
        body["type"] = source.get("type") or "Opaque"
    for field in _FIELDS[kind]:
        if source.get(field):
            body[field] = dict(source[field])
    return body


def restore_patch(kind: str, current: Mapping[str, Any], snapshot: Mapping[str, Any], rv: str) -> dict[str, Any]:
    """One merge patch: the snapshot's data (keys it lacks removed), the restore annotation removed, on
    the resourceVersion the decision was made on."""
    patch: dict[str, Any] = {"metadata": {"resourceVersion": rv, "annotations": {RESTORE: None}}}
    for field in _FIELDS[kind]:
        kept = snapshot.get(field) or {}
        now = current.get(field) or {}
        if kept or now:
            patch[field] = {**{key: None for key in now if key not in kept}, **kept}
    return patch


def ref_of(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {"apiVersion": "v1", "kind": kind,
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")}}


# --- the calls ----------------------------------------------------------------------------------------


class History:
    """Keeps the snapshots of annotated sources and restores them, from the sources' watch events.

    A source's snapshots are listed (by label, in its namespace) only when its data hash is new to
    this process or a restore is asked for: an edit of metadata alone, or our own write's echo, costs
    nothing. What is kept per source is its uid and data hash, never data."""

    def __init__(self, access: Access, enabled: bool) -> None:
        self.access = access
        self.enabled = enabled
        self._kept: dict[SourceKey, tuple[str, str, int]] = {}  # (uid, hash, limit) whose history is done
        self._said: dict[SourceKey, str] = {}  # the last Warning said on the source: not said again

    def forget(self, key: SourceKey) -> None:
        self._kept.pop(key, None)
        self._said.pop(key, None)

    def due(self, key: SourceKey, source: SourceView) -> bool:
        """Whether the source has history work this process has not done: a restore asked for, or data
        whose version it has not kept (both seen from the source's index entry)."""
        if source.restore is not None:
            return True
        return source.history is not None and self._kept.get(key, ("", "", 0))[1] != source.hash

    async def sweep(self, sources: Mapping[str, Index[SourceKey, SourceView]]) -> None:
        """The resync's pass, and a takeover's: each annotated source with work not done here (its event
        came while this replica stood by, or its handling failed) is read and handled as an event."""
        if not self.enabled or self.access.paused:
            return
        for kind, index in sources.items():
            for key in list(index.keys()):
                found = first(index, key)
                if found is None or not self.due(key, found):
                    continue
                body = await self.access.read(KINDS[kind], key[1], key[2])
                if body is not None:
                    await self.source_event(kind, "MODIFIED", body)

    async def source_event(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        annotations = meta.get("annotations") or {}
        wanted, restore = annotations.get(HISTORY), annotations.get(RESTORE)
        if event_type == "DELETED" or (wanted is None and restore is None) or meta.get("deletionTimestamp"):
            self.forget(key)
            return
        if self.access.paused:
            return  # the replica that acts does it
        if not self.enabled:
            self._warn(kind, body, f"{HISTORY} and {RESTORE} are not enabled in this installation (the chart's "
                                   f"operators.reroller.history.enabled): nothing kept or restored")
            return
        async with self.access.serialised(("history", *key)):
            try:
                if wanted is not None:
                    await self._keep(kind, body, str(wanted))
                if restore is not None:
                    await self._restore(kind, body, str(restore))
            except Paused:
                return
            except ApiError as exc:
                # Refused or failing after the layer's retries: the next event of the source tries again.
                logger.warning(f"{kind} {key[1]}/{key[2]}: history: {exc}")

    def _warn(self, kind: str, body: Mapping[str, Any], message: str) -> None:
        """A Warning Event on the source, once per message (a fixed annotation clears it)."""
        meta = body.get("metadata") or {}
        key = (kind, str(meta.get("namespace")), str(meta.get("name")))
        if self._said.get(key) == message:
            return
        self._said[key] = message
        logger.warning(f"{kind} {key[1]}/{key[2]}: {message}"[:1000])
        self.access.event(ref_of(kind, body), "Warning", "HistoryRefused", message)

    async def _snapshots(self, kind: str, namespace: str, name: str, uid: str) -> list[Snapshot]:
        # Rare (a new data hash, a restore) and narrow (one label value in one namespace): not an index,
        # whose lag would hide the snapshot made a moment ago.
        # Their metadata only: a source's versions' data are never all held at once.
        listed = await self.access.list(KINDS[kind], namespace, labels=f"{SNAPSHOT_OF}={snapshot_label(name)}",
                                        metadata_only=True)
        return [s for s in (snapshot_of(item, name, uid) for item in listed) if s is not None]

    async def _data_of(self, kind: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The source with its data: the event's body, or read when it came without (a large listed one)."""
        if DATA_ELIDED not in body:
            return body
        meta = body.get("metadata") or {}
        return await self.access.read(KINDS[kind], meta.get("namespace"), str(meta.get("name")))

    async def _keep(self, kind: str, body: Mapping[str, Any], wanted: str) -> None:
        meta = body.get("metadata") or {}
        namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
        limit, refusal = parse_limit(wanted)
        if limit is None:
            self._warn(kind, body, refusal)
            return
        elided = body.get(DATA_ELIDED)
        digest = str(elided["hash"]) if isinstance(elided, Mapping) else data_hash(kind, body)
        stamp = (meta.get("annotations") or {}).get(DATA_STAMP)
        if stamp and stamp != digest:
            return  # a copy edited by hand, about to be put back by its writer: not a version of it
        if self._kept.get((kind, namespace, name)) == (uid, digest, limit):
            return
        rv = str(meta.get("resourceVersion") or "0")
        where = f"{kind} {namespace}/{name}"
        snapshots = await self._snapshots(kind, namespace, name, uid)
        mine = next((s for s in snapshots if s.hash == digest), None)
        newest = max((s.version for s in snapshots), default=0)
        if mine is None:
            source = await self._data_of(kind, body)
            if source is None or data_hash(kind, source) != digest:
                return  # gone or changed meanwhile: its own event follows
            created = snapshot_body(kind, source, digest, _version(rv))
            try:
                answer = await self.access.create(KINDS[kind], created)
            except AlreadyExists:
                found = await self.access.read(KINDS[kind], namespace, created["metadata"]["name"])
                if found is None or snapshot_of(found, name, uid) is None:
                    self._warn(kind, body, f"{created['metadata']['name']} exists and is not a snapshot of "
                                           f"this {kind}: version {digest} not kept")
                    return
                answer = found
            mine = snapshot_of(answer, name, uid)
            logger.info(f"{where}: version {digest} kept as {kind} {created['metadata']['name']}")
            snapshots = [s for s in snapshots if s.hash != digest] + ([mine] if mine else [])
        elif mine.version < newest:
            # The data went back to a version kept before: it becomes the newest again (its metadata only:
            # a snapshot's data are immutable, its annotations are not).
            patch = {"metadata": {"annotations": {SNAPSHOT_VERSION: rv}}}
            if await self.access.patch(KINDS[kind], namespace, mine.name, patch) is not None:
                logger.info(f"{where}: version {digest} is current again ({kind} {mine.name})")
                snapshots = [s if s.hash != digest else dataclasses.replace(s, version=_version(rv))
                             for s in snapshots]
        for old in to_prune(snapshots, limit, digest):
            if await self.access.delete(KINDS[kind], namespace, old.name, uid=old.uid):
                logger.info(f"{where}: version {old.hash} dropped ({kind} {old.name}), beyond {limit} kept")
        self._kept[(kind, namespace, name)] = (uid, digest, limit)

    async def _restore(self, kind: str, body: Mapping[str, Any], value: str) -> None:
        meta = body.get("metadata") or {}
        namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
        where = f"{kind} {namespace}/{name}"
        current = await self._data_of(kind, body)
        if current is None:
            return
        current_meta = current.get("metadata") or {}
        if (current_meta.get("annotations") or {}).get(RESTORE) != value:
            return  # read anew and changed meanwhile: its own event follows
        digest = data_hash(kind, current)
        target, refusal = resolve_restore(value, digest, await self._snapshots(kind, namespace, name, uid))
        if target is None:
            self._warn(kind, body, refusal)
            return
        rv = str(current_meta.get("resourceVersion") or "")
        if target.hash == digest:
            patch: dict[str, Any] = {"metadata": {"resourceVersion": rv, "annotations": {RESTORE: None}}}
        else:
            snapshot = await self.access.read(KINDS[kind], namespace, target.name)
            if snapshot is None or snapshot_of(snapshot, name, uid) is None or data_hash(kind, snapshot) != target.hash:
                self._warn(kind, body, f"{RESTORE}: the snapshot of version {target.hash} is gone or altered: "
                                       f"nothing restored")
                return
            if kind == "Secret" and (snapshot.get("type") or "Opaque") != (current.get("type") or "Opaque"):
                self._warn(kind, body, f"{RESTORE}: version {target.hash} is of another Secret type: nothing restored")
                return
            patch = restore_patch(kind, current, snapshot, rv)
        try:
            answer = await self.access.patch(KINDS[kind], namespace, name, patch)
        except Conflict:
            return  # changed since: its newer event decides again
        if answer is None:
            return
        self._said.pop((kind, namespace, name), None)
        if target.hash == digest:
            logger.info(f"{where}: version {digest} is already its data: restore annotation removed")
            return
        message = f"Data restored to version {target.hash} (from {digest}); its users roll as for any change"
        logger.info(f"{where}: {message}")
        self.access.event(ref_of(kind, body), "Normal", "Restored", message)
