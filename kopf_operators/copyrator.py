"""Copyrator: pure decisions (no API calls).

A ``CopyratorRule`` names a resource type (ConfigMap or Secret), a label selector and one or more
source namespaces. Every matching object is copied into each target namespace. This module decides,
for one copy at a time, what the cluster should hold there and which single write gets it there;
``copyrator_controller`` feeds it from indexes and applies the answer.

Consent: a rule that reads a namespace other than its own copies a source only when the source
carries ``copyrator.kopf-operators.dev/allowed-namespaces`` (names and globs), and only into the
namespaces listed there, unless the operator runs with COPYRATOR_ALLOW_CROSS_NAMESPACE=true.

Objects are plain dicts as the API returns them (camelCase keys).
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from kopf_operators.common import (
    DOMAIN,
    env_bool,
    env_float,
    kstatus_conditions,
    matches_label_selector,
    matches_labels,
    set_condition,
    stable_hash,
)

GROUP = "flant.com"
VERSION = "v1"
PLURAL = "copyrators"
KIND = "CopyratorRule"
API_VERSION = f"{GROUP}/{VERSION}"

PREFIX = f"copyrator.{DOMAIN}/"
# The marker: the uid of the rule that owns a copy. Only objects carrying *this rule's* uid here
# are ever updated or deleted by that rule.
RULE_UID_LABEL = PREFIX + "rule-uid"
RULE_ANNOTATION = PREFIX + "rule"  # "<namespace>/<name>" of the rule
SOURCE_ANNOTATION = PREFIX + "source"  # "<namespace>/<name>" of the source
SOURCE_UID_ANNOTATION = PREFIX + "source-uid"
HASH_ANNOTATION = PREFIX + "content-hash"
# On a copy whose rule copies the source's annotations: they are then part of the content.
ANNOTATIONS_COPIED = PREFIX + "annotations-copied"
# On a source: the consent for rules in other namespaces ("team-a,team-*"): where it may be copied.
ALLOWED_NAMESPACES_ANNOTATION = PREFIX + "allowed-namespaces"
OUR_ANNOTATIONS = (RULE_ANNOTATION, SOURCE_ANNOTATION, SOURCE_UID_ANNOTATION, HASH_ANNOTATION)

RULE_TYPES = {"configmap": "ConfigMap", "secret": "Secret"}
# Never copied: credentials bound to one namespace/cluster identity, and Helm's release records.
FORBIDDEN_SECRET_TYPES = frozenset({
    "kubernetes.io/service-account-token",
    "bootstrap.kubernetes.io/token",
    "helm.sh/release.v1",
})
# Excluded from "all namespaces" unless a rule lists them in targetNamespaces.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})

# Labels and annotations by which another controller would claim, adopt or prune a copy (Helm,
# Argo CD, Flux, kapp, Kyverno generate, cert-manager): never copied (globs). ownerReferences and
# finalizers are never copied at all (a copy's metadata is built from scratch).
DEFAULT_STRIP_LABELS = (
    "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/*", "meta.helm.sh/*",
    "argocd.argoproj.io/*", "kustomize.toolkit.fluxcd.io/*", "helm.toolkit.fluxcd.io/*",
    "kapp.k14s.io/*", "generate.kyverno.io/*", "app.kubernetes.io/created-by",
    "controller.cert-manager.io/*",
)
DEFAULT_STRIP_ANNOTATIONS = (
    "meta.helm.sh/*", "helm.sh/*", "argocd.argoproj.io/*", "kustomize.toolkit.fluxcd.io/*",
    "helm.toolkit.fluxcd.io/*", "kapp.k14s.io/*", "generate.kyverno.io/*", "cert-manager.io/*",
    "kubectl.kubernetes.io/last-applied-configuration", "deployment.kubernetes.io/*",
    "reflector.v1.k8s.emberstack.com/*", "replicator.v1.mittwald.de/*",
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RULE_FIELDS = ("ruleType", "selector", "namespace", "targetNamespaces", "namespaceSelector",
               "excludedNamespaces", "stripLabels", "stripAnnotations", "copyAnnotations")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Copyrator's options (environment variables, documented in docs/copyrator.md)."""

    # The operator-wide override: every rule may read every namespace, without consent on sources.
    allow_cross_namespace: bool = False
    # Period of the level-triggered sweep over the indexes (jittered ±20 %).
    resync_seconds: float = 60.0
    # Independent copy writes in flight at once for one trigger.
    write_concurrency: int = 16
    # Status and Synced events of a rule are written at most this often (a burst of namespace
    # events costs one status patch, not one per namespace).
    status_delay_seconds: float = 0.5

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(
            allow_cross_namespace=env_bool(env, "COPYRATOR_ALLOW_CROSS_NAMESPACE"),
            resync_seconds=env_float(env, "COPYRATOR_RESYNC_SECONDS", 60.0, minimum=1.0),
            write_concurrency=int(env_float(env, "COPYRATOR_WRITE_CONCURRENCY", 16, minimum=1)),
            status_delay_seconds=env_float(env, "COPYRATOR_STATUS_DELAY_SECONDS", 0.5),
        )


class RuleError(ValueError):
    """The rule cannot work as written; ``reason`` becomes the condition/event reason."""

    def __init__(self, message: str, reason: str = "Invalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Rule:
    namespace: str
    name: str
    uid: str
    generation: int
    rule_type: str  # "configmap" | "secret"
    selector: Mapping[str, str]
    source_namespaces: tuple[str, ...]
    target_namespaces: tuple[str, ...] | None = None
    namespace_selector: Mapping[str, Any] | None = None
    excluded_namespaces: tuple[str, ...] = ()
    strip_labels: tuple[str, ...] = ()
    strip_annotations: tuple[str, ...] = ()
    copy_annotations: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def kind(self) -> str:
        return RULE_TYPES[self.rule_type]

    @property
    def pull(self) -> bool:
        """Reads only other namespaces and names no targets: it copies into its own namespace."""
        return (self.namespace not in self.source_namespaces and self.target_namespaces is None
                and self.namespace_selector is None)


@dataclasses.dataclass(frozen=True)
class NamespaceInfo:
    name: str
    labels: Mapping[str, str]
    active: bool  # False while terminating


def namespace_info(body: Mapping[str, Any]) -> NamespaceInfo:
    meta = body.get("metadata") or {}
    return NamespaceInfo(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        active=not meta.get("deletionTimestamp") and (body.get("status") or {}).get("phase") != "Terminating",
    )


def _names(value: Any, field: str, allow_empty: bool = False) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or (not value and not allow_empty):
        raise RuleError(f"{field} must be a namespace name or a non-empty list of namespace names")
    for item in value:
        if not isinstance(item, str) or not _DNS_LABEL.match(item) or len(item) > 63:
            raise RuleError(f"{field}: {item!r} is not a valid namespace name")
    return tuple(dict.fromkeys(value))  # de-duplicated, order kept


def _patterns(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise RuleError(f"{field} must be a list of label/annotation keys (globs allowed)")
    return tuple(value)


def rule_fields(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The rule's settings: under ``spec`` (conventional) or at the top level (the article's form)."""
    spec = body.get("spec")
    if isinstance(spec, Mapping):
        return spec
    return {key: body[key] for key in RULE_FIELDS if key in body}


def parse_rule(body: Mapping[str, Any]) -> Rule:
    """Validate and normalise a rule body. Raises ``RuleError`` with a user-readable message."""
    meta = body.get("metadata", {})
    fields = rule_fields(body)
    if "spec" in body and any(key in body for key in RULE_FIELDS):
        raise RuleError("set the rule's fields either at the top level or under spec, not both")
    rule_type = fields.get("ruleType")
    if rule_type not in RULE_TYPES:
        raise RuleError(f"ruleType must be one of {sorted(RULE_TYPES)}, not {rule_type!r}")
    selector = fields.get("selector")
    if not isinstance(selector, Mapping) or not selector:
        raise RuleError("selector must map at least one label to a value")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise RuleError("selector values must be strings (quote \"true\")")
    if "namespace" not in fields:
        raise RuleError("namespace (the source namespace or a list of them) is required")
    sources = _names(fields["namespace"], "namespace")
    targets = fields.get("targetNamespaces")
    ns_selector = fields.get("namespaceSelector")
    if ns_selector is not None and not isinstance(ns_selector, Mapping):
        raise RuleError("namespaceSelector must be a label selector (matchLabels/matchExpressions)")
    copy_annotations = fields.get("copyAnnotations", False)
    if not isinstance(copy_annotations, bool):
        raise RuleError("copyAnnotations must be true or false")
    return Rule(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        rule_type=str(rule_type),
        selector=dict(selector),
        source_namespaces=sources,
        target_namespaces=None if targets is None else _names(targets, "targetNamespaces", allow_empty=True),
        namespace_selector=dict(ns_selector) if ns_selector else None,
        excluded_namespaces=_names(fields.get("excludedNamespaces") or [], "excludedNamespaces",
                                   allow_empty=True),
        strip_labels=_patterns(fields.get("stripLabels"), "stripLabels"),
        strip_annotations=_patterns(fields.get("stripAnnotations"), "stripAnnotations"),
        copy_annotations=copy_annotations,
    )


# --- Consent ----------------------------------------------------------------------------------


def consent(source: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The namespaces (names and globs) a source allows copies into; None: no consent given."""
    raw = ((source.get("metadata") or {}).get("annotations") or {}).get(ALLOWED_NAMESPACES_ANNOTATION)
    if raw is None:
        return None
    return tuple(item.strip() for item in str(raw).split(",") if item.strip())


def needs_consent(rule: Rule, source_namespace: str, settings: Settings) -> bool:
    """A rule reading its own namespace needs none; the operator-wide switch waives it."""
    return source_namespace != rule.namespace and not settings.allow_cross_namespace


def consent_allows(patterns: Iterable[str], namespace: str) -> bool:
    return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in patterns)


def allowed_into(rule: Rule, source: Mapping[str, Any], namespace: str, settings: Settings) -> bool:
    """Whether ``rule`` may put a copy of ``source`` into ``namespace`` (consent only)."""
    source_ns = (source.get("metadata") or {}).get("namespace", "")
    if not needs_consent(rule, source_ns, settings):
        return True
    patterns = consent(source)
    return patterns is not None and consent_allows(patterns, namespace)


def consent_problem(rule: Rule, source: Mapping[str, Any], targets: Iterable[str],
                    settings: Settings) -> str | None:
    """Why ``rule`` copies nothing of ``source`` (None when it copies it somewhere, or may)."""
    meta = source.get("metadata") or {}
    if not needs_consent(rule, meta.get("namespace", ""), settings):
        return None
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    patterns = consent(source)
    if patterns is None:
        return (f"source {where} has no {ALLOWED_NAMESPACES_ANNOTATION} annotation: a rule in namespace "
                f"{rule.namespace!r} may not copy it (the source's owner consents by listing the target "
                f"namespaces there; COPYRATOR_ALLOW_CROSS_NAMESPACE=true waives consent operator-wide)")
    targets = list(targets)
    if targets and not any(consent_allows(patterns, ns) for ns in targets):
        return (f"source {where} allows copies only into {','.join(patterns) or 'no namespace'} "
                f"({ALLOWED_NAMESPACES_ANNOTATION}), none of this rule's target namespaces")
    return None


# --- Targets ----------------------------------------------------------------------------------


def is_target(rule: Rule, ns: NamespaceInfo) -> bool:
    """Whether ``ns`` should hold this rule's copies (before consent): active, not a source."""
    if not ns.active or ns.name in rule.source_namespaces or ns.name in rule.excluded_namespaces:
        return False
    if rule.pull:
        return ns.name == rule.namespace
    if rule.target_namespaces is not None:
        if ns.name not in rule.target_namespaces:
            return False
    elif ns.name in SYSTEM_NAMESPACES:
        return False
    return matches_label_selector(ns.labels, rule.namespace_selector)


def target_namespaces(rule: Rule, namespaces: Iterable[NamespaceInfo]) -> list[str]:
    """Active namespaces that receive copies (before consent), sorted."""
    return sorted(ns.name for ns in namespaces if is_target(rule, ns))


# --- Sources ----------------------------------------------------------------------------------


def is_copy(obj: Mapping[str, Any]) -> bool:
    """Made by some Copyrator rule (never treated as a source: no copy chains)."""
    return RULE_UID_LABEL in ((obj.get("metadata") or {}).get("labels") or {})


def selects(rule: Rule, kind: str, obj: Mapping[str, Any]) -> bool:
    """The object matches the rule's type, source namespaces and selector (copies never do)."""
    meta = obj.get("metadata") or {}
    return (kind == rule.kind and meta.get("namespace") in rule.source_namespaces
            and not meta.get("deletionTimestamp") and not is_copy(obj)
            and matches_labels(meta.get("labels"), rule.selector))


def skip_reason(rule: Rule, obj: Mapping[str, Any]) -> str | None:
    """Why a selected object is never copied (None: it is a source)."""
    if rule.rule_type == "secret" and obj.get("type") in FORBIDDEN_SECRET_TYPES:
        return f"Secrets of type {obj.get('type')} are never copied"
    return None


def source_entry(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the sources index keeps of a selected object: what a copy is built from."""
    meta = obj.get("metadata") or {}
    entry: dict[str, Any] = {
        "kind": obj.get("kind"),
        "metadata": {key: meta[key] for key in ("name", "namespace", "uid", "resourceVersion", "labels",
                                                "annotations") if meta.get(key) is not None},
    }
    for key in ("data", "binaryData", "type", "immutable"):
        if obj.get(key) is not None:
            entry[key] = obj[key]
    return entry


def winner(rule: Rule, candidates: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """One source per name: the first source namespace in the rule's order that has it.
    ``candidates``: namespace -> the selected object of that name there."""
    for ns in rule.source_namespaces:
        obj = candidates.get(ns)
        if obj is not None and skip_reason(rule, obj) is None:
            return obj
    return None


# --- The copy ---------------------------------------------------------------------------------


def _glob_any(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


def copied_labels(rule: Rule, labels: Mapping[str, str] | None) -> dict[str, str]:
    strip = DEFAULT_STRIP_LABELS + rule.strip_labels
    return {k: v for k, v in (labels or {}).items() if not k.startswith(PREFIX) and not _glob_any(k, strip)}


def copied_annotations(rule: Rule, annotations: Mapping[str, str] | None) -> dict[str, str]:
    if not rule.copy_annotations:
        return {}
    strip = DEFAULT_STRIP_ANNOTATIONS + rule.strip_annotations
    return {k: v for k, v in (annotations or {}).items()
            if not k.startswith(PREFIX) and not _glob_any(k, strip)}


def content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What a copy holds of its source: data, labels, type, immutability, copied annotations."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    result: dict[str, Any] = {
        "data": dict(obj.get("data") or {}),
        "binaryData": dict(obj.get("binaryData") or {}),
        "labels": {k: v for k, v in (meta.get("labels") or {}).items() if not k.startswith(PREFIX)},
        "immutable": bool(obj.get("immutable")),
    }
    if annotations.get(ANNOTATIONS_COPIED) == "true":
        result["annotations"] = {k: v for k, v in annotations.items() if not k.startswith(PREFIX)}
    if obj.get("kind") == "Secret" or "type" in obj:
        result["type"] = obj.get("type") or "Opaque"
    return result


def content_hash(source_uid: str, copy: Mapping[str, Any]) -> str:
    """A digest of a copy's content (salted with the source uid); never the values themselves."""
    return stable_hash([source_uid, content(copy)])


def desired_copy(rule: Rule, source: Mapping[str, Any], target_namespace: str) -> dict[str, Any]:
    meta = source["metadata"]
    labels = copied_labels(rule, meta.get("labels"))
    labels[RULE_UID_LABEL] = rule.uid
    annotations = copied_annotations(rule, meta.get("annotations"))
    if rule.copy_annotations:
        annotations[ANNOTATIONS_COPIED] = "true"
    annotations.update({
        RULE_ANNOTATION: rule.key,
        SOURCE_ANNOTATION: f"{meta['namespace']}/{meta['name']}",
        SOURCE_UID_ANNOTATION: meta.get("uid", ""),
    })
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": rule.kind,
        "metadata": {"name": meta["name"], "namespace": target_namespace, "labels": labels,
                     "annotations": annotations},
    }
    for field in ("data", "binaryData"):
        if source.get(field):
            body[field] = dict(source[field])
    if rule.rule_type == "secret":
        body["type"] = source.get("type") or "Opaque"
    if source.get("immutable"):
        body["immutable"] = True
    annotations[HASH_ANNOTATION] = content_hash(meta.get("uid", ""), body)
    return body


@dataclasses.dataclass(frozen=True)
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
        rule_uid=str((meta.get("labels") or {}).get(RULE_UID_LABEL, "")),
        source=str(annotations.get(SOURCE_ANNOTATION, "")),
        recorded_hash=str(annotations.get(HASH_ANNOTATION, "")),
        actual_hash=content_hash(str(annotations.get(SOURCE_UID_ANNOTATION, "")),
                                 {**obj, "kind": kind}),
        immutable=bool(obj.get("immutable")),
        type=(obj.get("type") or "Opaque") if kind == "Secret" else None,
        annotations_copied=annotations.get(ANNOTATIONS_COPIED) == "true",
        rule=str(annotations.get(RULE_ANNOTATION, "")),
    )


def in_sync(view: CopyView, desired: Mapping[str, Any]) -> bool:
    """Compare before writing: an idle cluster sees no writes."""
    annotations = desired["metadata"]["annotations"]
    return (view.actual_hash == annotations[HASH_ANNOTATION] == view.recorded_hash
            and view.source == annotations[SOURCE_ANNOTATION])


class Action(enum.Enum):
    NONE = "none"
    CREATE = "create"
    PATCH = "patch"
    RECREATE = "recreate"  # a Secret's type or an immutable copy cannot change in place
    DELETE = "delete"
    CONFLICT = "conflict"  # a foreign object holds the name: left untouched


def decide(rule_uid: str, desired: Mapping[str, Any] | None, view: CopyView | None,
           foreign: bool = False) -> Action:
    """The one write (if any) that makes a target namespace hold what it should.
    ``view``: the copy the indexes know at that name (any rule's), None when none; ``foreign``:
    a 409 showed an object that is nobody's copy in the way."""
    if view is not None and view.rule_uid != rule_uid:
        return Action.CONFLICT if desired is not None else Action.NONE
    if desired is None:
        return Action.DELETE if view is not None else Action.NONE
    if view is None:
        return Action.CONFLICT if foreign else Action.CREATE
    if in_sync(view, desired):
        return Action.NONE
    if view.immutable or (desired.get("kind") == "Secret" and view.type != desired.get("type")):
        return Action.RECREATE
    return Action.PATCH


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


# --- Status ------------------------------------------------------------------------------------

MAX_LISTED = 10  # conflicts/refusals named in status; the counts are always exact


@dataclasses.dataclass
class Tally:
    """One rule's copies as the indexes see them (for its status)."""

    sources: int = 0
    desired: int = 0
    copied: int = 0
    skipped: int = 0
    withheld: int = 0  # (source, target) pairs the source's consent does not allow
    targets: int = 0
    conflicts: list[str] = dataclasses.field(default_factory=list)
    refusals: list[str] = dataclasses.field(default_factory=list)  # consent problems, per source
    failed: int = 0
    rejected: list[str] = dataclasses.field(default_factory=list)  # copies the API server refuses (why)


def build_status(rule: Rule, previous: Mapping[str, Any] | None, tally: Tally | None = None,
                 problem: RuleError | None = None, now: str | None = None) -> dict[str, Any]:
    """The rule's status. Pure: the same inputs give the same dict, so the caller writes only when
    something changed."""
    previous = previous or {}
    conds = previous.get("conditions") or []
    gen = rule.generation
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "ruleType": rule.rule_type,
        "sourceNamespaces": ",".join(rule.source_namespaces),
    }
    if problem is not None:
        if problem.reason == "Refused":
            conds = set_condition(conds, "Refused", True, "Refused", str(problem), gen, now)
        # The rule cannot work as written: only an edit helps (kstatus: Failed).
        conds = kstatus_conditions(conds, ready=False, stalled=True, reason=problem.reason, message=str(problem),
                                   observed_generation=gen, now=now)
        status["conditions"] = conds
        for key in ("sources", "desired", "copied", "conflicted", "skipped", "conflicts", "withheld", "refused"):
            if key in previous:
                status[key] = previous[key]
        return status
    assert tally is not None
    conflicts = sorted(tally.conflicts)
    status.update({
        "sources": tally.sources,
        "desired": tally.desired,
        "copied": tally.copied,
        "conflicted": len(conflicts),
        "skipped": tally.skipped,
        "withheld": tally.withheld,
        "conflicts": conflicts[:MAX_LISTED],
        "refused": sorted(tally.refusals)[:MAX_LISTED],
    })
    if tally.refusals:
        conds = set_condition(conds, "Refused", True, "ConsentMissing",
                              f"{len(tally.refusals)} source(s) not copied: " + "; ".join(status["refused"]),
                              gen, now)
    else:
        conds = set_condition(conds, "Refused", False, "Allowed", "", gen, now)
    if conflicts:
        conds = set_condition(conds, "Conflict", True, "ForeignObject",
                              f"{len(conflicts)} target(s) hold an object this rule does not own "
                              f"(left untouched): {', '.join(status['conflicts'])}", gen, now)
    else:
        conds = set_condition(conds, "Conflict", False, "NoConflict", "", gen, now)
    ready, stalled, reason, message = readiness(tally, status)
    status["conditions"] = kstatus_conditions(conds, ready=ready, stalled=stalled, reason=reason, message=message,
                                              observed_generation=gen, now=now)
    return status


def readiness(tally: Tally, status: Mapping[str, Any]) -> tuple[bool, bool, str, str]:
    """(ready, stalled, reason, message) of a rule: Ready only when every wanted copy is in sync;
    Stalled when a person must act (a source's owner must consent, an object in the way must go, the
    API server refuses a copy of a source);
    else work is under way (copies being made, failed writes retried)."""
    if tally.refusals:
        return False, True, "Refused", (f"{len(tally.refusals)} source(s) not copied without their owner's "
                                               f"consent: " + "; ".join(status["refused"]))
    if tally.conflicts:
        return False, True, "ForeignObject", (f"{len(tally.conflicts)} target(s) hold an object this rule does not "
                                              f"own (left untouched; delete or rename it): "
                                              f"{', '.join(status['conflicts'])}")
    if tally.rejected:
        return False, True, "CopyRefused", (f"the API server refuses {len(tally.rejected)} copy(ies), not retried "
                                            f"until the source changes: {'; '.join(sorted(tally.rejected)[:10])}")
    if tally.failed:
        return False, False, "SyncFailed", f"{tally.failed} copy operation(s) failed; retrying"
    if tally.copied < tally.desired:
        return False, False, "Syncing", f"{tally.copied} of {tally.desired} copies in sync; copying the rest"
    withheld = f"; {tally.withheld} withheld by their sources' consent" if tally.withheld else ""
    return True, False, "Synced", f"all {tally.copied} copies in sync across {tally.targets} namespace(s){withheld}"


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    previous = previous or {}
    return any(previous.get(key) != value for key, value in new.items())


def rule_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the rules index keeps of a rule: its fields, identity and status (small)."""
    meta = body.get("metadata") or {}
    snap: dict[str, Any] = {
        "apiVersion": body.get("apiVersion", API_VERSION), "kind": body.get("kind", KIND),
        "metadata": {key: meta[key] for key in ("name", "namespace", "uid", "generation", "resourceVersion",
                                                "deletionTimestamp") if meta.get(key) is not None},
        "status": {k: v for k, v in (body.get("status") or {}).items() if k != "kopf"},
    }
    if "spec" in body:
        snap["spec"] = dict(body["spec"]) if isinstance(body["spec"], Mapping) else body["spec"]
    for key in RULE_FIELDS:
        if key in body:
            snap[key] = body[key]
    return snap


# --- Orphans: copies whose rule is gone ----------------------------------------------------------


def orphan_suspects(copies: Mapping[str, Iterable[CopyView]], live_rule_uids: Collection[str]) -> dict[str, str]:
    """Rule uid -> the rule's "ns/name" (from its copies' annotation; "" when none says), for every
    rule uid that copies carry but no live rule has. Suspects only: a rule outside this process's view
    (another shard's namespace, an unwatched one) is alive, so a read must confirm it gone."""
    suspects: dict[str, str] = {}
    for rule_uid, views in copies.items():
        if rule_uid and rule_uid not in live_rule_uids:
            suspects[rule_uid] = next((v.rule for v in views if split_rule_key(v.rule)), "")
    return suspects


def split_rule_key(key: str) -> tuple[str, str] | None:
    """ "ns/name" -> (ns, name); None when it is not one."""
    namespace, sep, name = key.partition("/")
    if not sep or not _DNS_LABEL.match(namespace) or not name or "/" in name:
        return None
    return namespace, name


def rule_gone(rule_uid: str, listed: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the rule with this uid is gone, from a listing of its namespace by its name: absent
    (a successor of the same name has another uid), or being deleted."""
    for obj in listed:
        meta = obj.get("metadata") or {}
        if meta.get("uid") == rule_uid:
            return bool(meta.get("deletionTimestamp"))
    return True
