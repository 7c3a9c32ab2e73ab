"""RBAC is minimal: every permission the chart grants is used, and nothing the operator calls is refused.

Runs last (file name), after every other end-to-end scenario ran with the operator authenticated as
the chart's ServiceAccount (see ``operator_identity`` in conftest). The API server's audit log
(cluster/audit-policy.yaml) records each request of that ServiceAccount; this test compares the
calls with the ClusterRole rendered from the chart.
"""

from __future__ import annotations

import os

import pytest

from tests.kube import E2E_RELEASE, chart_objects
from testsupport.audit import AuditLog, resource_of

Permission = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def granted() -> set[Permission]:
    """Every (apiGroup, resource, verb) of the chart's ClusterRole and Roles."""
    rules = [rule for obj in chart_objects(E2E_RELEASE, E2E_RELEASE) if obj["kind"] in {"ClusterRole", "Role"}
             for rule in obj["rules"]]
    perms: set[Permission] = set()
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    perms.add((group, resource, verb))
    return perms


def used(username: str) -> tuple[set[Permission], list[str]]:
    calls: set[Permission] = set()
    refused: list[str] = []
    for entry in AuditLog().entries():
        if entry.get("user", {}).get("username") != username or "objectRef" not in entry:
            continue
        ref = entry["objectRef"]
        perm = (ref.get("apiGroup", ""), resource_of(entry), entry["verb"])
        # RBAC's own verdict; a 403 from admission (say, a namespace being terminated) is not one.
        if entry.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid":
            refused.append(f"{perm}: {entry.get('responseStatus', {}).get('message', '')}")
        else:
            calls.add(perm)
    return calls, refused


def test_rbac_is_exactly_what_the_operators_use(operator_identity: str) -> None:
    if os.environ.get("OPERATOR_IDENTITY", "serviceaccount") == "admin":
        pytest.fail("OPERATOR_IDENTITY=admin: the operator ran as admin, so RBAC was not exercised")
    calls, refused = used(f"system:serviceaccount:{E2E_RELEASE}:{E2E_RELEASE}")
    assert not refused, "the operator was refused:\n" + "\n".join(sorted(set(refused)))
    grants = granted()
    for group, resource, verb in grants:
        assert "*" not in (group, resource, verb)
    unused = grants - calls
    assert not unused, f"granted but never used by the whole end-to-end suite: {sorted(unused)}"


def test_the_tenant_rbac_is_used_and_sufficient() -> None:
    """The rules `operators.blackadder.tenants.enabled` adds, against the calls of the operator that
    tests/e2e/test_blackadder_tenants.py ran as that release's ServiceAccount."""
    from tests.e2e.test_blackadder_tenants import RELEASE, TENANT_VALUES

    calls, refused = used(f"system:serviceaccount:{RELEASE}:{RELEASE}")
    assert calls, "the tenant operator made no call: did test_blackadder_tenants.py run?"
    assert not refused, "the tenant operator was refused:\n" + "\n".join(sorted(set(refused)))
    on = [rule for obj in chart_objects(RELEASE, RELEASE, *TENANT_VALUES) if obj["kind"] in {"ClusterRole", "Role"}
          and obj["metadata"]["name"] != f"{RELEASE}-blackadder-tenant" for rule in obj["rules"]]
    added = {(group, resource, verb) for rule in on for group in rule["apiGroups"] for resource in rule["resources"]
             for verb in rule["verbs"]} - granted()
    assert added == {("blackadder.io", "tenantchaosagents", v) for v in ("list", "watch", "patch")} | {
        ("blackadder.io", "tenantchaosagents/status", "patch")}
    # Plus list on Secrets in the operator's namespace (the Role; other operators list Secrets cluster-wide,
    # so the set difference hides it): the start-up sweep of orphaned ledgers.
    added.add(("", "secrets", "list"))
    assert added <= calls, f"granted for tenants but never used: {sorted(added - calls)}"
