"""Immortal containers: pure decisions (no API calls).

An ImmortalContainer asks for one pod running ``spec.image`` forever. The operator keeps a pod named
``<name>-immortalpod`` alive and counts how many pods it has started in ``status.startTimes``.

Counting is derived, not incremented blindly: ``status.currentPodUID`` records the uid of the pod
counted last, and a pod owned by the ImmortalContainer whose uid differs from it is a new start.
A retried handler, a second event for the same pod, or a restart after a crash between "create pod"
and "patch status" therefore counts every pod exactly once.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Collection, Mapping
from typing import Any

from kopf_operators.core.conventions import DOMAIN, compact, epoch_to_iso, iso_to_epoch, kstatus_conditions, stable_hash

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

# The digest of the pod the spec asks for (image shorthand or template): a change replaces the pod.
# Under the CRD's group: it is the operator's own data, not Kopf state.
TEMPLATE_HASH_ANNOTATION = f"{GROUP}/template-hash"

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# Crash backoff for pods that end, like the kubelet's: the first replacement at once, then 10 s
# doubling up to 5 minutes; a pod that ran 10 minutes before ending resets it.
BACKOFF_FIRST_SECONDS = 10.0
BACKOFF_CAP_SECONDS = 300.0
BACKOFF_RESET_SECONDS = 600.0

# A pod that something took away did not end by itself, whatever phase it reports on its way out (since
# Kubernetes 1.27 the kubelet moves a deleted or evicted pod to Failed or Succeeded before it is
# removed). It is replaced at once and never counts toward the crash backoff. The cases, by what
# the pod shows (``departure``):
#  - a deletionTimestamp: deleted by hand, by a ChaosAgent, by the garbage collector, or by the
#    eviction that ``kubectl drain`` and the Eviction API make (the pod is deleted once evicted);
#  - the DisruptionTarget condition (True) the control plane or the kubelet adds before taking a pod
#    away, by its reason:
DISRUPTION_REASONS = {
    "EvictionByEvictionAPI": "evicted through the Eviction API (a drain, a ChaosAgent, a user)",
    "PreemptionByScheduler": "preempted by the scheduler for a pod of higher priority",
    "DeletionByTaintManager": "deleted for a NoExecute taint of its node",
    "DeletionByPodGC": "deleted by the pod garbage collector (its node is gone)",
    "TerminationByKubelet": "stopped by the kubelet (node pressure or the node's shutdown)",
}
#  - the pod's status.reason, set by the kubelet (older kubelets set no DisruptionTarget condition):
TAKEN_AWAY_REASONS = {
    "Evicted": "evicted by the kubelet (node pressure)",
    "Preempting": "preempted by the kubelet for a critical pod",
    "Terminated": "stopped for the node's shutdown",  # the graceful node shutdown manager's reason
    "Shutdown": "stopped for the node's shutdown",  # its reason before Kubernetes 1.26
    "NodeShutdown": "stopped for the node's shutdown",
    "NodeLost": "lost with its node",
}
# Every other end (a container that exited under restartPolicy Never/OnFailure, an admission refused
# by the kubelet, a deadline) is the pod's own: one more end in a row (``observe_end``).
DISRUPTION_CONDITION = "DisruptionTarget"

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
    count starts, patch status with a resourceVersion and post Events; nothing else. Compact: it is
    kept for the object's lifetime, in Kopf's index and as the controller's newest answer."""
    meta = ic.get("metadata") or {}
    return compact({
        "apiVersion": ic.get("apiVersion", API_VERSION),
        "kind": ic.get("kind", KIND),
        "metadata": {key: meta[key] for key in SNAPSHOT_METADATA if meta.get(key) is not None},
        "spec": ic.get("spec") or {},
        "status": ic.get("status") or {},
    })


def pod_summary(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the pods index keeps of one of our pods: what ``observe_pod`` reads, nothing more (compact:
    it is kept for the pod's lifetime)."""
    meta = pod.get("metadata") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    status = pod.get("status") or {}
    summary_meta = {key: meta[key] for key in ("name", "uid", "resourceVersion", "ownerReferences",
                                               "deletionTimestamp") if meta.get(key) is not None}
    template_hash = (meta.get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
    if template_hash:
        summary_meta["annotations"] = {TEMPLATE_HASH_ANNOTATION: template_hash}
    summary_status = {key: status[key] for key in ("phase", "reason", "startTime") if status.get(key) is not None}
    disruption = pod_disruption(pod)
    if disruption:
        summary_status["disruption"] = disruption
    statuses = status.get("containerStatuses") or []
    summary_status["restartCount"] = sum(int(c.get("restartCount") or 0) for c in statuses)
    finished = [t["finishedAt"] for c in statuses
                if (t := (c.get("state") or {}).get("terminated") or {}).get("finishedAt")]
    if finished:
        summary_status["finishedAt"] = max(finished)
    summary_status["ready"] = pod_ready(pod)
    return compact({
        "metadata": summary_meta,
        "spec": {"containers": [{"name": c.get("name"), "image": c.get("image")} for c in containers]},
        "status": summary_status,
    })


def pod_fingerprint(pod: Mapping[str, Any]) -> int:
    """What the pods index and the pod handler read of a pod (its owner label and summary), without
    its version: equal across a modification they need not see (the scheduler binding it to a node,
    a kubelet status with the same phase, readiness and counts). A 64-bit hash: one is kept per pod."""
    summary = pod_summary(pod)
    summary["metadata"].pop("resourceVersion", None)
    owner = ((pod.get("metadata") or {}).get("labels") or {}).get(OWNER_LABEL)
    return hash((owner, repr(summary)))


def pod_disruption(pod: Mapping[str, Any]) -> str | None:
    """The reason of the pod's DisruptionTarget condition while it is True (or the summary's copy)."""
    status = pod.get("status") or {}
    if "disruption" in status:
        return str(status["disruption"]) if status["disruption"] else None
    for cond in status.get("conditions") or ():
        if cond.get("type") == DISRUPTION_CONDITION and cond.get("status") == "True":
            return str(cond.get("reason") or "Unknown")
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's own Ready condition (its readiness probes pass), or the summary's copy of it."""
    status = pod.get("status") or {}
    if "ready" in status:
        return bool(status["ready"])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def pod_template(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pod the spec asks for: ``template`` (labels, annotations, pod spec), or the article's
    shorthand ``image`` (one container named acontainer). With both, ``image`` fills in the image of
    template containers that have none."""
    template = spec.get("template")
    image = spec.get("image")
    if not template:
        return {"labels": {}, "annotations": {}, "spec": {"containers": [{"name": CONTAINER_NAME, "image": image}]}}
    meta = template.get("metadata") or {}
    pod_spec = copy.deepcopy(dict(template.get("spec") or {}))
    if image:
        pod_spec["containers"] = [c if c.get("image") else {**c, "image": image}
                                  for c in pod_spec.get("containers") or ()]
    return {"labels": dict(meta.get("labels") or {}), "annotations": dict(meta.get("annotations") or {}),
            "spec": pod_spec}


def template_hash(spec: Mapping[str, Any]) -> str:
    return stable_hash(pod_template(spec))


def _main_image(containers: Any) -> str | None:
    """The image that stands for the pod: the article's container's, else the first container's."""
    containers = list(containers or ())
    main = next((c for c in containers if c.get("name") == CONTAINER_NAME), containers[0] if containers else {})
    return main.get("image")


def main_image(spec: Mapping[str, Any]) -> str:
    return str(_main_image(pod_template(spec)["spec"].get("containers")) or "")


def build_pod(ic: Mapping[str, Any], template: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The pod manifest for an ImmortalContainer (the article's pod, or the template's), with the
    project's labels (which win over the template's), the owner reference and the template digest.
    ``template``: ``pod_template(ic["spec"])`` when the caller has it already."""
    meta = ic["metadata"]
    name = meta["name"]
    template = template if template is not None else pod_template(ic["spec"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name),
            "namespace": meta["namespace"],
            "labels": {**template["labels"], ARTICLE_LABEL: name, OWNER_LABEL: name},
            "annotations": {**template["annotations"], TEMPLATE_HASH_ANNOTATION: stable_hash(template)},
            "ownerReferences": [{
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": name,
                "uid": meta["uid"],
                "controller": True,
            }],
        },
        "spec": template["spec"],
    }


@dataclasses.dataclass(frozen=True)
class Wanted:
    """The pod one version of the spec asks for, built once: its main image, its template digest
    (compared with the pod's on every pass) and the manifest to create (or to dry-run)."""

    image: str
    hash: str
    pod: Mapping[str, Any]


def wanted(ic: Mapping[str, Any]) -> Wanted:
    template = pod_template(ic["spec"])
    return Wanted(image=str(_main_image(template["spec"].get("containers")) or ""), hash=stable_hash(template),
                  pod=build_pod(ic, template))


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
    template_hash: str | None = None  # None: created before templates (compare the image only)
    restarts: int = 0  # the containers' own restarts (restartCount, summed)
    started_at: str | None = None
    finished_at: str | None = None
    ready: bool = False  # the pod's Ready condition: its containers are ready (readiness probes pass)
    disruption: str | None = None  # the reason of its DisruptionTarget condition (True)

    @property
    def ended(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def departure(self) -> str | None:
        """What took the pod away, in words (None: nothing did; if it ended, it ended by itself)."""
        if self.terminating:
            return "deleted"
        if self.disruption:
            return DISRUPTION_REASONS.get(self.disruption, f"disrupted ({self.disruption})")
        return TAKEN_AWAY_REASONS.get(self.reason or "")

    @property
    def ended_by_itself(self) -> bool:
        """An end that counts toward the crash backoff: terminal, and nothing took the pod away."""
        return self.ended and self.departure is None

    def ran_seconds(self, now: float) -> float:
        """How long the pod ran before ending (0 when its start is unknown)."""
        started = iso_to_epoch(self.started_at)
        if started is None:
            return 0.0
        return max(0.0, (iso_to_epoch(self.finished_at) or now) - started)


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
    image = _main_image(containers)
    status = pod.get("status") or {}
    return PodView(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        owned=owned,
        image=image,
        phase=status.get("phase"),
        terminating=bool(meta.get("deletionTimestamp")),
        reason=status.get("reason"),
        template_hash=(meta.get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION),
        restarts=int(status.get("restartCount") or sum(int(c.get("restartCount") or 0)
                                                       for c in status.get("containerStatuses") or ())),
        started_at=status.get("startTime"),
        finished_at=status.get("finishedAt"),
        ready=pod_ready(pod),
        disruption=pod_disruption(pod),
    )


class Action(enum.Enum):
    NONE = "none"  # converged
    CREATE = "create"  # no pod: start one
    DELETE = "delete"  # our pod ended or runs the wrong image: remove it (the next pass creates)
    WAIT = "wait"  # our pod is going away: wait for it
    BLOCKED = "blocked"  # a pod we do not own has the target name: never touch it
    BACKOFF = "backoff"  # our pod ended again soon after the last end: replace it later
    INVALID = "invalid"  # the API server refuses the pod the spec describes: wait for a spec change
    REFUSED = "refused"  # as INVALID, but our previous pod still runs: keep it until the spec is fixed


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str  # CamelCase, used as the Ready condition's reason and the event's reason
    message: str
    retry_in: float = 0.0  # BACKOFF: seconds until the replacement


def spec_change(image: str, pod: PodView, wanted_hash: str | None) -> Decision | None:
    """The replacement a pod made from another spec needs (None when it matches the spec)."""
    if pod.image != image:
        return Decision(Action.DELETE, "ImageChanged",
                        f"pod {pod.name} runs {pod.image}, the spec asks for {image}; replacing it")
    if wanted_hash and pod.template_hash and pod.template_hash != wanted_hash:
        return Decision(Action.DELETE, "TemplateChanged",
                        f"pod {pod.name} was made from another template; replacing it")
    return None


def decide(image: str, pod: PodView | None, wanted_hash: str | None = None,
           backoff: Mapping[str, Any] | None = None, now: float = 0.0) -> Decision:
    """What to do next about the pod, given the desired image (and template digest), the observed
    pod, and the crash backoff state (``observe_end``) at ``now`` (epoch seconds). An ended pod made
    from another spec is replaced at once: the crash backoff belongs to the spec that crashed (as the
    kubelet's does to the container spec)."""
    if pod is None:
        return Decision(Action.CREATE, "PodCreating", "no pod is running; starting one")
    if not pod.owned:
        return Decision(Action.BLOCKED, "ForeignPod",
                        f"pod {pod.name} exists but is not owned by this ImmortalContainer; "
                        "it is left alone; waiting for it to go away")
    if pod.terminating:
        return Decision(Action.WAIT, "PodTerminating",
                        f"pod {pod.name} is terminating; waiting to replace it")
    changed = spec_change(image, pod, wanted_hash)
    if pod.ended and pod.departure is not None:
        return Decision(Action.DELETE, "PodDisrupted",
                        f"pod {pod.name} was {pod.departure} (phase {pod.phase}); not an end of its own: "
                        "replacing it at once, no crash backoff")
    if pod.ended:
        why = f" ({pod.reason})" if pod.reason else ""
        if changed is not None:
            return Decision(Action.DELETE, changed.reason,
                            f"pod {pod.name} ended with phase {pod.phase}{why} and the spec has changed "
                            "since; replacing it at once (no crash backoff for a new spec)")
        next_at = iso_to_epoch((backoff or {}).get("nextAttempt")) if (backoff or {}).get("podUID") == pod.uid else None
        wait = 0.0 if next_at is None else next_at - now
        if wait > 0:
            return Decision(Action.BACKOFF, "BackOff",
                            f"pod {pod.name} ended with phase {pod.phase}{why} "
                            f"({(backoff or {}).get('failures')} ends in a row); replacing it at "
                            f"{(backoff or {}).get('nextAttempt')}", retry_in=wait)
        return Decision(Action.DELETE, "PodEnded",
                        f"pod {pod.name} ended with phase {pod.phase}{why}; replacing it")
    if changed is not None:
        return changed
    if pod.phase == "Running" and pod.ready:
        return Decision(Action.NONE, "PodReady", f"pod {pod.name} is running {image} and Ready")
    if pod.phase == "Running":
        return Decision(Action.NONE, "PodNotReady",
                        f"pod {pod.name} is running {image} but not Ready (its readiness probe fails "
                        "or a container is not ready yet)")
    return Decision(Action.NONE, "PodStarting", f"pod {pod.name} is {pod.phase or 'Pending'}")


def refuses_pod(status: int | None, message: str) -> bool:
    """Whether an API error answering a pod create (or its dry run) refuses the pod itself, so that
    only a spec change helps: invalid (400/422), or forbidden by admission (PodSecurity, a webhook,
    a missing ServiceAccount). Not a quota (freed when the old pod goes), our own RBAC, or a
    namespace being deleted."""
    if status in (400, 422):
        return True
    return status == 403 and not any(
        sign in message for sign in ("exceeded quota", "cannot create resource", "being terminated"))


def refused(pod: PodView, message: str) -> Decision:
    """The API server refuses the pod the spec describes while our previous pod still runs."""
    return Decision(Action.REFUSED, "TemplateRefused",
                    f"the API server refuses the pod the spec describes ({message}); pod {pod.name} keeps "
                    "running the previous spec until the spec is fixed")


def backoff_delay(ends_before: int) -> float:
    """Seconds before replacing a pod that ended after ``ends_before`` earlier ends in a row:
    0 (the first replacement at once), then 10, 20, 40, ... capped at 300."""
    if ends_before <= 0:
        return 0.0
    return min(BACKOFF_CAP_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** min(ends_before - 1, 16))


def observe_end(backoff: Mapping[str, Any] | None, pod: PodView | None, now: float) -> dict[str, Any]:
    """The crash backoff state after observing ``pod`` at ``now``: an owned pod that ended by itself
    and was not counted yet (by uid, so retries and restarts count it once) is one more end in a row,
    unless it ran 10 minutes or was made from another spec than the last pod that ended (the count
    starts again). A pod taken away (``PodView.departure``: deleted, evicted, drained, preempted)
    neither counts nor resets the count, whichever of its events (the kubelet's terminal phase, the
    deletion) is seen first: every one of them carries the deletionTimestamp or disruption."""
    state = dict(backoff or {})
    if pod is None or not pod.owned or not pod.ended_by_itself or state.get("podUID") == pod.uid:
        return state
    new_spec = bool(pod.template_hash and state.get("templateHash") and pod.template_hash != state["templateHash"])
    fresh = new_spec or pod.ran_seconds(now) >= BACKOFF_RESET_SECONDS
    ends_before = 0 if fresh else int(state.get("failures") or 0)
    delay = backoff_delay(ends_before)
    why = f" ({pod.reason})" if pod.reason else ""
    return {"podUID": pod.uid, "templateHash": pod.template_hash, "failures": ends_before + 1,
            "delaySeconds": int(delay),
            "nextAttempt": epoch_to_iso(now + delay),
            "lastEnd": f"pod {pod.name} ended with phase {pod.phase}{why} at {epoch_to_iso(now)}"}


def count_start(status: Mapping[str, Any], pod: PodView | None, created: Collection[str] = ()
                ) -> tuple[int, str | None]:
    """(startTimes, currentPodUID) after observing ``pod``: an owned pod with an uncounted uid is a start,
    and so is every other pod in ``created`` (pods we created since the last status write, which may be
    gone before any write saw them)."""
    starts = int(status.get("startTimes") or 0)
    counted_uid = status.get("currentPodUID")
    if pod is not None and pod.owned and pod.uid and pod.uid != counted_uid:
        starts, counted_uid = starts + 1, pod.uid
    missed = set(created) - {counted_uid, status.get("currentPodUID"), None, ""}
    return starts + len(missed), counted_uid


def next_status(
    status: Mapping[str, Any],
    generation: int | None,
    pod: PodView | None,
    decision: Decision,
    now: str | None = None,
    backoff: Mapping[str, Any] | None = None,
    created: Collection[str] = (),
) -> dict[str, Any]:
    """The full set of status fields this operator owns, after observing ``pod`` and deciding
    (``created``: see ``count_start``)."""
    starts, counted_uid = count_start(status, pod, created)
    new: dict[str, Any] = {"startTimes": starts}
    if pod is not None and pod.owned:
        new["restartCount"] = pod.restarts
    elif status.get("restartCount") is not None:
        new["restartCount"] = status["restartCount"]
    if backoff:
        # nextAttempt only while a replacement waits; the count of ends in a row stays.
        # (null deletes the key in the merge patch).
        new["backoff"] = {**backoff, "nextAttempt": backoff.get("nextAttempt")
                          if decision.action is Action.BACKOFF else None}
    if counted_uid is not None:
        new["currentPodUID"] = counted_uid
    if pod is not None and pod.owned:
        new["currentPod"] = pod.name
    elif status.get("currentPod"):
        new["currentPod"] = status["currentPod"]
    if generation is not None:
        new["observedGeneration"] = generation
    new["conditions"] = conditions(status.get("conditions"), decision, generation, now)
    return new


# Decisions that cannot succeed until a person changes something (kstatus: Failed).
STALLED_ACTIONS = frozenset({Action.BLOCKED, Action.INVALID, Action.REFUSED})


def conditions(previous: Any, decision: Decision, generation: int | None, now: str | None = None
               ) -> list[dict[str, Any]]:
    """Ready (the pod is Ready), Stalled (a foreign pod in the way, a template the API server
    refuses) or else Reconciling, with the decision's reason and message."""
    return kstatus_conditions(previous, ready=decision.action is Action.NONE and decision.reason == "PodReady",
                              stalled=decision.action in STALLED_ACTIONS, reason=decision.reason,
                              message=decision.message, observed_generation=generation, now=now)


def _comparable(status: Mapping[str, Any]) -> dict[str, Any]:
    conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
             for c in status.get("conditions") or ()]
    keys = ("startTimes", "currentPodUID", "currentPod", "observedGeneration", "restartCount")
    backoff = {k: v for k, v in (status.get("backoff") or {}).items() if v is not None}
    return {**{k: status.get(k) for k in keys}, "backoff": backoff or None, "conditions": conds}


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` changes anything (so a converged object is not patched again)."""
    return _comparable(old) != _comparable(new)


def ready_reason(status: Mapping[str, Any]) -> str | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Ready":
            return str(cond.get("reason"))
    return None


# A pod of ours going away, or a new one starting, is reported in status only if it still is this much later.
TRANSIENT_SECONDS = 2.0


def settles(status: Mapping[str, Any], pod: PodView | None, decision: Decision, trigger: str) -> bool:
    """Whether to wait ``TRANSIENT_SECONDS`` before reporting this decision (a pass with the trigger
    "settle" then reports whatever it finds). Two waits usually end at once, and one status write
    then says it all:
    - our counted pod is going away: its DELETED event follows, and the replacement's write reports it;
    - an uncounted pod of ours has not started yet (usually the one this pass created): its Running
      event follows, and one write counts it and says Ready."""
    if trigger == "settle" or pod is None:
        return False
    counted = status.get("currentPodUID")
    going = decision.action is Action.WAIT and pod.uid == counted and ready_reason(status) != decision.reason
    starting = decision.reason == "PodStarting" and pod.owned and pod.uid != counted
    return going or starting


@dataclasses.dataclass(frozen=True)
class Step:
    """One pass's decision about what it observed: what to do, the crash backoff state after
    observing the pod (``observe_end``), and whether to report it now or only if it lasts."""

    pod: PodView | None
    decision: Decision
    backoff: Mapping[str, Any]
    settle: bool

    def instead(self, decision: Decision) -> Step:
        """Acting found out otherwise (the API server refuses the pod, the namespace is going away):
        that is reported at once."""
        return dataclasses.replace(self, decision=decision, settle=False)


def decide_pass(status: Mapping[str, Any], pod: PodView | None, want: Wanted, now: float, trigger: str) -> Step:
    """The one decision of a pass, from what it observed: the ImmortalContainer's status, the newest
    pod with the target name, the pod the spec asks for, the time and what triggered the pass."""
    backoff = observe_end(status.get("backoff"), pod, now)
    decision = decide(want.image, pod, want.hash, backoff, now)
    return Step(pod, decision, backoff, settles(status, pod, decision, trigger))
