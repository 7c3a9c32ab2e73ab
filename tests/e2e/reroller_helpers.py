"""Helpers shared by the re-roller end-to-end tests (tests/e2e/test_reroller*.py): builders of sources
and workloads, probes of what Kubernetes did (ReplicaSets, ControllerRevisions, Events) and the
``reroller_with`` fixture (the re-roller alone, with options). Test modules import from here, never
from each other."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kopf_operators.reroller import settings
from tests.kube import OperatorProcess, own_operators, stays, wait_for

AUTO = {settings.AUTO: "true"}
NGINX_CONF = "events {}\nhttp { server { listen 80; location / { return 200 'v1'; } } }\n"

# --- builders -----------------------------------------------------------------------------------


def configmap(core: Any, ns: str, name: str, data: dict[str, str]) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": data})


def set_cm(core: Any, ns: str, name: str, data: dict[str, str]) -> None:
    core.patch_namespaced_config_map(name, ns, {"data": data})


def secret(core: Any, ns: str, name: str, data: dict[str, str]) -> None:
    core.create_namespaced_secret(ns, {"metadata": {"name": name}, "stringData": data})


def pod_template(pod_spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec = pod_spec or {}
    spec.setdefault("containers", [{"name": "nginx", "image": "nginx:1.27"}])
    return {"metadata": {"labels": labels or {"app": "nginx"}, "annotations": annotations or {}}, "spec": spec}


def nginx_pod_spec(cm: str = "nginx-conf") -> dict[str, Any]:
    """The article's scenario: nginx.conf mounted from a ConfigMap."""
    return {
        "containers": [{"name": "nginx", "image": "nginx:1.27", "volumeMounts": [
            {"name": "nginx-conf", "mountPath": "/etc/nginx/nginx.conf", "subPath": "nginx.conf"}]}],
        "volumes": [{"name": "nginx-conf", "configMap": {"name": cm}}],
    }


def deployment(apps: Any, ns: str, name: str, pod_spec: dict[str, Any], annotations: dict[str, str],
               replicas: int = 1) -> None:
    labels = {"app": name}
    apps.create_namespaced_deployment(ns, {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": pod_template(pod_spec, labels)},
    })


# --- probes -------------------------------------------------------------------------------------


def read(apps: Any, kind: str, ns: str, name: str) -> Any:
    return {"Deployment": apps.read_namespaced_deployment, "StatefulSet": apps.read_namespaced_stateful_set,
            "DaemonSet": apps.read_namespaced_daemon_set}[kind](name, ns)


def template_hash(apps: Any, ns: str, name: str, kind: str = "Deployment", key: str = settings.CONFIG_HASH
                  ) -> str | None:
    annotations = read(apps, kind, ns, name).spec.template.metadata.annotations or {}
    return annotations.get(key)


def reloaded_from(apps: Any, ns: str, name: str, kind: str = "Deployment") -> str | None:
    return template_hash(apps, ns, name, kind, settings.LAST_RELOADED_FROM)


def observed_hash(apps: Any, ns: str, name: str, kind: str = "Deployment") -> str | None:
    return (read(apps, kind, ns, name).metadata.annotations or {}).get(settings.OBSERVED_HASH)


def replicasets(apps: Any, ns: str, name: str) -> int:
    return sum(1 for rs in apps.list_namespaced_replica_set(ns).items
               if any(o.name == name for o in rs.metadata.owner_references or ()))


def revisions(apps: Any, ns: str, name: str) -> int:
    """ControllerRevisions of a StatefulSet/DaemonSet: one per distinct pod template."""
    return sum(1 for rev in apps.list_namespaced_controller_revision(ns).items
               if any(o.name == name for o in rev.metadata.owner_references or ()))


def events(core: Any, ns: str, name: str, reason: str) -> list[Any]:
    return list(core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},reason={reason}").items)


def no_kopf_state(obj: Any) -> bool:
    annotations = obj.metadata.annotations or {}
    return (not any("kopf.zalando.org" in key for key in annotations)
            and not any("kopf" in f for f in obj.metadata.finalizers or ()))


def baseline(apps: Any, ns: str, name: str, kind: str = "Deployment") -> str:
    return str(wait_for(lambda: observed_hash(apps, ns, name, kind), timeout=30, what=f"{name}'s baseline"))


def assert_not_rolled(apps: Any, ns: str, name: str, seconds: float = 4) -> None:
    stays(lambda: template_hash(apps, ns, name) is None and replicasets(apps, ns, name) == 1,
          seconds, what=f"{name} not rolled")


def assert_rolled_once(apps: Any, core: Any, ns: str, name: str, source: str, rs: int = 2,
                       key: str = settings.CONFIG_HASH) -> str:
    new = wait_for(lambda: template_hash(apps, ns, name, key=key), timeout=30, what=f"{name} re-rolled")
    wait_for(lambda: replicasets(apps, ns, name) == rs, timeout=30, what=f"{rs} ReplicaSets of {name}")
    wait_for(lambda: any(source in (e.message or "") for e in events(core, ns, name, "Rerolled")),
             timeout=15, what="a Rerolled event naming the source")
    stays(lambda: replicasets(apps, ns, name) == rs and template_hash(apps, ns, name, key=key) == new, 4,
          what=f"exactly one rollout of {name}")
    return str(new)


# --- the re-roller alone, with options -------------------------------------------------------------


@pytest.fixture
def reroller_with(operator: OperatorProcess) -> Iterator[Callable[..., OperatorProcess]]:
    """The re-roller alone with options of the test's choosing (the session's operator is stopped
    meanwhile, so that only one re-roller acts; it runs again afterwards)."""
    yield from own_operators(operator, "reroller-own", files=["operators/reroller.py"])


def container_env(apps: Any, ns: str, name: str, container: str, kind: str = "Deployment") -> dict[str, str]:
    for c in read(apps, kind, ns, name).spec.template.spec.containers:
        if c.name == container:
            return {e.name: e.value for e in c.env or ()}
    return {}


def stakater(apps: Any, ns: str, name: str, container: str, kind: str = "Deployment") -> dict[str, str]:
    return {k: v for k, v in container_env(apps, ns, name, container, kind).items() if k.startswith("STAKATER_")}
