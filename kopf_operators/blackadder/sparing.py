"""Blackadder and rollouts (pure): which candidates a cycle spares because their workload is in the
middle of a rollout or has a change the re-roller holds back, and the agent's ``status.disrupting``,
the workloads its recent cycles disrupted (the re-roller reads it to tell chaos from a failing rollout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.blackadder.decisions import Inventory
from kopf_operators.blackadder.targets import PodRef
from kopf_operators.core.conventions import REROLLER_PENDING, epoch_to_iso, iso_to_epoch
from kopf_operators.core.rollouts import updating

WorkloadKey = tuple[str, str, str]  # (kind, namespace, name)
# The kinds whose rollouts a cycle can see (a pod's owner as targets.workload_of names it).
ROLLED_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
# status.disrupting: at most this many entries (the newest kept), each for this long at least.
DISRUPTING_CAP = 100
MIN_DISRUPTION_SECONDS = 300.0


def pod_workload(pod: PodRef) -> WorkloadKey | None:
    """The Deployment, StatefulSet or DaemonSet a Pod belongs to (a ReplicaSet's Deployment, by its
    name less the pod-template-hash: no read); None for a bare Pod or another owner."""
    kind, _, rest = pod.workload_name.partition("/")
    namespace, _, name = rest.partition("/")
    return (kind, namespace, name) if kind in ROLLED_KINDS and name else None


def busy(kind: str, body: Mapping[str, Any]) -> str | None:
    """Why chaos leaves this workload alone now, or None: the re-roller holds back a change of its
    configuration (its pending annotation), or its own controller is still replacing pods of an older
    template (not a new workload's first rollout, nor a scale: Blackadder's own doubling is one)."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if REROLLER_PENDING in annotations:
        return "a change is pending"
    if updating(kind, body):
        return "in a rollout"
    return None


def busy_workloads(listed: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[WorkloadKey, str]:
    """The busy ones among listed workloads ((kind, body) pairs): key -> why."""
    found: dict[WorkloadKey, str] = {}
    for kind, body in listed:
        meta = body.get("metadata") or {}
        why = busy(kind, body)
        if why is not None:
            found[(kind, str(meta.get("namespace", "")), str(meta.get("name", "")))] = why
    return found


def spare(inventory: Inventory, busy_keys: Mapping[WorkloadKey, str]) -> Inventory:
    """The inventory without the Pods and Deployments of busy workloads; ``spared`` names each of
    those workloads that had a candidate ("Kind/namespace/name (why)"), once."""
    spared: dict[WorkloadKey, str] = {}
    pods = []
    for pod in inventory.pods:
        key = pod_workload(pod)
        if key is not None and key in busy_keys:
            spared[key] = busy_keys[key]
        else:
            pods.append(pod)
    deployments = []
    for dep in inventory.deployments:
        key = ("Deployment", dep.namespace, dep.name)
        if key in busy_keys:
            spared[key] = busy_keys[key]
        else:
            deployments.append(dep)
    return dataclasses.replace(inventory, pods=tuple(pods), deployments=tuple(deployments),
                               spared=tuple(f"{'/'.join(key)} ({why})" for key, why in sorted(spared.items())))


def needed(pods: Iterable[PodRef], known: Iterable[WorkloadKey]) -> dict[str, set[str]]:
    """Which workloads a cycle must still read to judge its Pods: kind -> their namespaces (the
    workloads not among ``known``, those it listed already)."""
    have = set(known)
    wanted: dict[str, set[str]] = {}
    for pod in pods:
        key = pod_workload(pod)
        if key is not None and key not in have:
            wanted.setdefault(key[0], set()).add(key[1])
    return wanted


# --- status.disrupting -----------------------------------------------------------------------------


def disruption_seconds(pause: float) -> float:
    """How long a workload counts as disrupted after an action: two pauses (the next cycle may hit
    it again), at least five minutes (a rollout's pods take that long to settle)."""
    return max(2.0 * pause, MIN_DISRUPTION_SECONDS)


def disrupting(previous: Iterable[Any] | None, disrupted: Iterable[WorkloadKey], now: float,
               seconds: float, cap: int = DISRUPTING_CAP) -> list[dict[str, str]]:
    """The agent's ``status.disrupting`` after a cycle: the entries still running (``until`` after
    ``now``), then what this cycle disrupted (until ``now + seconds``, replacing an older entry of the
    same object); the newest ``cap`` kept."""
    entries: dict[WorkloadKey, dict[str, str]] = {}
    for entry in previous or ():
        if not isinstance(entry, Mapping):
            continue
        until = iso_to_epoch(entry.get("until"))
        key = (str(entry.get("kind", "")), str(entry.get("namespace", "")), str(entry.get("name", "")))
        if until is not None and until > now and all(key[::2]):
            entries[key] = {"kind": key[0], "namespace": key[1], "name": key[2], "until": str(entry["until"])}
    until_iso = epoch_to_iso(now + seconds)
    for key in disrupted:
        entries.pop(key, None)  # moved to the end: the newest
        entries[key] = {"kind": key[0], "namespace": key[1], "name": key[2], "until": until_iso}
    return list(entries.values())[-cap:] if cap > 0 else []
