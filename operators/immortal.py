"""Immortal containers operator: keep one pod per ImmortalContainer running forever.

Thin handlers: indexes feed the controller (kopf_operators.immortal_controller), which decides with
kopf_operators.immortal (pure). Kopf keeps state only on the ImmortalContainer; pods are watched with
a server-side label selector (only ours reach the process) and store nothing.
"""

from __future__ import annotations

from typing import Any

import kopf

from kopf_operators import immortal as logic
from kopf_operators import runtime
from kopf_operators.access import ApiError
from kopf_operators.immortal_controller import OBJECTS_INDEX, PODS_INDEX, ImmortalController


@kopf.on.startup(id="immortal-startup")
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    _, access = runtime.shared(memo)
    # Only our pods are streamed (immortal is the only operator that watches pods).
    settings.watching.label_selectors["pods"] = logic.OWNER_LABEL
    memo.immortal = ImmortalController(access, kwargs[OBJECTS_INDEX], kwargs[PODS_INDEX])
    memo.immortal.start_resync()


@kopf.on.cleanup(id="immortal-cleanup")
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await memo.immortal.stop()


@kopf.index(logic.GROUP, logic.PLURAL, id=OBJECTS_INDEX)
def immortal_objects(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, name): logic.snapshot(body)} if namespace else None


@kopf.index("pods", labels={logic.OWNER_LABEL: kopf.PRESENT}, id=PODS_INDEX)
def immortal_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, labels[logic.OWNER_LABEL]): logic.pod_summary(body)}


@kopf.on.create(logic.GROUP, logic.PLURAL, id="immortal-create", backoff=2)
@kopf.on.update(logic.GROUP, logic.PLURAL, field="spec", id="immortal-update", backoff=2)
@kopf.on.resume(logic.GROUP, logic.PLURAL, id="immortal-resume", backoff=2)
async def converge(namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if not namespace:
        return
    try:
        await memo.immortal.converge((namespace, name), logic.snapshot(body))
    except ApiError as exc:  # retried by Kopf after the delay, never hot
        raise exc.for_kopf("converging failed", delay=5) from None


@kopf.on.event("pods", labels={logic.OWNER_LABEL: kopf.PRESENT}, id="immortal-pod-event")
async def pod_event(type: str | None, namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                    memo: kopf.Memo, **_: Any) -> None:
    if namespace:  # type None: the initial listing after a (re)connect; level-triggered and cheap
        event_type = type or "LISTED"
        key = (namespace, str(labels[logic.OWNER_LABEL]))
        await memo.immortal.guarded(key, f"pod {event_type.lower()}", pod_event=(event_type, logic.pod_summary(body)))
