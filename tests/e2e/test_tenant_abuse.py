"""What a tenant cannot do to the shared process, end to end: a user who may write only in its own
namespace (the built-in ``admin`` role there, with the chart's aggregated CopyratorRule rights and its
TenantChaosAgent role; impersonated with ``kubectl --as``) tries every path at once against one process
of all four operators, run as the chart deploys it (its ServiceAccount and RBAC, its environment, two
replicas on a Lease):

- a reload pattern that backtracks for ever in Python's ``re`` beside a ConfigMap of 40 ``a``s, and one
  that no linear-time engine runs (a backreference);
- ConfigMaps over the size cap and many unconsented pushes;
- a TenantChaosAgent with its most checks against a host that trickles one byte a second and a
  catastrophic ``podNames`` pattern; one whose check URL carries a token; another in a namespace no
  administrator allowed;
- a CopyratorRule that copies a Secret dressed as a Blackadder ledger into the operator's namespace and
  kube-system.

Meanwhile, in a bystander namespace, the process keeps its promises: an ImmortalContainer's deleted pod
is replaced, a ConfigMap change rolls its Deployment, and the Lease stays with its holder. Afterwards
nothing was written outside the tenant's namespace, and the token is in no log line, Event or custom
resource.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from kopf_operators.blackadder.settings import (
    GROUP as CHAOS_GROUP,
)
from kopf_operators.blackadder.settings import (
    TENANT_KIND,
    TENANT_NAMESPACE_LABEL,
    TENANT_NAMESPACE_VALUE,
    TENANT_PLURAL,
    ledger_name,
)
from kopf_operators.blackadder.settings import (
    VERSION as CHAOS_VERSION,
)
from kopf_operators.core.conventions import COPY_SOURCE, COPYRATOR_RULE_UID_LABEL
from kopf_operators.reroller.settings import AUTO
from tests.e2e.immortal_helpers import create_ic, delete_pod, wait_pod
from tests.e2e.reroller_helpers import baseline, configmap, deployment, nginx_pod_spec, set_cm, template_hash
from tests.kube import (
    E2E_VALUES,
    OperatorProcess,
    chart_objects,
    delete_namespaces,
    namespace_exists,
    stays,
    wait_for,
)
from testsupport.kubectl import kubectl
from testsupport.paths import CLUSTER_DIR
from testsupport.tenant_abuse import SlowHost, elsewhere_agent, tenant_objects
from testsupport.tokens import token_kubeconfig

RELEASE = "kopf-operators-abuse"
USER = "tenant-abuser"
LEASE = RELEASE  # the chart grants its Lease by name
# The chart's values for a platform that lets teams write their own rules and chaos: tenants' chaos on,
# its hosts a list of their own (localhost: the trickling host), their rules needing targets' consent.
VALUES = (*E2E_VALUES, "operators.blackadder.tenants.enabled=true", "operators.blackadder.tenants.httpHosts=localhost",
          "operators.blackadder.tenants.minPauseSeconds=5", "operators.blackadder.tenants.minCheckIntervalSeconds=1",
          "operators.copyrator.tenantRules=true", "operators.copyrator.rulesNeedTargetConsent=true")
TOKEN = f"tok{uuid.uuid4().hex}"


def chart_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The operator container's environment as the chart renders it (its literal values; the metrics
    port is left to the test processes, one free port each)."""
    deployment_ = next(obj for obj in objects if obj["kind"] == "Deployment")
    container = deployment_["spec"]["template"]["spec"]["containers"][0]
    return {var["name"]: str(var["value"]) for var in container.get("env", [])
            if "value" in var and var["name"] != "METRICS_PORT"}


class Platform:
    """The process of the chart with ``VALUES`` (two replicas on a Lease, as its ServiceAccount), the
    tenant's two namespaces (one allowed tenant chaos by the administrator, one not), a bystander's."""

    def __init__(self, core: kubernetes.client.CoreV1Api) -> None:
        run = uuid.uuid4().hex[:5]
        self.tenant, self.elsewhere, self.bystander = (f"abuse-{p}-{run}" for p in ("t", "u", "b"))
        kubectl("create", "namespace", RELEASE, check=False)
        for name in (self.tenant, self.elsewhere, self.bystander):
            core.create_namespace({"metadata": {"name": name, "labels": {"kopf-operators.dev/test": "true"}}})
        core.patch_namespace(self.tenant, {"metadata": {"labels": {TENANT_NAMESPACE_LABEL: TENANT_NAMESPACE_VALUE}}})
        objects = chart_objects(RELEASE, RELEASE, *VALUES)
        self.rbac = [obj for obj in objects if obj["kind"] in
                     {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}]
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(self.rbac))
        for name in (self.tenant, self.elsewhere):  # the tenant: admin of its namespaces, and their chaos
            kubectl("create", "rolebinding", "tenant-admin", "-n", name, "--clusterrole=admin", f"--user={USER}")
            kubectl("create", "rolebinding", "tenant-chaos", "-n", name, f"--clusterrole={RELEASE}-blackadder-tenant",
                    f"--user={USER}")
        config = token_kubeconfig(RELEASE, RELEASE, CLUSTER_DIR / "abuse-operator.kubeconfig")
        self.host = SlowHost()
        env = {**chart_env(objects), "OPERATOR_NAMESPACE": RELEASE, "LEASE_NAMESPACE": RELEASE,
               "LEADER_ELECTION": "true"}
        self.replicas = [OperatorProcess(env=env, kubeconfig=config, log_name=f"abuse-{i}") for i in range(2)]
        kubectl("delete", "lease", "-n", RELEASE, LEASE, "--ignore-not-found")

    def start(self) -> None:
        for proc in self.replicas:
            proc.start()

    def holder(self) -> str:
        out = kubectl("get", "lease", "-n", RELEASE, LEASE, "-o", "jsonpath={.spec.holderIdentity}", check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    def as_tenant(self, obj: dict[str, Any], namespace: str = "") -> Any:
        return kubectl("--as", USER, "create", "-n", namespace or self.tenant, "-f", "-", check=False,
                       input=yaml.safe_dump(obj))

    def logs(self) -> str:
        return "".join(proc.output() for proc in self.replicas)

    def close(self, core: kubernetes.client.CoreV1Api) -> None:
        """The namespaces go first, while the replicas still run (the agents' finalizers are theirs), and
        are gone before the next operator starts: one started beside a namespace being deleted posts its
        refusals' Events into it, which the API server refuses."""
        names = [self.tenant, self.elsewhere, self.bystander]
        delete_namespaces(core, names)
        try:
            wait_for(lambda: not any(namespace_exists(core, name) for name in names), timeout=120,
                     what="the abuse's namespaces to be gone")
        finally:
            for proc in self.replicas:
                proc.stop()
            self.host.close()
        for obj in self.rbac:
            if obj["kind"] in {"ClusterRole", "ClusterRoleBinding"}:
                kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found")


@pytest.fixture(scope="module")
def platform(operator_process: OperatorProcess, crds: None, core: kubernetes.client.CoreV1Api) -> Iterator[Platform]:
    """The session's operator stops meanwhile (two processes would both act)."""
    operator_process.stop()
    made = Platform(core)
    try:
        made.start()
        wait_for(made.holder, timeout=60, what="a replica to take the Lease")
        yield made
        errors = [line for proc in made.replicas for line in proc.errors()]
        assert not errors, errors
    finally:
        made.close(core)
        operator_process.start()


def written_outside(core: kubernetes.client.CoreV1Api, tenant: str) -> list[str]:
    """Every Copyrator copy anywhere whose source is in the tenant's namespace ("ns/name")."""
    found = []
    for listing in (core.list_config_map_for_all_namespaces, core.list_secret_for_all_namespaces):
        for obj in listing(label_selector=COPYRATOR_RULE_UID_LABEL).items:
            if (obj.metadata.annotations or {}).get(COPY_SOURCE, "").startswith(f"{tenant}/"):
                found.append(f"{obj.metadata.namespace}/{obj.metadata.name}")
    return found


def warnings(core: kubernetes.client.CoreV1Api, namespace: str, reason: str) -> list[Any]:
    return [e for e in core.list_namespaced_event(namespace).items if e.type == "Warning" and e.reason == reason]


def test_a_tenant_abusing_every_path_stalls_starves_and_steers_nothing(
        platform: Platform, core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    by = platform.bystander
    # The bystander's workloads, serving before the abuse starts.
    configmap(core, by, "conf", {"nginx.conf": "v1"})
    deployment(apps, by, "web", nginx_pod_spec("conf"), {AUTO: "true"})
    baseline(apps, by, "web")
    create_ic(custom, by, "keeper")
    pod = wait_pod(core, by, "keeper-immortalpod")
    holder = platform.holder()

    for obj in tenant_objects(platform.host.port, platform.tenant, [RELEASE, "kube-system", by]):
        done = platform.as_tenant(obj)
        assert done.returncode == 0, f"{obj['kind']} {obj['metadata']['name']}: {done.stderr}"
    # A check URL carrying a token is refused when written (the API server tells its writer what it
    # wrote): never stored.
    leaky = platform.as_tenant({"apiVersion": f"{CHAOS_GROUP}/{CHAOS_VERSION}", "kind": TENANT_KIND,
                                "metadata": {"name": "leaky"}, "spec": {"eagerness": 0, "steadyState": {"checks": [{
                                    "name": "c", "http": {"url": f"http://user:{TOKEN}@localhost/x"}}]}}})
    assert leaky.returncode != 0 and "may not carry credentials" in leaky.stderr, leaky.stderr
    outside = platform.as_tenant(elsewhere_agent(platform.host.port), namespace=platform.elsewhere)
    assert outside.returncode == 0, outside.stderr
    wait_for(lambda: platform.host.sent("/hog") >= 4, timeout=60, what="the tenant's checks holding the slow host")

    # Meanwhile the bystander is served: its pod replaced, its change rolled, the Lease kept.
    delete_pod(core, by, "keeper-immortalpod")
    wait_pod(core, by, "keeper-immortalpod", not_uid=pod.metadata.uid, timeout=15)
    set_cm(core, by, "conf", {"nginx.conf": "v2"})
    wait_for(lambda: template_hash(apps, by, "web"), timeout=30, what="the bystander's Deployment rolled")
    assert platform.holder() == holder

    # The tenant is answered, in its own namespace: each refusal says why.
    wait_for(lambda: warnings(core, platform.tenant, "PatternRefused"), timeout=30, what="PatternRefused")
    too_large = wait_for(lambda: len(warnings(core, platform.tenant, "SourceTooLarge")) >= 3 or None, timeout=60,
                         what="SourceTooLarge on each big ConfigMap")
    assert too_large
    refused = wait_for(lambda: warnings(core, platform.tenant, "PushRefused"), timeout=60, what="PushRefused")
    namespaces = {ns.metadata.name for ns in core.list_namespace().items} - {platform.tenant}
    assert not [ns for e in refused for ns in namespaces if f" {ns}" in e.message or f"{ns}," in e.message]
    # The agent in the namespace no administrator allowed sends nothing, its checks neither.
    stays(lambda: platform.host.sent("/elsewhere") == 0, seconds=5, what="no check from the agent not allowed")
    assert platform.holder() == holder

    # Nothing was written outside the tenant's namespace; the token is nowhere.
    assert written_outside(core, platform.tenant) == []
    assert [s.metadata.name for s in core.list_namespaced_secret(RELEASE).items
            if s.metadata.name == ledger_name("hog") and (s.metadata.labels or {}).get(COPYRATOR_RULE_UID_LABEL)] == []
    assert TOKEN not in platform.logs()
    assert TOKEN not in kubectl("get", "events", "-A", "-o", "json").stdout
    assert TOKEN not in json.dumps(custom.list_cluster_custom_object(CHAOS_GROUP, CHAOS_VERSION, TENANT_PLURAL))
    assert apps.read_namespaced_deployment("web", by).spec.replicas == 1
