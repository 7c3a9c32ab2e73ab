"""Blackadder's game-day report on the local cluster's real kubelet node (cluster/node.sh), where a killed
Pod really stops and its replacement really starts: the run's time to recover matches the Pods' own
timestamps. The session's host operator (all four operators) acts; the ImmortalContainer's Pod runs on
the real node from the local base image.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from tests.e2e.blackadder_helpers import GREEDY, Agents, agents_of
from tests.e2e.realnode import NODE, script
from tests.kube import OperatorProcess, wait_for

REAL_NODE_TAINT = "kopf-operators.dev/real-node"
IC = ("immortalcontainer.flugel.it", "v1alpha1", "immortalcontainers")


@pytest.fixture(scope="module")
def image(real_node: str) -> str:
    base = script("image.sh", "base")
    script("node.sh", "load", base)
    return base


@pytest.fixture
def agents(operator: OperatorProcess, custom: kubernetes.client.CustomObjectsApi) -> Iterator[Agents]:
    yield from agents_of(custom)


def epoch(value: Any) -> float:
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def test_the_reported_time_to_recover_matches_the_pods_timestamps(
        image: str, agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    spec = {"nodeName": NODE, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"]}]}
    custom.create_namespaced_custom_object(*IC[:2], namespace, IC[2], {
        "apiVersion": f"{IC[0]}/{IC[1]}", "kind": "ImmortalContainer", "metadata": {"name": "forever"},
        "spec": {"template": {"spec": spec}}})

    def ready_pod() -> Any:
        pods = [p for p in core.list_namespaced_pod(namespace).items if p.metadata.deletion_timestamp is None]
        return next((p for p in pods if any(c.type == "Ready" and c.status == "True"
                                            for c in p.status.conditions or ())), None)

    first = wait_for(ready_pod, timeout=60, what="the ImmortalContainer's pod Ready on the real node")
    name = agents.create({**GREEDY, "tantrumMode": True, "maxActions": 1, "targetNamespaces": [namespace]})

    def deleting() -> Any:  # the killed Pod as the API server saw the kill
        pod = core.read_namespaced_pod(first.metadata.name, namespace)
        return pod if pod.metadata.uid == first.metadata.uid and pod.metadata.deletion_timestamp else None

    killed = wait_for(deleting, timeout=30, interval=0.05, what="the pod killed")
    # deletionTimestamp is the delete request's time plus the grace period (whole seconds).
    kill_at = epoch(killed.metadata.deletion_timestamp) - (killed.metadata.deletion_grace_period_seconds or 0)
    workload = f"ImmortalContainer/{namespace}/forever"

    def report() -> Any:
        entry = (agents.status(name).get("run") or {}).get("workloads", {}).get(workload) or {}
        return entry if entry.get("recovered") == 1 else None

    entry = wait_for(report, timeout=90, what="the recovery reported")
    replacement = ready_pod()
    assert replacement.metadata.uid != first.metadata.uid
    ready_at = next(epoch(c.last_transition_time) for c in replacement.status.conditions if c.type == "Ready")
    expected = ready_at - kill_at
    assert expected > 0 and abs(entry["maxSeconds"] - expected) <= 1.5, (entry, expected)
    assert entry["p50Seconds"] == entry["maxSeconds"]
