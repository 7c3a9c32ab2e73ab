"""Immortal containers operator: keep one pod per ImmortalContainer running forever.

Thin handlers: indexes feed the controller (kopf_operators.immortal.controller), which decides with
kopf_operators.immortal.decisions (pure). Kopf keeps state only on the ImmortalContainer; pods are watched with
a server-side label selector (only ours reach the process) and store nothing.
"""

from __future__ import annotations

from typing import Any

import kopf

from kopf_operators.core import process
from kopf_operators.immortal import decisions
from kopf_operators.immortal.controller import CONTROLLER, OBJECTS_INDEX, PODS_INDEX, ImmortalController, Key, Snapshot


@kopf.on.startup(id="immortal-startup")
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    _, access = process.shared(memo)
    # Only our pods are streamed (immortal is the only operator that watches pods).
    settings.watching.label_selectors["pods"] = decisions.OWNER_LABEL
    # A pod's binding to a node (and any status that changes nothing we read) runs no pass.
    process.skip_unchanged(memo, "", "pods", decisions.pod_fingerprint)
    controller = CONTROLLER.set(memo, ImmortalController(access, kwargs[OBJECTS_INDEX], kwargs[PODS_INDEX]))
    controller.start_resync()


@kopf.on.cleanup(id="immortal-cleanup")
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await CONTROLLER(memo).stop()


@kopf.index(decisions.GROUP, decisions.PLURAL, id=OBJECTS_INDEX)
async def immortal_objects(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, Snapshot] | None:
    return {(namespace, name): decisions.snapshot(body)} if namespace else None


@kopf.index("pods", labels={decisions.OWNER_LABEL: kopf.PRESENT}, id=PODS_INDEX)
async def immortal_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                       **_: Any) -> dict[Key, Snapshot] | None:
    return {(namespace, labels[decisions.OWNER_LABEL]): decisions.pod_summary(body)} if namespace else None


# Events only: Kopf's create/update/resume handlers would keep the last handled spec in an
# annotation on the object, and annotations cannot exceed 256 KiB (a template of that size then
# failed every pass with 422). Every event (the initial listing included) runs the same
# level-triggered pass; a failed pass is retried by the controller with backoff.
@kopf.on.event(decisions.GROUP, decisions.PLURAL, id="immortal-event")
async def object_event(type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo,
                       **_: Any) -> None:
    if not namespace:
        return
    key = (namespace, name)
    if type == "DELETED":
        await CONTROLLER(memo).deleted(key)
        return
    await CONTROLLER(memo).guarded(key, "object", body=decisions.snapshot(body))


@kopf.on.event("pods", labels={decisions.OWNER_LABEL: kopf.PRESENT}, id="immortal-pod-event")
async def pod_event(type: str | None, namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                    memo: kopf.Memo, **_: Any) -> None:
    if namespace:  # type None: the initial listing after a (re)connect; level-triggered and cheap
        event_type = type or "LISTED"
        key = (namespace, str(labels[decisions.OWNER_LABEL]))
        pod = decisions.pod_summary(body)
        await CONTROLLER(memo).guarded(key, f"pod {event_type.lower()}", pod_event=(event_type, pod))
