"""Helpers shared by the Copyrator end-to-end tests (tests/e2e/test_copyrator*.py): reading and writing
ConfigMaps, rules, their status and Events, waiting for copies and conditions, and a fixture that runs
the operator with extra settings. Test modules import from here, never from each other."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

from kopf_operators.copyrator import rules
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL
from tests.kube import OperatorProcess, own_operators, wait_for

G, V, P = rules.GROUP, rules.VERSION, rules.PLURAL


def get(core: kubernetes.client.CoreV1Api, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as a plain dict, or None when absent."""
    read = core.read_namespaced_config_map if kind == "ConfigMap" else core.read_namespaced_secret
    try:
        obj = read(name, namespace)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(core.api_client.sanitize_for_serialization(obj))


def put_cm(core: kubernetes.client.CoreV1Api, namespace: str, name: str, data: dict[str, str],
           labels: dict[str, str] | None = None) -> None:
    body = {"metadata": {"name": name, "namespace": namespace,
                         "labels": {"copyrator": "true"} if labels is None else labels}, "data": data}
    try:
        core.create_namespaced_config_map(namespace, body)
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
        core.replace_namespaced_config_map(name, namespace, body)


def make_rule(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str, /, **spec: Any) -> None:
    body = {"apiVersion": f"{G}/{V}", "kind": rules.KIND,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    custom.create_namespaced_custom_object(G, V, namespace, P, body)


def status(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return dict(custom.get_namespaced_custom_object(G, V, namespace, P, name).get("status") or {})


def condition(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str, type_: str) -> dict[str, Any]:
    return next((c for c in status(custom, namespace, name).get("conditions") or [] if c["type"] == type_), {})


def rule_gone(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str) -> bool:
    try:
        custom.get_namespaced_custom_object(G, V, namespace, P, name)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def delete_rule(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str) -> None:
    """Delete a rule, wait until it is gone, then until its copies are pruned (a rule has no
    finalizer: the operator prunes its copies from the rule's DELETED event, after the rule is gone)."""
    try:
        uid = custom.get_namespaced_custom_object(G, V, namespace, P, name)["metadata"]["uid"]
        custom.delete_namespaced_custom_object(G, V, namespace, P, name)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise
        return
    wait_for(lambda: rule_gone(custom, namespace, name), timeout=60, what=f"rule {namespace}/{name} to be deleted")
    core = kubernetes.client.CoreV1Api(custom.api_client)
    wait_for(lambda: not any(copies(core, kind, f"{COPYRATOR_RULE_UID_LABEL}={uid}")
                             for kind in ("ConfigMap", "Secret")),
             timeout=60, what=f"the copies of rule {namespace}/{name} to be pruned")


def copies(core: kubernetes.client.CoreV1Api, kind: str = "ConfigMap", selector: str = "") -> dict[str, Any]:
    """Every object carrying a Copyrator marker, keyed ns/name."""
    call = core.list_config_map_for_all_namespaces if kind == "ConfigMap" else core.list_secret_for_all_namespaces
    items = call(label_selector=selector or COPYRATOR_RULE_UID_LABEL).items
    return {f"{i.metadata.namespace}/{i.metadata.name}": i for i in items}


def events(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    return list(core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items)


def own_errors(proc: OperatorProcess) -> list[str]:
    """Copyrator's errors in the shared process log (the other operators' are their tests' business)."""
    return [line for line in proc.errors() if "copyrator" in line.lower()]


def data_of(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> dict[str, str] | None:
    obj = get(core, "ConfigMap", namespace, name)
    return None if obj is None else dict(obj.get("data") or {})


def wait_data(core: kubernetes.client.CoreV1Api, namespace: str, name: str,
              expected: dict[str, str] | None = None, timeout: float = 30) -> None:
    """Wait until the ConfigMap exists (with ``expected`` data, when given)."""
    def probe() -> bool:
        data = data_of(core, namespace, name)
        return data is not None and (expected is None or data == expected)

    wait_for(probe, timeout=timeout, what=f"ConfigMap {namespace}/{name} with {expected or 'any data'}")


def wait_condition(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str, type_: str,
                   **expect: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        cond = condition(custom, namespace, name, type_)
        return cond if all(cond.get(k) == v for k, v in expect.items()) else None

    found = wait_for(probe, what=f"condition {type_} {expect} on {namespace}/{name}")
    assert found is not None
    return found


@pytest.fixture
def own_operator(operator: OperatorProcess) -> Iterator[Callable[..., OperatorProcess]]:
    """Stop the shared operator and run one with extra env; the shared one restarts afterwards."""
    yield from own_operators(operator, "copyrator-own")
