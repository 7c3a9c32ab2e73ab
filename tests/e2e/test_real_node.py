"""The deployed operator, for real: the image built here (cluster/image.sh), the Helm chart installed
on the local cluster's real kubelet node (cluster/node.sh), its probes executed by the kubelet, and
the operator in the pod working with its kubelet-mounted ServiceAccount token.

The session's host operator (``kopf run operators/*.py --all-namespaces``) is paused for this module:
two operators reconciling the same objects would double-post Events and race on status, and the
cluster-scoped ChaosAgents here (one of them not dry-run) are seen by every operator. The in-cluster
release runs ``--standalone`` and watches only this module's two namespaces; ChaosAgents, being
cluster-scoped, it sees all of, which is why nothing else may run meanwhile.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from tests.e2e.realnode import (
    CHART,
    IMAGE_REPO,
    NODE,
    TAG,
    agent_status,
    all_ready,
    copy_rule_yaml,
    dry_run_agent_yaml,
    helm,
    ic_status,
    immortal_yaml,
    install_release,
    observed_hash,
    podman,
    rerolled_app_yaml,
    script,
    template_hash,
    uninstall_release,
    watched_namespaces,
)
from tests.kube import stays, wait_for
from testsupport.kubectl import apply_yaml, kubectl
from testsupport.paths import CLUSTER_DIR

RELEASE = "kopf-real"
DEPLOYMENT = f"{RELEASE}-kopf-operators"  # the chart's fullname
NAMESPACE = "kopf-real"
NEXT_TAG = "e2e-next"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
TEST_LABEL = "kopf-operators.dev/real-node-test"
POD_CIDR_PREFIX = "10.245.0."
GRACE = 30  # the pod's terminationGracePeriodSeconds (Kubernetes' default; the chart keeps it)


@pytest.fixture(scope="module")
def images(operator_image: str) -> tuple[str, str]:
    """The image built from the Dockerfile here (once per session), under a second tag too."""
    second = f"{IMAGE_REPO}:{NEXT_TAG}"
    podman("tag", operator_image, second)
    script("node.sh", "load", second)
    return operator_image, second


@pytest.fixture(scope="module")
def spaces(core: kubernetes.client.CoreV1Api, crds: None) -> Iterator[tuple[str, str]]:
    """Two namespaces only this module uses: the in-cluster operator watches exactly these."""
    run = uuid.uuid4().hex[:5]
    with watched_namespaces(core, (f"real-a-{run}", f"real-b-{run}"), {TEST_LABEL: run}) as names:
        yield names[0], names[1]


@pytest.fixture(scope="module")
def release(images: tuple[str, str], host_operator_paused: None, spaces: tuple[str, str],
            core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi) -> Iterator[str]:
    install_release(core, RELEASE, NAMESPACE, spaces,
                    # Not peered with anything: the session's operators are standalone, and this one is alone.
                    "leaderElection.enabled=false", "replicaCount=1",
                    # The chart forces dry-run for every agent; the self-protection test needs real chaos.
                    "operators.blackadder.dryRun=false", replicas=1)
    yield RELEASE
    uninstall_release(RELEASE, NAMESPACE, spaces, agents=TEST_LABEL)


def ready_pod(core: kubernetes.client.CoreV1Api) -> Any:
    """The release's one operator pod when it is Ready (else None)."""
    pods = all_ready(core, NAMESPACE, RELEASE, 1)
    return pods[0] if pods else None


def restarts(pod: Any) -> int:
    return sum(s.restart_count for s in pod.status.container_statuses or [])


def exec_in(pod: Any, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return kubectl("exec", "-n", NAMESPACE, pod.metadata.name, "-c", "operator", "--", *command, check=check)


def liveness_probes(pod: Any) -> float:
    """Successful liveness probes of the pod, from the kubelet's own metrics (through the API server)."""
    text = kubectl("get", "--raw", f"/api/v1/nodes/{NODE}/proxy/metrics/probes").stdout
    total = 0.0
    for line in text.splitlines():
        if (line.startswith("prober_probe_total{") and 'probe_type="Liveness"' in line
                and 'result="successful"' in line and f'pod="{pod.metadata.name}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- the pod itself ---------------------------------------------------------------------------------


def test_operator_pod_runs_on_the_real_node_and_stays_ready(release: str, core: kubernetes.client.CoreV1Api) -> None:
    pod = ready_pod(core)
    assert pod.spec.node_name == NODE
    assert pod.status.pod_ip.startswith(POD_CIDR_PREFIX), pod.status.pod_ip
    assert pod.spec.containers[0].image == f"{IMAGE_REPO}:{TAG}"
    assert pod.spec.containers[0].image_pull_policy == "Never"
    probes_before = liveness_probes(pod)

    def still_ready() -> bool:
        now = ready_pod(core)
        return bool(now and now.metadata.uid == pod.metadata.uid and restarts(now) == 0)

    stays(still_ready, seconds=60, interval=1, what="the operator pod Ready with 0 restarts")
    # The probe runs every 20 s: at least two more successful probes in 60 s, counted by the kubelet.
    assert liveness_probes(pod) >= probes_before + 2


def test_container_runs_as_10001_on_a_read_only_root(release: str, core: kubernetes.client.CoreV1Api) -> None:
    pod = ready_pod(core)
    assert exec_in(pod, "id", "-u").stdout.strip() == "10001"
    write = exec_in(pod, "sh", "-c", "echo x > /app/written", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    assert exec_in(pod, "sh", "-c", "echo x > /tmp/scratch && cat /tmp/scratch").stdout.strip() == "x"


def test_namespace_enforces_restricted_pod_security(release: str, core: kubernetes.client.CoreV1Api) -> None:
    labels = core.read_namespace(NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    privileged = f"""
apiVersion: v1
kind: Pod
metadata: {{name: not-restricted, namespace: {NAMESPACE}}}
spec:
  nodeSelector: {{kopf-operators.dev/real-node: "true"}}
  containers: [{{name: c, image: {IMAGE_REPO}:{TAG}, securityContext: {{privileged: true}}}}]
"""
    result = kubectl("apply", "--dry-run=server", "-f", "-", input=privileged, check=False)
    assert result.returncode != 0 and "violates PodSecurity" in result.stderr, result.stderr


def test_pod_network_reaches_only_this_machine(release: str, core: kubernetes.client.CoreV1Api) -> None:
    """No kube-proxy: the `kubernetes` Service address is DNAT-ed to the API server by the host, and
    pods have no default route. Checked without sending a packet anywhere but here."""
    pod = ready_pod(core)
    env = exec_in(pod, "sh", "-c", "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT").stdout.strip()
    assert env == "10.0.0.1:443"
    # The operator reached the API server through that address with the kubelet-mounted token.
    token = exec_in(pod, "sh", "-c", "wc -c < /var/run/secrets/kubernetes.io/serviceaccount/token").stdout
    assert int(token) > 100
    routes = exec_in(pod, "cat", "/proc/net/route").stdout.splitlines()[1:]
    destinations = {int(line.split()[1], 16) for line in routes}
    assert 0 not in destinations, f"a default route in the pod:\n{routes}"  # 0 = 0.0.0.0
    # So a connection anywhere else fails at the pod's own route lookup, before any packet exists
    # (203.0.113.1 is a documentation address; were a route there, the host's FORWARD chain drops it).
    probe = exec_in(pod, "python", "-c", "import socket\ntry:\n socket.create_connection(('203.0.113.1', 80), 3)"
                    "\nexcept OSError as e:\n print(e.errno)", check=False)
    assert probe.stdout.strip() == "101", probe  # ENETUNREACH
    nat = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=True).stdout
    assert not [r for r in nat.splitlines() if "10.245.0.0/24" in r and "MASQUERADE" in r], nat
    assert re.search(r"-A KOPF-NODE-SVC -s 10.245.0.0/24 -d 10.0.0.1/32 -p tcp -m tcp --dport 443 -j DNAT", nat)
    forward = subprocess.run(["iptables", "-w", "-S", "KOPF-NODE-FWD"], capture_output=True, text=True,
                             check=True).stdout
    assert "-A KOPF-NODE-FWD -s 10.245.0.0/24 -j DROP" in forward
    assert "-A KOPF-NODE-FWD -d 10.245.0.0/24 -j DROP" in forward


# --- the operator in the pod at work ------------------------------------------------------------------


def agent_reported(custom: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any]:
    """The agent's status once a cycle and its conditions are in it (else empty: not yet)."""
    status = agent_status(custom, name)
    return status if status.get("cycle", 0) >= 1 and dry_run_condition(status) else {}


def dry_run_condition(status: dict[str, Any]) -> str:
    return next((c["status"] for c in status.get("conditions", []) if c["type"] == "DryRun"), "")


def test_in_cluster_operator_serves_all_four_operators(
        release: str, spaces: tuple[str, str], core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api, custom: kubernetes.client.CustomObjectsApi) -> None:
    ns_a, ns_b = spaces
    run = ns_a.rsplit("-", 1)[1]
    # Immortal: one pod (on the KWOK node: it does not tolerate the real node's taint), one start.
    apply_yaml(immortal_yaml("sleeper"), namespace=ns_a)
    wait_for(lambda: ic_status(custom, ns_a, "sleeper").get("startTimes") == 1, timeout=60, what="immortal start")
    assert core.read_namespaced_pod("sleeper-immortalpod", ns_a).spec.node_name != NODE
    # Copyrator: a labelled ConfigMap in A copied into B (selected by label).
    apply_yaml(copy_rule_yaml(ns_a, TEST_LABEL, run), namespace=ns_a)
    wait_for(lambda: core.read_namespaced_config_map("shared", ns_b).data == {"greeting": "hello"},
             timeout=60, what="the copy in namespace B")
    # Re-roller: a ConfigMap change rolls the Deployment that uses it.
    apply_yaml(rerolled_app_yaml(), namespace=ns_a)
    baseline = wait_for(lambda: observed_hash(apps, ns_a), timeout=60, what="the re-roller's baseline")
    before = template_hash(apps, ns_a)
    core.patch_namespaced_config_map("app-conf", ns_a, {"data": {"level": "2"}})
    wait_for(lambda: template_hash(apps, ns_a) not in (None, before), timeout=60, what="the rollout")
    assert baseline
    # Blackadder: a dry-run agent confined to namespace A reports a cycle in its status.
    name = f"real-dry-{run}"
    apply_yaml(dry_run_agent_yaml(name, TEST_LABEL, run, ns_a))
    status = wait_for(lambda: agent_reported(custom, name), timeout=60, what="a dry-run cycle in the agent's status")
    assert dry_run_condition(status) == "True"
    assert status["lastCycle"]["candidates"]["pods"] >= 1
    assert core.read_namespaced_pod("sleeper-immortalpod", ns_a)  # dry-run: nothing deleted
    kubectl("delete", "chaosagent", name, "--timeout=60s")


def test_metrics_answer_on_the_pod_ip(release: str, core: kubernetes.client.CoreV1Api) -> None:
    pod = ready_pod(core)
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:9090/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert "kopf_operators_actions_total" in text
    assert re.search(r'kopf_operators_actions_total\{[^}]*operator="immortal"', text), text[:2000]


class PodEvents:
    """Every watch event of the release's pods, with the time it arrived, from now on."""

    def __init__(self, core: kubernetes.client.CoreV1Api) -> None:
        self.events: list[tuple[float, str, Any]] = []
        self._watch = kubernetes.watch.Watch()
        version = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(core, version), daemon=True)
        self._thread.start()

    def _run(self, core: kubernetes.client.CoreV1Api, version: str) -> None:
        try:
            for event in self._watch.stream(core.list_namespaced_pod, NAMESPACE, label_selector=SELECTOR,
                                            resource_version=version, timeout_seconds=300):
                self.events.append((time.monotonic(), event["type"], event["object"]))
        except Exception:  # stop() closes the stream under the reader
            pass

    def stop(self) -> None:
        self._watch.stop()

    def deleted_at(self, uid: str) -> float | None:
        return next((t for t, kind, pod in self.events if kind == "DELETED" and pod.metadata.uid == uid), None)

    def stopped_at(self, uid: str) -> float | None:
        """When the pod's containers had all ended (terminal phase, as the kubelet reports it) or it was gone."""
        return next((t for t, kind, pod in self.events if pod.metadata.uid == uid
                     and (kind == "DELETED" or pod.status.phase in ("Succeeded", "Failed"))), None)

    def added_at(self, uid: str) -> float | None:
        return next((t for t, kind, pod in self.events if kind == "ADDED" and pod.metadata.uid == uid), None)

    def exit_code(self, uid: str) -> int | None:
        for _, _, pod in reversed(self.events):
            if pod.metadata.uid == uid:
                for status in pod.status.container_statuses or []:
                    if status.state and status.state.terminated:
                        return int(status.state.terminated.exit_code)
        return None


def test_deleted_pod_exits_on_sigterm_and_its_replacement_resumes_without_duplicate_work(
        release: str, spaces: tuple[str, str], core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api, custom: kubernetes.client.CustomObjectsApi) -> None:
    ns_a, ns_b = spaces
    old = ready_pod(core)
    immortal_pod = core.read_namespaced_pod("sleeper-immortalpod", ns_a).metadata.uid
    copy_version = core.read_namespaced_config_map("shared", ns_b).metadata.resource_version
    rolled = template_hash(apps, ns_a)
    generation = apps.read_namespaced_deployment("app", ns_a).metadata.generation
    logs = subprocess.Popen(["kubectl", "--kubeconfig", str(CLUSTER_DIR / "kubeconfig"), "logs", "-f", "-n",
                             NAMESPACE, old.metadata.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    events = PodEvents(core)
    try:
        wait_for(lambda: logs.poll() is None, timeout=5, what="the log stream")
        started = time.monotonic()
        core.delete_namespaced_pod(old.metadata.name, NAMESPACE)  # SIGTERM, default grace period
        wait_for(lambda: events.deleted_at(old.metadata.uid), timeout=GRACE + 30, what="the old pod to go")
        took = events.deleted_at(old.metadata.uid) - started  # type: ignore[operator]
        new = wait_for(lambda: ready_pod(core), timeout=120, what="the replacement to be Ready")
    finally:
        events.stop()
    output = logs.communicate(timeout=30)[0]
    print(f"SIGTERM to pod gone: {took:.1f}s; exit code {events.exit_code(old.metadata.uid)}")
    assert took < GRACE, f"the operator took {took:.1f}s to stop after SIGTERM (grace {GRACE}s)"
    exit_code = events.exit_code(old.metadata.uid)
    assert exit_code in (0, None), f"exit code {exit_code} after SIGTERM:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    assert new.metadata.uid != old.metadata.uid and new.spec.node_name == NODE
    # The replacement picks up where the old one left: nothing is redone.
    stays(lambda: (ic_status(custom, ns_a, "sleeper").get("startTimes") == 1
                   and core.read_namespaced_pod("sleeper-immortalpod", ns_a).metadata.uid == immortal_pod
                   and core.read_namespaced_config_map("shared", ns_b).metadata.resource_version == copy_version
                   and template_hash(apps, ns_a) == rolled
                   and apps.read_namespaced_deployment("app", ns_a).metadata.generation == generation),
          seconds=15, interval=0.5, what="no duplicate work after the restart")
    # ...and it is really at work: a new change is handled by the new pod.
    core.patch_namespaced_config_map("shared", ns_a, {"data": {"greeting": "again"}})
    wait_for(lambda: core.read_namespaced_config_map("shared", ns_b).data == {"greeting": "again"},
             timeout=60, what="the copy updated by the replacement")


def test_helm_upgrade_to_a_new_tag_recreates_the_pod(release: str, core: kubernetes.client.CoreV1Api,
                                                      apps: kubernetes.client.AppsV1Api) -> None:
    old = ready_pod(core)
    assert apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE).spec.strategy.type == "Recreate"
    events = PodEvents(core)
    try:
        helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
             "--reuse-values", "--set", f"image.tag={NEXT_TAG}")
        new = wait_for(lambda: (p := ready_pod(core)) and p.metadata.uid != old.metadata.uid and p,
                       timeout=120, what="the upgraded pod to be Ready")
    finally:
        events.stop()
    assert new.spec.containers[0].image == f"{IMAGE_REPO}:{NEXT_TAG}" and new.spec.node_name == NODE
    # Recreate: the new pod is created only once the old one has stopped (the deployment controller
    # waits for a terminal phase; the API object itself may go a moment later, after volume clean-up).
    stopped, added = events.stopped_at(old.metadata.uid), events.added_at(new.metadata.uid)
    assert stopped is not None and added is not None and stopped <= added, "Recreate: the old pod stops first"


def test_unleashed_chaos_agent_never_kills_the_operator_pod(
        release: str, spaces: tuple[str, str], core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    ns_a = spaces[0]
    run = ns_a.rsplit("-", 1)[1]
    operator = ready_pod(core)
    victim = core.create_namespaced_pod(ns_a, {
        "metadata": {"name": "victim"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}).metadata.uid
    name = f"real-chaos-{run}"
    apply_yaml(f"""
apiVersion: blackadder.io/v1beta1
kind: ChaosAgent
metadata: {{name: {name}, labels: {{{TEST_LABEL}: "{run}"}}}}
spec: {{tantrumMode: true, eagerness: 100, podTolerance: 0, pauseDuration: 5,
        maxKillsPerCycle: "100%", allowSingleReplica: true}}
""")  # every guard off (#14's caps and the single-replica rule): only the self-protection is left

    def victim_gone() -> bool:
        pods = core.list_namespaced_pod(ns_a, field_selector="metadata.name=victim").items
        return not pods or pods[0].metadata.uid != victim

    wait_for(victim_gone, timeout=60, what="the agent to kill a pod (it really acts)")
    status = wait_for(lambda: agent_reported(custom, name), timeout=30, what="the agent's status")
    assert dry_run_condition(status) == "False"
    cycle = status["cycle"]

    def operator_untouched() -> bool:
        now = ready_pod(core)
        return bool(now and now.metadata.uid == operator.metadata.uid and restarts(now) == 0)

    stays(operator_untouched, seconds=12, interval=0.5, what="the operator pod alive through chaos")
    assert agent_status(custom, name)["cycle"] >= cycle + 2
    kubectl("delete", "chaosagent", name, "--timeout=60s")
