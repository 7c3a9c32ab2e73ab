"""Immortal containers: pure decisions (no API calls).

An ImmortalContainer asks for one pod running ``spec.image`` forever. The operator keeps a pod named
``<name>-immortalpod`` alive and counts how many pods it has started in ``status.startTimes``.

Counting is derived, not incremented blindly: ``status.currentPodUID`` records the uid of the pod
counted last, and a pod owned by the ImmortalContainer whose uid differs from it is a new start.
A retried handler, a second event for the same pod, or a restart after a crash between "create pod"
and "patch status" therefore counts every pod exactly once.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from kopf_operators.common import DOMAIN, set_condition

GROUP = "immortalcontainer.flugel.it"
VERSION = "v1alpha1"
PLURAL = "immortalcontainers"
KIND = "ImmortalContainer"
API_VERSION = f"{GROUP}/{VERSION}"

POD_SUFFIX = "-immortalpod"
CONTAINER_NAME = "acontainer"  # as in the article
# The article's label (kept for compatibility) and the project's own label; both carry the CR's name.
ARTICLE_LABEL = "controller"
OWNER_LABEL = f"{DOMAIN}/immortal"

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

SNAPSHOT_METADATA = ("name", "namespace", "uid", "generation", "resourceVersion", "deletionTimestamp")


def pod_name(ic_name: str) -> str:
    return f"{ic_name}{POD_SUFFIX}"


def ic_name_for_pod(name: str) -> str | None:
    """The ImmortalContainer a pod name belongs to, by the naming convention (None if it is not one)."""
    if name.endswith(POD_SUFFIX) and len(name) > len(POD_SUFFIX):
        return name[: -len(POD_SUFFIX)]
    return None


def snapshot(ic: Mapping[str, Any]) -> dict[str, Any]:
    """What the controller keeps of an ImmortalContainer (its index entry): enough to build the pod,
    count starts, patch status with a resourceVersion and post Events; nothing else."""
    meta = ic.get("metadata") or {}
    return {
        "apiVersion": ic.get("apiVersion", API_VERSION),
        "kind": ic.get("kind", KIND),
        "metadata": {key: meta[key] for key in SNAPSHOT_METADATA if meta.get(key) is not None},
        "spec": dict(ic.get("spec") or {}),
        "status": dict(ic.get("status") or {}),
    }


def pod_summary(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the pods index keeps of one of our pods: what ``observe_pod`` reads, nothing more."""
    meta = pod.get("metadata") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    status = pod.get("status") or {}
    return {
        "metadata": {key: meta[key] for key in ("name", "uid", "ownerReferences", "deletionTimestamp")
                     if meta.get(key) is not None},
        "spec": {"containers": [{"name": c.get("name"), "image": c.get("image")} for c in containers]},
        "status": {key: status[key] for key in ("phase", "reason") if status.get(key) is not None},
    }


def build_pod(ic: Mapping[str, Any]) -> dict[str, Any]:
    """The pod manifest for an ImmortalContainer (the article's pod, plus the project's label)."""
    meta = ic["metadata"]
    name = meta["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name),
            "namespace": meta["namespace"],
            "labels": {ARTICLE_LABEL: name, OWNER_LABEL: name},
            "ownerReferences": [{
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": name,
                "uid": meta["uid"],
                "controller": True,
            }],
        },
        "spec": {
            "containers": [{"name": CONTAINER_NAME, "image": ic["spec"]["image"]}],
        },
    }


@dataclasses.dataclass(frozen=True)
class PodView:
    """What the decisions need to know about the pod with the target name."""

    name: str
    uid: str
    owned: bool  # controller ownerReference points at this ImmortalContainer (by uid)
    image: str | None
    phase: str | None
    terminating: bool
    reason: str | None = None  # e.g. "Evicted"

    @property
    def ended(self) -> bool:
        return self.phase in TERMINAL_PHASES


def observe_pod(pod: Mapping[str, Any] | None, owner_uid: str) -> PodView | None:
    """Reduce a pod (API dict, camelCase) to a PodView; None when there is no pod."""
    if pod is None:
        return None
    meta = pod.get("metadata") or {}
    owned = any(
        ref.get("controller") and ref.get("uid") == owner_uid
        for ref in meta.get("ownerReferences") or ()
    )
    containers = (pod.get("spec") or {}).get("containers") or []
    image = next((c.get("image") for c in containers if c.get("name") == CONTAINER_NAME), None)
    status = pod.get("status") or {}
    return PodView(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        owned=owned,
        image=image,
        phase=status.get("phase"),
        terminating=bool(meta.get("deletionTimestamp")),
        reason=status.get("reason"),
    )


class Action(enum.Enum):
    NONE = "none"  # converged
    CREATE = "create"  # no pod: start one
    DELETE = "delete"  # our pod ended or runs the wrong image: remove it (the next pass creates)
    WAIT = "wait"  # our pod is going away: wait for it
    BLOCKED = "blocked"  # a pod we do not own has the target name: never touch it


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str  # CamelCase, used as the Ready condition's reason and the event's reason
    message: str


def decide(image: str, pod: PodView | None) -> Decision:
    """What to do next about the pod, given the desired image and the observed pod."""
    if pod is None:
        return Decision(Action.CREATE, "PodCreating", "no pod is running; starting one")
    if not pod.owned:
        return Decision(Action.BLOCKED, "ForeignPod",
                        f"pod {pod.name} exists but is not owned by this ImmortalContainer; "
                        "it is left alone; waiting for it to go away")
    if pod.terminating:
        return Decision(Action.WAIT, "PodTerminating",
                        f"pod {pod.name} is terminating; waiting to replace it")
    if pod.ended:
        why = f" ({pod.reason})" if pod.reason else ""
        return Decision(Action.DELETE, "PodEnded",
                        f"pod {pod.name} ended with phase {pod.phase}{why}; replacing it")
    if pod.image != image:
        return Decision(Action.DELETE, "ImageChanged",
                        f"pod {pod.name} runs {pod.image}, the spec asks for {image}; replacing it")
    if pod.phase == "Running":
        return Decision(Action.NONE, "PodRunning", f"pod {pod.name} is running {image}")
    return Decision(Action.NONE, "PodStarting", f"pod {pod.name} is {pod.phase or 'Pending'}")


def count_start(status: Mapping[str, Any], pod: PodView | None) -> tuple[int, str | None]:
    """(startTimes, currentPodUID) after observing ``pod``: an owned pod with an uncounted uid is a start."""
    starts = int(status.get("startTimes") or 0)
    counted_uid = status.get("currentPodUID")
    if pod is not None and pod.owned and pod.uid and pod.uid != counted_uid:
        return starts + 1, pod.uid
    return starts, counted_uid


def next_status(
    status: Mapping[str, Any],
    generation: int | None,
    pod: PodView | None,
    decision: Decision,
    now: str | None = None,
) -> dict[str, Any]:
    """The full set of status fields this operator owns, after observing ``pod`` and deciding."""
    starts, counted_uid = count_start(status, pod)
    new: dict[str, Any] = {"startTimes": starts}
    if counted_uid is not None:
        new["currentPodUID"] = counted_uid
    if pod is not None and pod.owned:
        new["currentPod"] = pod.name
    elif status.get("currentPod"):
        new["currentPod"] = status["currentPod"]
    if generation is not None:
        new["observedGeneration"] = generation
    ready = decision.action is Action.NONE and decision.reason == "PodRunning"
    new["conditions"] = set_condition(status.get("conditions"), "Ready", ready, decision.reason,
                                      decision.message, observed_generation=generation, now=now)
    return new


def _comparable(status: Mapping[str, Any]) -> dict[str, Any]:
    conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
             for c in status.get("conditions") or ()]
    keys = ("startTimes", "currentPodUID", "currentPod", "observedGeneration")
    return {**{k: status.get(k) for k in keys}, "conditions": conds}


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` changes anything (so a converged object is not patched again)."""
    return _comparable(old) != _comparable(new)


def ready_reason(status: Mapping[str, Any]) -> str | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Ready":
            return str(cond.get("reason"))
    return None
