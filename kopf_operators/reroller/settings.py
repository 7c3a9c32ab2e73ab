"""Re-roller: the annotation keys it reads and writes, its options (from the environment) and label
selectors (pure).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from typing import Literal

from kopf_operators.core.conventions import DOMAIN, env_bool, env_float, env_list

PREFIX = f"reroller.{DOMAIN}"

# Our opt-in keys (on the workload or on its pod template).
AUTO = f"{PREFIX}/auto"                  # "true": every ConfigMap/Secret the pod template references
CONFIGMAPS = f"{PREFIX}/configmaps"      # "a,b": these ConfigMaps (exact names, referenced or not)
SECRETS = f"{PREFIX}/secrets"            # "x": these Secrets
# "true": roll only when a key the pod template uses changes (not any key of a shared source).
USED_KEYS_ONLY = f"{PREFIX}/used-keys-only"

# stakater Reloader's keys, with Reloader's meaning (see docs/reroller.md).
RELOADER = "reloader.stakater.com"
RELOADER_AUTO = f"{RELOADER}/auto"
RELOADER_CONFIGMAP_AUTO = "configmap.reloader.stakater.com/auto"
RELOADER_SECRET_AUTO = "secret.reloader.stakater.com/auto"
RELOADER_CONFIGMAPS = "configmap.reloader.stakater.com/reload"   # names are anchored regexes
RELOADER_SECRETS = "secret.reloader.stakater.com/reload"
RELOADER_SEARCH = f"{RELOADER}/search"      # workload: roll on referenced sources marked match
RELOADER_MATCH = f"{RELOADER}/match"        # source
RELOADER_IGNORE = f"{RELOADER}/ignore"      # source: never rolls anything
RELOADER_CONFIGMAPS_EXCLUDE = "configmaps.exclude.reloader.stakater.com/reload"
RELOADER_SECRETS_EXCLUDE = "secrets.exclude.reloader.stakater.com/reload"
ROLLOUT_STRATEGY = f"{RELOADER}/rollout-strategy"  # Argo Rollout: "restart" sets spec.restartAt
PAUSE_PERIOD = "deployment.reloader.stakater.com/pause-period"
PAUSED_AT = "deployment.reloader.stakater.com/paused-at"
LAST_RELOADED_FROM = f"{RELOADER}/last-reloaded-from"   # pod template, Reloader's JSON format
CRONJOB_INSTANTIATE = "cronjob.kubernetes.io/instantiate"
# Restart windows (workload metadata): a rollout starts only inside one; JSON, see ``windows``.
RESTART_WINDOW = f"{PREFIX}/restart-window"
RELOADER_RESTART_WINDOW = f"{RELOADER}/restart-window"
# CronJob: what a change does (CRONJOB_MODES; the default is REROLLER_CRONJOB_MODE).
CRONJOB_MODE = f"{PREFIX}/cronjob-mode"
CRONJOB_MODES = ("run-now", "next-run", "restart-active")
# History and restore (source metadata; ``history``): keep N versions; put one back.
HISTORY = f"{PREFIX}/history"            # "5": keep the last 5 versions of the data as snapshots
RESTORE = f"{PREFIX}/restore"            # "<hash>" or "previous": put that version back (then removed)
SNAPSHOT_OF = f"{PREFIX}/snapshot-of"    # label on a snapshot: its source's name
SNAPSHOT_HASH = f"{PREFIX}/snapshot-hash"        # snapshot: the data hash it holds
SNAPSHOT_VERSION = f"{PREFIX}/snapshot-version"  # snapshot: the source's resourceVersion when last current

# Progressive rollouts (``waves``). On a source (or cluster-wide: REROLLER_ROLLOUT): "progressive" fans
# its changes out in waves gated on health; "immediate" rolls every user at once (the default).
ROLLOUT = f"{PREFIX}/rollout"
ROLLOUT_MODES = ("immediate", "progressive")  # the values of ROLLOUT and REROLLER_ROLLOUT
# On a source: the first wave's size, "1" (workloads) or "10%" (of its users, at least one).
FIRST_WAVE = f"{PREFIX}/first-wave"
# On a source: how long a workload of a wave may take to finish its rollout ("10m"; Go's syntax).
WAVE_DEADLINE = f"{PREFIX}/wave-deadline"
# On a source: the data hash (its first 8 or more characters) whose held workloads an administrator
# releases: they roll, and the waves are over for that change.
RELEASE = f"{PREFIX}/release"
# On a workload: its place in every progression (lower first; unset: DEFAULT_PRIORITY).
WAVE = f"{PREFIX}/wave"
DEFAULT_PRIORITY = 100
MAX_PRIORITY = 1_000_000
MAX_PERCENT = 100.0
MIN_RELEASE_CHARS = 8

# Written by the operator.
# Workload metadata, written with a progressive rollout: "<observed hash>@<epoch seconds>" (its wave's
# deadline counts from then).
ROLLED = f"{PREFIX}/rolled"
CONFIG_HASH = f"{PREFIX}/config-hash"          # pod template: changing it rolls the workload
OBSERVED_HASH = f"{PREFIX}/observed-hash"      # workload metadata: the baseline (no rollout)
OBSERVED_SOURCES = f"{PREFIX}/observed-sources"  # workload metadata: short per-source hashes

# Reloader's env-vars strategy: STAKATER_<NAME>_<CONFIGMAP|SECRET> in the container using the source.
ENV_PREFIX = "STAKATER_"
STRATEGIES = ("annotations", "env-vars")

SourceKind = Literal["ConfigMap", "Secret"]
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "CronJob", "Job", "Rollout")
TEMPLATED = ("Deployment", "StatefulSet", "DaemonSet", "Rollout")  # rolled by a pod-template change
WORKLOAD_TYPE_NAMES = {"deployments": "Deployment", "statefulsets": "StatefulSet", "daemonsets": "DaemonSet",
                       "cronjobs": "CronJob", "jobs": "Job"}
# Names that are plain object names: indexed exactly. Anything else in a Reloader key is a pattern.
_PLAIN_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
WorkloadKey = tuple[str, str, str]  # (kind, namespace, name)
ABSENT = "absent"


# --- wave sizes ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WaveSize:
    count: int | None = 1         # this many workloads
    percent: float | None = None  # or this share of the users (at least one)

    def first(self, users: int) -> int:
        if self.percent is not None:
            return max(1, math.ceil(users * self.percent / 100))
        return max(1, self.count or 1)


def parse_wave_size(text: str | None) -> WaveSize:
    """"3" or "25%"; ValueError naming the problem for anything else."""
    value = (text or "").strip()
    if not value:
        return WaveSize()
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            raise ValueError(f"{value!r} is not a percentage like 25%") from None
        if not math.isfinite(percent) or not 0 < percent <= MAX_PERCENT:
            raise ValueError(f"{value!r}: a percentage must be above 0% and at most 100%")
        return WaveSize(count=None, percent=percent)
    if not value.isdigit() or len(value) > 6 or int(value) < 1:
        raise ValueError(f"{value!r} is not a count of workloads (1 to 999999) or a percentage like 25%")
    return WaveSize(count=int(value))


# --- options ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """The re-roller's options (environment variables, README's table); Reloader's flags in brackets."""

    debounce_seconds: float = 2.0        # merge window after a rollout (changes in it: one more rollout)
    min_interval_seconds: float = 10.0   # least time between two rollouts of one workload
    cluster_rate: float = 20.0           # cluster-wide rollouts per second (token bucket); 0: unlimited
    cluster_burst: float = 40.0          # bucket size: this many at once after a quiet period
    resync_seconds: float = 300.0        # level-triggered sweep over the indexes (no requests if nothing to do)
    auto_reload_all: bool = False        # [--auto-reload-all] every workload as if auto=true unless auto=false
    reload_on_create: bool = False       # [--reload-on-create] a watched source appearing rolls
    reload_on_delete: bool = False       # [--reload-on-delete] a watched source deleted rolls
    namespaces_to_ignore: tuple[str, ...] = ()        # [--namespaces-to-ignore]
    namespace_selector: str = ""         # [--namespace-selector] label selector on namespaces
    resource_label_selector: str = ""    # [--resource-label-selector] label selector on ConfigMaps/Secrets
    resources_to_ignore: tuple[str, ...] = ()         # [--resources-to-ignore] configmaps | secrets
    ignored_workload_types: tuple[str, ...] = ()      # [--ignored-workload-types] jobs, cronjobs, ...
    reload_strategy: str = "annotations"  # [--reload-strategy] annotations | env-vars
    metrics_by_namespace: bool = False    # [enableMetricsByNamespace] per-namespace reload counter
    argo_rollouts: bool = False           # [--is-Argo-Rollouts] Argo Rollouts (argoproj.io/v1alpha1) too
    cronjob_mode: str = "run-now"         # a CronJob without the cronjob-mode annotation: CRONJOB_MODES
    # restart-active deletes pods (those of a CronJob's unfinished Jobs): it needs pods delete on every
    # watched namespace, so it is an installation's explicit choice, off by default.
    allow_restart_active: bool = False
    # [--sync-after-restart, off by default there] changes made while the operator was down roll at
    # start; off: they become the baseline, as Reloader's default skips them.
    sync_after_restart: bool = True
    # Progressive rollouts for every source that does not say otherwise (ROLLOUT_MODES), the first
    # wave's size, and how long a workload of a wave may take to finish its rollout.
    rollout: str = "immediate"
    first_wave: WaveSize = WaveSize()
    wave_deadline_seconds: float = 600.0
    # Blackadder's CRD is installed (the chart says so): a progression asks the ChaosAgents which
    # workloads they disrupt before it calls a failed rollout a failure.
    chaos_aware: bool = False
    # Snapshots and restores of annotated sources (``history``): it writes ConfigMaps and Secrets in
    # tenants' namespaces, so the chart grants those verbs only with it.
    history: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Options:
        resources = tuple(r.lower() for r in env_list(env, "REROLLER_RESOURCES_TO_IGNORE"))
        for r in resources:
            if r not in ("configmaps", "secrets"):
                raise ValueError(f"REROLLER_RESOURCES_TO_IGNORE: {r!r} is not configmaps or secrets")
        if len(set(resources)) > 1:
            raise ValueError("REROLLER_RESOURCES_TO_IGNORE: ignore configmaps or secrets, not both")
        types = tuple(t.lower() for t in env_list(env, "REROLLER_IGNORED_WORKLOAD_TYPES"))
        for t in types:
            if t not in WORKLOAD_TYPE_NAMES:
                raise ValueError(f"REROLLER_IGNORED_WORKLOAD_TYPES: {t!r} is not one of "
                                 f"{', '.join(sorted(WORKLOAD_TYPE_NAMES))}")
        namespace_selector = env.get("REROLLER_NAMESPACE_SELECTOR", "").strip()
        resource_selector = env.get("REROLLER_RESOURCE_LABEL_SELECTOR", "").strip()
        parse_selector(namespace_selector, "REROLLER_NAMESPACE_SELECTOR")  # fail fast on a typo
        parse_selector(resource_selector, "REROLLER_RESOURCE_LABEL_SELECTOR")
        strategy = env.get("REROLLER_RELOAD_STRATEGY", "").strip().lower() or "annotations"
        if strategy not in STRATEGIES:
            raise ValueError(f"REROLLER_RELOAD_STRATEGY: {strategy!r} is not one of {', '.join(STRATEGIES)}")
        cronjob_mode = env.get("REROLLER_CRONJOB_MODE", "").strip().lower() or "run-now"
        if cronjob_mode not in CRONJOB_MODES:
            raise ValueError(f"REROLLER_CRONJOB_MODE: {cronjob_mode!r} is not one of {', '.join(CRONJOB_MODES)}")
        allow_restart_active = env_bool(env, "REROLLER_ALLOW_RESTART_ACTIVE")
        if cronjob_mode == "restart-active" and not allow_restart_active:
            raise ValueError("REROLLER_CRONJOB_MODE: restart-active deletes pods; it needs "
                             "REROLLER_ALLOW_RESTART_ACTIVE=true")
        rollout = env.get("REROLLER_ROLLOUT", "").strip().lower() or "immediate"
        if rollout not in ROLLOUT_MODES:
            raise ValueError(f"REROLLER_ROLLOUT: {rollout!r} is not one of {', '.join(ROLLOUT_MODES)}")
        try:
            first_wave = parse_wave_size(env.get("REROLLER_FIRST_WAVE"))
        except ValueError as exc:
            raise ValueError(f"REROLLER_FIRST_WAVE: {exc}") from None
        return cls(
            rollout=rollout, first_wave=first_wave, chaos_aware=env_bool(env, "REROLLER_CHAOS_AWARE"),
            wave_deadline_seconds=env_float(env, "REROLLER_WAVE_DEADLINE_SECONDS", 600.0, minimum=1.0),
            debounce_seconds=env_float(env, "REROLLER_DEBOUNCE_SECONDS", 2.0),
            min_interval_seconds=env_float(env, "REROLLER_MIN_INTERVAL_SECONDS", 10.0),
            cluster_rate=env_float(env, "REROLLER_CLUSTER_ROLLOUTS_PER_SECOND", 20.0),
            cluster_burst=env_float(env, "REROLLER_CLUSTER_BURST", 40.0, minimum=1.0),
            resync_seconds=env_float(env, "REROLLER_RESYNC_SECONDS", 300.0, minimum=1.0),
            auto_reload_all=env_bool(env, "REROLLER_AUTO_RELOAD_ALL"),
            reload_on_create=env_bool(env, "REROLLER_RELOAD_ON_CREATE"),
            reload_on_delete=env_bool(env, "REROLLER_RELOAD_ON_DELETE"),
            namespaces_to_ignore=env_list(env, "REROLLER_NAMESPACES_TO_IGNORE"),
            namespace_selector=namespace_selector,
            resource_label_selector=resource_selector,
            resources_to_ignore=resources,
            ignored_workload_types=types,
            reload_strategy=strategy,
            metrics_by_namespace=env_bool(env, "REROLLER_METRICS_BY_NAMESPACE"),
            argo_rollouts=env_bool(env, "REROLLER_ARGO_ROLLOUTS"),
            cronjob_mode=cronjob_mode,
            allow_restart_active=allow_restart_active,
            sync_after_restart=env_bool(env, "REROLLER_SYNC_AFTER_RESTART", True),
            history=env_bool(env, "REROLLER_HISTORY"),
        )

    @property
    def env_vars(self) -> bool:
        return self.reload_strategy == "env-vars"

    @property
    def min_gap(self) -> float:
        """The least time between two rollouts of one workload."""
        return max(self.debounce_seconds, self.min_interval_seconds)

    def ignores_kind(self, kind: str) -> bool:
        return any(WORKLOAD_TYPE_NAMES[t] == kind for t in self.ignored_workload_types)

    def ignores_source_kind(self, kind: str) -> bool:
        return f"{kind.lower()}s" in self.resources_to_ignore


# --- label selectors (the string form: "a=b,c!=d,e in (f,g),!h") -----------------------------------

Requirement = tuple[str, str, tuple[str, ...]]  # (key, operator, values)
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9._-]*")
_SET_RE = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")


def parse_selector(text: str, what: str = "selector") -> tuple[Requirement, ...]:
    """Kubernetes' label selector string; ValueError on anything else."""
    requirements: list[Requirement] = []
    parts = re.split(r",(?![^()]*\))", text) if text.strip() else []
    for part in parts:
        part = part.strip()
        match = _SET_RE.match(part)
        if match:
            values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
            requirements.append((match.group(1), match.group(2), values))
        elif "!=" in part:
            key, value = (s.strip() for s in part.split("!=", 1))
            requirements.append((key, "!=", (value,)))
        elif "=" in part:
            key, value = (s.strip() for s in part.replace("==", "=").split("=", 1))
            requirements.append((key, "=", (value,)))
        elif part.startswith("!") and part[1:].strip():
            requirements.append((part[1:].strip(), "!", ()))
        elif part and re.fullmatch(r"[^\s!=()]+", part):
            requirements.append((part, "exists", ()))
        else:
            raise ValueError(f"{what}: {text!r} is not a label selector")
    for key, _, values in requirements:
        if not _LABEL_KEY.fullmatch(key) or not all(_LABEL_VALUE.fullmatch(v) for v in values):
            raise ValueError(f"{what}: {text!r} is not a label selector")
    return tuple(requirements)


def selector_matches(requirements: Iterable[Requirement], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    for key, op, values in requirements:
        present, value = key in labels, labels.get(key)
        if op == "=" and value != values[0]:
            return False
        if op == "!=" and value == values[0]:
            return False
        if op == "in" and value not in values:
            return False
        if op == "notin" and present and value in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
    return True
