"""Re-roller: re-roll workloads when the ConfigMaps/Secrets they use change.

Thin handlers: indexes feed the controller (kopf_operators.reroller.controller), which decides with
kopf_operators.reroller.decisions (pure). Only ``@kopf.index`` and ``@kopf.on.event`` on built-in objects: Kopf
stores nothing on them. Kopf fills the indexes from the initial listing before any event handler
runs, so the first look after a start compares stored baselines with the real data (changes made
while the operator was down roll exactly once).
"""

from __future__ import annotations

import os
from typing import Any

import kopf

from kopf_operators.core import process
from kopf_operators.core.conventions import env_bool
from kopf_operators.reroller import settings, views
from kopf_operators.reroller.alerts import AlertSettings
from kopf_operators.reroller.controller import (
    CONTROLLER,
    INDEXES,
    NAMESPACES_INDEX,
    SOURCE_INDEXES,
    TERMINATING_INDEX,
    WORKLOAD_INDEXES,
    RerollerController,
)


@kopf.on.startup(id="reroller-startup")
async def start(memo: kopf.Memo, **kwargs: Any) -> None:
    config, access = process.shared(memo)
    options = settings.Options.from_env(os.environ)  # fails fast on a malformed option
    alerts = AlertSettings.from_env(os.environ)
    indexes = {index_id: kwargs[index_id] for index_id in INDEXES if index_id in kwargs}
    controller = CONTROLLER.set(memo, RerollerController(access, options, indexes, alerts,
                                                                config.operator_namespace))
    controller.start_resync()


@kopf.on.cleanup(id="reroller-cleanup")
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await CONTROLLER(memo).stop()


# --- indexes: hashes, names and flags, never data -------------------------------------------------


def _source_index(kind: str) -> Any:
    async def index(namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> Any:
        return {(kind, namespace or "", name): views.source_view(kind, body, CONTROLLER(memo).resource_selector)}
    return index


kopf.index("configmaps", id=SOURCE_INDEXES["ConfigMap"])(_source_index("ConfigMap"))
kopf.index("secrets", id=SOURCE_INDEXES["Secret"])(_source_index("Secret"))


def _workload_index(kind: str) -> Any:
    async def index(body: kopf.Body, memo: kopf.Memo, **_: Any) -> Any:
        return views.workload_index_entries(views.workload_view(kind, body, CONTROLLER(memo).options))
    return index


_WORKLOADS = {"Deployment": ("apps", "v1", "deployments"), "StatefulSet": ("apps", "v1", "statefulsets"),
              "DaemonSet": ("apps", "v1", "daemonsets"), "CronJob": ("batch", "v1", "cronjobs"),
              "Job": ("batch", "v1", "jobs")}
# Argo Rollouts only when enabled (the chart grants RBAC on them only then): handlers are registered
# at import, so this one option is read here, before Kopf starts, by the same parser as the others.
ARGO_ROLLOUTS = env_bool(os.environ, "REROLLER_ARGO_ROLLOUTS")
if ARGO_ROLLOUTS:
    _WORKLOADS["Rollout"] = ("argoproj.io", "v1alpha1", "rollouts")
for _kind, (_group, _version, _plural) in _WORKLOADS.items():
    kopf.index(_group, _version, _plural, id=WORKLOAD_INDEXES[_kind])(_workload_index(_kind))


@kopf.index("namespaces", id=NAMESPACES_INDEX)
async def namespace_labels(name: str, labels: kopf.Labels, **_: Any) -> Any:
    return {name: dict(labels)}


@kopf.index("namespaces", id=TERMINATING_INDEX)
async def terminating_namespaces(name: str, meta: kopf.Meta, **_: Any) -> Any:
    return {name: True} if meta.get("deletionTimestamp") else None


@kopf.on.event("namespaces", id="reroller-namespace-deleted", when=lambda type, **_: type == "DELETED")
async def namespace_deleted(name: str, memo: kopf.Memo, **_: Any) -> None:
    CONTROLLER(memo).namespace_deleted(name)


# --- events: the controller decides from the indexes and the event's body --------------------------


@kopf.on.event("configmaps", id="reroller-configmap-event")
@kopf.on.event("secrets", id="reroller-secret-event")
async def source_event(resource: kopf.Resource, type: str | None, namespace: str | None, name: str,
                       body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    kind = "ConfigMap" if resource.plural == "configmaps" else "Secret"
    await CONTROLLER(memo).source_event(kind, namespace or "", name)
    await CONTROLLER(memo).history.source_event(kind, type, body)


def _workload_event(kind: str) -> Any:
    async def handler(type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo,
                      **_: Any) -> None:
        await CONTROLLER(memo).workload_event((kind, namespace or "", name), type, body)
    return handler


for _kind, (_group, _version, _plural) in _WORKLOADS.items():
    kopf.on.event(_group, _version, _plural, id=f"reroller-{_plural[:-1]}-event")(_workload_event(_kind))
