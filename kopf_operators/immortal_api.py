"""Immortal containers: the one level-triggered reconcile pass (API calls; decisions in immortal.py).

Every trigger (the CR's create/update/resume handlers, pod events) calls ``reconcile``: it reads the
CR and the pod fresh from the API, acts at most once, and writes status only when it changes.
A per-object lock serialises passes inside the process; the status write carries the CR's
resourceVersion, so a pass that raced with another writer re-reads and recomputes instead of
counting a start twice.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Mapping
from typing import Any, cast

import kopf
import kubernetes

from kopf_operators import common
from kopf_operators import immortal as logic

OPERATOR = "immortal"
# A plain logger: Kopf's per-object logger would turn warnings into Events on the *pod*.
logger = logging.getLogger("kopf_operators.immortal")

_locks: collections.defaultdict[tuple[str, str], threading.Lock] = collections.defaultdict(threading.Lock)
_locks_guard = threading.Lock()


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks[(namespace, name)]


def _get_ic(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = common.custom_objects().get_namespaced_custom_object(
            logic.GROUP, logic.VERSION, namespace, logic.PLURAL, name)
    except Exception as exc:
        if common.is_status(exc, 404):
            return None
        raise
    return cast(dict[str, Any], obj)


def _get_pod(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        pod = common.core_v1().read_namespaced_pod(name, namespace)
    except Exception as exc:
        if common.is_status(exc, 404):
            return None
        raise
    return dict(common.api_client().sanitize_for_serialization(pod))


def _namespace_terminating(exc: BaseException) -> bool:
    return common.is_status(exc, 403) and "being terminated" in str(getattr(exc, "body", "") or "")


def _event(ic: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, ic), type=type_, reason=reason, message=message)


def reconcile(namespace: str, name: str, pod_deleted: bool = False) -> logic.Decision | None:
    """One pass for one ImmortalContainer; returns the decision (None when the CR is gone).

    ``pod_deleted``: called for the pod's DELETED event, so reading the pod can be skipped on the
    critical path (should a new pod exist already, creating one answers 409 and the pass re-reads)."""
    with _lock(namespace, name):
        ic = _get_ic(namespace, name)
        if ic is None or ic["metadata"].get("deletionTimestamp"):
            return None  # garbage collection removes the pod via its ownerReference
        uid = ic["metadata"]["uid"]
        decision, pod = _act(ic, pod_deleted)
        for _attempt in range(5):
            if _write_status(ic, pod, decision):
                return decision
            # 409: the CR changed since we read it (often Kopf's own bookkeeping). Recompute the
            # status from the fresh object for the pod we saw or created, so that a pod created by
            # this pass is counted even if it is deleted again meanwhile.
            fresh = _get_ic(namespace, name)
            if fresh is None or fresh["metadata"]["uid"] != uid:
                return None
            ic = fresh
        raise kopf.TemporaryError("status kept conflicting; retrying", delay=1)


def _act(ic: Mapping[str, Any], pod_deleted: bool = False) -> tuple[logic.Decision, logic.PodView | None]:
    meta = ic["metadata"]
    namespace, uid = meta["namespace"], meta["uid"]
    image = ic["spec"]["image"]
    target = logic.pod_name(meta["name"])
    pod = None if pod_deleted else logic.observe_pod(_get_pod(namespace, target), uid)
    decision = logic.decide(image, pod)

    if decision.action is logic.Action.CREATE:
        manifest = logic.build_pod(ic)
        try:
            created = common.core_v1().create_namespaced_pod(namespace, cast(Any, manifest))
        except Exception as exc:
            if _namespace_terminating(exc):
                # The namespace is being deleted (and this CR with it): nothing to keep alive.
                return logic.Decision(logic.Action.NONE, "NamespaceTerminating",
                                      f"namespace {namespace} is being deleted"), pod
            if not common.is_status(exc, 409):
                common.count_error(OPERATOR, "create-pod")
                raise
            # Already there (a concurrent pass, or a retry after a crash): decide on what exists.
            pod = logic.observe_pod(_get_pod(namespace, target), uid)
            return logic.decide(image, pod), pod
        pod = logic.observe_pod(common.api_client().sanitize_for_serialization(created), uid)
        common.count_action(OPERATOR, "create-pod")
        logger.info(f"[{namespace}/{meta['name']}] Created pod {target} running {image}")
        _event(ic, "Normal", "PodCreated", f"created pod {target} running {image}")
        return logic.decide(image, pod), pod

    if decision.action is logic.Action.DELETE and pod is not None:
        # A pod that already ended has nothing to shut down gracefully.
        grace = 0 if pod.ended else None
        try:
            # The uid precondition: never delete a pod that replaced ours meanwhile.
            options = kubernetes.client.V1DeleteOptions(
                grace_period_seconds=grace, preconditions=kubernetes.client.V1Preconditions(uid=pod.uid))
            common.core_v1().delete_namespaced_pod(target, namespace, body=options)
        except Exception as exc:
            if not common.is_status(exc, 404, 409):
                common.count_error(OPERATOR, "delete-pod")
                raise
        common.count_action(OPERATOR, "delete-pod")
        logger.info(f"[{namespace}/{meta['name']}] Deleting pod {target}: {decision.message}")
        _event(ic, "Normal", decision.reason, decision.message)
    return decision, pod


def _write_status(ic: Mapping[str, Any], pod: logic.PodView | None, decision: logic.Decision) -> bool:
    """Patch status if it changes; False on a resourceVersion conflict (caller re-reads)."""
    meta = ic["metadata"]
    old = ic.get("status") or {}
    new = logic.next_status(old, meta.get("generation"), pod, decision)
    if not logic.status_changed(old, new):
        return True
    body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": new}
    try:
        common.custom_objects().patch_namespaced_custom_object_status(
            logic.GROUP, logic.VERSION, meta["namespace"], logic.PLURAL, meta["name"], body)
    except Exception as exc:
        if common.is_status(exc, 409):
            return False
        if common.is_status(exc, 404):
            return True
        raise
    if new["startTimes"] != old.get("startTimes"):
        logger.info(f"[{meta['namespace']}/{meta['name']}] Counted start #{new['startTimes']} "
                    f"(pod uid {new.get('currentPodUID')})")
    if decision.action is logic.Action.BLOCKED and logic.ready_reason(old) != decision.reason:
        # Once per episode, not on every retry.
        common.count_error(OPERATOR, "foreign-pod")
        logger.warning(f"[{meta['namespace']}/{meta['name']}] {decision.message}")
        kopf.warn(cast(kopf.Body, ic), reason=decision.reason, message=decision.message)
    return True
