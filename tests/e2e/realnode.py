"""What the tests that deploy the chart on the local cluster's real node (cluster/node.sh) share
(test_real_node, test_ha, test_upgrade, test_uninstall): scripts, podman, Helm; the namespaces a release
watches; the chart installed with the image built here and torn down again; one object for each
operator; the objects' status; the release's pods, their logs, a SIGKILL from the host, and the API
server's audit log per pod (a kubelet-mounted token names its pod in every audit line)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import kubernetes

from tests.kube import wait_for
from testsupport.audit import AuditLog, resource_of
from testsupport.kubectl import kubectl
from testsupport.launcher import total
from testsupport.paths import CLUSTER_DIR, REPO, helm_binary

NODE = "kopf-real-node"
IMAGE_REPO = "localhost/kopf-operators"
TAG = "e2e"  # the image built from this tree, once per session (tests/e2e/conftest.py)
VALUES = REPO / "cluster" / "real-node-values.yaml"
CHART = REPO / "charts" / "kopf-operators"
CRDS = REPO / "manifests" / "crds"
REROLLER = "reroller.kopf-operators.dev"  # the re-roller's annotation prefix
TEST_NAMESPACE_LABEL = "kopf-operators.dev/test"
# The namespaced custom resources whose deletion the operator handles (a finalizer may wait for it).
CUSTOM_RESOURCES = "copyrators.flant.com,immortalcontainers.immortalcontainer.flugel.it"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
# The chart's default metrics port: every replica serves its leader gauge there, in standby too.
METRICS_PORT = 9090


def script(name: str, *args: str, timeout: float = 900, root: Any = REPO) -> str:
    result = subprocess.run([str(root / "cluster" / name), *args], capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, "CLUSTER_DIR": str(CLUSTER_DIR)})
    assert result.returncode == 0, f"cluster/{name} {' '.join(args)} failed:\n{result.stderr[-3000:]}"
    return result.stdout.strip()


def helm(*args: str) -> str:
    result = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "KUBECONFIG": str(CLUSTER_DIR / "kubeconfig")})
    assert result.returncode == 0, result.stderr
    return result.stdout


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["podman", "--cgroup-manager=cgroupfs", "--events-backend=file", *args],
                          check=check, capture_output=True, timeout=300)


def image_exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def restricted_namespace(name: str) -> None:
    kubectl("apply", "-f", "-", input=f"""
apiVersion: v1
kind: Namespace
metadata:
  name: {name}
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
""")


def release_pods(core: kubernetes.client.CoreV1Api, namespace: str, release: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={release}").items
            if p.metadata.deletion_timestamp is None]


def ready(pod: Any) -> bool:
    return {c.type: c.status for c in (pod.status.conditions or [])}.get("Ready") == "True"


def all_ready(core: kubernetes.client.CoreV1Api, namespace: str, release: str, count: int) -> list[Any] | None:
    pods = release_pods(core, namespace, release)
    return pods if len(pods) == count and all(ready(p) for p in pods) else None


def logs(namespace: str, pod: str, previous: bool = False) -> str:
    return kubectl("logs", "-n", namespace, pod, "-c", "operator", *(["--previous"] if previous else []),
                   check=False).stdout


def acting(namespace: str, pod: str, port: int = METRICS_PORT) -> bool:
    """Whether the replica in ``pod`` acts now: its leader gauge (1 while it holds the Lease, 0 in standby),
    read through the API server's pod proxy. A pod that does not answer yet does not act."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics"
    done = kubectl("get", "--raw", path, check=False)
    if done.returncode != 0:
        return False
    return total(done.stdout, "kopf_operators_leader") > 0


def sigkill(pod: Any) -> None:
    """SIGKILL to the pod's operator process from the host, through the node's containerd: no SIGTERM,
    no release of the Lease, as when the process is OOM-killed or its node dies."""
    container = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    subprocess.run(["ctr", "--address", str(CLUSTER_DIR / "node" / "containerd.sock"), "-n", "k8s.io",
                    "tasks", "kill", "--signal", "SIGKILL", container], check=True, capture_output=True, timeout=30)


def audit_writes(since: str, pod: str) -> list[tuple[str, str, str, str]]:
    """(time, verb, resource, name) of every write request made with the token of ``pod`` after
    ``since`` (audit_now()), from the API server's audit log."""
    return [(entry["requestReceivedTimestamp"], entry["verb"], resource_of(entry),
             (entry.get("objectRef") or {}).get("name", ""))
            for entry in AuditLog().entries()
            if entry.get("verb") in WRITES and entry.get("requestReceivedTimestamp", "") > since
            and entry.get("user", {}).get("extra", {}).get("authentication.kubernetes.io/pod-name") == [pod]]


def not_lease(writes: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """Writes other than attempts at the Lease (a standby's only writes)."""
    return [w for w in writes if w[2] != "leases"]


# --- the namespaces a release watches, the release itself ---------------------------------------------


@contextlib.contextmanager
def watched_namespaces(core: kubernetes.client.CoreV1Api, names: Sequence[str],
                       labels: dict[str, str] | None = None) -> Iterator[tuple[str, ...]]:
    """Namespaces for a release to watch (with ``labels``), each ready once its default ServiceAccount
    exists; deleted afterwards without waiting (normally gone already: ``uninstall_release``)."""
    for name in names:
        core.create_namespace({"metadata": {"name": name, "labels": {**(labels or {}), TEST_NAMESPACE_LABEL: "true"}}})
    for name in names:
        wait_for(lambda n=name: core.read_namespaced_service_account("default", n), timeout=30,  # type: ignore[misc]
                 what=f"the default ServiceAccount in {name}")
    try:
        yield tuple(names)
    finally:
        for name in names:
            kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false", check=False)


def chart_values(tag: str, watch: Sequence[str]) -> list[str]:
    """What a user gives Helm on the real node: the image loaded there under ``tag``, the namespaces to
    watch, and no debounce before a rollout (so that tests wait for nothing)."""
    return ["-f", str(VALUES), "--set", f"image.repository={IMAGE_REPO}", "--set", f"image.tag={tag}",
            "--set", f"watchNamespaces={{{','.join(watch)}}}", "--set", "operators.reroller.debounceSeconds=0"]


def install_release(core: kubernetes.client.CoreV1Api, release: str, namespace: str, watch: Sequence[str],
                    *sets: str, replicas: int, tag: str = TAG, chart: Path = CHART) -> None:
    """The chart (this tree's, or ``chart``) installed into a namespace that enforces the restricted Pod
    Security level, with ``chart_values`` and ``sets`` ("key=value"); its ``replicas`` pods Ready."""
    restricted_namespace(namespace)
    helm("upgrade", "--install", release, str(chart), "--namespace", namespace, *chart_values(tag, watch),
         *[arg for item in sets for arg in ("--set", item)])
    wait_for(lambda: all_ready(core, namespace, release, replicas), timeout=120,
             what=f"{replicas} Ready operator pod(s) of {release} on the real node")


def uninstall_release(release: str, namespace: str, watched: Sequence[str], agents: str = "") -> None:
    """Tear a release down while its operator still runs, so that it releases its own finalizers: the
    ChaosAgents labelled ``agents`` (a label selector) and the custom resources in the watched namespaces
    first (their deletion handlers still have their sources and targets), then the namespaces, the release
    and its namespace. Whatever still waits for a finalizer then has no operator: released, loudly."""
    if agents:
        kubectl("delete", "chaosagents.blackadder.io", "-l", agents, "--timeout=60s", check=False, timeout=70)
    for name in watched:
        kubectl("delete", "-n", name, CUSTOM_RESOURCES, "--all", "--timeout=60s", check=False, timeout=70)
    for name in watched:
        kubectl("delete", "namespace", name, "--wait=false", check=False)
    for name in watched:
        kubectl("wait", "--for=delete", f"namespace/{name}", "--timeout=60s", check=False, timeout=70)
    helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "90s")
    kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=90s", check=False, timeout=100)
    for name in watched:
        for obj in kubectl("get", CUSTOM_RESOURCES, "-n", name, "-o", "name", check=False).stdout.split():
            print(f"teardown: releasing the finalizers of {name}/{obj}")
            kubectl("patch", obj, "-n", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)


def apply_crds(crds: Path = CRDS) -> None:
    """CRDs as a user applies them (this tree's by default), established."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds), timeout=70)


# --- one object for each operator, and what they report --------------------------------------------------

def immortal_yaml(name: str) -> str:
    return f"""
apiVersion: immortalcontainer.flugel.it/v1alpha1
kind: ImmortalContainer
metadata: {{name: {name}}}
spec: {{image: "busybox:1.36"}}
"""


def copy_rule_yaml(source: str, label: str, run: str) -> str:
    """A labelled ConfigMap ``shared`` and a CopyratorRule that copies it from ``source`` into every
    namespace labelled ``label=run``."""
    return f"""
apiVersion: v1
kind: ConfigMap
metadata: {{name: shared, labels: {{copy-me: "yes"}}}}
data: {{greeting: hello}}
---
apiVersion: flant.com/v1
kind: CopyratorRule
metadata: {{name: to-b}}
spec:
  ruleType: configmap
  selector: {{copy-me: "yes"}}
  namespace: [{source}]
  namespaceSelector: {{matchLabels: {{{label}: "{run}"}}}}
"""


def rerolled_app_yaml(config: str = "app-conf") -> str:
    """A ConfigMap ``config`` and a Deployment ``app`` that uses it, annotated for the re-roller."""
    return f"""
apiVersion: v1
kind: ConfigMap
metadata: {{name: {config}}}
data: {{level: "1"}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
  annotations: {{{REROLLER}/auto: "true"}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: app}}}}
  template:
    metadata: {{labels: {{app: app}}}}
    spec:
      containers: [{{name: app, image: "busybox:1.36", envFrom: [{{configMapRef: {{name: {config}}}}}]}}]
"""


def one_of_each_yaml(source: str, label: str, run: str, immortal: str = "sleeper") -> str:
    """An object for each namespaced operator, all in namespace ``source``."""
    return "---".join([immortal_yaml(immortal), copy_rule_yaml(source, label, run), rerolled_app_yaml()])


def dry_run_agent_yaml(name: str, label: str, run: str, target: str) -> str:
    """A ChaosAgent (cluster-scoped, labelled ``label=run``) that acts in dry run on namespace ``target``."""
    return f"""
apiVersion: blackadder.io/v1beta1
kind: ChaosAgent
metadata: {{name: {name}, labels: {{{label}: "{run}"}}}}
spec: {{tantrumMode: true, eagerness: 100, podTolerance: 0, pauseDuration: 5, dryRun: true,
        targetNamespaces: [{target}]}}
"""


def ic_status(custom: kubernetes.client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    body = custom.get_namespaced_custom_object("immortalcontainer.flugel.it", "v1alpha1", ns,
                                               "immortalcontainers", name)
    return dict(body.get("status") or {})


def agent_status(custom: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any]:
    return dict(custom.get_cluster_custom_object("blackadder.io", "v1beta1", "chaosagents", name).get("status") or {})


def agent_cycle(custom: kubernetes.client.CustomObjectsApi, name: str) -> int:
    return int(agent_status(custom, name).get("cycle") or 0)


def template_hash(apps: kubernetes.client.AppsV1Api, ns: str, name: str = "app") -> str | None:
    """The hash the re-roller put on the Deployment's pod template (its last rollout), if any."""
    annotations = apps.read_namespaced_deployment(name, ns).spec.template.metadata.annotations or {}
    return annotations.get(f"{REROLLER}/config-hash")


def observed_hash(apps: kubernetes.client.AppsV1Api, ns: str, name: str = "app") -> str | None:
    """The re-roller's baseline for the Deployment (set when it first sees it), if any."""
    return (apps.read_namespaced_deployment(name, ns).metadata.annotations or {}).get(f"{REROLLER}/observed-hash")
