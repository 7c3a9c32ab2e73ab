"""Helpers for the tests that deploy the chart on the local cluster's real node (cluster/node.sh):
scripts, Helm, the release's pods, their logs, a SIGKILL from the host, and the API server's audit
log per pod (a kubelet-mounted token names its pod in every audit line)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import kubernetes

from testsupport.kubectl import kubectl
from testsupport.paths import CLUSTER_DIR, REPO, helm_binary

NODE = "kopf-real-node"
IMAGE_REPO = "localhost/kopf-operators"
TAG = "e2e"  # the image built from this tree, once per session (tests/e2e/conftest.py)
VALUES = REPO / "cluster" / "real-node-values.yaml"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
RESUMED = "Resuming operations after the pause"
PAUSED = "Pausing operations in favour of"


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


def image_exists(image: str) -> bool:
    return subprocess.run(["podman", "--cgroup-manager=cgroupfs", "--events-backend=file", "image", "exists",
                           image], capture_output=True).returncode == 0


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


def acting(log: str) -> bool:
    """Whether Kopf acts in this process now, by its own log: the last pause or resume line."""
    last_resumed, last_paused = log.rfind(RESUMED), max(log.rfind(PAUSED), log.rfind("Pausing all operators"))
    return last_resumed > last_paused


def sigkill(pod: Any) -> None:
    """SIGKILL to the pod's operator process from the host, through the node's containerd: no SIGTERM,
    no goodbye in the peering, as when the process is OOM-killed or its node dies."""
    container = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    subprocess.run(["ctr", "--address", str(CLUSTER_DIR / "node" / "containerd.sock"), "-n", "k8s.io",
                    "tasks", "kill", "--signal", "SIGKILL", container], check=True, capture_output=True, timeout=30)


def audit_writes(since: str, pod: str) -> list[tuple[str, str, str, str]]:
    """(time, verb, resource, name) of every write request made with the token of ``pod`` after
    ``since`` (audit_now()), from the API server's audit log."""
    path = script("cluster.sh", "audit-log")
    writes = []
    with open(path) as log:
        for line in log:
            entry = json.loads(line)
            extra = entry.get("user", {}).get("extra", {})
            if (entry.get("verb") in WRITES and entry.get("requestReceivedTimestamp", "") > since
                    and extra.get("authentication.kubernetes.io/pod-name") == [pod]):
                ref = entry.get("objectRef") or {}
                resource = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
                writes.append((entry["requestReceivedTimestamp"], entry["verb"], resource, ref.get("name", "")))
    return writes


def not_peering(writes: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """Writes other than Kopf's keep-alives in the ClusterKopfPeering (every replica renews its own entry)."""
    return [w for w in writes if not (w[1] == "patch" and w[2] == "clusterkopfpeerings")]
