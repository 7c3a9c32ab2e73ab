# ruff: noqa: F401, F811  (the fixtures imported from blackadder_helpers are parameters here)
"""One tenant cannot stall, starve or steer the shared process, end to end: a TenantChaosAgent with its
most checks against a host that trickles one byte a second delays neither an administrator's check nor
a re-roller alert; a webhook URL with credentials gets a clear Warning and its token shows in no log
line, Event or status; a ledger the operator did not write makes no write."""

from __future__ import annotations

import base64
import http.server
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from kopf_operators.blackadder import decisions, settings
from tests.e2e.blackadder_helpers import (
    Agents,
    agents,  # a fixture
    condition,
    events,
    make_deployment,
    other_namespace,  # a fixture
    replicas,
)
from tests.e2e.reroller_helpers import AUTO, baseline, configmap, deployment, nginx_pod_spec, set_cm
from tests.kube import OperatorProcess, operator_namespace, stays, wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import KUBECONFIG, REPO
from testsupport.tenant_abuse import SlowHost

TENANT_CHECKS = 16  # the schema's most; the test's limit allows them all, with the longest timeout
SLOW_TIMEOUT = 60


class Hosts:
    """Local hosts only (nothing leaves the machine): ``fast`` answers at once and records when each
    check and alert came; ``slow`` answers 200 and then one byte a second for as long as it is read."""

    def __init__(self) -> None:
        self.checks: list[float] = []
        self.alerts: list[tuple[float, dict[str, Any]]] = []
        outer = self

        class Fast(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.checks.append(time.monotonic())
                self.send_response(204)
                self.end_headers()

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.alerts.append((time.monotonic(), json.loads(body or b"{}")))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fast)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.fast = int(self.server.server_address[1])
        self.trickling = SlowHost(seconds=600)
        self.slow = self.trickling.port

    def alerts_about(self, namespace: str) -> list[float]:
        return [at for at, body in self.alerts if body.get("namespace") == namespace]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.trickling.close()


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    local = Hosts()
    yield local
    local.close()


def largest_gap(times: list[float], since: float) -> float:
    recent = [t for t in times if t >= since]
    return max((b - a for a, b in itertools.pairwise(recent)), default=float("inf"))


def test_a_tenants_slow_checks_delay_neither_an_administrators_check_nor_an_alert(
        operator: OperatorProcess, crds: None, hosts: Hosts, namespace: str, other_namespace: str,
        custom: kubernetes.client.CustomObjectsApi, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api) -> None:
    """Blackadder and the re-roller in one process. The tenant's host (``localhost``) is on the tenants'
    list only, the administrators' (``127.0.0.1``) on theirs only. While the tenant's 16 checks hold
    connections to the trickling host (each up to 60 s), the administrator's check still runs every
    second and an alert still arrives as soon as without the tenant."""
    env = {"CHAOS_TENANTS": "true", "CHAOS_DRY_RUN": "true", "CHAOS_CHECK_HOSTS": "127.0.0.1",
           "CHAOS_TENANT_HTTP_HOSTS": "localhost", "CHAOS_TENANTS_MAX_CHECKS": str(TENANT_CHECKS),
           "CHAOS_TENANTS_MAX_CHECK_TIMEOUT_SECONDS": str(SLOW_TIMEOUT),
           "CHAOS_TENANTS_MIN_CHECK_INTERVAL_SECONDS": "1",
           "CHAOS_TENANTS_MIN_PAUSE_SECONDS": "5", "REROLLER_ALERT_SINK": "webhook",
           "REROLLER_ALERT_WEBHOOK_URL": f"http://127.0.0.1:{hosts.fast}/alert"}
    operator.stop()
    proc = OperatorProcess(files=[str(REPO / "operators" / "blackadder.py"), str(REPO / "operators" / "reroller.py")],
                           env=env, kubeconfig=KUBECONFIG, log_name="shared-process")
    proc.start()
    agents = Agents(custom)
    tenant_ns = other_namespace
    try:
        core.patch_namespace(tenant_ns, {"metadata": {"labels": {
            settings.TENANT_NAMESPACE_LABEL: settings.TENANT_NAMESPACE_VALUE}}})
        # Two workloads: one rollout each (a workload's second rollout would wait out its minimum interval).
        for name in ("quiet", "loaded"):
            configmap(core, namespace, f"{name}-conf", {"nginx.conf": "v1"})
            deployment(apps, namespace, name, nginx_pod_spec(f"{name}-conf"), AUTO)
            baseline(apps, namespace, name)
        health = {"name": "health", "http": {"url": f"http://127.0.0.1:{hosts.fast}/health", "timeoutSeconds": 2}}
        admin = agents.create({"eagerness": 0, "pauseDuration": settings.MIN_PAUSE_SECONDS,
                               "targetNamespaces": [namespace],
                               "steadyState": {"intervalSeconds": 1, "failureThreshold": 100, "checks": [health]}})
        wait_for(lambda: len(hosts.checks) >= 4, timeout=30, what="the administrator's check running")
        quiet = time.monotonic()
        wait_for(lambda: len([t for t in hosts.checks if t >= quiet]) >= 6, timeout=20, what="six checks")
        quiet_gap = largest_gap(hosts.checks, quiet)
        changed = time.monotonic()
        set_cm(core, namespace, "quiet-conf", {"nginx.conf": "v2"})
        wait_for(lambda: hosts.alerts_about(namespace), timeout=30, what="the alert without the tenant")
        quiet_alert = hosts.alerts_about(namespace)[0] - changed

        checks = [{"name": f"c{i}", "http": {"url": f"http://localhost:{hosts.slow}/c{i}",
                                             "timeoutSeconds": SLOW_TIMEOUT}} for i in range(TENANT_CHECKS)]
        custom.create_namespaced_custom_object(settings.GROUP, settings.VERSION, tenant_ns, settings.TENANT_PLURAL, {
            "apiVersion": f"{settings.GROUP}/{settings.VERSION}", "kind": settings.TENANT_KIND,
            "metadata": {"name": "slow"}, "spec": {"eagerness": 0, "pauseDuration": 5, "steadyState": {
                "intervalSeconds": 1, "failureThreshold": 100, "checks": checks}}})
        wait_for(lambda: hosts.trickling.open >= 4, timeout=30, what="the tenant's checks holding the slow host")
        loaded = time.monotonic()
        wait_for(lambda: len([t for t in hosts.checks if t >= loaded]) >= 6, timeout=20,
                 what="six administrator's checks while the tenant's are outstanding")
        loaded_gap = largest_gap(hosts.checks, loaded)
        before = len(hosts.alerts_about(namespace))
        changed = time.monotonic()
        set_cm(core, namespace, "loaded-conf", {"nginx.conf": "v2"})
        wait_for(lambda: len(hosts.alerts_about(namespace)) > before, timeout=30, what="the alert with the tenant")
        loaded_alert = hosts.alerts_about(namespace)[before] - changed
        assert hosts.trickling.open >= 4  # the tenant's checks were still outstanding throughout
        # Behaviour, not a timing target: each within its own deadline (check 2 s after its 1 s interval,
        # alert 5 s), where a shared thread pool held by the tenant stopped both.
        assert loaded_gap < 1 + 2 + 1, (quiet_gap, loaded_gap)
        assert loaded_alert < quiet_alert + 5, (quiet_alert, loaded_alert)
        print(f"\nadministrator's check, largest gap: {quiet_gap:.2f} s alone, {loaded_gap:.2f} s with the tenant; "
              f"alert after the change: {quiet_alert:.2f} s alone, {loaded_alert:.2f} s with the tenant")
        assert agents.status(admin).get("state") != "Halted"
    finally:
        for item in custom.list_namespaced_custom_object(settings.GROUP, settings.VERSION, tenant_ns,
                                                         settings.TENANT_PLURAL)["items"]:
            custom.delete_namespaced_custom_object(settings.GROUP, settings.VERSION, tenant_ns, settings.TENANT_PLURAL,
                                                   item["metadata"]["name"])
        for name in list(agents.names):
            agents.delete(name)
        proc.stop()
        operator.start()
    assert not proc.errors(), proc.errors()


def test_a_webhook_url_with_credentials_gets_a_clear_warning_and_its_token_shows_nowhere(
        operator: OperatorProcess, agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api, custom: kubernetes.client.CustomObjectsApi) -> None:
    token = f"tok{uuid.uuid4().hex}"
    where = settings.ledger_namespace(operator_namespace())
    secret = f"userinfo-{namespace[-5:]}"
    kubectl("create", "namespace", where, check=False)
    core.create_namespaced_secret(where, {"metadata": {"name": secret}, "stringData": {
        settings.WEBHOOK_SECRET_KEY: f"http://user:{token}@127.0.0.1/x"}})  # no port: urllib raised InvalidURL here
    make_deployment(apps, namespace, "a", 1)
    try:
        name = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": settings.MIN_PAUSE_SECONDS,
                              "targetNamespaces": [namespace], "webhook": {"secretRef": {"name": secret}}})
        refused = wait_for(lambda: events(core, "WebhookRefused", agent=name), timeout=30, what="the Warning")
        assert "carries credentials" in refused[0].message and f"Secret {where}/{secret}" in refused[0].message
        assert replicas(apps, namespace, "a") >= 2  # the agent acted; its notification was refused, loudly
        # A check URL with credentials is refused when the agent is written.
        inline = kubectl("apply", "--dry-run=server", "-f", "-", check=False, input=json.dumps({
            "apiVersion": f"{settings.GROUP}/{settings.VERSION}", "kind": settings.KIND, "metadata": {"name": "inline"},
            "spec": {"eagerness": 0, "paused": True, "targetNamespaces": [namespace], "steadyState": {"checks": [
                {"name": "h", "http": {"url": f"http://user:{token}@127.0.0.1/x"}}]}}}))
        assert inline.returncode != 0 and "may not carry credentials" in inline.stderr, inline.stderr
        agents.delete(name)
    finally:
        core.delete_namespaced_secret(secret, where)
    assert token not in operator.output()
    assert token not in kubectl("get", "events", "-A", "-o", "json").stdout
    assert token not in json.dumps(custom.list_cluster_custom_object(settings.GROUP, settings.VERSION, settings.PLURAL))


def forged_ledger(where: str, agent: str, agent_uid: str, victim: Any, labels: dict[str, str]) -> dict[str, Any]:
    """What a Copyrator copy of a tenant's Secret (or anyone else's write) would put under the agent's
    ledger name: an undo entry that "restores" a Deployment in another namespace to 5 replicas."""
    key = decisions.target_key("Deployment", victim.metadata.namespace, victim.metadata.name)
    ledger = {**decisions.empty_ledger(agent, agent_uid), "undo": {key: {
        "kind": "Deployment", "namespace": victim.metadata.namespace, "name": victim.metadata.name,
        "uid": victim.metadata.uid, "before": 5, "written": victim.spec.replicas,
        "generation": victim.metadata.generation}}}
    return {"metadata": {"name": settings.ledger_name(agent), "namespace": where,
                         "labels": {settings.LEDGER_LABEL: settings.ledger_label(agent), **labels}},
            "data": {settings.LEDGER_KEY: base64.b64encode(json.dumps(ledger).encode()).decode()}}


def test_a_forged_ledger_makes_no_write(
        operator: OperatorProcess, agents: Agents, namespace: str, other_namespace: str,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """A Secret under an agent's ledger name that the operator did not write, claiming that agent (its
    uid) and naming a Deployment the agent never touched: a Copyrator copy (it carries the copy's
    label), and one without the ownerReference only the operator sets. Read after a restart, with
    revert: true, neither is trusted: the agents report it, and the Deployment keeps its replicas."""
    make_deployment(apps, other_namespace, "victim", 1)
    victim = apps.read_namespaced_deployment("victim", other_namespace)
    where = settings.ledger_namespace(operator_namespace())
    copied = agents.create({"eagerness": 0, "paused": True, "targetNamespaces": [namespace]})
    unowned = agents.create({"eagerness": 0, "paused": True, "targetNamespaces": [namespace]})
    operator.stop()
    forged = [forged_ledger(where, copied, agents.get(copied)["metadata"]["uid"], victim,
                            {"copyrator.kopf-operators.dev/rule-uid": "some-rule"}),
              forged_ledger(where, unowned, agents.get(unowned)["metadata"]["uid"], victim, {})]
    existing = {s.metadata.name for s in core.list_namespaced_secret(where).items}
    for secret in forged:
        if secret["metadata"]["name"] in existing:  # the operator's own, from a paused cycle: the forger's now
            core.delete_namespaced_secret(secret["metadata"]["name"], where)
        core.create_namespaced_secret(where, secret)
    for name in (copied, unowned):
        agents.patch_spec(name, {"paused": False, "revert": True})
    operator.start()
    try:
        for name, why in ((copied, "is a Copyrator copy"), (unowned, "was not written by the operator")):
            wait_for(lambda n=name, w=why: w in condition(agents.status(n), "Ready").get("message", ""),  # type: ignore[misc]
                     timeout=30, what=f"{name} reporting its ledger")
        stays(lambda: replicas(apps, other_namespace, "victim") == 1, seconds=6, what="the victim untouched")
    finally:
        for secret in forged:
            core.delete_namespaced_secret(secret["metadata"]["name"], where)
