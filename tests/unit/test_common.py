"""Shared helpers: configuration parsing, condition bookkeeping, metrics rendering."""

from __future__ import annotations

import pytest

from kopf_operators.core.conventions import (
    Config,
    kstatus_conditions,
    matches_label_selector,
    set_condition,
    stable_hash,
    stall_event,
)


def test_config_defaults() -> None:
    cfg = Config.from_env({})
    assert (cfg.operator_namespace, cfg.operator_pod_name, cfg.metrics_port) == ("", "", 0)


def test_config_reads_environment() -> None:
    cfg = Config.from_env({"METRICS_PORT": "9090", "OPERATOR_NAMESPACE": "ops", "OPERATOR_POD_NAME": "op-1"})
    assert (cfg.operator_namespace, cfg.operator_pod_name, cfg.metrics_port) == ("ops", "op-1", 9090)


@pytest.mark.parametrize(("env", "message"), [
    ({"METRICS_PORT": "soon"}, "METRICS_PORT='soon' is not a number"),
    ({"METRICS_PORT": "-1"}, "must be at least 0.0"),
])
def test_config_rejects_malformed_values_with_a_clear_message(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config.from_env(env)


def test_condition_keeps_transition_time_while_status_holds() -> None:
    first = set_condition([], "Ready", True, "PodRunning", "ok", observed_generation=1, now="t1")
    again = set_condition(first, "Ready", True, "PodRunning", "still ok", observed_generation=2, now="t2")
    assert again == [{"type": "Ready", "status": "True", "reason": "PodRunning", "message": "still ok",
                      "lastTransitionTime": "t1", "observedGeneration": 2}]
    flipped = set_condition(again, "Ready", False, "PodMissing", "gone", now="t3")
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["status"] == "False"


def test_condition_replaces_only_its_own_type() -> None:
    conds = set_condition([{"type": "Conflict", "status": "False"}], "Ready", True, "R", "m", now="t")
    assert [c["type"] for c in conds] == ["Conflict", "Ready"]


def test_stable_hash_ignores_key_order_and_tracks_values() -> None:
    assert stable_hash({"a": 1, "b": 2}) == stable_hash({"b": 2, "a": 1})
    assert stable_hash({"a": 1}) != stable_hash({"a": 2})


def test_label_selector_semantics() -> None:
    labels = {"team": "a", "tier": "web"}
    assert matches_label_selector(labels, None) and matches_label_selector(labels, {})
    assert matches_label_selector(labels, {"matchLabels": {"team": "a"}})
    assert not matches_label_selector(labels, {"matchLabels": {"team": "b"}})
    assert matches_label_selector(labels, {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]})
    assert not matches_label_selector(labels, {"matchExpressions": [{"key": "tier", "operator": "NotIn",
                                                                     "values": ["web"]}]})
    assert not matches_label_selector(labels, {"matchExpressions": [{"key": "x", "operator": "Exists"}]})
    assert matches_label_selector(labels, {"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]})


def by_type(conditions: list[dict[str, object]]) -> dict[object, object]:
    return {c["type"]: c["status"] for c in conditions}


def test_kstatus_conditions_make_exactly_one_of_ready_reconciling_stalled_true() -> None:
    assert by_type(kstatus_conditions([], ready=True, stalled=False, reason="R", message="m")) == {
        "Ready": "True", "Reconciling": "False", "Stalled": "False"}
    assert by_type(kstatus_conditions([], ready=False, stalled=False, reason="R", message="m")) == {
        "Ready": "False", "Reconciling": "True", "Stalled": "False"}
    assert by_type(kstatus_conditions([], ready=False, stalled=True, reason="R", message="m")) == {
        "Ready": "False", "Reconciling": "False", "Stalled": "True"}
    with pytest.raises(ValueError):
        kstatus_conditions([], ready=True, stalled=True, reason="R", message="m")


def test_stall_event_on_transitions_only() -> None:
    working = kstatus_conditions([], ready=True, stalled=False, reason="Fine", message="ok")
    stuck = kstatus_conditions(working, ready=False, stalled=True, reason="ForeignPod", message="pod x is in the way")
    assert stall_event(working, stuck) == ("Warning", "Stalled", "ForeignPod: pod x is in the way")
    assert stall_event([], stuck) == ("Warning", "Stalled", "ForeignPod: pod x is in the way")
    assert stall_event(stuck, stuck) is None  # still stalled for the same reason: no new Event
    other = kstatus_conditions(stuck, ready=False, stalled=True, reason="InvalidTemplate", message="refused")
    assert stall_event(stuck, other) == ("Warning", "Stalled", "InvalidTemplate: refused")
    recovered = stall_event(stuck, working)
    assert recovered is not None and recovered[:2] == ("Normal", "Recovered")
    assert stall_event(working, working) is None and stall_event([], working) is None
