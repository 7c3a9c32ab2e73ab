"""Copyrator: pure decision logic (no API calls).

A ``CopyratorRule`` names a resource type (ConfigMap or Secret), a label selector and one or more
source namespaces. Every matching object is copied into each target namespace. This module decides
*what* the cluster should look like (the plan); ``copyrator_api`` makes it so.

Objects are plain dicts as the API returns them (camelCase keys).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kopf_operators.common import DOMAIN, set_condition, stable_hash

GROUP = "flant.com"
VERSION = "v1"
PLURAL = "copyrators"
KIND = "CopyratorRule"

PREFIX = f"copyrator.{DOMAIN}/"
# The marker: the uid of the rule that owns a copy. Only objects carrying *this rule's* uid here
# are ever updated or deleted by that rule.
RULE_UID_LABEL = PREFIX + "rule-uid"
RULE_ANNOTATION = PREFIX + "rule"  # "<namespace>/<name>" of the rule
SOURCE_ANNOTATION = PREFIX + "source"  # "<namespace>/<name>" of the source
SOURCE_UID_ANNOTATION = PREFIX + "source-uid"
HASH_ANNOTATION = PREFIX + "content-hash"
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

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RULE_FIELDS = ("ruleType", "selector", "namespace", "targetNamespaces", "namespaceSelector",
               "excludedNamespaces")


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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def kind(self) -> str:
        return RULE_TYPES[self.rule_type]


@dataclasses.dataclass(frozen=True)
class NamespaceInfo:
    name: str
    labels: Mapping[str, str]
    active: bool  # False while terminating


def _names(value: Any, field: str, allow_empty: bool = False) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or (not value and not allow_empty):
        raise RuleError(f"{field} must be a namespace name or a non-empty list of namespace names")
    for item in value:
        if not isinstance(item, str) or not _DNS_LABEL.match(item) or len(item) > 63:
            raise RuleError(f"{field}: {item!r} is not a valid namespace name")
    return tuple(dict.fromkeys(value))  # de-duplicated, order kept


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
    )


def refusal(rule: Rule, allow_cross_namespace: bool) -> str | None:
    """Why the rule may not run at all (security), or None. A namespaced rule reads only its own
    namespace unless the operator was started with COPYRATOR_ALLOW_CROSS_NAMESPACE=true."""
    foreign = [ns for ns in rule.source_namespaces if ns != rule.namespace]
    if foreign and not allow_cross_namespace:
        return (f"the rule lives in namespace {rule.namespace!r} but reads sources from "
                f"{', '.join(repr(ns) for ns in foreign)}; cross-namespace rules are disabled "
                f"(start the operator with COPYRATOR_ALLOW_CROSS_NAMESPACE=true to allow them)")
    return None


def label_selector_string(selector: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def matches_labels(labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    labels = labels or {}
    return all(labels.get(key) == value for key, value in selector.items())


def matches_label_selector(labels: Mapping[str, str] | None, selector: Mapping[str, Any] | None) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels AND every matchExpression)."""
    if not selector:
        return True
    labels = labels or {}
    if not matches_labels(labels, selector.get("matchLabels") or {}):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def is_copy(obj: Mapping[str, Any]) -> bool:
    """Made by some Copyrator rule (never treated as a source: no copy chains)."""
    return RULE_UID_LABEL in (obj.get("metadata", {}).get("labels") or {})


def owned_by(obj: Mapping[str, Any], rule: Rule) -> bool:
    return (obj.get("metadata", {}).get("labels") or {}).get(RULE_UID_LABEL) == rule.uid


def skip_reason(rule: Rule, obj: Mapping[str, Any]) -> str | None:
    """Why a selector-matching object is not copied (None: it is a source)."""
    if is_copy(obj):
        return "it is a copy made by a Copyrator rule"
    if rule.rule_type == "secret" and obj.get("type") in FORBIDDEN_SECRET_TYPES:
        return f"Secrets of type {obj.get('type')} are never copied"
    return None


def is_source(rule: Rule, obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata", {})
    return (meta.get("namespace") in rule.source_namespaces
            and not meta.get("deletionTimestamp")
            and matches_labels(meta.get("labels"), rule.selector)
            and skip_reason(rule, obj) is None)


def target_namespaces(rule: Rule, namespaces: Iterable[NamespaceInfo]) -> list[str]:
    """Active namespaces that receive copies, sorted."""
    explicit = set(rule.target_namespaces) if rule.target_namespaces is not None else None
    result = []
    for ns in namespaces:
        if not ns.active or ns.name in rule.source_namespaces or ns.name in rule.excluded_namespaces:
            continue
        if explicit is not None and ns.name not in explicit:
            continue
        if explicit is None and ns.name in SYSTEM_NAMESPACES:
            continue
        if not matches_label_selector(ns.labels, rule.namespace_selector):
            continue
        result.append(ns.name)
    return sorted(result)


def _own_labels_removed(labels: Mapping[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if not k.startswith(PREFIX)}


def content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What a copy reproduces from its source: data, labels, type, immutability."""
    result: dict[str, Any] = {
        "data": dict(obj.get("data") or {}),
        "binaryData": dict(obj.get("binaryData") or {}),
        "labels": _own_labels_removed(obj.get("metadata", {}).get("labels")),
        "immutable": bool(obj.get("immutable")),
    }
    if obj.get("kind") == "Secret" or "type" in obj:
        result["type"] = obj.get("type") or "Opaque"
    return result


def content_hash(source_uid: str, obj: Mapping[str, Any]) -> str:
    """A digest of the content (salted with the source uid); never the values themselves."""
    return stable_hash([source_uid, content(obj)])


def desired_copy(rule: Rule, source: Mapping[str, Any], target_namespace: str) -> dict[str, Any]:
    meta = source["metadata"]
    labels = _own_labels_removed(meta.get("labels"))
    labels[RULE_UID_LABEL] = rule.uid
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": rule.kind,
        "metadata": {
            "name": meta["name"],
            "namespace": target_namespace,
            "labels": labels,
            "annotations": {
                RULE_ANNOTATION: rule.key,
                SOURCE_ANNOTATION: f"{meta['namespace']}/{meta['name']}",
                SOURCE_UID_ANNOTATION: meta.get("uid", ""),
                HASH_ANNOTATION: content_hash(meta.get("uid", ""), source),
            },
        },
    }
    for field in ("data", "binaryData"):
        if source.get(field):
            body[field] = dict(source[field])
    if rule.rule_type == "secret":
        body["type"] = source.get("type") or "Opaque"
    if source.get("immutable"):
        body["immutable"] = True
    return body


def in_sync(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Compare before writing: an idle cluster sees no writes."""
    if content(existing) != content(desired):
        return False
    if (existing.get("metadata", {}).get("labels") or {}) != desired["metadata"]["labels"]:
        return False
    annotations = existing.get("metadata", {}).get("annotations") or {}
    return all(annotations.get(k) == v for k, v in desired["metadata"]["annotations"].items())


def drifted(obj: Mapping[str, Any]) -> bool:
    """A copy whose content no longer matches its recorded hash (edited by hand)."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    recorded = annotations.get(HASH_ANNOTATION)
    return recorded is None or recorded != content_hash(annotations.get(SOURCE_UID_ANNOTATION, ""), obj)


def needs_recreate(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """A Secret's type and an immutable object's content cannot be updated in place."""
    if existing.get("immutable"):
        return True
    return desired.get("kind") == "Secret" and (existing.get("type") or "Opaque") != desired.get("type")


@dataclasses.dataclass(frozen=True)
class Ref:
    namespace: str
    name: str
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def ref(obj: Mapping[str, Any]) -> Ref:
    meta = obj.get("metadata", {})
    return Ref(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""))


@dataclasses.dataclass
class Plan:
    creates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # (existing, desired, recreate?)
    updates: list[tuple[dict[str, Any], dict[str, Any], bool]] = dataclasses.field(default_factory=list)
    deletes: list[Ref] = dataclasses.field(default_factory=list)
    conflicts: list[Ref] = dataclasses.field(default_factory=list)  # foreign objects in the way
    unchanged: int = 0
    sources: list[Ref] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)  # "ns/name: why" (never values)
    targets: list[str] = dataclasses.field(default_factory=list)

    @property
    def desired(self) -> int:
        return len(self.creates) + len(self.updates) + self.unchanged + len(self.conflicts)

    @property
    def writes(self) -> int:
        return len(self.creates) + len(self.updates) + len(self.deletes)


def plan(
    rule: Rule,
    candidates: Sequence[Mapping[str, Any]],
    namespaces: Iterable[NamespaceInfo],
    existing: Sequence[Mapping[str, Any]],
) -> Plan:
    """Decide creates/updates/deletes.

    ``candidates``: selector-matching objects listed in the source namespaces.
    ``existing``: every object of the kind that may be in the way or ours: same-named objects in
    the targets and all objects carrying this rule's marker.
    """
    namespaces = list(namespaces)
    terminating = {ns.name for ns in namespaces if not ns.active}
    result = Plan(targets=target_namespaces(rule, namespaces))

    # One source per name: the first source namespace in the rule's order wins a name clash.
    by_name: dict[str, Mapping[str, Any]] = {}
    order = {ns: i for i, ns in enumerate(rule.source_namespaces)}
    for obj in sorted(candidates, key=lambda o: (order.get(o["metadata"].get("namespace"), 1 << 30),
                                                 o["metadata"]["name"])):
        if not is_source(rule, obj):
            why = skip_reason(rule, obj)
            if why and not is_copy(obj):
                result.skipped.append(f"{ref(obj)}: {why}")
            continue
        by_name.setdefault(obj["metadata"]["name"], obj)
        result.sources.append(ref(obj))

    at: dict[tuple[str, str], Mapping[str, Any]] = {}
    for obj in existing:
        meta = obj.get("metadata", {})
        at[(meta.get("namespace", ""), meta.get("name", ""))] = obj

    wanted: set[tuple[str, str]] = set()
    for name, source in sorted(by_name.items()):
        for ns in result.targets:
            wanted.add((ns, name))
            desired = desired_copy(rule, source, ns)
            current = at.get((ns, name))
            if current is None:
                result.creates.append(desired)
            elif not owned_by(current, rule):
                result.conflicts.append(ref(current))
            elif in_sync(current, desired):
                result.unchanged += 1
            else:
                result.updates.append((dict(current), desired, needs_recreate(current, desired)))

    for (ns, name), obj in sorted(at.items()):
        if owned_by(obj, rule) and (ns, name) not in wanted and ns not in terminating:
            result.deletes.append(ref(obj))
    return result


# --- Status ------------------------------------------------------------------------------------

MAX_LISTED = 10  # conflicts named in status; the count is always exact


def build_status(
    rule: Rule,
    previous: Mapping[str, Any] | None,
    result: Plan | None = None,
    failed: int = 0,
    problem: RuleError | None = None,
    now: str | None = None,
) -> dict[str, Any]:
    """The rule's status after a reconcile. Pure: the same inputs give the same dict, so the caller
    writes only when something changed."""
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
        conds = set_condition(conds, "Ready", False, problem.reason, str(problem), gen, now)
        status["conditions"] = conds
        for key in ("sources", "desired", "copied", "conflicted", "skipped", "conflicts"):
            if key in previous:
                status[key] = previous[key]
        return status
    assert result is not None
    copied = result.unchanged + len(result.creates) + len(result.updates) - failed
    status.update({
        "sources": len(result.sources),
        "desired": result.desired,
        "copied": max(copied, 0),
        "conflicted": len(result.conflicts),
        "skipped": len(result.skipped),
        "conflicts": [str(r) for r in result.conflicts[:MAX_LISTED]],
    })
    conds = set_condition(conds, "Refused", False, "Allowed", "", gen, now)
    if result.conflicts:
        conds = set_condition(conds, "Conflict", True, "ForeignObject",
                              f"{len(result.conflicts)} target(s) hold an object this rule does not own "
                              f"(left untouched): {', '.join(status['conflicts'])}", gen, now)
    else:
        conds = set_condition(conds, "Conflict", False, "NoConflict", "", gen, now)
    if failed:
        conds = set_condition(conds, "Ready", False, "SyncFailed",
                              f"{failed} copy operation(s) failed; retrying", gen, now)
    else:
        conds = set_condition(conds, "Ready", True, "Synced",
                              f"{status['copied']} of {status['desired']} copies in sync across "
                              f"{len(result.targets)} namespace(s)", gen, now)
    status["conditions"] = conds
    return status


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    previous = previous or {}
    return any(previous.get(key) != value for key, value in new.items())


def index_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the in-memory rule index keeps to route ConfigMap/Secret events to rules (small)."""
    try:
        rule = parse_rule(body)
    except RuleError:
        return None
    return {"uid": rule.uid, "ruleType": rule.rule_type, "selector": dict(rule.selector),
            "sources": list(rule.source_namespaces)}


def routes_to(entry: Mapping[str, Any], rule_type: str, obj: Mapping[str, Any],
              known_sources: Iterable[str] = ()) -> bool:
    """Whether an event on ``obj`` may change what the indexed rule should do."""
    if entry["ruleType"] != rule_type:
        return False
    meta = obj.get("metadata", {})
    labels = meta.get("labels") or {}
    if labels.get(RULE_UID_LABEL) == entry["uid"]:
        return True  # one of its copies: deleted or edited (the caller checks drift)
    if meta.get("namespace") not in entry["sources"]:
        return False
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    return matches_labels(labels, entry["selector"]) or name in set(known_sources)
