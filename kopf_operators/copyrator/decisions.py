"""Copyrator: pure decisions (no API calls).

A ``CopyratorRule`` names a resource type (ConfigMap or Secret), a label selector and one or more
source namespaces. Every matching object is copied into each target namespace. This module decides,
for one copy at a time, what the cluster should hold there and which single write gets it there;
``copyrator.controller`` feeds it from indexes and applies the answer.

Consent: a rule that reads a namespace other than its own copies a source only when the source
carries ``copyrator.kopf-operators.dev/allowed-namespaces`` (names and globs), and only into the
namespaces listed there, unless the operator runs with COPYRATOR_ALLOW_CROSS_NAMESPACE=true.

Target consent: a push (annotations on a source, no rule) writes into a namespace only when that
namespace accepts copies from the source's namespace (``copyrator.kopf-operators.dev/accept-from`` on
the Namespace, names and globs) or the operator trusts the source's namespace cluster-wide
(COPYRATOR_TRUSTED_NAMESPACES); the system namespaces and the operator's own never receive one unless
COPYRATOR_OPEN_NAMESPACES names them. COPYRATOR_RULES_NEED_TARGET_CONSENT applies the same to rules.

Objects are plain dicts as the API returns them (camelCase keys).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from kopf_operators.core.conventions import (
    DOMAIN,
    env_bool,
    env_float,
    env_list,
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
# On a source: push it, with no rule, into these namespaces (names and globs, comma-separated) and/or
# into the namespaces matching this label selector ("team=payments,tier=web").
PUSH_TO_ANNOTATION = PREFIX + "push-to"
PUSH_TO_MATCHING_ANNOTATION = PREFIX + "push-to-matching"
# On a copy made by a push annotation (no rule): its rule-uid label is then the source's uid.
PUSHED_ANNOTATION = PREFIX + "pushed"
# On a Namespace: the target's consent, the namespaces whose pushes (and, when rules need it too,
# rules) may write copies into it ("team-a,platform-*"; "*": anyone's).
ACCEPT_FROM_ANNOTATION = PREFIX + "accept-from"
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
# ConfigMap and Secret names: DNS subdomains (RFC 1123), at most 253 characters.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_NAME = 253
# ConfigMap/Secret data keys.
_DATA_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
RULE_FIELDS = ("ruleType", "selector", "namespace", "targetNamespaces", "namespaceSelector",
               "excludedNamespaces", "stripLabels", "stripAnnotations", "copyAnnotations", "target",
               "keys", "renameKeys")


@dataclasses.dataclass(frozen=True)
class Options:
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
    # Push annotations act at all (false: no push writes or deletes anything; copies already pushed stay).
    push: bool = True
    # Source namespaces (names and globs) whose pushes every namespace accepts (the platform's own).
    trusted_namespaces: tuple[str, ...] = ()
    # System namespaces, or the operator's own, that may receive pushes (names): closed otherwise.
    open_namespaces: tuple[str, ...] = ()
    # Rules need their targets' consent too (for clusters that let tenants write rules).
    rules_need_target_consent: bool = False
    # The operator's own namespace (closed to pushes like the system namespaces).
    operator_namespace: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str], operator_namespace: str = "") -> Options:
        return cls(
            push=env_bool(env, "COPYRATOR_PUSH", True),
            trusted_namespaces=env_list(env, "COPYRATOR_TRUSTED_NAMESPACES"),
            open_namespaces=env_list(env, "COPYRATOR_OPEN_NAMESPACES"),
            rules_need_target_consent=env_bool(env, "COPYRATOR_RULES_NEED_TARGET_CONSENT"),
            operator_namespace=operator_namespace,
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
    created: str = ""  # creationTimestamp: of two rules that want one target name, the older gets it
    target_name: str | None = None  # every copy under this name (one source)
    name_prefix: str = ""
    name_suffix: str = ""
    keys: tuple[str, ...] | None = None  # copy only these source keys (None: all)
    rename_keys: Mapping[str, str] = dataclasses.field(default_factory=dict)  # source key -> copy key
    # A push: the source's own annotations, no CopyratorRule (name and namespace are the source's,
    # uid the source's uid); target_namespaces may hold globs then.
    push: bool = False

    @property
    def key(self) -> str:
        return f"push {self.namespace}/{self.name}" if self.push else f"{self.namespace}/{self.name}"

    @property
    def claim(self) -> tuple[str, str, str, str]:
        """Order of two claims on one target name: the older rule first (then by name)."""
        return (self.created, self.namespace, self.name, self.uid)

    @property
    def kind(self) -> str:
        return RULE_TYPES[self.rule_type]

    @property
    def pull(self) -> bool:
        """Reads only other namespaces and names no targets: it copies into its own namespace."""
        return (self.namespace not in self.source_namespaces and self.target_namespaces is None
                and self.namespace_selector is None)


@dataclasses.dataclass(frozen=True, slots=True)
class NamespaceInfo:
    name: str
    labels: Mapping[str, str]
    active: bool  # False while terminating
    # The namespaces it accepts copies from (ACCEPT_FROM_ANNOTATION; None: it gives no consent).
    accept_from: tuple[str, ...] | None = None


def namespace_info(body: Mapping[str, Any]) -> NamespaceInfo:
    meta = body.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ACCEPT_FROM_ANNOTATION)
    return NamespaceInfo(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        active=not meta.get("deletionTimestamp") and (body.get("status") or {}).get("phase") != "Terminating",
        accept_from=None if raw is None else tuple(i.strip() for i in str(raw).split(",") if i.strip()),
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


def _target(value: Any) -> tuple[str | None, str, str]:
    """(name, prefix, suffix) of ``target`` (the schema checks the characters; this the rest)."""
    if value is None:
        return None, "", ""
    if not isinstance(value, Mapping):
        raise RuleError("target must be a mapping with name, or namePrefix and/or nameSuffix")
    name, prefix, suffix = value.get("name"), value.get("namePrefix") or "", value.get("nameSuffix") or ""
    if not all(isinstance(v, str) for v in (prefix, suffix)) or not (name is None or isinstance(name, str)):
        raise RuleError("target.name, target.namePrefix and target.nameSuffix must be strings")
    if name is not None and (prefix or suffix):
        raise RuleError("target.name renames the copy outright: it cannot be combined with namePrefix/nameSuffix")
    if name is not None and (len(name) > MAX_NAME or not _DNS_SUBDOMAIN.match(name)):
        raise RuleError(f"target.name {name!r} is not a valid object name (lower-case RFC 1123 subdomain)")
    if (prefix or suffix) and not _DNS_SUBDOMAIN.match(f"{prefix}x{suffix}"):
        raise RuleError(f"target.namePrefix {prefix!r} / nameSuffix {suffix!r} cannot make a valid object name")
    return name, prefix, suffix


def _keys(value: Any, renames: Any) -> tuple[tuple[str, ...] | None, dict[str, str]]:
    if value is not None and (not isinstance(value, list) or not all(isinstance(k, str) for k in value)):
        raise RuleError("keys must be a list of data keys")
    if renames is not None and (not isinstance(renames, Mapping)
                                or not all(isinstance(v, str) for v in renames.values())):
        raise RuleError("renameKeys must map a source key to the key the copy holds it under")
    renames = dict(renames or {})
    for key in [*(value or ()), *renames, *renames.values()]:
        if not _DATA_KEY.match(key) or len(key) > MAX_NAME:
            raise RuleError(f"{key!r} is not a valid data key (letters, digits, '-', '_', '.')")
    problem = key_collision(tuple(value) if value is not None else None, renames, None)
    if problem:
        raise RuleError(problem)
    return (None if value is None else tuple(dict.fromkeys(value))), renames


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
    target_name, prefix, suffix = _target(fields.get("target"))
    keys, renames = _keys(fields.get("keys"), fields.get("renameKeys"))
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
        created=str(meta.get("creationTimestamp") or ""),
        target_name=target_name,
        name_prefix=prefix,
        name_suffix=suffix,
        keys=keys,
        rename_keys=renames,
    )


# --- Renaming: copy names and keys ----------------------------------------------------------------


def copy_name(rule: Rule, source_name: str) -> str:
    """The name a copy of ``source_name`` gets from this rule."""
    if rule.target_name is not None:
        return rule.target_name
    return f"{rule.name_prefix}{source_name}{rule.name_suffix}"


def source_names_for(rule: Rule, name: str, selected: Iterable[str]) -> list[str]:
    """The selected source names whose copy would be called ``name`` (sorted)."""
    return sorted({source for source in selected if copy_name(rule, source) == name})


def key_collision(keys: tuple[str, ...] | None, renames: Mapping[str, str],
                  present: Iterable[str] | None) -> str | None:
    """Why two source keys would land on one copy key (None: they do not). ``present``: the source's
    keys (None: only the rule's own lists are checked)."""
    if present is None:
        kept = set(keys) if keys is not None else set(renames)
    else:
        kept = set(present) if keys is None else set(keys) & set(present)
    landing: dict[str, str] = {}
    for key in sorted(kept):
        to = renames.get(key, key)
        if to in landing:
            return (f"keys {landing[to]!r} and {key!r} would both be copied as {to!r} "
                    f"(renameKeys); rename one of them elsewhere or leave one out of keys")
        landing[to] = key
    return None


def copy_problem(rule: Rule, source: Mapping[str, Any]) -> str | None:
    """Why this rule cannot copy ``source`` as configured (None: it can): the resulting name is not
    a valid object name, or two keys would land on one."""
    meta = source.get("metadata") or {}
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    name = copy_name(rule, str(meta.get("name", "")))
    if len(name) > MAX_NAME:
        return f"source {where}: the copy's name would be {len(name)} characters long (at most {MAX_NAME})"
    present = [*(source.get("data") or {}), *(source.get("binaryData") or {})]
    collision = key_collision(rule.keys, rule.rename_keys, present)
    return f"source {where}: {collision}" if collision else None


def copied_data(rule: Rule, data: Mapping[str, Any] | None) -> dict[str, Any]:
    """The source's data map as the copy holds it: only ``keys`` (when set), renamed per ``renameKeys``."""
    return {rule.rename_keys.get(key, key): value for key, value in (data or {}).items()
            if rule.keys is None or key in rule.keys}


# --- Push: a source's own annotations, no rule --------------------------------------------------

_GLOB = re.compile(r"^[-a-z0-9*?]+$")


def push_rule(source: Mapping[str, Any]) -> Rule | RuleError | None:
    """The implicit rule of a source that carries a push annotation (None: it carries none). It acts as
    a rule in the source's own namespace: it needs no consent, and its targets are the namespaces
    ``push-to`` names (names and globs; kube-system & co. only by name) and/or those matching
    ``push-to-matching`` (``key=value`` pairs, all of them)."""
    meta = source.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    to, matching = annotations.get(PUSH_TO_ANNOTATION), annotations.get(PUSH_TO_MATCHING_ANNOTATION)
    if to is None and matching is None:
        return None
    kind = str(source.get("kind") or "")
    rule_type = next((t for t, k in RULE_TYPES.items() if k == kind), "configmap")
    targets = None
    if to is not None:
        targets = tuple(dict.fromkeys(item.strip() for item in str(to).split(",") if item.strip()))
        bad = [item for item in targets if not _GLOB.match(item)]
        if bad or not targets:
            return RuleError(f"{PUSH_TO_ANNOTATION}: {', '.join(bad) or 'empty'}: expected namespace names or "
                             f"globs, comma-separated (\"team-a,team-*\")")
    selector = None
    if matching is not None:
        labels: dict[str, str] = {}
        for pair in (item.strip() for item in str(matching).split(",")):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                return RuleError(f"{PUSH_TO_MATCHING_ANNOTATION}: {pair!r}: expected key=value pairs, "
                                 f"comma-separated (\"team=payments,tier=web\")")
            labels[key.strip()] = value.strip()
        selector = {"matchLabels": labels}
    return Rule(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                uid=str(meta.get("uid", "")), generation=0, rule_type=rule_type, selector={},
                source_namespaces=(str(meta.get("namespace", "")),), target_namespaces=targets,
                namespace_selector=selector, created=str(meta.get("creationTimestamp") or ""), push=True)


# --- Consent ----------------------------------------------------------------------------------


def consent(source: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The namespaces (names and globs) a source allows copies into; None: no consent given."""
    raw = ((source.get("metadata") or {}).get("annotations") or {}).get(ALLOWED_NAMESPACES_ANNOTATION)
    if raw is None:
        return None
    return tuple(item.strip() for item in str(raw).split(",") if item.strip())


def needs_consent(rule: Rule, source_namespace: str, settings: Options) -> bool:
    """A rule reading its own namespace needs none; the operator-wide switch waives it."""
    return source_namespace != rule.namespace and not settings.allow_cross_namespace


def consent_allows(patterns: Iterable[str], namespace: str) -> bool:
    return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in patterns)


def allowed_into(rule: Rule, source: Mapping[str, Any], namespace: str, settings: Options) -> bool:
    """Whether ``rule`` may put a copy of ``source`` into ``namespace`` (consent only)."""
    source_ns = (source.get("metadata") or {}).get("namespace", "")
    if not needs_consent(rule, source_ns, settings):
        return True
    patterns = consent(source)
    return patterns is not None and consent_allows(patterns, namespace)


def consent_problem(rule: Rule, source: Mapping[str, Any], targets: Iterable[str],
                    settings: Options) -> str | None:
    """Why ``rule`` copies nothing of ``source`` (None when it copies it somewhere, or may)."""
    targets = list(targets)
    patterns = consent(source) or ()
    allowed = sum(1 for ns in targets if consent_allows(patterns, ns))
    return consent_refusal(rule, source, settings, targets=len(targets), allowed=allowed)


def consent_refusal(rule: Rule, source: Mapping[str, Any], settings: Options, *, targets: int,
                    allowed: int) -> str | None:
    """``consent_problem`` from counts: ``targets`` target namespaces, ``allowed`` of them covered by
    the source's consent (the status counts them as places change, not namespace by namespace)."""
    meta = source.get("metadata") or {}
    if not needs_consent(rule, meta.get("namespace", ""), settings):
        return None
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    patterns = consent(source)
    if patterns is None:
        return (f"source {where} has no {ALLOWED_NAMESPACES_ANNOTATION} annotation: a rule in namespace "
                f"{rule.namespace!r} may not copy it (the source's owner consents by listing the target "
                f"namespaces there; COPYRATOR_ALLOW_CROSS_NAMESPACE=true waives consent operator-wide)")
    if targets and not allowed:
        return (f"source {where} allows copies only into {','.join(patterns) or 'no namespace'} "
                f"({ALLOWED_NAMESPACES_ANNOTATION}), none of this rule's target namespaces")
    return None


CLOSED = ("closed: a system namespace or the operator's own, which receive copies from other namespaces "
          "only when COPYRATOR_OPEN_NAMESPACES names them")


def target_refusal(rule: Rule, ns: NamespaceInfo, settings: Options) -> str | None:
    """Why ``ns`` does not accept this push's (or, when rules need it, this rule's) copies; None: it
    accepts. The one asking is the rule's namespace (a push's: its source's). A namespace always
    accepts what its own rules ask (a pull rule); the system namespaces and the operator's own are
    closed unless COPYRATOR_OPEN_NAMESPACES names them; then a trusted asker
    (COPYRATOR_TRUSTED_NAMESPACES) or the namespace's own accept-from annotation decides."""
    if not rule.push and not settings.rules_need_target_consent:
        return None
    asker = rule.namespace
    if ns.name == asker:
        return None
    if (ns.name in SYSTEM_NAMESPACES or ns.name == settings.operator_namespace) \
            and ns.name not in settings.open_namespaces:
        return CLOSED
    if consent_allows(settings.trusted_namespaces, asker):
        return None
    if ns.accept_from is not None and consent_allows(ns.accept_from, asker):
        return None
    return f"no {ACCEPT_FROM_ANNOTATION} annotation listing {asker}"


# --- Targets ----------------------------------------------------------------------------------


def is_target(rule: Rule, ns: NamespaceInfo) -> bool:
    """Whether ``ns`` should hold this rule's copies (before consent): active, not a source."""
    if not ns.active or ns.name in rule.source_namespaces or ns.name in rule.excluded_namespaces:
        return False
    if rule.pull:
        return ns.name == rule.namespace
    if rule.target_namespaces is not None:
        listed = ns.name in rule.target_namespaces
        if rule.push and not listed:  # globs, but system namespaces only by name
            listed = ns.name not in SYSTEM_NAMESPACES and consent_allows(rule.target_namespaces, ns.name)
        if not listed:
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
    if rule.push and (meta.get("uid") != rule.uid or not isinstance(push_rule(obj), Rule)):
        return False
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
                                                "annotations", "creationTimestamp") if meta.get(key) is not None},
    }
    for key in ("data", "binaryData", "type", "immutable"):
        if obj.get(key) is not None:
            entry[key] = obj[key]
    return entry


def first_claim(claimants: Iterable[Rule]) -> Rule | None:
    """Of the rules that want one target name and none of which holds it, the one that gets it: the
    oldest (creationTimestamp, then namespace/name). The holder of an existing copy always keeps it,
    so two rules never take a name from each other (no flapping)."""
    return min(claimants, key=lambda rule: rule.claim, default=None)


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
    if rule.push:
        annotations[PUSHED_ANNOTATION] = "true"
    else:
        annotations[RULE_ANNOTATION] = rule.key
    annotations.update({
        SOURCE_ANNOTATION: f"{meta['namespace']}/{meta['name']}",
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
        pushed=annotations.get(PUSHED_ANNOTATION) == "true",
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
    contested: list[str] = dataclasses.field(default_factory=list)  # "ns/name (rule ...)": another rule's
    invalid: list[str] = dataclasses.field(default_factory=list)  # sources not copyable as configured (why)
    rejected: list[str] = dataclasses.field(default_factory=list)  # copies the API server refuses (why)
    # Target namespaces that do not accept the copies (target consent), as (namespace, why); "kept":
    # those of them holding a copy made before ("ns/name", left as it is, no longer synced).
    unaccepted: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)


class Standing(enum.Enum):
    """What one place of a rule (a target namespace and a copy name) holds, for the rule's status."""

    WITHHELD = "withheld"  # the source's consent does not cover the namespace
    MISSING = "missing"  # wanted, nothing there yet
    STALE = "stale"  # the rule's copy, not in sync (yet)
    COPIED = "copied"  # the rule's copy, in sync
    CONFLICT = "conflict"  # an object that is nobody's copy is in the way
    CONTESTED = "contested"  # another rule holds the name, or gets it (the older rule)
    UNACCEPTED = "unaccepted"  # the target namespace does not consent (a copy made before stays, unsynced)
    KEPT = "kept"  # as UNACCEPTED, and the rule's copy from before is there


# Named (in the status, or a push's Warning); the others are only counted.
PROBLEMS = (Standing.CONFLICT, Standing.CONTESTED, Standing.UNACCEPTED, Standing.KEPT)
_PLAIN = {standing: (standing, "") for standing in Standing}  # one shared tuple each: a ledger holds many


def standing(rule: Rule, namespace: str, name: str, *, allowed: bool, view: CopyView | None,
             wanted: Mapping[str, Any] | None, foreign: bool = False,
             claimant: Rule | None = None, refusal: str | None = None) -> tuple[Standing, str]:
    """What the place ``namespace``/``name`` of ``rule`` holds, and the text the status names it by
    (conflicts and contested places only). ``view``: the copy there (any rule's); ``wanted``: the
    copy the rule wants there (None: its source cannot be copied as configured, so only consent
    counts); ``foreign``: an object that is nobody's copy is in the way; ``claimant``: an older rule
    that gets this free name; ``refusal``: why the target namespace does not accept the copy."""
    if not allowed:
        return _PLAIN[Standing.WITHHELD]
    if refusal is not None:
        if view is not None and view.rule_uid == rule.uid:
            return Standing.KEPT, f"{namespace}/{name}"
        return Standing.UNACCEPTED, refusal
    if wanted is None:
        return _PLAIN[Standing.MISSING]
    if view is None:
        if foreign:
            return Standing.CONFLICT, f"{namespace}/{name}"
        if claimant is not None:
            return Standing.CONTESTED, f"{namespace}/{name} (wanted by the older rule {claimant.key})"
        return _PLAIN[Standing.MISSING]
    if view.rule_uid != rule.uid:
        holder = view.rule or ("a push annotation on " + view.source if view.pushed else "")
        return Standing.CONTESTED, f"{namespace}/{name} (held by {holder or 'another rule'})"
    return _PLAIN[Standing.COPIED if in_sync(view, wanted) else Standing.STALE]


Judgement = tuple[Standing, str]


@dataclasses.dataclass
class Ledger:
    """One rule's places (target namespace x copy name) and what each holds, counted per source as the
    places change: the status costs O(sources + places changed), not O(copies). The controller fills it
    from the indexes (at start, and whenever ``basis``, what every judgement depends on besides the
    place itself, changed) and then re-judges only the places events touched, so the counts always
    equal a count from scratch."""

    kind: str
    basis: Any = None
    targets: set[str] = dataclasses.field(default_factory=set)  # the rule's target namespaces
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # copy name -> source name
    places: dict[str, dict[str, Judgement]] = dataclasses.field(default_factory=dict)  # source name -> ns ->
    counts: dict[str, collections.Counter[Standing]] = dataclasses.field(default_factory=dict)  # per source name
    problems: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # source name -> ns -> text
    dirty_namespaces: set[str] = dataclasses.field(default_factory=set)  # to re-judge: every place in them
    dirty_places: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # (namespace, copy name)

    def judge(self, source_name: str, namespace: str, judgement: Judgement | None) -> None:
        """Record what a place holds now (None: it is no place of the rule any more)."""
        places = self.places.get(source_name)
        if places is None:
            places = self.places[source_name] = {}
            self.counts[source_name] = collections.Counter()
            self.problems[source_name] = {}
        old = places.get(namespace)
        if old == judgement:
            return
        counts, problems = self.counts[source_name], self.problems[source_name]
        if old is not None:
            counts[old[0]] -= 1
            if old[0] in PROBLEMS:
                del problems[namespace]
            del places[namespace]
        if judgement is not None:
            places[namespace] = judgement
            counts[judgement[0]] += 1
            if judgement[0] in PROBLEMS:
                problems[namespace] = judgement[1]


def ledger_tally(rule: Rule, ledger: Ledger, sources: Mapping[str, tuple[Mapping[str, Any], str | None]],
                 settings: Options) -> Tally:
    """The rule's tally from its ledger. ``sources``: source name -> (the source the rule copies under
    that name, why it cannot copy it as configured or None)."""
    tally = Tally(targets=len(ledger.targets))
    invalid: set[str] = set()
    unaccepted: set[tuple[str, str]] = set()  # once per namespace, whichever sources it refuses
    kept: list[str] = []
    for source_name, (source, blocked) in sorted(sources.items()):
        tally.sources += 1
        counts = ledger.counts.get(source_name) or collections.Counter()
        withheld = counts[Standing.WITHHELD]
        allowed = counts.total() - withheld
        refusal = consent_refusal(rule, source, settings, targets=len(ledger.targets), allowed=allowed)
        if refusal:
            tally.refusals.append(refusal)
            continue
        if blocked:
            invalid.add(blocked)
            continue
        tally.withheld += withheld
        tally.desired += allowed - counts[Standing.UNACCEPTED] - counts[Standing.KEPT]
        tally.copied += counts[Standing.COPIED]
        places = ledger.places.get(source_name) or {}
        for namespace, text in (ledger.problems.get(source_name) or {}).items():
            held = places[namespace][0]
            if held is Standing.UNACCEPTED:
                unaccepted.add((namespace, text))
            else:
                {Standing.CONFLICT: tally.conflicts, Standing.CONTESTED: tally.contested,
                 Standing.KEPT: kept}[held].append(text)
    tally.invalid = sorted(invalid)
    tally.unaccepted, tally.kept = sorted(unaccepted), sorted(kept)
    return tally


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
        for key in ("sources", "desired", "copied", "conflicted", "skipped", "conflicts", "withheld", "refused",
                    "contested", "invalid"):
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
        "contested": sorted(tally.contested)[:MAX_LISTED],
        "invalid": sorted(tally.invalid)[:MAX_LISTED],
    })
    if tally.refusals:
        conds = set_condition(conds, "Refused", True, "ConsentMissing",
                              f"{len(tally.refusals)} source(s) not copied: " + "; ".join(status["refused"]),
                              gen, now)
    else:
        conds = set_condition(conds, "Refused", False, "Allowed", "", gen, now)
    if conflicts or tally.contested:
        # Every object in the way, whoever's: someone else's (ForeignObject) or another rule's (TargetClaimed).
        parts = []
        if conflicts:
            parts.append(f"{len(conflicts)} target(s) hold an object this rule does not own "
                         f"(left untouched): {', '.join(status['conflicts'])}")
        if tally.contested:
            parts.append(f"{len(tally.contested)} target name(s) belong to another rule: "
                         f"{', '.join(status['contested'])}")
        conds = set_condition(conds, "Conflict", True, "ForeignObject" if conflicts else "TargetClaimed",
                              "; ".join(parts), gen, now)
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
    if tally.invalid:
        return False, True, "InvalidCopy", (f"{len(tally.invalid)} source(s) cannot be copied as this rule "
                                            f"says: " + "; ".join(status["invalid"]))
    if tally.contested:
        return False, True, "TargetClaimed", (f"{len(tally.contested)} target name(s) are another rule's "
                                              f"(the rule holding a copy keeps it; else the older rule gets "
                                              f"it); change target/namePrefix/nameSuffix or the other rule: "
                                              f"{', '.join(status['contested'])}")
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
    if tally.unaccepted or tally.kept:
        withheld += f"; {target_refusals(tally)}"
    return True, False, "Synced", f"all {tally.copied} copies in sync across {tally.targets} namespace(s){withheld}"


def target_refusals(tally: Tally) -> str:
    """What the targets' consent refuses (the Warning a push's source gets, a rule's Synced message):
    the namespaces and the consent each lacks, and the copies made before that are kept unsynced."""
    parts = []
    if tally.unaccepted:
        by_reason: dict[str, list[str]] = collections.defaultdict(list)
        for namespace, why in tally.unaccepted[:MAX_LISTED]:
            by_reason[why].append(namespace)
        more = f" and {len(tally.unaccepted) - MAX_LISTED} more" if len(tally.unaccepted) > MAX_LISTED else ""
        parts.append(f"not copied into {len(tally.unaccepted)} namespace(s) without their consent: "
                     + "; ".join(f"{', '.join(names)} ({why})" for why, names in sorted(by_reason.items())) + more)
    if tally.kept:
        parts.append(f"{len(tally.kept)} copy(ies) made before in namespaces that do not consent are kept as "
                     f"they are and no longer synced (consent resumes them; deleting them is final): "
                     + ", ".join(tally.kept[:MAX_LISTED]))
    return "; ".join(parts)


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    previous = previous or {}
    return any(previous.get(key) != value for key, value in new.items())


def rule_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the rules index keeps of a rule: its fields, identity and status (small)."""
    meta = body.get("metadata") or {}
    snap: dict[str, Any] = {
        "apiVersion": body.get("apiVersion", API_VERSION), "kind": body.get("kind", KIND),
        "metadata": {key: meta[key] for key in ("name", "namespace", "uid", "generation", "resourceVersion",
                                                "deletionTimestamp", "creationTimestamp")
                     if meta.get(key) is not None},
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
