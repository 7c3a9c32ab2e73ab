"""Blackadder: what an agent is told (pure, no API calls): the constants, the operator's ``Options``,
an agent's ``AgentSettings`` from its spec (a TenantChaosAgent's bounded by the administrator's
limits) and the names of its ledger."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.core.conventions import DOMAIN, env_bool, env_float, env_list, stable_hash
from kopf_operators.core.http import credentials_refusal

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
# A TenantChaosAgent's steady-state checks, bounded (the process's HTTP is shared with administrators).
DEFAULT_TENANT_MAX_CHECKS = 4
DEFAULT_TENANT_MAX_CHECK_TIMEOUT = 5
DEFAULT_TENANT_MIN_CHECK_INTERVAL = 5
DEFAULT_TENANT_MAX_AGENTS = 5  # per namespace
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
    # CHAOS_TENANT_HTTP_HOSTS: the only hosts tenants' HTTP checks may ask (empty: none), a list of its
    # own: a host only the administrators' checks may ask (CHAOS_CHECK_HOSTS) is refused to tenants.
    tenant_http_hosts: tuple[str, ...] = ()
    tenant_max_checks: int = DEFAULT_TENANT_MAX_CHECKS  # CHAOS_TENANTS_MAX_CHECKS (per agent)
    tenant_max_check_timeout: int = DEFAULT_TENANT_MAX_CHECK_TIMEOUT  # CHAOS_TENANTS_MAX_CHECK_TIMEOUT_SECONDS
    tenant_min_check_interval: int = DEFAULT_TENANT_MIN_CHECK_INTERVAL  # CHAOS_TENANTS_MIN_CHECK_INTERVAL_SECONDS
    tenant_max_agents: int = DEFAULT_TENANT_MAX_AGENTS  # CHAOS_TENANTS_MAX_AGENTS_PER_NAMESPACE
    # Steady-state checks (spec.steadyState): CHAOS_CHECK_HOSTS, the only hosts HTTP checks may ask
    # (empty: none); CHAOS_PROMETHEUS_URL, the Prometheus that prometheus checks query (empty: none).
    check_hosts: tuple[str, ...] = ()
    prometheus_url: str = ""
    # CHAOS_SPARE_ROLLOUTS (chart operators.blackadder.spareRollouts): no pod of a workload in the middle
    # of its rollout, or with a change the re-roller holds back, is killed, and no such Deployment doubled.
    spare_rollouts: bool = True

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
                                                                         DEFAULT_TENANT_MIN_PAUSE))),
                   tenant_http_hosts=tuple(h.lower() for h in env_list(env, "CHAOS_TENANT_HTTP_HOSTS")),
                   tenant_max_checks=max(0, int(env_float(env, "CHAOS_TENANTS_MAX_CHECKS",
                                                          DEFAULT_TENANT_MAX_CHECKS))),
                   tenant_max_check_timeout=max(1, int(env_float(env, "CHAOS_TENANTS_MAX_CHECK_TIMEOUT_SECONDS",
                                                                 DEFAULT_TENANT_MAX_CHECK_TIMEOUT))),
                   tenant_min_check_interval=max(1, int(env_float(env, "CHAOS_TENANTS_MIN_CHECK_INTERVAL_SECONDS",
                                                                  DEFAULT_TENANT_MIN_CHECK_INTERVAL))),
                   tenant_max_agents=max(0, int(env_float(env, "CHAOS_TENANTS_MAX_AGENTS_PER_NAMESPACE",
                                                          DEFAULT_TENANT_MAX_AGENTS))),
                   check_hosts=tuple(h.lower() for h in env_list(env, "CHAOS_CHECK_HOSTS")),
                   prometheus_url=(env.get("CHAOS_PROMETHEUS_URL") or "").strip(),
                   spare_rollouts=env_bool(env, "CHAOS_SPARE_ROLLOUTS", True))



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
    # namespace, or over the administrator's limits): reported as InvalidSpec, like what the schema
    # could not check. Nothing runs then, its steady-state checks neither.
    scope_problem: str = ""
    # What is wrong with spec.steadyState (a check URL with credentials): InvalidSpec too.
    steady_problem: str = ""


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
        steady_problem=checks_problem(spec) or "",
    )


def _checks(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in ((spec.get("steadyState") or {}).get("checks") or ()) if isinstance(c, Mapping)]


def checks_problem(spec: Mapping[str, Any]) -> str | None:
    """What no check may have, whoever asks: a URL with credentials (the message never shows it)."""
    for check in _checks(spec):
        url = str((check.get("http") or {}).get("url") or "")
        refusal = credentials_refusal(url, f"check {check.get('name')!s:.63}") if url else None
        if refusal:
            return refusal
    return None


def _number(value: Any) -> float | None:
    """A number from a spec (None when unset or unreadable: the schema's default then applies)."""
    try:
        return None if value is None or value == "" else float(value)
    except (TypeError, ValueError):
        return None


def tenant_checks_problem(spec: Mapping[str, Any], settings: Options) -> str | None:
    """A TenantChaosAgent's steady state over the administrator's limits (refused, not trimmed: a
    check silently dropped or cut short would judge a different hypothesis)."""
    checks = _checks(spec)
    if len(checks) > settings.tenant_max_checks:
        return (f"spec.steadyState has {len(checks)} checks; TenantChaosAgents may have at most "
                f"{settings.tenant_max_checks} (chart: operators.blackadder.tenants.maxChecks)")
    for check in checks:
        timeout = _number((check.get("http") or {}).get("timeoutSeconds"))
        if timeout is not None and timeout > settings.tenant_max_check_timeout:
            return (f"check {check.get('name')!s:.63} has timeoutSeconds {timeout:g}; TenantChaosAgents may wait at "
                    f"most {settings.tenant_max_check_timeout} s (chart: operators.blackadder.tenants."
                    "maxCheckTimeoutSeconds)")
    interval = _number((spec.get("steadyState") or {}).get("intervalSeconds"))
    if checks and interval is not None and interval < settings.tenant_min_check_interval:
        return (f"spec.steadyState.intervalSeconds is {interval:g}; TenantChaosAgents check at most every "
                f"{settings.tenant_min_check_interval} s (chart: operators.blackadder.tenants.minCheckIntervalSeconds)")
    return None


def tenant_settings(spec: Mapping[str, Any], namespace: str, settings: Options, operator_namespace: str,
                    namespace_labels: Mapping[str, str] | None) -> AgentSettings:
    """A TenantChaosAgent's effective settings: its spec read as a ChaosAgent's, then confined to its
    own namespace (whatever the spec says: the schema has no namespace field, this is the second
    line) and bounded by the administrator's limits (min of spec and limit; the longer pause)."""
    base = settings_from_spec(spec, settings.dry_run)
    spec_kills = base.max_kills
    kills = settings.tenant_max_kills if not isinstance(spec_kills, int) else min(spec_kills,
                                                                                   settings.tenant_max_kills)
    problem = (tenant_scope_problem(namespace, settings, operator_namespace, namespace_labels)
               or tenant_checks_problem(spec, settings) or "")
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


def tenant_agents_problem(live: Mapping[str, tuple[str, str]], uid: str, namespace: str, limit: int) -> str:
    """Why this TenantChaosAgent may not act because its namespace has more than ``limit`` live agents
    (``live``: uid -> (creationTimestamp, name)): the oldest ``limit`` act, a newer one does not ("" when
    it may). Decided from the agents this process runs, so the same agents act whichever starts first."""
    ranked = sorted(live, key=lambda u: (*live[u], u))
    if uid not in live or ranked.index(uid) < limit:
        return ""
    return (f"namespace {namespace} has {len(live)} TenantChaosAgents; at most {limit} act (the oldest; chart: "
            "operators.blackadder.tenants.maxAgentsPerNamespace)")


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
