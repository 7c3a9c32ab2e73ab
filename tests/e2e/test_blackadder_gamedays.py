"""Blackadder's game days: steady-state checks that halt an agent (a Deployment, an HTTP endpoint on
127.0.0.1, a real Prometheus scraping the operator's own metrics), runs that end (duration, maxActions)
and their report. Real local API server, KWOK-backed pods; the operator runs as the chart's
ServiceAccount with HTTP checks allowed to 127.0.0.1 and the test's Prometheus configured.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from kopf_operators.blackadder import settings
from tests.e2e.blackadder_helpers import (
    GREEDY,
    PAUSE,
    Agents,
    agents_of,
    condition,
    events,
    make_deployment,
    replicas,
)
from tests.kube import OperatorProcess, operator_namespace, wait_for
from testsupport.kubectl import kubectl
from testsupport.launcher import free_port
from testsupport.paths import REPO

METRICS_PORT = free_port()
PROMETHEUS = f"http://127.0.0.1:{free_port()}"  # started by the fixture of the test that needs it


class Health(http.server.BaseHTTPRequestHandler):
    """/health answers ``status``; /hook records webhook notifications."""

    status = 200
    hooks: list[dict[str, Any]] = []

    def do_GET(self) -> None:
        self.send_response(Health.status)
        self.end_headers()

    def do_POST(self) -> None:
        Health.hooks.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def health() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)  # local only
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus (cluster/monitoring.sh builds it from its Go module) on 127.0.0.1, scraping
    the game-day operator's /metrics every second."""
    tools = Path(subprocess.run([str(REPO / "cluster" / "monitoring.sh")], capture_output=True, text=True,
                                check=True).stdout.strip())
    work = tmp_path_factory.mktemp("prometheus")
    (work / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "operator", "static_configs": [{"targets": [f"127.0.0.1:{METRICS_PORT}"]}]}]}))
    url = PROMETHEUS
    proc = subprocess.Popen([str(tools / "prometheus"), f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address={url[7:]}"],
                            stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("w"))

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, timeout=60, what="Prometheus ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def query(url: str, promql: str) -> float:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}),
                                timeout=5) as answer:
        result = json.loads(answer.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


@pytest.fixture(scope="module")
def game_operator(operator_process: OperatorProcess, health: int) -> Iterator[OperatorProcess]:
    """All operators (the immortal one makes ImmortalContainers Ready), HTTP checks and webhooks
    allowed to 127.0.0.1, the test's Prometheus. The session's operator stops meanwhile."""
    operator_process.stop()
    proc = OperatorProcess(log_name="gamedays", env={
        "CHAOS_CHECK_HOSTS": "127.0.0.1", "CHAOS_WEBHOOK_HOSTS": "127.0.0.1", "CHAOS_PROMETHEUS_URL": PROMETHEUS,
        "METRICS_PORT": str(METRICS_PORT)})
    proc.start()
    yield proc
    proc.stop()
    operator_process.start()
    assert not proc.errors(), proc.errors()


@pytest.fixture
def agents(game_operator: OperatorProcess, custom: kubernetes.client.CustomObjectsApi) -> Iterator[Agents]:
    yield from agents_of(custom)


def run_of(agents: Agents, name: str) -> dict[str, Any]:
    return dict(agents.status(name).get("run") or {})


def halted(agents: Agents, name: str) -> bool:
    return agents.status(name).get("state") == "Halted"


def check(name: str, **what: Any) -> dict[str, Any]:
    return {"name": name, **what}


# --- halting ----------------------------------------------------------------------------------------


def test_a_deployment_check_breaking_mid_run_halts_the_agent_and_reverts(
        agents: Agents, namespace: str, apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api) -> None:
    make_deployment(apps, namespace, "victim", 2)
    make_deployment(apps, namespace, "web", 1)
    wait_for(lambda: (apps.read_namespaced_deployment("web", namespace).status.available_replicas or 0) == 1,
             timeout=30, what="web available")
    interval, threshold = 1, 2
    name = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": 30,
                          "targetNamespaces": [namespace], "podSelector": {"matchLabels": {"app": "victim"}},
                          "steadyState": {"intervalSeconds": interval, "failureThreshold": threshold, "checks": [
                              check("web", workload={"kind": "Deployment", "namespace": namespace, "name": "web",
                                                     "minAvailable": 1})]}})
    wait_for(lambda: replicas(apps, namespace, "victim") == 4, timeout=30, what="victim doubled")
    wait_for(lambda: agents.status(name).get("state") == "Active", timeout=10, what="the cycle reported")
    assert run_of(agents, name)["checks"]["web"]["passed"] >= 1
    broken_at = time.monotonic()
    apps.delete_namespaced_deployment("web", namespace)  # the steady state breaks, mid-run
    wait_for(lambda: halted(agents, name), timeout=threshold * interval + 10, interval=0.1, what="halted")
    took = time.monotonic() - broken_at
    assert took <= threshold * interval + 2, f"halted {took:.1f}s after the check broke"
    assert replicas(apps, namespace, "victim") == 2  # reverted before it said Halted
    status = agents.status(name)
    run = status["run"]
    assert run["reason"] == "SteadyStateBroken" and "check web" in run["message"]
    assert "Deployment not found" in run["message"] and run["end"] and run["verdict"].startswith("halted")
    assert condition(status, "Stalled")["status"] == "True" and condition(status, "Ready")["status"] == "False"
    broken = wait_for(lambda: events(core, "SteadyStateBroken", agent=name), timeout=15, what="SteadyStateBroken")
    assert broken[0].type == "Warning"
    # Halted stays halted: no new chaos and no new run until a person edits the spec.
    time.sleep(interval * 3)
    assert agents.status(name)["run"]["start"] == run["start"] and replicas(apps, namespace, "victim") == 2
    make_deployment(apps, namespace, "web", 1)
    agents.patch_spec(name, {"resume": "after-fix"})
    wait_for(lambda: run_of(agents, name).get("start") != run["start"] and replicas(apps, namespace, "victim") == 4,
             timeout=40, what="a new run after resume")


def test_an_http_check_that_starts_failing_halts_it_and_the_url_from_a_secret_stays_secret(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api, health: int,
        game_operator: OperatorProcess) -> None:
    secrets = settings.ledger_namespace(operator_namespace())
    kubectl("create", "namespace", secrets, check=False)
    token = f"token-{namespace[-6:]}"
    secret = f"health-{namespace[-6:]}"
    core.create_namespaced_secret(secrets, {"metadata": {"name": secret},
                                            "stringData": {"address": f"http://127.0.0.1:{health}/health/{token}"}})
    hook = f"hook-{namespace[-6:]}"
    core.create_namespaced_secret(secrets, {"metadata": {"name": hook},
                                            "stringData": {"address": f"http://127.0.0.1:{health}/hook"}})
    Health.status, Health.hooks = 200, []
    try:
        name = agents.create({**GREEDY, "tantrumMode": True, "dryRun": True, "targetNamespaces": [namespace],
                              "webhook": {"secretRef": {"name": hook}},
                              "steadyState": {"intervalSeconds": 1, "failureThreshold": 2, "checks": [
                                  check("health", http={"secretRef": {"name": secret}, "timeoutSeconds": 1})]}})
        wait_for(lambda: run_of(agents, name).get("checks", {}).get("health", {}).get("passed", 0) >= 2,
                 timeout=30, what="the HTTP check passing")
        Health.status = 503
        wait_for(lambda: halted(agents, name), timeout=15, what="halted")
        run = run_of(agents, name)
        assert run["reason"] == "SteadyStateBroken" and "HTTP 503" in run["message"]
        wait_for(lambda: any(h.get("outcome") == "halted: SteadyStateBroken" for h in Health.hooks), timeout=10,
                 what="the halt's webhook notification")
        shown = json.dumps(agents.get(name)) + json.dumps([e.message for e in events(core, "SteadyStateBroken")])
        assert token not in shown and token not in game_operator.output()
    finally:
        Health.status = 200
        for name in (secret, hook):
            core.delete_namespaced_secret(name, secrets)


def test_a_prometheus_check_on_the_operators_own_metrics_halts_it_and_recoveries_are_reported(
        agents: Agents, namespace: str, apps: kubernetes.client.AppsV1Api, prometheus: str) -> None:
    make_deployment(apps, namespace, "app", 3)
    wait_for(lambda: (apps.read_namespaced_deployment("app", namespace).status.available_replicas or 0) == 3,
             timeout=30, what="app available")
    kills = 'sum(kopf_operators_actions_total{operator="blackadder",action="pod-killed"}) or vector(0)'
    wait_for(lambda: query(prometheus, "up") == 1, timeout=30, what="Prometheus scraping the operator")
    before = query(prometheus, kills)
    name = agents.create({**GREEDY, "tantrumMode": True, "maxKillsPerCycle": 1, "targetNamespaces": [namespace],
                          "steadyState": {"intervalSeconds": 1, "failureThreshold": 1, "checks": [
                              check("fewer-than-two-kills",
                                    prometheus={"query": kills, "op": "<", "threshold": before + 2})]}})
    wait_for(lambda: halted(agents, name), timeout=4 * PAUSE + 15, what="halted by the Prometheus check")
    run = run_of(agents, name)
    assert run["reason"] == "SteadyStateBroken" and f"not < {before + 2:g}" in run["message"]
    assert run["actions"] == {"tantrum": 2}
    workload = f"Deployment/{namespace}/app"
    wait_for(lambda: run_of(agents, name)["workloads"].get(workload, {}).get("recovered") == 2, timeout=30,
             what="both kills recovered")
    report = run_of(agents, name)["workloads"][workload]
    assert 0 <= report["p50Seconds"] <= report["maxSeconds"] < 30 and report["lowestAvailability"] is not None


# --- runs that end ----------------------------------------------------------------------------------


def test_a_duration_run_finishes_reverts_and_reports_and_max_actions_stops_it(
        agents: Agents, namespace: str, apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api) -> None:
    make_deployment(apps, namespace, "victim", 2)
    make_deployment(apps, namespace, "app", 3)
    timed = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE, "duration": "8s",
                           "targetNamespaces": [namespace], "podSelector": {"matchLabels": {"app": "victim"}}})
    counted = agents.create({**GREEDY, "tantrumMode": True, "maxActions": 2, "targetNamespaces": [namespace],
                             "podSelector": {"matchLabels": {"app": "app"}}})
    wait_for(lambda: replicas(apps, namespace, "victim") >= 4, timeout=30, what="victim doubled")
    wait_for(lambda: agents.status(timed).get("state") == "Finished", timeout=30, what="the timed run finished")
    assert replicas(apps, namespace, "victim") == 2  # reverted as on delete
    status = agents.status(timed)
    run = status["run"]
    assert run["reason"] == "DurationElapsed" and run["end"] and run["verdict"].startswith("finished")
    assert condition(status, "Ready")["status"] == "True"  # kstatus: Current, the run did its job
    wait_for(lambda: agents.status(counted).get("state") == "Finished", timeout=30, what="maxActions reached")
    assert run_of(agents, counted)["reason"] == "MaxActionsReached"
    assert run_of(agents, counted)["actions"] == {"tantrum": 2}
    assert len({e.involved_object.name for e in events(core, "PodKilled", namespace=namespace)}) == 2
    # Extending the run reopens it.
    agents.patch_spec(counted, {"maxActions": 3})
    wait_for(lambda: run_of(agents, counted).get("actions") == {"tantrum": 3}, timeout=30, what="one more kill")


def test_checks_read_statefulsets_daemonsets_and_immortal_containers(
        agents: Agents, namespace: str, apps: kubernetes.client.AppsV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    labels = {"app": "sts"}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "test"}]}}
    apps.create_namespaced_stateful_set(namespace, {"metadata": {"name": "sts"}, "spec": {
        "replicas": 1, "serviceName": "sts", "selector": {"matchLabels": labels}, "template": template}})
    apps.create_namespaced_daemon_set(namespace, {"metadata": {"name": "ds"}, "spec": {
        "selector": {"matchLabels": {"app": "ds"}},
        "template": {**template, "metadata": {"labels": {"app": "ds"}}}}})
    custom.create_namespaced_custom_object("immortalcontainer.flugel.it", "v1alpha1", namespace,
                                           "immortalcontainers", {
        "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
        "metadata": {"name": "forever"}, "spec": {"image": "test"}})
    name = agents.create({"eagerness": 0, "dryRun": True, "pauseDuration": PAUSE, "targetNamespaces": [namespace],
                          "steadyState": {"intervalSeconds": 1, "failureThreshold": 100, "checks": [
                              check(kind.lower(), workload={"kind": kind, "namespace": namespace, "name": obj,
                                                            "minAvailable": 0})
                              for kind, obj in (("StatefulSet", "sts"), ("DaemonSet", "ds"),
                                                ("ImmortalContainer", "forever"))]}})

    def answered() -> dict[str, str]:
        return {k: v["last"] for k, v in run_of(agents, name).get("checks", {}).items() if v["passed"]}

    wait_for(lambda: set(answered()) == {"statefulset", "daemonset", "immortalcontainer"}, timeout=30,
             what="all three checks passing")
    assert answered()["immortalcontainer"] == "Ready" and "available" in answered()["statefulset"]
