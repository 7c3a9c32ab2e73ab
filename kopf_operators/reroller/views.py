"""Re-roller: what the indexes hold (pure): a ConfigMap's/Secret's ``SourceView`` (data hashes, never the
data), a workload's ``WorkloadView`` (its opt-in, references and baseline) and the sources a workload
watches right now.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.core.conventions import COPY_SOURCE, DATA_STAMP, REROLLER_PENDING, data_hash
from kopf_operators.core.patterns import tenant_pattern
from kopf_operators.core.rollouts import RolloutStatus, rollout_status
from kopf_operators.reroller.settings import (
    _PLAIN_NAME,
    ABSENT,
    AUTO,
    CONFIGMAPS,
    CRONJOB_MODE,
    DEFAULT_PRIORITY,
    FIRST_WAVE,
    HISTORY,
    MAX_PRIORITY,
    OBSERVED_HASH,
    OBSERVED_SOURCES,
    PAUSE_PERIOD,
    PAUSED_AT,
    RELEASE,
    RELOADER_AUTO,
    RELOADER_CONFIGMAP_AUTO,
    RELOADER_CONFIGMAPS,
    RELOADER_CONFIGMAPS_EXCLUDE,
    RELOADER_IGNORE,
    RELOADER_MATCH,
    RELOADER_RESTART_WINDOW,
    RELOADER_SEARCH,
    RELOADER_SECRET_AUTO,
    RELOADER_SECRETS,
    RELOADER_SECRETS_EXCLUDE,
    RESTART_WINDOW,
    RESTORE,
    ROLLED,
    ROLLOUT,
    ROLLOUT_STRATEGY,
    SECRETS,
    TEMPLATED,
    USED_KEYS_ONLY,
    WAVE,
    WAVE_DEADLINE,
    Options,
    Requirement,
    SourceKind,
    WorkloadKey,
    selector_matches,
)

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
    # Its data differs from its data stamp (``core.conventions.DATA_STAMP``): an edit of a copy that
    # its writer (Copyrator) is about to undo, not a change to roll for.
    drifted: bool = False
    # Progressive rollouts (``waves``): its annotations as written (read and checked by the gate).
    rollout: str | None = None
    first_wave: str | None = None
    wave_deadline: str | None = None
    release: str | None = None
    # History and restore (``history``): its annotations as written, for the sweep after a takeover.
    history: str | None = None
    restore: str | None = None
    # A Copyrator copy (it carries a data stamp): (namespace, name) of the source it copies, whose rollout
    # settings its users follow when it has none of its own.
    origin: tuple[str, str] | None = None


def source_hash(kind: str, body: Mapping[str, Any]) -> str:
    """A digest of a ConfigMap's/Secret's data only (the shared ``data_hash``, the one a data stamp
    carries): metadata-only edits and a delete-and-recreate with the same data hash the same."""
    return data_hash(kind, body)


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
    digest = source_hash(kind, body)
    stamp = annotations.get(DATA_STAMP)
    return SourceView(hash=digest, rv=resource_version(body),
                      ignore=_truthy(annotations.get(RELOADER_IGNORE)),
                      match=_truthy(annotations.get(RELOADER_MATCH)),
                      selected=selector_matches(selector, metadata.get("labels")),
                      keys=key_hashes(kind, body), drifted=bool(stamp) and stamp != digest,
                      rollout=_setting(annotations.get(ROLLOUT)), first_wave=_setting(annotations.get(FIRST_WAVE)),
                      wave_deadline=_setting(annotations.get(WAVE_DEADLINE)),
                      release=_setting(annotations.get(RELEASE)), history=_setting(annotations.get(HISTORY)),
                      restore=_setting(annotations.get(RESTORE)), origin=_origin(stamp, annotations.get(COPY_SOURCE)))


def _origin(stamp: object, source: object) -> tuple[str, str] | None:
    namespace, slash, name = str(source or "").partition("/")
    return (namespace, name) if stamp and slash and namespace and name else None


def _setting(value: object) -> str | None:
    """An annotation's value as a setting: stripped, bounded (it is said back in Events); None if unset."""
    text = str(value).strip()[:64] if value is not None else ""
    return text or None


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


API_VERSIONS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
                "CronJob": "batch/v1", "Job": "batch/v1", "Rollout": "argoproj.io/v1alpha1"}


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
    restart_window: str | None = None  # the restart-window annotation (ours wins over Reloader's)
    pending: str | None = None         # the pending annotation (a rollout held back, said on the workload)
    cronjob_mode: str | None = None    # CronJob: its cronjob-mode annotation (None: the operator's default)
    # Progressive rollouts: its place in a progression (the wave annotation), its last progressive
    # rollout (ROLLED) and what its own controller reports of its rollout (templated kinds only).
    priority: int = DEFAULT_PRIORITY
    rolled: str | None = None
    status: RolloutStatus | None = None

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


def ref_of(view: WorkloadView) -> dict[str, Any]:
    return {"apiVersion": API_VERSIONS[view.kind], "kind": view.kind,
            "metadata": {"name": view.name, "namespace": view.namespace, "uid": view.uid}}


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
        restart_window=ws.get(RESTART_WINDOW, ws.get(RELOADER_RESTART_WINDOW)),
        pending=ws.get(REROLLER_PENDING), cronjob_mode=ws.get(CRONJOB_MODE) if kind == "CronJob" else None,
        priority=parse_priority(ws.get(WAVE)), rolled=ws.get(ROLLED),
        status=rollout_status(kind, body) if kind in TEMPLATED else None,
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


def parse_priority(text: str | None) -> int:
    """A workload's ``wave`` annotation: a small whole number; anything else is the default."""
    value = (text or "").strip()
    if value.isdigit() and len(value) <= 7 and int(value) <= MAX_PRIORITY:
        return int(value)
    return DEFAULT_PRIORITY


def parse_duration(value: object) -> float | None:
    """Go's duration syntax as Reloader reads it ("90s", "5m", "1h30m", "1.5h"); None if unparsable."""
    text = str(value or "").strip()
    if not text:
        return None
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    seconds = sum(float(n) * units[u] for n, u in parts)
    return seconds if math.isfinite(seconds) else None  # "999…9h": no sleep of infinite length


def refused_patterns(view: WorkloadView) -> tuple[str, ...]:
    """Why each of the workload's name patterns matches nothing (RE2 refused it), one line each."""
    problems = []
    for source_kind, pattern in view.patterns:
        problem = tenant_pattern(pattern).problem
        if problem is not None:
            key = RELOADER_CONFIGMAPS if source_kind == "ConfigMap" else RELOADER_SECRETS
            problems.append(f"{key} {pattern[:80]!r}: {problem}")
    return tuple(problems)


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
        compiled = tenant_pattern(pattern)  # RE2: linear time; refused (``refused_patterns``) matches nothing
        result |= {Source(source_kind, name) for (kind, name) in lookup
                   if kind == source_kind and compiled.fullmatch(name)}

    def keep(source: Source) -> bool:
        if (source.kind, source.name) in view.excluded or settings.ignores_source_kind(source.kind):
            return False
        found = lookup.get((source.kind, source.name))
        return found is None or (not found.ignore and found.selected)
    return {s for s in result if keep(s)}
