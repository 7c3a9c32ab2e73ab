"""Immortal containers operator: keep one pod per ImmortalContainer running forever.

Handlers are thin: every trigger runs the same level-triggered pass (kopf_operators.immortal_api).
Kopf keeps state only on the ImmortalContainer; pods are only watched (``on.event``, stores nothing).
"""

from __future__ import annotations

import time
from typing import Any

import kopf

from kopf_operators import common  # also registers the shared settings
from kopf_operators import immortal as logic
from kopf_operators import immortal_api as api


def _converge(namespace: str, name: str) -> None:
    decision = api.reconcile(namespace, name)
    if decision is None or decision.action in (logic.Action.NONE,):
        return
    if decision.action is logic.Action.BLOCKED:
        raise kopf.TemporaryError(decision.message, delay=logic.WAIT_FOREIGN_DELAY)
    # CREATE raced, DELETE issued, or WAIT: come back soon (pod events usually finish it first).
    raise kopf.TemporaryError(decision.message, delay=logic.WAIT_TERMINATING_DELAY)


# The CR's own handlers retry until the pod matches the spec: they make creation, image changes,
# operator restarts (resume) and foreign-pod waits converge even when a pod event is missed.
@kopf.on.create(logic.GROUP, logic.PLURAL, id="immortal-create", retries=None, backoff=2)
@kopf.on.update(logic.GROUP, logic.PLURAL, field="spec", id="immortal-update", retries=None, backoff=2)
@kopf.on.resume(logic.GROUP, logic.PLURAL, id="immortal-resume", retries=None, backoff=2)
def converge_ic(namespace: str | None, name: str, **_: Any) -> None:
    if namespace:
        _converge(namespace, name)


def _is_ours(labels: kopf.Labels, **_: Any) -> bool:
    return logic.OWNER_LABEL in labels


def _has_target_name(name: str, labels: kopf.Labels, **_: Any) -> bool:
    # Foreign pods with a target name carry no label of ours; their deletion unblocks a waiting CR.
    return logic.OWNER_LABEL not in labels and logic.ic_name_for_pod(name) is not None


def _on_pod(namespace: str, ic_name: str) -> None:
    # Event handlers are not retried: retry transient failures briefly here; the CR's handlers
    # and the next restart (resume) converge anything still missed.
    for attempt in range(1, 4):
        try:
            api.reconcile(namespace, ic_name)
            return
        except Exception as exc:  # logged, never raised into Kopf's event loop
            common.count_error(api.OPERATOR, "pod-event")
            api.logger.warning(f"[{namespace}/{ic_name}] reconcile after a pod event failed "
                               f"(attempt {attempt}/3): {exc}")
            time.sleep(0.5 * attempt)


@kopf.on.event("pods", labels={logic.OWNER_LABEL: kopf.PRESENT}, id="immortal-pod-event")
def pod_event(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    if namespace:
        _on_pod(namespace, str(labels[logic.OWNER_LABEL]))


@kopf.on.event("pods", when=_has_target_name, id="immortal-foreign-pod-event")
def foreign_pod_event(namespace: str | None, name: str, **_: Any) -> None:
    ic_name = logic.ic_name_for_pod(name)
    if namespace and ic_name:
        _on_pod(namespace, ic_name)
