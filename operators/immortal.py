"""Immortal containers operator: keep one pod per ImmortalContainer running forever.

Handlers are thin: every trigger runs the same level-triggered pass (kopf_operators.immortal_api).
Kopf keeps state only on the ImmortalContainer; pods are only watched (``on.event``, stores nothing).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf

from kopf_operators import common  # also registers the shared settings
from kopf_operators import immortal as logic
from kopf_operators import immortal_api as api


# The CR's own handlers run passes until the pod matches the spec, so creation, image changes and
# operator restarts (resume) converge even when a pod event is missed. Async, so that waiting for an
# old pod to terminate holds no worker thread; the sync API calls run via asyncio.to_thread.
@kopf.on.create(logic.GROUP, logic.PLURAL, id="immortal-create", retries=None, backoff=2)
@kopf.on.update(logic.GROUP, logic.PLURAL, field="spec", id="immortal-update", retries=None, backoff=2)
@kopf.on.resume(logic.GROUP, logic.PLURAL, id="immortal-resume", retries=None, backoff=2)
async def converge_ic(namespace: str | None, name: str, **_: Any) -> None:
    if not namespace:
        return
    deadline = time.monotonic() + logic.CONVERGE_WAIT_SECONDS
    while True:
        try:
            decision = await asyncio.to_thread(api.reconcile, namespace, name)
        except common.API_ERRORS as exc:  # the API server is unreachable or failing: retry, no traceback
            raise kopf.TemporaryError(f"API call failed: {type(exc).__name__}", delay=2) from None
        # A foreign pod is reported (status, Warning Event) and left alone; its deletion is a pod
        # event that resumes the work, so there is nothing to retry here.
        if decision is None or decision.action in (logic.Action.NONE, logic.Action.BLOCKED):
            return
        if time.monotonic() > deadline:
            # Unusual (e.g. a pod stuck terminating): Kopf retries and reports it.
            raise kopf.TemporaryError(decision.message, delay=logic.RETRY_DELAY_SECONDS)
        await asyncio.sleep(logic.POLL_SECONDS)


def _is_ours(labels: kopf.Labels, **_: Any) -> bool:
    return logic.OWNER_LABEL in labels


def _has_target_name(name: str, labels: kopf.Labels, **_: Any) -> bool:
    # Foreign pods with a target name carry no label of ours; their deletion unblocks a waiting CR.
    return logic.OWNER_LABEL not in labels and logic.ic_name_for_pod(name) is not None


def _on_pod(namespace: str, ic_name: str, pod_deleted: bool) -> None:
    # Event handlers are not retried: retry transient failures briefly here; the CR's handlers
    # and the next restart (resume) converge anything still missed.
    for attempt in range(1, 4):
        try:
            api.reconcile(namespace, ic_name, pod_deleted=pod_deleted and attempt == 1)
            return
        except Exception as exc:  # logged, never raised into Kopf's event loop
            common.count_error(api.OPERATOR, "pod-event")
            api.logger.warning(f"[{namespace}/{ic_name}] reconcile after a pod event failed "
                               f"(attempt {attempt}/3): {exc}")
            time.sleep(0.5 * attempt)


@kopf.on.event("pods", labels={logic.OWNER_LABEL: kopf.PRESENT}, id="immortal-pod-event")
def pod_event(type: str | None, namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    if namespace:
        _on_pod(namespace, str(labels[logic.OWNER_LABEL]), pod_deleted=type == "DELETED")


@kopf.on.event("pods", when=_has_target_name, id="immortal-foreign-pod-event")
def foreign_pod_event(type: str | None, namespace: str | None, name: str, **_: Any) -> None:
    ic_name = logic.ic_name_for_pod(name)
    if namespace and ic_name:
        _on_pod(namespace, ic_name, pod_deleted=type == "DELETED")
