"""The re-roller and Copyrator in one process, end to end: a workload that uses a Copyrator copy rolls
once per real change of what it reads. A hand edit of the copy that Copyrator repairs rolls nothing
(neither the edit nor the repair); a source edit reaching several copies rolls each consumer once; a
source key the rule does not copy rolls nothing.

The session's operator runs every operator file, as deployed; the rule limits its targets to the
test's own namespaces and goes with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes

from kopf_operators.reroller import settings
from kopf_operators.reroller.waves import parse_rolled
from tests.e2e.copyrator_helpers import data_of, make_rule, put_cm, wait_data
from tests.e2e.reroller_helpers import AUTO, baseline, deployment, nginx_pod_spec, replicasets
from tests.kube import OperatorProcess, stays, wait_for


def rollouts(apps: Any, targets: list[str]) -> dict[str, int]:
    """Per target namespace, the rollouts of its Deployment ``app`` (ReplicaSets beyond the first)."""
    return {ns: replicasets(apps, ns, "app") - 1 for ns in targets}


def test_copies_roll_each_consumer_once_per_real_change(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api, apps: Any,
        custom: kubernetes.client.CustomObjectsApi, namespace: str, make_namespace: Callable[..., str]) -> None:
    targets = [make_namespace("copy"), make_namespace("copy")]
    put_cm(core, namespace, "app-conf", {"nginx.conf": "v1", "extra": "e1", "unused": "u1"})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=targets, keys=["nginx.conf", "extra"])
    copied = {"nginx.conf": "v1", "extra": "e1"}
    for ns in targets:
        wait_data(core, ns, "app-conf", copied)
        deployment(apps, ns, "app", nginx_pod_spec("app-conf"), AUTO)
        baseline(apps, ns, "app")
        wait_for(lambda: replicasets(apps, ns, "app") == 1, timeout=30,  # noqa: B023  (used at once)
                 what=f"the first ReplicaSet in {ns}")

    # A hand edit of one copy: Copyrator puts it back, and neither the edit nor the repair rolls.
    edited = targets[0]
    core.patch_namespaced_config_map("app-conf", edited, {"data": {"nginx.conf": "by hand"}})
    wait_data(core, edited, "app-conf", copied)
    stays(lambda: rollouts(apps, targets) == {ns: 0 for ns in targets}, 4,
          what="no rollout for a repaired hand edit")

    # A source key the rule does not copy: the copies do not change, nothing rolls.
    put_cm(core, namespace, "app-conf", {"nginx.conf": "v1", "extra": "e1", "unused": "u2"})
    stays(lambda: rollouts(apps, targets) == {ns: 0 for ns in targets} and
          all(data_of(core, ns, "app-conf") == copied for ns in targets), 3,
          what="no rollout for a key the rule does not copy")

    # A copied key changes at the source: every copy follows, each consumer rolls exactly once.
    put_cm(core, namespace, "app-conf", {"nginx.conf": "v2", "extra": "e1", "unused": "u2"})
    for ns in targets:
        wait_data(core, ns, "app-conf", {"nginx.conf": "v2", "extra": "e1"})
    wait_for(lambda: rollouts(apps, targets) == {ns: 1 for ns in targets}, timeout=30,
             what="one rollout per consumer")
    stays(lambda: rollouts(apps, targets) == {ns: 1 for ns in targets}, 4,
          what="exactly one rollout per consumer")


def test_a_progressive_sources_copies_roll_their_users_in_waves(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api, apps: Any,
        custom: kubernetes.client.CustomObjectsApi, namespace: str, make_namespace: Callable[..., str]) -> None:
    """A copy never takes the project's annotations from its source (even with copyAnnotations), yet
    its users follow the source's ``rollout: progressive``: in the target namespace they roll in waves,
    the one with ``wave: "1"`` first (each writes ``rolled``, which only a progressive rollout does)."""
    target = make_namespace("waves")
    core.create_namespaced_config_map(namespace, {"metadata": {
        "name": "app-conf", "labels": {"copyrator": "true"},
        "annotations": {settings.ROLLOUT: "progressive"}}, "data": {"nginx.conf": "v1"}})
    make_rule(custom, namespace, "r", ruleType="configmap", selector={"copyrator": "true"},
              namespace=namespace, targetNamespaces=[target], copyAnnotations=True)
    wait_data(core, target, "app-conf", {"nginx.conf": "v1"})
    assert settings.ROLLOUT not in (core.read_namespaced_config_map("app-conf", target).metadata.annotations or {})
    names = ("first", "second", "third")
    for name in names:
        deployment(apps, target, name, nginx_pod_spec("app-conf"),
                   {**AUTO, **({settings.WAVE: "1"} if name == "first" else {})})
    for name in names:
        baseline(apps, target, name)
    core.patch_namespaced_config_map("app-conf", namespace, {"data": {"nginx.conf": "v2"}})

    def rolled(name: str) -> tuple[str, float] | None:
        annotations = apps.read_namespaced_deployment(name, target).metadata.annotations or {}
        return parse_rolled(annotations.get(settings.ROLLED))
    times: dict[str, tuple[str, float]] = {}
    for name in names:
        found = wait_for(lambda n=name: rolled(n), timeout=60, what=f"{name} rolled in a wave")  # type: ignore[misc]
        assert found is not None
        times[name] = found
    assert times["first"][1] <= min(times["second"][1], times["third"][1])
    stays(lambda: all(replicasets(apps, target, n) == 2 for n in names), 3, what="one rollout each")
