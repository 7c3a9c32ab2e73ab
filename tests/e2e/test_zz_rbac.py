"""RBAC is minimal: every permission the chart grants is used, and nothing the operator calls is refused;
in deploymentMode perOperator (on the real node), each operator's account uses only its own rights.

Runs last (file name; under `pytest -n`, tests/scheduling.py), after every other end-to-end scenario
ran with the operator authenticated as the chart's ServiceAccount (see ``operator_identity`` in
conftest). The API server's audit log (cluster/audit-policy.yaml; one per cluster of the run) records
each request of that ServiceAccount; this test compares the calls with the ClusterRole rendered from
the chart.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import kubernetes
import pytest

from tests.e2e.realnode import (
    agent_status,
    copy_rule_yaml,
    dry_run_agent_yaml,
    ic_status,
    immortal_yaml,
    install_release,
    observed_hash,
    rerolled_app_yaml,
    template_hash,
    uninstall_release,
    watched_namespaces,
)
from tests.kube import E2E_RELEASE, E2E_VALUES, Grant, account_grants, chart_objects, stays, wait_for
from tests.scheduling import audit_log_paths
from testsupport.audit import AuditLog, audit_now, resource_of
from testsupport.kubectl import apply_yaml, kubectl

Permission = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def granted() -> set[Permission]:
    """Every (apiGroup, resource, verb) of the chart's ClusterRole and Roles."""
    rules = [rule for obj in chart_objects(E2E_RELEASE, E2E_RELEASE, *E2E_VALUES)
             if obj["kind"] in {"ClusterRole", "Role"} for rule in obj["rules"]]
    perms: set[Permission] = set()
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    perms.add((group, resource, verb))
    return perms


def audited(username: str, since: str | None = None) -> tuple[set[Permission], list[str], set[tuple[str, Permission]]]:
    """``username``'s calls in the audit log (after ``since``): the rights used, RBAC's refusals, and
    (namespace, right) of each use."""
    used_rights: set[Permission] = set()
    refused: list[str] = []
    where: set[tuple[str, Permission]] = set()
    entries = (entry for path in audit_log_paths() for entry in AuditLog(path).entries())
    for entry in entries:
        if (entry.get("user", {}).get("username") != username or "objectRef" not in entry
                or (since is not None and entry.get("requestReceivedTimestamp", "") <= since)):
            continue
        ref = entry["objectRef"]
        perm = (ref.get("apiGroup", ""), resource_of(entry), entry["verb"])
        # RBAC's own verdict; a 403 from admission (say, a namespace being terminated) is not one.
        if entry.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid":
            refused.append(f"{perm}: {entry.get('responseStatus', {}).get('message', '')}")
        else:
            used_rights.add(perm)
            where.add((ref.get("namespace", ""), perm))
    return used_rights, refused, where


def test_rbac_is_exactly_what_the_operators_use(operator_identity: str) -> None:
    if os.environ.get("OPERATOR_IDENTITY", "serviceaccount") == "admin":
        pytest.fail("OPERATOR_IDENTITY=admin: the operator ran as admin, so RBAC was not exercised")
    calls, refused, _ = audited(f"system:serviceaccount:{E2E_RELEASE}:{E2E_RELEASE}")
    assert not refused, "the operator was refused:\n" + "\n".join(sorted(set(refused)))
    grants = granted()
    for group, resource, verb in grants:
        assert "*" not in (group, resource, verb)
    unused = grants - calls
    assert not unused, f"granted but never used by the whole end-to-end suite: {sorted(unused)}"


def test_the_tenant_rbac_is_used_and_sufficient() -> None:
    """The rules `operators.blackadder.tenants.enabled` adds, against the calls of the operator that
    tests/e2e/test_blackadder_tenants.py ran as that release's ServiceAccount."""
    from tests.e2e.blackadder_helpers import RELEASE, TENANT_VALUES

    calls, refused, _ = audited(f"system:serviceaccount:{RELEASE}:{RELEASE}")
    assert calls, "the tenant operator made no call: did test_blackadder_tenants.py run?"
    assert not refused, "the tenant operator was refused:\n" + "\n".join(sorted(set(refused)))
    on = [rule for obj in chart_objects(RELEASE, RELEASE, *E2E_VALUES, *TENANT_VALUES)
          if obj["kind"] in {"ClusterRole", "Role"} and obj["metadata"]["name"] != f"{RELEASE}-blackadder-tenant"
          for rule in obj["rules"]]
    added = {(group, resource, verb) for rule in on for group in rule["apiGroups"] for resource in rule["resources"]
             for verb in rule["verbs"]} - granted()
    assert added == {("blackadder.io", "tenantchaosagents", v) for v in ("list", "watch", "patch")} | {
        ("blackadder.io", "tenantchaosagents/status", "patch")}
    # Plus list on Secrets in the operator's namespace (the Role; other operators list Secrets cluster-wide,
    # so the set difference hides it): the start-up sweep of orphaned ledgers.
    added.add(("", "secrets", "list"))
    assert added <= calls, f"granted for tenants but never used: {sorted(added - calls)}"


# --- deploymentMode perOperator on the real node: each account uses only its own rights ---------------

PER_OPERATOR = "deploymentMode=perOperator"
# Two releases side by side, one per operator group, each watching namespaces of its own.
GROUPS = {
    "kopf-perop-a": ("operators.blackadder.enabled=false", "operators.reroller.enabled=false"),
    "kopf-perop-b": ("operators.immortal.enabled=false", "operators.copyrator.enabled=false"),
}
TEST_LABEL = "kopf-operators.dev/rbac-test"


def covered(grants: set[Grant], namespace: str, right: tuple[str, str, str]) -> bool:
    return ("*", *right) in grants or (bool(namespace) and (namespace, *right) in grants)


@pytest.fixture(scope="module")
def two_releases(operator_image: str, host_operator_paused: None, core: kubernetes.client.CoreV1Api,
                 crds: None) -> Iterator[tuple[dict[str, tuple[str, ...]], str]]:
    """Release a (Immortal, Copyrator) watching two namespaces, release b (the re-roller, Blackadder)
    watching a third, both per operator, one replica each (on a Lease): what each watches, once both
    are Ready, and the moment before they were installed (audit_now)."""
    run = uuid.uuid4().hex[:5]
    since = audit_now()
    with (watched_namespaces(core, (f"perop-a1-{run}", f"perop-a2-{run}"), {TEST_LABEL: run}) as mine,
          watched_namespaces(core, (f"perop-b-{run}",), {TEST_LABEL: f"{run}-b"}) as theirs):
        spaces = dict(zip(GROUPS, (mine, theirs), strict=True))
        try:
            for release, values in GROUPS.items():
                install_release(core, release, release, spaces[release], PER_OPERATOR, "replicaCount=1",
                                *values, replicas=2)
            yield spaces, since
        finally:
            for release in GROUPS:
                uninstall_release(release, release, spaces[release], agents=f"{TEST_LABEL}={run}-b")


def test_per_operator_accounts_use_only_their_own_rights_and_releases_keep_apart(
        real_node: str, two_releases: tuple[dict[str, tuple[str, ...]], str], core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api, custom: kubernetes.client.CustomObjectsApi) -> None:
    watched, since = two_releases
    (a1, a2), (b,) = watched["kopf-perop-a"], watched["kopf-perop-b"]
    run = a1.rsplit("-", 1)[1]
    # Release a: an immortal pod, a copy from a1 into a2.
    apply_yaml(immortal_yaml("sleeper"), namespace=a1)
    wait_for(lambda: ic_status(custom, a1, "sleeper").get("startTimes") == 1, timeout=60, what="immortal start")
    apply_yaml(copy_rule_yaml(a1, TEST_LABEL, run), namespace=a1)
    wait_for(lambda: core.read_namespaced_config_map("shared", a2).data == {"greeting": "hello"},
             timeout=60, what="the copy in a2")
    # Release b: a rollout after a ConfigMap change, a dry-run agent's cycle on b.
    apply_yaml(rerolled_app_yaml(), namespace=b)
    wait_for(lambda: observed_hash(apps, b), timeout=60, what="the re-roller's baseline")
    core.patch_namespaced_config_map("app-conf", b, {"data": {"level": "2"}})
    wait_for(lambda: template_hash(apps, b), timeout=60, what="the rollout")
    agent = f"perop-dry-{run}"
    apply_yaml(dry_run_agent_yaml(agent, TEST_LABEL, f"{run}-b", b))
    wait_for(lambda: agent_status(custom, agent).get("cycle", 0) >= 1, timeout=60, what="a dry-run cycle")
    # Neither release acts on the other's namespaces: an ImmortalContainer in b gets no pod.
    apply_yaml(immortal_yaml("stranger"), namespace=b)
    stays(lambda: not core.list_namespaced_pod(b, field_selector="metadata.name=stranger-immortalpod").items
          and not ic_status(custom, b, "stranger").get("startTimes"), seconds=5,
          what="no pod for an object release a does not watch")
    kubectl("delete", "chaosagent", agent, "--timeout=60s")
    for release, values in GROUPS.items():
        spaces = ",".join(watched[release])
        objects = chart_objects(release, release, PER_OPERATOR, f"watchNamespaces={{{spaces}}}", *values)
        others = {ns for name, names in watched.items() if name != release for ns in names}
        grants = account_grants(objects)
        assert len(grants) == 2
        for account, mine in grants.items():
            used, refused, where = audited(f"system:serviceaccount:{account.replace('/', ':')}", since)
            assert used, f"{account} made no call: did its operator run?"
            assert not refused, f"{account} was refused:\n" + "\n".join(sorted(set(refused)))
            beyond = {(ns, *right) for ns, right in where if not covered(mine, ns, right)}
            assert not beyond, f"{account} used rights that are not its own: {sorted(beyond)}"
            assert not {ns for ns, _ in where} & others, f"{account} reached into the other release's namespaces"
