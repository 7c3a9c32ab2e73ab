"""Blackadder, issue #23: chaos for tenants. A team bound only to the chart's tenant ClusterRole in its
own namespace creates TenantChaosAgents there and nowhere else; an agent never touches another
namespace's pods, whatever its spec says, and stays within the administrator's limits. Real local API
server (KWOK-backed pods); the operator runs as the chart's ServiceAccount with tenants enabled.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from kopf_operators.blackadder import settings
from tests.e2e.blackadder_helpers import (
    LIMITS,
    RELEASE,
    TENANT_VALUES,
    condition,
    events,
    live_pods,
    make_deployment,
    make_pod,
    make_pods,
    render,
)
from tests.kube import E2E_VALUES, OperatorProcess, chart_objects, delete_namespaces, stays, wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, REPO, helm_binary, kube_version
from testsupport.tokens import token_kubeconfig

G, V, P = settings.GROUP, settings.VERSION, settings.TENANT_PLURAL
ENV = {"CHAOS_TENANTS": "true", "CHAOS_TENANTS_MAX_KILLS_PER_CYCLE": LIMITS["maxKillsPerCycle"],
       "CHAOS_TENANTS_MIN_PAUSE_SECONDS": LIMITS["minPauseSeconds"], "CHAOS_DRY_RUN": "false",
       "OPERATOR_NAMESPACE": RELEASE, "CHAOS_TENANT_HTTP_HOSTS": "127.0.0.1",
       "CHAOS_TENANTS_MIN_CHECK_INTERVAL_SECONDS": "1"}


# --- the operator with tenants on, and a team ---------------------------------------------------------


@pytest.fixture(scope="module")
def tenant_operator(operator_process: OperatorProcess, crds: None) -> Iterator[OperatorProcess]:
    """Blackadder as the chart deploys it with tenants enabled: its ServiceAccount, exactly the chart's
    RBAC. The session's operator stops meanwhile (two operators would both serve ChaosAgents)."""
    kubectl("create", "namespace", RELEASE, check=False)
    rbac = [obj for obj in chart_objects(RELEASE, RELEASE, *E2E_VALUES, *TENANT_VALUES)
            if obj["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}]
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(rbac))
    config = token_kubeconfig(RELEASE, RELEASE, CLUSTER_DIR / "tenants-operator.kubeconfig")
    operator_process.stop()
    proc = OperatorProcess(files=[str(REPO / "operators" / "blackadder.py")], env=ENV, kubeconfig=config,
                           log_name="tenants")
    proc.start()
    yield proc
    proc.stop()
    operator_process.start()
    assert not proc.errors(), proc.errors()


class Team:
    """A ServiceAccount bound (RoleBinding) to the chart's tenant ClusterRole in its namespace only."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.user = f"system:serviceaccount:{namespace}:team"
        kubectl("create", "serviceaccount", "team", "-n", namespace)
        kubectl("create", "rolebinding", "team-chaos", "-n", namespace, f"--clusterrole={RELEASE}-blackadder-tenant",
                f"--serviceaccount={namespace}:team")

    def apply(self, text: str, namespace: str | None = None, *flags: str) -> Any:
        return kubectl("apply", "--as", self.user, "-n", namespace or self.namespace, *flags, "-f", "-",
                       input=text, check=False)


def agent_yaml(name: str, spec: dict[str, Any], kind: str = settings.TENANT_KIND) -> str:
    return yaml.safe_dump({"apiVersion": f"{G}/{V}", "kind": kind, "metadata": {"name": name}, "spec": spec})


@pytest.fixture
def team(tenant_operator: OperatorProcess, namespace: str,
         custom: kubernetes.client.CustomObjectsApi) -> Iterator[Team]:
    yield Team(namespace)
    for item in custom.list_namespaced_custom_object(G, V, namespace, P)["items"]:  # the operator still runs
        custom.delete_namespaced_custom_object(G, V, namespace, P, item["metadata"]["name"])
    wait_for(lambda: not custom.list_namespaced_custom_object(G, V, namespace, P)["items"], timeout=30,
             what="the tenant agents to be deleted")


@pytest.fixture
def neighbour(namespace: str, core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    """Another team's namespace, allowed for tenant chaos too (the most tempting target)."""
    name = f"{namespace}-n"
    core.create_namespace({"metadata": {"name": name, "labels": {
        "kopf-operators.dev/test": "true", settings.TENANT_NAMESPACE_LABEL: settings.TENANT_NAMESPACE_VALUE}}})
    yield name
    delete_namespaces(core, [name])


def allow(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": {
        settings.TENANT_NAMESPACE_LABEL: settings.TENANT_NAMESPACE_VALUE}}})


def status(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return dict(custom.get_namespaced_custom_object(G, V, namespace, P, name).get("status") or {})


def ledger(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> dict[str, Any] | None:
    secret_name = settings.tenant_ledger_name(settings.tenant_agent_id(namespace, name))
    try:
        secret = core.read_namespaced_secret(secret_name, RELEASE)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(json.loads(base64.b64decode(secret.data[settings.LEDGER_KEY])))


# Every field a ChaosAgent has that could reach further: the schema prunes them.
REACHING = {"targetNamespaces": ["NEIGHBOUR"], "namespaceSelector": {"matchLabels": {
    settings.TENANT_NAMESPACE_LABEL: settings.TENANT_NAMESPACE_VALUE}}, "excludedNamespaces": ["NAMESPACE"],
    "cancerMode": True, "ipsumMode": True, "webhook": {"secretRef": {"name": "hook"}}, "tantrumMode": True}


# --- tests ------------------------------------------------------------------------------------------


def test_a_team_can_create_agents_only_in_its_own_namespace(team: Team, neighbour: str) -> None:
    assert team.apply(agent_yaml("mine", {"eagerness": 0, "paused": True})).returncode == 0
    elsewhere = team.apply(agent_yaml("theirs", {"eagerness": 0, "paused": True}), namespace=neighbour)
    assert elsewhere.returncode != 0 and "forbidden" in elsewhere.stderr.lower(), elsewhere.stderr
    cluster_wide = team.apply(agent_yaml("everywhere", {"eagerness": 0, "paused": True}, kind=settings.KIND))
    assert cluster_wide.returncode != 0 and "forbidden" in cluster_wide.stderr.lower(), cluster_wide.stderr
    # Nor do they get the pods through the role: only the operator deletes them.
    cannot = kubectl("auth", "can-i", "delete", "pods", "--as", team.user, "-n", team.namespace, check=False)
    assert cannot.stdout.strip() == "no"


def test_an_agent_with_every_field_kills_only_in_its_namespace_within_the_limits(
        team: Team, neighbour: str, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    ns = team.namespace
    allow(core, ns)
    make_pods(core, ns, "own", 6)
    make_pods(core, neighbour, "their", 3)
    wait_for(lambda: len(live_pods(core, ns)) == 6 and len(live_pods(core, neighbour)) == 3, timeout=30,
             what="the pods")
    theirs = live_pods(core, neighbour)
    spec = {**json.loads(json.dumps(REACHING).replace("NEIGHBOUR", neighbour).replace("NAMESPACE", ns)),
            "eagerness": 100, "pauseDuration": 5, "maxKillsPerCycle": 50, "allowSingleReplica": True}
    refused = team.apply(agent_yaml("gremlin", spec))
    assert refused.returncode != 0 and 'unknown field "spec.targetNamespaces"' in refused.stderr, refused.stderr
    # Without kubectl's field validation the API server prunes them: no field can name a namespace.
    assert team.apply(agent_yaml("gremlin", spec), None, "--validate=false").returncode == 0
    stored = custom.get_namespaced_custom_object(G, V, ns, P, "gremlin")["spec"]
    assert not set(REACHING) & set(stored), stored
    wait_for(lambda: (status(custom, ns, "gremlin").get("cycle") or 0) >= 2, timeout=40, what="two cycles")
    agent = status(custom, ns, "gremlin")
    assert agent["lastCycle"]["tantrum"] == 2, agent  # 50 in the spec, 2 by the administrator's limit
    assert condition(agent, "Ready")["status"] == "True"
    assert len(live_pods(core, ns)) <= 2
    assert live_pods(core, neighbour) == theirs
    assert not [e for e in events(core, "PodKilled", namespace=neighbour)]
    # The ledger is in the operator's namespace, not the team's (a tenant could otherwise edit it).
    record = ledger(core, ns, "gremlin")
    assert record is not None and record["counts"]["tantrum"] >= 4 and record["undo"] == {}
    assert not [s for s in core.list_namespaced_secret(ns).items if s.metadata.name.startswith("blackadder")]


class Counted(http.server.BaseHTTPRequestHandler):
    """A check's host on 127.0.0.1 (on the tenants' list) that counts the GETs it gets."""

    gets = 0

    def do_GET(self) -> None:
        Counted.gets += 1
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


def test_an_agent_in_a_namespace_not_allowed_by_the_administrator_does_nothing(
        team: Team, core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi) -> None:
    """Nothing at all: no kill, and not one of its steady-state checks (the scope is decided first)."""
    ns = team.namespace
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counted)
    Counted.gets = 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    make_pod(core, ns, "victim")
    wait_for(lambda: "victim" in live_pods(core, ns), timeout=30, what="the pod")
    pods = live_pods(core, ns)
    check = {"name": "h", "http": {"url": f"http://127.0.0.1:{server.server_address[1]}/health"}}
    try:
        assert team.apply(agent_yaml("eager", {"eagerness": 100, "pauseDuration": 5, "allowSingleReplica": True,
                                               "steadyState": {"intervalSeconds": 1, "checks": [check]}})
                          ).returncode == 0
        wait_for(lambda: condition(status(custom, ns, "eager"), "Stalled").get("status") == "True", timeout=20,
                 what="Stalled")
        ready = condition(status(custom, ns, "eager"), "Ready")
        assert ready["reason"] == "InvalidSpec" and settings.TENANT_NAMESPACE_LABEL in ready["message"]
        stays(lambda: live_pods(core, ns) == pods and Counted.gets == 0, seconds=6, what="the pod alive, no check")
        allow(core, ns)  # the same agent, allowed: its check runs (so the silence above was the scope)
        wait_for(lambda: Counted.gets > 0, timeout=20, what="the check once the namespace is allowed")
    finally:
        server.shutdown()


def test_the_kill_switch_and_the_operators_dry_run_stop_tenants(
        tenant_operator: OperatorProcess, team: Team, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    ns = team.namespace
    allow(core, ns)
    make_pods(core, ns, "p", 3)
    wait_for(lambda: len(live_pods(core, ns)) == 3, timeout=30, what="the pods")
    pods = live_pods(core, ns)
    core.patch_namespace(RELEASE, {"metadata": {"labels": {settings.KILL_SWITCH_LABEL: "true"}}})
    try:
        assert team.apply(agent_yaml("held", {"eagerness": 100, "pauseDuration": 5,
                                              "allowSingleReplica": True})).returncode == 0
        wait_for(lambda: condition(status(custom, ns, "held"), "Ready").get("reason") == "KillSwitch", timeout=20,
                 what="the kill switch in status")
        stays(lambda: live_pods(core, ns) == pods, seconds=6, what="the pods alive")
    finally:
        core.patch_namespace(RELEASE, {"metadata": {"labels": {settings.KILL_SWITCH_LABEL: None}}})
    tenant_operator.stop()
    tenant_operator.extra_env["CHAOS_DRY_RUN"] = "true"
    try:
        tenant_operator.start()
        wait_for(lambda: condition(status(custom, ns, "held"), "DryRun").get("reason") == "OperatorForced",
                 timeout=30, what="the forced dry-run")
        wait_for(lambda: (status(custom, ns, "held").get("wouldBe") or {}).get("tantrum", 0) >= 1, timeout=20,
                 what="a would-be kill")
        assert live_pods(core, ns) == pods
    finally:
        tenant_operator.stop()
        tenant_operator.extra_env["CHAOS_DRY_RUN"] = "false"
        tenant_operator.start()


def test_deleting_an_agent_removes_its_ledger_and_nothing_else(
        team: Team, core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi) -> None:
    ns = team.namespace
    allow(core, ns)
    make_pods(core, ns, "p", 4)
    wait_for(lambda: len(live_pods(core, ns)) == 4, timeout=30, what="the pods")
    assert team.apply(agent_yaml("brief", {"eagerness": 100, "pauseDuration": 5, "maxKillsPerCycle": 1,
                                           "allowSingleReplica": True})).returncode == 0
    wait_for(lambda: ledger(core, ns, "brief") is not None and status(custom, ns, "brief").get("cycle"),
             timeout=30, what="the first cycle and its ledger")
    assert kubectl("delete", "--as", team.user, "-n", ns, f"{P}.{G}", "brief", "--wait=true",
                   "--timeout=30s").returncode == 0
    wait_for(lambda: ledger(core, ns, "brief") is None, timeout=10, what="the ledger to go")
    left = live_pods(core, ns)
    stays(lambda: live_pods(core, ns) == left, seconds=6, what="no more kills")


def documented_way_out() -> str:
    """The shell block of docs/blackadder.md that releases a TenantChaosAgent without the operator."""
    doc = (REPO / "docs" / "blackadder.md").read_text()
    start = doc.index("**When the operator is gone, or tenants were switched off")
    block = doc[doc.index("```sh\n", start) + 6:]
    return block[:block.index("```")]


def test_the_documented_way_out_releases_an_agent_and_its_ledger_without_the_operator(
        tenant_operator: OperatorProcess, team: Team, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    ns = team.namespace
    allow(core, ns)
    make_pod(core, ns, "p-0")
    assert team.apply(agent_yaml("bob", {"eagerness": 0, "pauseDuration": 5})).returncode == 0
    wait_for(lambda: status(custom, ns, "bob").get("ledger") and ledger(core, ns, "bob"), timeout=30,
             what="the first cycle and its ledger")
    tenant_operator.stop()
    try:
        kubectl("delete", "-n", ns, f"{P}.{G}", "bob", "--wait=false")
        stuck = custom.get_namespaced_custom_object(G, V, ns, P, "bob")["metadata"]
        assert stuck.get("deletionTimestamp") and stuck.get("finalizers")
        script = documented_way_out().replace("NS=team-a AGENT=george", f"NS={ns} AGENT=bob")
        result = subprocess.run(["bash", "-euc", script], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "KUBECONFIG": str(KUBECONFIG)})
        assert result.returncode == 0, result.stderr
        wait_for(lambda: not custom.list_namespaced_custom_object(G, V, ns, P)["items"], timeout=10,
                 what="the agent gone")
        assert ledger(core, ns, "bob") is None
    finally:
        tenant_operator.start()


def test_a_restart_sweeps_the_ledgers_whose_agent_is_gone(
        tenant_operator: OperatorProcess, team: Team, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    """A ledger left behind (its agent's finalizer removed by hand, the ledger forgotten) goes at the
    next start; the ledger of a live agent stays."""
    ns = team.namespace
    allow(core, ns)
    assert team.apply(agent_yaml("kept", {"eagerness": 0, "pauseDuration": 5})).returncode == 0
    wait_for(lambda: ledger(core, ns, "kept"), timeout=30, what="the live agent's ledger")
    orphan = settings.tenant_ledger_name(settings.tenant_agent_id(ns, "forgotten"))
    core.create_namespaced_secret(RELEASE, {"metadata": {"name": orphan, "labels": {
        settings.LEDGER_LABEL: "forgotten", settings.TENANT_LEDGER_UID_LABEL: "0000-no-such-agent"}},
        "data": {settings.LEDGER_KEY: base64.b64encode(b"{}").decode()}})
    tenant_operator.restart()

    def orphan_gone() -> bool:
        try:
            core.read_namespaced_secret(orphan, RELEASE)
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(orphan_gone, timeout=20, what="the orphaned ledger swept")
    assert ledger(core, ns, "kept") is not None


def test_a_tenant_agents_checks_read_only_its_own_namespace_and_report(
        team: Team, neighbour: str, custom: kubernetes.client.CustomObjectsApi, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api) -> None:
    allow(core, team.namespace)
    make_deployment(apps, neighbour, "web", 1)  # only in the other team's namespace
    make_deployment(apps, team.namespace, "mine", 1)

    def spec(workload: dict[str, Any]) -> dict[str, Any]:
        return {"eagerness": 0, "pauseDuration": 5, "steadyState": {"intervalSeconds": 1, "failureThreshold": 2,
                                                                    "checks": [{"name": "w", "workload": workload}]}}

    # No check can name another namespace: the schema has no such field.
    elsewhere = team.apply(agent_yaml("names-it", spec({"kind": "Deployment", "name": "web", "namespace": neighbour})))
    assert elsewhere.returncode != 0 and "namespace" in elsewhere.stderr, elsewhere.stderr
    assert team.apply(agent_yaml("looks-for-web", spec({"kind": "Deployment", "name": "web"}))).returncode == 0
    assert team.apply(agent_yaml("looks-home", spec({"kind": "Deployment", "name": "mine"}))).returncode == 0
    wait_for(lambda: status(custom, team.namespace, "looks-for-web").get("state") == "Halted", timeout=30,
             what="the agent whose Deployment is not in its namespace halted")
    run = status(custom, team.namespace, "looks-for-web")["run"]
    assert run["reason"] == "SteadyStateBroken" and run["checks"]["w"]["last"] == "Deployment not found"
    wait_for(lambda: (status(custom, team.namespace, "looks-home").get("run") or {}).get("checks", {}).get(
        "w", {}).get("passed", 0) >= 2, timeout=30, what="its own Deployment's check passing")
    assert status(custom, team.namespace, "looks-home")["state"] != "Halted"


def test_a_team_can_apply_the_example(team: Team, custom: kubernetes.client.CustomObjectsApi) -> None:
    """As documented: applied in the team's namespace, it reports why it does not act (not allowed yet)."""
    result = team.apply((REPO / "manifests" / "examples" / "blackadder-tenant.yaml").read_text())
    assert result.returncode == 0, result.stderr
    wait_for(lambda: condition(status(custom, team.namespace, "george"), "Ready").get("reason") == "InvalidSpec",
             timeout=20, what="the example's status")


# --- the chart --------------------------------------------------------------------------------------


def rules(objects: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    role = next((o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == name), None)
    return list(role["rules"]) if role else []


def test_the_chart_grants_tenant_rbac_only_when_tenants_are_enabled() -> None:
    off = render()
    assert not [r for r in rules(off, "kopf-operators") if any("tenant" in res for res in r["resources"])]
    assert not rules(off, "kopf-operators-blackadder-tenant")
    deployment = next(o for o in off if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CHAOS_TENANTS"] == "false"

    on = render(*TENANT_VALUES)
    tenant_rules = [r for r in rules(on, "kopf-operators") if any("tenant" in res for res in r["resources"])]
    assert tenant_rules == [
        {"apiGroups": ["blackadder.io"], "resources": ["tenantchaosagents"], "verbs": ["list", "watch", "patch"]},
        {"apiGroups": ["blackadder.io"], "resources": ["tenantchaosagents/status"], "verbs": ["patch"]}]
    assert rules(on, "kopf-operators-blackadder-tenant") == [
        {"apiGroups": ["blackadder.io"], "resources": ["tenantchaosagents"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
    deployment = next(o for o in on if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["CHAOS_TENANTS"], env["CHAOS_TENANTS_MAX_KILLS_PER_CYCLE"],
            env["CHAOS_TENANTS_MIN_PAUSE_SECONDS"]) == ("true", "2", "5")
    def ledger_role(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return next(o["rules"] for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-ledger"))

    # The start-up sweep lists the ledgers (in the operator's namespace only).
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]} in ledger_role(on)
    assert not [r for r in ledger_role(off) if "list" in r["verbs"]]
    # Switched off with Blackadder itself.
    assert not rules(render(*TENANT_VALUES, "operators.blackadder.enabled=false"),
                     "kopf-operators-blackadder-tenant")


@pytest.mark.parametrize(("value", "message"), [
    ("operators.blackadder.tenants.enabled=maybe", "at '/operators/blackadder/tenants/enabled': got string"),
    ("operators.blackadder.tenants.maxKillsPerCycle=-1", "at '/operators/blackadder/tenants/maxKillsPerCycle'"),
    ("operators.blackadder.tenants.minPauseSeconds=1", "at '/operators/blackadder/tenants/minPauseSeconds'"),
    ("operators.blackadder.tenants.namespaces=all", "additional properties 'namespaces' not allowed"),
])
def test_the_chart_refuses_a_wrong_tenant_limit(value: str, message: str) -> None:
    chart = REPO / "charts" / "kopf-operators"
    result = subprocess.run([str(helm_binary()), "template", "x", str(chart), "--kube-version", kube_version(),
                             "--set", value], capture_output=True, text=True)
    assert result.returncode != 0 and message in result.stderr, result.stderr
