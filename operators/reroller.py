"""Re-roller: re-roll Deployments/StatefulSets/DaemonSets when the ConfigMaps/Secrets they use change.

Only ``@kopf.index`` and ``@kopf.on.event`` on built-in objects: Kopf stores nothing on them. The
indexes hold hashes of source data and the source -> workload reverse lookup; Kopf fills them from
the initial listing before any event handler runs, so the first sighting after a start already
compares against the real data (changes made while the operator was down roll exactly once).
"""

from __future__ import annotations

from typing import Any

import kopf

from kopf_operators import common  # noqa: F401  (registers the shared settings)
from kopf_operators import reroller as logic
from kopf_operators.reroller_api import runtime

# --- in-memory indexes: hashes and names only, never data ------------------------------------------


@kopf.index("configmaps", id="reroller_configmaps")
def configmap_hashes(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, str]:
    return {("ConfigMap", namespace or "", name): logic.source_hash("ConfigMap", body)}


@kopf.index("secrets", id="reroller_secrets")
def secret_hashes(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, str]:
    return {("Secret", namespace or "", name): logic.source_hash("Secret", body)}


def _index_workload(kind: str) -> Any:
    def index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return logic.workload_index_entries((kind, namespace or "", name), body)
    return index


kopf.index("apps", "v1", "deployments", id="reroller_deployments")(_index_workload("Deployment"))
kopf.index("apps", "v1", "statefulsets", id="reroller_statefulsets")(_index_workload("StatefulSet"))
kopf.index("apps", "v1", "daemonsets", id="reroller_daemonsets")(_index_workload("DaemonSet"))


# --- events: cheap in-memory checks; the per-workload task does the (debounced) work ---------------


@kopf.on.event("configmaps", id="reroller-configmap-event")
@kopf.on.event("secrets", id="reroller-secret-event")
async def source_event(resource: kopf.Resource, namespace: str | None, name: str, **kwargs: Any) -> None:
    runtime.bind(kwargs)
    kind = "ConfigMap" if resource.plural == "configmaps" else "Secret"
    for key in runtime.workloads_of(kind, namespace or "", name):
        runtime.check(key, runtime.state_of(key))


def _on_workload(kind: str) -> Any:
    async def handler(type: str, namespace: str | None, name: str, body: kopf.Body, **kwargs: Any) -> None:
        runtime.bind(kwargs)
        if type == "DELETED":
            return
        runtime.check((kind, namespace or "", name), logic.workload_state(body))
    return handler


kopf.on.event("apps", "v1", "deployments", id="reroller-deployment-event")(_on_workload("Deployment"))
kopf.on.event("apps", "v1", "statefulsets", id="reroller-statefulset-event")(_on_workload("StatefulSet"))
kopf.on.event("apps", "v1", "daemonsets", id="reroller-daemonset-event")(_on_workload("DaemonSet"))


@kopf.on.cleanup(id="reroller-cleanup")
async def cleanup(**_: Any) -> None:
    await runtime.shutdown()
