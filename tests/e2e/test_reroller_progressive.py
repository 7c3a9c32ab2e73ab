# ruff: noqa: F811  (the fixtures imported from the helpers are parameters here)
"""Progressive rollouts on the real node: a ConfigMap annotated ``rollout: progressive`` rolls its users
in waves, each gated on the health its own controller reports, with real pods and real readiness.

Three Deployments read ``mode`` from the ConfigMap into their environment; their readiness probe
passes only when it is ``good``, and their progress deadline is short. A change to ``bad`` rolls
the first wave (the Deployment with ``wave: "1"``) only: its new pod never becomes ready, its
controller reports ``ProgressDeadlineExceeded``, and the other two are held (the pending annotation,
``RerollHalted`` on each and on the ConfigMap, the held-rollouts gauge), never rolled. A fixing change
then rolls all three, the first wave first. The session's host operator acts; the pods run on the
real node (``nodeName`` and its taint's toleration), from the local base image loaded there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest

from kopf_operators.core.conventions import REROLLER_PENDING
from kopf_operators.reroller import settings
from tests.e2e.blackadder_helpers import GREEDY, Agents, agents, next_cycles  # noqa: F401 (a fixture)
from tests.e2e.blackadder_helpers import events as chaos_events
from tests.e2e.realnode import NODE, script
from tests.e2e.reroller_helpers import (  # noqa: F401 (a fixture)
    baseline,
    events,
    read,
    reroller_with,
    set_cm,
    template_hash,
)
from tests.kube import OperatorProcess, stays, wait_for

REAL_NODE_TAINT = "kopf-operators.dev/real-node"
NAMES = ("first", "second", "third")
PROGRESS_DEADLINE = 12  # seconds: the Deployment's own, after which its controller reports the failure


@pytest.fixture(scope="module")
def image(real_node: str) -> str:
    """The local base image (Debian with a shell), loaded into the real node's containerd."""
    base = script("image.sh", "base")
    script("node.sh", "load", base)
    return base


def app(apps: Any, namespace: str, name: str, image: str, wave: str | None = None,
        deadline: int = PROGRESS_DEADLINE, replicas: int = 1, configured: bool = True) -> None:
    """A Deployment on the real node whose pod is ready only while the ConfigMap's mode is good (not
    ``configured``: no ConfigMap, and always ready)."""
    labels = {"app": name}
    annotations = {settings.AUTO: "true", **({settings.WAVE: wave} if wave else {})} if configured else {}
    mode = ({"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "mode"}}} if configured
            else {"name": "MODE", "value": "good"})
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "progressDeadlineSeconds": deadline,
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "nodeName": NODE, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
                     "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{
                         "name": "main", "image": image, "imagePullPolicy": "Never",
                         "command": ["sleep", "infinity"],
                         "env": [mode],
                         "readinessProbe": {"exec": {"command": ["sh", "-c", 'test "$MODE" = good']},
                                            "periodSeconds": 1, "failureThreshold": 1}}]}}}})


def available(apps: Any, namespace: str, name: str) -> bool:
    """Its rollout is finished: every replica updated and available, for the newest generation."""
    d = read(apps, "Deployment", namespace, name)
    s = d.status
    want = d.spec.replicas
    return bool(s.observed_generation == d.metadata.generation and s.updated_replicas == want
                and s.available_replicas == want and (s.replicas or 0) == want)


def deadline_exceeded(apps: Any, namespace: str, name: str) -> bool:
    conditions = read(apps, "Deployment", namespace, name).status.conditions or ()
    return any(c.type == "Progressing" and c.reason == "ProgressDeadlineExceeded" for c in conditions)


def pending(apps: Any, namespace: str, name: str) -> str:
    return str((read(apps, "Deployment", namespace, name).metadata.annotations or {}).get(REROLLER_PENDING) or "")


Progression = Callable[..., dict[str, str | None]]


@pytest.fixture
def progression(apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api, namespace: str,
                image: str) -> Progression:
    """``start(annotations={}, first_deadline=...)``: three healthy users of a progressive ConfigMap
    (with these annotations too; the first one's progress deadline), once their baselines are recorded
    and they are available; returns their template hashes (None: never rolled)."""
    def start(annotations: dict[str, str] | None = None, first_deadline: int = PROGRESS_DEADLINE
              ) -> dict[str, str | None]:
        core.create_namespaced_config_map(namespace, {
            "metadata": {"name": "conf", "annotations": {settings.ROLLOUT: "progressive", **(annotations or {})}},
            "data": {"mode": "good"}})
        for name in NAMES:
            first = name == "first"
            app(apps, namespace, name, image, wave="1" if first else None,
                deadline=first_deadline if first else PROGRESS_DEADLINE)
        for name in NAMES:
            baseline(apps, namespace, name)
            wait_for(lambda n=name: available(apps, namespace, n), timeout=90, what=f"{name} available")  # type: ignore[misc]
        return {name: template_hash(apps, namespace, name) for name in NAMES}
    return start


def halted(apps: Any, core: Any, namespace: str, before: dict[str, str | None], operator: OperatorProcess) -> None:
    """The first wave rolled once and failed; the other two are held, said, counted, and not rolled."""
    wait_for(lambda: deadline_exceeded(apps, namespace, "first"), timeout=60, what="first's progress deadline")
    for name in ("second", "third"):
        wait_for(lambda n=name: pending(apps, namespace, n).startswith("halted: "), timeout=30,  # type: ignore[misc]
                 what=f"{name} held")
        [warning] = wait_for(lambda n=name: events(core, namespace, n, "RerollHalted"), timeout=15,  # type: ignore[misc]
                             what=f"RerollHalted on {name}")
        assert "Deployment " + namespace + "/first" in warning.message and "ProgressDeadlineExceeded" in warning.message
        assert template_hash(apps, namespace, name) == before[name]  # never rolled
    [said] = wait_for(lambda: events(core, namespace, "conf", "RerollHalted"), timeout=15,
                      what="RerollHalted on the ConfigMap")
    assert said.involved_object.kind == "ConfigMap" and settings.RELEASE in said.message
    assert operator.metric("kopf_operators_reroller_held_rollouts") == 2
    assert template_hash(apps, namespace, "first") != before["first"]


def fixed(apps: Any, core: Any, namespace: str, failed: str) -> None:
    """A fixing change (a new version: not the data the held ones still run, which would only drop
    their holds) rolls all three, the first wave first, and lifts the holds."""
    set_cm(core, namespace, "conf", {"mode": "good", "version": "2"})
    wait_for(lambda: template_hash(apps, namespace, "first") != failed, timeout=30, what="first rolled again")
    wait_for(lambda: available(apps, namespace, "first"), timeout=60, what="first available")
    for name in ("second", "third"):
        wait_for(lambda n=name: available(apps, namespace, n) and not pending(apps, namespace, n),  # type: ignore[misc]
                 timeout=60, what=f"{name} rolled and available")
        wait_for(lambda n=name: len(events(core, namespace, n, "Rerolled")) == 1, timeout=15,  # type: ignore[misc]
                 what=f"one Rerolled on {name}")


def test_a_failing_first_wave_holds_the_rest_and_a_fixing_change_rolls_all(
        apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api, namespace: str,
        operator: OperatorProcess, progression: Progression) -> None:
    before = progression()
    set_cm(core, namespace, "conf", {"mode": "bad"})
    wait_for(lambda: template_hash(apps, namespace, "first") != before["first"], timeout=30, what="first rolled")
    # While the first wave rolls (and until its deadline), the others wait: nothing written on them.
    stays(lambda: all(template_hash(apps, namespace, n) == before[n] and not pending(apps, namespace, n)
                      for n in ("second", "third")), PROGRESS_DEADLINE / 2, what="the later waves waiting")
    halted(apps, core, namespace, before, operator)
    failed = str(template_hash(apps, namespace, "first"))
    fixed(apps, core, namespace, failed)
    assert operator.metric("kopf_operators_reroller_held_rollouts") == 0


def test_a_progression_survives_the_operator_killed_mid_way(
        apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api, namespace: str,
        operator: OperatorProcess, progression: Progression) -> None:
    """SIGKILL after the first wave rolled: the new process resumes the progression from the objects
    (the first wave's rollout is not repeated, the others still wait, then are held)."""
    before = progression()
    set_cm(core, namespace, "conf", {"mode": "bad"})
    rolled = wait_for(lambda: template_hash(apps, namespace, "first") if template_hash(
        apps, namespace, "first") != before["first"] else None, timeout=30, what="first rolled")
    operator.kill()
    operator.start()
    halted(apps, core, namespace, before, operator)
    assert template_hash(apps, namespace, "first") == rolled  # rolled once, not again after the restart
    assert len(wait_for(lambda: events(core, namespace, "first", "Rerolled"), timeout=15)) == 1
    fixed(apps, core, namespace, str(rolled))


def test_a_release_rolls_the_held_workloads(
        apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api, namespace: str,
        operator: OperatorProcess, progression: Progression) -> None:
    before = progression()
    set_cm(core, namespace, "conf", {"mode": "bad"})
    halted(apps, core, namespace, before, operator)
    [said] = events(core, namespace, "conf", "RerollHalted")
    token = said.message.rsplit(f"{settings.RELEASE}=", 1)[1].strip()
    started = time.monotonic()
    core.patch_namespaced_config_map("conf", namespace, {"metadata": {"annotations": {settings.RELEASE: token}}})
    for name in ("second", "third"):
        wait_for(lambda n=name: template_hash(apps, namespace, n) != before[n] and not pending(apps, namespace, n),  # type: ignore[misc]
                 timeout=30, what=f"{name} released and rolled")
    assert time.monotonic() - started < 30
    assert operator.metric("kopf_operators_reroller_held_rollouts") == 0


def test_a_restore_of_the_previous_data_rolls_the_users_once_through_the_waves(
        apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api, namespace: str,
        reroller_with: Callable[..., OperatorProcess], progression: Progression) -> None:
    """History on: a good new version rolls all three; restoring the previous data (one write of the
    ConfigMap) rolls each of them once more, the first wave first."""
    reroller = reroller_with(REROLLER_HISTORY="true")
    progression({settings.HISTORY: "3"})
    set_cm(core, namespace, "conf", {"mode": "good", "version": "2"})
    for name in NAMES:
        wait_for(lambda n=name: len(events(core, namespace, n, "Rerolled")) == 1 and available(apps, namespace, n),  # type: ignore[misc]
                 timeout=60, what=f"{name} rolled to version 2")
    rolled = {name: template_hash(apps, namespace, name) for name in NAMES}
    core.patch_namespaced_config_map("conf", namespace, {"metadata": {"annotations": {settings.RESTORE: "previous"}}})
    wait_for(lambda: core.read_namespaced_config_map("conf", namespace).data == {"mode": "good"}, timeout=30,
             what="the previous data back")
    for name in NAMES:
        wait_for(lambda n=name: len(events(core, namespace, n, "Rerolled")) == 2 and available(apps, namespace, n),  # type: ignore[misc]
                 timeout=60, what=f"{name} rolled once more")
        assert template_hash(apps, namespace, name) != rolled[name]
    stays(lambda: all(len(events(core, namespace, n, "Rerolled")) == 2 for n in NAMES), 5, what="one rollout each")
    assert not (core.read_namespaced_config_map("conf", namespace).metadata.annotations or {}).get(settings.RESTORE)
    assert not reroller.errors(), reroller.errors()


def test_a_chaos_agent_spares_a_deployment_in_the_middle_of_its_rollout(
        apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api, namespace: str, image: str,
        operator: OperatorProcess, agents: Agents, progression: Progression) -> None:
    """The first wave rolls a pod that never becomes ready (its deadline far away): it is in the middle
    of its rollout, and the others wait for it. A greedy ChaosAgent on the namespace kills the pods of
    a settled Deployment beside them and spares the one mid-rollout."""
    app(apps, namespace, "calm", image, replicas=2, configured=False)
    before = progression(first_deadline=600)
    wait_for(lambda: available(apps, namespace, "calm"), timeout=60, what="calm available")
    set_cm(core, namespace, "conf", {"mode": "bad"})
    wait_for(lambda: template_hash(apps, namespace, "first") != before["first"], timeout=30, what="first rolled")
    agent = agents.create({**GREEDY, "tantrumMode": True, "targetNamespaces": [namespace]})

    def killed(workload: str) -> list[str]:
        return [e.involved_object.name for e in chaos_events(core, "PodKilled", namespace=namespace)
                if e.involved_object.name.startswith(f"{workload}-")]
    wait_for(lambda: killed("calm"), timeout=60, what="a pod of the settled Deployment killed")
    next_cycles(agents, agent, 2)
    assert not killed("first"), killed("first")
    assert agents.status(agent)["lastCycle"]["sparedRollouts"] >= 1
    assert all(template_hash(apps, namespace, n) == before[n] for n in ("second", "third"))  # still waiting
