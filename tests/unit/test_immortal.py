"""Pure decisions of the immortal containers operator: pod manifest, start counting, status."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from kopf_operators.core import catalogue, conventions
from kopf_operators.immortal.decisions import (
    OWNER_LABEL,
    TEMPLATE_HASH_ANNOTATION,
    Action,
    Decision,
    PodView,
    backoff_delay,
    build_pod,
    count_start,
    decide,
    decide_pass,
    ic_name_for_pod,
    main_image,
    next_status,
    observe_end,
    observe_pod,
    pod_disruption,
    pod_fingerprint,
    pod_name,
    pod_summary,
    ready_reason,
    refused,
    refuses_pod,
    snapshot,
    status_changed,
    template_hash,
    wanted,
)

IC: dict[str, Any] = {
    "apiVersion": "immortalcontainer.flugel.it/v1alpha1",
    "kind": "ImmortalContainer",
    "metadata": {"name": "example-immortalcontainer", "namespace": "ns1", "uid": "ic-uid", "generation": 3},
    "spec": {"image": "nginx:latest"},
}


def view(**kw: Any) -> PodView:
    base: dict[str, Any] = dict(name="example-immortalcontainer-immortalpod", uid="pod-1", owned=True,
                                image="nginx:latest", phase="Running", terminating=False, ready=True)
    base.update(kw)
    return PodView(**base)


def test_pod_manifest_matches_the_article_plus_project_label() -> None:
    pod = build_pod(IC)
    meta = pod["metadata"]
    assert meta["name"] == "example-immortalcontainer-immortalpod"
    assert meta["namespace"] == "ns1"
    assert meta["labels"] == {"controller": "example-immortalcontainer",
                              "kopf-operators.dev/immortal": "example-immortalcontainer"}
    assert meta["ownerReferences"] == [{
        "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
        "name": "example-immortalcontainer", "uid": "ic-uid", "controller": True,
    }]
    assert pod["spec"]["containers"] == [{"name": "acontainer", "image": "nginx:latest"}]
    # No Kopf state: the only annotation is the operator's digest of the pod the spec asks for.
    assert meta["annotations"] == {TEMPLATE_HASH_ANNOTATION: template_hash(IC["spec"])}
    assert "finalizers" not in meta


def test_pod_name_round_trip() -> None:
    assert ic_name_for_pod(pod_name("a")) == "a"
    assert ic_name_for_pod("-immortalpod") is None
    assert ic_name_for_pod("web-1") is None


def test_observe_pod_ownership_by_controller_uid() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "x-immortalpod", "uid": "u", "ownerReferences": [
        {"uid": "ic-uid", "controller": True}]},
        "spec": {"containers": [{"name": "acontainer", "image": "img"}]}, "status": {"phase": "Pending"}}
    v = observe_pod(pod, "ic-uid")
    assert v is not None and v.owned and v.image == "img" and v.phase == "Pending" and not v.terminating
    other = observe_pod(pod, "another-uid")
    assert other is not None and not other.owned
    not_controller = {**pod, "metadata": {**pod["metadata"], "ownerReferences": [{"uid": "ic-uid"}]}}
    nc = observe_pod(not_controller, "ic-uid")
    assert nc is not None and not nc.owned
    assert observe_pod(None, "ic-uid") is None


@pytest.mark.parametrize(("pod", "action", "reason"), [
    (None, Action.CREATE, "PodCreating"),
    (view(owned=False), Action.BLOCKED, "ForeignPod"),
    (view(owned=False, phase="Failed"), Action.BLOCKED, "ForeignPod"),  # never touch it
    (view(terminating=True), Action.WAIT, "PodTerminating"),
    (view(phase="Failed"), Action.DELETE, "PodEnded"),
    (view(phase="Succeeded"), Action.DELETE, "PodEnded"),
    (view(phase="Failed", reason="Evicted"), Action.DELETE, "PodDisrupted"),
    (view(phase="Failed", reason="Error"), Action.DELETE, "PodEnded"),
    (view(image="nginx:1.0"), Action.DELETE, "ImageChanged"),
    (view(phase="Pending"), Action.NONE, "PodStarting"),
    (view(phase="Running", ready=False), Action.NONE, "PodNotReady"),  # Running is not enough
    (view(), Action.NONE, "PodReady"),
])
def test_decide(pod: PodView | None, action: Action, reason: str) -> None:
    d = decide("nginx:latest", pod)
    assert (d.action, d.reason) == (action, reason)


def test_count_start_is_idempotent_per_pod_uid() -> None:
    assert count_start({}, None) == (0, None)
    assert count_start({}, view(uid="a")) == (1, "a")
    # Same pod seen again (retry, second event, restart): not counted again.
    assert count_start({"startTimes": 1, "currentPodUID": "a"}, view(uid="a")) == (1, "a")
    # A new pod (another uid): one more start, whatever its phase.
    ended = view(uid="b", phase="Failed")
    assert count_start({"startTimes": 1, "currentPodUID": "a"}, ended) == (2, "b")
    # No pod, or a foreign pod: the count stays.
    assert count_start({"startTimes": 4, "currentPodUID": "a"}, None) == (4, "a")
    assert count_start({"startTimes": 4, "currentPodUID": "a"}, view(uid="z", owned=False)) == (4, "a")


def test_pods_we_created_that_vanished_before_a_write_are_counted_once() -> None:
    counted = {"startTimes": 1, "currentPodUID": "a"}
    # "b" was created and deleted before any write saw it; "c" (its replacement) is the pod now.
    assert count_start(counted, view(uid="c"), created={"b", "c"}) == (3, "c")
    # No pod now (the replacement waits): "b" still counts, the counted uid stays.
    assert count_start(counted, None, created={"b"}) == (2, "a")
    # The pod already counted, or the one counted now, is never counted again through ``created``.
    assert count_start(counted, view(uid="a"), created={"a"}) == (1, "a")
    assert count_start(counted, view(uid="c"), created={"a", "c"}) == (2, "c")


def test_replaying_observations_never_double_counts() -> None:
    status: dict[str, Any] = {}
    for uid in ["a", "a", "b", "b", "b", "c", "a"]:  # "a" again = an old observation replayed late
        status = next_status(status, 1, view(uid=uid), decide("nginx:latest", view(uid=uid)))
    # a, b, c, and the stale "a" differs from "c": counted; stale events cannot come after a newer
    # pod in practice because every pass reads the pod fresh from the API.
    assert status["startTimes"] == 4


def test_next_status_ready_and_generation() -> None:
    st = next_status({}, 3, view(), decide("nginx:latest", view()), now="T1")
    assert st["currentPod"] == "example-immortalcontainer-immortalpod"
    assert st["startTimes"] == 1 and st["currentPodUID"] == "pod-1"
    assert st["observedGeneration"] == 3
    conds = {c["type"]: c for c in st["conditions"]}
    ready = conds["Ready"]
    assert ready["status"] == "True" and ready["reason"] == "PodReady"
    assert ready["lastTransitionTime"] == "T1" and ready["observedGeneration"] == 3
    assert conds["Reconciling"]["status"] == conds["Stalled"]["status"] == "False"
    # Converged: a second pass changes nothing, so nothing is written.
    again = next_status(st, 3, view(), decide("nginx:latest", view()), now="T2")
    assert not status_changed(st, again)
    # Foreign pod: not ready, count and currentPod kept.
    foreign = view(uid="f", owned=False)
    blocked = next_status(st, 3, foreign, decide("nginx:latest", foreign), now="T3")
    assert blocked["startTimes"] == 1 and blocked["currentPod"] == st["currentPod"]
    conds = {c["type"]: c for c in blocked["conditions"]}
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "ForeignPod"
    # A foreign pod is never touched: only a person can clear the way (kstatus: Failed).
    assert conds["Stalled"]["status"] == "True" and conds["Reconciling"]["status"] == "False"
    assert status_changed(st, blocked)
    assert ready_reason(blocked) == "ForeignPod"


def test_status_changed_ignores_transition_times_only() -> None:
    a = next_status({}, 1, None, decide("x", None), now="T1")
    b = next_status({}, 1, None, decide("x", None), now="T2")
    assert not status_changed(a, b)
    assert status_changed(a, {**b, "observedGeneration": 2})


# --- pod template --------------------------------------------------------------------------------


TEMPLATE_SPEC: dict[str, Any] = {"template": {
    "metadata": {"labels": {"app": "web", "controller": "spoofed"}, "annotations": {"team": "a"}},
    "spec": {"serviceAccountName": "runner", "nodeSelector": {"disk": "ssd"},
             "tolerations": [{"key": "k", "operator": "Exists"}], "securityContext": {"runAsNonRoot": True},
             "volumes": [{"name": "v", "emptyDir": {}}],
             "containers": [{"name": "web", "image": "nginx:1.27", "command": ["nginx"], "args": ["-g", "x"],
                             "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80}],
                             "resources": {"limits": {"cpu": "1"}}, "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                             "readinessProbe": {"httpGet": {"port": 80}}},
                            {"name": "side", "command": ["sleep"]}]}}}


def test_pod_from_a_template_keeps_everything_and_our_labels_win() -> None:
    ic = {**IC, "spec": {**TEMPLATE_SPEC, "image": "busybox:1.36"}}
    pod = build_pod(ic)
    template = TEMPLATE_SPEC["template"]
    assert pod["metadata"]["labels"] == {"app": "web", "controller": "example-immortalcontainer",
                                         OWNER_LABEL: "example-immortalcontainer"}
    assert pod["metadata"]["annotations"]["team"] == "a"
    spec = pod["spec"]
    for field in ("serviceAccountName", "nodeSelector", "tolerations", "securityContext", "volumes"):
        assert spec[field] == template["spec"][field]
    assert spec["containers"][0] == template["spec"]["containers"][0]
    assert spec["containers"][1] == {"name": "side", "command": ["sleep"], "image": "busybox:1.36"}  # filled in
    assert "image" not in template["spec"]["containers"][1]  # the spec itself is not mutated
    assert main_image(ic["spec"]) == "nginx:1.27"


def test_a_template_change_replaces_the_pod_like_an_image_change() -> None:
    ic = {**IC, "spec": TEMPLATE_SPEC}
    built = observe_pod(build_pod(ic), "ic-uid")
    assert built is not None
    wanted = template_hash(TEMPLATE_SPEC)
    running = dataclasses.replace(built, phase="Running")
    assert decide("nginx:1.27", running, wanted).action is Action.NONE
    changed = json.loads(json.dumps(TEMPLATE_SPEC))
    changed["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "2"}]
    decision = decide("nginx:1.27", running, template_hash(changed))
    assert (decision.action, decision.reason) == (Action.DELETE, "TemplateChanged")
    # A pod from before templates (no digest) is compared by image only: no needless replacement.
    legacy = dataclasses.replace(running, template_hash=None)
    assert decide("nginx:1.27", legacy, template_hash(changed)).action is Action.NONE


# --- crash backoff --------------------------------------------------------------------------------


def test_backoff_arithmetic_like_the_kubelet() -> None:
    assert [backoff_delay(n) for n in range(8)] == [0, 10, 20, 40, 80, 160, 300, 300]
    assert backoff_delay(1000) == 300


NOW = 1_700_000_000.0


def ended(uid: str, started: float | None = None, **kw: Any) -> PodView:
    return view(uid=uid, phase="Failed", started_at=conventions.epoch_to_iso(started) if started else None, **kw)


def test_backoff_counts_each_end_once_and_waits_longer_each_time() -> None:
    state: dict[str, Any] = {}
    delays = []
    for i in range(5):
        state = observe_end(state, ended(f"p{i}", NOW - 5), NOW)
        again = observe_end(state, ended(f"p{i}", NOW - 5), NOW + 3)  # a retry or second event
        assert again == state
        delays.append(state["delaySeconds"])
    assert delays == [0, 10, 20, 40, 80] and state["failures"] == 5
    assert state["nextAttempt"] == conventions.epoch_to_iso(NOW + 80)


def test_backoff_resets_after_a_pod_ran_ten_minutes() -> None:
    state = {"podUID": "old", "failures": 6, "nextAttempt": None}
    state = observe_end(state, ended("long", NOW - 601), NOW)
    assert (state["failures"], state["delaySeconds"]) == (1, 0)
    state = observe_end(state, ended("short", NOW - 599), NOW)
    assert (state["failures"], state["delaySeconds"]) == (2, 10)


def test_decide_first_end_at_once_then_backoff_until_due() -> None:
    first = observe_end({}, ended("a"), NOW)
    assert decide("nginx:latest", ended("a"), None, first, NOW).action is Action.DELETE
    second = observe_end(first, ended("b"), NOW)
    decision = decide("nginx:latest", ended("b"), None, second, NOW)
    assert (decision.action, decision.reason, decision.retry_in) == (Action.BACKOFF, "BackOff", 10)
    assert decide("nginx:latest", ended("b"), None, second, NOW + 10).action is Action.DELETE
    # Status shows the next attempt only while waiting; the count of ends in a row stays.
    waiting = next_status({}, 1, ended("b"), decision, backoff=second)
    assert waiting["backoff"]["nextAttempt"] == conventions.epoch_to_iso(NOW + 10)
    assert ready_reason(waiting) == "BackOff"
    created = next_status(waiting, 1, view(uid="c"), decide("nginx:latest", view(uid="c")),
                          backoff=second)
    assert created["backoff"]["nextAttempt"] is None and created["backoff"]["failures"] == 2


def test_a_spec_change_ends_the_backoff_and_starts_the_count_again() -> None:
    """Issue #20: a fix must not wait out the backoff of the spec that crashed."""
    state: dict[str, Any] = {}
    for uid in ("a", "b", "c"):
        state = observe_end(state, ended(uid, template_hash="h1"), NOW)
    assert (state["failures"], state["delaySeconds"], state["templateHash"]) == (3, 20, "h1")
    crashed = ended("c", template_hash="h1")
    assert decide("nginx:latest", crashed, "h1", state, NOW).action is Action.BACKOFF
    fixed = decide("nginx:latest", crashed, "h2", state, NOW)  # the template was fixed
    assert (fixed.action, fixed.reason) == (Action.DELETE, "TemplateChanged")
    assert "at once" in fixed.message
    image_fix = decide("busybox:1.36", crashed, None, state, NOW)  # the image was fixed
    assert (image_fix.action, image_fix.reason) == (Action.DELETE, "ImageChanged")
    # The pod of the new spec ending is the first end of that spec: replaced at once.
    state = observe_end(state, ended("d", template_hash="h2"), NOW)
    assert (state["failures"], state["delaySeconds"], state["templateHash"]) == (1, 0, "h2")
    # Pods without a digest (from before templates) keep counting.
    legacy = observe_end(state, ended("e"), NOW)
    assert legacy["failures"] == 2


def kubelet_pod(phase: str = "Running", *, deleted: bool = False, reason: str | None = None,
                disruption: str | None = None, uid: str = "gone") -> dict[str, Any]:
    """A pod of ours as a real kubelet reports it (camelCase API dict)."""
    meta: dict[str, Any] = {"name": "example-immortalcontainer-immortalpod", "uid": uid, "resourceVersion": "7",
                            "ownerReferences": [{"uid": "ic-uid", "controller": True}]}
    if deleted:
        meta["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    conditions = [{"type": "Ready", "status": "False"}]
    if disruption:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
    status: dict[str, Any] = {"phase": phase, "conditions": conditions, "startTime": "2026-11-26T09:59:00Z",
                              "containerStatuses": [{"restartCount": 0, "state": {"terminated": {
                                  "exitCode": 137, "finishedAt": "2026-11-26T10:00:01Z"}}}]}
    if reason:
        status["reason"] = reason
    return {"metadata": meta, "spec": {"containers": [{"name": "acontainer", "image": "nginx:latest"}]},
            "status": status}


# Each way a pod is taken away, as the kubelet reports it on its way out (Kubernetes >= 1.27 moves such a
# pod to a terminal phase before it is removed): not an end of its own.
TAKEN_AWAY = {
    "deleted by hand (graceful)": kubelet_pod("Failed", deleted=True),
    "deleted, all containers exited 0": kubelet_pod("Succeeded", deleted=True),
    "a ChaosAgent's kill (a deletion)": kubelet_pod("Failed", deleted=True),
    "Eviction API / kubectl drain, before the deletion": kubelet_pod("Running", disruption="EvictionByEvictionAPI"),
    "Eviction API / kubectl drain, on its way out": kubelet_pod("Failed", deleted=True,
                                                                disruption="EvictionByEvictionAPI"),
    "evicted by the kubelet (node pressure), left Failed": kubelet_pod("Failed", reason="Evicted",
                                                                       disruption="TerminationByKubelet"),
    "evicted by an older kubelet (no condition)": kubelet_pod("Failed", reason="Evicted"),
    "preempted by the scheduler": kubelet_pod("Failed", disruption="PreemptionByScheduler"),
    "preempted by the kubelet": kubelet_pod("Failed", reason="Preempting"),
    "graceful node shutdown": kubelet_pod("Failed", reason="Terminated"),
    "graceful node shutdown (before 1.26)": kubelet_pod("Failed", reason="Shutdown"),
    "NoExecute taint": kubelet_pod("Failed", disruption="DeletionByTaintManager"),
    "pod garbage collector (node gone)": kubelet_pod("Failed", disruption="DeletionByPodGC"),
    "a disruption this version does not name": kubelet_pod("Failed", disruption="SomethingNew"),
}


@pytest.mark.parametrize("case", TAKEN_AWAY)
def test_a_pod_taken_away_is_not_an_end_and_is_replaced_at_once(case: str) -> None:
    body = TAKEN_AWAY[case]
    for pod in (observe_pod(body, "ic-uid"), observe_pod(pod_summary(body), "ic-uid")):
        assert pod is not None and pod.departure is not None and not pod.ended_by_itself
        # Two ends of its own in a row before: the next one would wait 20 s; this one neither waits nor counts.
        state = {"podUID": "earlier", "failures": 2, "delaySeconds": 10,
                 "nextAttempt": conventions.epoch_to_iso(NOW + 5)}
        assert observe_end(state, pod, NOW) == state
        decision = decide("nginx:latest", pod, None, observe_end(state, pod, NOW), NOW)
        if pod.terminating:
            assert decision.action is Action.WAIT  # its DELETED event replaces it at once
        elif pod.ended:
            assert (decision.action, decision.reason) == (Action.DELETE, "PodDisrupted")
            assert "no crash backoff" in decision.message
        else:
            assert decision.action is Action.NONE  # still running: the deletion follows
        # The disappearance itself (DELETED): replaced at once.
        assert decide("nginx:latest", None, None, state, NOW).action is Action.CREATE


@pytest.mark.parametrize("body", [kubelet_pod("Failed"), kubelet_pod("Succeeded"),
                                  kubelet_pod("Failed", reason="Error"),
                                  kubelet_pod("Failed", reason="UnexpectedAdmissionError")])
def test_an_end_the_pod_reached_by_itself_counts(body: dict[str, Any]) -> None:
    pod = observe_pod(pod_summary(body), "ic-uid")
    assert pod is not None and pod.departure is None and pod.ended_by_itself
    state = observe_end({"podUID": "earlier", "failures": 1}, pod, NOW)
    assert (state["failures"], state["delaySeconds"]) == (2, 10)
    assert decide("nginx:latest", pod, None, state, NOW).action is Action.BACKOFF


def test_a_deletion_counts_nothing_whichever_event_comes_first() -> None:
    """A kubelet reports a deleted pod Failed before it is removed; the operator may see that MODIFIED
    first, or only the DELETED (a watch reconnect, a busy process). Same state and decisions either way."""
    failed = observe_pod(kubelet_pod("Failed", deleted=True), "ic-uid")
    crash = observe_pod(kubelet_pod("Failed", uid="crash"), "ic-uid")
    assert failed is not None and crash is not None
    for seen in ([failed, None], [None], [failed]):
        state: dict[str, Any] = {}
        for pod in seen:
            state = observe_end(state, pod, NOW)
        assert state == {}
        # A real crash afterwards is the first end in a row: replaced at once.
        after = observe_end(state, crash, NOW)
        assert (after["failures"], after["delaySeconds"]) == (1, 0)
        assert decide("nginx:latest", crash, None, after, NOW).action is Action.DELETE
    # Between two crashes, deletions neither count nor reset the count.
    state = observe_end({}, crash, NOW)
    for i in range(3):
        state = observe_end(state, observe_pod(kubelet_pod("Failed", deleted=True, uid=f"d{i}"),
                                               "ic-uid"), NOW)
    again = observe_pod(kubelet_pod("Failed", uid="crash-2"), "ic-uid")
    assert observe_end(state, again, NOW)["failures"] == 2


def test_the_pods_index_keeps_the_disruption() -> None:
    summary = pod_summary(kubelet_pod("Running", disruption="EvictionByEvictionAPI"))
    assert summary["status"]["disruption"] == "EvictionByEvictionAPI"
    assert "disruption" not in pod_summary(kubelet_pod("Running"))["status"]
    # A condition that is not True (the disruption was called off) is no disruption.
    body = kubelet_pod("Running")
    body["status"]["conditions"].append({"type": "DisruptionTarget", "status": "False", "reason": "x"})
    assert pod_disruption(body) is None
    assert pod_fingerprint(body) != pod_fingerprint(kubelet_pod("Running", disruption="x"))


@pytest.mark.parametrize(("status", "message", "refuses"), [
    (422, 'Pod "x" is invalid: spec.containers[0].name: Invalid value: "Bad_Name"', True),
    (400, "bad request", True),
    (403, 'pods "x" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true', True),
    (403, 'pods "x" is forbidden: error looking up service account ns/missing', True),
    (403, 'admission webhook "deny.example.com" denied the request: no', True),
    (403, 'pods "x" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=1, limited: pods=1',
     False),
    (403, 'pods is forbidden: User "system:serviceaccount:x:y" cannot create resource "pods"', False),
    (403, "unable to create new content in namespace x because it is being terminated", False),
    (409, "already exists", False),
    (500, "etcd timeout", False),
    (None, "", False),
])
def test_which_answers_refuse_the_pod_itself(status: int | None, message: str, refuses: bool) -> None:
    assert refuses_pod(status, message) is refuses


def test_a_refused_replacement_is_reported_while_the_pod_keeps_running() -> None:
    decision = refused(view(), 'Pod "x" is invalid: Bad_Name')
    assert (decision.action, decision.reason) == (Action.REFUSED, "TemplateRefused")
    assert "keeps running" in decision.message and "Bad_Name" in decision.message
    st = next_status({}, 4, view(), decision)
    cond = st["conditions"][0]
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("False", "TemplateRefused", 4)
    assert st["currentPod"] == view().name  # the pod that keeps running is still ours, counted


def test_status_shows_the_containers_restart_count() -> None:
    summary = pod_summary({"metadata": {"name": "x", "uid": "u"}, "spec": {"containers": []},
                           "status": {"phase": "Running", "containerStatuses": [{"restartCount": 2},
                                                                               {"restartCount": 1}]}})
    view = observe_pod(summary, "ic-uid")
    assert view is not None and view.restarts == 3
    status = next_status({}, 1, dataclasses.replace(view, owned=True), decide("x", None))
    assert status["restartCount"] == 3


def test_a_late_event_of_a_replaced_pod_never_counts_as_a_new_start() -> None:
    """Kopf handles each pod (uid) on its own: the old pod's events may come after its successor's.
    The controller keeps the newest version per object; a deletion is remembered at its version."""
    from kopf_operators.immortal.controller import ImmortalController

    def pod(uid: str, rv: int, **meta: Any) -> dict[str, Any]:
        return pod_summary({"metadata": {"name": "x-immortalpod", "uid": uid, "resourceVersion": str(rv),
                                         "ownerReferences": [{"controller": True, "uid": "ic-uid"}], **meta},
                                  "spec": {"containers": [{"name": "acontainer", "image": "nginx"}]},
                                  "status": {"phase": "Running"}})

    ic = {"metadata": {"uid": "ic-uid"}}
    key = ("ns", "x")
    controller = ImmortalController(access=None, objects={}, pods={key: [pod("old", 10)]})  # type: ignore[arg-type]
    assert controller._pod(key, ic, ("DELETED", pod("old", 12))) is None
    controller._saw_pod(key, pod("new", 13))
    late = controller._pod(key, ic, ("MODIFIED", pod("old", 11, deletionTimestamp="t")))
    assert late is not None and late.uid == "new"
    assert controller._pod(key, ic, ("ADDED", pod("new", 13))).uid == "new"  # type: ignore[union-attr]
    assert controller._pod(key, ic, ("DELETED", pod("old", 12))).uid == "new"  # type: ignore[union-attr]


def kstatus(conditions: list[dict[str, Any]]) -> tuple[str, str, str]:
    by_type = {c["type"]: c["status"] for c in conditions}
    return by_type["Ready"], by_type["Reconciling"], by_type["Stalled"]


@pytest.mark.parametrize(("pod", "expected"), [
    (view(), ("True", "False", "False")),  # the pod is Ready: the object does its job
    (view(ready=False), ("False", "True", "False")),  # Running, readiness probe failing: not yet
    (view(phase="Pending", ready=False), ("False", "True", "False")),
    (None, ("False", "True", "False")),  # creating
    (view(phase="Failed"), ("False", "True", "False")),  # replaced by the operator, no person needed
    (view(terminating=True), ("False", "True", "False")),
    (view(owned=False), ("False", "False", "True")),  # someone else's pod in the way
])
def test_conditions_follow_kstatus(pod: PodView | None, expected: tuple[str, str, str]) -> None:
    status = next_status({}, 2, pod, decide("nginx:latest", pod))
    assert kstatus(status["conditions"]) == expected
    assert all(c["observedGeneration"] == 2 for c in status["conditions"])


def test_refused_template_stalls_with_the_api_servers_words() -> None:
    refused = Decision(Action.INVALID, "InvalidTemplate", "the API server refuses the pod: bad name")
    status = next_status({}, 1, None, refused)
    assert kstatus(status["conditions"]) == ("False", "False", "True")
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert (stalled["reason"], stalled["message"]) == ("InvalidTemplate", "the API server refuses the pod: bad name")


def test_pod_readiness_survives_the_index_summary() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "x-immortalpod", "uid": "u", "ownerReferences": [{"uid": "ic-uid", "controller": True}]},
        "spec": {"containers": [{"name": "acontainer", "image": "img"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}
    for body in (pod, pod_summary(pod)):
        observed = observe_pod(body, "ic-uid")
        assert observed is not None and not observed.ready
    ready = {**pod, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    for body in (ready, pod_summary(ready)):
        observed = observe_pod(body, "ic-uid")
        assert observed is not None and observed.ready


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in (key, *_strings(item))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return [value] if isinstance(value, str) else []


def test_kept_entries_share_their_strings_across_decoded_versions() -> None:
    """Each watch event is decoded with strings of its own; what the index and the controller keep of
    an object for its lifetime holds each distinct string once per process, however many versions
    (the index entry, the controller's newer answer) and objects keep it."""
    status = next_status({}, 1, view(), decide("nginx:latest", view()))
    ic = json.dumps({**IC, "status": status})
    owner = {"uid": "ic-uid", "controller": True, "kind": "ImmortalContainer"}
    pod = json.dumps({"metadata": {"name": "example-immortalcontainer-immortalpod", "uid": "pod-1",
                                   "ownerReferences": [owner]},
                      "spec": {"containers": [{"name": "acontainer", "image": "nginx:latest"}]},
                      "status": {"phase": "Running", "startTime": "2026-11-26T12:00:00Z"}})
    for keep in ((lambda: snapshot(json.loads(ic))), (lambda: pod_summary(json.loads(pod)))):
        first, second = _strings(keep()), _strings(keep())
        assert first
        assert all(a is b for a, b in zip(first, second, strict=True))
    # Within one entry, the conditions' repeated reasons, messages and timestamps are one string each.
    kept = _strings(snapshot(json.loads(ic)))
    assert len({id(s) for s in kept}) == len(set(kept))


class FakeAccess:
    """The access layer's surface the immortal controller uses, recording writes (controller logic
    only; behaviour against the API server is in tests/e2e)."""

    def __init__(self, refuse: bool, ic: dict[str, Any]) -> None:
        self.refuse = refuse
        self.ic = ic
        self.calls: list[tuple[str, bool]] = []

    def serialised(self, key: Any) -> Any:
        import contextlib

        @contextlib.asynccontextmanager
        async def hold() -> Any:
            yield

        return hold()

    async def create(self, kind: Any, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any] | None:
        from kopf_operators.core.api import ApiError

        self.calls.append(("create", dry_run))
        if self.refuse:
            raise ApiError(422, "Unprocessable Entity", 'Pod "x" is invalid: Bad_Name')
        return body

    async def delete(self, *args: Any, **kwargs: Any) -> bool:
        self.calls.append(("delete", False))
        return True

    async def patch_status(self, kind: Any, namespace: str, name: str, status: dict[str, Any],
                           resource_version: str | None = None) -> dict[str, Any]:
        self.calls.append(("patch-status", False))
        return {**self.ic, "metadata": {**self.ic["metadata"], "resourceVersion": "99"}, "status": status}

    def event(self, body: Any, type_: str, reason: str, message: str) -> None:
        assert catalogue.event_problem(type_, reason) is None, catalogue.event_problem(type_, reason)
        self.calls.append((f"event {reason}", False))

    def keep_answer(self, answer: dict[str, Any]) -> None:
        pass  # only Kopf's event processing asks about it (tests/unit/test_process.py)


@pytest.mark.parametrize("refuse", [True, False])
def test_a_running_pod_is_deleted_only_after_the_dry_run_accepts_its_replacement(refuse: bool) -> None:
    """Issue #20: the dry run comes before the delete; a refused spec is asked about once per spec
    (pod events do not repeat it), the periodic sweep asks again."""
    import asyncio

    from kopf_operators.immortal.controller import ImmortalController

    key = ("ns1", "example-immortalcontainer")
    ic = {**IC, "metadata": {**IC["metadata"], "resourceVersion": "5"}, "spec": {"image": "nginx:2"}}
    running = pod_summary({"metadata": {"name": "example-immortalcontainer-immortalpod", "uid": "pod-1",
                                        "resourceVersion": "4",
                                        "ownerReferences": [{"controller": True, "uid": "ic-uid"}]},
                                 "spec": {"containers": [{"name": "acontainer", "image": "nginx:1"}]},
                                 "status": {"phase": "Running"}})
    access = FakeAccess(refuse, ic)
    controller = ImmortalController(access, objects={key: [snapshot(ic)]}, pods={key: [running]})  # type: ignore[arg-type]

    async def passes() -> list[Decision | None]:
        return [await controller.converge(key, trigger=trigger) for trigger in ("object", "pod modified", "resync")]

    decisions = asyncio.run(passes())
    if refuse:
        assert [d.reason for d in decisions if d] == ["TemplateRefused"] * 3
        assert [c for c in access.calls if c[0] in ("create", "delete")] == [("create", True), ("create", True)]
        events = [c[0] for c in access.calls if c[0].startswith("event")]
        assert sorted(events) == ["event Stalled", "event TemplateRefused"]  # once per episode
    else:
        assert decisions[0] is not None and decisions[0].reason == "ImageChanged"
        assert access.calls[:2] == [("create", True), ("delete", False)]


def test_a_pods_fingerprint_changes_only_with_what_the_operator_reads() -> None:
    """A pod's binding to a node and a kubelet status that changes no phase, readiness or count run no
    pass (process.skip_unchanged); whatever the controller reads changes the fingerprint."""
    created: dict[str, dict[str, Any]] = {"metadata": {"name": "x-immortalpod", "uid": "pod-1", "resourceVersion": "10",
                                           "labels": {OWNER_LABEL: "x"},
                                           "ownerReferences": [{"controller": True, "uid": "ic-1"}]},
                                      "spec": {"containers": [{"name": "acontainer", "image": "nginx"}]},
                                      "status": {"phase": "Pending"}}

    def changed(**parts: Any) -> dict[str, Any]:
        pod = copy.deepcopy(created)
        for part, fields in parts.items():
            pod[part].update(fields)
        return pod

    fingerprint = pod_fingerprint(created)
    bound = changed(metadata={"resourceVersion": "11"}, spec={"nodeName": "node-1"},
                    status={"conditions": [{"type": "PodScheduled", "status": "True"}]})
    assert pod_fingerprint(bound) == fingerprint
    running = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    for other in (changed(status={"phase": "Running"}), changed(status=running),
                  changed(status={"startTime": "2026-11-26T06:00:00Z"}),
                  changed(status={"containerStatuses": [{"restartCount": 1}]}),
                  changed(metadata={"deletionTimestamp": "2026-11-26T06:00:00Z"}),
                  changed(metadata={"labels": {OWNER_LABEL: "y"}}),
                  changed(spec={"containers": [{"name": "acontainer", "image": "nginx:2"}]})):
        assert pod_fingerprint(other) != fingerprint


# --- one pass's decision (decide_pass): what to do, and whether to report it now --------------------


def ready_status(reason: str = "PodReady", uid: str = "pod-1") -> dict[str, Any]:
    return {"currentPodUID": uid, "startTimes": 1,
            "conditions": [{"type": "Ready", "status": "True" if reason == "PodReady" else "False", "reason": reason}]}


def test_the_wanted_pod_is_built_once_with_its_digest_and_main_image() -> None:
    want = wanted({**IC, "spec": TEMPLATE_SPEC})
    assert want.hash == template_hash(TEMPLATE_SPEC)
    assert want.image == main_image(TEMPLATE_SPEC)
    assert want.pod == build_pod({**IC, "spec": TEMPLATE_SPEC})


@pytest.mark.parametrize(("status", "pod", "trigger", "settle"), [
    # Our counted pod is going away: wait; its DELETED event and the replacement follow at once.
    (ready_status(), view(terminating=True), "pod modified", True),
    # ... reported if it lasts (the settle pass), or at once if already reported as going.
    (ready_status(), view(terminating=True), "settle", False),
    (ready_status("PodTerminating"), view(terminating=True), "pod modified", False),
    # A new pod of ours, not started yet: its Running event usually follows; one write then says it all.
    (ready_status(), view(uid="pod-2", phase="Pending", ready=False), "pod added", True),
    (ready_status(), view(uid="pod-2", phase="Pending", ready=False), "settle", False),
    # The counted pod is still starting (reported so): nothing to wait for.
    (ready_status("PodStarting"), view(phase="Pending", ready=False), "object", False),
    # A running pod, no pod at all, a foreign pod: report now.
    (ready_status(), view(uid="pod-2"), "pod modified", False),
    ({}, None, "object", False),
    (ready_status(), view(uid="other", owned=False, phase="Pending"), "object", False),
])
def test_a_pass_waits_to_report_only_what_usually_ends_at_once(status: dict[str, Any], pod: PodView | None,
                                                               trigger: str, settle: bool) -> None:
    step = decide_pass(status, pod, wanted(IC), 0.0, trigger)
    assert step.settle is settle
    assert step.decision == decide("nginx:latest", pod, template_hash(IC["spec"]), step.backoff, 0.0)


def test_a_pass_counts_an_end_in_its_backoff_once_and_acting_otherwise_reports_at_once() -> None:
    ended = view(phase="Failed", ready=False, started_at="2026-11-26T12:00:00Z", finished_at="2026-11-26T12:00:05Z")
    first = decide_pass(ready_status(), ended, wanted(IC), 1_000.0, "pod modified")
    assert (first.backoff["failures"], first.decision.action) == (1, Action.DELETE)
    again = decide_pass({**ready_status(), "backoff": first.backoff}, ended, wanted(IC), 1_001.0, "retry")
    assert again.backoff == first.backoff  # the same end, seen twice, counts once
    starting = decide_pass(ready_status(), view(uid="pod-2", phase="Pending", ready=False), wanted(IC),
                           0.0, "object")
    instead = starting.instead(refused(view(), "bad"))
    assert (instead.settle, instead.decision.action, instead.pod) == (False, Action.REFUSED, starting.pod)
