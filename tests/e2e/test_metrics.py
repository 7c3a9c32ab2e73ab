"""The Prometheus endpoint counts what the operators do (issue: operations)."""

from __future__ import annotations

from typing import Any

from tests.e2e.immortal_helpers import pod_or_none
from tests.kube import OperatorProcess, wait_for
from testsupport.kubectl import apply_yaml
from testsupport.launcher import counter


def apply_ic(namespace: str, name: str) -> None:
    apply_yaml(f"""
apiVersion: immortalcontainer.flugel.it/v1alpha1
kind: ImmortalContainer
metadata: {{name: {name}}}
spec: {{image: nginx:latest}}
""", namespace)


def test_metrics_count_each_pod_the_operator_starts(namespace: str, operator: OperatorProcess, core: Any) -> None:
    started = counter(operator.metrics(), "kopf_operators_actions_total", operator="immortal", action="create-pod")
    apply_ic(namespace, "counted")
    wait_for(lambda: core.read_namespaced_pod("counted-immortalpod", namespace), timeout=30, what="the pod")
    wait_for(lambda: counter(operator.metrics(), "kopf_operators_actions_total", operator="immortal",
                             action="create-pod") == started + 1, timeout=10, what="the counter to grow by one")
    text = operator.metrics()
    assert "# TYPE kopf_operators_actions_total counter" in text


def test_reaction_latency_is_a_histogram_per_operator(namespace: str, operator: OperatorProcess, core: Any) -> None:
    def reactions() -> float:
        return counter(operator.metrics(), "kopf_operators_reaction_seconds_count",
                       operator="immortal", trigger="pod deleted")

    before = reactions()
    apply_ic(namespace, "timed")
    pod = wait_for(lambda: core.read_namespaced_pod("timed-immortalpod", namespace), timeout=30, what="the pod")
    core.delete_namespaced_pod("timed-immortalpod", namespace, grace_period_seconds=0)
    wait_for(lambda: reactions() > before, timeout=30, what="a timed reaction to the pod's deletion")
    # A replacement (a stray KWOK delete may have replaced it once more: see immortal_helpers.delete_pod).
    wait_for(lambda: (new := pod_or_none(core, namespace, "timed-immortalpod")) is not None
             and new.metadata.uid != pod.metadata.uid, timeout=30, what="a new pod")
    assert "# TYPE kopf_operators_reaction_seconds histogram" in operator.metrics()


def test_events_are_counted_by_resource_and_outcome(namespace: str, operator: OperatorProcess, core: Any) -> None:
    """Every watch event of a resource without change handlers is processed, or skipped (superseded by
    a newer one of the same object, the echo of our own write, or a change nothing reads); a new
    ImmortalContainer brings its own and its pod's."""

    def events(resource: str) -> float:
        text = operator.metrics()
        return sum(counter(text, "kopf_operators_events_total", resource=resource, outcome=outcome)
                   for outcome in ("processed", "superseded", "echo", "unchanged"))

    before = {resource: events(resource) for resource in ("immortalcontainers", "pods")}
    apply_ic(namespace, "eventful")
    wait_for(lambda: core.read_namespaced_pod("eventful-immortalpod", namespace), timeout=30, what="the pod")
    wait_for(lambda: all(events(resource) > count for resource, count in before.items()), timeout=10,
             what="events of both resources counted")
    assert "# TYPE kopf_operators_events_total counter" in operator.metrics()
