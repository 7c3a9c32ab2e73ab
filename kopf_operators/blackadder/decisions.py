"""Blackadder: pure decision logic of the ChaosAgent operator (no API calls here).

Everything the handlers decide (which namespaces are candidates, which pods die, how far a
Deployment grows, what a ConfigMap becomes, what the ledger remembers and what a revert may
restore) is a plain function of data, so it is unit-tested with a fixed seed.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import functools
import json
import math
import random
import re
import urllib.parse
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kopf_operators.copyrator import decisions as copyrator
from kopf_operators.core.conventions import (
    DOMAIN,
    env_bool,
    env_float,
    env_list,
    iso_to_epoch,
    kstatus_conditions,
    matches_label_selector,
    set_condition,
    stable_hash,
)

GROUP = "blackadder.io"
VERSION = "v1beta1"
PLURAL = "chaosagents"
KIND = "ChaosAgent"

# Namespaces no spec can make a target (the operator's own namespace is added at runtime).
DENIED_NAMESPACES: frozenset[str] = frozenset({"kube-system", "kube-public", "kube-node-lease"})
# ConfigMaps no spec can make a target, in any namespace (the cluster's CA bundle).
DENIED_CONFIGMAPS: frozenset[str] = frozenset({"kube-root-ca.crt"})
# Where the ledgers live when the operator runs outside the cluster (OPERATOR_NAMESPACE="").
DEFAULT_LEDGER_NAMESPACE = "blackadder-system"
LEDGER_PREFIX = "blackadder-ledger-"
LEDGER_KEY = "ledger.json"
LEDGER_LABEL = f"{DOMAIN}/blackadder-ledger"
# The agent's full name on its ledger (a label value stops at 63 characters, an agent name at 253).
LEDGER_AGENT_ANNOTATION = f"{DOMAIN}/blackadder-agent"
# Set on a ledger the operator let go of (a revert that kept failing): it stays for an administrator.
LEDGER_ABANDONED_ANNOTATION = f"{DOMAIN}/blackadder-abandoned"
# The global kill switch: this label on the operator's namespace stops every agent within seconds.
KILL_SWITCH_LABEL = "blackadder.io/stop"
# Where a webhook's URL (with its token) lives: this key of a Secret in the operator's namespace.
WEBHOOK_SECRET_KEY = "address"
# A revert refused this many times (403, 422 on our own write, ...) is given up on delete.
REVERT_ATTEMPTS = 5
MAX_REPLICAS = 128
MIN_PAUSE_SECONDS = 5
JOURNAL_LIMIT = 100
# A Secret holds at most 1 MiB; keep the ledger well below that and refuse actions that would not fit.
LEDGER_BUDGET_BYTES = 700_000

TANTRUM, CANCER, IPSUM = "tantrum", "cancer", "ipsum"
MODES = (TANTRUM, CANCER, IPSUM)

# The opt-in/opt-out label on Pods, Deployments and ConfigMaps: "false" always opts out; with
# requireOptIn only objects labelled "true" are candidates. Applied server-side.
OPT_LABEL = "blackadder.io/chaos"
# Per-target frequency (after kube-monkey's kube-monkey/mtbf, kill-type, kill-value), on Pods (put
# them in the workload's pod template): the workload's own mean time between failures.
MTBF_LABEL = "blackadder.io/mtbf"
KILL_MODE_LABEL = "blackadder.io/kill-mode"
KILL_VALUE_LABEL = "blackadder.io/kill-value"
KILL_ONE, KILL_FIXED, KILL_ALL, KILL_RANDOM_MAX_PERCENT, KILL_FIXED_PERCENT = (
    "", "fixed", "kill-all", "random-max-percent", "fixed-percent")
KILL_MODES = (KILL_FIXED, KILL_ALL, KILL_RANDOM_MAX_PERCENT, KILL_FIXED_PERCENT)
# Copyrator's marker on its copies: ConfigMaps carrying it are Copyrator's to keep in sync.
COPYRATOR_COPY_LABEL = copyrator.RULE_UID_LABEL
DEFAULT_MAX_KILLS = 1  # like chaoskube's --max-kill
DEFAULT_MAX_ADDED_REPLICAS = 32
# Chaos for tenants: the namespaced TenantChaosAgent (tantrum only, in its own namespace).
TENANT_KIND = "TenantChaosAgent"
TENANT_PLURAL = "tenantchaosagents"
# Only namespaces an administrator labels so may hold acting TenantChaosAgents.
TENANT_NAMESPACE_LABEL = "blackadder.io/tenant-chaos"
TENANT_NAMESPACE_VALUE = "allowed"
TENANT_LEDGER_PREFIX = "blackadder-tenant-ledger-"
# On a TenantChaosAgent's ledger: its agent's uid (the start-up sweep deletes ledgers whose agent is gone).
TENANT_LEDGER_UID_LABEL = f"{DOMAIN}/blackadder-tenant-agent-uid"
DEFAULT_TENANT_MAX_KILLS = 1
DEFAULT_TENANT_MIN_PAUSE = 60
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


# --- Options -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """Operator-wide options of Blackadder (environment variables, documented in docs/blackadder.md)."""

    dry_run: bool = False  # CHAOS_DRY_RUN: forces dry-run on every agent (the chart sets it)
    # CHAOS_MAX_ADDED_REPLICAS: all agents together never add more replicas than this (cancer).
    max_added_replicas: int = DEFAULT_MAX_ADDED_REPLICAS
    # CHAOS_WEBHOOK_HOSTS: the only hosts webhook notifications may go to (empty: any host).
    webhook_hosts: tuple[str, ...] = ()
    # CHAOS_STOP_ALL: the kill switch from the chart (operators.blackadder.stopAll): no agent acts.
    stop_all: bool = False
    # Chaos for tenants (chart operators.blackadder.tenants): TenantChaosAgents are served only when
    # CHAOS_TENANTS=true, and every one is bounded by these administrator's limits.
    tenants: bool = False
    tenant_max_kills: int = DEFAULT_TENANT_MAX_KILLS  # CHAOS_TENANTS_MAX_KILLS_PER_CYCLE
    tenant_min_pause: int = DEFAULT_TENANT_MIN_PAUSE  # CHAOS_TENANTS_MIN_PAUSE_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Options:
        return cls(dry_run=env_bool(env, "CHAOS_DRY_RUN", False),
                   max_added_replicas=int(env_float(env, "CHAOS_MAX_ADDED_REPLICAS", DEFAULT_MAX_ADDED_REPLICAS)),
                   webhook_hosts=tuple(h.lower() for h in env_list(env, "CHAOS_WEBHOOK_HOSTS")),
                   stop_all=env_bool(env, "CHAOS_STOP_ALL", False),
                   tenants=env_bool(env, "CHAOS_TENANTS", False),
                   tenant_max_kills=max(0, int(env_float(env, "CHAOS_TENANTS_MAX_KILLS_PER_CYCLE",
                                                         DEFAULT_TENANT_MAX_KILLS))),
                   tenant_min_pause=max(MIN_PAUSE_SECONDS, int(env_float(env, "CHAOS_TENANTS_MIN_PAUSE_SECONDS",
                                                                         DEFAULT_TENANT_MIN_PAUSE))))



@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """A ChaosAgent's spec, normalised (the CRD schema already applied defaults and bounds)."""

    tantrum: bool = False
    cancer: bool = False
    ipsum: bool = False
    tolerance: int = 0
    eagerness: int = 0
    pause: int = 60
    excluded: tuple[str, ...] = ()
    targets: tuple[str, ...] | None = None
    dry_run: bool = False
    dry_run_reason: str = ""
    paused: bool = False
    revert: bool = False
    revert_on_delete: bool = True
    seed: int | None = None
    # The guards of issue #14 (defaults: the article's agents keep working, with chaoskube's cap).
    pod_selector: Mapping[str, Any] | None = None
    namespace_selector: Mapping[str, Any] | None = None
    annotation_selector: Mapping[str, Any] | None = None
    require_opt_in: bool = False
    max_kills: int | str | None = DEFAULT_MAX_KILLS
    min_pod_age: int = 0
    windows: tuple[Mapping[str, Any], ...] = ()
    time_zone: str = "UTC"
    allow_single_replica: bool = False
    evict: bool = False
    webhook_secret: str = ""  # the Secret (operator's namespace) whose key "address" is the URL
    shared_configmaps: str = "Skip"
    # chaoskube's remaining filters (issue #23): owner kinds, pod names, excluded dates, grace period.
    owner_kinds_included: tuple[str, ...] = ()
    owner_kinds_excluded: tuple[str, ...] = ()
    pod_names_included: str = ""  # a regular expression (searched in the name, as chaoskube's)
    pod_names_excluded: str = ""
    excluded_dates: tuple[str, ...] = ()  # "YYYY-MM-DD" (once) or "MM-DD" (every year), in time_zone
    grace_period: int | None = None  # gracePeriodSeconds of the deletion (None: the Pod's own)
    # Per-target frequency (blackadder.io/mtbf on Pods): Honour (default) or Ignore.
    target_frequency: str = "Honour"
    # Why the agent may not act at all, whatever its spec (a TenantChaosAgent outside an allowed
    # namespace): reported as InvalidSpec, like what the schema could not check.
    scope_problem: str = ""


def settings_from_spec(spec: Mapping[str, Any], forced_dry_run: bool = False) -> AgentSettings:
    """Read a spec defensively: objects stored before a schema change may lack fields."""
    targets = spec.get("targetNamespaces")
    seed = spec.get("seed")
    dry_spec = bool(spec.get("dryRun", False))
    reason = "OperatorForced" if forced_dry_run else ("Spec" if dry_spec else "")
    return AgentSettings(
        tantrum=bool(spec.get("tantrumMode", False)),
        cancer=bool(spec.get("cancerMode", False)),
        ipsum=bool(spec.get("ipsumMode", False)),
        tolerance=max(0, int(spec.get("podTolerance", 0) or 0)),
        eagerness=min(100, max(0, int(spec.get("eagerness", 0) or 0))),
        pause=max(MIN_PAUSE_SECONDS, int(spec.get("pauseDuration", 60) or 60)),
        excluded=tuple(sorted(set(spec.get("excludedNamespaces") or ()))),
        targets=None if targets is None else tuple(sorted(set(targets))),
        dry_run=forced_dry_run or dry_spec,
        dry_run_reason=reason,
        paused=bool(spec.get("paused", False)),
        revert=bool(spec.get("revert", False)),
        revert_on_delete=bool(spec.get("revertOnDelete", True)),
        seed=None if seed is None else int(seed),
        pod_selector=_mapping(spec.get("podSelector")),
        namespace_selector=_mapping(spec.get("namespaceSelector")),
        annotation_selector=_mapping(spec.get("annotationSelector")),
        require_opt_in=bool(spec.get("requireOptIn", False)),
        max_kills=spec.get("maxKillsPerCycle", DEFAULT_MAX_KILLS),
        min_pod_age=max(0, int(spec.get("minPodAgeSeconds", 0) or 0)),
        windows=tuple(_mapping(w) or {} for w in spec.get("activeWindows") or ()),
        time_zone=str(spec.get("timeZone") or "UTC"),
        allow_single_replica=bool(spec.get("allowSingleReplica", False)),
        evict=bool(spec.get("evictPods", False)),
        webhook_secret=str(((spec.get("webhook") or {}).get("secretRef") or {}).get("name") or ""),
        shared_configmaps=str(spec.get("sharedConfigMaps") or "Skip"),
        owner_kinds_included=tuple(sorted(set((spec.get("ownerKinds") or {}).get("include") or ()))),
        owner_kinds_excluded=tuple(sorted(set((spec.get("ownerKinds") or {}).get("exclude") or ()))),
        pod_names_included=str((spec.get("podNames") or {}).get("include") or ""),
        pod_names_excluded=str((spec.get("podNames") or {}).get("exclude") or ""),
        excluded_dates=tuple(sorted(set(spec.get("excludedDates") or ()))),
        grace_period=None if spec.get("gracePeriodSeconds") is None else max(0, int(spec["gracePeriodSeconds"])),
        target_frequency=str(spec.get("targetFrequency") or "Honour"),
    )


def tenant_settings(spec: Mapping[str, Any], namespace: str, settings: Options, operator_namespace: str,
                    namespace_labels: Mapping[str, str] | None) -> AgentSettings:
    """A TenantChaosAgent's effective settings: its spec read as a ChaosAgent's, then confined to its
    own namespace (whatever the spec says: the schema has no namespace field, this is the second
    line) and bounded by the administrator's limits (min of spec and limit; the longer pause)."""
    base = settings_from_spec(spec, settings.dry_run)
    spec_kills = base.max_kills
    kills = settings.tenant_max_kills if not isinstance(spec_kills, int) else min(spec_kills,
                                                                                   settings.tenant_max_kills)
    problem = tenant_scope_problem(namespace, settings, operator_namespace, namespace_labels)
    return dataclasses.replace(
        base, tantrum=True, cancer=False, ipsum=False,
        targets=(namespace,), excluded=(), namespace_selector=None,
        webhook_secret="", revert=False, revert_on_delete=False,
        max_kills=max(0, kills), pause=max(base.pause, settings.tenant_min_pause),
        scope_problem=problem)


def tenant_scope_problem(namespace: str, settings: Options, operator_namespace: str,
                         namespace_labels: Mapping[str, str] | None) -> str:
    """Why a TenantChaosAgent in ``namespace`` may not act ("" when it may)."""
    if not settings.tenants:
        return "chaos for tenants is switched off (chart: operators.blackadder.tenants.enabled)"
    if namespace in denied_namespaces(operator_namespace):
        return f"namespace {namespace} is on Blackadder's deny-list: no chaos there"
    if (namespace_labels or {}).get(TENANT_NAMESPACE_LABEL) != TENANT_NAMESPACE_VALUE:
        return (f"namespace {namespace} does not allow chaos for tenants: an administrator labels it "
                f"{TENANT_NAMESPACE_LABEL}={TENANT_NAMESPACE_VALUE}")
    return ""


def tenant_agent_id(namespace: str, name: str) -> str:
    """A TenantChaosAgent's identity in its ledger: a namespace has no dot, so the first dot
    separates the two and no two agents share it."""
    return f"{namespace}.{name}"


def tenant_ledger_name(agent_id: str) -> str:
    """The ledger of a TenantChaosAgent (operator's namespace): its own prefix, so that no
    ChaosAgent's name can take it; hashed when too long."""
    return _bounded(f"{TENANT_LEDGER_PREFIX}{agent_id}", 253)


def orphaned_tenant_ledgers(ledgers: Iterable[Mapping[str, Any]],
                            live_agent_uids: Iterable[str]) -> list[Mapping[str, Any]]:
    """The tenant ledger Secrets whose agent no longer exists (its finalizer removed by hand, say).
    List the ledgers before the agents: a ledger is only written by a live agent, so one whose agent
    is not in the later list of agents has lost it."""
    live = set(live_agent_uids)
    return [secret for secret in ledgers
            if (uid := ((secret.get("metadata") or {}).get("labels") or {}).get(TENANT_LEDGER_UID_LABEL))
            and uid not in live]


def _mapping(value: Any) -> dict[str, Any] | None:
    """A plain dict (munch and Kopf views included), None when unset or empty."""
    return json.loads(json.dumps(value)) if value else None


# --- Scope: namespaces, deny-list, field selectors -----------------------------------------------


def ledger_namespace(operator_namespace: str) -> str:
    return operator_namespace or DEFAULT_LEDGER_NAMESPACE


def _bounded(text: str, limit: int) -> str:
    """``text`` when it fits ``limit``; else a prefix and a hash of the whole, still a valid DNS
    subdomain / label value (no separator at the cut), unique per full text."""
    if len(text) <= limit:
        return text
    digest = stable_hash(text)[:10]
    return f"{text[:limit - len(digest) - 1].rstrip('.-_')}-{digest}"


def ledger_name(agent: str) -> str:
    """The ledger Secret's name: ``blackadder-ledger-<agent>`` while that fits 253 characters (every
    agent name up to 235), else hashed (the full name is in an annotation)."""
    return _bounded(f"{LEDGER_PREFIX}{agent}", 253)


def ledger_label(agent: str) -> str:
    """The agent's name as a label value: a label value stops at 63 characters, a name at 253."""
    return _bounded(agent, 63)


def denied_namespaces(operator_namespace: str) -> frozenset[str]:
    """The hard deny-list: system namespaces, the operator's own and the ledgers' namespace."""
    return DENIED_NAMESPACES | {ledger_namespace(operator_namespace)}


def namespace_field_selector(excluded: Iterable[str]) -> str:
    """The article's server-side filter: ``metadata.namespace!=a,metadata.namespace!=b`` (sorted)."""
    return ",".join(f"metadata.namespace!={ns}" for ns in sorted(set(excluded)))


def listing_plan(settings: AgentSettings, operator_namespace: str) -> tuple[list[str] | None, str]:
    """How to list candidates: (namespaces to list one by one, or None for all), field selector."""
    excluded = set(settings.excluded) | denied_namespaces(operator_namespace)
    if settings.targets is not None:
        return [ns for ns in settings.targets if ns not in excluded], ""
    return None, namespace_field_selector(excluded)


def listing_plan_for(settings: AgentSettings, operator_namespace: str,
                     namespace_labels: Mapping[str, Mapping[str, str]]) -> tuple[list[str] | None, str]:
    """``listing_plan`` with the namespaceSelector: then only the matching namespaces (from the
    namespaces index) are listed, one by one."""
    namespaces, selector = listing_plan(settings, operator_namespace)
    if settings.namespace_selector is None:
        return namespaces, selector
    matching = sorted(ns for ns, labels in namespace_labels.items()
                      if matches_label_selector(labels, settings.namespace_selector)
                      and namespace_allowed(ns, settings, operator_namespace))
    return [ns for ns in matching if namespaces is None or ns in namespaces], ""


def selector_string(selector: Mapping[str, Any] | None) -> str:
    """A LabelSelector (matchLabels, matchExpressions) as the API's labelSelector query string."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), sorted(expr.get("values") or ())
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def label_selector_for(kind: str, settings: AgentSettings) -> str:
    """The server-side label selector of a listing: the opt-in/opt-out label, the podSelector (Pods),
    and without sharedConfigMaps: Include, no Copyrator copies (ConfigMaps)."""
    parts = [f"{OPT_LABEL}=true" if settings.require_opt_in else f"{OPT_LABEL}!=false"]
    if kind == "Pod" and settings.pod_selector:
        parts.append(selector_string(settings.pod_selector))
    if kind == "ConfigMap" and settings.shared_configmaps != "Include":
        parts.append(f"!{COPYRATOR_COPY_LABEL}")
    return ",".join(p for p in parts if p)


def pod_field_selector(namespace_selector: str) -> str:
    """Pods that have ended are no candidates (nothing to kill), filtered server-side too."""
    return ",".join(p for p in (namespace_selector, "status.phase!=Succeeded,status.phase!=Failed") if p)


def namespace_allowed(namespace: str, settings: AgentSettings, operator_namespace: str) -> bool:
    """Client-side double check of what the server-side selectors already filtered."""
    if namespace in denied_namespaces(operator_namespace) or namespace in settings.excluded:
        return False
    return settings.targets is None or namespace in settings.targets


# --- Inventory ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    terminating: bool = False
    owner: str = ""  # uid of its controller (ReplicaSet, StatefulSet, ...); "" for a bare pod
    ready: bool = True
    created: float | None = None  # epoch seconds
    owner_kind: str = ""  # the kind of its controller; "" for a bare pod
    # Its own frequency (labels blackadder.io/mtbf, kill-mode, kill-value), "" when unlabelled.
    mtbf: str = ""
    kill_mode: str = ""
    kill_value: str = ""

    @property
    def workload(self) -> str:
        return self.owner or f"bare:{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class DeploymentRef:
    namespace: str
    name: str
    uid: str
    replicas: int
    resource_version: str = ""
    generation: int = 0


@dataclasses.dataclass(frozen=True)
class ConfigMapRef:
    namespace: str
    name: str
    uid: str
    data: Mapping[str, str] | None
    immutable: bool = False
    resource_version: str = ""


def _controller(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((ref for ref in meta.get("ownerReferences") or () if ref.get("controller")), {})


def pod_ref(obj: Mapping[str, Any]) -> PodRef:
    meta = obj.get("metadata", {})
    controller = _controller(meta)
    conditions = (obj.get("status") or {}).get("conditions") or ()
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    labels = meta.get("labels") or {}
    return PodRef(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                  bool(meta.get("deletionTimestamp")), controller.get("uid", ""), ready,
                  iso_to_epoch(meta.get("creationTimestamp")), controller.get("kind", ""),
                  str(labels.get(MTBF_LABEL, "")), str(labels.get(KILL_MODE_LABEL, "")),
                  str(labels.get(KILL_VALUE_LABEL, "")))


# The owner kind of a Pod without a controller, in ownerKinds.include/exclude.
BARE_POD_KIND = "None"


def owner_kind_allowed(owner_kind: str, settings: AgentSettings) -> bool:
    """chaoskube's --kinds: include (when set) is the only kinds allowed, exclude never; a bare Pod
    has the kind "None"."""
    kind = owner_kind or BARE_POD_KIND
    if settings.owner_kinds_included and kind not in settings.owner_kinds_included:
        return False
    return kind not in settings.owner_kinds_excluded


@functools.lru_cache(maxsize=64)
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def regex_problem(field: str, text: str) -> str | None:
    """Why ``text`` is no regular expression (the schema cannot tell; the agent idles and says so)."""
    if not text:
        return None
    try:
        _pattern(text)
    except re.error as exc:
        return f"{field} {text!r} is not a valid regular expression: {exc}"
    return None


def pod_name_allowed(name: str, settings: AgentSettings) -> bool:
    """chaoskube's --included-pod-names / --excluded-pod-names: the regex is searched in the name
    (anchor it with ^...$ for a full match). Call only when spec_problem() found nothing."""
    if settings.pod_names_included and not _pattern(settings.pod_names_included).search(name):
        return False
    return not (settings.pod_names_excluded and _pattern(settings.pod_names_excluded).search(name))


def pod_selected(obj: Mapping[str, Any], settings: AgentSettings, now: float) -> bool:
    """What the server-side selectors cannot express: the annotation selector, the minimum age, the
    owner kind and the pod-name patterns (all from the listed object: no request)."""
    meta = obj.get("metadata", {})
    if not matches_label_selector(meta.get("annotations") or {}, settings.annotation_selector):
        return False
    if not owner_kind_allowed(str(_controller(meta).get("kind", "")), settings):
        return False
    if not pod_name_allowed(str(meta.get("name", "")), settings):
        return False
    created = iso_to_epoch(meta.get("creationTimestamp"))
    return settings.min_pod_age <= 0 or (created is not None and now - created >= settings.min_pod_age)


def deployment_selected(obj: Mapping[str, Any], settings: AgentSettings) -> bool:
    """A Deployment is a candidate when the pods it makes match the podSelector."""
    template_labels = (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels")
    return matches_label_selector(template_labels or {}, settings.pod_selector)


def deployment_ref(obj: Mapping[str, Any]) -> DeploymentRef:
    meta = obj.get("metadata", {})
    replicas = (obj.get("spec") or {}).get("replicas")
    return DeploymentRef(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                         1 if replicas is None else int(replicas), meta.get("resourceVersion", ""),
                         int(meta.get("generation") or 0))


def configmap_ref(obj: Mapping[str, Any]) -> ConfigMapRef:
    meta = obj.get("metadata", {})
    return ConfigMapRef(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                        obj.get("data"), bool(obj.get("immutable")), meta.get("resourceVersion", ""))


def pod_allowed(pod: PodRef, settings: AgentSettings, operator_namespace: str, operator_pod: str) -> bool:
    if operator_pod and pod.name == operator_pod and (not operator_namespace or pod.namespace == operator_namespace):
        return False
    return namespace_allowed(pod.namespace, settings, operator_namespace)


def configmap_allowed(cm: ConfigMapRef, settings: AgentSettings, operator_namespace: str) -> bool:
    if cm.name in DENIED_CONFIGMAPS or cm.name.startswith(LEDGER_PREFIX):
        return False
    return namespace_allowed(cm.namespace, settings, operator_namespace)


# --- Decisions ------------------------------------------------------------------------------------


def rng_for(seed: int | None, cycle: int, mode: str) -> random.Random:
    """One RNG per (seed, cycle, mode): the same seed and inventory give the same decisions, and
    toggling one mode does not change the others' draws. No seed: fresh OS entropy."""
    if seed is None:
        return random.Random()
    return random.Random(f"blackadder:{seed}:{cycle}:{mode}")


def eager(rng: random.Random, eagerness: int) -> bool:
    """True with probability eagerness/100: exactly never at 0, exactly always at 100."""
    return rng.random() * 100 < eagerness


def _key(obj: Any) -> tuple[str, str]:
    return (obj.namespace, obj.name)


def max_kills(value: int | str | None, alive: int) -> int | None:
    """maxKillsPerCycle: a count, or a percentage of the live candidates ("25%", rounded down but at
    least 1 when above 0 %); None: no cap."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        percent = float(value.strip()[:-1])
        return 0 if percent <= 0 else max(1, math.floor(alive * percent / 100))
    return max(0, int(value))


# --- Per-target frequency (kube-monkey's mtbf, kill-type, kill-value) ------------------------------

_DURATION = re.compile(r"^([1-9][0-9]{0,5})([smhd]?)$")
_UNIT_SECONDS = {"": 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}  # no unit: days, as kube-monkey


@dataclasses.dataclass(frozen=True)
class Frequency:
    """A workload's own frequency: its mean time between failures and how many Pods a failure kills."""

    mtbf_seconds: float
    mode: str = KILL_FIXED
    value: int = 1


def parse_frequency(mtbf: str, mode: str, value: str) -> tuple[Frequency | None, str | None]:
    """The labels as a Frequency, or why they are not one. ``mtbf``: "3" (days, as kube-monkey),
    "3d", "12h", "90m", "600s"; ``mode``: fixed (default, ``value`` Pods, default 1), kill-all,
    fixed-percent or random-max-percent (``value`` 0-100)."""
    match = _DURATION.match(mtbf.strip())
    if not match:
        return None, f"{MTBF_LABEL}={mtbf!r} is not a duration like 3 (days), 3d, 12h, 90m or 600s"
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    mode = mode.strip() or KILL_FIXED
    if mode not in KILL_MODES:
        return None, f"{KILL_MODE_LABEL}={mode!r} is not one of {', '.join(KILL_MODES)}"
    if mode == KILL_ALL:
        return Frequency(seconds, mode, 0), None
    text = value.strip() or ("1" if mode == KILL_FIXED else "")
    if not text.isdigit():
        return None, f"{KILL_VALUE_LABEL}={value!r}: {mode} needs a whole number"
    number = int(text)
    if mode == KILL_FIXED and number < 1:
        return None, f"{KILL_VALUE_LABEL}={value!r}: fixed needs at least 1"
    if mode != KILL_FIXED and number > 100:
        return None, f"{KILL_VALUE_LABEL}={value!r}: {mode} needs a percentage from 0 to 100"
    return Frequency(seconds, mode, number), None


def failure_probability(mtbf_seconds: float, elapsed: float) -> float:
    """The chance that a workload with this mean time between failures fails within ``elapsed``
    seconds (failures as a Poisson process: 1 - e^(-elapsed/mtbf))."""
    return 1.0 - math.exp(-max(0.0, elapsed) / mtbf_seconds)


def frequency_elapsed(last_cycle_epoch: float | None, now: float, pause: int) -> float:
    """The time this cycle stands for: since the last chaos cycle, at most two pauses (time the agent
    idled, was paused or the operator was down does not count), one pause for the first cycle."""
    if last_cycle_epoch is None:
        return float(pause)
    return min(max(0.0, now - last_cycle_epoch), 2.0 * pause)


def kill_count(frequency: Frequency, alive: int, rng: random.Random) -> int:
    """How many of a workload's ``alive`` Pods one failure kills (before the agent's caps)."""
    if frequency.mode == KILL_ALL:
        return alive
    if frequency.mode == KILL_FIXED:
        return min(alive, frequency.value)
    most = math.floor(alive * frequency.value / 100)
    if frequency.mode == KILL_FIXED_PERCENT:
        return min(alive, max(1, most)) if frequency.value > 0 else 0
    return rng.randint(0, most)  # random-max-percent, as kube-monkey: from none up to the percentage


@dataclasses.dataclass(frozen=True)
class FrequencyPlan:
    """Which workloads have their own frequency, which of their Pods fail this cycle, and the labels
    that could not be read (those workloads are left alone: never killed at the agent's eagerness)."""

    workloads: frozenset[str] = frozenset()
    chosen: frozenset[tuple[str, str]] = frozenset()
    problems: tuple[str, ...] = ()


def frequency_plan(pods: Sequence[PodRef], elapsed: float, rng: random.Random) -> FrequencyPlan:
    """Each labelled workload (in name order) fails with failure_probability(mtbf, elapsed); a failing
    one loses kill_count Pods, drawn at random. The labels of its first Pod (by name) count."""
    groups: dict[str, list[PodRef]] = {}
    for pod in sorted((p for p in pods if not p.terminating), key=_key):
        groups.setdefault(pod.workload, []).append(pod)
    workloads: set[str] = set()
    chosen: set[tuple[str, str]] = set()
    problems: list[str] = []
    for workload in sorted(groups, key=lambda w: _key(groups[w][0])):
        members = groups[workload]
        labelled = next((p for p in members if p.mtbf or p.kill_mode or p.kill_value), None)
        if labelled is None:
            continue
        workloads.add(workload)
        frequency, problem = parse_frequency(labelled.mtbf, labelled.kill_mode, labelled.kill_value)
        if frequency is None:
            problems.append(f"{labelled.namespace}/{labelled.name}: {problem}")
            continue
        if rng.random() < failure_probability(frequency.mtbf_seconds, elapsed):
            count = kill_count(frequency, len(members), rng)
            chosen.update(_key(p) for p in rng.sample(members, count))
    return FrequencyPlan(frozenset(workloads), frozenset(chosen), tuple(problems))


def pick_pods(pods: Sequence[PodRef], tolerance: int, eagerness: int, rng: random.Random,
              cap: int | None = None, allow_single_replica: bool = True,
              frequency: FrequencyPlan | None = None) -> list[PodRef]:
    """Pods to kill: only when at least ``tolerance`` live pods match, never below ``tolerance``,
    never pods already being deleted, at most ``cap``; without ``allow_single_replica`` never the
    last ready replica of a workload (a bare pod is a workload of one). The workloads of
    ``frequency`` follow their own frequency instead of ``eagerness`` and come first (the caps
    still apply to them)."""
    alive = sorted((p for p in pods if not p.terminating), key=_key)
    if len(alive) < tolerance:
        return []
    budget = len(alive) - tolerance
    if cap is not None:
        budget = min(budget, cap)
    ready = collections.Counter(p.workload for p in alive if p.ready)
    left = {w: n - 1 for w, n in ready.items()}  # each workload keeps at least one ready replica
    own = frequency or FrequencyPlan()
    ordered = [p for p in alive if p.workload in own.workloads] + [p for p in alive if p.workload not in own.workloads]
    picked: list[PodRef] = []
    for pod in ordered:
        # Eagerness draws for every other pod, so decisions do not shift with the budget.
        chosen = _key(pod) in own.chosen if pod.workload in own.workloads else eager(rng, eagerness)
        if not chosen or len(picked) >= budget:
            continue
        if not allow_single_replica:
            if left.get(pod.workload, 0) <= 0:
                continue
            left[pod.workload] -= 1
        picked.append(pod)
    return picked


def doubled(replicas: int) -> int:
    """The cancer growth: double, capped at MAX_REPLICAS; 0 stays 0; never shrink."""
    if replicas <= 0:
        return 0
    return max(replicas, min(replicas * 2, MAX_REPLICAS))


def pick_deployments(deployments: Sequence[DeploymentRef], eagerness: int,
                     rng: random.Random, budget: int | None = None) -> list[tuple[DeploymentRef, int]]:
    """Deployments to grow; ``budget``: how many replicas may still be added (the cluster-wide cap),
    the last pick grows only by what is left."""
    picked: list[tuple[DeploymentRef, int]] = []
    for dep in sorted(deployments, key=_key):
        chosen = eager(rng, eagerness)
        target = doubled(dep.replicas)
        if budget is not None:
            target = min(target, dep.replicas + max(0, budget))
        if chosen and target != dep.replicas:
            picked.append((dep, target))
            if budget is not None:
                budget -= target - dep.replicas
    return picked


def added_replicas(ledgers: Iterable[Mapping[str, Any]]) -> int:
    """Replicas the agents' cancer added and not yet reverted (from their ledgers' undo entries)."""
    return sum(max(0, int(entry.get("written") or 0) - int(entry.get("before") or 0))
               for ledger in ledgers for entry in (ledger.get("undo") or {}).values()
               if entry.get("kind") == "Deployment")


def ipsum_eligible(cm: ConfigMapRef) -> bool:
    return not cm.immutable and bool(cm.data)


def pick_configmaps(configmaps: Sequence[ConfigMapRef], eagerness: int, rng: random.Random) -> list[ConfigMapRef]:
    picked: list[ConfigMapRef] = []
    for cm in sorted(configmaps, key=_key):
        chosen = eager(rng, eagerness)
        if chosen and ipsum_eligible(cm):
            picked.append(cm)
    return picked


def ipsum_data(data: Mapping[str, str], paragraph: Callable[[], str]) -> dict[str, str]:
    """The same keys, every value replaced by a lorem paragraph."""
    return {key: paragraph() for key in data}


# --- Ledger ---------------------------------------------------------------------------------------


def target_key(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}"


def empty_ledger(agent: str, agent_uid: str) -> dict[str, Any]:
    return {"version": 1, "agent": agent, "agentUid": agent_uid, "cycle": 0, "lastCycleAt": None,
            "lastCycleEpoch": None,
            "counts": {m: 0 for m in MODES}, "wouldBe": {m: 0 for m in MODES},
            "undo": {}, "journal": []}


def normalise_ledger(raw: Mapping[str, Any] | None, agent: str, agent_uid: str) -> dict[str, Any]:
    """A ledger of another agent with the same name (deleted and recreated) starts afresh."""
    if not raw or raw.get("agentUid") != agent_uid:
        return empty_ledger(agent, agent_uid)
    ledger = empty_ledger(agent, agent_uid)
    ledger.update({k: v for k, v in raw.items() if k in ledger})
    return ledger


def journal(ledger: dict[str, Any], entry: Mapping[str, Any]) -> None:
    ledger["journal"] = [*ledger.get("journal", []), dict(entry)][-JOURNAL_LIMIT:]


def record_undo(ledger: dict[str, Any], key: str, entry: Mapping[str, Any],
                current_fingerprint: Any) -> None:
    """Remember the state before our write. When we already changed this object and it still shows
    what we wrote, keep the ORIGINAL before-state (4 -> 8 after 2 -> 4 still reverts to 2)."""
    undo = ledger.setdefault("undo", {})
    previous = undo.get(key)
    merged = dict(entry)
    if previous and previous.get("uid") == entry.get("uid") and previous.get("written") == current_fingerprint:
        merged["before"] = previous["before"]
        merged["firstAt"] = previous.get("firstAt")
        merged["actions"] = int(previous.get("actions", 1)) + 1
    undo[key] = merged


def ledger_size(ledger: Mapping[str, Any]) -> int:
    return len(json.dumps(ledger, separators=(",", ":")))


def data_fingerprint(data: Mapping[str, str] | None) -> str:
    return stable_hash(dict(data or {}))


# --- Revert ---------------------------------------------------------------------------------------

RESTORE, CHANGED, GONE, UNCHANGED = "restore", "changed", "gone", "unchanged"


def revert_verdict(entry: Mapping[str, Any], current: Mapping[str, Any] | None) -> str:
    """May we restore ``entry``'s before-state over ``current`` (the object as it is now)?

    Only when the object is the same one (uid) and still shows exactly what we wrote: for a
    Deployment the replicas we set and (when known) the generation our scale produced; for a
    ConfigMap the hash of the data we wrote. Anything else is someone else's change: reported."""
    if current is None:
        return GONE
    meta = current.get("metadata", {})
    if meta.get("uid") != entry.get("uid"):
        return GONE
    if entry.get("kind") == "Deployment":
        replicas = (current.get("spec") or {}).get("replicas")
        if entry.get("pending") and replicas == entry.get("before"):
            return UNCHANGED  # a crash before our write happened: nothing to undo
        if replicas != entry.get("written"):
            return CHANGED
        generation = entry.get("generation")
        if generation is not None and meta.get("generation") != generation:
            return CHANGED
        return RESTORE
    if entry.get("pending") and data_fingerprint(current.get("data")) == data_fingerprint(entry.get("before")):
        return UNCHANGED
    if data_fingerprint(current.get("data")) != entry.get("written"):
        return CHANGED
    return RESTORE


# --- Status ---------------------------------------------------------------------------------------


def seconds_until_next_cycle(last_cycle_epoch: float | None, now_epoch: float, pause: int) -> float:
    """After a restart, wait out the rest of the pause instead of running a cycle at once."""
    if last_cycle_epoch is None:
        return 0.0
    return max(0.0, min(float(pause), last_cycle_epoch + pause - now_epoch))


# --- A cycle, step by step (the controller applies what these return) ------------------------------

REVERT_STEP, PAUSED_STEP, INVALID_STEP, IDLE_STEP, CHAOS_STEP = "revert", "paused", "invalid", "idle", "chaos"
STOPPED_STEP = "stopped"  # the global kill switch
EXCLUDED_DATE_STEP = "excluded-date"  # today is one of excludedDates


def must_halt(settings: AgentSettings, kill_switch: bool) -> bool:
    """Whether a running cycle must stop before its next action (checked before every one): an
    emergency stop acts at once, not at the next cycle."""
    return kill_switch or settings.paused or settings.revert


def still_wanted(live: AgentSettings, planned: AgentSettings, mode: str, namespace: str,
                 operator_namespace: str) -> bool:
    """Whether a planned action still matches the agent's live spec (an edit in the middle of a cycle):
    its mode still on, its namespace still allowed, and no dry-run switched on since the plan."""
    enabled = {TANTRUM: live.tantrum, CANCER: live.cancer, IPSUM: live.ipsum}[mode]
    return (enabled and not live.scope_problem and namespace_allowed(namespace, live, operator_namespace)
            and (planned.dry_run or not live.dry_run))


def halt_state(settings: AgentSettings, kill_switch: bool) -> tuple[bool, bool, bool]:
    """What wakes a sleeping agent when it changes: the kill switch, paused, revert."""
    return (kill_switch, settings.paused, settings.revert)


def kill_switch_on(operator_namespace_labels: Mapping[str, str] | None, stop_all: bool) -> bool:
    """The global kill switch: the chart's stopAll, or the label on the operator's namespace."""
    return stop_all or str((operator_namespace_labels or {}).get(KILL_SWITCH_LABEL, "")).lower() == "true"


def revert_failures(summary: Mapping[str, Any]) -> list[str]:
    """The ledger entries a revert could not restore (kept in the ledger for the next try)."""
    return list(summary.get("failed") or ())


def cycle_step(settings: AgentSettings, now: float | None = None, kill_switch: bool = False) -> str:
    """What this cycle does: revert wins over pause (and over the kill switch: undoing is stopping),
    pause over a closed time window, then chaos. Windows in an unknown time zone: the agent idles and
    reports it (revert and pause still work)."""
    if settings.revert:
        return REVERT_STEP
    if kill_switch:
        return STOPPED_STEP
    if settings.paused:
        return PAUSED_STEP
    if spec_problem(settings):
        return INVALID_STEP
    if now is not None and settings.excluded_dates and excluded_date(settings.excluded_dates,
                                                                     settings.time_zone, now):
        return EXCLUDED_DATE_STEP
    if now is not None and settings.windows and not in_windows(settings.windows, settings.time_zone, now):
        return IDLE_STEP
    return CHAOS_STEP


def spec_problem(settings: AgentSettings) -> str | None:
    """What the schema could not check: the time zone (when windows or dates use it) and the
    pod-name regular expressions. The agent then idles, Stalled with reason InvalidSpec."""
    if settings.scope_problem:
        return settings.scope_problem
    if settings.windows or settings.excluded_dates:
        problem = window_problem(settings)
        if problem:
            return problem
    return (regex_problem("podNames.include", settings.pod_names_included)
            or regex_problem("podNames.exclude", settings.pod_names_excluded))


def excluded_date(dates: Iterable[str], time_zone: str, now: float) -> str | None:
    """The entry of ``dates`` that today (``now`` in ``time_zone``) is: "YYYY-MM-DD" once, "MM-DD"
    every year (chaoskube's --excluded-days-of-year); None on any other day."""
    today = datetime.datetime.fromtimestamp(now, zoneinfo.ZoneInfo(time_zone)).date()
    for date in dates:
        if date in (today.isoformat(), today.isoformat()[5:]):
            return date
    return None


# --- Time windows ---------------------------------------------------------------------------------


def _minutes(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


def _window_days(window: Mapping[str, Any]) -> set[int]:
    days = window.get("weekdays") or WEEKDAYS
    return {WEEKDAYS.index(d[:3].title()) for d in days}


def in_windows(windows: Sequence[Mapping[str, Any]], time_zone: str, now: float) -> bool:
    """Whether ``now`` (epoch) falls in one of the windows, in ``time_zone`` (its daylight saving
    included). A window is weekdays (default all) and from/to times of day ("HH:MM", from inclusive,
    to exclusive); to <= from spans midnight (the weekday is the one it starts on)."""
    local = datetime.datetime.fromtimestamp(now, zoneinfo.ZoneInfo(time_zone))
    minute, day = local.hour * 60 + local.minute, local.weekday()
    for window in windows:
        start, end = _minutes(window.get("from", "00:00")), _minutes(window.get("to", "00:00"))
        days = _window_days(window)
        if start < end:
            if day in days and start <= minute < end:
                return True
        elif (day in days and minute >= start) or ((day - 1) % 7 in days and minute < end):
            return True
    return False


def next_window_start(windows: Sequence[Mapping[str, Any]], time_zone: str, now: float) -> str | None:
    """When the next window opens, in the windows' time zone (ISO, for status)."""
    zone = zoneinfo.ZoneInfo(time_zone)
    local = datetime.datetime.fromtimestamp(now, zone)
    starts = []
    for offset in range(8):
        date = (local + datetime.timedelta(days=offset)).date()
        for window in windows:
            if date.weekday() in _window_days(window):
                start = _minutes(window.get("from", "00:00"))
                at = datetime.datetime.combine(date, datetime.time(start // 60, start % 60), zone)
                if at > local:
                    starts.append(at)
    return min(starts).isoformat(timespec="minutes") if starts else None


def window_problem(settings: AgentSettings) -> str | None:
    """A timeZone or window the schema could not check (the agent idles and says so)."""
    try:
        zoneinfo.ZoneInfo(settings.time_zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"timeZone {settings.time_zone!r} is not a known IANA time zone (e.g. Europe/Berlin)"
    return None


# --- Other operators' objects ---------------------------------------------------------------------


def copyrator_sources(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a Copyrator rule reads (fields at the top level or under spec): its ConfigMap sources'
    namespaces and label selector. Small, for an index; empty when the rule is not about ConfigMaps."""
    spec = body.get("spec")
    fields: Mapping[str, Any] = spec if isinstance(spec, Mapping) else body
    if str(fields.get("ruleType", "")).lower() != "configmap" or not isinstance(fields.get("selector"), Mapping):
        return []
    namespaces = fields.get("namespace")
    # Malformed rules (Copyrator reports them) must not break this index: anything but a name or a
    # list of names names nothing.
    namespaces = [namespaces] if isinstance(namespaces, str) else namespaces if isinstance(namespaces, list) else []
    return [{"namespace": ns, "selector": dict(fields["selector"])} for ns in namespaces if isinstance(ns, str)]


def is_copyrator_source(namespace: str, labels: Mapping[str, str] | None,
                        sources: Iterable[Mapping[str, Any]]) -> bool:
    return any(src["namespace"] == namespace and matches_label_selector(labels, {"matchLabels": src["selector"]})
               for src in sources)


# --- Webhook --------------------------------------------------------------------------------------


def webhook_refusal(url: str, allowed_hosts: Sequence[str]) -> str | None:
    """Why a webhook URL may not be used (None: it may): http(s) only, and only the operator's
    allowed hosts when CHAOS_WEBHOOK_HOSTS is set."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return "the webhook address must be an http:// or https:// URL"
    if allowed_hosts and parsed.hostname.lower() not in allowed_hosts:
        return f"webhook host {parsed.hostname} is not in the operator's CHAOS_WEBHOOK_HOSTS"
    return None


def webhook_payload(agent: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One action as the webhook receives it (names and counts, never ConfigMap values)."""
    keys = ("cycle", "at", "mode", "kind", "namespace", "name", "outcome", "dryRun")
    return {"agent": agent, **{k: entry.get(k) for k in keys}}


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The candidates of one cycle, after the deny-list and the spec's scope."""

    pods: tuple[PodRef, ...] = ()
    deployments: tuple[DeploymentRef, ...] = ()
    configmaps: tuple[ConfigMapRef, ...] = ()

    def counts(self) -> dict[str, int]:
        return {"pods": len(self.pods), "deployments": len(self.deployments), "configMaps": len(self.configmaps)}


@dataclasses.dataclass(frozen=True)
class Plan:
    kills: tuple[PodRef, ...] = ()
    scales: tuple[tuple[DeploymentRef, int], ...] = ()
    writes: tuple[ConfigMapRef, ...] = ()
    frequency_problems: tuple[str, ...] = ()  # blackadder.io/mtbf labels that could not be read


MTBF = "mtbf"  # the random source of per-target frequencies


def plan_cycle(inventory: Inventory, settings: AgentSettings, cycle: int,
               replica_budget: int | None = None, elapsed: float | None = None) -> Plan:
    """Which candidates each enabled mode acts on in this cycle. ``elapsed``: the seconds this
    cycle stands for (frequency_elapsed), for the workloads' own frequencies (default: pauseDuration)."""
    alive = sum(1 for p in inventory.pods if not p.terminating)
    frequency = None
    if settings.tantrum and settings.target_frequency == "Honour":
        frequency = frequency_plan(inventory.pods, settings.pause if elapsed is None else elapsed,
                                   rng_for(settings.seed, cycle, MTBF))
    kills = pick_pods(inventory.pods, settings.tolerance, settings.eagerness, rng_for(settings.seed, cycle, TANTRUM),
                      cap=max_kills(settings.max_kills, alive),
                      allow_single_replica=settings.allow_single_replica,
                      frequency=frequency) if settings.tantrum else []
    scales = pick_deployments(inventory.deployments, settings.eagerness, rng_for(settings.seed, cycle, CANCER),
                              budget=replica_budget) if settings.cancer else []
    writes = pick_configmaps(inventory.configmaps, settings.eagerness,
                             rng_for(settings.seed, cycle, IPSUM)) if settings.ipsum else []
    return Plan(tuple(kills), tuple(scales), tuple(writes), frequency.problems if frequency else ())


def deployment_undo(dep: DeploymentRef, wanted: int, now: str) -> dict[str, Any]:
    # The generation our scale will produce: one more than listed (a concurrent spec change makes it
    # differ, and revert then reports the Deployment as changed instead of overwriting it).
    generation = dep.generation + 1 if dep.generation else None
    return {"kind": "Deployment", "namespace": dep.namespace, "name": dep.name, "uid": dep.uid,
            "before": dep.replicas, "written": wanted, "generation": generation, "firstAt": now, "lastAt": now,
            "actions": 1, "pending": True}


def write_ahead(ledger: dict[str, Any], plan: Plan, now: str, paragraph: Callable[[], str]
                ) -> tuple[list[tuple[ConfigMapRef, dict[str, str]]], list[ConfigMapRef]]:
    """Record the before-state of every planned change in ``ledger`` BEFORE making it (a crash between
    the write and the ledger update never loses an original). Returns the ConfigMap writes with their
    new data, and the ConfigMaps refused because their undo would not fit the ledger."""
    for dep, wanted in plan.scales:
        record_undo(ledger, target_key("Deployment", dep.namespace, dep.name), deployment_undo(dep, wanted, now),
                    dep.replicas)
    planned: list[tuple[ConfigMapRef, dict[str, str]]] = []
    refused: list[ConfigMapRef] = []
    for cm in plan.writes:
        new_data = ipsum_data(cm.data or {}, paragraph)
        key = target_key("ConfigMap", cm.namespace, cm.name)
        trial = {**ledger, "undo": dict(ledger.get("undo") or {})}
        record_undo(trial, key, {"kind": "ConfigMap", "namespace": cm.namespace, "name": cm.name, "uid": cm.uid,
                                 "before": dict(cm.data or {}), "written": data_fingerprint(new_data),
                                 "firstAt": now, "lastAt": now, "actions": 1, "pending": True},
                    data_fingerprint(cm.data))
        if ledger_size(trial) > LEDGER_BUDGET_BYTES:
            refused.append(cm)
            continue
        ledger["undo"] = trial["undo"]
        planned.append((cm, new_data))
    return planned, refused


def forget_undo(ledger: dict[str, Any], previous_undo: Mapping[str, Any], key: str) -> None:
    """An action that did not happen: drop its write-ahead entry (keeping an older one if any)."""
    if key in previous_undo:
        ledger["undo"][key] = previous_undo[key]
    else:
        ledger["undo"].pop(key, None)


def scale_patch(expected: int, replicas: int) -> list[dict[str, Any]]:
    """A JSON patch that fails (422) unless the replicas are still what we expect."""
    return [{"op": "test", "path": "/spec/replicas", "value": expected},
            {"op": "replace", "path": "/spec/replicas", "value": replicas}]


# --- Status -----------------------------------------------------------------------------------------


# Reasons that need a person: the agent cannot act until its spec is fixed (kstatus: Failed).
STALLED_REASONS = frozenset({"InvalidSpec"})


def conditions_for(previous: Any, settings: AgentSettings, generation: int | None,
                   ready: bool, reason: str, message: str, stalled: bool = False) -> list[dict[str, Any]]:
    """Ready (the last cycle succeeded, or the agent idles by design: paused, outside its windows,
    reverted), Stalled (``stalled``: it cannot work until a person acts), else Reconciling (a failed
    cycle that the next one retries); plus Paused and DryRun."""
    conds = kstatus_conditions(previous, ready=ready, stalled=stalled, reason=reason, message=message,
                               observed_generation=generation)
    conds = set_condition(conds, "Paused", settings.paused, "Spec" if settings.paused else "Running",
                          "paused: true in the spec" if settings.paused else "acting every pauseDuration",
                          generation)
    dry_msg = {"OperatorForced": "CHAOS_DRY_RUN=true forces dry-run for every agent",
               "Spec": "dryRun: true in the spec"}.get(settings.dry_run_reason, "actions are real")
    return set_condition(conds, "DryRun", settings.dry_run, settings.dry_run_reason or "Off", dry_msg, generation)


STATES = {"Reverted": "Reverted", "Paused": "Paused", "KillSwitch": "Paused", "OutsideWindow": "Idle",
          "ExcludedDate": "Idle",
          "CycleFailed": "Failed", "InvalidSpec": "Failed"}


def simple_status(previous: Any, settings: AgentSettings, generation: int | None, ready: bool, reason: str,
                  message: str, stalled: bool | None = None) -> dict[str, Any]:
    """The status of a cycle that did no chaos (revert, paused, idle outside its windows, failed).
    ``stalled`` None: by the reason (STALLED_REASONS)."""
    stalled = reason in STALLED_REASONS if stalled is None else stalled
    conditions = conditions_for(previous, settings, generation, ready, reason, message, stalled)
    conditions = set_condition(conditions, "Active", False, reason, message, generation)
    status: dict[str, Any] = {"observedGeneration": generation, "state": STATES.get(reason, reason),
                              "conditions": conditions}
    if ready:
        status["dryRun"] = settings.dry_run
    return status


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether patching ``new`` over ``old`` changes anything but condition timestamps."""
    def comparable(status: Mapping[str, Any]) -> dict[str, Any]:
        view = {k: v for k, v in status.items() if k != "conditions"}
        view["conditions"] = sorted(sorted((k, str(v)) for k, v in c.items() if k != "lastTransitionTime")
                                     for c in status.get("conditions") or ())
        return view
    return comparable({k: old.get(k) for k in new}) != comparable(new)


def cycle_status(previous: Any, settings: AgentSettings, generation: int | None, ledger: Mapping[str, Any],
                 done: Mapping[str, int], skipped: int, candidates: Mapping[str, int],
                 ledger_ref: str, frequency_problems: Sequence[str] = ()) -> dict[str, Any]:
    cycle = ledger["cycle"]
    done_msg = ", ".join(f"{m} {n}" for m, n in done.items())
    if frequency_problems:
        done_msg += (f"; {len(frequency_problems)} workload(s) left alone for unreadable {MTBF_LABEL} labels: "
                     + "; ".join(frequency_problems[:3]))
    return {
        "observedGeneration": generation, "cycle": cycle, "lastCycleTime": ledger["lastCycleAt"],
        "dryRun": settings.dry_run, "actions": ledger["counts"], "wouldBe": ledger["wouldBe"],
        "lastCycle": {"cycle": cycle, "dryRun": settings.dry_run, "skipped": skipped,
                      "candidates": dict(candidates), **done,
                      # always written, so that a fixed label clears it (a status patch merges)
                      "invalidFrequencyLabels": list(frequency_problems[:10])},
        "ledger": ledger_ref,
        "state": "Active",
        "conditions": set_condition(
            conditions_for(previous, settings, generation, True, "CycleDone",
                           f"cycle {cycle}: {'would ' if settings.dry_run else ''}{done_msg}"),
            "Active", True, "InWindow" if settings.windows else "Always",
            "inside activeWindows" if settings.windows else "no activeWindows: always active", generation),
    }
