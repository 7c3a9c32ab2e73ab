"""Re-roller: pure decision logic (no API calls).

A workload (Deployment, StatefulSet, DaemonSet, CronJob, Job) opts in by annotation, with the
project's keys or with stakater Reloader's. The operator hashes the data of the ConfigMaps/Secrets it
watches and, when that data differs from the baseline stored on the workload (``observed-hash`` and
``observed-sources`` in ``metadata.annotations``), re-rolls it: a pod-template annotation changes
(``config-hash`` for our keys, Reloader's ``last-reloaded-from`` for Reloader's keys), a CronJob gets
a Job from its template, a Job is recreated. The first sighting records the baseline at once.

Everything here is data in, data out: index entries (``WorkloadView``, ``SourceView``), the watched
set, the plan, the patches, and the pacing arithmetic (leading edge, per-workload interval, cluster
token bucket), all unit-tested without a cluster.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Literal

from kopf_operators.core.conventions import DOMAIN, env_bool, env_float, env_list, epoch_to_iso, iso_to_epoch

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

# Written by the operator.
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
        return cls(
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


# --- sources -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class Source:
    """A ConfigMap or Secret in the workload's namespace. ``optional``: every reference to it is
    optional (the pods start without it), so its absence is a legitimate state, not an error."""

    kind: SourceKind
    name: str
    optional: bool = False

    @property
    def ref(self) -> str:
        return f"{self.kind.lower()}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class SourceView:
    """What the source index keeps per ConfigMap/Secret: a data hash, never the data."""

    hash: str
    rv: int                 # resourceVersion: orders a source change against a workload's creation
    ignore: bool = False    # reloader.stakater.com/ignore: "true"
    match: bool = False     # reloader.stakater.com/match: "true" (search mode)
    selected: bool = True   # passes REROLLER_RESOURCE_LABEL_SELECTOR
    keys: tuple[tuple[str, str], ...] = ()  # (data key, short hash of its value), for key-scoped reloads


def source_hash(kind: str, body: Mapping[str, Any]) -> str:
    """A digest of a ConfigMap's/Secret's data only: not of uid, resourceVersion or metadata, so a
    delete-and-recreate with the same data and metadata-only edits hash the same."""
    if kind == "Secret":
        payload: dict[str, Any] = {"data": body.get("data") or {}, "type": body.get("type") or "Opaque"}
    else:
        payload = {"data": body.get("data") or {}, "binaryData": body.get("binaryData") or {}}
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def key_hashes(kind: str, body: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Each data key with a short digest of its value (ConfigMap ``data`` and ``binaryData``, Secret
    ``data``): enough to tell which keys changed, never the values."""
    values: dict[str, Any] = dict(body.get("data") or {})
    if kind == "ConfigMap":
        values.update({k: ["binary", v] for k, v in (body.get("binaryData") or {}).items()})
    return tuple((key, hashlib.sha256(json.dumps(value).encode()).hexdigest()[:8])
                 for key, value in sorted(values.items()))


def resource_version(body: Mapping[str, Any]) -> int:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def source_view(kind: str, body: Mapping[str, Any], selector: tuple[Requirement, ...] = ()) -> SourceView:
    metadata = body.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return SourceView(hash=source_hash(kind, body), rv=resource_version(body),
                      ignore=_truthy(annotations.get(RELOADER_IGNORE)),
                      match=_truthy(annotations.get(RELOADER_MATCH)),
                      selected=selector_matches(selector, metadata.get("labels")),
                      keys=key_hashes(kind, body))


def _truthy(value: object) -> bool:
    return str(value).strip().lower() == "true"


def _falsy(value: object) -> bool:
    return str(value).strip().lower() == "false"


def _names(value: object) -> list[str]:
    return [n.strip() for n in str(value or "").split(",") if n.strip()]


def _containers(pod_spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod_spec.get(key) or ()


def references(pod_spec: Mapping[str, Any]) -> set[Source]:
    """Every ConfigMap/Secret a pod spec names: volumes, projected volumes, envFrom, env valueFrom,
    in init, regular and ephemeral containers. A source is optional only if all references are."""
    return set(reference_map(pod_spec))


def reference_map(pod_spec: Mapping[str, Any]) -> dict[Source, tuple[str, ...]]:
    """Each referenced source -> the containers using it (by env or by a mounted volume)."""
    found: dict[tuple[SourceKind, str], bool] = {}
    users: dict[tuple[SourceKind, str], list[str]] = {}
    volumes: dict[str, list[tuple[SourceKind, str]]] = {}

    def add(kind: SourceKind, ref: Mapping[str, Any] | None, name_key: str = "name") -> tuple[SourceKind, str] | None:
        if not ref or not ref.get(name_key):
            return None
        key = (kind, str(ref[name_key]))
        optional = bool(ref.get("optional", False))
        found[key] = found.get(key, True) and optional
        users.setdefault(key, [])
        return key

    for volume in pod_spec.get("volumes") or ():
        keys = [add("ConfigMap", volume.get("configMap")), add("Secret", volume.get("secret"), "secretName")]
        for projection in (volume.get("projected") or {}).get("sources") or ():
            keys += [add("ConfigMap", projection.get("configMap")), add("Secret", projection.get("secret"))]
        volumes[str(volume.get("name"))] = [k for k in keys if k]
    for container in _containers(pod_spec):
        cname = str(container.get("name") or "")
        used: list[tuple[SourceKind, str] | None] = []
        for env_from in container.get("envFrom") or ():
            used += [add("ConfigMap", env_from.get("configMapRef")), add("Secret", env_from.get("secretRef"))]
        for env in container.get("env") or ():
            value_from = env.get("valueFrom") or {}
            used += [add("ConfigMap", value_from.get("configMapKeyRef")),
                     add("Secret", value_from.get("secretKeyRef"))]
        for mount in container.get("volumeMounts") or ():
            used += volumes.get(str(mount.get("name")), [])
        for key in used:
            if key and cname not in users[key]:
                users[key].append(cname)
    return {Source(kind, name, optional): tuple(users[(kind, name)]) for (kind, name), optional in found.items()}


KeyScope = frozenset[str] | None  # the data keys a pod template uses of one source; None: every key


def used_keys(pod_spec: Mapping[str, Any]) -> dict[tuple[SourceKind, str], KeyScope]:
    """The data keys of each referenced source that a pod spec uses: a ``configMapKeyRef`` /
    ``secretKeyRef`` uses its key, a volume with ``items`` (also a projected one) uses those keys;
    ``envFrom`` and a volume without ``items`` use every key (None). Uses add up; every key wins."""
    scopes: dict[tuple[SourceKind, str], KeyScope] = {}

    def use(kind: SourceKind, name: object, keys: Iterable[str] | None) -> None:
        if not name:
            return
        key = (kind, str(name))
        if keys is None or scopes.get(key, frozenset()) is None:
            scopes[key] = None
        else:
            scopes[key] = frozenset(scopes.get(key) or ()) | frozenset(keys)

    def items(ref: Mapping[str, Any]) -> list[str] | None:
        listed = ref.get("items")
        return None if not listed else [str(item.get("key")) for item in listed if item.get("key")]

    for volume in pod_spec.get("volumes") or ():
        if volume.get("configMap"):
            use("ConfigMap", volume["configMap"].get("name"), items(volume["configMap"]))
        if volume.get("secret"):
            use("Secret", volume["secret"].get("secretName"), items(volume["secret"]))
        for projection in (volume.get("projected") or {}).get("sources") or ():
            if projection.get("configMap"):
                use("ConfigMap", projection["configMap"].get("name"), items(projection["configMap"]))
            if projection.get("secret"):
                use("Secret", projection["secret"].get("name"), items(projection["secret"]))
    for container in _containers(pod_spec):
        for env_from in container.get("envFrom") or ():
            if env_from.get("configMapRef"):
                use("ConfigMap", env_from["configMapRef"].get("name"), None)
            if env_from.get("secretRef"):
                use("Secret", env_from["secretRef"].get("name"), None)
        for env in container.get("env") or ():
            value_from = env.get("valueFrom") or {}
            for source_kind, ref_key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                ref = value_from.get(ref_key)
                if ref:
                    use(source_kind, ref.get("name"), [str(ref.get("key") or "")])  # type: ignore[arg-type]
    return scopes


def scoped_hash(keys: Iterable[tuple[str, str]], scope: Iterable[str]) -> str:
    """A source's hash as a key-scoped workload sees it: ``<digest of the key set>.<digest of those
    keys' values>`` (a key missing from the source counts as absent). The key-set part tells a scope
    change (template edited, opt-in switched) from a data change."""
    wanted = sorted(set(scope))
    present = dict(keys)
    values = {k: present.get(k, ABSENT) for k in wanted}
    scope_digest = hashlib.sha256(json.dumps(wanted).encode()).hexdigest()[:4]
    value_digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]
    return f"{scope_digest}.{value_digest}"


# --- the workload view (its index entry) ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadView:
    """What the workload index keeps per opted-in workload: names, flags, hashes, and what a single
    patch needs (resourceVersion, the baseline). Jobs and CronJobs also keep their template (needed
    to recreate the Job / create one); no other body is kept."""

    kind: str
    namespace: str
    name: str
    uid: str
    rv: int
    sources: frozenset[Source]                     # exact names: referenced (auto) and named
    search: frozenset[Source] = frozenset()        # referenced; count only when the source has match
    patterns: tuple[tuple[SourceKind, str], ...] = ()  # Reloader's named keys that are regexes
    excluded: frozenset[tuple[str, str]] = frozenset()
    ours: bool = False            # opted in with our keys: write config-hash
    reloader: bool = False        # opted in with Reloader's keys: write last-reloaded-from
    containers: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (kind, name, container names)
    first_container: str = ""
    observed_hash: str | None = None
    observed_sources: str | None = None
    pause_period: float | None = None   # Deployments: Reloader's pause-period, in seconds
    paused_at: str | None = None
    paused: bool = False
    suspended: bool = False   # CronJob: spec.suspend (its owner said: run no Job)
    restart: bool = False     # Argo Rollout with rollout-strategy "restart": set spec.restartAt
    template: Mapping[str, Any] | None = None   # Job: its spec; CronJob: its jobTemplate
    labels: Mapping[str, str] | None = None     # Job: kept for the recreated Job
    annotations: Mapping[str, str] | None = None  # Job: kept for the recreated Job
    deleting: bool = False
    # The env-vars strategy only: each regular container (in order) with its env names (None: no env).
    env_containers: tuple[tuple[str, tuple[str, ...] | None], ...] = ()
    has_annotations: bool = False  # metadata.annotations is non-empty (a JSON patch adds into it)
    # USED_KEYS_ONLY: ((kind, name), used keys) of the sources used by some keys only (others: every key).
    key_scopes: tuple[tuple[tuple[str, str], tuple[str, ...]], ...] = ()

    @property
    def key(self) -> WorkloadKey:
        return (self.kind, self.namespace, self.name)

    @property
    def baseline(self) -> dict[str, str]:
        result = {}
        if self.observed_hash is not None:
            result[OBSERVED_HASH] = self.observed_hash
        if self.observed_sources is not None:
            result[OBSERVED_SOURCES] = self.observed_sources
        return result

    def containers_of(self, kind: str, name: str) -> list[str]:
        for k, n, names in self.containers:
            if k == kind and n == name and names:
                return list(names)
        return [self.first_container] if self.first_container else []


def pod_template(kind: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = body.get("spec") or {}
    if kind == "CronJob":
        return ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}
    return spec.get("template") or {}


def _reloader_keys(kind: SourceKind, workload: Mapping[str, str], template: Mapping[str, str]) -> Mapping[str, str]:
    """Reloader reads a source kind's keys from the workload's annotations when any of them is there,
    else from the pod template's."""
    keys = (RELOADER_AUTO, RELOADER_SEARCH,
            RELOADER_CONFIGMAPS if kind == "ConfigMap" else RELOADER_SECRETS,
            RELOADER_CONFIGMAP_AUTO if kind == "ConfigMap" else RELOADER_SECRET_AUTO)
    return workload if any(k in workload for k in keys) else template


def workload_view(kind: str, body: Mapping[str, Any], settings: Options | None = None) -> WorkloadView | None:
    """The index entry of a workload; None when it has not opted in (or is excluded by the options)."""
    settings = settings or Options()
    metadata = body.get("metadata") or {}
    namespace = str(metadata.get("namespace") or "")
    if settings.ignores_kind(kind) or namespace in settings.namespaces_to_ignore:
        return None
    template = pod_template(kind, body)
    pod_spec = template.get("spec") or {}
    ws: Mapping[str, str] = metadata.get("annotations") or {}
    ts: Mapping[str, str] = (template.get("metadata") or {}).get("annotations") or {}
    merged = {**ts, **ws}  # our keys: the workload's value wins
    refs = reference_map(pod_spec)
    by_key = {(s.kind, s.name): s for s in refs}

    sources: dict[tuple[SourceKind, str], Source] = {}
    search: dict[tuple[SourceKind, str], Source] = {}
    patterns: list[tuple[SourceKind, str]] = []
    ours = reloader = False

    # Our keys: auto (every reference), exact names.
    if _truthy(merged.get(AUTO)):
        ours = True
        sources.update(by_key)
    ours_keys: tuple[tuple[SourceKind, str], ...] = (("ConfigMap", CONFIGMAPS), ("Secret", SECRETS))
    for source_kind, key in ours_keys:
        for name in _names(merged.get(key)):
            ours = True
            sources[(source_kind, name)] = by_key.get((source_kind, name), Source(source_kind, name))

    # Reloader's keys, per source kind, with Reloader's precedence.
    source_kinds: tuple[SourceKind, ...] = ("ConfigMap", "Secret")
    for source_kind in source_kinds:
        ann = _reloader_keys(source_kind, ws, ts)
        typed = ann.get(RELOADER_CONFIGMAP_AUTO if source_kind == "ConfigMap" else RELOADER_SECRET_AUTO)
        auto = ann.get(RELOADER_AUTO)
        named = _names(ann.get(RELOADER_CONFIGMAPS if source_kind == "ConfigMap" else RELOADER_SECRETS))
        for name in named:
            reloader = True
            if _PLAIN_NAME.match(name):
                sources[(source_kind, name)] = by_key.get((source_kind, name), Source(source_kind, name))
            else:
                patterns.append((source_kind, name))
        auto_on = _truthy(auto) or _truthy(typed) or (
            settings.auto_reload_all and auto is None and typed is None and not _falsy(merged.get(AUTO)))
        if auto_on:
            reloader = True
            sources.update({k: s for k, s in by_key.items() if k[0] == source_kind})
        elif _truthy(ann.get(RELOADER_SEARCH)):
            reloader = True
            search.update({k: s for k, s in by_key.items() if k[0] == source_kind and k not in sources})

    if not (ours or reloader):
        return None
    excluded = {("ConfigMap", n) for n in _names(ws.get(RELOADER_CONFIGMAPS_EXCLUDE))}
    excluded |= {("Secret", n) for n in _names(ws.get(RELOADER_SECRETS_EXCLUDE))}
    pause = parse_duration(ws.get(PAUSE_PERIOD)) if kind == "Deployment" else None
    spec = body.get("spec") or {}
    kept_template: Mapping[str, Any] | None = None
    if kind == "Job":
        kept_template = spec
    elif kind == "CronJob":
        kept_template = spec.get("jobTemplate") or {}
    containers = [c for c in (pod_spec.get("containers") or ()) if c.get("name")]
    return WorkloadView(
        kind=kind, namespace=namespace, name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""), rv=resource_version(body),
        sources=frozenset(sources.values()), search=frozenset(search.values()), patterns=tuple(patterns),
        excluded=frozenset(excluded), ours=ours, reloader=reloader,
        containers=tuple((s.kind, s.name, names) for s, names in sorted(refs.items())),
        first_container=str(containers[0]["name"]) if containers else "",
        observed_hash=ws.get(OBSERVED_HASH), observed_sources=ws.get(OBSERVED_SOURCES),
        pause_period=pause, paused_at=ws.get(PAUSED_AT), paused=bool(spec.get("paused")),
        suspended=kind == "CronJob" and spec.get("suspend") is True,
        restart=kind == "Rollout" and str(ws.get(ROLLOUT_STRATEGY) or "").strip() == "restart",
        template=kept_template, labels=dict(metadata.get("labels") or {}) if kind == "Job" else None,
        annotations=dict(ws) if kind == "Job" else None,
        deleting=bool(metadata.get("deletionTimestamp")),
        env_containers=_env_containers(pod_spec) if settings.env_vars and kind in TEMPLATED else (),
        has_annotations=bool(ws),
        key_scopes=tuple((source, tuple(sorted(keys))) for source, keys in sorted(used_keys(pod_spec).items())
                         if keys is not None) if _truthy(merged.get(USED_KEYS_ONLY)) else (),
    )


def _env_containers(pod_spec: Mapping[str, Any]) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    result: list[tuple[str, tuple[str, ...] | None]] = []
    for container in pod_spec.get("containers") or ():
        env = container.get("env")
        names = None if env is None else tuple(str(e.get("name") or "") for e in env)
        result.append((str(container.get("name") or ""), names))
    return tuple(result)


def workload_index_entries(view: WorkloadView | None) -> dict[Any, Any]:
    """Index entries of one workload: (source kind, namespace, source name) -> workload key (the
    reverse lookup a source event needs; "*" for workloads with name patterns), and
    ("view", *key) -> the view itself."""
    if view is None:
        return {}
    entries: dict[Any, Any] = {(s.kind, view.namespace, s.name): view.key for s in (*view.sources, *view.search)}
    for source_kind, _ in view.patterns:
        entries[(source_kind, view.namespace, "*")] = view.key
    entries[("view", *view.key)] = view
    return entries


def parse_duration(value: object) -> float | None:
    """Go's duration syntax as Reloader reads it ("90s", "5m", "1h30m", "1.5h"); None if unparsable."""
    text = str(value or "").strip()
    if not text:
        return None
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * units[u] for n, u in parts)


# --- what a workload watches right now --------------------------------------------------------------


def effective_sources(view: WorkloadView, lookup: Mapping[tuple[str, str], SourceView],
                      settings: Options | None = None) -> set[Source]:
    """The sources whose data rolls the workload now: its exact names, the referenced sources marked
    match (search mode), the existing sources its patterns match; minus excluded, ignored, unselected
    and ignored kinds. ``lookup``: (kind, name) -> SourceView of the namespace's existing sources."""
    settings = settings or Options()
    result = set(view.sources)
    result |= {s for s in view.search if (found := lookup.get((s.kind, s.name))) is not None and found.match}
    for source_kind, pattern in view.patterns:
        try:
            compiled = re.compile(f"^(?:{pattern})$")
        except re.error:
            continue  # an invalid pattern matches nothing (as in Reloader)
        result |= {Source(source_kind, name) for (kind, name) in lookup
                   if kind == source_kind and compiled.match(name)}

    def keep(source: Source) -> bool:
        if (source.kind, source.name) in view.excluded or settings.ignores_source_kind(source.kind):
            return False
        found = lookup.get((source.kind, source.name))
        return found is None or (not found.ignore and found.selected)
    return {s for s in result if keep(s)}


# --- snapshots and plans ---------------------------------------------------------------------------


def short(h: str) -> str:
    """The per-source hash as stored on the workload: 8 hex characters are enough to tell a change
    and reveal even less about a Secret's data than the full digest."""
    return h[:8]


def combined_hash(per_source: Mapping[str, str]) -> str:
    """One hash over the per-source hashes (keyed by ``Source.ref``), independent of order."""
    encoded = json.dumps(dict(per_source), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The current data hashes of a workload's sources, as far as the indexes know them."""

    per_source: dict[str, str]        # ref -> short hash, or ABSENT for a missing source
    missing: list[str]                # refs of missing required sources
    optional: frozenset[str] = frozenset()

    @property
    def hash(self) -> str:
        return combined_hash(self.per_source)


def snapshot(sources: Iterable[Source], lookup: Mapping[tuple[str, str], Any],
             key_scopes: Iterable[tuple[tuple[str, str], tuple[str, ...]]] = ()) -> Snapshot:
    """``lookup``: (kind, name) -> SourceView (or a data hash) of the existing sources; ``key_scopes``:
    sources of which only these keys count (a key-scoped workload)."""
    scopes = dict(key_scopes)
    per_source: dict[str, str] = {}
    missing: list[str] = []
    optional: set[str] = set()
    for source in sorted(sources):
        found = lookup.get((source.kind, source.name))
        if source.optional:
            optional.add(source.ref)
        scope = scopes.get((source.kind, source.name))
        if found is not None and scope is not None and isinstance(found, SourceView):
            per_source[source.ref] = scoped_hash(found.keys, scope)
        elif found is not None:
            per_source[source.ref] = short(found.hash if isinstance(found, SourceView) else str(found))
        else:
            per_source[source.ref] = ABSENT
            if not source.optional:
                missing.append(source.ref)
    return Snapshot(per_source=per_source, missing=missing, optional=frozenset(optional))


class Action(enum.Enum):
    NONE = "none"
    BASELINE = "baseline"          # record what the workload runs now, roll nothing
    ROLL = "roll"
    WAIT_MISSING = "wait-missing"  # a required source is missing: wait for it


@dataclasses.dataclass(frozen=True)
class Plan:
    action: Action
    new_hash: str = ""
    changed: tuple[str, ...] = ()     # refs whose data changed (for the Event)
    missing: tuple[str, ...] = ()     # required sources missing now (warned about once)


def parse_observed(annotations: Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    observed = annotations.get(OBSERVED_HASH) or None
    try:
        per_source = json.loads(annotations.get(OBSERVED_SOURCES) or "{}")
    except ValueError:
        per_source = {}
    if not isinstance(per_source, dict):
        per_source = {}
    return observed, {str(k): str(v) for k, v in per_source.items()}


def plan(annotations: Mapping[str, str], snap: Snapshot, *, newer: Iterable[str] = (),
         reload_on_create: bool = False, reload_on_delete: bool = False) -> Plan:
    """Decide what to do with a workload, given its baseline annotations and the current snapshot.

    - no baseline yet (first sighting): record it at once, without rolling; except for sources
      changed after the workload's version first seen (``newer``, by resourceVersion): a change
      made right after creation is never absorbed into the baseline;
    - a required source is missing: hold (pods could not start anyway), keep the baseline, so a
      recreate with the same data rolls nothing (``reload_on_delete``: roll instead);
    - a required source that was absent appears: re-baseline (``reload_on_create``: roll);
    - the data of a source that was already watched changed: roll;
    - only the SET of sources changed (a template edit, which rolls by itself, or the opt-in keys):
      re-baseline without a second rollout.
    """
    missing = tuple(snap.missing)
    new_hash = snap.hash
    observed, observed_sources = parse_observed(annotations)
    if observed is None:
        newer = tuple(sorted(r for r in newer if snap.per_source.get(r, ABSENT) != ABSENT))
        if newer:
            return Plan(Action.ROLL, new_hash=new_hash, changed=newer, missing=missing)
        return Plan(Action.BASELINE, new_hash=new_hash, missing=missing)
    if snap.missing and not reload_on_delete:
        return Plan(Action.WAIT_MISSING if observed != new_hash else Action.NONE, new_hash=new_hash, missing=missing)
    if observed == new_hash:
        return Plan(Action.NONE, new_hash=new_hash, missing=missing)
    if not observed_sources:
        # A baseline without per-source hashes (edited by hand): the data may have changed; be safe.
        return Plan(Action.ROLL, new_hash=new_hash, changed=tuple(sorted(snap.per_source)), missing=missing)
    changed = []
    for ref, h in sorted(snap.per_source.items()):
        old = observed_sources.get(ref) or observed_sources.get(ref_digest(ref))
        if old is None or old == h or _scope_changed(old, h):
            continue
        required = ref not in snap.optional
        if required and old == ABSENT and not reload_on_create:
            continue  # appeared: pods could not have run without it; nothing to roll
        changed.append(ref)
    if not changed:
        return Plan(Action.BASELINE, new_hash=new_hash, missing=missing)
    return Plan(Action.ROLL, new_hash=new_hash, changed=tuple(changed), missing=missing)


def held_by_suspend(view: WorkloadView, plan_: Plan) -> bool:
    """A rollout a suspended CronJob must not get (issue #20): creating a Job would run what its owner
    suspended. The change becomes its baseline instead, so resuming it creates no Job either: its
    next scheduled Job reads the data of then."""
    return plan_.action is Action.ROLL and view.kind == "CronJob" and view.suspended


def _scope_changed(old: str, new: str) -> bool:
    """The keys a workload uses of a source changed (or key scoping was switched on or off): that is
    a template edit, which rolls by itself, not a data change."""
    if ABSENT in (old, new):
        return False
    old_scope = old.split(".")[0] if "." in old else None
    new_scope = new.split(".")[0] if "." in new else None
    return old_scope != new_scope


# --- patches ---------------------------------------------------------------------------------------


# Per-source hashes beyond this size are not stored (annotations are limited to 256 KiB in total): the
# combined hash alone still tells a change, only without naming the source.
MAX_OBSERVED_SOURCES = 32 * 1024


def ref_digest(ref: str) -> str:
    """A source's short stand-in key in the per-source hashes when the refs themselves take too much
    room (many sources with long names): "#" + 12 hex digits of its sha256."""
    return "#" + hashlib.sha256(ref.encode()).hexdigest()[:12]


def _compact(per_source: Mapping[str, str]) -> dict[str, str]:
    return {k if k.startswith("#") else ref_digest(k): v for k, v in per_source.items()}


def baseline_annotations(plan_: Plan, snap: Snapshot) -> dict[str, str]:
    # Full refs when they fit; else digests of the refs (issue #20: without any per-source hashes a
    # template edit that adds a source was rolled a second time); "{}" only past that.
    for form in (dict(snap.per_source), _compact(snap.per_source)):
        per_source = json.dumps(form, sort_keys=True, separators=(",", ":"))
        if len(per_source) <= MAX_OBSERVED_SOURCES:
            return {OBSERVED_HASH: plan_.new_hash, OBSERVED_SOURCES: per_source}
    return {OBSERVED_HASH: plan_.new_hash, OBSERVED_SOURCES: "{}"}


def metadata_patch(plan_: Plan, snap: Snapshot, rv: int | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"annotations": baseline_annotations(plan_, snap)}
    if rv:
        metadata["resourceVersion"] = str(rv)
    return {"metadata": metadata}


def last_reloaded_from(view: WorkloadView, ref: str, source_hash_: str, now: float) -> str:
    """Reloader's pod-template annotation: JSON with the source that caused the rollout, in
    Reloader's field order (type, name, namespace, hash, containerRefs, observedAt)."""
    kind, _, name = ref.partition("/")
    source_kind = "ConfigMap" if kind == "configmap" else "Secret"
    return json.dumps({"type": kind.upper(), "name": name, "namespace": view.namespace, "hash": source_hash_,
                       "containerRefs": view.containers_of(source_kind, name), "observedAt": int(now)},
                      separators=(",", ":"))


def template_annotations(view: WorkloadView, plan_: Plan, snap: Snapshot, now: float) -> dict[str, str]:
    """The pod-template annotations that roll the workload: ours for our keys, Reloader's for its."""
    result: dict[str, str] = {}
    if view.ours or not view.reloader:
        result[CONFIG_HASH] = plan_.new_hash
    if view.reloader:
        ref = (plan_.changed or tuple(snap.per_source) or ("configmap/",))[0]
        result[LAST_RELOADED_FROM] = last_reloaded_from(view, ref, snap.per_source.get(ref, ABSENT), now)
    return result


def roll_patch(view: WorkloadView, plan_: Plan, snap: Snapshot, now: float, rv: int | None = None) -> dict[str, Any]:
    """One merge patch: baseline plus the pod-template annotation that makes the controller roll the
    workload (and, for a Deployment with a pause period, Reloader's pause)."""
    patch = metadata_patch(plan_, snap, rv)
    if view.restart:
        # Reloader's rollout-strategy "restart" for Argo Rollouts: the Rollout controller restarts the
        # pods in place of a new revision; the pod template is not touched.
        patch["spec"] = {"restartAt": epoch_to_iso(now)}
        return patch
    spec: dict[str, Any] = {"template": {"metadata": {"annotations": template_annotations(view, plan_, snap, now)}}}
    if view.kind == "Deployment" and view.pause_period:
        spec["paused"] = True
        patch["metadata"]["annotations"][PAUSED_AT] = epoch_to_iso(now)
    patch["spec"] = spec
    return patch


def env_var_name(kind: str, name: str) -> str:
    """Reloader's variable name: STAKATER_ + the name upper-cased, each run of other characters as
    one "_" (none at the start), + _CONFIGMAP or _SECRET ("app.conf-v2" -> STAKATER_APP_CONF_V2_CONFIGMAP)."""
    converted = re.sub(r"[^A-Z0-9]+", "_", name.upper())
    converted = converted.lstrip("_")
    return f"{ENV_PREFIX}{converted}_{'CONFIGMAP' if kind == 'ConfigMap' else 'SECRET'}"


def env_target(view: WorkloadView, kind: str, name: str) -> int | None:
    """The index of the regular container that gets a source's variable, as Reloader picks it: the
    first regular container using the source; the first container when only init containers use it,
    or when nothing references it (a named source); None without containers."""
    names = [c for c, _ in view.env_containers]
    if not names:
        return None
    for user in view.containers_of(kind, name):
        if user in names:
            return names.index(user)
    return 0


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def env_vars_patch(view: WorkloadView, plan_: Plan, snap: Snapshot, now: float,
                   rv: int | None = None) -> list[dict[str, Any]]:
    """The env-vars strategy's rollout: one JSON patch (a merge patch would replace the whole list of
    containers) that sets the baseline annotations and, per changed source, its STAKATER_ variable
    to the source's short data hash in the container using it. ``rv`` makes it conditional: a
    workload changed since (containers reordered, say) answers 409, and is decided again."""
    ops: list[dict[str, Any]] = []
    if rv:
        ops.append({"op": "replace", "path": "/metadata/resourceVersion", "value": str(rv)})
    annotations = baseline_annotations(plan_, snap)
    if view.kind == "Deployment" and view.pause_period:
        annotations[PAUSED_AT] = epoch_to_iso(now)
        ops.append({"op": "add", "path": "/spec/paused", "value": True})
    if view.has_annotations:
        ops += [{"op": "add", "path": f"/metadata/annotations/{_pointer(key)}", "value": value}
                for key, value in annotations.items()]
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": annotations})
    env_names = {i: list(names) if names is not None else None for i, (_, names) in enumerate(view.env_containers)}
    for ref in plan_.changed or tuple(snap.per_source):
        kind, _, name = ref.partition("/")
        source_kind = "ConfigMap" if kind == "configmap" else "Secret"
        index = env_target(view, source_kind, name)
        if index is None:
            continue
        variable, value = env_var_name(source_kind, name), snap.per_source.get(ref, ABSENT)
        base = f"/spec/template/spec/containers/{index}/env"
        names = env_names[index]
        if names is None:
            ops.append({"op": "add", "path": base, "value": [{"name": variable, "value": value}]})
            env_names[index] = [variable]
        elif variable in names:
            ops.append({"op": "replace", "path": f"{base}/{names.index(variable)}/value", "value": value})
        else:
            ops.append({"op": "add", "path": f"{base}/-", "value": {"name": variable, "value": value}})
            names.append(variable)
    return ops


def unpause_patch(rv: int | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"annotations": {PAUSED_AT: None}}
    if rv:
        metadata["resourceVersion"] = str(rv)
    return {"metadata": metadata, "spec": {"paused": False}}


def unpause_due(view: WorkloadView, now: float) -> float | None:
    """Seconds until a Deployment we paused must be resumed (<= 0: now); None: not paused by us."""
    if view.kind != "Deployment" or not view.paused or not view.paused_at:
        return None
    since = iso_to_epoch(view.paused_at)
    if since is None:
        return 0.0
    return since + (view.pause_period or 0.0) - now


_JOB_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid", "job-name", "batch.kubernetes.io/job-name")


def cronjob_job(view: WorkloadView, suffix: str, extra_annotations: Mapping[str, str]) -> dict[str, Any]:
    """A Job from a CronJob's jobTemplate, owned by the CronJob (as ``kubectl create job --from``)."""
    template = dict(view.template or {})
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": f"{view.name[:52]}-{suffix}"[:63], "namespace": view.namespace,
            "labels": dict(meta.get("labels") or {}),
            "annotations": {**(meta.get("annotations") or {}), CRONJOB_INSTANTIATE: "manual", **extra_annotations},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": view.name, "uid": view.uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": dict(template.get("spec") or {}),
    }


def recreated_job(view: WorkloadView, annotations: Mapping[str, str]) -> dict[str, Any]:
    """The same Job again, new identity: the generated selector and its labels are left to the API."""
    spec = json.loads(json.dumps(view.template or {}))
    if not spec.get("manualSelector"):
        spec.pop("selector", None)
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        for key in _JOB_LABELS:
            labels.pop(key, None)
    job_labels = {k: v for k, v in (view.labels or {}).items() if k not in _JOB_LABELS}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": view.name, "namespace": view.namespace, "labels": job_labels,
                         "annotations": {**(view.annotations or {}), **annotations}},
            "spec": spec}


def rollout_message(kind: str, name: str, changed: Iterable[str]) -> str:
    return f"Re-rolled {kind} {name}: data changed in {', '.join(changed)}"


def notify_only_message(kind: str, name: str, changed: Iterable[str]) -> str:
    return f"Data changed in {', '.join(changed)}; {kind} {name} not re-rolled (notify-only)"


def suspended_message(name: str, changed: Iterable[str]) -> str:
    return (f"CronJob {name} is suspended: data changed in {', '.join(changed)}, no Job created "
            f"(recorded as the baseline; resuming creates none either)")


# --- pacing: leading edge, per-workload interval, cluster-wide token bucket -------------------------

MIN_WAIT = 0.001  # a waiter asks again no sooner than this (a timer firing early asks once more)


def next_rollout_at(last_roll: float | None, now: float, settings: Options) -> float:
    """When the workload may roll: at once after a quiet period (leading edge); otherwise when the
    merge window / minimum interval since its last rollout has passed (one trailing rollout, which
    takes every change made meanwhile)."""
    if last_roll is None:
        return now
    return max(now, last_roll + settings.min_gap)


class TokenBucket:
    """Cluster-wide rollouts per second, fair between namespaces. A rollout asks for its slot each time
    it is due (``ask``); when tokens are short, the waiting rollouts are served round-robin by
    namespace: each namespace's own in arrival order, and in each round the namespace served longest
    ago (or never) first. So a namespace flapping hundreds of rollouts cannot delay another
    namespace's first rollout beyond the next token (at most one token interval, 1/rate). Each waiter
    learns when to ask again (its place times the interval), so waiters never stampede; a waiter's
    place moves back when another namespace arrives, and it then waits longer when it asks again."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.stamp = now
        # namespace -> its waiting keys in arrival order (the dict: namespaces in arrival order).
        self.waiting: dict[str, dict[Hashable, None]] = {}
        # namespace -> the grant that last served it (while anyone waits; -1: none since).
        self.served: dict[str, int] = {}
        self.grants = 0

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def place(self, namespace: str, key: Hashable) -> int:
        """How many waiting rollouts are served before this one (round-robin by namespace)."""
        turn = list(self.waiting[namespace]).index(key)  # the round in which it is served
        order = sorted(self.waiting, key=lambda ns: self.served.get(ns, -1))  # stable: then by arrival
        first = order[:order.index(namespace)]
        ahead = turn
        for other in order:
            if other != namespace:
                # Full rounds before its turn, and in its own round the namespaces that come first.
                length = len(self.waiting[other])
                ahead += min(length, turn) + (1 if length > turn and other in first else 0)
        return ahead

    def ask(self, namespace: str, key: Hashable, now: float) -> float:
        """The seconds ``key`` (a rollout in ``namespace``) must wait before asking again; 0: it takes a
        token and may roll now."""
        if self.rate <= 0:
            return 0.0
        self._refill(now)
        if not self.waiting and self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        queue = self.waiting.setdefault(namespace, {})
        queue.setdefault(key, None)
        ahead = self.place(namespace, key)
        if self.tokens >= ahead + 1:  # enough for every rollout served before it, and for it
            self.tokens -= 1
            self.cancel(namespace, key)
            self.grants += 1
            self.served[namespace] = self.grants  # served: the namespace comes last in the next round
            if not self.waiting:
                self.served.clear()  # nobody waits: the next burst starts even
            return 0.0
        return max(MIN_WAIT, (ahead + 1 - self.tokens) / self.rate)

    def cancel(self, namespace: str, key: Hashable) -> None:
        """Drop a waiting rollout that turned out unnecessary (or whose workload is gone)."""
        queue = self.waiting.get(namespace)
        if queue is not None and key in queue:
            del queue[key]
            if not queue:
                del self.waiting[namespace]
