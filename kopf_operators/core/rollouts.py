"""What a workload's own controller reports of its rollout (pure), read by the re-roller (its waves wait
for a rollout to finish) and by Blackadder (it spares a workload in the middle of one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class RolloutStatus:
    """What a templated workload's own controller reports of its rollout (the index keeps this, no
    more). ``failed``: why its controller says the rollout failed (None: it does not)."""

    generation: int
    observed_generation: int
    desired: int
    updated: int
    available: int
    failed: str | None = None
    total: int | None = None  # its pods of every revision (a Deployment's old ones are counted here)

    @property
    def finished(self) -> bool:
        """Its controller has seen the newest spec, every replica is updated and available, and no pod
        of an older revision is left (as ``kubectl rollout status`` judges it). A Deployment whose new
        pod never becomes ready keeps its old one available: updated and available then both reach
        the desired count, and only the old pod left tells that the rollout is not over."""
        return (self.observed_generation >= self.generation and self.updated >= self.desired
                and self.available >= self.desired and (self.total is None or self.total <= self.updated))


def rollout_status(kind: str, body: Mapping[str, Any]) -> RolloutStatus | None:
    """The rollout's state from a workload's body, as each kind reports it; None for kinds that do not
    roll pods in place (CronJob, Job: a wave does not wait for them)."""
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    generation = int(meta.get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0)
    if kind == "Deployment":
        conditions = {c.get("type"): c for c in status.get("conditions") or () if isinstance(c, dict)}
        progressing = conditions.get("Progressing") or {}
        failed = None
        if progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
            failed = f"ProgressDeadlineExceeded: {progressing.get('message') or 'no progress'}"[:300]
        desired = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        return RolloutStatus(generation, observed, desired, int(status.get("updatedReplicas") or 0),
                             int(status.get("availableReplicas") or 0), failed, int(status.get("replicas") or 0))
    if kind == "StatefulSet":
        desired = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        updated = int(status.get("updatedReplicas") or 0)
        if status.get("updateRevision") and status.get("currentRevision") == status.get("updateRevision"):
            updated = max(updated, int(status.get("currentReplicas") or 0))  # a finished update resets it
        return RolloutStatus(generation, observed, desired, updated, int(status.get("availableReplicas") or 0))
    if kind == "DaemonSet":
        desired = int(status.get("desiredNumberScheduled") or 0)
        return RolloutStatus(generation, observed, desired, int(status.get("updatedNumberScheduled") or 0),
                             int(status.get("numberAvailable") or 0))
    if kind == "Rollout":  # Argo Rollouts: its phase says it
        phase = status.get("phase")
        desired = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        healthy = phase == "Healthy"
        failed = f"Argo Rollout {phase}: {status.get('message') or ''}".strip(": ")[:300] \
            if phase in ("Degraded", "Aborted") else None
        return RolloutStatus(generation, observed, desired, desired if healthy else 0, desired if healthy else 0,
                             failed)
    return None


def in_progress(status: RolloutStatus | None) -> bool:
    """Its controller is still rolling it out: it has not seen its newest spec yet, or not every
    replica is updated and available (and its controller has not given up)."""
    return status is not None and not status.failed and not status.finished


def updating(kind: str, body: Mapping[str, Any]) -> bool:
    """Its controller is replacing pods of an older pod template: a rollout of a change, not the first
    rollout of a new workload nor a scale (a Deployment's pods of an older ReplicaSet left, or a spec
    its controller has not seen yet after the first; a StatefulSet's current revision not its update
    revision; a DaemonSet's scheduled pods not all updated). What chaos spares."""
    status = rollout_status(kind, body)
    if status is None or status.failed:
        return False
    raw = body.get("status") or {}
    if kind == "Deployment":
        unseen = status.generation > 1 and status.observed_generation < status.generation
        return unseen or (status.total or 0) > status.updated
    if kind == "StatefulSet":
        return bool(raw.get("updateRevision")) and raw.get("currentRevision") != raw.get("updateRevision")
    if kind == "DaemonSet":
        return status.updated < int(raw.get("currentNumberScheduled") or 0)
    return in_progress(status)
