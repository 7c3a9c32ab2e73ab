"""Copyrator's features from issue #23, end to end on the real local control plane: a copy under
another name (and renaming an existing copy), keys selected and renamed, push annotations on a source
(no rule), and two rules that would write one target name.

Every rule limits its targets to the test's own namespaces and is deleted at the end.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
import urllib3
import yaml

from kopf_operators.copyrator import rules
from kopf_operators.core.conventions import COPY_SOURCE, COPYRATOR_RULE_UID_LABEL
from tests.e2e.copyrator_helpers import (
    G,
    P,
    V,
    condition,
    data_of,
    delete_rule,
    events,
    get,
    make_rule,
    own_errors,
    put_cm,
    status,
    wait_condition,
    wait_data,
)
from tests.kube import OperatorProcess, namespace_exists, stays, wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import REPO

EXAMPLES = REPO / "manifests" / "examples"


class Recorder:
    """ConfigMap watch events in one namespace, in the order the API server sends them."""

    def __init__(self, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
        self.seen: list[tuple[str, str]] = []
        self._watch = kubernetes.watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(core, namespace), daemon=True)
        self._thread.start()

    def _run(self, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
        # The stream ends abruptly when the test's namespace is deleted: what was seen is kept.
        with contextlib.suppress(urllib3.exceptions.ProtocolError):
            for event in self._watch.stream(core.list_namespaced_config_map, namespace, timeout_seconds=120):
                self.seen.append((event["type"], event["object"].metadata.name))

    def stop(self) -> None:
        self._watch.stop()


@pytest.fixture
def recorder(core: kubernetes.client.CoreV1Api) -> Iterator[Callable[[str], Recorder]]:
    made: list[Recorder] = []

    def start(namespace: str) -> Recorder:
        made.append(Recorder(core, namespace))
        return made[-1]

    yield start
    for rec in made:
        rec.stop()


def patch_rule(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str, spec: dict[str, Any]) -> None:
    custom.patch_namespaced_custom_object(G, V, namespace, P, name, {"spec": spec})


# --- 1. a copy under another name ----------------------------------------------------------------


def test_a_copy_under_another_name_and_renaming_it(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str], recorder: Callable[[str], Recorder]) -> None:
    target = make_namespace()
    put_cm(core, namespace, "settings", {"k": "v"})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=[target], target={"namePrefix": "shared-"})
    try:
        wait_data(core, target, "shared-settings", {"k": "v"})
        assert get(core, "ConfigMap", target, "settings") is None
        copy = get(core, "ConfigMap", target, "shared-settings") or {}
        assert copy["metadata"]["annotations"][COPY_SOURCE] == f"{namespace}/settings"
        wait_condition(custom, namespace, "r", "Ready", status="True")

        # The rule is edited to another name: the new copy exists, in sync, before the old one goes.
        rec = recorder(target)
        # The watch lists what exists first (ADDED): once it shows the old copy, it sees what follows.
        wait_for(lambda: ("ADDED", "shared-settings") in rec.seen, timeout=10, what="the watch to start")
        patch_rule(custom, namespace, "r", {"target": {"namePrefix": None, "nameSuffix": "-copy"}})
        wait_for(lambda: get(core, "ConfigMap", target, "shared-settings") is None, timeout=30,
                 what="the old copy to go")
        wait_data(core, target, "settings-copy", {"k": "v"})
        wait_for(lambda: ("DELETED", "shared-settings") in rec.seen, timeout=10, what="the watch to see the delete")
        order = [event for event in rec.seen if event[1] in ("settings-copy", "shared-settings")
                 and event[0] in ("ADDED", "DELETED")]
        assert order.index(("ADDED", "settings-copy")) < order.index(("DELETED", "shared-settings")), order

        # The new name is taken by somebody else's object: the old copy stays, the object is untouched,
        # the rule says what is in the way.
        put_cm(core, target, "settings-v3", {"owner": "someone"}, labels={})
        before = get(core, "ConfigMap", target, "settings-v3") or {}
        patch_rule(custom, namespace, "r", {"target": {"nameSuffix": "-v3"}})
        stalled = wait_condition(custom, namespace, "r", "Stalled", status="True", reason="ForeignObject")
        assert f"{target}/settings-v3" in stalled["message"]
        stays(lambda: data_of(core, target, "settings-copy") == {"k": "v"}, 3, what="the old copy kept")
        assert (get(core, "ConfigMap", target, "settings-v3") or {}) == before
        # The way is cleared: the copy takes the new name, and only then the old one goes.
        core.delete_namespaced_config_map("settings-v3", target)
        wait_for(lambda: (get(core, "ConfigMap", target, "settings-v3") or {}).get("metadata", {})
                 .get("labels", {}).get(COPYRATOR_RULE_UID_LABEL), timeout=30, what="the copy under the new name")
        wait_for(lambda: get(core, "ConfigMap", target, "settings-copy") is None, timeout=30,
                 what="the replaced copy to go")
        wait_condition(custom, namespace, "r", "Ready", status="True")
    finally:
        delete_rule(custom, namespace, "r")
    wait_for(lambda: get(core, "ConfigMap", target, "settings-v3") is None, timeout=30, what="the prune")
    assert not own_errors(operator)


def test_target_name_for_one_source_and_the_schema_refuses_impossible_names(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    def refused(spec: dict[str, Any]) -> str:
        body = {"apiVersion": f"{G}/{V}", "kind": rules.KIND, "metadata": {"name": "bad"},
                "spec": {"ruleType": "configmap", "selector": {"a": "b"}, "namespace": namespace, **spec}}
        proc = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), check=False)
        assert proc.returncode != 0, proc.stdout
        return proc.stderr

    assert "must be a valid object name" in refused({"target": {"name": "Bad_Name"}})
    assert "cannot be combined" in refused({"target": {"name": "x", "namePrefix": "p-"}})
    assert "cannot start a valid object name" in refused({"target": {"namePrefix": "app-."}})
    assert "cannot end a valid object name" in refused({"target": {"nameSuffix": "-"}})
    assert "at most 200 characters" in refused({"target": {"namePrefix": "a" * 150, "nameSuffix": "b" * 60}})

    target = make_namespace()
    put_cm(core, namespace, "app-settings-2026", {"k": "v"}, labels={"release": "current"})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"release": "current"},
              namespace=namespace, targetNamespaces=[target], target={"name": "app-settings"})
    try:
        wait_data(core, target, "app-settings", {"k": "v"})
        # A second source for the one name: the rule says so; the copy it made stays as it is.
        put_cm(core, namespace, "app-settings-2027", {"k": "new"}, labels={"release": "current"})
        stalled = wait_condition(custom, namespace, "r", "Stalled", status="True", reason="InvalidCopy")
        assert "2 sources match" in stalled["message"] and "app-settings-2027" in stalled["message"]
        stays(lambda: data_of(core, target, "app-settings") == {"k": "v"}, 2, what="the copy kept")
        core.delete_namespaced_config_map("app-settings-2026", namespace)
        wait_data(core, target, "app-settings", {"k": "new"})
        wait_condition(custom, namespace, "r", "Ready", status="True")
    finally:
        delete_rule(custom, namespace, "r")
    wait_for(lambda: get(core, "ConfigMap", target, "app-settings") is None, timeout=30, what="the prune")
    assert not own_errors(operator)


# --- 2. keys selected and renamed -----------------------------------------------------------------


def test_keys_selected_and_renamed(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    target = make_namespace()
    put_cm(core, namespace, "tls", {"tls.crt": "C", "tls.key": "K", "ca.crt": "A"})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=[target], keys=["tls.crt", "ca.crt"],
              renameKeys={"ca.crt": "ca.pem"})
    try:
        wait_data(core, target, "tls", {"tls.crt": "C", "ca.pem": "A"})
        # Source edits follow the same mapping; a key outside `keys` never reaches the copy.
        put_cm(core, namespace, "tls", {"tls.crt": "C2", "tls.key": "K2", "ca.crt": "A2", "extra": "x"})
        wait_data(core, target, "tls", {"tls.crt": "C2", "ca.pem": "A2"})
        # A hand edit of a renamed key is repaired.
        core.patch_namespaced_config_map("tls", target, {"data": {"ca.pem": "tampered"}})
        wait_data(core, target, "tls", {"tls.crt": "C2", "ca.pem": "A2"})
        # The rule stops selecting keys: the whole source is copied (one patch, the rename kept).
        patch_rule(custom, namespace, "r", {"keys": None})
        wait_data(core, target, "tls", {"tls.crt": "C2", "tls.key": "K2", "ca.pem": "A2", "extra": "x"})
        # A source holding both the renamed key and its new name: reported, the copy left as it is.
        patch_rule(custom, namespace, "r", {"renameKeys": {"ca.crt": "extra"}})
        stalled = wait_condition(custom, namespace, "r", "Stalled", status="True", reason="InvalidCopy")
        assert f"{namespace}/tls" in stalled["message"] and "'extra'" in stalled["message"]
        assert status(custom, namespace, "r")["invalid"]
        stays(lambda: data_of(core, target, "tls") == {"tls.crt": "C2", "tls.key": "K2", "ca.pem": "A2",
                                                       "extra": "x"}, 2, what="the copy left as it was")
        # The schema refuses what the rule alone shows.
        proc = kubectl("patch", "copyr", "r", "-n", namespace, "--type=merge", "-p",
                       '{"spec": {"keys": ["a", "b"], "renameKeys": {"a": "b"}}}', check=False)
        assert proc.returncode != 0 and "would be copied under one name" in proc.stderr
    finally:
        delete_rule(custom, namespace, "r")
    wait_for(lambda: get(core, "ConfigMap", target, "tls") is None, timeout=30, what="the prune")
    assert not own_errors(operator)


# --- 3. push annotations (no rule) -----------------------------------------------------------------


def test_a_source_pushes_itself_into_the_namespaces_it_names(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    token = namespace[-5:]
    one, two, labelled, other = (make_namespace(accept_from=namespace), make_namespace(accept_from=namespace),
                                 make_namespace(push=token, accept_from=namespace),
                                 make_namespace(accept_from=namespace))
    put_cm(core, other, "pushed", {"owner": "someone"}, labels={})
    before = get(core, "ConfigMap", other, "pushed") or {}
    body = {"metadata": {"name": "pushed", "namespace": namespace, "annotations": {
        rules.PUSH_TO_ANNOTATION: f"{one},{two},{other}", rules.PUSH_TO_MATCHING_ANNOTATION: f"push={token}"}},
        "data": {"k": "v"}}
    # Both annotations: the namespaces named AND labelled; here none is both, so nothing yet.
    core.create_namespaced_config_map(namespace, body)
    stays(lambda: all(get(core, "ConfigMap", ns, "pushed") is None for ns in (one, two, labelled)), 2,
          what="no copies where the two annotations do not agree")
    # Only push-to: the named namespaces; somebody else's object is left alone and reported on the source.
    core.patch_namespaced_config_map("pushed", namespace, {"metadata": {"annotations": {
        rules.PUSH_TO_MATCHING_ANNOTATION: None}}})
    for ns in (one, two):
        wait_data(core, ns, "pushed", {"k": "v"})
    copy = get(core, "ConfigMap", one, "pushed") or {}
    assert copy["metadata"]["annotations"][rules.PUSHED_ANNOTATION] == "true"
    assert copy["metadata"]["labels"][COPYRATOR_RULE_UID_LABEL] == (get(core, "ConfigMap", namespace, "pushed")
                                                                    or {})["metadata"]["uid"]
    wait_for(lambda: [e for e in events(core, namespace, "pushed") if e.type == "Warning"
                      and e.reason == "ForeignObject" and f"{other}/pushed" in e.message],
             timeout=30, what="a Warning event on the source naming the object in the way")
    assert (get(core, "ConfigMap", other, "pushed") or {}) == before
    # Edits follow.
    core.patch_namespaced_config_map("pushed", namespace, {"data": {"k": "v2"}})
    for ns in (one, two):
        wait_data(core, ns, "pushed", {"k": "v2"})
    # By label only (replicator's replicate-to-matching): a namespace labelled later gets it too.
    core.patch_namespaced_config_map("pushed", namespace, {"metadata": {"annotations": {
        rules.PUSH_TO_ANNOTATION: None, rules.PUSH_TO_MATCHING_ANNOTATION: f"push={token}"}}})
    wait_data(core, labelled, "pushed", {"k": "v2"})
    wait_for(lambda: get(core, "ConfigMap", one, "pushed") is None and get(core, "ConfigMap", two, "pushed") is None,
             timeout=30, what="the copies no longer named pruned")
    core.patch_namespace(two, {"metadata": {"labels": {"push": token}}})
    wait_data(core, two, "pushed", {"k": "v2"})
    # The annotation removed: every copy goes; the source stays.
    core.patch_namespaced_config_map("pushed", namespace, {"metadata": {"annotations": {
        rules.PUSH_TO_MATCHING_ANNOTATION: None}}})
    wait_for(lambda: all(get(core, "ConfigMap", ns, "pushed") is None for ns in (two, labelled)), timeout=30,
             what="the copies pruned")
    assert data_of(core, namespace, "pushed") == {"k": "v2"}
    assert (get(core, "ConfigMap", other, "pushed") or {}) == before
    # Pushed again, then the source deleted: its copies go.
    core.patch_namespaced_config_map("pushed", namespace, {"metadata": {"annotations": {
        rules.PUSH_TO_ANNOTATION: one}}})
    wait_data(core, one, "pushed", {"k": "v2"})
    core.delete_namespaced_config_map("pushed", namespace)
    wait_for(lambda: get(core, "ConfigMap", one, "pushed") is None, timeout=30, what="the prune of a deleted source")
    assert not own_errors(operator)


def test_a_malformed_push_annotation_is_reported_on_the_source(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "bad", "annotations": {
        rules.PUSH_TO_MATCHING_ANNOTATION: "team"}}, "data": {"k": "v"}})
    wait_for(lambda: [e for e in events(core, namespace, "bad") if e.type == "Warning" and "key=value" in e.message],
             timeout=30, what="a Warning event on the source")


def test_a_pushed_secret_keeps_its_type_and_tokens_are_never_pushed(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    target = make_namespace(accept_from=namespace)
    push = {rules.PUSH_TO_ANNOTATION: target}
    core.create_namespaced_secret(namespace, {"metadata": {"name": "tls", "annotations": push},
                                              "type": "kubernetes.io/tls",
                                              "stringData": {"tls.crt": "C", "tls.key": "K"}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "token", "annotations": {
        **push, "kubernetes.io/service-account.name": "default"}}, "type": "kubernetes.io/service-account-token"})
    copy = wait_for(lambda: get(core, "Secret", target, "tls"), timeout=30, what="the pushed Secret")
    assert copy is not None and copy["type"] == "kubernetes.io/tls"
    wait_for(lambda: [e for e in events(core, namespace, "token") if e.type == "Warning" and e.reason == "Skipped"
                      and "never copied" in e.message], timeout=30, what="a Warning event on the token")
    assert get(core, "Secret", target, "token") is None
    core.delete_namespaced_secret("tls", namespace)
    wait_for(lambda: get(core, "Secret", target, "tls") is None, timeout=30, what="the prune")
    assert not own_errors(operator)


def test_the_push_example_works(operator: OperatorProcess, core: kubernetes.client.CoreV1Api) -> None:
    """manifests/examples/copyrator-push-source.yaml, applied as it is, into the namespaces it names."""
    example = (EXAMPLES / "copyrator-push-source.yaml").read_text()
    doc = yaml.safe_load(example)
    names = doc["metadata"]["annotations"][rules.PUSH_TO_ANNOTATION].split(",")
    made = [ns for ns in names if not namespace_exists(core, ns)]
    for ns in made:
        core.create_namespace({"metadata": {"name": ns, "labels": {"kopf-operators.dev/test": "true"}}})
    # Each target consents, as the example's comment says (its own annotation).
    accept = {rules.ACCEPT_FROM_ANNOTATION: doc["metadata"]["namespace"]}
    before = {ns: ((core.read_namespace(ns).metadata.annotations or {}).get(rules.ACCEPT_FROM_ANNOTATION))
              for ns in names}
    for ns in names:
        core.patch_namespace(ns, {"metadata": {"annotations": accept}})
    existed = get(core, "ConfigMap", doc["metadata"]["namespace"], doc["metadata"]["name"]) is not None
    try:
        kubectl("apply", "-f", "-", input=example)
        for ns in names:
            wait_data(core, ns, doc["metadata"]["name"], doc["data"])
    finally:
        if not existed:
            core.delete_namespaced_config_map(doc["metadata"]["name"], doc["metadata"]["namespace"])
            name = doc["metadata"]["name"]
            wait_for(lambda: all(get(core, "ConfigMap", ns, name) is None for ns in names), timeout=30,
                     what="the pushed copies pruned")
        for ns in set(names) - set(made):
            core.patch_namespace(ns, {"metadata": {"annotations": {rules.ACCEPT_FROM_ANNOTATION: before[ns]}}})
        for ns in made:
            core.delete_namespace(ns)




# --- 4. two rules for one target name ----------------------------------------------------------------


def test_two_rules_for_one_target_name_the_later_is_refused_without_flapping(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    target = make_namespace()
    put_cm(core, namespace, "blue", {"colour": "blue"}, labels={"colour": "blue"})
    put_cm(core, namespace, "green", {"colour": "green"}, labels={"colour": "green"})
    # Created back to back: both want target/app-config; the older one gets it.
    make_rule(custom, namespace, "first", ruleType="configmap", selector={"colour": "blue"},
              namespace=namespace, targetNamespaces=[target], target={"name": "app-config"})
    make_rule(custom, namespace, "second", ruleType="configmap", selector={"colour": "green"},
              namespace=namespace, targetNamespaces=[target], target={"name": "app-config"})
    try:
        wait_data(core, target, "app-config", {"colour": "blue"})
        stalled = wait_condition(custom, namespace, "second", "Stalled", status="True", reason="TargetClaimed")
        assert f"{target}/app-config" in stalled["message"] and f"{namespace}/first" in stalled["message"]
        assert condition(custom, namespace, "second", "Ready")["status"] == "False"
        assert status(custom, namespace, "second")["contested"]
        wait_condition(custom, namespace, "first", "Ready", status="True")
        printed = kubectl("get", "copyr", "-n", namespace, "second").stdout
        assert "TargetClaimed" in printed
        # Never flapping: the copy stays the first rule's across source edits of both rules.
        copy = get(core, "ConfigMap", target, "app-config") or {}
        put_cm(core, namespace, "green", {"colour": "green", "v": "2"}, labels={"colour": "green"})
        stays(lambda: (get(core, "ConfigMap", target, "app-config") or {}).get("metadata", {})
              .get("resourceVersion") == copy["metadata"]["resourceVersion"], 3, what="the first rule's copy")
        # The first rule goes: the second gets the name, and says so.
        delete_rule(custom, namespace, "first")
        wait_data(core, target, "app-config", {"colour": "green", "v": "2"})
        wait_condition(custom, namespace, "second", "Ready", status="True")
        # A rule created now that wants the held name is the one refused (the holder keeps it).
        make_rule(custom, namespace, "third", ruleType="configmap", selector={"colour": "blue"},
                  namespace=namespace, targetNamespaces=[target], target={"name": "app-config"})
        stalled = wait_condition(custom, namespace, "third", "Stalled", status="True", reason="TargetClaimed")
        assert f"{namespace}/second" in stalled["message"]
        stays(lambda: data_of(core, target, "app-config") == {"colour": "green", "v": "2"}, 2,
              what="the holder keeps the copy")
    finally:
        for name in ("first", "second", "third"):
            delete_rule(custom, namespace, name)
    wait_for(lambda: get(core, "ConfigMap", target, "app-config") is None, timeout=30, what="the prune")
    assert not own_errors(operator)
