"""Pure decisions of the immortal containers operator: pod manifest, start counting, status."""

from __future__ import annotations

from typing import Any

import pytest

from kopf_operators import immortal as logic

IC: dict[str, Any] = {
    "apiVersion": "immortalcontainer.flugel.it/v1alpha1",
    "kind": "ImmortalContainer",
    "metadata": {"name": "example-immortalcontainer", "namespace": "ns1", "uid": "ic-uid", "generation": 3},
    "spec": {"image": "nginx:latest"},
}


def view(**kw: Any) -> logic.PodView:
    base: dict[str, Any] = dict(name="example-immortalcontainer-immortalpod", uid="pod-1", owned=True,
                                image="nginx:latest", phase="Running", terminating=False)
    base.update(kw)
    return logic.PodView(**base)


def test_pod_manifest_matches_the_article_plus_project_label() -> None:
    pod = logic.build_pod(IC)
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
    assert "annotations" not in meta and "finalizers" not in meta


def test_pod_name_round_trip() -> None:
    assert logic.ic_name_for_pod(logic.pod_name("a")) == "a"
    assert logic.ic_name_for_pod("-immortalpod") is None
    assert logic.ic_name_for_pod("web-1") is None


def test_observe_pod_ownership_by_controller_uid() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "x-immortalpod", "uid": "u", "ownerReferences": [
        {"uid": "ic-uid", "controller": True}]},
        "spec": {"containers": [{"name": "acontainer", "image": "img"}]}, "status": {"phase": "Pending"}}
    v = logic.observe_pod(pod, "ic-uid")
    assert v is not None and v.owned and v.image == "img" and v.phase == "Pending" and not v.terminating
    other = logic.observe_pod(pod, "another-uid")
    assert other is not None and not other.owned
    not_controller = {**pod, "metadata": {**pod["metadata"], "ownerReferences": [{"uid": "ic-uid"}]}}
    nc = logic.observe_pod(not_controller, "ic-uid")
    assert nc is not None and not nc.owned
    assert logic.observe_pod(None, "ic-uid") is None


@pytest.mark.parametrize(("pod", "action", "reason"), [
    (None, logic.Action.CREATE, "PodCreating"),
    (view(owned=False), logic.Action.BLOCKED, "ForeignPod"),
    (view(owned=False, phase="Failed"), logic.Action.BLOCKED, "ForeignPod"),  # never touch it
    (view(terminating=True), logic.Action.WAIT, "PodTerminating"),
    (view(phase="Failed"), logic.Action.DELETE, "PodEnded"),
    (view(phase="Succeeded"), logic.Action.DELETE, "PodEnded"),
    (view(phase="Failed", reason="Evicted"), logic.Action.DELETE, "PodEnded"),
    (view(image="nginx:1.0"), logic.Action.DELETE, "ImageChanged"),
    (view(phase="Pending"), logic.Action.NONE, "PodStarting"),
    (view(), logic.Action.NONE, "PodRunning"),
])
def test_decide(pod: logic.PodView | None, action: logic.Action, reason: str) -> None:
    d = logic.decide("nginx:latest", pod)
    assert (d.action, d.reason) == (action, reason)


def test_count_start_is_idempotent_per_pod_uid() -> None:
    assert logic.count_start({}, None) == (0, None)
    assert logic.count_start({}, view(uid="a")) == (1, "a")
    # Same pod seen again (retry, second event, restart): not counted again.
    assert logic.count_start({"startTimes": 1, "currentPodUID": "a"}, view(uid="a")) == (1, "a")
    # A new pod (another uid): one more start, whatever its phase.
    ended = view(uid="b", phase="Failed")
    assert logic.count_start({"startTimes": 1, "currentPodUID": "a"}, ended) == (2, "b")
    # No pod, or a foreign pod: the count stays.
    assert logic.count_start({"startTimes": 4, "currentPodUID": "a"}, None) == (4, "a")
    assert logic.count_start({"startTimes": 4, "currentPodUID": "a"}, view(uid="z", owned=False)) == (4, "a")


def test_replaying_observations_never_double_counts() -> None:
    status: dict[str, Any] = {}
    for uid in ["a", "a", "b", "b", "b", "c", "a"]:  # "a" again = an old observation replayed late
        status = logic.next_status(status, 1, view(uid=uid), logic.decide("nginx:latest", view(uid=uid)))
    # a, b, c, and the stale "a" differs from "c": counted; stale events cannot come after a newer
    # pod in practice because every pass reads the pod fresh from the API.
    assert status["startTimes"] == 4


def test_next_status_ready_and_generation() -> None:
    st = logic.next_status({}, 3, view(), logic.decide("nginx:latest", view()), now="T1")
    assert st["currentPod"] == "example-immortalcontainer-immortalpod"
    assert st["startTimes"] == 1 and st["currentPodUID"] == "pod-1"
    assert st["observedGeneration"] == 3
    [ready] = st["conditions"]
    assert ready["type"] == "Ready" and ready["status"] == "True" and ready["reason"] == "PodRunning"
    assert ready["lastTransitionTime"] == "T1" and ready["observedGeneration"] == 3
    # Converged: a second pass changes nothing, so nothing is written.
    again = logic.next_status(st, 3, view(), logic.decide("nginx:latest", view()), now="T2")
    assert not logic.status_changed(st, again)
    # Foreign pod: not ready, count and currentPod kept.
    foreign = view(uid="f", owned=False)
    blocked = logic.next_status(st, 3, foreign, logic.decide("nginx:latest", foreign), now="T3")
    assert blocked["startTimes"] == 1 and blocked["currentPod"] == st["currentPod"]
    [cond] = blocked["conditions"]
    assert cond["status"] == "False" and cond["reason"] == "ForeignPod"
    assert logic.status_changed(st, blocked)
    assert logic.ready_reason(blocked) == "ForeignPod"


def test_status_changed_ignores_transition_times_only() -> None:
    a = logic.next_status({}, 1, None, logic.decide("x", None), now="T1")
    b = logic.next_status({}, 1, None, logic.decide("x", None), now="T2")
    assert not logic.status_changed(a, b)
    assert logic.status_changed(a, {**b, "observedGeneration": 2})
