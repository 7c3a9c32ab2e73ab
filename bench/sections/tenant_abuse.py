"""tenant_abuse: the operator's event-loop lag while a tenant abuses every path at once.

The operator restarts with the chart's tenant settings (tenant chaos on, its hosts localhost, rules
needing their targets' consent, the operator's namespace set). Its gauge
``kopf_operators_event_loop_lag_seconds`` (the largest lag in the last 10 s) is read from its metrics
endpoint every second: over a quiet baseline, then while a tenant, impersonated by the harness, writes
the abuse of tests/e2e/test_tenant_abuse.py (testsupport/tenant_abuse.py: a backtracking reload
pattern, a TenantChaosAgent with its most checks against a host that trickles one byte a second, a rule
copying a ledger-like Secret into other namespaces, ConfigMaps over the size cap, unconsented pushes,
and an agent in a namespace no administrator allowed). In each phase a bystander's ConfigMap is edited
once → its Deployment's pod template changed (on the harness's watch).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness import SA_NAMESPACE, Bench, deployment, log, timed_change, within
from bench.kube import ApiError, Kube, Watcher
from bench.sections.reroller_latency import baseline, template_annotations, template_changed
from kopf_operators.blackadder.settings import (
    TENANT_KIND,
    TENANT_NAMESPACE_LABEL,
    TENANT_NAMESPACE_VALUE,
    TENANT_PLURAL,
)
from kopf_operators.copyrator.rules import KIND as RULE_KIND
from kopf_operators.copyrator.rules import PLURAL as RULE_PLURAL
from testsupport.paths import KUBECONFIG
from testsupport.stats import summary_ms
from testsupport.tenant_abuse import SlowHost, elsewhere_agent, tenant_objects

LAG = "kopf_operators_event_loop_lag_seconds"
TENANT = "bench-tenant"  # the impersonated user
TENANT_ROLE = "kopf-bench-tenant"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
# The chart's environment with operators.blackadder.tenants.enabled, httpHosts=localhost and the
# e2e test's minimums, operators.copyrator.rulesNeedTargetConsent, and its namespace (the ServiceAccount's).
TENANT_ENV = {"CHAOS_DRY_RUN": "false", "CHAOS_TENANTS": "true", "CHAOS_TENANT_HTTP_HOSTS": "localhost",
              "CHAOS_TENANTS_MIN_PAUSE_SECONDS": "5", "CHAOS_TENANTS_MIN_CHECK_INTERVAL_SECONDS": "1",
              "COPYRATOR_RULES_NEED_TARGET_CONSENT": "true", "OPERATOR_NAMESPACE": SA_NAMESPACE}


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("copyrator", "reroller", "blackadder"):
        return skipped
    previous = b.operator_env
    b.restart_operator({**previous, **TENANT_ENV})
    host = SlowHost()
    tenant_kube = Kube(KUBECONFIG, impersonate=TENANT)
    tenant, elsewhere, by = (f"bench-tab-{p}-{b.run}" for p in ("t", "u", "b"))
    try:
        return await _measure(b, host, tenant_kube, tenant, elsewhere, by)
    finally:
        await tenant_kube.close()
        host.close()
        await b.cleanup([tenant, elsewhere, by])
        await b.kube.delete(f"{RBAC}/clusterroles/{TENANT_ROLE}")
        b.restart_operator(previous)


async def _measure(b: Bench, host: SlowHost, tenant_kube: Kube, tenant: str, elsewhere: str,
                   by: str) -> dict[str, Any]:
    assert b.operator
    await b.namespace(tenant, {TENANT_NAMESPACE_LABEL: TENANT_NAMESPACE_VALUE})
    await b.namespace(elsewhere)
    await b.namespace(by)
    # The tenant: admin of its two namespaces, with CopyratorRules and TenantChaosAgents there (what the
    # chart's aggregated rules role and its blackadder-tenant role grant).
    await b.create_retrying(f"{RBAC}/clusterroles", {"metadata": {"name": TENANT_ROLE}, "rules": [
        {"apiGroups": ["flant.com"], "resources": ["copyrators"], "verbs": ["*"]},
        {"apiGroups": ["blackadder.io"], "resources": ["tenantchaosagents"], "verbs": ["*"]}]})
    for ns in (tenant, elsewhere):
        for role in ("admin", TENANT_ROLE):
            await b.kube.create(f"{RBAC}/namespaces/{ns}/rolebindings", {
                "metadata": {"name": f"tenant-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}]})

    # The bystander: a ConfigMap and an opted-in Deployment reading it, baselined by the re-roller.
    deps = await Watcher(b.kube, f"/apis/apps/v1/namespaces/{by}/deployments").start()
    cms = await Watcher(b.kube, f"/api/v1/namespaces/{by}/configmaps").start()
    await b.kube.create(f"/api/v1/namespaces/{by}/configmaps", {"metadata": {"name": "conf"}, "data": {"v": "0"}})
    await b.kube.create(f"/apis/apps/v1/namespaces/{by}/deployments", deployment("web", "conf", True))
    await baseline(b, deps, "web")
    last = {"web": template_annotations(await b.kube.get(f"/apis/apps/v1/namespaces/{by}/deployments/web"))}

    async def bystander(value: str) -> float:
        into: list[float] = []
        done = deps.expect(template_changed("web", last))
        seen = cms.expect(lambda t, o, _: o["metadata"]["name"] == "conf" and o.get("data", {}).get("v") == value)
        await timed_change(b, b.kube.merge_patch(f"/api/v1/namespaces/{by}/configmaps/conf", {"data": {"v": value}}),
                           done, seen, "the bystander's Deployment to roll", into, None)
        return into[0]

    await b.operator.settle()
    quiet_s, abuse_s = b.n["tenant_baseline"], b.n["tenant_abuse"]
    quiet = asyncio.create_task(_sample(b, quiet_s))
    await asyncio.sleep(quiet_s / 2)
    quiet_reaction = await bystander("quiet")
    lag_quiet = await quiet

    abused = asyncio.create_task(_sample(b, abuse_s))
    abuse_started = time.monotonic()
    refused: list[str] = []
    for obj in tenant_objects(host.port, tenant, [SA_NAMESPACE, "kube-system", by]):
        refused += await _as_tenant(tenant_kube, tenant, obj)
    refused += await _as_tenant(tenant_kube, elsewhere, elsewhere_agent(host.port))
    await within(_until(lambda: host.sent("/hog") >= 4), 60, "the tenant's checks holding the slow host")
    edited_after = time.monotonic() - abuse_started
    abuse_reaction = await bystander("abused")
    lag_abuse = await abused
    await deps.stop()
    await cms.stop()
    result: dict[str, Any] = {
        "what": (f"{LAG} (the largest event-loop lag in the last 10 s) read every second: {quiet_s} s quiet, then "
                 f"{abuse_s} s from the first of the tenant's writes (as the impersonated user {TENANT!r}: admin of "
                 "its namespaces, with CopyratorRules and TenantChaosAgents); in each phase one bystander ConfigMap "
                 "edit → its Deployment's pod template changed"),
        "writer": f"impersonated tenant {TENANT}",
        "lag_quiet": summary_ms(lag_quiet, (0.5,)),
        "lag_abuse": summary_ms(lag_abuse, (0.5,)),
        "bystander_quiet_ms": round(quiet_reaction * 1000, 1),
        "bystander_abuse_ms": round(abuse_reaction * 1000, 1),
        "bystander_abuse_edited_after_s": round(edited_after, 1),  # from the first of the tenant's writes
        "refused_writes": refused,
        "slow_host_requests": {"hog": host.sent("/hog"), "elsewhere": host.sent("/elsewhere")},
        "operator_errors": len(b.operator.errors()),
    }
    log(f"  lag p50/max quiet {result['lag_quiet']['p50_ms']}/{result['lag_quiet']['max_ms']} ms, under abuse "
        f"{result['lag_abuse']['p50_ms']}/{result['lag_abuse']['max_ms']} ms; bystander "
        f"{result['bystander_quiet_ms']} / {result['bystander_abuse_ms']} ms")
    return result


async def _sample(b: Bench, seconds: int) -> list[float]:
    """The lag gauge, once a second for ``seconds`` (read in a thread: the harness's loop keeps watching)."""
    assert b.operator
    values: list[float] = []
    started = time.monotonic()
    for i in range(seconds):
        values.append(await asyncio.to_thread(b.operator.metric, LAG))
        await asyncio.sleep(max(0.0, started + i + 1 - time.monotonic()))
    return values


async def _as_tenant(kube: Kube, namespace: str, obj: dict[str, Any]) -> list[str]:
    """Create ``obj`` as the tenant; a refusal (the API server's, or an admission policy's) is recorded, as
    the e2e test expects every one of these writes to be accepted."""
    resource = {"ConfigMap": "configmaps", "Secret": "secrets", "Deployment": "deployments", RULE_KIND: RULE_PLURAL,
                TENANT_KIND: TENANT_PLURAL}[obj["kind"]]
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    try:
        await kube.create(f"{base}/namespaces/{namespace}/{resource}", obj)
    except ApiError as exc:
        return [f"{obj['kind']} {obj['metadata']['name']}: {exc}"]
    return []


async def _until(check: Any) -> None:
    """Until ``check()`` holds: a local counter of the slow host (not the API), looked at every 0.2 s."""
    while not check():
        await asyncio.sleep(0.2)
