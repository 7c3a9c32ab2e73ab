"""Uninstalling never deadlocks (issue #18, item 3): `make undeploy && make uninstall` completes with
live objects of all four operators present, the chart deployed on the real node as a user deploys it
(`make deploy`, the image built here).

Removing the CRDs deletes every custom resource in the cluster, so this module puts them back at the
end. The session's host operator is stopped meanwhile (as in test_real_node.py: ChaosAgents are
cluster-scoped, every operator would serve them).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from tests.kube import wait_for
from testsupport.kubectl import apply_yaml, kubectl
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, REPO

RELEASE = NAMESPACE = "kopf-uninstall"
TEST_LABEL = "kopf-operators.dev/uninstall-test"
CRDS = REPO / "manifests" / "crds"
BOUND = 180  # seconds each of `make undeploy` and `make uninstall` may take


def make(target: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(["make", "-s", target], cwd=REPO, capture_output=True, text=True, timeout=BOUND,
                            env={**os.environ, "KUBECONFIG": str(KUBECONFIG), "CLUSTER_DIR": str(CLUSTER_DIR),
                                 "RELEASE": RELEASE, "DEPLOY_NAMESPACE": NAMESPACE, **env})
    return result, time.monotonic() - started


def gone(*args: str) -> bool:
    result = kubectl("get", *args, "--ignore-not-found", "-o", "name", check=False)
    return result.returncode == 0 and not result.stdout.strip()


@pytest.fixture
def spaces(core: kubernetes.client.CoreV1Api, crds: None) -> Iterator[tuple[str, str]]:
    run = uuid.uuid4().hex[:5]
    names = (f"uninst-a-{run}", f"uninst-b-{run}")
    for name in names:
        core.create_namespace({"metadata": {"name": name, "labels": {TEST_LABEL: run,
                                                                      "kopf-operators.dev/test": "true"}}})
    for name in names:
        wait_for(lambda n=name: core.read_namespaced_service_account("default", n), timeout=30,  # type: ignore[misc]
                 what=f"the default ServiceAccount in {name}")
    yield names
    for name in (*names, NAMESPACE):
        kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false", check=False)
    # The CRDs back, for whatever runs next in the session.
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS), check=False)
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS), check=False, timeout=70)


def agent_cycled(custom: kubernetes.client.CustomObjectsApi, name: str) -> bool:
    status: dict[str, Any] = custom.get_cluster_custom_object("blackadder.io", "v1beta1", "chaosagents",
                                                              name).get("status") or {}
    return int(status.get("cycle") or 0) >= 1


def test_undeploy_then_uninstall_completes_with_live_objects_of_every_kind(
        operator_image: str, host_operator_paused: None, spaces: tuple[str, str],
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    ns_a, ns_b = spaces
    run = ns_a.rsplit("-", 1)[1]
    kubectl("create", "namespace", NAMESPACE, check=False)
    deployed, took = make("deploy", IMAGE=operator_image,
                          HELM_ARGS=f"--set watchNamespaces={{{ns_a},{ns_b}}} --set peering.enabled=false "
                                    "--set replicaCount=1")  # one standalone replica: nothing acts twice
    assert deployed.returncode == 0, deployed.stderr
    wait_for(lambda: [p for p in core.list_namespaced_pod(NAMESPACE).items
                      if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])],
             timeout=120, what="the operator pod Ready on the real node")

    # Live objects of every kind, each handled by the operator in the pod.
    agent = f"uninst-{run}"
    apply_yaml(f"""
apiVersion: immortalcontainer.flugel.it/v1alpha1
kind: ImmortalContainer
metadata: {{name: sleeper}}
spec: {{image: "busybox:1.36"}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: shared, labels: {{copy-me: "yes"}}}}
data: {{greeting: hello}}
---
apiVersion: flant.com/v1
kind: CopyratorRule
metadata: {{name: to-b}}
spec: {{ruleType: configmap, selector: {{copy-me: "yes"}}, namespace: [{ns_a}], targetNamespaces: [{ns_b}]}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: app-conf}}
data: {{level: "1"}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: app, annotations: {{reroller.kopf-operators.dev/auto: "true"}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: app}}}}
  template:
    metadata: {{labels: {{app: app}}}}
    spec: {{containers: [{{name: app, image: "busybox:1.36", envFrom: [{{configMapRef: {{name: app-conf}}}}]}}]}}
""", namespace=ns_a)
    apply_yaml(f"""
apiVersion: blackadder.io/v1beta1
kind: ChaosAgent
metadata: {{name: {agent}, labels: {{{TEST_LABEL}: "{run}"}}}}
spec: {{tantrumMode: true, eagerness: 100, podTolerance: 0, pauseDuration: 5, dryRun: true,
        targetNamespaces: [{ns_a}]}}
""")
    wait_for(lambda: core.read_namespaced_pod("sleeper-immortalpod", ns_a), timeout=60, what="the immortal pod")
    wait_for(lambda: core.read_namespaced_config_map("shared", ns_b), timeout=60, what="the copy in B")
    wait_for(lambda: (apps.read_namespaced_deployment("app", ns_a).metadata.annotations or {}).get(
        "reroller.kopf-operators.dev/observed-hash"), timeout=60, what="the re-roller's baseline")
    wait_for(lambda: agent_cycled(custom, agent), timeout=60, what="the agent's first cycle")
    agent_body = custom.get_cluster_custom_object("blackadder.io", "v1beta1", "chaosagents", agent)
    assert agent_body["metadata"].get("finalizers"), "the agent holds a finalizer (its revert needs the operator)"
    rule = custom.get_namespaced_custom_object("flant.com", "v1", ns_a, "copyrators", "to-b")
    assert not rule["metadata"].get("finalizers")

    undeployed, undeploy_took = make("undeploy")
    assert undeployed.returncode == 0, undeployed.stderr
    assert gone("chaosagents.blackadder.io", agent), "undeploy deleted the agent while the operator ran"
    assert gone("deployment", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")
    uninstalled, uninstall_took = make("uninstall")
    assert uninstalled.returncode == 0, uninstalled.stderr
    print(f"\nmake deploy {took:.1f}s, make undeploy {undeploy_took:.1f}s, make uninstall {uninstall_took:.1f}s")
    for crd in CRDS.glob("*.yaml"):
        assert kubectl("get", "-f", str(crd), check=False).returncode != 0, f"{crd.name} still there"
    # With no operator and no CRD: the immortal pod goes with its owner (garbage collection), the
    # copy stays (a plain ConfigMap now), and both namespaces delete.
    wait_for(lambda: gone("pod", "sleeper-immortalpod", "-n", ns_a), timeout=60, what="the immortal pod collected")
    assert core.read_namespaced_config_map("shared", ns_b).data == {"greeting": "hello"}
    for name in (ns_a, ns_b, NAMESPACE):
        kubectl("delete", "namespace", name, "--wait=false")
    for name in (ns_a, ns_b, NAMESPACE):
        wait_for(lambda n=name: gone("namespace", n), timeout=90, what=f"namespace {name} deleted")  # type: ignore[misc]
