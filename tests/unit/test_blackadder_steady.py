"""Blackadder's game days, pure decisions (kopf_operators.blackadder.steady): no cluster."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from kopf_operators.blackadder import steady
from kopf_operators.blackadder.probes import Probes
from kopf_operators.blackadder.targets import pod_ref
from kopf_operators.core.api import ApiError
from tests.unit.fake_access import FakeAccess

SPEC = {"steadyState": {"intervalSeconds": 2, "failureThreshold": 2, "checks": [
    {"name": "web", "workload": {"kind": "Deployment", "namespace": "elsewhere", "name": "web",
                                 "minAvailable": "50%"}},
    {"name": "health", "http": {"url": "http://127.0.0.1:8080/healthz"}}]},
    "duration": "1m30s", "maxActions": 3}


def test_an_agent_without_game_day_fields_has_no_run() -> None:
    game = steady.game_day_from_spec({"eagerness": 10})
    assert not game.enabled
    ledger: dict[str, Any] = {}
    assert steady.run_for(ledger, game, 100.0, 1) is None and "run" not in ledger


def test_spec_is_read_and_a_tenant_check_stays_in_its_namespace() -> None:
    game = steady.game_day_from_spec(SPEC)
    assert (game.interval, game.failure_threshold, game.duration, game.max_actions) == (2, 2, 90, 3)
    assert game.checks[0].spec["namespace"] == "elsewhere" and game.checks[1].kind == "http"
    tenant = steady.game_day_from_spec(SPEC, namespace="team-a")
    assert tenant.checks[0].spec["namespace"] == "team-a"


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("1h30m", 5400), ("", None),
                                               ("soon", None), (None, None)])
def test_durations(text: Any, seconds: float | None) -> None:
    assert steady.parse_duration(text) == seconds


@pytest.mark.parametrize(("obj", "wanted", "ok"), [
    ({"spec": {"replicas": 4}, "status": {"availableReplicas": 2}}, "50%", True),
    ({"spec": {"replicas": 4}, "status": {"availableReplicas": 1}}, "50%", False),
    ({"spec": {"replicas": 3}, "status": {"availableReplicas": 2}}, None, False),
    ({"spec": {"replicas": 3}, "status": {"availableReplicas": 2}}, 2, True),
    ({"spec": {"replicas": 3}, "status": {}}, "0%", True),
    (None, 1, False),
])
def test_workload_availability(obj: Any, wanted: Any, ok: bool) -> None:
    assert steady.workload_answer("Deployment", obj, wanted)[0] is ok


def test_daemonset_and_immortal_container() -> None:
    ds = {"status": {"desiredNumberScheduled": 3, "numberAvailable": 3}}
    assert steady.workload_answer("DaemonSet", ds, None) == (True, "3/3 available (needs 3)")
    ic = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert steady.workload_answer("ImmortalContainer", ic, None) == (False, "not Ready")


def test_prometheus_answers() -> None:
    vector = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [1, "0.5"]}, {"metric": {}, "value": [1, "2"]}]}}
    assert steady.prometheus_answer(vector, "<", 1) == (False, "2 not < 1")
    assert steady.prometheus_answer(vector, "<", 3)[0]
    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1, "7"]}}
    assert steady.prometheus_answer(scalar, ">=", 7) == (True, "7 >= 7")
    empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
    assert steady.prometheus_answer(empty, "<", 1) == (False, "no data")  # proves nothing: fails
    assert not steady.prometheus_answer({"status": "error", "error": "bad"}, "<", 1)[0]


def test_http_checks_fail_closed_and_never_show_a_token() -> None:
    assert steady.http_answer(204) == (True, "HTTP 204")
    assert not steady.http_answer(503)[0] and not steady.http_answer(None, "timeout")[0]
    assert steady.url_refusal("http://127.0.0.1:1/x", ("127.0.0.1",)) is None
    assert "not in the operator's CHAOS_CHECK_HOSTS" in str(steady.url_refusal("http://evil/x", ("127.0.0.1",)))
    assert steady.url_refusal("http://127.0.0.1/x", ()) is not None  # empty allow-list: no host
    assert steady.url_refusal("file:///etc/passwd", ("127.0.0.1",)) is not None
    shown = steady.safe_url("https://user:pw@api.example:8443/hook/SECRET?token=T#f")
    assert shown == "https://api.example:8443" and "SECRET" not in shown


def test_consecutive_failures_halt_and_a_pass_resets_them() -> None:
    game = steady.game_day_from_spec(SPEC)
    run = steady.new_run(0.0, 1)
    steady.record_check(run, "web", False, "1/4 available (needs 2)")
    assert steady.failing_checks(run, game) == ["web"] and steady.broken_check(run, game) is None
    steady.record_check(run, "web", True, "2/4")
    steady.record_check(run, "web", False, "x")
    assert steady.broken_check(run, game) is None
    steady.record_check(run, "web", False, "0/4 available (needs 2)")
    assert steady.broken_check(run, game) == ("web", "0/4 available (needs 2)")
    assert run["checks"]["web"]["pass"] == 1 and run["checks"]["web"]["fail"] == 3


def test_duration_and_max_actions_end_the_run_and_raising_them_reopens_it() -> None:
    game = steady.game_day_from_spec(SPEC)
    ledger: dict[str, Any] = {}
    run = steady.run_for(ledger, game, 1000.0, 1)
    assert run is not None and steady.limit_reached(run, game, 1089.0) is None
    assert steady.limit_reached(run, game, 1090.0) == (steady.DURATION_ELAPSED, "duration 90s elapsed")
    steady.add_actions(run, {"tantrum": 2, "cancer": 1, "ipsum": 0})
    assert steady.actions_left(run, game) == 0
    assert steady.limit_reached(run, game, 1010.0)[0] == steady.MAX_ACTIONS  # type: ignore[index]
    steady.end_run(run, 1010.0, steady.FINISHED, steady.MAX_ACTIONS, "3 of maxActions 3 taken")
    assert steady.run_for(ledger, game, 1020.0, 2)["state"] == steady.FINISHED  # type: ignore[index]
    more = steady.game_day_from_spec({**SPEC, "maxActions": 10})
    reopened = steady.run_for(ledger, more, 1020.0, 3)
    assert reopened is run and not steady.ended(run) and run["start"] == 1000.0  # the same run goes on


def test_a_halted_run_waits_for_a_spec_edit_then_a_new_run_starts() -> None:
    game = steady.game_day_from_spec(SPEC)
    ledger: dict[str, Any] = {}
    run = steady.run_for(ledger, game, 1000.0, 4)
    steady.end_run(run, 1005.0, steady.HALTED, steady.STEADY_STATE_BROKEN, "check web failed")  # type: ignore[arg-type]
    assert steady.run_for(ledger, game, 1100.0, 4) is run and steady.ended(run)
    fresh = steady.run_for(ledger, game, 1200.0, 5)
    assert fresh is not run and fresh["start"] == 1200.0 and not steady.ended(fresh)  # type: ignore[index]


def _pod(uid: str, owner: str, ready_at: str | None, deleting: bool = False) -> dict[str, Any]:
    cond = {"type": "Ready", "status": "True" if ready_at else "False", "lastTransitionTime": ready_at}
    meta: dict[str, Any] = {"uid": uid, "ownerReferences": [{"uid": owner, "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"conditions": [cond]}}


def test_time_to_recover_comes_from_the_pods_own_conditions() -> None:
    killed_at = 1767225600.0  # 2026-01-01T00:00:00Z
    old = _pod("a", "rs", "2025-12-31T23:00:00Z")
    assert steady.recovery(killed_at, "k", [old, _pod("k", "rs", "2025-12-31T23:00:00Z", deleting=True)])[0] is None
    assert steady.recovery(killed_at, "k", [old, _pod("b", "rs", None)]) == (None, 1, 2)
    assert steady.recovery(killed_at, "k", [old, _pod("b", "rs", "2026-01-01T00:00:07Z")]) == (7.0, 2, 2)
    assert steady.recovery(killed_at, "k", [old]) == (None, 1, 1)  # no replacement Ready since the kill
    assert steady.owned_by(old, "rs") and not steady.owned_by(old, "other")


def test_the_report() -> None:
    run = steady.new_run(1767225600.0, 1)
    steady.note_availability(run, "Deployment/ns/web", 1, 2)
    steady.note_availability(run, "Deployment/ns/web", 2, 2)
    for seconds in (3.0, 5.0, 10.0):
        steady.note_recovery(run, "Deployment/ns/web", seconds)
    steady.record_check(run, "web", True, "2/2")
    steady.add_actions(run, {"tantrum": 3})
    report = steady.run_status(run)
    assert report["workloads"]["Deployment/ns/web"] == {"lowestAvailability": 0.5, "recovered": 3,
                                                        "p50Seconds": 5.0, "maxSeconds": 10.0}
    assert report["start"] == "2026-01-01T00:00:00Z" and report["end"] is None and report["state"] == "Running"
    assert report["verdict"] == "running, held 1/1 checks" and report["actions"] == {"tantrum": 3}
    steady.end_run(run, 1767225700.0, steady.HALTED, steady.STEADY_STATE_BROKEN, "check web failed")
    assert steady.run_status(run)["verdict"].startswith("halted: check web failed")


def test_a_killed_pod_names_its_deployment() -> None:
    pod = pod_ref({"metadata": {"namespace": "ns", "name": "web-5d9f-x", "uid": "u",
                                "labels": {"pod-template-hash": "5d9f"},
                                "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d9f", "uid": "rs",
                                                     "controller": True}]}})
    assert pod.workload_name == "Deployment/ns/web" and pod.owner == "rs"


# --- the probes, with a fake access layer: what cannot be evaluated fails --------------------------------


def _evaluate(probes: Any, check: steady.Check, namespace: str = "") -> tuple[bool, str]:
    return asyncio.run(probes.evaluate(check, namespace))


def test_checks_that_cannot_be_evaluated_fail_closed() -> None:
    access = FakeAccess()
    probes = Probes(access, ("127.0.0.1",), "", "ops")  # type: ignore[arg-type]
    workload = steady.Check("w", "workload", {"kind": "StatefulSet", "namespace": "shop", "name": "db"})
    assert _evaluate(probes, workload) == (False, "StatefulSet not found")
    access.answer("read", ApiError(403, "Forbidden", "no"))
    assert _evaluate(probes, workload) == (False, "could not evaluate: HTTP 403 Forbidden")
    from_secret = steady.Check("h", "http", {"secretRef": {"name": "health"}})
    assert _evaluate(probes, from_secret) == (False, "could not evaluate: Secret ops/health does not exist")
    url = base64.b64encode(b"http://elsewhere.example/health?token=T").decode()
    access.answer("read", {"data": {"address": url}})
    passed, answer = _evaluate(probes, from_secret)
    assert not passed and "elsewhere.example is not in the operator's CHAOS_CHECK_HOSTS" in answer
    assert "token" not in answer
    query = steady.Check("p", "prometheus", {"query": "up", "op": "==", "threshold": 1})
    assert _evaluate(probes, query) == (False, "could not evaluate: no Prometheus configured (CHAOS_PROMETHEUS_URL)")
    unreachable = Probes(access, (), "http://127.0.0.1:9", "ops")  # type: ignore[arg-type]
    assert _evaluate(unreachable, query)[1].startswith("could not evaluate: Prometheus unreachable")
    tenant = Probes(access, ("127.0.0.1",), "http://127.0.0.1:9", "ops", tenant=True)  # type: ignore[arg-type]
    assert not _evaluate(tenant, query)[0] and not _evaluate(tenant, from_secret)[0]
    assert _evaluate(tenant, steady.Check("w", "workload", {"kind": "Deployment", "name": "web"}), "team-a") == (
        False, "Deployment not found")
    assert access.made("read")[-1] == ("read", "Deployment", "team-a", "web")  # its own namespace only
