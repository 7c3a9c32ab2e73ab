"""Helpers shared by the Blackadder end-to-end tests (tests/e2e/test_blackadder*.py): the agents
registry and its fixture, a second namespace, the objects agents act on, and reads of Events, status
and ledgers. Test modules import from here, never from each other."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

from kopf_operators.blackadder import settings
from tests.kube import OperatorProcess, chart_objects, delete_namespaces, operator_namespace, wait_for
from testsupport.kubectl import kubectl

G, V, P = settings.GROUP, settings.VERSION, settings.PLURAL
PAUSE = settings.MIN_PAUSE_SECONDS
# The TenantChaosAgent tests' own release (the session's operator keeps the default RBAC) and limits;
# tests/e2e/test_zz_rbac.py checks that release's calls against its rules.
RELEASE = "kopf-operators-tenants"
LIMITS = {"enabled": "true", "maxKillsPerCycle": "2", "minPauseSeconds": "5"}
TENANT_VALUES = [f"operators.blackadder.tenants.{k}={v}" for k, v in LIMITS.items()]


class Agents:
    def __init__(self, custom: kubernetes.client.CustomObjectsApi) -> None:
        self.custom = custom
        self.names: list[str] = []

    def create(self, spec: dict[str, Any], name: str | None = None) -> str:
        name = name or f"agent-{uuid.uuid4().hex[:6]}"
        self.custom.create_cluster_custom_object(G, V, P, {
            "apiVersion": f"{G}/{V}", "kind": "ChaosAgent", "metadata": {"name": name}, "spec": spec})
        self.names.append(name)
        return name

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_cluster_custom_object(G, V, P, name))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def patch_spec(self, name: str, spec: dict[str, Any]) -> int:
        return int(self.custom.patch_cluster_custom_object(G, V, P, name, {"spec": spec})["metadata"]["generation"])

    def delete(self, name: str, timeout: float = 30) -> None:
        try:
            self.custom.delete_cluster_custom_object(G, V, P, name)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
        wait_for(lambda: gone(lambda: self.get(name)), timeout=timeout, what=f"agent {name} to be deleted")


def gone(read: Callable[[], Any]) -> bool:
    try:
        read()
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def agents_of(custom: kubernetes.client.CustomObjectsApi,
              before_cleanup: Callable[[], object] = lambda: None) -> Iterator[Agents]:
    """The body of an ``agents`` fixture (``yield from``): the test's agents, each deleted after it and
    awaited gone; ``before_cleanup`` runs first (say, starting the operator their finalizer needs)."""
    registry = Agents(custom)
    yield registry
    before_cleanup()
    for name in registry.names:
        registry.delete(name)


@pytest.fixture
def agents(operator: OperatorProcess, custom: kubernetes.client.CustomObjectsApi) -> Iterator[Agents]:
    yield from agents_of(custom, operator.start)  # the finalizer needs a running operator


@pytest.fixture
def other_namespace(namespace: str, core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    name = f"{namespace}-x"
    core.create_namespace({"metadata": {"name": name, "labels": {"kopf-operators.dev/test": "true"}}})
    yield name
    delete_namespaces(core, [name])


def make_pod(core: kubernetes.client.CoreV1Api, ns: str, name: str) -> None:
    core.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": {"app": "chaos-test"}},
                                    "spec": {"containers": [{"name": "c", "image": "test"}]}})


def make_pods(core: kubernetes.client.CoreV1Api, ns: str, prefix: str, count: int) -> None:
    """Bare pods ``<prefix>-0`` .. ``<prefix>-<count - 1>``."""
    for i in range(count):
        make_pod(core, ns, f"{prefix}-{i}")


def make_deployment(apps: kubernetes.client.AppsV1Api, ns: str, name: str, replicas: int) -> None:
    labels = {"app": name}
    apps.create_namespaced_deployment(ns, {
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "test"}]}}}})


def make_cm(core: kubernetes.client.CoreV1Api, ns: str, name: str, data: dict[str, str] | None,
            immutable: bool = False) -> str:
    body: dict[str, Any] = {"metadata": {"name": name}}
    if data is not None:
        body["data"] = data
    if immutable:
        body["immutable"] = True
    return str(core.create_namespaced_config_map(ns, body).metadata.resource_version)


def live_pods(core: kubernetes.client.CoreV1Api, ns: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(ns).items
            if p.metadata.deletion_timestamp is None}


def cm_rv(core: kubernetes.client.CoreV1Api, ns: str, name: str) -> str:
    return str(core.read_namespaced_config_map(name, ns).metadata.resource_version)


def replicas(apps: kubernetes.client.AppsV1Api, ns: str, name: str) -> int:
    return int(apps.read_namespaced_deployment(name, ns).spec.replicas)


def events(core: kubernetes.client.CoreV1Api, reason: str, namespace: str | None = None,
           agent: str | None = None) -> list[Any]:
    selector = f"reason={reason}" + (f",involvedObject.name={agent}" if agent else "")
    items = (core.list_namespaced_event(namespace, field_selector=selector) if namespace
             else core.list_event_for_all_namespaces(field_selector=selector)).items
    return list(items)


def ledger_location(agent: str) -> tuple[str, str]:
    """Where the operator keeps the agent's ledger (status.ledger: namespace/name)."""
    agents = Agents(kubernetes.client.CustomObjectsApi())
    try:
        where = str(wait_for(lambda: agents.status(agent).get("ledger"), timeout=5, what="status.ledger"))
    except AssertionError:  # no cycle reported yet (e.g. the operator was killed mid-cycle)
        where = f"{settings.ledger_namespace(operator_namespace())}/{settings.ledger_name(agent)}"
    namespace, name = where.split("/")
    return namespace, name


def ledger(core: kubernetes.client.CoreV1Api, agent: str) -> dict[str, Any]:
    namespace, name = ledger_location(agent)
    secret = core.read_namespaced_secret(name, namespace)
    return dict(json.loads(base64.b64decode(secret.data[settings.LEDGER_KEY])))


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def next_cycles(agents: Agents, name: str, count: int = 1) -> None:
    """Wait until ``count`` more cycles have run (and reported) from now."""
    seen = int(agents.status(name).get("cycle") or 0)
    wait_for(lambda: int(agents.status(name).get("cycle") or 0) >= seen + count, timeout=(PAUSE + 5) * count + 10,
             what=f"{count} more cycle(s)")


# Greedy but confined: every candidate is acted on in each cycle.
GREEDY = {"eagerness": 100, "pauseDuration": PAUSE, "maxKillsPerCycle": "100%", "allowSingleReplica": True}


def assert_field_rejected(name: str, field: str, needle: str) -> None:
    """A harmless ChaosAgent with one more spec ``field`` (a YAML line) is refused, saying ``needle``."""
    result = kubectl("apply", "-f", "-", check=False, input=f"""
apiVersion: blackadder.io/v1beta1
kind: ChaosAgent
metadata: {{name: {name}}}
spec:
  eagerness: 0
  paused: true
  dryRun: true
  targetNamespaces: [nowhere]
  {field}
""")
    assert result.returncode != 0 and needle in result.stderr, result.stderr


def render(*values: str) -> list[dict[str, Any]]:
    """The chart's objects (release kopf-operators) with ``values`` set."""
    return chart_objects("kopf-operators", "kopf-operators", *values)
