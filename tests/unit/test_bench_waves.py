"""The progressive-rollouts benchmark's arithmetic (bench/sections/reroller_waves.py): when a Deployment's
rollout is over, the waves the rollouts show, and how long the gate took to let each go."""

from __future__ import annotations

from typing import Any

from bench.report import waves_table
from bench.sections.reroller_waves import finished, gate_done, timeline, waves_seen


def deployment(generation: int = 2, observed: int = 2, replicas: int = 1, updated: int = 1, available: int = 1,
               desired: int | None = 1) -> dict[str, Any]:
    return {"metadata": {"name": "d", "generation": generation}, "spec": {"replicas": desired},
            "status": {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": updated,
                       "availableReplicas": available}}


def test_a_rollout_is_over_when_every_replica_is_updated_and_available_and_no_old_one_is_left() -> None:
    assert finished(deployment())
    assert gate_done(deployment())


def test_a_rollout_its_controller_has_not_seen_is_not_over() -> None:
    assert not finished(deployment(generation=3, observed=2))
    assert not gate_done(deployment(generation=3, observed=2))


def test_an_old_replica_still_there_keeps_it_going_for_kubectl_and_the_gate() -> None:
    # The new pod is created, the old one still serves: 2 replicas, 1 updated, 1 available (the old one).
    surging = deployment(replicas=2, updated=1, available=1)
    assert not finished(surging)
    assert not gate_done(surging)  # the gate, too, waits until no old replica is left


def test_an_update_not_yet_available_is_not_over() -> None:
    assert not finished(deployment(available=0))
    assert not finished(deployment(updated=0, replicas=1))


def test_an_unset_replicas_means_one() -> None:
    assert finished(deployment(desired=None))
    assert not finished(deployment(desired=None, updated=0))


def test_rollouts_written_while_earlier_ones_roll_are_one_wave() -> None:
    rolled = {"a": 0.0, "b": 0.1, "c": 0.2}
    assert waves_seen(rolled, {"a": 1.0, "b": 1.1, "c": 1.2}) == [3]


def test_a_rollout_written_after_all_earlier_ones_finished_opens_a_wave() -> None:
    rolled = {"a": 0.0, "b": 1.5, "c": 1.6, "d": 3.0, "e": 3.0, "f": 3.1, "g": 3.1}
    done = {"a": 1.0, "b": 2.0, "c": 2.9, "d": 4.0, "e": 4.0, "f": 4.1, "g": 4.2}
    assert waves_seen(rolled, done) == [1, 2, 4]


def test_a_wave_mate_finishing_before_the_last_of_its_wave_is_written_does_not_split_it() -> None:
    # b finished before c was written, but a (written before c) had not: c belongs with b.
    assert waves_seen({"a": 0.0, "b": 0.1, "c": 0.5}, {"a": 2.0, "b": 0.4, "c": 3.0}) == [3]


def test_a_rollout_that_never_finished_holds_every_later_one_in_its_wave() -> None:
    assert waves_seen({"a": 0.0, "b": 5.0}, {"b": 6.0}) == [2]


def test_no_rollout_no_wave() -> None:
    assert waves_seen({}, {}) == []


def test_the_timeline_follows_the_gates_order_and_times_each_release() -> None:
    order = ["a", "b", "c", "d"]
    rolled = {"a": 10.5, "b": 12.0, "c": 16.0, "d": 13.0}  # d (wave 3) written before c (wave 2) finished
    done = {"a": 11.0, "b": 14.0, "c": 17.0, "d": 15.0}
    first, second, third = timeline(order, [1, 2, 1], rolled, done, t0=10.0)
    assert first == {"size": 1, "rolled": 1, "first_rollout_s": 0.5, "last_rollout_s": 0.5, "release_s": 0.5,
                     "early": 0, "finished_s": 1.0}
    assert second == {"size": 2, "rolled": 2, "first_rollout_s": 2.0, "last_rollout_s": 6.0, "release_s": 1.0,
                      "early": 0, "finished_s": 7.0}
    assert third["first_rollout_s"] == 3.0 and third["release_s"] == -4.0 and third["early"] == 1


def test_a_wave_not_rolled_or_not_finished_says_so() -> None:
    first, second = timeline(["a", "b"], [1, 1], {"a": 1.0}, {}, t0=0.0)
    assert first["rolled"] == 1 and "finished_s" not in first
    assert second == {"size": 1, "rolled": 0}


def test_the_table_sets_progressive_beside_immediate() -> None:
    api = {"writes": 2.0, "reads": 0.0, "requests": 2.0, "by_verb_resource": {}}
    side = {"deployments": 3, "last_rollout_s": 0.2, "all_finished_s": 1.0, "waves": 1, "wave_sizes": [3],
            "release_p50_s": 0.1, "release_max_s": 0.2, "api_per_workload": api}
    text = waves_table({"reroller_waves": {"what": "w", "immediate": side,
                                           "progressive": {**side, "waves": 2, "wave_sizes": [1, 2]}}})
    assert "| Waves seen (sizes) | 2 (1, 2) | 1 |" in text
    assert "no Go peer" in text
    assert "not run" in waves_table({})
