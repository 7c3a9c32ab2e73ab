"""Shared helpers: configuration parsing, condition bookkeeping, metrics rendering."""

from __future__ import annotations

import pytest

from kopf_operators.common import Config, Metrics, set_condition, stable_hash


def test_config_defaults_are_safe() -> None:
    cfg = Config.from_env({})
    assert cfg.chaos_dry_run is False  # local `make run`; the chart and manifests default to true
    assert cfg.copyrator_allow_cross_namespace is False
    assert cfg.metrics_port == 0


def test_config_reads_environment() -> None:
    cfg = Config.from_env({"CHAOS_DRY_RUN": "true", "COPYRATOR_ALLOW_CROSS_NAMESPACE": "yes",
                           "REROLLER_DEBOUNCE_SECONDS": "0.5", "METRICS_PORT": "9090",
                           "OPERATOR_NAMESPACE": "ops"})
    assert cfg.chaos_dry_run and cfg.copyrator_allow_cross_namespace
    assert cfg.reroller_debounce_seconds == 0.5
    assert cfg.metrics_port == 9090
    assert cfg.operator_namespace == "ops"


@pytest.mark.parametrize(("env", "message"), [
    ({"CHAOS_DRY_RUN": "maybe"}, "CHAOS_DRY_RUN='maybe' is not a boolean"),
    ({"REROLLER_DEBOUNCE_SECONDS": "soon"}, "is not a number"),
    ({"COPYRATOR_RESYNC_SECONDS": "0"}, "must be at least 1.0"),
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


def test_metrics_render_in_prometheus_text_format() -> None:
    metrics = Metrics()
    metrics.inc("ops_total", "Things done.", operator="immortal", action="pod-created")
    metrics.inc("ops_total", "Things done.", operator="immortal", action="pod-created")
    text = metrics.render()
    assert "# TYPE ops_total counter" in text
    assert 'ops_total{action="pod-created",operator="immortal"} 2' in text
