# ruff: noqa: F401, F811  (the fixture imported from copyrator_helpers is a parameter here)
"""Copyrator under adversarial conditions (issue #20), on the real local API server.

Names and sizes at the API's limits (253-character names, ConfigMaps and Secrets of about 1 MiB),
objects owned by someone else where a copy would go, edits in the middle of a pass, the operator
stopped at each step, the same change applied twice. Every rule targets only the test's own
namespaces, and every test deletes its rules and waits for the prune.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable

import kubernetes
import pytest

from kopf_operators.copyrator import rules
from kopf_operators.core import conventions
from kopf_operators.core.conventions import COPY_SOURCE, COPYRATOR_RULE_UID_LABEL
from tests.e2e.copyrator_helpers import (
    G,
    P,
    V,
    copies,
    data_of,
    delete_rule,
    events,
    get,
    make_rule,
    own_operator,  # a fixture
    put_cm,
    rule_gone,
    wait_condition,
    wait_data,
)
from tests.kube import OperatorProcess, stays, wait_for

LONG = 253  # the longest object name the API server accepts (a DNS subdomain)
# ConfigMap and Secret data may total 1 MiB (keys and values); leave room for the key names.
NEAR_ONE_MIB = 1024 * 1024 - 64


def own_errors_about(proc: OperatorProcess, namespace: str) -> list[str]:
    """Copyrator's errors about this test's rules (the whole suite shares one operator log)."""
    return [line for line in proc.errors(about=namespace) if "copyrator" in line.lower()]


def long_name(prefix: str) -> str:
    head = f"{prefix}-{uuid.uuid4().hex[:6]}-"
    return head + "x" * (LONG - len(head))


def versions(core: kubernetes.client.CoreV1Api, rule_uid: str) -> dict[str, str]:
    return {k: o.metadata.resource_version
            for k, o in copies(core, selector=f"{COPYRATOR_RULE_UID_LABEL}={rule_uid}").items()}


def rule_uid(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str) -> str:
    return str(custom.get_namespaced_custom_object(G, V, namespace, P, name)["metadata"]["uid"])


# --- names at the API's limits ----------------------------------------------------------------------


def test_253_character_rule_and_source_names_work(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    """The rule's name is never a label value (copies carry its uid) and the source's name only the
    copy's own name and annotations: every name the API server accepts works."""
    target = make_namespace()
    rule, source = long_name("rule"), long_name("cm")
    put_cm(core, namespace, source, {"k": "v"})
    make_rule(custom, namespace, rule, ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=[target])
    try:
        wait_data(core, target, source, {"k": "v"})
        copy = get(core, "ConfigMap", target, source) or {}
        annotations = copy["metadata"]["annotations"]
        assert annotations[rules.RULE_ANNOTATION] == f"{namespace}/{rule}"
        assert annotations[COPY_SOURCE] == f"{namespace}/{source}"
        wait_condition(custom, namespace, rule, "Ready", status="True")
        wait_for(lambda: [e for e in events(core, namespace, rule) if e.reason == "Synced"], what="a Synced event")
        put_cm(core, namespace, source, {"k": "v2"})
        wait_data(core, target, source, {"k": "v2"})
        # A foreign object with a 253-character name in the way: reported by name.
        foreign = long_name("in-the-way")
        put_cm(core, target, foreign, {"owner": "someone else"}, labels={})
        put_cm(core, namespace, foreign, {"k": "v"})
        cond = wait_condition(custom, namespace, rule, "Conflict", status="True")
        assert f"{target}/{foreign}" in cond["message"]
        assert data_of(core, target, foreign) == {"owner": "someone else"}
    finally:
        delete_rule(custom, namespace, rule)  # the finalizer and the prune work with the long name
    assert get(core, "ConfigMap", target, source) is None
    assert data_of(core, target, foreign) == {"owner": "someone else"}
    assert not own_errors_about(operator, namespace)


# --- sizes at the API's limits ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
def test_objects_of_one_mib_are_copied_and_updated(
        own_operator: Callable[..., OperatorProcess], core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str], kind: str) -> None:
    """With the cap on a source's size raised to the API's limit (it is 256 KiB by default)."""
    operator = own_operator(COPYRATOR_MAX_SOURCE_BYTES=str(1024 * 1024))
    targets = [make_namespace(), make_namespace()]
    labels = {"share": "big"}

    def put(fill: str) -> None:
        value = fill * NEAR_ONE_MIB
        if kind == "ConfigMap":
            put_cm(core, namespace, "big", {"blob": value}, labels=labels)
            return
        body = {"metadata": {"name": "big", "labels": labels},
                "data": {"blob": base64.b64encode(value.encode()).decode()}}
        try:
            core.create_namespaced_secret(namespace, body)
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise
            core.replace_namespaced_secret("big", namespace, body)

    def holds(ns: str, fill: str) -> bool:
        obj = get(core, kind, ns, "big")
        if obj is None:
            return False
        blob = (obj.get("data") or {}).get("blob", "")
        if kind == "Secret":
            blob = base64.b64decode(blob).decode()
        return len(blob) == NEAR_ONE_MIB and blob[0] == fill and blob[-1] == fill

    put("a")
    make_rule(custom, namespace, "big", ruleType=kind.lower(), selector=labels, namespace=namespace,
              targetNamespaces=targets)
    try:
        wait_for(lambda: all(holds(ns, "a") for ns in targets), timeout=60, what="1 MiB copies")
        put("b")  # a 1 MiB update: one JSON patch per copy
        wait_for(lambda: all(holds(ns, "b") for ns in targets), timeout=60, what="1 MiB updates")
        wait_condition(custom, namespace, "big", "Ready", status="True")
    finally:
        delete_rule(custom, namespace, "big")
    assert all(get(core, kind, ns, "big") is None for ns in targets)
    assert not own_errors_about(operator, namespace)


def test_copied_annotations_over_the_api_limit_are_reported_not_retried_hot(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    """A source whose annotations fill the API's 256 KiB: with copyAnnotations, the copy would carry
    them plus the operator's own, which the API server refuses. The rule says so; the other source
    is still copied."""
    target = make_namespace()
    full = {"fill": "x" * (256 * 1024 - 200)}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "full", "labels": {"copyrator": "true"},
                                                               "annotations": full}, "data": {"k": "v"}})
    put_cm(core, namespace, "small", {"k": "v"})
    make_rule(custom, namespace, "ann", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=[target], copyAnnotations=True)
    try:
        wait_data(core, target, "small", {"k": "v"})
        cond = wait_condition(custom, namespace, "ann", "Ready", status="False", reason="CopyRefused")
        assert f"{target}/full" in cond["message"] and "annotations" in cond["message"], cond
        wait_for(lambda: [e for e in events(core, namespace, "ann") if e.reason == "CopyRefused"
                          and e.type == "Warning"], what="a CopyRefused Warning event")
        assert get(core, "ConfigMap", target, "full") is None
        attempts = operator.metric("kopf_operators_api_errors_total")  # each refused request counts
        stays(lambda: get(core, "ConfigMap", target, "full") is None, 5, what="no copy")
        assert operator.metric("kopf_operators_api_errors_total") <= attempts + 3, "retried hot"
    finally:
        delete_rule(custom, namespace, "ann")
    assert not own_errors_about(operator, namespace)


# --- objects owned by someone else ----------------------------------------------------------------


def test_objects_in_the_way_are_never_touched_whatever_they_carry(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    """A plain ConfigMap, one carrying another rule's marker, and one that is a source's namesake in
    the target: none is updated or deleted, not by a source edit, nor by the rule's deletion. When
    the plain one goes away, the copy takes its place."""
    target = make_namespace()
    put_cm(core, namespace, "plain", {"k": "v"})
    put_cm(core, namespace, "marked", {"k": "v"})
    put_cm(core, target, "plain", {"owner": "someone"}, labels={})
    put_cm(core, target, "marked", {"owner": "another rule"},
           labels={COPYRATOR_RULE_UID_LABEL: str(uuid.uuid4())})
    before = {name: get(core, "ConfigMap", target, name) for name in ("plain", "marked")}
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=[target])
    try:
        cond = wait_condition(custom, namespace, "r", "Conflict", status="True")
        assert f"{target}/plain" in cond["message"] and f"{target}/marked" in cond["message"]
        put_cm(core, namespace, "plain", {"k": "v2"})
        put_cm(core, namespace, "marked", {"k": "v2"})
        stays(lambda: all(get(core, "ConfigMap", target, n) == before[n] for n in before), 3,
              what="the objects in the way untouched")
        core.delete_namespaced_config_map("plain", target)
        wait_data(core, target, "plain", {"k": "v2"})  # the place is free: the copy goes there
    finally:
        delete_rule(custom, namespace, "r")
    assert get(core, "ConfigMap", target, "marked") == before["marked"], "pruning spares another rule's object"
    assert get(core, "ConfigMap", target, "plain") is None
    assert not own_errors_about(operator, namespace)


# --- edits in the middle of a pass ------------------------------------------------------------------


def test_a_burst_of_edits_ends_with_the_last_content(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    targets = [make_namespace() for _ in range(3)]
    put_cm(core, namespace, "hot", {"v": "0"})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=targets)
    try:
        for ns in targets:
            wait_data(core, ns, "hot", {"v": "0"})
        for i in range(1, 21):  # 20 edits without waiting
            put_cm(core, namespace, "hot", {"v": str(i)})
        # Deleted and re-created under the same name mid-propagation: copies follow the new object.
        core.delete_namespaced_config_map("hot", namespace)
        put_cm(core, namespace, "hot", {"v": "reborn"})
        # The rule's targets narrowed meanwhile.
        custom.patch_namespaced_custom_object(G, V, namespace, P, "r", {"spec": {"targetNamespaces": targets[:2]}})
        for ns in targets[:2]:
            wait_data(core, ns, "hot", {"v": "reborn"})
        wait_for(lambda: get(core, "ConfigMap", targets[2], "hot") is None, what="the prune from the dropped target")
        new_uid = (get(core, "ConfigMap", namespace, "hot") or {})["metadata"]["uid"]
        for ns in targets[:2]:
            annotations = (get(core, "ConfigMap", ns, "hot") or {})["metadata"]["annotations"]
            assert annotations[rules.SOURCE_UID_ANNOTATION] == new_uid
        wait_condition(custom, namespace, "r", "Ready", status="True")
    finally:
        delete_rule(custom, namespace, "r")
    assert not own_errors_about(operator, namespace)


# --- the operator stopped at each step --------------------------------------------------------------


@pytest.mark.parametrize("step", ["rule-deleted", "source-deleted", "targets-narrowed", "copy-replaced-by-hand"])
def test_operator_stopped_while_things_change_converges_on_start(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str], step: str) -> None:
    a, b = make_namespace(), make_namespace()
    put_cm(core, namespace, "s", {"k": "v"})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=[a, b])
    try:
        for ns in (a, b):
            wait_data(core, ns, "s", {"k": "v"})
        operator.stop()
        if step == "rule-deleted":  # no finalizer: the rule goes at once, its copies stay until the operator is back
            custom.delete_namespaced_custom_object(G, V, namespace, P, "r")
            wait_for(lambda: rule_gone(custom, namespace, "r"), timeout=30, what="the rule gone")
            assert data_of(core, a, "s") == {"k": "v"} and data_of(core, b, "s") == {"k": "v"}
        elif step == "source-deleted":
            core.delete_namespaced_config_map("s", namespace)
        elif step == "targets-narrowed":
            custom.patch_namespaced_custom_object(G, V, namespace, P, "r", {"spec": {"targetNamespaces": [a]}})
        else:  # someone deletes our copy and puts their own object there
            core.delete_namespaced_config_map("s", b)
            put_cm(core, b, "s", {"owner": "someone"}, labels={})
        operator.start()
        if step in ("rule-deleted", "source-deleted"):
            wait_for(lambda: get(core, "ConfigMap", a, "s") is None and get(core, "ConfigMap", b, "s") is None,
                     timeout=30, what="every copy pruned")
        elif step == "targets-narrowed":
            wait_for(lambda: get(core, "ConfigMap", b, "s") is None, timeout=30, what="the prune from b")
            assert data_of(core, a, "s") == {"k": "v"}
        else:
            cond = wait_condition(custom, namespace, "r", "Conflict", status="True")
            assert f"{b}/s" in cond["message"]
            assert data_of(core, b, "s") == {"owner": "someone"}
    finally:
        delete_rule(custom, namespace, "r")
    if step == "copy-replaced-by-hand":
        assert data_of(core, b, "s") == {"owner": "someone"}, "never pruned: not ours"
    assert not own_errors_about(operator, namespace)


# --- the same change applied twice ------------------------------------------------------------------


def test_the_same_change_applied_twice_writes_nothing_more(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    targets = [make_namespace(), make_namespace()]
    put_cm(core, namespace, "s", {"k": "v"})
    body = {"apiVersion": f"{G}/{V}", "kind": rules.KIND, "metadata": {"name": "r", "namespace": namespace},
            "spec": {"ruleType": "configmap", "selector": {"copyrator": "true"}, "namespace": namespace,
                     "targetNamespaces": targets}}
    custom.create_namespaced_custom_object(G, V, namespace, P, body)
    try:
        for ns in targets:
            wait_data(core, ns, "s", {"k": "v"})
        wait_condition(custom, namespace, "r", "Ready", status="True")
        uid = rule_uid(custom, namespace, "r")
        before = versions(core, uid)
        put_cm(core, namespace, "s", {"k": "v"})  # the same content again
        current = custom.get_namespaced_custom_object(G, V, namespace, P, "r")
        custom.replace_namespaced_custom_object(G, V, namespace, P, "r", {**current, "spec": body["spec"]})
        core.patch_namespaced_config_map("s", namespace, {"metadata": {"annotations": {"unrelated": "1"}}})
        stays(lambda: versions(core, uid) == before, 4, what="no copy rewritten")
        # The same real change twice: one write per copy.
        put_cm(core, namespace, "s", {"k": "v2"})
        put_cm(core, namespace, "s", {"k": "v2"})
        for ns in targets:
            wait_data(core, ns, "s", {"k": "v2"})
        after = versions(core, uid)
        stays(lambda: versions(core, uid) == after, 3, what="no second write")
    finally:
        delete_rule(custom, namespace, "r")
    assert not own_errors_about(operator, namespace)
