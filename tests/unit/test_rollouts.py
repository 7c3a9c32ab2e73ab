"""core.rollouts.in_progress: when a workload's own controller is still rolling it out (pure)."""

from __future__ import annotations

from typing import Any

from kopf_operators.core.rollouts import RolloutStatus, in_progress, rollout_status


def deployment(generation: int = 2, observed: int = 2, replicas: int = 3, updated: int = 3, available: int = 3,
               progressing: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "availableReplicas": available,
                       "conditions": [progressing] if progressing else []}}


def test_a_rolled_out_workload_is_not_in_progress() -> None:
    assert not in_progress(RolloutStatus(2, 2, 3, 3, 3))
    assert not in_progress(rollout_status("Deployment", deployment()))


def test_an_unobserved_spec_is_in_progress() -> None:
    assert in_progress(RolloutStatus(3, 2, 3, 3, 3))
    assert in_progress(rollout_status("Deployment", deployment(generation=3)))


def test_replicas_not_yet_updated_or_available_are_in_progress() -> None:
    assert in_progress(RolloutStatus(2, 2, 3, 1, 3))
    assert in_progress(RolloutStatus(2, 2, 3, 3, 2))
    assert in_progress(rollout_status("Deployment", deployment(updated=1, available=2)))


def test_a_failed_rollout_is_not_in_progress() -> None:
    """Its controller has given up: nothing is rolling any more."""
    assert not in_progress(RolloutStatus(2, 2, 3, 1, 1, failed="ProgressDeadlineExceeded: no progress"))
    stuck = deployment(updated=1, available=1, progressing={"type": "Progressing", "status": "False",
                                                            "reason": "ProgressDeadlineExceeded"})
    assert not in_progress(rollout_status("Deployment", stuck))


def test_no_status_and_kinds_that_do_not_roll_are_not_in_progress() -> None:
    assert not in_progress(None)
    assert not in_progress(rollout_status("CronJob", {"spec": {}}))
    assert not in_progress(rollout_status("Job", {"spec": {}}))


def test_statefulsets_and_daemonsets_by_their_own_fields() -> None:
    sts: dict[str, Any] = {"metadata": {"generation": 1}, "spec": {"replicas": 2},
                           "status": {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 2,
                                      "currentRevision": "a", "updateRevision": "b"}}
    assert in_progress(rollout_status("StatefulSet", sts))
    finished = {**sts, "status": {**sts["status"], "currentRevision": "b", "currentReplicas": 2, "updatedReplicas": 0}}
    assert not in_progress(rollout_status("StatefulSet", finished))
    ds = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "desiredNumberScheduled": 3,
                                                      "updatedNumberScheduled": 2, "numberAvailable": 3}}
    assert in_progress(rollout_status("DaemonSet", ds))
    assert not in_progress(rollout_status("DaemonSet", {**ds, "status": {**ds["status"], "updatedNumberScheduled": 3}}))


def test_a_deployment_whose_new_pod_never_becomes_ready_is_still_rolling() -> None:
    """Its old pod stays available, so updated and available both reach the desired count: only the
    old pod left (status.replicas over updatedReplicas) says the rollout is not over."""
    body = {"metadata": {"generation": 2}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}}
    status = rollout_status("Deployment", body)
    assert status is not None and not status.finished and in_progress(status)
    body["status"]["replicas"] = 1  # the old pod gone: done
    status = rollout_status("Deployment", body)
    assert status is not None and status.finished and not in_progress(status)
