# ruff: noqa: F811  (the fixtures imported from blackadder_helpers are parameters here)
"""Blackadder, issues #18 and #20: no secret in a ChaosAgent, the way out of its finalizer, a revert
that keeps being refused lets go, and emergency stops (paused, revert, the global kill switch) that act
within seconds. Real local API server, KWOK-backed pods; every agent is confined to its test's namespace.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from kopf_operators.blackadder import settings
from tests.e2e.blackadder_helpers import (  # noqa: F401 (fixtures)
    PAUSE,
    Agents,
    agents,
    events,
    gone,
    ledger_location,
    make_cm,
    make_deployment,
    other_namespace,
    replicas,
)
from tests.kube import OperatorProcess, operator_namespace, stays, wait_for
from testsupport.kubectl import apply_yaml, kubectl, kubectl_json
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, REPO

# An emergency stop must act within seconds (the agents below sleep 10 minutes between cycles).
STOP_SECONDS = 8
LONG_PAUSE = 600


class Receiver(http.server.BaseHTTPRequestHandler):
    """A webhook receiver on 127.0.0.1: nothing leaves the machine."""

    paths: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Receiver.paths.append(self.path)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    Receiver.paths = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()


def webhook_secret(core: kubernetes.client.CoreV1Api, namespace: str, name: str, address: str) -> None:
    kubectl("create", "namespace", namespace, check=False)
    core.create_namespaced_secret(namespace, {"metadata": {"name": name},
                                              "stringData": {settings.WEBHOOK_SECRET_KEY: address}})


# --- #18 item 4: nothing secret in a custom resource -------------------------------------------------


def scaled_and_ipsumed(agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
                       apps: kubernetes.client.AppsV1Api, deployment: str, start_replicas: int) -> str:
    """A Deployment of ``start_replicas`` and a ConfigMap ``settings``, and an agent (cancer and ipsum)
    that has doubled the one and rewritten the other: the agent's name."""
    make_deployment(apps, namespace, deployment, start_replicas)
    make_cm(core, namespace, "settings", {"k": "original"})
    name = agents.create({"cancerMode": True, "ipsumMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                          "targetNamespaces": [namespace]})
    wait_for(lambda: replicas(apps, namespace, deployment) >= 2 * start_replicas, timeout=30,
             what="the agent's chaos")
    wait_for(lambda: core.read_namespaced_config_map("settings", namespace).data["k"] != "original", timeout=30,
             what="the ConfigMap ipsumed")
    return name


def test_webhook_url_inline_is_refused_with_a_readable_message(crds: None) -> None:
    result = kubectl("apply", "--dry-run=server", "-f", "-", check=False, input="""
apiVersion: blackadder.io/v1beta1
kind: ChaosAgent
metadata: {name: inline-webhook}
spec: {eagerness: 0, paused: true, targetNamespaces: [nowhere], webhook: {url: "http://127.0.0.1/h?token=x"}}
""")
    assert result.returncode != 0
    assert "webhook.url is not accepted: a URL carries its token" in result.stderr, result.stderr
    assert "webhook.secretRef.name" in result.stderr


def test_make_run_verbose_never_logs_or_posts_the_webhook_token(
        operator: OperatorProcess, namespace: str, receiver: int, custom: kubernetes.client.CustomObjectsApi,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """`make run` exactly as the README says (kopf run --all-namespaces --verbose operators/*.py): Kopf
    logs whole bodies at DEBUG there. The token is in the Secret only: never in the output, never in
    an Event, whether the webhook works or fails."""
    token = f"tok{uuid.uuid4().hex}"
    ledger_ns = settings.DEFAULT_LEDGER_NAMESPACE  # `make run` has no OPERATOR_NAMESPACE: the local default
    good, broken = f"hook-{namespace[-5:]}", f"broken-{namespace[-5:]}"
    webhook_secret(core, ledger_ns, good, f"http://127.0.0.1:{receiver}/hook?token={token}")
    closed_port = receiver + 1 if receiver < 65535 else receiver - 1  # nothing listens: the failure path
    webhook_secret(core, ledger_ns, broken, f"http://127.0.0.1:{closed_port}/hook?token={token}")
    make_deployment(apps, namespace, "a", 1)
    make_deployment(apps, namespace, "b", 1)
    operator.stop()  # one operator at a time: `make run` takes its place
    log_path = CLUSTER_DIR / "logs" / f"make-run-{os.getpid()}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("OPERATOR_NAMESPACE", "METRICS_PORT")}
    env["KUBECONFIG"] = str(KUBECONFIG)
    agents = Agents(custom)
    with log_path.open("wb") as log:
        run = subprocess.Popen(["make", "run"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        spec = {"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE, "targetNamespaces": [namespace]}
        first = agents.create({**spec, "webhook": {"secretRef": {"name": good}}})
        wait_for(lambda: any(token in p for p in Receiver.paths), timeout=60, what="a notification at the URL")
        agents.delete(first)
        agents.names.remove(first)
        second = agents.create({**spec, "webhook": {"secretRef": {"name": broken}}})
        wait_for(lambda: events(core, "WebhookFailed", agent=second), timeout=30, what="the failing webhook reported")
        agents.delete(second)  # Kopf logs "Deletion is in progress: <the whole body>" at DEBUG
        agents.names.remove(second)
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=30)
        for name in agents.names:
            operator.start()
            agents.delete(name)
        for name in (good, broken):
            core.delete_namespaced_secret(name, ledger_ns)
    output = log_path.read_text(errors="replace")
    assert "kopf run --all-namespaces --verbose operators/" in output or "[DEBUG" in output, output[-2000:]
    assert "Deletion is in progress" in output and '"secretRef"' in output.replace("'", '"')  # bodies were logged
    assert token not in output
    every_event = kubectl("get", "events", "-A", "-o", "json").stdout
    assert f"Secret {ledger_ns}/{broken}" in every_event  # the failure names the Secret, not the URL
    assert token not in every_event
    assert token not in json.dumps(custom.list_cluster_custom_object(settings.GROUP, settings.VERSION, settings.PLURAL))


def test_missing_webhook_secret_is_reported_by_name(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    make_deployment(apps, namespace, "a", 1)
    name = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                          "targetNamespaces": [namespace], "webhook": {"secretRef": {"name": "no-such-hook"}}})
    found = wait_for(lambda: events(core, "WebhookSecretMissing", agent=name), timeout=30, what="the missing Secret")
    where = settings.ledger_namespace(operator_namespace())
    assert f"Secret {where}/no-such-hook does not exist" in found[0].message
    assert replicas(apps, namespace, "a") >= 2  # a missing notification never stops the agent


# --- #18 item 3: the finalizer's way out ----------------------------------------------------------------


def test_revert_first_uninstall_path(
        operator: OperatorProcess, agents: Agents, namespace: str,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """`make revert-agents` (docs/blackadder.md, "Uninstalling"): with the operator running, every agent
    is deleted, reverts first, and the command returns once they are gone."""
    name = scaled_and_ipsumed(agents, namespace, core, apps, "grow", 2)
    ledger_ns, ledger_name = ledger_location(name)
    result = subprocess.run(["make", "revert-agents"], cwd=REPO, capture_output=True, text=True, timeout=240,
                            env={**os.environ, "KUBECONFIG": str(KUBECONFIG)})
    assert result.returncode == 0, result.stdout + result.stderr
    agents.names.remove(name)
    assert gone(lambda: agents.get(name))
    assert replicas(apps, namespace, "grow") == 2
    assert core.read_namespaced_config_map("settings", namespace).data == {"k": "original"}
    assert gone(lambda: core.read_namespaced_secret(ledger_name, ledger_ns))


def test_operator_gone_the_documented_finalizer_removal_keeps_the_ledger(
        operator: OperatorProcess, agents: Agents, namespace: str,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """docs/blackadder.md, "When the operator is gone": keep the ledger, remove the finalizer; the agent
    goes, its changes stay unreverted, and the ledger still says what they were."""
    make_deployment(apps, namespace, "grow", 1)
    name = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                          "targetNamespaces": [namespace]})
    wait_for(lambda: replicas(apps, namespace, "grow") >= 2, timeout=30, what="the agent's chaos")
    ledger_ns, ledger_name = ledger_location(name)
    operator.stop()
    kubectl("delete", "chaosagent", name, "--wait=false")
    stuck = kubectl_json("get", "chaosagent", name)
    assert stuck["metadata"].get("deletionTimestamp") and stuck["metadata"].get("finalizers")
    # The two documented commands, verbatim.
    kubectl("-n", ledger_ns, "patch", "secret", ledger_name, "--type=json",
            "-p", '[{"op":"remove","path":"/metadata/ownerReferences"}]')
    kubectl("patch", "chaosagent", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    wait_for(lambda: gone(lambda: agents.get(name)), timeout=10, what="the agent gone")
    agents.names.remove(name)
    grown = replicas(apps, namespace, "grow")
    assert grown >= 2  # not reverted: nobody could
    kept = json.loads(base64.b64decode(core.read_namespaced_secret(ledger_name, ledger_ns).data[settings.LEDGER_KEY]))
    entry = kept["undo"][f"Deployment/{namespace}/grow"]
    assert entry["before"] == 1 and entry["written"] == grown
    operator.start()
    stays(lambda: not gone(lambda: core.read_namespaced_secret(ledger_name, ledger_ns)), seconds=3,
          what="the kept ledger")
    core.delete_namespaced_secret(ledger_name, ledger_ns)


# --- #20: a revert that keeps being refused lets go ------------------------------------------------------


def freeze_scaling(namespace: str) -> str:
    """A ValidatingAdmissionPolicy that refuses (403) every scale of Deployments in ``namespace``: a
    revert the API keeps refusing, as when the operator's RBAC lost the right to scale."""
    name = f"freeze-scale-{namespace}"[:63]
    apply_yaml(f"""
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {name}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [UPDATE]
      resources: [deployments/scale]
  validations:
  - expression: "false"
    message: scaling is frozen in this namespace
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {name}}}
spec:
  policyName: {name}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {namespace}}}
""")
    return name


def test_a_revert_refused_again_and_again_lets_go_and_keeps_the_ledger(
        operator: OperatorProcess, agents: Agents, namespace: str,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    name = scaled_and_ipsumed(agents, namespace, core, apps, "frozen", 1)
    agents.patch_spec(name, {"paused": True})
    wait_for(lambda: agents.status(name).get("state") == "Paused", timeout=STOP_SECONDS, what="paused")
    grown = replicas(apps, namespace, "frozen")
    policy = freeze_scaling(namespace)
    try:
        def refused() -> bool:
            probe = kubectl("-n", namespace, "scale", "deployment", "frozen", "--replicas=1", "--dry-run=server",
                            check=False)
            return probe.returncode != 0 and "frozen" in probe.stderr
        wait_for(refused, timeout=30, what="the policy in force")
        ledger_ns, ledger_name = ledger_location(name)
        kubectl("delete", "chaosagent", name, "--wait=false")
        retrying: dict[str, Any] = wait_for(
            lambda: agents.status(name) if agents.status(name).get("state") == "RevertFailed" else {},
            timeout=30, what="the Terminating agent saying what is left")
        assert [f["key"] for f in retrying["revert"]["failed"]] == [f"Deployment/{namespace}/frozen"], retrying
        wait_for(lambda: gone(lambda: agents.get(name)), timeout=90, what="the agent let go")
        agents.names.remove(name)
        assert replicas(apps, namespace, "frozen") == grown  # could not be reverted
        assert core.read_namespaced_config_map("settings", namespace).data == {"k": "original"}  # the rest was
        abandoned = events(core, "RevertAbandoned", agent=name)
        assert len(abandoned) == 1, abandoned
        message = abandoned[0].message
        assert f"Deployment/{namespace}/frozen" in message and "HTTP 403" in message, message
        assert f"ledger Secret {ledger_ns}/{ledger_name}" in message, message
        assert f"ConfigMap/{namespace}/settings" not in message
        assert len(events(core, "RevertFailed", agent=name)) >= settings.REVERT_ATTEMPTS - 1
        secret = core.read_namespaced_secret(ledger_name, ledger_ns)
        assert not secret.metadata.owner_references  # the garbage collector keeps it
        assert settings.LEDGER_ABANDONED_ANNOTATION in secret.metadata.annotations
        kept = json.loads(base64.b64decode(secret.data[settings.LEDGER_KEY]))
        assert list(kept["undo"]) == [f"Deployment/{namespace}/frozen"]
        assert kept["undo"][f"Deployment/{namespace}/frozen"]["before"] == 1
        stays(lambda: not gone(lambda: core.read_namespaced_secret(ledger_name, ledger_ns)), seconds=3,
              what="the kept ledger")

        # A new agent of the same name never overwrites the kept ledger: it says why and does nothing.
        agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                       "targetNamespaces": [namespace]}, name=name)
        taken = wait_for(lambda: events(core, "CycleFailed", agent=name), timeout=30, what="the taken ledger")
        assert "could not revert" in taken[-1].message, taken[-1].message
        assert json.loads(base64.b64decode(core.read_namespaced_secret(ledger_name, ledger_ns)
                                           .data[settings.LEDGER_KEY]))["undo"] == kept["undo"]
        agents.delete(name)
        agents.names.remove(name)
        assert core.read_namespaced_secret(ledger_name, ledger_ns)  # still there, not deleted by the new agent
        core.delete_namespaced_secret(ledger_name, ledger_ns)
    finally:
        kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", policy,
                "--ignore-not-found", check=False)
    # Kopf logs each retry of the delete handler at ERROR ("failed temporarily"): expected here; nothing else.
    unexpected = [e for e in operator.errors(namespace) if "failed temporarily" not in e]
    assert not unexpected, unexpected


# --- #20: emergency stops act within seconds ----------------------------------------------------------------


def test_paused_and_revert_act_within_seconds_not_at_the_next_cycle(
        agents: Agents, namespace: str, apps: kubernetes.client.AppsV1Api) -> None:
    make_deployment(apps, namespace, "grow", 1)
    name = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": LONG_PAUSE,
                          "targetNamespaces": [namespace]})
    wait_for(lambda: replicas(apps, namespace, "grow") == 2, timeout=30, what="the first cycle")
    agents.patch_spec(name, {"paused": True})
    wait_for(lambda: agents.status(name).get("state") == "Paused", timeout=STOP_SECONDS,
             what="paused within seconds (the next cycle is 10 minutes away)")
    agents.patch_spec(name, {"revert": True})
    wait_for(lambda: replicas(apps, namespace, "grow") == 1, timeout=STOP_SECONDS, what="reverted within seconds")
    wait_for(lambda: agents.status(name).get("state") == "Reverted", timeout=5, what="status Reverted")


def test_global_kill_switch_stops_every_agent_within_seconds(
        agents: Agents, namespace: str, other_namespace: str,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """The one documented kubectl command: a label on the operator's namespace."""
    switch_ns = settings.ledger_namespace(operator_namespace())
    kubectl("create", "namespace", switch_ns, check=False)
    for ns in (namespace, other_namespace):
        for i in range(3):
            make_cm(core, ns, f"cm-{i}", {"k": "v"})
    busy = {"ipsumMode": True, "eagerness": 100, "pauseDuration": PAUSE}
    first = agents.create({**busy, "targetNamespaces": [namespace]})
    second = agents.create({**busy, "pauseDuration": LONG_PAUSE, "targetNamespaces": [other_namespace]})
    for name in (first, second):
        wait_for(functools.partial(lambda n: agents.status(n).get("cycle"), name), timeout=30,
                 what=f"{name} acting")
    try:
        kubectl("label", "namespace", switch_ns, f"{settings.KILL_SWITCH_LABEL}=true", "--overwrite")
        for name in (first, second):
            wait_for(functools.partial(lambda n: agents.status(n).get("state") == "Paused", name),
                     timeout=STOP_SECONDS, what=f"{name} stopped by the kill switch")
            ready = next(c for c in agents.status(name)["conditions"] if c["type"] == "Ready")
            assert ready["reason"] == "KillSwitch", ready
        versions = {(ns, cm.metadata.name): cm.metadata.resource_version for ns in (namespace, other_namespace)
                    for cm in core.list_namespaced_config_map(ns).items}
        cycle = agents.status(first).get("cycle")

        def still() -> bool:
            now = {(ns, cm.metadata.name): cm.metadata.resource_version for ns in (namespace, other_namespace)
                   for cm in core.list_namespaced_config_map(ns).items}
            return now == versions and agents.status(first).get("cycle") == cycle

        stays(still, seconds=2 * PAUSE + 1, what="no agent acting while the switch is on")
    finally:
        kubectl("label", "namespace", switch_ns, f"{settings.KILL_SWITCH_LABEL}-")
    wait_for(lambda: agents.status(first).get("state") == "Active", timeout=PAUSE + 10, what="acting again")


def test_chart_stop_all_value_stops_every_agent(
        operator: OperatorProcess, namespace: str, custom: kubernetes.client.CustomObjectsApi,
        core: kubernetes.client.CoreV1Api) -> None:
    """operators.blackadder.stopAll renders CHAOS_STOP_ALL=true; an operator started with it never acts."""
    from tests.kube import chart_objects
    deployment = next(o for o in chart_objects("r", "ns", "operators.blackadder.stopAll=true")
                      if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CHAOS_STOP_ALL"] == "true"
    version = make_cm(core, namespace, "settings", {"k": "v"})
    operator.stop()
    stopped = OperatorProcess(files=["operators/blackadder.py"], env={"CHAOS_STOP_ALL": "true"},
                              log_name="blackadder-stop-all")
    stopped.start()
    agents = Agents(custom)
    try:
        name = agents.create({"ipsumMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                              "targetNamespaces": [namespace]})
        wait_for(lambda: agents.status(name).get("state") == "Paused", timeout=30, what="reported stopped")
        stays(lambda: core.read_namespaced_config_map("settings", namespace).metadata.resource_version == version,
              seconds=PAUSE + 1, what="nothing written")
    finally:
        for name in agents.names:
            agents.delete(name)
        stopped.stop()
