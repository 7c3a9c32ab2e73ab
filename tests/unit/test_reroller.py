"""Re-roller pure logic: reference discovery, opt-in, hashing, and the rollout decision."""

from __future__ import annotations

import json
from typing import Any, Final

import pytest

from kopf_operators import reroller as logic
from kopf_operators.reroller import Source

CM: Final = "ConfigMap"
SEC: Final = "Secret"

# Every form in which a pod spec can name a ConfigMap or a Secret.
REFERENCE_TABLE: list[tuple[str, dict[str, Any], set[Source]]] = [
    ("volume configMap", {"volumes": [{"name": "v", "configMap": {"name": "a"}}]}, {Source(CM, "a")}),
    ("volume secret", {"volumes": [{"name": "v", "secret": {"secretName": "s"}}]}, {Source(SEC, "s")}),
    ("projected configMap+secret",
     {"volumes": [{"name": "v", "projected": {"sources": [
         {"configMap": {"name": "a"}}, {"secret": {"name": "s"}}, {"serviceAccountToken": {"path": "t"}},
         {"downwardAPI": {"items": []}}]}}]},
     {Source(CM, "a"), Source(SEC, "s")}),
    ("envFrom configMapRef", {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "a"}}]}]},
     {Source(CM, "a")}),
    ("envFrom secretRef", {"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "s"}}]}]},
     {Source(SEC, "s")}),
    ("env configMapKeyRef", {"containers": [{"name": "c", "env": [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "a", "key": "k"}}}]}]}, {Source(CM, "a")}),
    ("env secretKeyRef", {"containers": [{"name": "c", "env": [
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}, {Source(SEC, "s")}),
    ("env plain value and fieldRef ignored", {"containers": [{"name": "c", "env": [
        {"name": "X", "value": "1"},
        {"name": "Y", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}]},
     set()),
    ("init container", {"initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "init"}}]}],
                        "containers": [{"name": "c"}]}, {Source(CM, "init")}),
    ("ephemeral container", {"containers": [{"name": "c"}], "ephemeralContainers": [
        {"name": "e", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "dbg", "key": "k"}}}]}]},
     {Source(SEC, "dbg")}),
    ("optional reference", {"volumes": [{"name": "v", "configMap": {"name": "a", "optional": True}}]},
     {Source(CM, "a", optional=True)}),
    ("required wins over optional",
     {"volumes": [{"name": "v", "configMap": {"name": "a", "optional": True}}],
      "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "a"}}]}]}, {Source(CM, "a")}),
    ("same name, different kinds",
     {"volumes": [{"name": "v", "configMap": {"name": "x"}}, {"name": "w", "secret": {"secretName": "x"}}]},
     {Source(CM, "x"), Source(SEC, "x")}),
    ("other volume types and empty spec", {"volumes": [{"name": "v", "emptyDir": {}}]}, set()),
]


@pytest.mark.parametrize(("pod_spec", "expected"), [(s, e) for _, s, e in REFERENCE_TABLE],
                         ids=[n for n, _, _ in REFERENCE_TABLE])
def test_references(pod_spec: dict[str, Any], expected: set[Source]) -> None:
    assert logic.references(pod_spec) == expected


def workload(annotations: dict[str, str] | None = None, template_annotations: dict[str, str] | None = None,
             pod_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"template": {"metadata": {"annotations": template_annotations or {}},
                                  "spec": pod_spec or {"containers": [{"name": "c"}]}}}}


POD = {"volumes": [{"name": "v", "configMap": {"name": "nginx-conf"}}],
       "containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "creds"}}]}]}


@pytest.mark.parametrize(("annotations", "template_annotations", "expected"), [
    ({}, {}, set()),
    ({logic.AUTO: "true"}, {}, {Source(CM, "nginx-conf"), Source(SEC, "creds")}),
    ({logic.AUTO: "false"}, {}, set()),
    ({}, {logic.AUTO: "True"}, {Source(CM, "nginx-conf"), Source(SEC, "creds")}),
    ({logic.RELOADER_AUTO: "true"}, {}, {Source(CM, "nginx-conf"), Source(SEC, "creds")}),
    ({logic.CONFIGMAPS: "nginx-conf, other"}, {}, {Source(CM, "nginx-conf"), Source(CM, "other")}),
    ({logic.SECRETS: "creds"}, {}, {Source(SEC, "creds")}),
    ({logic.RELOADER_CONFIGMAPS: "nginx-conf"}, {}, {Source(CM, "nginx-conf")}),
    ({logic.RELOADER_SECRETS: "x,y"}, {}, {Source(SEC, "x"), Source(SEC, "y")}),
    ({logic.CONFIGMAPS: " , "}, {}, set()),
])
def test_watched_sources(annotations: dict[str, str], template_annotations: dict[str, str],
                         expected: set[Source]) -> None:
    body = workload(annotations, template_annotations, POD)
    assert logic.watched_sources(body) == expected
    assert (logic.workload_state(body) is not None) == bool(expected)


def test_source_hash_is_stable_and_order_independent() -> None:
    a = {"data": {"x": "1", "y": "2"}, "metadata": {"uid": "u1", "resourceVersion": "1"}}
    b = {"data": {"y": "2", "x": "1"}, "metadata": {"uid": "u2", "resourceVersion": "99",
                                                   "labels": {"new": "label"}}}
    assert logic.source_hash(CM, a) == logic.source_hash(CM, b)
    assert logic.source_hash(CM, a) == logic.source_hash(CM, json.loads(json.dumps(a)))


def test_source_hash_differs_on_data_change() -> None:
    base = {"data": {"nginx.conf": "worker_processes 1;"}}
    h = logic.source_hash(CM, base)
    assert h != logic.source_hash(CM, {"data": {"nginx.conf": "worker_processes 2;"}})
    assert h != logic.source_hash(CM, {"data": {"other.conf": "worker_processes 1;"}})
    assert h != logic.source_hash(CM, {**base, "binaryData": {"b": "AAE="}})
    assert logic.source_hash(CM, {}) == logic.source_hash(CM, {"data": None})


def test_secret_hash_never_contains_the_value() -> None:
    h = logic.source_hash(SEC, {"data": {"password": "c2VjcmV0"}})
    assert "c2VjcmV0" not in h and "secret" not in h and len(h) == 16


def test_combined_hash_is_order_independent() -> None:
    assert logic.combined_hash({"a": "1", "b": "2"}) == logic.combined_hash({"b": "2", "a": "1"})
    assert logic.combined_hash({"a": "1"}) != logic.combined_hash({"a": "2"})


SOURCES = {Source(CM, "nginx-conf"), Source(SEC, "creds")}
LOOKUP = {(CM, "nginx-conf"): "1111111111111111", (SEC, "creds"): "2222222222222222"}


def observed(snap: logic.Snapshot) -> dict[str, str]:
    return logic.metadata_patch(logic.Plan("baseline", new_hash=snap.hash), snap)["metadata"]["annotations"]


def test_first_sighting_records_the_baseline_without_rolling() -> None:
    snap = logic.snapshot(SOURCES, LOOKUP)
    plan = logic.plan({}, snap)
    assert plan.action == "baseline"
    patch = logic.metadata_patch(plan, snap)
    assert "spec" not in patch  # the pod template is not touched: no rollout
    assert patch["metadata"]["annotations"][logic.OBSERVED_HASH] == snap.hash


def test_unchanged_data_is_a_noop() -> None:
    snap = logic.snapshot(SOURCES, LOOKUP)
    assert logic.plan(observed(snap), snap).action == "none"


def test_changed_data_rolls_and_names_the_source() -> None:
    before = observed(logic.snapshot(SOURCES, LOOKUP))
    snap = logic.snapshot(SOURCES, {**LOOKUP, (CM, "nginx-conf"): "3333333333333333"})
    plan = logic.plan(before, snap)
    assert plan.action == "roll" and plan.changed == ("configmap/nginx-conf",)
    patch = logic.roll_patch(plan, snap)
    assert patch["spec"]["template"]["metadata"]["annotations"][logic.CONFIG_HASH] == snap.hash
    assert patch["metadata"]["annotations"][logic.OBSERVED_HASH] == snap.hash


def test_missing_required_source_waits_and_keeps_the_baseline() -> None:
    before = observed(logic.snapshot(SOURCES, LOOKUP))
    snap = logic.snapshot(SOURCES, {(SEC, "creds"): LOOKUP[(SEC, "creds")]})
    plan = logic.plan(before, snap)
    assert plan.action == "wait-missing" and plan.missing == ("configmap/nginx-conf",)
    # Recreated with the same data: nothing to do.
    assert logic.plan(before, logic.snapshot(SOURCES, LOOKUP)).action == "none"


def test_missing_optional_source_is_hashed_as_absent() -> None:
    sources = {Source(CM, "opt", optional=True)}
    snap = logic.snapshot(sources, {})
    assert snap.per_source == {"configmap/opt": logic.ABSENT} and not snap.missing
    later = logic.snapshot(sources, {(CM, "opt"): "4444444444444444"})
    assert logic.plan(observed(snap), later).action == "roll"


def test_changed_set_of_sources_rebaselines_without_a_second_rollout() -> None:
    before = observed(logic.snapshot({Source(CM, "nginx-conf")}, LOOKUP))
    plan = logic.plan(before, logic.snapshot(SOURCES, LOOKUP))
    assert plan.action == "baseline"


def test_foreign_baseline_without_per_source_hashes_rolls() -> None:
    snap = logic.snapshot(SOURCES, LOOKUP)
    plan = logic.plan({logic.OBSERVED_HASH: "something-else"}, snap)
    assert plan.action == "roll" and set(plan.changed) == {"configmap/nginx-conf", "secret/creds"}


def test_needs_reconcile() -> None:
    body = workload({logic.AUTO: "true"}, pod_spec=POD)
    state = logic.workload_state(body)
    assert logic.needs_reconcile(state, LOOKUP)  # no baseline yet
    snap = logic.snapshot(SOURCES, LOOKUP)
    body["metadata"]["annotations"].update(observed(snap))
    assert not logic.needs_reconcile(logic.workload_state(body), LOOKUP)
    assert not logic.needs_reconcile(logic.workload_state(workload(pod_spec=POD)), LOOKUP)
    missing = {(SEC, "creds"): LOOKUP[(SEC, "creds")]}
    assert logic.needs_reconcile(logic.workload_state(body), missing)
    assert not logic.needs_reconcile(logic.workload_state(body), missing, ("configmap/nginx-conf",))


def test_workload_index_entries() -> None:
    body = workload({logic.AUTO: "true"}, pod_spec=POD)
    entries = logic.workload_index_entries(("Deployment", "ns", "w"), body)
    assert entries[(CM, "ns", "nginx-conf")] == ("Deployment", "ns", "w")
    assert entries[(SEC, "ns", "creds")] == ("Deployment", "ns", "w")
    assert isinstance(entries[("state", "Deployment", "ns", "w")], logic.WorkloadState)
    assert logic.workload_index_entries(("Deployment", "ns", "w"), workload(pod_spec=POD)) == {}
