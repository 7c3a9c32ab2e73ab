"""Helpers shared by the ImmortalContainer end-to-end tests (tests/e2e/test_immortal*.py,
test_metrics.py): create and read ImmortalContainers, wait for their pods and counted starts, read their
Events. Test modules import from here, never from each other."""

from __future__ import annotations

from typing import Any

import kubernetes

from kopf_operators.immortal import decisions
from tests.kube import PodCreations, stays, wait_for

G, V, P = decisions.GROUP, decisions.VERSION, decisions.PLURAL


def create_ic(custom: Any, namespace: str, name: str, image: str = "nginx:latest") -> dict[str, Any]:
    body = {"apiVersion": decisions.API_VERSION, "kind": decisions.KIND, "metadata": {"name": name},
            "spec": {"image": image}}
    return dict(custom.create_namespaced_custom_object(G, V, namespace, P, body))


def get_ic(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(custom.get_namespaced_custom_object(G, V, namespace, P, name))


def status(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(get_ic(custom, namespace, name).get("status") or {})


def pod_or_none(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> Any:
    try:
        return core.read_namespaced_pod(name, namespace)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_pod(core: kubernetes.client.CoreV1Api, namespace: str, name: str, not_uid: str | None = None,
             timeout: float = 30, interval: float = 0.05) -> Any:
    """The pod ``name`` once it exists (and is not terminating), with a uid other than ``not_uid``."""
    def probe() -> Any:
        pod = pod_or_none(core, namespace, name)
        ok = pod is not None and pod.metadata.uid != not_uid and pod.metadata.deletion_timestamp is None
        return pod if ok else None
    return wait_for(probe, timeout=timeout, interval=interval, what=f"pod {name} (uid != {not_uid})")


def wait_counted(custom: Any, namespace: str, name: str, starts: int, uid: str, timeout: float = 30) -> dict[str, Any]:
    def probe() -> dict[str, Any]:
        st = status(custom, namespace, name)
        return st if st.get("startTimes") == starts and st.get("currentPodUID") == uid else {}
    return wait_for(probe, timeout=timeout, what=f"{name} to count start #{starts} for pod {uid}")


def started_ic(core: kubernetes.client.CoreV1Api, custom: Any, namespace: str, name: str) -> tuple[PodCreations, Any]:
    """An ImmortalContainer ``name`` created with a watch of its pod's creations (the ground truth of
    its starts: ``wait_counted_exactly``), once its first pod is counted: (the watch, the pod)."""
    creations = PodCreations(core, namespace, field_selector=f"metadata.name={name}-immortalpod")
    create_ic(custom, namespace, name)
    pod = wait_pod(core, namespace, f"{name}-immortalpod")
    wait_counted(custom, namespace, name, 1, pod.metadata.uid)
    return creations, pod


def ready(st: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in st.get("conditions") or () if c["type"] == "Ready")


def events_for(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    return list(core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items)


def has_event(core: kubernetes.client.CoreV1Api, namespace: str, name: str, reason: str, type_: str) -> bool:
    return any(e.reason == reason and e.type == type_ for e in events_for(core, namespace, name))


def assert_no_kopf_state_on(pod: Any) -> None:
    annotations = pod.metadata.annotations or {}
    assert not [k for k in annotations if "kopf" in k], annotations
    assert not pod.metadata.finalizers, pod.metadata.finalizers


def delete_pod(core: kubernetes.client.CoreV1Api, namespace: str, name: str, *, at_once: bool = False) -> None:
    """Delete the pod ``name`` if it is still there. On a KWOK node, KWOK (v0.8.0) finishes each pod
    deletion with a DELETE by name, without a uid precondition, often twice (kwok-controller.log: "Delete
    pod", then a "not found" retry): a late one deletes the replacement that already has the name, and
    the operator replaces that one too. So a pod may be gone before the test deletes it, and the tests
    count starts against a pod watch (``PodCreations``), not against their own deletions.

    ``at_once``: a grace period of 0, so the API server removes the pod in the same request. KWOK
    still sees it marked deleting and sends its DELETE by name some tens of milliseconds later; that
    usually finds nothing, but can hit a replacement created in between."""
    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0 if at_once else None)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


def wait_counted_exactly(custom: Any, namespace: str, name: str, creations: PodCreations,
                         not_ours: tuple[str, ...] = ()) -> None:
    """Every pod created under the name (but the uids ``not_ours``) counted once, and the newest one is
    the current pod."""
    def counted_exactly() -> bool:
        st = status(custom, namespace, name)
        created = [uid for uid in creations.uids(decisions.pod_name(name)) if uid not in not_ours]
        return bool(created) and st.get("startTimes") == len(created) and st.get("currentPodUID") == created[-1]

    wait_for(counted_exactly, what="every pod created counted once")
    stays(counted_exactly, 3, what="exactly one start per pod created")


def delete_pod_while_down(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> None:
    """Delete the pod at once while no operator runs, and return once it is gone and stays gone for a
    second: KWOK's late DELETE by name (see ``delete_pod``) lands in that second and finds nothing, so
    it cannot take the pod that replaces this one. There is nothing to wait for instead: KWOK's queued
    DELETE is not visible in the API. Without it, a replacement KWOK deleted before any operator ran
    would be the documented miss (docs/immortal.md, "What the start count can miss")."""
    delete_pod(core, namespace, name, at_once=True)
    wait_for(lambda: pod_or_none(core, namespace, name) is None, what=f"{name} to be gone")
    stays(lambda: pod_or_none(core, namespace, name) is None, 1, what=f"{name} gone (KWOK's late DELETE done)")


def create_template_ic(custom: Any, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": decisions.API_VERSION, "kind": decisions.KIND, "metadata": {"name": name}, "spec": spec}
    return dict(custom.create_namespaced_custom_object(G, V, namespace, P, body))


def fail_pod(core: Any, namespace: str, name: str) -> Any:
    def running() -> Any:
        pod = pod_or_none(core, namespace, name)
        ok = pod is not None and pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None
        return pod if ok else None

    pod = wait_for(running, what=f"{name} running")
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Failed", "reason": "Error"}})
    return pod
