"""ImmortalContainer under adversarial conditions (issue #20), on the real local API server (KWOK node).

Edits the API server refuses, edits in the middle of a pass, the operator stopped at each step,
names and sizes at the API's limits, objects owned by someone else, the same change applied twice.
Each test states the promise it holds the operator to (docs/immortal.md).
"""

from __future__ import annotations

import json
import time
from typing import Any

import kubernetes
import pytest

from kopf_operators.core import conventions
from kopf_operators.immortal import decisions
from tests.e2e.immortal_helpers import (
    G,
    P,
    V,
    create_ic,
    create_template_ic,
    delete_pod,
    delete_pod_while_down,
    events_for,
    fail_pod,
    get_ic,
    has_event,
    pod_or_none,
    ready,
    status,
    wait_counted,
    wait_counted_exactly,
    wait_pod,
)
from tests.kube import OperatorProcess, PodCreations, stays, wait_for
from testsupport.audit import audit_now, operator_requests
from testsupport.kubectl import apply_yaml, kubectl

GOOD: dict[str, Any] = {"spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}
# Passes the CRD's schema, not the API server's pod validation.
BAD: dict[str, Any] = {"spec": {"containers": [{"name": "Bad_Name", "image": "nginx:1.27"}]}}


def running_pod(core: Any, namespace: str, name: str) -> Any:
    def probe() -> Any:
        pod = pod_or_none(core, namespace, name)
        return pod if pod is not None and pod.status.phase == "Running" and not pod.metadata.deletion_timestamp \
            else None
    return wait_for(probe, what=f"{name} running")


def reason_is(custom: Any, namespace: str, name: str, reason: str) -> Any:
    def probe() -> dict[str, Any]:
        st = status(custom, namespace, name)
        return st if st.get("conditions") and ready(st)["reason"] == reason else {}
    return probe


def same_pod(core: Any, namespace: str, name: str, uid: str) -> Any:
    def probe() -> bool:
        pod = pod_or_none(core, namespace, name)
        return pod is not None and pod.metadata.uid == uid and pod.metadata.deletion_timestamp is None
    return probe


def count_events(core: Any, namespace: str, name: str, reason: str) -> int:
    return sum(1 for e in events_for(core, namespace, name) if e.reason == reason)


def patch_spec(custom: Any, namespace: str, name: str, spec: dict[str, Any]) -> None:
    custom.patch_namespaced_custom_object(G, V, namespace, P, name, {"spec": spec})


# --- issue #20: an edit the API server refuses must not cause an outage ----------------------------


def test_an_edit_the_api_server_refuses_keeps_the_working_pod(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    create_template_ic(custom, namespace, "keep", {"template": GOOD})
    pod = running_pod(core, namespace, "keep-immortalpod")
    wait_counted(custom, namespace, "keep", 1, pod.metadata.uid)
    patch_spec(custom, namespace, "keep", {"template": BAD})
    st = wait_for(reason_is(custom, namespace, "keep", "TemplateRefused"), what="TemplateRefused in status")
    cond = ready(st)
    assert cond["status"] == "False" and "Bad_Name" in cond["message"], cond
    assert "keep-immortalpod" in cond["message"] and "keeps running" in cond["message"], cond
    assert cond["observedGeneration"] == get_ic(custom, namespace, "keep")["metadata"]["generation"]
    wait_for(lambda: has_event(core, namespace, "keep", "TemplateRefused", "Warning"), what="a Warning event")
    # The working pod stays (the bug: deleted within 5 s, then 422 on the new one, no pod at all).
    stays(same_pod(core, namespace, "keep-immortalpod", pod.metadata.uid), 6, what="the working pod kept")
    assert status(custom, namespace, "keep")["startTimes"] == 1
    assert count_events(core, namespace, "keep", "TemplateRefused") == 1  # once per episode
    # Fixed: the pod is replaced by the fixed template at once.
    fixed = {"spec": {"containers": [{"name": "web", "image": "nginx:1.28"}]}}
    patch_spec(custom, namespace, "keep", {"template": fixed})
    new = wait_pod(core, namespace, "keep-immortalpod", not_uid=pod.metadata.uid)
    assert new.spec.containers[0].image == "nginx:1.28"
    wait_counted(custom, namespace, "keep", 2, new.metadata.uid)
    wait_for(reason_is(custom, namespace, "keep", "PodReady"), what="Ready again")
    assert not operator.errors(about=namespace)


# --- issue #20: a spec change resets the crash backoff ---------------------------------------------


def test_a_fix_starts_at_once_instead_of_waiting_out_the_backoff(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    create_ic(custom, namespace, "loop", image="busybox:broken")
    name = "loop-immortalpod"
    first = fail_pod(core, namespace, name)  # the first end: replaced at once
    second = wait_pod(core, namespace, name, not_uid=first.metadata.uid, timeout=10)
    fail_pod(core, namespace, name)  # the second end in a row: a 10 s backoff
    st = wait_for(reason_is(custom, namespace, "loop", "BackOff"), timeout=10, what="the backoff")
    assert st["backoff"]["delaySeconds"] == 10
    fixed_at = time.monotonic()
    patch_spec(custom, namespace, "loop", {"image": "busybox:1.36"})
    fixed = wait_pod(core, namespace, name, not_uid=second.metadata.uid, timeout=8)
    assert time.monotonic() - fixed_at < 5, "the fix waited for the old backoff"
    assert fixed.spec.containers[0].image == "busybox:1.36"
    wait_counted(custom, namespace, "loop", 3, fixed.metadata.uid)
    # The count of ends starts again with the new spec: its first end is replaced at once.
    fail_pod(core, namespace, name)
    again = wait_pod(core, namespace, name, not_uid=fixed.metadata.uid, timeout=5)
    st = wait_counted(custom, namespace, "loop", 4, again.metadata.uid)
    assert st["backoff"]["failures"] == 1 and st["backoff"]["delaySeconds"] == 0, st["backoff"]
    assert not operator.errors(about=namespace)


def test_a_refused_edit_reverted_changes_nothing(core: Any, custom: Any, namespace: str,
                                                 operator: OperatorProcess) -> None:
    create_template_ic(custom, namespace, "revert", {"template": GOOD})
    pod = running_pod(core, namespace, "revert-immortalpod")
    wait_counted(custom, namespace, "revert", 1, pod.metadata.uid)
    patch_spec(custom, namespace, "revert", {"template": BAD})
    wait_for(reason_is(custom, namespace, "revert", "TemplateRefused"), what="TemplateRefused")
    patch_spec(custom, namespace, "revert", {"template": GOOD})  # back to what the pod runs
    wait_for(reason_is(custom, namespace, "revert", "PodReady"), what="Ready again")
    stays(same_pod(core, namespace, "revert-immortalpod", pod.metadata.uid), 3, what="the same pod, never replaced")
    assert status(custom, namespace, "revert")["startTimes"] == 1


@pytest.mark.parametrize("case", ["missing-service-account", "pod-security"])
def test_an_edit_refused_by_admission_keeps_the_working_pod(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess, case: str) -> None:
    """Not only validation: admission (a ServiceAccount that does not exist, Pod Security) refuses
    pods with 403, and the dry run goes through admission too."""
    create_template_ic(custom, namespace, "adm", {"template": GOOD})
    pod = running_pod(core, namespace, "adm-immortalpod")
    wait_counted(custom, namespace, "adm", 1, pod.metadata.uid)
    spec: dict[str, Any]
    if case == "pod-security":
        core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
        spec = {"containers": [{"name": "web", "image": "nginx:1.27", "securityContext": {"privileged": True}}]}
        needle = "PodSecurity"
    else:
        spec = {"serviceAccountName": "nobody", "containers": [{"name": "web", "image": "nginx:1.27"}]}
        needle = "nobody"
    patch_spec(custom, namespace, "adm", {"template": {"spec": spec}})
    st = wait_for(reason_is(custom, namespace, "adm", "TemplateRefused"), what="TemplateRefused")
    assert needle in ready(st)["message"], ready(st)
    stays(same_pod(core, namespace, "adm-immortalpod", pod.metadata.uid), 4, what="the working pod kept")
    assert not operator.errors(about=namespace)


def test_a_refused_edit_is_asked_about_once_not_on_every_pod_event(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    """Pod events while the refusal stands do not repeat the dry run (nor post Events again)."""
    create_template_ic(custom, namespace, "once", {"template": GOOD})
    pod = running_pod(core, namespace, "once-immortalpod")
    wait_counted(custom, namespace, "once", 1, pod.metadata.uid)
    since = audit_now()
    patch_spec(custom, namespace, "once", {"template": BAD})
    wait_for(reason_is(custom, namespace, "once", "TemplateRefused"), what="TemplateRefused")
    for restarts in (1, 2, 3):  # pod events: its containers restart
        current = core.read_namespaced_pod("once-immortalpod", namespace)
        statuses = kubernetes.client.ApiClient().sanitize_for_serialization(current.status.container_statuses)
        for cs in statuses:
            cs["restartCount"] = restarts
        core.patch_namespaced_pod_status("once-immortalpod", namespace, {"status": {"containerStatuses": statuses}})
        wait_for(lambda r=restarts: status(custom, namespace, "once").get("restartCount") == r,  # type: ignore[misc]
                 what=f"restartCount {restarts}")
    calls = operator_requests(namespace, since)
    assert calls.count(("create", "pods", "once-immortalpod")) == 1, calls  # the one dry run
    assert not [c for c in calls if c[0] == "delete"], calls
    assert count_events(core, namespace, "once", "TemplateRefused") == 1
    assert ready(status(custom, namespace, "once"))["reason"] == "TemplateRefused"


# --- edits in the middle of a pass -----------------------------------------------------------------


HOLD = "kopf-operators.dev/test-hold"  # a finalizer of the test's: keeps a deleted pod terminating


def hold(core: Any, namespace: str, name: str) -> None:
    core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": [HOLD]}})


def release(core: Any, namespace: str, name: str) -> None:
    core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})


def test_edits_while_the_old_pod_terminates_end_with_the_last_spec(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    creations = PodCreations(core, namespace, field_selector="metadata.name=mid-immortalpod")
    create_ic(custom, namespace, "mid", image="nginx:1.25")
    pod = running_pod(core, namespace, "mid-immortalpod")
    wait_counted(custom, namespace, "mid", 1, pod.metadata.uid)
    hold(core, namespace, "mid-immortalpod")
    patch_spec(custom, namespace, "mid", {"image": "nginx:1.26"})
    wait_for(lambda: core.read_namespaced_pod("mid-immortalpod", namespace).metadata.deletion_timestamp,
             what="the old pod terminating")
    patch_spec(custom, namespace, "mid", {"image": "nginx:1.27"})  # a second edit mid-replacement
    patch_spec(custom, namespace, "mid", {"image": "nginx:1.28"})  # and a third
    stays(same_pod_terminating(core, namespace, "mid-immortalpod", pod.metadata.uid), 2,
          what="nothing created while the old pod is still there")
    release(core, namespace, "mid-immortalpod")
    new = wait_pod(core, namespace, "mid-immortalpod", not_uid=pod.metadata.uid)
    assert new.spec.containers[0].image == "nginx:1.28"
    wait_counted(custom, namespace, "mid", 2, new.metadata.uid)
    stays(same_pod(core, namespace, "mid-immortalpod", new.metadata.uid), 2, what="the last spec's pod stays")
    # One replacement (KWOK may re-create a just-created pod: then each pod is still counted once).
    creations.life("mid-immortalpod", new.metadata.uid)
    uids = creations.uids("mid-immortalpod")
    assert uids[0] == pod.metadata.uid and uids[-1] == new.metadata.uid, uids
    assert status(custom, namespace, "mid")["startTimes"] == len(uids)
    creations.stop()
    assert not operator.errors(about=namespace)


def same_pod_terminating(core: Any, namespace: str, name: str, uid: str) -> Any:
    def probe() -> bool:
        pod = pod_or_none(core, namespace, name)
        return pod is not None and pod.metadata.uid == uid
    return probe


def test_recreated_under_the_same_name_never_adopts_the_old_pod(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    """Deleted with --cascade=orphan and created again: the old pod keeps our labels but belongs to
    nobody; it is reported, never deleted or adopted, and the new object's pod follows once it goes."""
    creations = PodCreations(core, namespace, field_selector="metadata.name=again-immortalpod")
    create_ic(custom, namespace, "again")
    old = running_pod(core, namespace, "again-immortalpod")
    kubectl_ok("delete", "ic", "again", "-n", namespace, "--cascade=orphan")
    wait_for(lambda: not (core.read_namespaced_pod("again-immortalpod", namespace).metadata.owner_references or []),
             what="the garbage collector to orphan the pod")
    create_ic(custom, namespace, "again")
    wait_for(reason_is(custom, namespace, "again", "ForeignPod"), what="ForeignPod")
    stays(same_pod(core, namespace, "again-immortalpod", old.metadata.uid), 3, what="the orphan left alone")
    assert not core.read_namespaced_pod("again-immortalpod", namespace).metadata.owner_references
    delete_pod(core, namespace, "again-immortalpod")
    wait_pod(core, namespace, "again-immortalpod", not_uid=old.metadata.uid)
    wait_counted_exactly(custom, namespace, "again", creations, not_ours=(old.metadata.uid,))
    creations.stop()


def test_a_foreign_pod_wearing_our_labels_is_never_touched(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    labels = {"controller": "mimic", decisions.OWNER_LABEL: "mimic"}
    foreign = core.create_namespaced_pod(namespace, {
        "metadata": {"name": "mimic-immortalpod", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}})
    create_ic(custom, namespace, "mimic", image="nginx:1.27")
    wait_for(reason_is(custom, namespace, "mimic", "ForeignPod"), what="ForeignPod")
    # Its events reach us (it carries the watched label): still never deleted, whatever it does.
    core.patch_namespaced_pod_status("mimic-immortalpod", namespace, {"status": {"phase": "Failed"}})
    stays(same_pod_terminating(core, namespace, "mimic-immortalpod", foreign.metadata.uid), 3,
          what="the foreign pod untouched")
    assert core.read_namespaced_pod("mimic-immortalpod", namespace).metadata.deletion_timestamp is None
    assert status(custom, namespace, "mimic").get("startTimes", 0) == 0


# --- the operator stopped at each step ------------------------------------------------------------


@pytest.mark.parametrize("step", ["before-acting", "after-deleting-the-old-pod"])
def test_operator_stopped_during_a_replacement_converges_once(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess, step: str) -> None:
    create_ic(custom, namespace, "paused", image="nginx:1.25")
    pod = running_pod(core, namespace, "paused-immortalpod")
    wait_counted(custom, namespace, "paused", 1, pod.metadata.uid)
    operator.stop()
    patch_spec(custom, namespace, "paused", {"image": "nginx:1.27"})
    if step == "after-deleting-the-old-pod":  # the state a crash right after our delete leaves
        delete_pod_while_down(core, namespace, "paused-immortalpod")
    operator.start()
    new = wait_pod(core, namespace, "paused-immortalpod", not_uid=pod.metadata.uid)
    assert new.spec.containers[0].image == "nginx:1.27"
    wait_counted(custom, namespace, "paused", 2, new.metadata.uid)
    stays(lambda: status(custom, namespace, "paused")["startTimes"] == 2, 2, what="counted once")


def test_operator_restarted_while_an_edit_is_refused_keeps_the_pod(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    """What the operator learnt about the refusal is in memory only; after a restart it asks again
    before touching the pod."""
    create_template_ic(custom, namespace, "sticky", {"template": GOOD})
    pod = running_pod(core, namespace, "sticky-immortalpod")
    wait_counted(custom, namespace, "sticky", 1, pod.metadata.uid)
    operator.stop()
    patch_spec(custom, namespace, "sticky", {"template": BAD})  # edited while the operator is down
    operator.start()
    wait_for(reason_is(custom, namespace, "sticky", "TemplateRefused"), what="TemplateRefused after start")
    operator.restart()
    stays(same_pod(core, namespace, "sticky-immortalpod", pod.metadata.uid), 4, what="the working pod kept")


def test_operator_restarted_during_a_backoff_keeps_its_schedule(
        core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    create_ic(custom, namespace, "sched", image="busybox:1.36")
    name = "sched-immortalpod"
    first = fail_pod(core, namespace, name)
    second = wait_pod(core, namespace, name, not_uid=first.metadata.uid, timeout=10)
    fail_pod(core, namespace, name)
    st = wait_for(reason_is(custom, namespace, "sched", "BackOff"), timeout=10, what="the backoff")
    due = iso_epoch(st["backoff"]["nextAttempt"])
    operator.restart()
    stays(lambda: pod_or_none(core, namespace, name).metadata.uid == second.metadata.uid,
          seconds=max(0.0, due - time.time() - 1.5), what="no replacement before nextAttempt")
    third = wait_pod(core, namespace, name, not_uid=second.metadata.uid, timeout=max(0.0, due - time.time()) + 8)
    wait_counted(custom, namespace, "sched", 3, third.metadata.uid)


# --- names and sizes at the API's limits ----------------------------------------------------------


@pytest.mark.parametrize("name", ["n" * 63, "dotted.name.v1", "0-starts-with-a-digit"])
def test_every_name_the_crd_accepts_works(core: Any, custom: Any, namespace: str, operator: OperatorProcess,
                                           name: str) -> None:
    pod_name = decisions.pod_name(name)
    creations = PodCreations(core, namespace, field_selector=f"metadata.name={pod_name}")
    create_ic(custom, namespace, name)
    pod = running_pod(core, namespace, pod_name)
    assert pod.metadata.labels["controller"] == name and pod.metadata.labels[decisions.OWNER_LABEL] == name
    wait_counted(custom, namespace, name, 1, pod.metadata.uid)
    wait_for(lambda: has_event(core, namespace, name, "PodCreated", "Normal"), what="a PodCreated event")
    delete_pod(core, namespace, pod_name)
    wait_pod(core, namespace, pod_name, not_uid=pod.metadata.uid)
    wait_counted_exactly(custom, namespace, name, creations)
    creations.stop()
    assert len(creations.uids(pod_name)) >= 2
    assert not operator.errors(about=namespace)


def test_a_name_that_cannot_work_is_refused_up_front(namespace: str, crds: None) -> None:
    body = {"apiVersion": decisions.API_VERSION, "kind": decisions.KIND, "metadata": {"name": "n" * 64},
            "spec": {"image": "nginx"}}
    result = apply_json(body, namespace)
    assert result.returncode != 0 and "at most 63 characters: it is used as a label value" in result.stderr


def test_a_pod_at_the_size_limit_runs(core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    """A template near the API's size limit (a 700 KiB environment value; the CR and the pod both
    carry it) works like any other, and a change to it replaces the pod."""
    big = "x" * (700 * 1024)
    spec: dict[str, Any] = {"spec": {"containers": [
        {"name": "web", "image": "nginx:1.27", "env": [{"name": "BIG", "value": big}]}]}}
    create_template_ic(custom, namespace, "big", {"template": spec})
    pod = running_pod(core, namespace, "big-immortalpod")
    assert len(pod.spec.containers[0].env[0].value) == len(big)
    wait_counted(custom, namespace, "big", 1, pod.metadata.uid)
    spec["spec"]["containers"][0]["env"][0]["value"] = "y" * len(big)
    patch_spec(custom, namespace, "big", {"template": spec})
    new = wait_pod(core, namespace, "big-immortalpod", not_uid=pod.metadata.uid)
    assert new.spec.containers[0].env[0].value[0] == "y"
    wait_counted(custom, namespace, "big", 2, new.metadata.uid)
    assert not operator.errors(about=namespace)


def test_an_oversized_pod_is_refused_and_reported(core: Any, custom: Any, namespace: str,
                                                   operator: OperatorProcess) -> None:
    """Annotations over the API's 256 KiB: the CR is accepted, the pod is not. A new object reports
    InvalidTemplate; an edit to it keeps the working pod (TemplateRefused)."""
    huge = {"metadata": {"annotations": {"big": "x" * (300 * 1024)}}, **GOOD}
    create_template_ic(custom, namespace, "fat", {"template": huge})
    st = wait_for(reason_is(custom, namespace, "fat", "InvalidTemplate"), what="InvalidTemplate")
    assert "annotations" in ready(st)["message"], ready(st)
    create_template_ic(custom, namespace, "slim", {"template": GOOD})
    pod = running_pod(core, namespace, "slim-immortalpod")
    patch_spec(custom, namespace, "slim", {"template": huge})
    wait_for(reason_is(custom, namespace, "slim", "TemplateRefused"), what="TemplateRefused")
    stays(same_pod(core, namespace, "slim-immortalpod", pod.metadata.uid), 3, what="the working pod kept")
    assert not operator.errors(about=namespace)


# --- the same change applied twice ----------------------------------------------------------------


def test_the_same_change_applied_twice_changes_nothing(core: Any, custom: Any, namespace: str,
                                                        operator: OperatorProcess) -> None:
    manifest = {"apiVersion": decisions.API_VERSION, "kind": decisions.KIND, "metadata": {"name": "twice"},
                "spec": {"template": {"metadata": {"labels": {"a": "1", "b": "2"}}, **GOOD}}}
    creations = PodCreations(core, namespace, field_selector="metadata.name=twice-immortalpod")
    try:
        apply_json(manifest, namespace, check=True)
        pod = running_pod(core, namespace, "twice-immortalpod")
        wait_counted(custom, namespace, "twice", 1, pod.metadata.uid)
        apply_json(manifest, namespace, check=True)
        # The same template with its keys in another order: the same pod.
        reordered = {**manifest, "spec": {"template": {"spec": GOOD["spec"],
                                                       "metadata": {"labels": {"b": "2", "a": "1"}}}}}
        apply_json(reordered, namespace, check=True)
        stays(same_pod(core, namespace, "twice-immortalpod", pod.metadata.uid), 2, what="no replacement")
        # The same image change twice: the operator replaces the pod once (one ImageChanged). KWOK may
        # then delete the replacement by name once more (see immortal_helpers.delete_pod): the operator
        # replaces that one as it would any lost pod, and every pod created is counted once.
        changed = {**manifest, "spec": {"template": {"metadata": {"labels": {"a": "1", "b": "2"}},
                                                     "spec": {"containers": [{"name": "web", "image": "nginx:1.28"}]}}}}
        apply_json(changed, namespace, check=True)
        apply_json(changed, namespace, check=True)
        wait_pod(core, namespace, "twice-immortalpod", not_uid=pod.metadata.uid)
        wait_counted_exactly(custom, namespace, "twice", creations)
    finally:
        creations.stop()
    assert core.read_namespaced_pod("twice-immortalpod", namespace).spec.containers[0].image == "nginx:1.28"
    assert count_events(core, namespace, "twice", "ImageChanged") == 1
    assert count_events(core, namespace, "twice", "PodCreated") == status(custom, namespace, "twice")["startTimes"]


# --- helpers ---------------------------------------------------------------------------------------


def iso_epoch(value: str) -> float:
    epoch = conventions.iso_to_epoch(value)
    assert epoch is not None, value
    return epoch


def apply_json(body: dict[str, Any], namespace: str, check: bool = False) -> Any:
    return apply_yaml(json.dumps(body), namespace, check=check)


def kubectl_ok(*args: str) -> None:
    kubectl(*args)
