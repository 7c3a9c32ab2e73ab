"""Re-roller: the writes a plan becomes (pure): baseline annotations, pod-template rollouts (annotations
or STAKATER_ variables), CronJob Jobs, recreated Jobs, the unpause, and the messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.core.conventions import REROLLER_PENDING, epoch_to_iso, iso_to_epoch
from kopf_operators.reroller.plans import (
    Plan,
    Snapshot,
    ref_digest,
)
from kopf_operators.reroller.settings import (
    ABSENT,
    CONFIG_HASH,
    CRONJOB_INSTANTIATE,
    ENV_PREFIX,
    LAST_RELOADED_FROM,
    OBSERVED_HASH,
    OBSERVED_SOURCES,
    PAUSED_AT,
    ROLLED,
)
from kopf_operators.reroller.views import (
    WorkloadView,
)

# --- patches ---------------------------------------------------------------------------------------


# Per-source hashes beyond this size are not stored (annotations are limited to 256 KiB in total): the
# combined hash alone still tells a change, only without naming the source.
MAX_OBSERVED_SOURCES = 32 * 1024




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


def metadata_patch(plan_: Plan, snap: Snapshot, rv: int | None = None, *, pending: bool = False) -> dict[str, Any]:
    """The baseline; ``pending``: the workload has a pending annotation, done with by this write."""
    metadata: dict[str, Any] = {"annotations": baseline_annotations(plan_, snap)}
    if pending:
        metadata["annotations"][REROLLER_PENDING] = None
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


def roll_patch(view: WorkloadView, plan_: Plan, snap: Snapshot, now: float, rv: int | None = None,
               rolled: str | None = None) -> dict[str, Any]:
    """One merge patch: baseline plus the pod-template annotation that makes the controller roll the
    workload (and, for a Deployment with a pause period, Reloader's pause); ``rolled``: a progressive
    rollout's ``ROLLED`` value."""
    patch = metadata_patch(plan_, snap, rv, pending=view.pending is not None)
    if rolled is not None:
        patch["metadata"]["annotations"][ROLLED] = rolled
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
                   rv: int | None = None, rolled: str | None = None) -> list[dict[str, Any]]:
    """The env-vars strategy's rollout: one JSON patch (a merge patch would replace the whole list of
    containers) that sets the baseline annotations and, per changed source, its STAKATER_ variable
    to the source's short data hash in the container using it. ``rv`` makes it conditional: a
    workload changed since (containers reordered, say) answers 409, and is decided again."""
    ops: list[dict[str, Any]] = []
    if rv:
        ops.append({"op": "replace", "path": "/metadata/resourceVersion", "value": str(rv)})
    annotations = baseline_annotations(plan_, snap)
    if rolled is not None:
        annotations[ROLLED] = rolled
    if view.kind == "Deployment" and view.pause_period:
        annotations[PAUSED_AT] = epoch_to_iso(now)
        ops.append({"op": "add", "path": "/spec/paused", "value": True})
    if view.has_annotations:
        ops += [{"op": "add", "path": f"/metadata/annotations/{_pointer(key)}", "value": value}
                for key, value in annotations.items()]
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": annotations})
    if view.pending is not None:
        ops.append({"op": "remove", "path": f"/metadata/annotations/{_pointer(REROLLER_PENDING)}"})
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


def cronjob_template_patch(view: WorkloadView, plan_: Plan, snap: Snapshot, now: float,
                           rv: int | None = None) -> dict[str, Any]:
    """CronJob mode next-run: the baseline and the jobTemplate's pod-template annotations, so that the
    next scheduled Job (and no Job now) starts with the new configuration, and says so."""
    patch = metadata_patch(plan_, snap, rv, pending=view.pending is not None)
    annotations = template_annotations(view, plan_, snap, now)
    patch["spec"] = {"jobTemplate": {"spec": {"template": {"metadata": {"annotations": annotations}}}}}
    return patch


def active_job(job: Mapping[str, Any], cronjob_uid: str) -> bool:
    """A Job the CronJob owns (by uid) that has not finished: restart-active restarts its pods."""
    owned = any(ref.get("uid") == cronjob_uid and ref.get("controller")
                for ref in (job.get("metadata") or {}).get("ownerReferences") or ())
    finished = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in (job.get("status") or {}).get("conditions") or ())
    return owned and not finished and not (job.get("metadata") or {}).get("deletionTimestamp")


def recreated_job(view: WorkloadView, annotations: Mapping[str, str]) -> dict[str, Any]:
    """The same Job again, new identity: the generated selector and its labels are left to the API."""
    spec = json.loads(json.dumps(view.template or {}))
    if not spec.get("manualSelector"):
        spec.pop("selector", None)
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        for key in _JOB_LABELS:
            labels.pop(key, None)
    job_labels = {k: v for k, v in (view.labels or {}).items() if k not in _JOB_LABELS}
    kept = {k: v for k, v in (view.annotations or {}).items() if k != REROLLER_PENDING}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": view.name, "namespace": view.namespace, "labels": job_labels,
                         "annotations": {**kept, **annotations}},
            "spec": spec}


def rollout_message(kind: str, name: str, changed: Iterable[str]) -> str:
    return f"Re-rolled {kind} {name}: data changed in {', '.join(changed)}"


def notify_only_message(kind: str, name: str, changed: Iterable[str]) -> str:
    return f"Data changed in {', '.join(changed)}; {kind} {name} not re-rolled (notify-only)"


def suspended_message(name: str, changed: Iterable[str]) -> str:
    return (f"CronJob {name} is suspended: data changed in {', '.join(changed)}, no Job created "
            f"(recorded as the baseline; resuming creates none either)")
