# ruff: noqa: F401, F811  (the fixture imported from copyrator_helpers is a parameter here)
"""Copyrator's tenant boundary, end to end: a user bound by a Role to ConfigMaps and Secrets in its own
namespace only (impersonated: ``kubectl --as``) cannot make the operator write anywhere else without
that namespace's consent. Every cross-namespace path is tried: push by name, by glob and by label;
into another tenant's namespace, into kube-system and into the operator's namespace; a rule (pull or
push) once tenants may write rules. With consent given, the same push works. Plus the upgrade: copies
pushed before consent existed are kept, unsynced, and reported.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from kopf_operators.blackadder.settings import LEDGER_LABEL, OPT_LABEL
from kopf_operators.copyrator import copies, rules
from kopf_operators.core import conventions
from kopf_operators.core.conventions import COPY_SOURCE, COPYRATOR_RULE_UID_LABEL
from tests.e2e.copyrator_helpers import (
    G,
    V,
    condition,
    data_of,
    delete_rule,
    events,
    get,
    own_operator,  # a fixture
    wait_condition,
    wait_data,
)
from tests.kube import E2E_RELEASE, OperatorProcess, chart_objects, operator_namespace, stays, wait_for
from testsupport.kubectl import kubectl

USER = "tenant-a"


class Tenant:
    """User ``tenant-a``, bound by a Role to ConfigMaps and Secrets (and, when ``rules``, through the
    built-in ``edit`` ClusterRole with the chart's aggregated rule-writing role) in one namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        kubectl("create", "role", "tenant", "-n", namespace, "--verb=*", "--resource=configmaps,secrets")
        kubectl("create", "rolebinding", "tenant", "-n", namespace, "--role=tenant", f"--user={USER}")

    def kubectl(self, *args: str, input: str | None = None) -> Any:
        return kubectl("--as", USER, *args, input=input, check=False)

    def apply(self, obj: dict[str, Any], namespace: str | None = None) -> Any:
        return self.kubectl("apply", "-n", namespace or self.namespace, "-f", "-", input=yaml.safe_dump(obj))

    def may(self, verb: str, resource: str, namespace: str) -> bool:
        return self.kubectl("auth", "can-i", verb, resource, "-n", namespace).stdout.strip() == "yes"


@pytest.fixture
def tenant(operator: OperatorProcess, namespace: str) -> Tenant:
    return Tenant(namespace)


def configmap(name: str, annotations: dict[str, str], data: str = "tenant-a's") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "annotations": annotations},
            "data": {"HTTP_PROXY": data}}


def written_outside(core: kubernetes.client.CoreV1Api, namespace: str) -> list[str]:
    """Every copy anywhere in the cluster whose source is in ``namespace`` ("ns/name")."""
    found = []
    for listing in (core.list_config_map_for_all_namespaces, core.list_secret_for_all_namespaces):
        for obj in listing(label_selector=COPYRATOR_RULE_UID_LABEL).items:
            source = (obj.metadata.annotations or {}).get(COPY_SOURCE, "")
            if source.startswith(f"{namespace}/"):
                found.append(f"{obj.metadata.namespace}/{obj.metadata.name}")
    return sorted(found)


def warning(core: kubernetes.client.CoreV1Api, namespace: str, name: str, reason: str, *words: str) -> Any:
    return wait_for(lambda: next((e for e in events(core, namespace, name) if e.type == "Warning"
                                  and e.reason == reason and all(w in e.message for w in words)), None),
                    timeout=30, what=f"a Warning {reason} on {namespace}/{name} naming {words}")


def test_a_tenant_pushes_nowhere_without_consent_and_with_consent_the_same_push_works(
        tenant: Tenant, core: kubernetes.client.CoreV1Api, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    token = uuid.uuid4().hex[:6]
    other, labelled = make_namespace("tenant-b"), make_namespace("tenant-c", team=token)
    # The operator's namespace (the chart's ServiceAccount's, as the session's operator runs).
    closed = ["kube-system", *filter(None, [operator_namespace()])]
    # The premise: the tenant may write none of these namespaces itself, nor annotate a Namespace.
    for ns in (other, labelled, *closed):
        assert not tenant.may("create", "configmaps", ns), ns
    assert not tenant.may("patch", "namespaces", namespace)
    assert not tenant.may("create", "copyrators.flant.com", namespace)  # rules are an administrator's tool

    by_name = ",".join([other, *closed])
    for obj in (configmap("by-name", {rules.PUSH_TO_ANNOTATION: by_name}),
                configmap("by-glob", {rules.PUSH_TO_ANNOTATION: "tenant-*"}),
                configmap("everywhere", {rules.PUSH_TO_ANNOTATION: "*"}),
                configmap("by-label", {rules.PUSH_TO_MATCHING_ANNOTATION: f"team={token}"}),
                {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "squat", "annotations": {
                    rules.PUSH_TO_ANNOTATION: by_name}}, "stringData": {"url": "http://127.0.0.1:9/"}}):
        done = tenant.apply(obj)
        assert done.returncode == 0, done.stderr
    # A Warning on each source, counting the namespaces it did not reach by the consent they lack.
    no_consent = f"no {rules.ACCEPT_FROM_ANNOTATION} annotation listing {namespace}"
    warning(core, namespace, "by-name", "PushRefused", f"{len(closed)} ({rules.CLOSED})", f"1 ({no_consent})")
    warning(core, namespace, "by-glob", "PushRefused", no_consent)
    warning(core, namespace, "by-label", "PushRefused", f"1 ({no_consent})")
    warning(core, namespace, "squat", "PushRefused", f"{len(closed)} ({rules.CLOSED})", f"1 ({no_consent})")
    warning(core, namespace, "everywhere", "PushRefused", "without their consent")
    # ... and naming none of them: a push to globs must not list the cluster's namespaces to its owner.
    for name in ("by-name", "by-glob", "by-label", "squat", "everywhere"):
        said = [e.message for e in events(core, namespace, name) if e.reason == "PushRefused"]
        assert said and not [ns for ns in (other, labelled, "kube-system") for m in said if ns in m], said
    stays(lambda: written_outside(core, namespace) == [], 3, what="nothing written outside the tenant's namespace")
    for ns in (other, labelled, *closed):
        for name in ("by-name", "by-glob", "by-label", "everywhere"):
            assert get(core, "ConfigMap", ns, name) is None
        assert get(core, "Secret", ns, "squat") is None

    # The administrator lets tenant B's and C's namespaces consent: the same pushes copy there, and
    # still nowhere else (kube-system and the operator's namespace stay closed).
    core.patch_namespace(other, {"metadata": {"annotations": {rules.ACCEPT_FROM_ANNOTATION: namespace}}})
    core.patch_namespace(labelled, {"metadata": {"annotations": {rules.ACCEPT_FROM_ANNOTATION: "*"}}})
    for ns, name in ((other, "by-name"), (other, "by-glob"), (labelled, "by-glob"), (labelled, "by-label"),
                     (other, "everywhere"), (labelled, "everywhere")):
        wait_data(core, ns, name, {"HTTP_PROXY": "tenant-a's"})
    wait_for(lambda: get(core, "Secret", other, "squat"), timeout=30, what="the consented Secret")
    expected = sorted([f"{other}/by-name", f"{other}/by-glob", f"{labelled}/by-glob", f"{labelled}/by-label",
                       f"{other}/everywhere", f"{labelled}/everywhere", f"{other}/squat"])
    stays(lambda: written_outside(core, namespace) == expected, 2, what="copies only where consented")


def test_copies_pushed_before_consent_existed_are_kept_unsynced_and_reported(
        tenant: Tenant, core: kubernetes.client.CoreV1Api, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    """The upgrade: a copy an earlier version pushed into a namespace that never consented neither
    vanishes nor follows its source any more; the source's Event names it; the administrator keeps it
    (consent, or the marker label removed) or deletes it, and it is not put back."""
    other = make_namespace("tenant-b")
    for name in ("kept", "adopted", "removed"):
        # The sources, and the copies an earlier version pushed (made here as it made them), then the
        # push annotation the new version sees at its start (as after an upgrade).
        done = tenant.apply(configmap(name, {}, data="v1"))
        assert done.returncode == 0, done.stderr
        source = get(core, "ConfigMap", namespace, name) or {}
        source["metadata"]["annotations"] = {rules.PUSH_TO_ANNOTATION: other}
        rule = rules.push_rule(source)
        assert isinstance(rule, rules.Rule)
        core.create_namespaced_config_map(other, copies.desired_copy(rule, source, other))
        tenant.apply(configmap(name, {rules.PUSH_TO_ANNOTATION: other}, data="v1"))
    warning(core, namespace, "kept", "PushRefused", f"{other}/kept", "no longer synced")
    for name in ("kept", "adopted", "removed"):
        tenant.apply(configmap(name, {rules.PUSH_TO_ANNOTATION: other}, data="v2"))
    stays(lambda: all(data_of(core, other, n) == {"HTTP_PROXY": "v1"} for n in ("kept", "adopted", "removed")), 3,
          what="the old copies kept as they were")
    # Keep one as the namespace's own object; delete another: neither is touched or put back.
    kubectl("-n", other, "label", "configmap", "adopted", f"{COPYRATOR_RULE_UID_LABEL}-")
    kubectl("-n", other, "delete", "configmap", "removed")
    # Consent resumes syncing the one still marked.
    core.patch_namespace(other, {"metadata": {"annotations": {rules.ACCEPT_FROM_ANNOTATION: namespace}}})
    wait_data(core, other, "kept", {"HTTP_PROXY": "v2"})
    wait_for(lambda: get(core, "ConfigMap", other, "removed"), timeout=30, what="the removed copy, consented now")
    stays(lambda: data_of(core, other, "adopted") == {"HTTP_PROXY": "v1"}, 2, what="the adopted object untouched")
    warning(core, namespace, "adopted", "ForeignObject", f"{other}/adopted")


@pytest.fixture
def rule_writer(tenant: Tenant, namespace: str) -> Iterator[Tenant]:
    """Tenants may write rules: the chart's aggregated role (operators.copyrator.tenantRules, which the
    chart renders only with rulesNeedTargetConsent) adds CopyratorRules to the built-in admin role,
    which the tenant holds in its namespace (not to edit)."""
    role = [obj for obj in chart_objects(E2E_RELEASE, E2E_RELEASE, "operators.copyrator.tenantRules=true",
                                         "operators.copyrator.rulesNeedTargetConsent=true")
            if obj["kind"] == "ClusterRole" and obj["metadata"]["name"].endswith("-copyrator-rules-admin")]
    assert len(role) == 1
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(role))
    kubectl("create", "rolebinding", "tenant-admin", "-n", namespace, "--clusterrole=admin", f"--user={USER}")
    wait_for(lambda: tenant.may("create", "copyrators.flant.com", namespace), timeout=30,
             what="the admin role aggregating CopyratorRules")
    yield tenant
    kubectl("delete", "clusterrole", role[0]["metadata"]["name"], "--ignore-not-found")


def rule(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": rules.KIND, "metadata": {"name": name}, "spec": spec}


def test_a_tenants_rules_need_the_sources_and_with_the_chart_value_the_targets_consent(
        rule_writer: Tenant, own_operator: Callable[..., OperatorProcess], core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi, namespace: str, make_namespace: Callable[..., str]) -> None:
    other = make_namespace("tenant-b")
    assert not rule_writer.may("create", "copyrators.flant.com", other)
    core.create_namespaced_secret(other, {"metadata": {"name": "creds", "labels": {"share": "x"}},
                                          "stringData": {"password": "b's"}})
    proc = own_operator(COPYRATOR_RULES_NEED_TARGET_CONSENT="true")
    rule_writer.apply(configmap("settings", {}) | {"metadata": {"name": "settings", "labels": {"share": "x"}}})
    # A pull rule without the source's consent: refused, nothing copied into the tenant's namespace.
    done = rule_writer.apply(rule("pull", ruleType="secret", selector={"share": "x"}, namespace=other))
    assert done.returncode == 0, done.stderr
    # A push rule into another tenant's namespace and the closed ones: refused by the targets.
    closed = ["kube-system", *filter(None, [operator_namespace()])]
    done = rule_writer.apply(rule("push", ruleType="configmap", selector={"share": "x"}, namespace=namespace,
                                  targetNamespaces=[other, *closed]))
    assert done.returncode == 0, done.stderr
    try:
        wait_condition(custom, namespace, "pull", "Refused", status="True")
        warning(core, namespace, "push", "TargetRefused", f"{len(closed)} ({rules.CLOSED})",
                f"1 (no {rules.ACCEPT_FROM_ANNOTATION} annotation listing {namespace})")
        stays(lambda: get(core, "Secret", namespace, "creds") is None and written_outside(core, namespace) == [], 2,
              what="nothing copied without consent")
        # It copies nothing anywhere: not Ready, and it says which targets refuse and why.
        refused = wait_condition(custom, namespace, "push", "Ready", status="False", reason="NoTargetConsents")
        assert f"{len(closed) + 1} namespace(s)" in refused["message"] and other not in refused["message"], refused
        core.patch_namespace(other, {"metadata": {"annotations": {rules.ACCEPT_FROM_ANNOTATION: namespace}}})
        wait_data(core, other, "settings", {"HTTP_PROXY": "tenant-a's"})
        wait_condition(custom, namespace, "push", "Ready", status="True")  # it does its job where accepted
        assert written_outside(core, namespace) == [f"{other}/settings"]
        assert not [line for line in proc.errors() if "copyrator" in line.lower()]
    finally:
        delete_rule(custom, namespace, "pull")
        delete_rule(custom, namespace, "push")


# --- what a tenant cannot do to the process -------------------------------------------------------


def test_no_rule_outside_the_operators_namespace_reaches_it_or_kube_system_and_copies_carry_no_project_keys(
        tenant: Tenant, core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi,
        namespace: str, make_namespace: Callable[..., str]) -> None:
    """With the defaults (rules need no target consent): a rule in a tenant's namespace that names
    kube-system and the operator's namespace writes into neither (counted in its Warning, naming
    none); into an ordinary namespace it copies, without the source's project labels and annotations
    (Blackadder's ledger and opt-in labels, a forged re-roller annotation)."""
    other = make_namespace("tenant-b")
    closed = ["kube-system", *filter(None, [operator_namespace()])]
    project = {LEDGER_LABEL: "forged", OPT_LABEL: "true", "reroller.kopf-operators.dev/auto": "true"}
    done = tenant.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "settings", "labels": {"share": "x", "team": "a", **project},
        "annotations": {**project, "note": "kept"}}, "data": {"HTTP_PROXY": "tenant-a's"}})
    assert done.returncode == 0, done.stderr
    custom.create_namespaced_custom_object(G, V, namespace, rules.PLURAL, rule(
        "everywhere", ruleType="configmap", selector={"share": "x"}, namespace=namespace, copyAnnotations=True,
        targetNamespaces=[other, *closed]))
    try:
        wait_data(core, other, "settings", {"HTTP_PROXY": "tenant-a's"})
        copy = get(core, "ConfigMap", other, "settings") or {}
        labels, annotations = copy["metadata"].get("labels") or {}, copy["metadata"].get("annotations") or {}
        assert labels.get("team") == "a" and annotations.get("note") == "kept"
        assert not [key for key in project if key in labels or key in annotations], copy["metadata"]
        said = warning(core, namespace, "everywhere", "TargetRefused", f"{len(closed)} ({rules.CLOSED})")
        assert not [ns for ns in closed if f" {ns}" in said.message], said.message
        stays(lambda: all(get(core, "ConfigMap", ns, "settings") is None for ns in closed), 2,
              what="nothing in the closed namespaces")
        assert written_outside(core, namespace) == [f"{other}/settings"]
    finally:
        delete_rule(custom, namespace, "everywhere")


def test_a_source_over_the_size_cap_is_refused_on_it_and_never_copied(
        tenant: Tenant, core: kubernetes.client.CoreV1Api, namespace: str,
        make_namespace: Callable[..., str]) -> None:
    """A push of more than the cap (256 KiB by default) into a namespace that consents: a Warning
    SourceTooLarge on the source with both sizes, no copy; made small enough, it is copied."""
    other = make_namespace("tenant-b", accept_from=namespace)
    big = "x" * (256 * 1024)
    # create/replace, not apply: apply would copy it into an annotation, which the API server caps at 256 KiB
    done = tenant.kubectl("create", "-n", namespace, "-f", "-",
                          input=yaml.safe_dump(configmap("big", {rules.PUSH_TO_ANNOTATION: other}, data=big)))
    assert done.returncode == 0, done.stderr
    said = warning(core, namespace, "big", "SourceTooLarge", f"hold {len(big) + len('HTTP_PROXY')} bytes",
                   "more than the 262144", "COPYRATOR_MAX_SOURCE_BYTES")
    assert other not in said.message
    stays(lambda: get(core, "ConfigMap", other, "big") is None, 3, what="no copy of the oversized source")
    done = tenant.kubectl("replace", "-n", namespace, "-f", "-", input=yaml.safe_dump(
        configmap("big", {rules.PUSH_TO_ANNOTATION: other}, data="small now")))
    assert done.returncode == 0, done.stderr
    wait_data(core, other, "big", {"HTTP_PROXY": "small now"})
