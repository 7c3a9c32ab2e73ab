# ruff: noqa: F401, F811  (the fixture imported from copyrator_helpers is a parameter here)
"""Copyrator end to end, on the real local control plane.

Rules that target every namespace copy into other tests' namespaces too, so only the tests of the
article's all-namespaces behaviour use them; the rest limit targets to their own namespaces, and
every test deletes its rules and waits for the prune.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable
from typing import Any

import kubernetes
import yaml

from kopf_operators.copyrator import rules
from kopf_operators.core import conventions
from kopf_operators.core.conventions import COPY_SOURCE, COPYRATOR_RULE_UID_LABEL
from tests.e2e.copyrator_helpers import (
    G,
    P,
    V,
    condition,
    copies,
    data_of,
    delete_rule,
    events,
    get,
    make_rule,
    own_errors,
    own_operator,
    put_cm,
    status,
    wait_condition,
    wait_data,
)
from tests.kube import OperatorProcess, delete_namespaces, stays, wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import REPO

ARTICLE_RULE = REPO / "manifests" / "examples" / "copyrator-article-rule.yaml"


# --- The article's rule ------------------------------------------------------------------------


def test_article_rule_copies_into_every_namespace_and_propagates(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    source = f"copyrator-e2e-{uuid.uuid4().hex[:6]}"
    put_cm(core, "default", source, {"LOG_LEVEL": "info", "MODE": "a"})
    try:
        kubectl("apply", "-n", "default", "-f", str(ARTICLE_RULE))  # verbatim: fields at the top level
        wait_for(lambda: data_of(core, namespace, source) == {"LOG_LEVEL": "info", "MODE": "a"},
                 timeout=30, what="the copy in an existing namespace")
        copy = get(core, "ConfigMap", namespace, source) or {}
        rule = custom.get_namespaced_custom_object(G, V, "default", P, "main-rule")
        assert copy["metadata"]["labels"] == {"copyrator": "true", COPYRATOR_RULE_UID_LABEL: rule["metadata"]["uid"]}
        assert copy["metadata"]["annotations"][COPY_SOURCE] == f"default/{source}"
        assert copy["metadata"]["annotations"][rules.RULE_ANNOTATION] == "default/main-rule"
        assert get(core, "ConfigMap", "kube-system", source) is None  # system namespaces excluded
        wait_for(lambda: condition(custom, "default", "main-rule", "Ready").get("status") == "True",
                 what="Ready=True")
        st = status(custom, "default", "main-rule")
        assert st["observedGeneration"] == rule["metadata"]["generation"] and st["ruleType"] == "configmap"
        printed = kubectl("get", "copyr", "-n", "default", "main-rule").stdout
        assert "configmap" in printed and "default" in printed and "True" in printed

        # A namespace created later gets the copy.
        started = time.monotonic()
        later = make_namespace()
        wait_for(lambda: data_of(core, later, source), timeout=30, what="the copy in a new namespace")
        print(f"\nnew namespace -> copy: {time.monotonic() - started:.2f}s")

        # Updates, key removal and label changes propagate.
        started = time.monotonic()
        put_cm(core, "default", source, {"LOG_LEVEL": "debug"}, labels={"copyrator": "true", "tier": "x"})
        for ns in (namespace, later):
            wait_data(core, ns, source, {"LOG_LEVEL": "debug"})
        print(f"source update -> copies: {time.monotonic() - started:.2f}s")
        assert (get(core, "ConfigMap", later, source) or {})["metadata"]["labels"]["tier"] == "x"

        # Top-level field edits reach the operator (generation bumps; Kopf diffs the whole body).
        kubectl("patch", "copyr", "main-rule", "-n", "default", "--type=merge",
                "-p", f'{{"excludedNamespaces": ["{later}"]}}')
        wait_for(lambda: get(core, "ConfigMap", later, source) is None, timeout=30,
                 what="the prune from an excluded namespace")
        assert data_of(core, namespace, source) == {"LOG_LEVEL": "debug"}
        generation = custom.get_namespaced_custom_object(G, V, "default", P, "main-rule")["metadata"]["generation"]
        # The status follows the copies' writes (a moment later): wait for it rather than race it.
        wait_for(lambda: status(custom, "default", "main-rule").get("observedGeneration") == generation,
                 timeout=10, what="observedGeneration to follow the edit")
    finally:
        delete_rule(custom, "default", "main-rule")
        core.delete_namespaced_config_map(source, "default")
    assert not [k for k in copies(core) if k.endswith(f"/{source}")], "rule deletion prunes every copy"
    assert not own_errors(operator)


# --- Secrets, canaries, conflicts ------------------------------------------------------------


def test_secret_rule_skips_tokens_and_never_leaks_values(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    target = make_namespace()
    labels = {"share": "creds"}

    def secret(name: str, type_: str, annotations: dict[str, str] | None = None) -> None:
        core.create_namespaced_secret(namespace, {
            "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
            "type": type_, "stringData": {"password": canary}})

    secret("creds", "Opaque")
    secret("sa-token", "kubernetes.io/service-account-token", {"kubernetes.io/service-account.name": "default"})
    secret("sh.helm.release.v1.app.v1", "helm.sh/release.v1")
    make_rule(custom, namespace, "creds", ruleType="secret", selector=labels, namespace=[namespace],
              targetNamespaces=[target])
    try:
        copied = wait_for(lambda: get(core, "Secret", target, "creds"), timeout=30, what="the secret copy")
        assert copied is not None
        assert base64.b64decode(copied["data"]["password"]).decode() == canary and copied["type"] == "Opaque"
        wait_for(lambda: status(custom, namespace, "creds").get("skipped") == 2, what="2 skipped secrets")
        stays(lambda: get(core, "Secret", target, "sa-token") is None
              and get(core, "Secret", target, "sh.helm.release.v1.app.v1") is None, 2, what="tokens not copied")

        # A type change cannot be updated in place: the copy is re-created with the new type.
        new = {"metadata": {"name": "creds", "labels": labels}, "type": "example.com/custom",
               "stringData": {"password": canary, "user": "u"}}
        core.delete_namespaced_secret("creds", namespace)
        core.create_namespaced_secret(namespace, new)
        wait_for(lambda: (get(core, "Secret", target, "creds") or {}).get("type") == "example.com/custom",
                 timeout=30, what="the re-created copy")

        encoded = base64.b64encode(canary.encode()).decode()
        evs = " ".join(f"{e.reason} {e.message}" for e in events(core, namespace, "creds"))
        st = repr(status(custom, namespace, "creds"))
        annotations = repr((get(core, "Secret", target, "creds") or {})["metadata"].get("annotations"))
        for where, text in (("operator log", operator.output()), ("events", evs), ("status", st),
                            ("annotations", annotations)):
            assert canary not in text and encoded not in text, f"secret value leaked into {where}"
    finally:
        delete_rule(custom, namespace, "creds")
    assert get(core, "Secret", target, "creds") is None
    assert not own_errors(operator)


def test_foreign_object_is_left_untouched_and_reported(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    mine, theirs = make_namespace(), make_namespace()
    put_cm(core, theirs, "settings", {"owner": "somebody else"}, labels={})
    before = get(core, "ConfigMap", theirs, "settings") or {}
    put_cm(core, namespace, "settings", {"k": "v"})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=[mine, theirs])
    try:
        wait_for(lambda: data_of(core, mine, "settings") == {"k": "v"}, timeout=30, what="the copy")
        cond = wait_condition(custom, namespace, "r", "Conflict", status="True")
        assert f"{theirs}/settings" in cond["message"]
        st = status(custom, namespace, "r")
        assert (st["desired"], st["copied"], st["conflicted"]) == (2, 1, 1)
        wait_for(lambda: [e for e in events(core, namespace, "r") if e.reason == "Conflict" and e.type == "Warning"],
                 what="a Warning event")
        # An update of the source still never touches the foreign object.
        put_cm(core, namespace, "settings", {"k": "v2"})
        wait_for(lambda: data_of(core, mine, "settings") == {"k": "v2"}, timeout=30, what="the update")
        after = get(core, "ConfigMap", theirs, "settings") or {}
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert after == before
    finally:
        delete_rule(custom, namespace, "r")
    assert get(core, "ConfigMap", mine, "settings") is None
    assert (get(core, "ConfigMap", theirs, "settings") or {}) == before, "pruning spares foreign objects"


# --- Pruning -------------------------------------------------------------------------------


def test_every_prune_path(operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
                          custom: kubernetes.client.CustomObjectsApi, namespace: str,
                          make_namespace: Callable[..., str]) -> None:
    token = uuid.uuid4().hex[:6]
    a, b = make_namespace(**{"copyrator-e2e": token}), make_namespace(**{"copyrator-e2e": token})
    for name in ("deleted", "unlabelled", "kept"):
        put_cm(core, namespace, name, {"name": name})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, namespaceSelector={"matchLabels": {"copyrator-e2e": token}})
    try:
        for ns in (a, b):
            for name in ("deleted", "unlabelled", "kept"):
                wait_data(core, ns, name)
        # The source is deleted.
        core.delete_namespaced_config_map("deleted", namespace)
        wait_for(lambda: all(get(core, "ConfigMap", ns, "deleted") is None for ns in (a, b)), timeout=30,
                 what="the prune of a deleted source's copies")
        # The source stops matching the selector.
        put_cm(core, namespace, "unlabelled", {"name": "unlabelled"}, labels={"copyrator": "no"})
        wait_for(lambda: all(get(core, "ConfigMap", ns, "unlabelled") is None for ns in (a, b)), timeout=30,
                 what="the prune of an unlabelled source's copies")
        # A namespace stops being a target (its labels no longer match).
        core.patch_namespace(b, {"metadata": {"labels": {"copyrator-e2e": None}}})
        wait_for(lambda: get(core, "ConfigMap", b, "kept") is None, timeout=30, what="the prune from b")
        assert data_of(core, a, "kept") == {"name": "kept"}
        # The status follows a burst of changes a moment later (written once per burst).
        wait_for(lambda: status(custom, namespace, "r").get("copied") == 1, timeout=10, what="status copied=1")
    finally:
        # The rule is deleted: its last copies go.
        delete_rule(custom, namespace, "r")
    assert get(core, "ConfigMap", a, "kept") is None
    assert data_of(core, namespace, "kept") == {"name": "kept"}, "sources are never touched"
    assert not own_errors(operator)


def test_schema_rejects_bad_rules_readably(crds: None, namespace: str) -> None:
    def apply(doc: dict[str, Any]) -> str:
        body = {"apiVersion": f"{G}/{V}", "kind": rules.KIND, "metadata": {"name": "bad"}, **doc}
        proc = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), check=False)
        assert proc.returncode != 0, proc.stdout
        return proc.stderr

    assert "Unsupported value" in apply({"ruleType": "pods", "selector": {"a": "b"}, "namespace": namespace})
    assert "not both" in apply({"ruleType": "secret", "selector": {"a": "b"}, "namespace": namespace,
                                "spec": {"ruleType": "secret", "selector": {"a": "b"}, "namespace": namespace}})
    assert "selector" in apply({"spec": {"ruleType": "secret", "selector": {}, "namespace": namespace}})
    # namespace: one name or a list of names (checked per JSON type by the schema).
    for bad, message in (("Bad_Name", "should match"), ([], "at least 1 items"), (["ok", "Bad_X"], "namespace[1]"),
                         ([5], "must be of type string"), ({"a": "b"}, "at most 0")):
        assert message in apply({"ruleType": "configmap", "selector": {"a": "b"}, "namespace": bad})
        assert message in apply({"spec": {"ruleType": "configmap", "selector": {"a": "b"}, "namespace": bad}})
    assert "values" in apply({"spec": {"ruleType": "secret", "selector": {"a": "b"}, "namespace": namespace,
                                       "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}})


def test_invalid_namespace_value_is_reported_in_status(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str) -> None:
    body = {"apiVersion": f"{G}/{V}", "kind": rules.KIND, "metadata": {"name": "bad", "namespace": namespace},
            "ruleType": "configmap", "selector": {"a": "b"}, "namespace": 5}  # passes the schema
    custom.create_namespaced_custom_object(G, V, namespace, P, body)
    try:
        cond = wait_condition(custom, namespace, "bad", "Ready", reason="Invalid")
        assert "namespace" in cond["message"] and cond["status"] == "False"
        wait_for(lambda: [e for e in events(core, namespace, "bad") if e.reason == "Invalid"], what="event")
    finally:
        delete_rule(custom, namespace, "bad")


# --- With an operator of our own (special environment) ------------------------------------------


def test_cross_namespace_rules_are_refused_unless_allowed(
        operator: OperatorProcess, own_operator: Callable[..., OperatorProcess],
        core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi,
        namespace: str, make_namespace: Callable[..., str]) -> None:
    elsewhere, target = make_namespace(), make_namespace()
    put_cm(core, elsewhere, "settings", {"k": "v"})
    make_rule(custom, namespace, "cross", ruleType="configmap", selector={"copyrator": "true"},
              namespace=elsewhere, targetNamespaces=[target])
    try:
        cond = wait_condition(custom, namespace, "cross", "Refused", status="True")
        assert elsewhere in cond["message"] and "COPYRATOR_ALLOW_CROSS_NAMESPACE" in cond["message"]
        assert condition(custom, namespace, "cross", "Ready")["status"] == "False"
        wait_for(lambda: [e for e in events(core, namespace, "cross") if e.reason == "Refused"
                          and e.type == "Warning"], what="a Refused event")
        stays(lambda: get(core, "ConfigMap", target, "settings") is None, 2, what="nothing copied")

        proc = own_operator(COPYRATOR_ALLOW_CROSS_NAMESPACE="true")
        wait_for(lambda: data_of(core, target, "settings") == {"k": "v"}, timeout=30, what="the allowed copy")
        wait_condition(custom, namespace, "cross", "Refused", status="False")
        assert not own_errors(proc)
        delete_rule(custom, namespace, "cross")
        assert get(core, "ConfigMap", target, "settings") is None
    finally:
        delete_rule(custom, namespace, "cross")


def test_converges_after_downtime_and_idle_means_no_writes(
        operator: OperatorProcess, own_operator: Callable[..., OperatorProcess],
        core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi,
        namespace: str, make_namespace: Callable[..., str]) -> None:
    token = uuid.uuid4().hex[:6]
    a, b = make_namespace(**{"copyrator-e2e": token}), make_namespace(**{"copyrator-e2e": token})
    put_cm(core, namespace, "one", {"v": "1"})
    put_cm(core, namespace, "two", {"v": "1"})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, namespaceSelector={"matchLabels": {"copyrator-e2e": token}})
    try:
        for ns in (a, b):
            for name in ("one", "two"):
                wait_data(core, ns, name)

        operator.stop()  # downtime: every kind of change happens meanwhile
        put_cm(core, namespace, "one", {"v": "2"})
        core.delete_namespaced_config_map("two", a)  # a copy deleted by hand
        core.patch_namespaced_config_map("two", b, {"data": {"v": "edited by hand"}})
        put_cm(core, namespace, "three", {"v": "3"})
        c = make_namespace(**{"copyrator-e2e": token})

        started = time.monotonic()
        proc = own_operator(COPYRATOR_RESYNC_SECONDS="2")
        want = {(ns, name): {"v": v} for ns in (a, b, c) for name, v in (("one", "2"), ("two", "1"), ("three", "3"))}
        wait_for(lambda: all(data_of(core, ns, name) == d for (ns, name), d in want.items()), timeout=60,
                 what="convergence after downtime")
        print(f"\nconverged after restart in {time.monotonic() - started:.2f}s")

        # Drift between events is repaired too (the copy is edited: the event or the resync fixes it).
        core.patch_namespaced_config_map("one", c, {"data": {"v": "drift"}})
        wait_for(lambda: data_of(core, c, "one") == {"v": "2"}, timeout=15, what="the drift repair")

        # Idle: several resyncs run, nothing is written.
        wait_for(lambda: status(custom, namespace, "r").get("copied") == 9, what="status copied=9")
        uid = custom.get_namespaced_custom_object(G, V, namespace, P, "r")["metadata"]["uid"]

        def versions() -> dict[str, str]:
            objs = copies(core, selector=f"{COPYRATOR_RULE_UID_LABEL}={uid}")
            rule = custom.get_namespaced_custom_object(G, V, namespace, P, "r")
            return {**{k: o.metadata.resource_version for k, o in objs.items()},
                    "rule": rule["metadata"]["resourceVersion"]}

        before = versions()
        assert len(before) == 10
        def resyncs() -> float:
            return proc.metric("kopf_operators_actions_total", operator="copyrator", action="resync")
        swept = resyncs()
        stays(lambda: versions() == before, 5, what="no writes while idle")  # 2.5 resync periods
        assert resyncs() >= swept + 2, "the resync timer runs"
        assert not own_errors(proc)
    finally:
        delete_rule(custom, namespace, "r")
    assert not [k for k in copies(core) if k.split("/")[0] in (a, b)]


# --- Consent on the source, pull rules, no adoption, Secret types (issue #15) ----------------------

CONSENT = rules.ALLOWED_NAMESPACES_ANNOTATION


def annotate(core: kubernetes.client.CoreV1Api, namespace: str, name: str, consent: str | None) -> None:
    core.patch_namespaced_config_map(name, namespace, {"metadata": {"annotations": {CONSENT: consent}}})


def test_consent_on_the_source_limits_targets_and_its_withdrawal_prunes(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    shared, team_a, other = make_namespace("shared"), make_namespace("team-a"), make_namespace("other")
    put_cm(core, shared, "settings", {"k": "v"})
    annotate(core, shared, "settings", f"{team_a}, nothing-*")
    # A rule in a third namespace pushes the shared source into two namespaces; the source allows one.
    make_rule(custom, namespace, "push", ruleType="configmap", selector={"copyrator": "true"},
              namespace=shared, targetNamespaces=[team_a, other])
    try:
        wait_data(core, team_a, "settings", {"k": "v"})
        wait_for(lambda: status(custom, namespace, "push").get("withheld") == 1, what="one copy withheld")
        st = status(custom, namespace, "push")
        assert (st["desired"], st["copied"]) == (1, 1)
        assert condition(custom, namespace, "push", "Ready")["status"] == "True"
        assert get(core, "ConfigMap", other, "settings") is None
        assert get(core, "ConfigMap", namespace, "settings") is None

        # Consent widened by a glob: the copy follows.
        annotate(core, shared, "settings", "team-*,other-*")
        wait_data(core, other, "settings", {"k": "v"})

        # Consent withdrawn: both copies go; the rule says why, naming the source.
        annotate(core, shared, "settings", None)
        wait_for(lambda: get(core, "ConfigMap", team_a, "settings") is None
                 and get(core, "ConfigMap", other, "settings") is None, timeout=30, what="the prune")
        cond = wait_condition(custom, namespace, "push", "Refused", status="True")
        assert f"{shared}/settings" in cond["message"] and CONSENT in cond["message"]
        assert condition(custom, namespace, "push", "Ready")["status"] == "False"
        wait_for(lambda: [e for e in events(core, namespace, "push") if e.reason == "Refused"
                          and e.type == "Warning" and f"{shared}/settings" in e.message], what="a Refused event")
        assert data_of(core, shared, "settings") == {"k": "v"}, "the source is never touched"
    finally:
        delete_rule(custom, namespace, "push")
    assert not own_errors(operator)


def test_a_pull_rule_copies_into_its_own_namespace_under_the_same_consent(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    shared, bystander = make_namespace("shared"), make_namespace("bystander")
    put_cm(core, shared, "settings", {"k": "v"})
    # The rule lives where the copy is wanted, and names the source namespace (no targets: pull).
    make_rule(custom, namespace, "pull", ruleType="configmap", selector={"copyrator": "true"}, namespace=shared)
    try:
        wait_condition(custom, namespace, "pull", "Refused", status="True")
        stays(lambda: get(core, "ConfigMap", namespace, "settings") is None, 2, what="nothing pulled without consent")
        annotate(core, shared, "settings", namespace)
        wait_data(core, namespace, "settings", {"k": "v"})
        wait_condition(custom, namespace, "pull", "Ready", status="True")
        assert condition(custom, namespace, "pull", "Refused")["status"] == "False"
        # Edits follow; nobody else gets a copy; nothing is written into the source namespace.
        core.patch_namespaced_config_map("settings", shared, {"data": {"k": "v2"}})  # the consent stays
        wait_data(core, namespace, "settings", {"k": "v2"})
        assert get(core, "ConfigMap", bystander, "settings") is None
        assert not [k for k in copies(core) if k.startswith(f"{shared}/")]
    finally:
        delete_rule(custom, namespace, "pull")
    assert get(core, "ConfigMap", namespace, "settings") is None
    assert not own_errors(operator)


def test_copies_are_not_adopted_by_other_controllers(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    target = make_namespace()
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(namespace, {
        "metadata": {
            "name": "chart-settings",
            "labels": {"copyrator": "true", "app": "web", "app.kubernetes.io/managed-by": "Helm",
                       "helm.sh/chart": "web-1.0.0", "app.kubernetes.io/instance": "web", "team": "a"},
            "annotations": {"meta.helm.sh/release-name": "web", "meta.helm.sh/release-namespace": namespace,
                            "note": "kept when annotations are copied"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                 "uid": owner.metadata.uid}]},
        "data": {"k": "v"}})
    make_rule(custom, namespace, "plain", ruleType="configmap", selector={"app": "web"}, namespace=namespace,
              targetNamespaces=[target])
    try:
        copy = wait_for(lambda: get(core, "ConfigMap", target, "chart-settings"), what="the copy") or {}
        uid = custom.get_namespaced_custom_object(G, V, namespace, P, "plain")["metadata"]["uid"]
        assert copy["metadata"]["labels"] == {"copyrator": "true", "app": "web", "team": "a",
                                              COPYRATOR_RULE_UID_LABEL: uid}
        assert not copy["metadata"].get("ownerReferences")
        assert {k for k in copy["metadata"]["annotations"] if not k.startswith(conventions.COPYRATOR_PREFIX)} == set()
        delete_rule(custom, namespace, "plain")

        # Options: strip more labels, copy annotations (Helm's still not).
        make_rule(custom, namespace, "rich", ruleType="configmap", selector={"app": "web"}, namespace=namespace,
                  targetNamespaces=[target], stripLabels=["team"], copyAnnotations=True)
        wait_for(lambda: (get(core, "ConfigMap", target, "chart-settings") or {}).get("metadata", {})
                 .get("annotations", {}).get("note"), what="the annotated copy")
        copy = get(core, "ConfigMap", target, "chart-settings") or {}
        labels = copy["metadata"]["labels"]
        assert "team" not in labels and "app.kubernetes.io/managed-by" not in labels
        assert not [k for k in copy["metadata"]["annotations"] if "helm.sh" in k]
        # A copied annotation edited by hand is drift: restored.
        core.patch_namespaced_config_map("chart-settings", target, {"metadata": {"annotations": {"note": "x"}}})
        wait_for(lambda: (get(core, "ConfigMap", target, "chart-settings") or {})["metadata"]["annotations"]
                 .get("note") == "kept when annotations are copied", timeout=15, what="the restored annotation")
    finally:
        delete_rule(custom, namespace, "plain")
        delete_rule(custom, namespace, "rich")
    assert get(core, "ConfigMap", target, "chart-settings") is None
    assert not own_errors(operator)


def test_replicator_scenarios_for_secrets(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    """What kubernetes-replicator's own suite checks, in Copyrator's terms: copies of existing
    Secrets keep values and type (TLS from cert-manager, dockerconfigjson), follow updates and key
    removals, reach namespaces named or selected (also created later), never land in the source
    namespace, and go when the source, or the source's namespace, is deleted."""
    token = uuid.uuid4().hex[:6]
    source_ns = make_namespace("certs")
    named, occupied = make_namespace(), make_namespace()
    selected = make_namespace(**{"copyrator-e2e": token})
    # Somebody else's Secret of that name: never overwritten (replicator would merge into it).
    core.create_namespaced_secret(occupied, {"metadata": {"name": "wildcard-tls"}, "type": "Opaque",
                                             "data": {"mine": base64.b64encode(b"x").decode()}})
    tls = {"tls.crt": base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode(),
           "tls.key": base64.b64encode(b"-----BEGIN PRIVATE KEY-----").decode(),
           "ca.crt": base64.b64encode(b"ca").decode()}
    # As cert-manager writes a Certificate's Secret (its annotations and label included).
    core.create_namespaced_secret(source_ns, {
        "metadata": {"name": "wildcard-tls", "labels": {"share": token, "controller.cert-manager.io/fao": "true"},
                     "annotations": {"cert-manager.io/certificate-name": "wildcard",
                                     "cert-manager.io/issuer-name": "ca", CONSENT: "*"}},
        "type": "kubernetes.io/tls", "data": tls})
    core.create_namespaced_secret(source_ns, {
        "metadata": {"name": "registry", "labels": {"share": token}, "annotations": {CONSENT: "*"}},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(b'{"auths":{}}').decode()}})
    # Push by names and by a namespace label selector (both AND-ed would be narrower: two rules).
    make_rule(custom, namespace, "by-name", ruleType="secret", selector={"share": token}, namespace=source_ns,
              targetNamespaces=[named, occupied])
    make_rule(custom, namespace, "by-label", ruleType="secret", selector={"share": token}, namespace=source_ns,
              namespaceSelector={"matchLabels": {"copyrator-e2e": token}})
    try:
        def secret_in(ns: str, name: str) -> Callable[[], dict[str, Any] | None]:
            return lambda: get(core, "Secret", ns, name)

        def data_is(ns: str, name: str, data: dict[str, str]) -> Callable[[], bool]:
            return lambda: (get(core, "Secret", ns, name) or {}).get("data") == data

        for ns in (named, selected):
            copy = wait_for(secret_in(ns, "wildcard-tls"), what=f"the TLS copy in {ns}") or {}
            assert copy["type"] == "kubernetes.io/tls" and copy["data"] == tls
            assert not [k for k in copy["metadata"].get("annotations") or {} if k.startswith("cert-manager.io/")]
            assert "controller.cert-manager.io/fao" not in copy["metadata"]["labels"]
            reg = wait_for(secret_in(ns, "registry"), what=f"the registry copy in {ns}") or {}
            assert reg["type"] == "kubernetes.io/dockerconfigjson"
        cond = wait_condition(custom, namespace, "by-name", "Conflict", status="True")
        assert f"{occupied}/wildcard-tls" in cond["message"]
        assert (get(core, "Secret", occupied, "wildcard-tls") or {}).get("type") == "Opaque"
        # A namespace created later (matching the selector) gets the copies.
        later = make_namespace(**{"copyrator-e2e": token})
        wait_for(lambda: get(core, "Secret", later, "wildcard-tls"), what="the copy in a new namespace")
        # An update (a renewed certificate) and a removed key reach every copy.
        renewed = {**tls, "tls.crt": base64.b64encode(b"renewed").decode()}
        del renewed["ca.crt"]
        core.patch_namespaced_secret("wildcard-tls", source_ns,
                                     [{"op": "replace", "path": "/data", "value": renewed}])
        for ns in (named, selected, later):
            wait_for(data_is(ns, "wildcard-tls", renewed), what=f"the renewed copy in {ns}")
        # Never onto the source namespace, nothing written there.
        secrets_there = core.list_namespaced_secret(source_ns, label_selector=COPYRATOR_RULE_UID_LABEL).items
        assert not secrets_there
        # Deleting a source deletes its copies.
        core.delete_namespaced_secret("registry", source_ns)
        wait_for(lambda: all(get(core, "Secret", ns, "registry") is None for ns in (named, selected, later)),
                 what="the registry copies pruned")
        # Deleting the source's namespace deletes the rest.
        delete_namespaces(core, [source_ns])
        wait_for(lambda: all(get(core, "Secret", ns, "wildcard-tls") is None for ns in (named, selected, later)),
                 timeout=60, what="the copies pruned with the source namespace")
        assert (get(core, "Secret", occupied, "wildcard-tls") or {}).get("data") == \
            {"mine": base64.b64encode(b"x").decode()}, "the foreign Secret is never touched"
    finally:
        delete_rule(custom, namespace, "by-name")
        delete_rule(custom, namespace, "by-label")
    assert not own_errors(operator)
