# ruff: noqa: F811  (the fixtures imported from blackadder_helpers are parameters here)
"""Blackadder under adversarial conditions (#20): names at the API's limits, edits in the middle of a
cycle, the operator stopped between steps, objects owned by someone else, the same change twice.
Real local API server, KWOK-backed pods; every agent is confined to its test's namespace.
"""

from __future__ import annotations

from collections.abc import Callable
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
    ledger,
    ledger_location,
    make_cm,
    make_deployment,
    other_namespace,
    replicas,
)
from tests.kube import OperatorProcess, operator_namespace, stays, wait_for
from testsupport.kubectl import apply_yaml, kubectl

STOP_SECONDS = 8


def long_name(length: int, namespace: str) -> str:
    """A valid cluster-scoped name of exactly ``length`` characters (DNS subdomain, dots included)."""
    head = f"edmund-{namespace[-5:]}."
    body = ("a" * 62 + ".") * 5
    name = (head + body)[:length - 1] + "z"
    assert len(name) == length
    return name


@pytest.mark.parametrize("length", [64, 253])
def test_agent_names_at_the_limits_complete_cycles_revert_and_go(
        agents: Agents, namespace: str, length: int,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """64: the name no longer fits a label value; 253 (the API's maximum): nor the ledger's name."""
    make_deployment(apps, namespace, "grow", 1)
    name = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                          "targetNamespaces": [namespace]}, name=long_name(length, namespace))
    wait_for(lambda: replicas(apps, namespace, "grow") == 2, timeout=30, what="the first cycle")
    wait_for(lambda: (agents.status(name).get("cycle") or 0) >= 2, timeout=PAUSE + 20, what="a second cycle")
    status = agents.status(name)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "CycleDone", ready
    ledger_ns, ledger_name = ledger_location(name)
    assert ledger_name == settings.ledger_name(name) and len(ledger_name) <= 253
    secret = core.read_namespaced_secret(ledger_name, ledger_ns)
    assert secret.metadata.annotations[settings.LEDGER_AGENT_ANNOTATION] == name  # the full name
    assert len(secret.metadata.labels[settings.LEDGER_LABEL]) <= 63
    assert ledger(core, name)["agent"] == name
    wait_for(lambda: events(core, "DeploymentScaled", agent=name), timeout=15, what="DeploymentScaled")  # posted after
    agents.delete(name)
    agents.names.remove(name)
    assert replicas(apps, namespace, "grow") == 1
    assert gone(lambda: core.read_namespaced_secret(ledger_name, ledger_ns))


def test_two_long_names_with_the_same_prefix_keep_separate_ledgers() -> None:
    """Hashing keeps names distinct where the prefix alone would collide (pure, no cluster needed,
    but it guards the e2e above: two agents must never share a ledger)."""
    a, b = "x" * 240 + "a", "x" * 240 + "b"
    assert settings.ledger_name(a) != settings.ledger_name(b)
    assert settings.ledger_label(a) != settings.ledger_label(b)


def ipsum_cycle_under_way(agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api
                          ) -> tuple[str, dict[str, dict[str, str]], Callable[[], set[str]]]:
    """60 ConfigMaps and an ipsum agent writing them all in one cycle, its first write seen: the agent's
    name, the ConfigMaps' original data, and a probe of the names written so far."""
    originals = {f"cm-{i:02d}": {"k": f"v{i}"} for i in range(60)}
    for cm, data in originals.items():
        make_cm(core, namespace, cm, data)
    name = agents.create({"ipsumMode": True, "eagerness": 100, "pauseDuration": 600,
                          "targetNamespaces": [namespace]})

    def written() -> set[str]:
        return {cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items
                if cm.metadata.name in originals and cm.data != originals[cm.metadata.name]}

    wait_for(lambda: len(written()) >= 1, timeout=30, what="the cycle under way")
    return name, originals, written


def test_pause_in_the_middle_of_a_cycle_stops_before_the_next_action_and_revert_is_exact(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    """An edit mid-cycle: 60 ConfigMaps in one cycle, paused while it writes. No write after the pause
    is seen; the ledger has exactly the ConfigMaps written, so the revert restores every one of them."""
    name, originals, written = ipsum_cycle_under_way(agents, namespace, core)
    agents.patch_spec(name, {"paused": True})
    wait_for(lambda: agents.status(name).get("state") == "Paused", timeout=STOP_SECONDS, what="paused")
    after_pause = written()
    assert len(after_pause) < len(originals)  # it stopped mid-cycle
    stays(lambda: written() == after_pause, seconds=3, what="no write after the pause")
    undo = ledger(core, name)["undo"]
    assert {key.rsplit("/", 1)[1] for key in undo} == after_pause  # nothing planned-but-not-done left behind
    agents.patch_spec(name, {"revert": True})
    wait_for(lambda: not written(), timeout=STOP_SECONDS + 5, what="every written ConfigMap restored")


def test_operator_stopped_while_revert_or_delete_is_asked_acts_on_restart(
        operator: OperatorProcess, agents: Agents, namespace: str, apps: kubernetes.client.AppsV1Api) -> None:
    """The operator stopped between steps: a revert asked while it was down happens when it is back;
    so does a deletion asked while it was down (the finalizer waits for it)."""
    make_deployment(apps, namespace, "a", 1)
    make_deployment(apps, namespace, "b", 1)
    spec = {"cancerMode": True, "eagerness": 100, "pauseDuration": 600, "targetNamespaces": [namespace]}
    reverted = agents.create({**spec, "podSelector": {"matchLabels": {"app": "a"}}})
    deleted = agents.create({**spec, "podSelector": {"matchLabels": {"app": "b"}}})
    wait_for(lambda: replicas(apps, namespace, "a") == 2 and replicas(apps, namespace, "b") == 2, timeout=30,
             what="the first cycles")
    operator.kill()
    agents.patch_spec(reverted, {"revert": True})
    kubectl("delete", "chaosagent", deleted, "--wait=false")
    operator.start()
    wait_for(lambda: replicas(apps, namespace, "a") == 1, timeout=STOP_SECONDS + 5, what="reverted after restart")
    wait_for(lambda: gone(lambda: agents.get(deleted)), timeout=30, what="deleted after restart")
    agents.names.remove(deleted)
    assert replicas(apps, namespace, "b") == 1


def test_a_foreign_secret_with_the_ledger_name_is_never_overwritten_or_deleted(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """Owned by someone else: a Secret that happens to carry the ledger's name."""
    make_deployment(apps, namespace, "grow", 1)
    agent = f"squatted-{namespace[-5:]}"
    ledger_ns = settings.ledger_namespace(operator_namespace())
    kubectl("create", "namespace", ledger_ns, check=False)
    foreign = core.create_namespaced_secret(ledger_ns, {"metadata": {"name": settings.ledger_name(agent)},
                                                        "stringData": {"password": "someone else's"}})
    try:
        agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                       "targetNamespaces": [namespace]}, name=agent)
        failed = wait_for(lambda: events(core, "CycleFailed", agent=agent), timeout=30, what="the conflict reported")
        assert "is not a Blackadder ledger" in failed[0].message, failed[0].message
        assert replicas(apps, namespace, "grow") == 1  # no chaos without a ledger to undo it
        agents.delete(agent)
        agents.names.remove(agent)
        kept = core.read_namespaced_secret(settings.ledger_name(agent), ledger_ns)
        assert kept.metadata.uid == foreign.metadata.uid
        assert kept.metadata.resource_version == foreign.metadata.resource_version  # untouched
    finally:
        core.delete_namespaced_secret(settings.ledger_name(agent), ledger_ns)


def test_the_same_change_applied_twice_acts_once(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """kubectl apply of the same agent twice changes nothing; revert: true twice restores once; deleting
    twice is harmless."""
    make_deployment(apps, namespace, "grow", 1)
    name = f"twice-{namespace[-5:]}"
    manifest = f"""
apiVersion: blackadder.io/v1beta1
kind: ChaosAgent
metadata: {{name: {name}}}
spec: {{cancerMode: true, eagerness: 100, pauseDuration: 600, targetNamespaces: [{namespace}]}}
"""
    apply_yaml(manifest)
    agents.names.append(name)
    wait_for(lambda: replicas(apps, namespace, "grow") == 2, timeout=30, what="the first cycle")
    generation = agents.get(name)["metadata"]["generation"]
    assert "unchanged" in apply_yaml(manifest).stdout
    assert agents.get(name)["metadata"]["generation"] == generation
    stays(lambda: replicas(apps, namespace, "grow") == 2, seconds=3, what="no extra cycle from a no-op apply")
    agents.patch_spec(name, {"revert": True})
    wait_for(lambda: replicas(apps, namespace, "grow") == 1, timeout=STOP_SECONDS, what="reverted")
    agents.patch_spec(name, {"revert": True})
    stays(lambda: replicas(apps, namespace, "grow") == 1, seconds=3, what="the second revert a no-op")
    assert len(events(core, "Reverted", agent=name)) == 1
    kubectl("delete", "chaosagent", name, "--wait=false")
    kubectl("delete", "chaosagent", name, "--wait=false", "--ignore-not-found")
    wait_for(lambda: gone(lambda: agents.get(name)), timeout=30, what="deleted")
    agents.names.remove(name)
    assert replicas(apps, namespace, "grow") == 1


def test_a_target_removed_mid_cycle_is_not_touched_by_the_rest_of_that_cycle(
        agents: Agents, namespace: str, other_namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    """An edit mid-cycle: the plan covers two namespaces (the test's first, in name order); the second
    is removed from targetNamespaces while the first is being written. Nothing in it is written. (The
    first holds four times as many ConfigMaps: its writes outlast the edit's way to the operator on a
    loaded machine.)"""
    first, second = 120, 30
    for ns, count in ((namespace, first), (other_namespace, second)):
        for i in range(count):
            make_cm(core, ns, f"cm-{i:03d}", {"k": "v"})

    def written(ns: str) -> int:
        return sum(1 for cm in core.list_namespaced_config_map(ns).items
                   if cm.metadata.name.startswith("cm-") and cm.data != {"k": "v"})

    name = agents.create({"ipsumMode": True, "eagerness": 100, "pauseDuration": 600,
                          "targetNamespaces": [namespace, other_namespace]})
    wait_for(lambda: written(namespace) >= 1, timeout=30, what="the cycle under way")
    agents.patch_spec(name, {"targetNamespaces": [namespace]})
    wait_for(lambda: written(namespace) == first, timeout=60, what="the rest of the first namespace")
    stays(lambda: written(other_namespace) == 0, seconds=3, what="the removed namespace untouched")
    wait_for(lambda: agents.status(name).get("lastCycle", {}).get("skipped") == second, timeout=10,
             what="the dropped actions counted as skipped")
    assert set(ledger(core, name)["undo"]) == {f"ConfigMap/{namespace}/cm-{i:03d}" for i in range(first)}


def test_operator_killed_mid_cycle_then_revert_restores_exactly_what_was_written(
        operator: OperatorProcess, agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    """SIGKILL between a write-ahead and its action: the ledger may hold entries for writes that never
    happened; the revert must restore what was written and leave the rest alone, reporting nothing as
    changed by someone else."""
    name, originals, written = ipsum_cycle_under_way(agents, namespace, core)
    operator.kill()
    assert 0 < len(written()) < len(originals)  # killed mid-cycle
    assert len(ledger(core, name)["undo"]) == len(originals)  # every write was recorded ahead
    operator.start()
    agents.patch_spec(name, {"revert": True})
    wait_for(lambda: not written(), timeout=STOP_SECONDS + 5, what="every written ConfigMap restored")
    revert: dict[str, Any] = dict(wait_for(lambda: agents.status(name).get("revert") or {}, timeout=10,
                                           what="the revert reported"))
    assert revert["changed"] == [] and revert["gone"] == [] and revert["failed"] == [], revert
    assert not ledger(core, name)["undo"]
