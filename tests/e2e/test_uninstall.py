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

import kubernetes
import pytest

from tests.e2e.realnode import (
    CRDS,
    agent_cycle,
    all_ready,
    apply_crds,
    dry_run_agent_yaml,
    observed_hash,
    one_of_each_yaml,
    watched_namespaces,
)
from tests.kube import wait_for
from testsupport.kubectl import apply_yaml, kubectl
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, REPO

RELEASE = NAMESPACE = "kopf-uninstall"
TEST_LABEL = "kopf-operators.dev/uninstall-test"
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
    with watched_namespaces(core, (f"uninst-a-{run}", f"uninst-b-{run}"), {TEST_LABEL: run}) as names:
        yield names[0], names[1]
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    # The CRDs back, for whatever runs next in the session.
    apply_crds()


def test_undeploy_then_uninstall_completes_with_live_objects_of_every_kind(
        operator_image: str, host_operator_paused: None, spaces: tuple[str, str],
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    ns_a, ns_b = spaces
    run = ns_a.rsplit("-", 1)[1]
    kubectl("create", "namespace", NAMESPACE, check=False)
    deployed, took = make("deploy", IMAGE=operator_image,
                          HELM_ARGS=f"--set watchNamespaces={{{ns_a},{ns_b}}} --set leaderElection.enabled=false "
                                    "--set replicaCount=1")  # one standalone replica: nothing acts twice
    assert deployed.returncode == 0, deployed.stderr
    wait_for(lambda: all_ready(core, NAMESPACE, RELEASE, 1), timeout=120,
             what="the operator pod Ready on the real node")

    # Live objects of every kind, each handled by the operator in the pod.
    agent = f"uninst-{run}"
    apply_yaml(one_of_each_yaml(ns_a, TEST_LABEL, run), namespace=ns_a)
    apply_yaml(dry_run_agent_yaml(agent, TEST_LABEL, run, ns_a))
    wait_for(lambda: core.read_namespaced_pod("sleeper-immortalpod", ns_a), timeout=60, what="the immortal pod")
    wait_for(lambda: core.read_namespaced_config_map("shared", ns_b), timeout=60, what="the copy in B")
    wait_for(lambda: observed_hash(apps, ns_a), timeout=60, what="the re-roller's baseline")
    wait_for(lambda: agent_cycle(custom, agent) >= 1, timeout=60, what="the agent's first cycle")
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
