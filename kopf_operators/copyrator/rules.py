"""Copyrator: rules, namespaces, consent and sources (pure: no API calls).

The CopyratorRule and its parsing, the renaming of copies, push annotations, the sources' and the
targets' consent, and which objects a rule selects. Beside it, ``copies`` decides one copy (what a
place should hold and the single write that gets it there) and ``tally`` a rule's ledger, status and
orphans; ``copyrator.controller`` feeds them from indexes and applies their answers.

A ``CopyratorRule`` names a resource type (ConfigMap or Secret), a label selector and one or more
source namespaces. Every matching object is copied into each target namespace.

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

import dataclasses
import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from kopf_operators.core.conventions import (
    COPY_SOURCE,
    COPYRATOR_PREFIX,
    COPYRATOR_RULE_UID_LABEL,
    DATA_ELIDED,
    DATA_STAMP,
    DOMAIN,
    data_bytes,
    data_hash,
    env_bool,
    env_float,
    env_list,
    matches_label_selector,
    matches_labels,
)

GROUP = "flant.com"
VERSION = "v1"
PLURAL = "copyrators"
KIND = "CopyratorRule"
API_VERSION = f"{GROUP}/{VERSION}"

RULE_ANNOTATION = COPYRATOR_PREFIX + "rule"  # "<namespace>/<name>" of the rule
SOURCE_UID_ANNOTATION = COPYRATOR_PREFIX + "source-uid"
HASH_ANNOTATION = COPYRATOR_PREFIX + "content-hash"
# On a copy whose rule copies the source's annotations: they are then part of the content.
ANNOTATIONS_COPIED = COPYRATOR_PREFIX + "annotations-copied"
# On a source: the consent for rules in other namespaces ("team-a,team-*"): where it may be copied.
ALLOWED_NAMESPACES_ANNOTATION = COPYRATOR_PREFIX + "allowed-namespaces"
# On a source: push it, with no rule, into these namespaces (names and globs, comma-separated) and/or
# into the namespaces matching this label selector ("team=payments,tier=web").
PUSH_TO_ANNOTATION = COPYRATOR_PREFIX + "push-to"
PUSH_TO_MATCHING_ANNOTATION = COPYRATOR_PREFIX + "push-to-matching"
# On a copy made by a push annotation (no rule): its rule-uid label is then the source's uid.
PUSHED_ANNOTATION = COPYRATOR_PREFIX + "pushed"
# On a Namespace: the target's consent, the namespaces whose pushes (and, when rules need it too,
# rules) may write copies into it ("team-a,platform-*"; "*": anyone's).
ACCEPT_FROM_ANNOTATION = COPYRATOR_PREFIX + "accept-from"
OUR_ANNOTATIONS = (RULE_ANNOTATION, COPY_SOURCE, SOURCE_UID_ANNOTATION, HASH_ANNOTATION, DATA_STAMP)

RULE_TYPES = {"configmap": "ConfigMap", "secret": "Secret"}
# Never copied: credentials bound to one namespace/cluster identity, and Helm's release records.
FORBIDDEN_SECRET_TYPES = frozenset({
    "kubernetes.io/service-account-token",
    "bootstrap.kubernetes.io/token",
    "helm.sh/release.v1",
})
# Excluded from "all namespaces" (and from a push's globs), as is the operator's own namespace; closed
# to other namespaces' rules and pushes unless COPYRATOR_OPEN_NAMESPACES names them (``target_refusal``).
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
# The project's own label and annotation domains (and their subdomains): keys under them steer the
# operators (Blackadder's ledger and opt-in labels, the re-roller's annotations, Copyrator's marker),
# so a copy never carries one from its source; the copier sets its own bookkeeping keys itself.
PROJECT_DOMAINS = (DOMAIN, "blackadder.io")

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

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
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
    # The operator's own namespace (closed to other namespaces' rules and pushes, like the system ones).
    operator_namespace: str = ""
    # A source whose data and binaryData hold more bytes than this is never copied, nor held with its data.
    max_source_bytes: int = 262144

    @property
    def by_name_only(self) -> frozenset[str]:
        """Namespaces that "every namespace" and a push's globs leave out: a rule or push reaches them
        only by listing their name (and then only when they are open to it: ``target_refusal``)."""
        return SYSTEM_NAMESPACES | {self.operator_namespace} - {""}

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
            max_source_bytes=int(env_float(env, "COPYRATOR_MAX_SOURCE_BYTES", 262144, minimum=1)),
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
        if not isinstance(item, str) or not DNS_LABEL.match(item) or len(item) > 63:
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
    if refused := too_large(source):
        return refused
    name = copy_name(rule, str(meta.get("name", "")))
    if len(name) > MAX_NAME:
        return f"source {where}: the copy's name would be {len(name)} characters long (at most {MAX_NAME})"
    present = data_keys(source)
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
    """Why ``ns`` does not accept this rule's (or push's) copies; None: it accepts. The one asking is
    the rule's namespace (a push's: its source's). A namespace always accepts what its own rules ask (a
    pull rule). The system namespaces and the operator's own are closed in every configuration unless
    COPYRATOR_OPEN_NAMESPACES names them: a push, or a rule in any other namespace than the operator's
    (where only the administrator writes rules), writes nothing there. Then a push (and, with
    COPYRATOR_RULES_NEED_TARGET_CONSENT, a rule) needs consent: a trusted asker
    (COPYRATOR_TRUSTED_NAMESPACES) or the namespace's own accept-from annotation."""
    asker = rule.namespace
    if ns.name == asker:
        return None
    if ns.name in settings.by_name_only and ns.name not in settings.open_namespaces \
            and (rule.push or asker != settings.operator_namespace):
        return CLOSED
    if not rule.push and not settings.rules_need_target_consent:
        return None
    if consent_allows(settings.trusted_namespaces, asker):
        return None
    if ns.accept_from is not None and consent_allows(ns.accept_from, asker):
        return None
    return f"no {ACCEPT_FROM_ANNOTATION} annotation listing {asker}"


# --- Targets ----------------------------------------------------------------------------------


def is_target(rule: Rule, ns: NamespaceInfo, by_name_only: Collection[str] = SYSTEM_NAMESPACES) -> bool:
    """Whether ``ns`` should hold this rule's copies (before consent): active, not a source.
    ``by_name_only`` (``Options.by_name_only``): namespaces reached only when listed by name."""
    if not ns.active or ns.name in rule.source_namespaces or ns.name in rule.excluded_namespaces:
        return False
    if rule.pull:
        return ns.name == rule.namespace
    if rule.target_namespaces is not None:
        listed = ns.name in rule.target_namespaces
        if rule.push and not listed:  # globs, but the system namespaces and the operator's only by name
            listed = ns.name not in by_name_only and consent_allows(rule.target_namespaces, ns.name)
        if not listed:
            return False
    elif ns.name in by_name_only:
        return False
    return matches_label_selector(ns.labels, rule.namespace_selector)


def target_namespaces(rule: Rule, namespaces: Iterable[NamespaceInfo],
                      by_name_only: Collection[str] = SYSTEM_NAMESPACES) -> list[str]:
    """Active namespaces that receive copies (before consent), sorted."""
    return sorted(ns.name for ns in namespaces if is_target(rule, ns, by_name_only))


# --- Sources ----------------------------------------------------------------------------------


def is_copy(obj: Mapping[str, Any]) -> bool:
    """Made by some Copyrator rule (never treated as a source: no copy chains)."""
    return COPYRATOR_RULE_UID_LABEL in ((obj.get("metadata") or {}).get("labels") or {})


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


# In a lean source entry: what it holds instead of the data (``source_entry``).
DIGEST = "digest"


def source_entry(obj: Mapping[str, Any], *, keep_data: bool = True, max_bytes: int | None = None) -> dict[str, Any]:
    """What the sources index keeps of a selected object. With its data (what a copy is built from)
    when ``keep_data``; else lean: a digest of the data and its size, and of the annotations only
    Copyrator's own (what selecting, consent and push read), so a source no target accepts costs little
    however big it is. Over ``max_bytes`` (or handed on without its data: ``DATA_ELIDED``) it is lean in
    any case; over ``max_bytes``, marked refused (``too_large``)."""
    meta = obj.get("metadata") or {}
    size = data_bytes(obj)
    elided = obj.get(DATA_ELIDED)  # a listed body handed on without its data: lean in any case
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    refused = None
    if max_bytes is not None and size > max_bytes:
        refused = (f"source {where}: its data and binaryData hold {size} bytes, more than the {max_bytes} a "
                   f"source may hold (COPYRATOR_MAX_SOURCE_BYTES): never copied")
    keep_data = keep_data and refused is None and elided is None
    entry: dict[str, Any] = {
        "kind": obj.get("kind"),
        "metadata": {key: meta[key] for key in ("name", "namespace", "uid", "resourceVersion", "labels",
                                                "annotations", "creationTimestamp") if meta.get(key) is not None},
    }
    for key in ("type", "immutable", *(("data", "binaryData") if keep_data else ())):
        if obj.get(key) is not None:
            entry[key] = obj[key]
    if not keep_data:
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(COPYRATOR_PREFIX)}
        entry["metadata"]["annotations"] = annotations
        digest = elided["hash"] if isinstance(elided, Mapping) else data_hash(str(obj.get("kind") or ""), obj)
        entry[DIGEST] = {"hash": digest, "bytes": size, "refused": refused}
    return entry


def is_lean(entry: Mapping[str, Any]) -> bool:
    """A source entry held without its data (``source_entry``): no copy can be built from it."""
    return DIGEST in entry


def too_large(entry: Mapping[str, Any]) -> str | None:
    """Why a source is never copied for its size (None: it fits the cap)."""
    digest = entry.get(DIGEST)
    return digest.get("refused") if isinstance(digest, Mapping) else None


def data_keys(obj: Mapping[str, Any]) -> list[str]:
    """The data and binaryData keys of a source (entry); none of a lean one (its keys are not held
    either: as many as its bytes allow; they are checked once it is read, before any copy is made)."""
    return [*(obj.get("data") or {}), *(obj.get("binaryData") or {})]


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
