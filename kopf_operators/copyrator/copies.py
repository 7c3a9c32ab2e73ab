"""Copyrator: one copy (pure): what a place should hold and the single write that gets it there.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.copyrator.rules import (
    ANNOTATIONS_COPIED,
    DEFAULT_STRIP_ANNOTATIONS,
    DEFAULT_STRIP_LABELS,
    HASH_ANNOTATION,
    PROJECT_DOMAINS,
    PUSHED_ANNOTATION,
    RULE_ANNOTATION,
    SOURCE_UID_ANNOTATION,
    Rule,
    copied_data,
    copy_name,
)
from kopf_operators.core.conventions import (
    COPY_SOURCE,
    COPYRATOR_PREFIX,
    COPYRATOR_RULE_UID_LABEL,
    DATA_STAMP,
    data_hash,
    stable_hash,
)

# --- The copy ---------------------------------------------------------------------------------


def _glob_any(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


def ours(key: str) -> bool:
    """A label or annotation key under one of the project's domains (``PROJECT_DOMAINS``, subdomains
    included): it steers one of the operators, so a copy never takes it from its source (a tenant's
    source must not put Blackadder's ledger label, or any marker, into another namespace)."""
    prefix, slash, _name = key.rpartition("/")
    return bool(slash) and any(prefix == domain or prefix.endswith("." + domain) for domain in PROJECT_DOMAINS)


def copied_labels(rule: Rule, labels: Mapping[str, str] | None) -> dict[str, str]:
    strip = DEFAULT_STRIP_LABELS + rule.strip_labels
    return {k: v for k, v in (labels or {}).items() if not ours(k) and not _glob_any(k, strip)}


def copied_annotations(rule: Rule, annotations: Mapping[str, str] | None) -> dict[str, str]:
    if not rule.copy_annotations:
        return {}
    strip = DEFAULT_STRIP_ANNOTATIONS + rule.strip_annotations
    return {k: v for k, v in (annotations or {}).items() if not ours(k) and not _glob_any(k, strip)}


def content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What a copy holds of its source: data, labels, type, immutability, copied annotations."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    result: dict[str, Any] = {
        "data": dict(obj.get("data") or {}),
        "binaryData": dict(obj.get("binaryData") or {}),
        "labels": {k: v for k, v in (meta.get("labels") or {}).items() if not k.startswith(COPYRATOR_PREFIX)},
        "immutable": bool(obj.get("immutable")),
    }
    if annotations.get(ANNOTATIONS_COPIED) == "true":
        result["annotations"] = {k: v for k, v in annotations.items() if not k.startswith(COPYRATOR_PREFIX)}
    if obj.get("kind") == "Secret" or "type" in obj:
        result["type"] = obj.get("type") or "Opaque"
    return result


def content_hash(source_uid: str, copy: Mapping[str, Any]) -> str:
    """A digest of a copy's content (salted with the source uid); never the values themselves."""
    return stable_hash([source_uid, content(copy)])


def desired_copy(rule: Rule, source: Mapping[str, Any], target_namespace: str) -> dict[str, Any]:
    meta = source["metadata"]
    labels = copied_labels(rule, meta.get("labels"))
    labels[COPYRATOR_RULE_UID_LABEL] = rule.uid
    annotations = copied_annotations(rule, meta.get("annotations"))
    if rule.copy_annotations:
        annotations[ANNOTATIONS_COPIED] = "true"
    if rule.push:
        annotations[PUSHED_ANNOTATION] = "true"
    else:
        annotations[RULE_ANNOTATION] = rule.key
    annotations.update({
        COPY_SOURCE: f"{meta['namespace']}/{meta['name']}",
        SOURCE_UID_ANNOTATION: meta.get("uid", ""),
    })
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": rule.kind,
        "metadata": {"name": copy_name(rule, meta["name"]), "namespace": target_namespace, "labels": labels,
                     "annotations": annotations},
    }
    for field in ("data", "binaryData"):
        if copied := copied_data(rule, source.get(field)):
            body[field] = copied
    if rule.rule_type == "secret":
        body["type"] = source.get("type") or "Opaque"
    if source.get("immutable"):
        body["immutable"] = True
    annotations[HASH_ANNOTATION] = content_hash(meta.get("uid", ""), body)
    # The data stamp: a hand edit of the copy is told from a change by whoever reads its data (the
    # re-roller holds its rollouts until the copy is put back).
    annotations[DATA_STAMP] = data_hash(rule.kind, body)
    return body


@dataclasses.dataclass(frozen=True, slots=True)
class CopyView:
    """What the copies index keeps of one copy (no values): enough to decide and to write."""

    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: str
    rule_uid: str
    source: str  # "ns/name" of its source
    recorded_hash: str  # the hash annotation (what we wrote)
    actual_hash: str  # the hash of what it holds now (differs: edited by hand)
    immutable: bool
    type: str | None
    annotations_copied: bool
    rule: str = ""  # "ns/name" of its rule (the annotation): where to confirm that the rule is gone
    pushed: bool = False  # made by a push annotation on its source (its rule uid is the source's uid)
    stamp: str = ""  # the data stamp (``DATA_STAMP``) it carries

    @property
    def drifted(self) -> bool:
        return self.recorded_hash != self.actual_hash

    @property
    def rv(self) -> int:
        try:
            return int(self.resource_version)
        except ValueError:
            return 0


def copy_view(obj: Mapping[str, Any], kind: str | None = None) -> CopyView:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    kind = kind or str(obj.get("kind") or "")
    return CopyView(
        kind=kind, namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")), resource_version=str(meta.get("resourceVersion", "")),
        rule_uid=str((meta.get("labels") or {}).get(COPYRATOR_RULE_UID_LABEL, "")),
        source=str(annotations.get(COPY_SOURCE, "")),
        recorded_hash=str(annotations.get(HASH_ANNOTATION, "")),
        actual_hash=content_hash(str(annotations.get(SOURCE_UID_ANNOTATION, "")),
                                 {**obj, "kind": kind}),
        immutable=bool(obj.get("immutable")),
        type=(obj.get("type") or "Opaque") if kind == "Secret" else None,
        annotations_copied=annotations.get(ANNOTATIONS_COPIED) == "true",
        rule=str(annotations.get(RULE_ANNOTATION, "")),
        pushed=annotations.get(PUSHED_ANNOTATION) == "true",
        stamp=str(annotations.get(DATA_STAMP, "")),
    )


def in_sync(view: CopyView, desired: Mapping[str, Any]) -> bool:
    """Compare before writing: an idle cluster sees no writes. A copy without a data stamp (written
    before copies carried one) is not rewritten for the stamp alone: an upgrade writes nothing; it gets
    its stamp with its next write (until then the re-roller treats it as an unstamped object)."""
    annotations = desired["metadata"]["annotations"]
    return (view.actual_hash == annotations[HASH_ANNOTATION] == view.recorded_hash
            and view.source == annotations[COPY_SOURCE] and view.stamp in ("", annotations[DATA_STAMP]))


class Action(enum.Enum):
    NONE = "none"
    CREATE = "create"
    PATCH = "patch"
    RECREATE = "recreate"  # a Secret's type or an immutable copy cannot change in place
    DELETE = "delete"
    CONFLICT = "conflict"  # a foreign object holds the name: left untouched


def decide(rule_uid: str, desired: Mapping[str, Any] | None, view: CopyView | None,
           foreign: bool = False, claimed: bool = False, keep: bool = False) -> Action:
    """The one write (if any) that makes a target namespace hold what it should.
    ``view``: the copy the indexes know at that name (any rule's), None when none; ``foreign``:
    a 409 showed an object that is nobody's copy in the way; ``claimed``: an older rule wants this
    name too (it gets it); ``keep``: an unwanted copy whose replacement (the same source under the
    rule's new name) is not in sync yet stays until it is."""
    if view is not None and view.rule_uid != rule_uid:
        return Action.CONFLICT if desired is not None else Action.NONE
    if desired is None:
        return Action.DELETE if view is not None and not keep else Action.NONE
    if view is None:
        return Action.CONFLICT if foreign or claimed else Action.CREATE
    if in_sync(view, desired):
        return Action.NONE
    if view.immutable or (desired.get("kind") == "Secret" and view.type != desired.get("type")):
        return Action.RECREATE
    return Action.PATCH


@dataclasses.dataclass(frozen=True)
class Place:
    """One place of a rule (kind, namespace, name) as observed from the indexes: what ``decide``
    needs, or why nothing may be written there. ``gone``: its namespace is gone or terminating (its
    copies go with it); ``blocked``: the rule cannot copy its source as configured, or the target
    does not consent (whatever is there stays)."""

    key: tuple[str, str, str]
    desired: Mapping[str, Any] | None = None
    view: CopyView | None = None
    foreign: bool = False
    claimed: bool = False
    keep: bool = False
    gone: bool = False
    blocked: bool = False

    def action(self, rule_uid: str) -> Action:
        if self.gone or self.blocked:
            return Action.NONE
        return decide(rule_uid, self.desired, self.view, foreign=self.foreign, claimed=self.claimed, keep=self.keep)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A rule's sweep over some of its places, decided: the writes to make (each with the place as
    decided on: the writer makes it only while the place still looks so), and the places where
    nothing is written and nothing fails any more (in sync, someone else's, gone)."""

    writes: list[tuple[Place, Action]]
    settled: list[tuple[str, str, str]]


def decide_sweep(rule_uid: str, places: Iterable[Place]) -> Sweep:
    """One call for a sweep of a rule's places: every write, in the places' order."""
    writes: list[tuple[Place, Action]] = []
    settled: list[tuple[str, str, str]] = []
    for place in places:
        action = place.action(rule_uid)
        if action is Action.NONE or action is Action.CONFLICT:
            if not place.blocked:
                settled.append(place.key)
        else:
            writes.append((place, action))
    return Sweep(writes, settled)


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def patch_ops(view: CopyView, desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch that makes the copy ``view`` hold ``desired``, without reading it: whole maps
    replace data and labels (so removed keys go), our annotations are set one by one (others'
    annotations stay, unless the rule copies annotations). The resourceVersion makes it optimistic."""
    meta = desired["metadata"]
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": "/metadata/resourceVersion", "value": view.resource_version},
        {"op": "add", "path": "/data", "value": dict(desired.get("data") or {})},
        {"op": "add", "path": "/metadata/labels", "value": dict(meta["labels"])},
    ]
    if desired.get("kind") == "ConfigMap":  # Secrets have no binaryData
        ops.append({"op": "add", "path": "/binaryData", "value": dict(desired.get("binaryData") or {})})
    if meta["annotations"].get(ANNOTATIONS_COPIED) == "true" or view.annotations_copied:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": dict(meta["annotations"])})
    else:
        ops.extend({"op": "add", "path": "/metadata/annotations/" + _pointer(key), "value": value}
                   for key, value in sorted(meta["annotations"].items()))
    if desired.get("immutable"):
        ops.append({"op": "add", "path": "/immutable", "value": True})
    return ops
