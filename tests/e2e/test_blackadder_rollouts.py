# ruff: noqa: F811  (the fixtures imported from blackadder_helpers are parameters here)
"""Blackadder spares rollouts: a ChaosAgent kills and doubles a settled Deployment while it spares an
equal one in the middle of its rollout, and one whose change the re-roller holds back (its pending
annotation); with CHAOS_SPARE_ROLLOUTS=false it spares neither. Real local API server, KWOK-backed pods
(the real Deployment and ReplicaSet controllers); every agent is confined to its test's namespace.
"""

from __future__ import annotations

from typing import Any

import kubernetes

from kopf_operators.core.conventions import REROLLER_PENDING
from kopf_operators.core.rollouts import in_progress, rollout_status
from tests.e2e.blackadder_helpers import (  # noqa: F401 (fixtures)
    GREEDY,
    Agents,
    agents,
    events,
    make_deployment,
    next_cycles,
    replicas,
)
from tests.kube import OperatorProcess, wait_for


def settled(apps: kubernetes.client.AppsV1Api, ns: str, name: str) -> bool:
    body = apps.read_namespaced_deployment(name, ns).to_dict()
    status = body.get("status") or {}
    return (status.get("observed_generation") == body["metadata"]["generation"]
            and (status.get("available_replicas") or 0) == body["spec"]["replicas"]
            and (status.get("updated_replicas") or 0) == body["spec"]["replicas"])


def mid_rollout(apps: kubernetes.client.AppsV1Api, ns: str, name: str) -> None:
    """Start a rollout of ``name`` and hold it in the middle: paused, with a changed pod template (its
    controller observes the new spec and updates none of its pods: what core.rollouts calls in progress)."""
    apps.patch_namespaced_deployment(name, ns, {"spec": {"paused": True}})
    apps.patch_namespaced_deployment(name, ns, {"spec": {"template": {"metadata": {"annotations": {
        "kopf-operators.dev/test-rollout": "2"}}}}})

    def rolling() -> bool:
        raw = kubernetes.client.ApiClient().sanitize_for_serialization(apps.read_namespaced_deployment(name, ns))
        observed = (raw.get("status") or {}).get("observedGeneration")
        return observed == raw["metadata"]["generation"] and in_progress(rollout_status("Deployment", raw))

    wait_for(rolling, timeout=30, what=f"Deployment {name} in the middle of its rollout")


def statefulset_mid_rollout(apps: kubernetes.client.AppsV1Api, ns: str, name: str) -> None:
    """A StatefulSet of 2 whose changed template waits for its pods to be deleted (OnDelete): its
    update revision is not its current one, none of its pods updated."""
    labels = {"app": name}
    apps.create_namespaced_stateful_set(ns, {"metadata": {"name": name}, "spec": {
        "replicas": 2, "serviceName": name, "selector": {"matchLabels": labels},
        "updateStrategy": {"type": "OnDelete"},
        "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "test"}]}}}})
    wait_for(lambda: (apps.read_namespaced_stateful_set(name, ns).status.available_replicas or 0) == 2, timeout=60,
             what=f"StatefulSet {name} available")
    apps.patch_namespaced_stateful_set(name, ns, {"spec": {"template": {"metadata": {"annotations": {
        "kopf-operators.dev/test-rollout": "2"}}}}})

    def rolling() -> bool:
        raw = kubernetes.client.ApiClient().sanitize_for_serialization(apps.read_namespaced_stateful_set(name, ns))
        return in_progress(rollout_status("StatefulSet", raw)) and raw["status"].get("observedGeneration") == 2

    wait_for(rolling, timeout=30, what=f"StatefulSet {name} in the middle of its rollout")


def workloads(apps: kubernetes.client.AppsV1Api, ns: str, *names: str) -> None:
    for name in names:
        make_deployment(apps, ns, name, 2)
    for name in names:
        wait_for(lambda name=name: settled(apps, ns, name), timeout=60, what=f"Deployment {name} settled")  # type: ignore[misc]


def killed_of(core: kubernetes.client.CoreV1Api, ns: str, workload: str) -> list[str]:
    return [e.involved_object.name for e in events(core, "PodKilled", namespace=ns)
            if e.involved_object.kind == "Pod" and e.involved_object.name.startswith(f"{workload}-")]


def scaled(core: kubernetes.client.CoreV1Api, ns: str, name: str) -> bool:
    return any(e.involved_object.kind == "Deployment" and e.involved_object.name == name
               for e in events(core, "DeploymentScaled", namespace=ns))


def chaos(namespace: str) -> dict[str, Any]:
    return {**GREEDY, "tantrumMode": True, "cancerMode": True, "targetNamespaces": [namespace]}


def test_an_agent_spares_a_deployment_in_its_rollout_or_held_back_and_disrupts_an_equal_one(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api) -> None:
    workloads(apps, namespace, "calm", "rolling", "held")
    mid_rollout(apps, namespace, "rolling")
    apps.patch_namespaced_deployment("held", namespace, {"metadata": {"annotations": {REROLLER_PENDING: "{}"}}})
    statefulset_mid_rollout(apps, namespace, "db")
    agent = agents.create(chaos(namespace))
    wait_for(lambda: killed_of(core, namespace, "calm") and scaled(core, namespace, "calm"), timeout=40,
             what="the settled Deployment's pods killed and the Deployment doubled")
    next_cycles(agents, agent)
    status = agents.status(agent)
    spared = status["lastCycle"]["sparedRollouts"]
    assert spared >= 3, status["lastCycle"]  # rolling, held, db (calm too, once doubled)
    assert not killed_of(core, namespace, "rolling") and not killed_of(core, namespace, "held")
    assert not killed_of(core, namespace, "db")  # a StatefulSet's pods: their workload listed once per cycle
    assert not scaled(core, namespace, "rolling") and not scaled(core, namespace, "held")
    assert replicas(apps, namespace, "rolling") == 2 and replicas(apps, namespace, "held") == 2
    disrupting = {(e["kind"], e["namespace"], e["name"]) for e in status["disrupting"]}
    assert ("Deployment", namespace, "calm") in disrupting  # the re-roller's view of what the agent disrupts
    assert not {("Deployment", namespace, "rolling"), ("Deployment", namespace, "held")} & disrupting
    assert all(e["until"].endswith("Z") for e in status["disrupting"])


def test_without_spare_rollouts_an_agent_disrupts_a_deployment_in_its_rollout(
        operator: OperatorProcess, namespace: str, custom: kubernetes.client.CustomObjectsApi,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    workloads(apps, namespace, "rolling", "held")
    mid_rollout(apps, namespace, "rolling")
    apps.patch_namespaced_deployment("held", namespace, {"metadata": {"annotations": {REROLLER_PENDING: "{}"}}})
    operator.stop()
    unsparing = OperatorProcess(files=["operators/blackadder.py"], log_name="blackadder-unsparing",
                                env={"CHAOS_SPARE_ROLLOUTS": "false"})
    unsparing.start()
    agents = Agents(custom)
    try:
        agent = agents.create(chaos(namespace))
        wait_for(lambda: all(killed_of(core, namespace, w) and scaled(core, namespace, w) for w in ("rolling", "held")),
                 timeout=40, what="both Deployments' pods killed and both Deployments doubled")
        assert agents.status(agent)["lastCycle"]["sparedRollouts"] == 0
        assert not unsparing.errors(), unsparing.errors()
    finally:
        for name in agents.names:
            agents.delete(name)
        unsparing.stop()
    assert replicas(apps, namespace, "rolling") == 2 and replicas(apps, namespace, "held") == 2  # reverted
