"""Progressive rollouts' decisions (reroller.waves): wave sizes, health from each kind's status, the gate."""

from __future__ import annotations

from typing import Any

import pytest

from kopf_operators.core.rollouts import rollout_status
from kopf_operators.reroller import waves
from kopf_operators.reroller.settings import DEFAULT_PRIORITY, WaveSize, parse_wave_size
from kopf_operators.reroller.views import parse_priority
from kopf_operators.reroller.waves import Gate, Health, Member


def key(i: int) -> tuple[str, str, str]:
    return ("Deployment", "ns", f"w-{i:02d}")


def test_waves_start_small_and_double() -> None:
    assert waves.wave_sizes(1, 1) == [1]
    assert waves.wave_sizes(3, 1) == [1, 2]
    assert waves.wave_sizes(200, 1) == [1, 2, 4, 8, 16, 32, 64, 73]
    assert waves.wave_sizes(10, 3) == [3, 6, 1]
    assert WaveSize(count=None, percent=10).first(200) == 20
    assert WaveSize(count=None, percent=10).first(3) == 1  # at least one


@pytest.mark.parametrize("text, expected", [
    ("", WaveSize()), ("2", WaveSize(count=2)), (" 25% ", WaveSize(count=None, percent=25.0)),
    ("100%", WaveSize(count=None, percent=100.0))])
def test_wave_size_parses(text: str, expected: WaveSize) -> None:
    assert parse_wave_size(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "0%", "101%", "nan%", "inf%", "x", "1234567", "%"])
def test_bad_wave_sizes_are_refused_readably(text: str) -> None:
    with pytest.raises(ValueError, match=r"count of workloads|percentage"):
        parse_wave_size(text)


def test_the_first_wave_rolls_at_once_and_the_next_waits_for_it() -> None:
    members = [Member(key(i)) for i in range(3)]
    assert waves.gate(members, key(0), WaveSize()).gate is Gate.GO
    v = waves.gate(members, key(1), WaveSize())
    assert (v.gate, v.wave, v.waves, v.blocker) == (Gate.WAIT, 2, 2, key(0))
    assert "has not started" in v.message
    rolling = [Member(key(0), caught_up=True, health=Health.ROLLING, how="0/1 updated"), *members[1:]]
    assert waves.gate(rolling, key(2), WaveSize()).gate is Gate.WAIT
    done = [Member(key(0), caught_up=True), *members[1:]]
    assert waves.gate(done, key(1), WaveSize()).gate is Gate.GO
    assert waves.gate(done, key(2), WaveSize()).gate is Gate.GO  # same wave as w-01


def test_a_failed_earlier_wave_halts_the_rest_and_a_release_lets_them_roll() -> None:
    failed = Member(key(0), caught_up=True, health=Health.FAILED, how="ProgressDeadlineExceeded: x")
    members = [failed, Member(key(1)), Member(key(2))]
    v = waves.gate(members, key(2), WaveSize())
    assert (v.gate, v.blocker) == (Gate.HALT, key(0))
    assert "Deployment ns/w-00 of an earlier wave failed its rollout: ProgressDeadlineExceeded" in v.message
    assert waves.gate(members, key(2), WaveSize(), released=True).gate is Gate.GO
    # Not caught up with this change (a new one): its old failure does not count; it rolls first.
    fresh = [Member(key(0), caught_up=False, health=Health.FAILED), Member(key(1))]
    assert waves.gate(fresh, key(0), WaveSize()).gate is Gate.GO
    assert waves.gate(fresh, key(1), WaveSize()).gate is Gate.WAIT


def test_the_wave_annotation_picks_the_canary_and_the_order_is_stable() -> None:
    members = [Member(key(0)), Member(key(1)), Member(key(2), priority=1)]
    assert waves.gate(members, key(2), WaveSize()).gate is Gate.GO
    assert waves.gate(list(reversed(members)), key(0), WaveSize()).blocker == key(2)
    assert parse_priority("1") == 1 and parse_priority("x") == DEFAULT_PRIORITY
    assert parse_priority("99999999") == DEFAULT_PRIORITY


def test_a_workload_that_is_no_user_is_not_gated() -> None:
    assert waves.gate([Member(key(0))], key(5), WaveSize()).gate is Gate.GO


def deployment(generation: int = 2, observed: int = 2, replicas: int = 3, updated: int = 3, available: int = 3,
               progressing: tuple[str, str] | None = None) -> dict[str, Any]:
    conditions = [{"type": "Progressing", "status": progressing[0], "reason": progressing[1], "message": "m"}] \
        if progressing else []
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "availableReplicas": available,
                       "conditions": conditions}}


def test_health_of_a_deployment() -> None:
    done = rollout_status("Deployment", deployment())
    assert waves.health(done, 0, 1000, 600)[0] is Health.DONE
    lagging = rollout_status("Deployment", deployment(observed=1))
    assert waves.health(lagging, 900, 1000, 600) == (Health.ROLLING, "its controller has not seen the change yet")
    rolling = rollout_status("Deployment", deployment(updated=1, available=2))
    assert waves.health(rolling, 900, 1000, 600) == (Health.ROLLING, "1/3 updated, 2/3 available")
    late = waves.health(rolling, 0, 1000, 600)
    assert late[0] is Health.FAILED and late[1].startswith("not finished 10 min after its rollout")
    stuck = deployment(available=2, progressing=("False", "ProgressDeadlineExceeded"))
    gave_up = rollout_status("Deployment", stuck)
    assert waves.health(gave_up, 999, 1000, 600)[0] is Health.FAILED
    assert waves.health(None, None, 0, 600)[0] is Health.DONE  # a CronJob or a Job


def test_health_of_statefulsets_daemonsets_and_argo_rollouts() -> None:
    sts: dict[str, Any] = {"metadata": {"generation": 3}, "spec": {"replicas": 2},
           "status": {"observedGeneration": 3, "updatedReplicas": 0, "currentReplicas": 2, "availableReplicas": 2,
                      "currentRevision": "r2", "updateRevision": "r2"}}
    assert waves.health(rollout_status("StatefulSet", sts), 0, 10, 600)[0] is Health.DONE
    sts["status"]["updateRevision"] = "r3"
    assert waves.health(rollout_status("StatefulSet", sts), 0, 10, 600)[0] is Health.ROLLING
    ds = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "desiredNumberScheduled": 4,
                                                   "updatedNumberScheduled": 4, "numberAvailable": 3}}
    assert waves.health(rollout_status("DaemonSet", ds), 0, 10, 600)[0] is Health.ROLLING
    argo = {"metadata": {"generation": 1}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, "phase": "Degraded", "message": "ProgressDeadlineExceeded"}}
    assert waves.health(rollout_status("Rollout", argo), 0, 10, 600) == (
        Health.FAILED, "Argo Rollout Degraded: ProgressDeadlineExceeded")
    assert rollout_status("CronJob", {}) is None


def test_rolled_annotation_round_trips_and_refuses_junk() -> None:
    assert waves.parse_rolled(waves.rolled_value("abc123", 1700000000.4)) == ("abc123", 1700000000.0)
    for junk in (None, "", "abc", "@1", "abc@x", "abc@inf", "abc@nan"):
        assert waves.parse_rolled(junk) is None
