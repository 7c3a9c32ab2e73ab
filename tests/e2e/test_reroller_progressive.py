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

from kopf_operators.reroller import settings
from tests.e2e.realnode import NODE, script
from tests.e2e.reroller_helpers import baseline, events, read, set_cm, template_hash
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


def app(apps: Any, namespace: str, name: str, image: str, wave: str | None = None) -> None:
    """A Deployment on the real node whose pod is ready only while the ConfigMap's mode is good."""
    labels = {"app": name}
    annotations = {settings.AUTO: "true", **({settings.WAVE: wave} if wave else {})}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "progressDeadlineSeconds": PROGRESS_DEADLINE,
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "nodeName": NODE, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
                     "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{
                         "name": "main", "image": image, "imagePullPolicy": "Never",
                         "command": ["sleep", "infinity"],
                         "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "mode"}}}],
                         "readinessProbe": {"exec": {"command": ["sh", "-c", 'test "$MODE" = good']},
                                            "periodSeconds": 1, "failureThreshold": 1}}]}}}})


def available(apps: Any, namespace: str, name: str) -> bool:
    """Its rollout is finished: every replica updated and available, for the newest generation."""
    d = read(apps, "Deployment", namespace, name)
    s = d.status
    return bool(s.observed_generation == d.metadata.generation and s.updated_replicas == 1
                and s.available_replicas == 1 and (s.replicas or 0) == 1)


def deadline_exceeded(apps: Any, namespace: str, name: str) -> bool:
    conditions = read(apps, "Deployment", namespace, name).status.conditions or ()
    return any(c.type == "Progressing" and c.reason == "ProgressDeadlineExceeded" for c in conditions)


def pending(apps: Any, namespace: str, name: str) -> str:
    return str((read(apps, "Deployment", namespace, name).metadata.annotations or {}).get(settings.PENDING) or "")


@pytest.fixture
def progression(apps: kubernetes.client.AppsV1Api, core: kubernetes.client.CoreV1Api, namespace: str,
                image: str) -> Callable[[], dict[str, str | None]]:
    """Three healthy users of a progressive ConfigMap, with their baselines; returns their template hashes."""
    core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "conf", "annotations": {settings.ROLLOUT: "progressive"}}, "data": {"mode": "good"}})
    for name in NAMES:
        app(apps, namespace, name, image, wave="1" if name == "first" else None)

    def ready() -> dict[str, str | None]:
        for name in NAMES:
            baseline(apps, namespace, name)
            wait_for(lambda n=name: available(apps, namespace, n), timeout=90, what=f"{name} available")  # type: ignore[misc]
        return {name: template_hash(apps, namespace, name) for name in NAMES}  # None: never rolled
    return ready


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
        operator: OperatorProcess, progression: Callable[[], dict[str, str | None]]) -> None:
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
        operator: OperatorProcess, progression: Callable[[], dict[str, str | None]]) -> None:
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
        operator: OperatorProcess, progression: Callable[[], dict[str, str | None]]) -> None:
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

