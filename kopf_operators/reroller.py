"""Re-roller: pure decision logic (no API calls).

A workload (Deployment, StatefulSet, DaemonSet) opts in by annotation. The operator hashes the data of
the ConfigMaps/Secrets it watches and, when that hash differs from the baseline stored on the workload
(``observed-hash``, in ``metadata.annotations``), re-rolls it the way ``kubectl rollout restart`` does:
by changing a pod-template annotation (``config-hash``). The first sighting only records the baseline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from kopf_operators.common import DOMAIN

PREFIX = f"reroller.{DOMAIN}"

# Opt-in keys (on the workload or on its pod template).
AUTO = f"{PREFIX}/auto"                  # "true": every ConfigMap/Secret the pod template references
CONFIGMAPS = f"{PREFIX}/configmaps"      # "a,b": these ConfigMaps (referenced or not)
SECRETS = f"{PREFIX}/secrets"            # "x": these Secrets
# stakater Reloader's keys, honoured for migration.
RELOADER_AUTO = "reloader.stakater.com/auto"
RELOADER_CONFIGMAPS = "configmap.reloader.stakater.com/reload"
RELOADER_SECRETS = "secret.reloader.stakater.com/reload"

# Written by the operator.
CONFIG_HASH = f"{PREFIX}/config-hash"          # pod template: changing it rolls the workload
OBSERVED_HASH = f"{PREFIX}/observed-hash"      # workload metadata: the baseline (no rollout)
OBSERVED_SOURCES = f"{PREFIX}/observed-sources"  # workload metadata: short per-source hashes

SourceKind = Literal["ConfigMap", "Secret"]
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")


@dataclasses.dataclass(frozen=True, order=True)
class Source:
    """A ConfigMap or Secret in the workload's namespace. ``optional``: every reference to it is
    optional (the pods start without it), so its absence is a legitimate state, not an error."""

    kind: SourceKind
    name: str
    optional: bool = False

    @property
    def ref(self) -> str:
        return f"{self.kind.lower()}/{self.name}"


def _truthy(value: object) -> bool:
    return str(value).strip().lower() == "true"


def _names(value: object) -> list[str]:
    return [n.strip() for n in str(value or "").split(",") if n.strip()]


def opt_in_annotations(metadata: Mapping[str, Any], template_metadata: Mapping[str, Any]) -> dict[str, str]:
    """The annotations that decide the opt-in: the pod template's, overridden by the workload's."""
    merged: dict[str, str] = {}
    merged.update(template_metadata.get("annotations") or {})
    merged.update(metadata.get("annotations") or {})
    return merged


def is_opted_in(annotations: Mapping[str, str]) -> bool:
    return (_truthy(annotations.get(AUTO)) or _truthy(annotations.get(RELOADER_AUTO))
            or any(_names(annotations.get(k)) for k in (CONFIGMAPS, SECRETS, RELOADER_CONFIGMAPS,
                                                          RELOADER_SECRETS)))


def _containers(pod_spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod_spec.get(key) or ()


def references(pod_spec: Mapping[str, Any]) -> set[Source]:
    """Every ConfigMap/Secret a pod spec names: volumes, projected volumes, envFrom, env valueFrom,
    in init, regular and ephemeral containers. A source is optional only if all references are."""
    found: dict[tuple[SourceKind, str], bool] = {}

    def add(kind: SourceKind, ref: Mapping[str, Any] | None, name_key: str = "name") -> None:
        if not ref or not ref.get(name_key):
            return
        key = (kind, str(ref[name_key]))
        optional = bool(ref.get("optional", False))
        found[key] = found.get(key, True) and optional

    for volume in pod_spec.get("volumes") or ():
        add("ConfigMap", volume.get("configMap"))
        add("Secret", volume.get("secret"), "secretName")
        for projection in (volume.get("projected") or {}).get("sources") or ():
            add("ConfigMap", projection.get("configMap"))
            add("Secret", projection.get("secret"))
    for container in _containers(pod_spec):
        for env_from in container.get("envFrom") or ():
            add("ConfigMap", env_from.get("configMapRef"))
            add("Secret", env_from.get("secretRef"))
        for env in container.get("env") or ():
            value_from = env.get("valueFrom") or {}
            add("ConfigMap", value_from.get("configMapKeyRef"))
            add("Secret", value_from.get("secretKeyRef"))
    return {Source(kind, name, optional) for (kind, name), optional in found.items()}


def watched_sources(body: Mapping[str, Any]) -> set[Source]:
    """The sources whose data changes roll this workload (empty: not opted in)."""
    metadata = body.get("metadata") or {}
    template = (body.get("spec") or {}).get("template") or {}
    annotations = opt_in_annotations(metadata, template.get("metadata") or {})
    pod_spec = template.get("spec") or {}
    result: dict[tuple[SourceKind, str], Source] = {}
    if _truthy(annotations.get(AUTO)) or _truthy(annotations.get(RELOADER_AUTO)):
        result.update({(s.kind, s.name): s for s in references(pod_spec)})
    referenced = {(s.kind, s.name): s for s in references(pod_spec)}
    named: list[tuple[SourceKind, str]] = [
        *(("ConfigMap", n) for k in (CONFIGMAPS, RELOADER_CONFIGMAPS) for n in _names(annotations.get(k))),
        *(("Secret", n) for k in (SECRETS, RELOADER_SECRETS) for n in _names(annotations.get(k))),
    ]
    for key in named:
        # A named source keeps the optionality of its references; unreferenced ones are required.
        result[key] = referenced.get(key, Source(key[0], key[1]))
    return set(result.values())


def source_hash(kind: str, body: Mapping[str, Any]) -> str:
    """A digest of a ConfigMap's/Secret's data only: not of uid, resourceVersion or metadata, so a
    delete-and-recreate with the same data and metadata-only edits hash the same."""
    if kind == "Secret":
        payload: dict[str, Any] = {"data": body.get("data") or {}, "type": body.get("type") or "Opaque"}
    else:
        payload = {"data": body.get("data") or {}, "binaryData": body.get("binaryData") or {}}
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


ABSENT = "absent"


def combined_hash(per_source: Mapping[str, str]) -> str:
    """One hash over the per-source hashes (keyed by ``Source.ref``), independent of order."""
    encoded = json.dumps(dict(per_source), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def short(h: str) -> str:
    """The per-source hash as stored on the workload: 8 hex characters are enough to tell a change
    and reveal even less about a Secret's data than the full digest."""
    return h[:8]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The current data hashes of a workload's sources, as far as the cache knows them."""

    per_source: dict[str, str]        # ref -> short hash (or ABSENT for a missing optional source)
    missing: list[str]                # refs of missing required sources

    @property
    def hash(self) -> str:
        return combined_hash(self.per_source)


def snapshot(sources: Iterable[Source], lookup: Mapping[tuple[str, str], str]) -> Snapshot:
    """``lookup``: (kind, name) -> data hash, for existing sources in the workload's namespace."""
    per_source: dict[str, str] = {}
    missing: list[str] = []
    for source in sorted(sources):
        h = lookup.get((source.kind, source.name))
        if h is not None:
            per_source[source.ref] = short(h)
        elif source.optional:
            per_source[source.ref] = ABSENT
        else:
            missing.append(source.ref)
    return Snapshot(per_source=per_source, missing=missing)


Action = Literal["none", "baseline", "roll", "wait-missing"]


@dataclasses.dataclass(frozen=True)
class Plan:
    action: Action
    new_hash: str = ""
    changed: tuple[str, ...] = ()     # refs whose data changed (for the Event)
    missing: tuple[str, ...] = ()


def parse_observed(annotations: Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    observed = annotations.get(OBSERVED_HASH) or None
    try:
        per_source = json.loads(annotations.get(OBSERVED_SOURCES) or "{}")
    except ValueError:
        per_source = {}
    if not isinstance(per_source, dict):
        per_source = {}
    return observed, {str(k): str(v) for k, v in per_source.items()}


def plan(annotations: Mapping[str, str], snap: Snapshot) -> Plan:
    """Decide what to do with a workload, given its metadata annotations and the current snapshot.

    - a required source is missing: do nothing (pods could not start anyway), warn, keep the baseline,
      so a recreate with the same data rolls nothing;
    - no baseline yet (new or newly annotated workload): record it, do not roll;
    - the data of a source that was already watched changed: roll;
    - only the SET of sources changed (the user edited the pod template, which rolls it anyway, or
      the opt-in annotations): re-baseline without a second rollout.
    """
    if snap.missing:
        return Plan("wait-missing", missing=tuple(snap.missing))
    observed, observed_sources = parse_observed(annotations)
    new_hash = snap.hash
    if observed == new_hash:
        return Plan("none", new_hash=new_hash)
    if observed is None:
        return Plan("baseline", new_hash=new_hash)
    if not observed_sources:
        # A baseline without per-source hashes (edited by hand): the data may have changed; be safe.
        return Plan("roll", new_hash=new_hash, changed=tuple(sorted(snap.per_source)))
    changed = tuple(ref for ref, h in sorted(snap.per_source.items())
                    if ref in observed_sources and observed_sources[ref] != h)
    if not changed:
        return Plan("baseline", new_hash=new_hash)
    return Plan("roll", new_hash=new_hash, changed=changed)


def metadata_patch(plan_: Plan, snap: Snapshot) -> dict[str, Any]:
    annotations = {OBSERVED_HASH: plan_.new_hash,
                   OBSERVED_SOURCES: json.dumps(snap.per_source, sort_keys=True, separators=(",", ":"))}
    return {"metadata": {"annotations": annotations}}


def roll_patch(plan_: Plan, snap: Snapshot) -> dict[str, Any]:
    """Baseline plus the pod-template annotation that makes the controller roll the workload."""
    patch = metadata_patch(plan_, snap)
    patch["spec"] = {"template": {"metadata": {"annotations": {CONFIG_HASH: plan_.new_hash}}}}
    return patch


@dataclasses.dataclass(frozen=True)
class WorkloadState:
    """What the in-memory index keeps per opted-in workload: names and hashes, never data."""

    sources: frozenset[Source]
    observed_hash: str | None
    observed_sources: str | None

    @property
    def annotations(self) -> dict[str, str]:
        result = {}
        if self.observed_hash is not None:
            result[OBSERVED_HASH] = self.observed_hash
        if self.observed_sources is not None:
            result[OBSERVED_SOURCES] = self.observed_sources
        return result


def workload_state(body: Mapping[str, Any]) -> WorkloadState | None:
    """None when the workload has not opted in."""
    metadata = body.get("metadata") or {}
    template_metadata = ((body.get("spec") or {}).get("template") or {}).get("metadata") or {}
    if not is_opted_in(opt_in_annotations(metadata, template_metadata)):
        return None
    annotations = metadata.get("annotations") or {}
    return WorkloadState(frozenset(watched_sources(body)), annotations.get(OBSERVED_HASH),
                         annotations.get(OBSERVED_SOURCES))


def needs_reconcile(state: WorkloadState | None, lookup: Mapping[tuple[str, str], str],
                    already_warned: tuple[str, ...] | None = None) -> bool:
    """Cheap in-memory pre-check on a watch event: is there anything to do or to warn about?
    (Missing sources already warned about need nothing until they appear.)"""
    if state is None:
        return False
    p = plan(state.annotations, snapshot(state.sources, lookup))
    return p.action != "none" and not (p.action == "wait-missing" and p.missing == already_warned)


WorkloadKey = tuple[str, str, str]  # (kind, namespace, name)


def workload_index_entries(key: WorkloadKey, body: Mapping[str, Any]) -> dict[Any, Any]:
    """Index entries of one workload: (source kind, namespace, source name) -> workload key (the
    reverse lookup a source event needs), and ("state", *key) -> its WorkloadState."""
    state = workload_state(body)
    if state is None:
        return {}
    entries: dict[Any, Any] = {(s.kind, key[1], s.name): key for s in state.sources}
    entries[("state", *key)] = state
    return entries


def rollout_message(kind: str, name: str, changed: Iterable[str]) -> str:
    return f"Re-rolled {kind} {name}: data changed in {', '.join(changed)}"
