"""The re-roller's one decision per pass (``decisions.decide``): a workload's baseline, its first
sighting and a first-sighting baseline not written yet, from data alone."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from kopf_operators.core.conventions import DATA_STAMP, REROLLER_PENDING, data_hash
from kopf_operators.reroller import decisions, patches, settings, views
from kopf_operators.reroller.plans import Action

OPTIONS = settings.Options()


def configmap(value: str, rv: str = "3") -> views.SourceView:
    return views.source_view("ConfigMap", {"metadata": {"name": "conf", "namespace": "ns", "resourceVersion": rv},
                                           "data": {"k": value}})


def view(annotations: dict[str, str] | None = None, rv: str = "5") -> views.WorkloadView:
    body: dict[str, Any] = {
        "metadata": {"name": "web", "namespace": "ns", "uid": "u", "resourceVersion": rv,
                     "annotations": {settings.AUTO: "true", **(annotations or {})}},
        "spec": {"template": {"spec": {"containers": [
            {"name": "c", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}}}}
    found = views.workload_view("Deployment", body, OPTIONS)
    assert found is not None
    return found


def lookup(source: views.SourceView | None) -> dict[tuple[str, str], views.SourceView]:
    return {} if source is None else {("ConfigMap", "conf"): source}


def decide(workload: views.WorkloadView, source: views.SourceView | None,
           sighting: decisions.FirstSighting | None = None, now: float = 100.0) -> decisions.Decision:
    return decisions.decide(workload, lookup(source), OPTIONS, sighting, now)


def test_the_first_sighting_decides_the_baseline_and_remembers_it_until_written() -> None:
    first = decide(view(), configmap("v1"))
    assert first.plan is not None and first.plan.action is Action.BASELINE and first.look_in is None
    assert first.sighting == decisions.FirstSighting(rv=5, pending=patches.baseline_annotations(first.plan, first.snap))
    # The write failed (a 409, say) and the data changed meanwhile: that change rolls.
    again = decide(view(), configmap("v2", rv="9"), first.sighting)
    assert again.plan is not None and again.plan.action is Action.ROLL and again.plan.changed == ("configmap/conf",)
    # Unchanged: the remembered baseline is written, not a new one.
    same = decide(view(), configmap("v1"), first.sighting)
    assert same.plan is not None and same.plan.action is Action.BASELINE
    assert same.plan.new_hash == first.plan.new_hash and same.sighting == first.sighting


def test_a_source_newer_than_the_workload_at_its_first_sighting_rolls_it() -> None:
    decision = decide(view(rv="5"), configmap("v2", rv="7"))
    assert decision.plan is not None and decision.plan.action is Action.ROLL
    assert decision.sighting == decisions.FirstSighting(rv=5)  # asked again (the budget), still the same version


def test_a_source_missing_at_the_first_sighting_is_absent_only_once_settled() -> None:
    early = decide(view(), None, now=100.0)
    assert early.plan is None and early.look_in == decisions.ABSENT_SETTLE_SECONDS
    assert early.sighting is not None and early.sighting.absent_until == 100.0 + decisions.ABSENT_SETTLE_SECONDS
    assert decide(view(), None, early.sighting, now=101.0).plan is None  # not yet
    settled = decide(view(), None, early.sighting, now=100.0 + decisions.ABSENT_SETTLE_SECONDS)
    assert settled.plan is not None and settled.plan.action is Action.BASELINE and settled.plan.missing
    late = decide(view(), configmap("v1"), early.sighting, now=101.0)  # only late in its watch stream
    assert late.plan is not None and late.plan.action is Action.BASELINE and not late.plan.missing


def test_a_workload_with_a_baseline_is_planned_against_it() -> None:
    recorded = decide(view(), configmap("v1"))
    assert recorded.sighting is not None and recorded.sighting.pending is not None
    baselined = view(dict(recorded.sighting.pending))
    assert (plan := decide(baselined, configmap("v1")).plan) is not None and plan.action is Action.NONE
    changed = decide(baselined, configmap("v2"))
    assert changed.plan is not None and changed.plan.action is Action.ROLL and changed.sighting is None


def stamped(value: str, stamp_of: str, rv: str = "3") -> views.SourceView:
    """A copy carrying the data stamp of ``stamp_of`` while it holds ``value`` (a hand edit when they differ)."""
    stamp = data_hash("ConfigMap", {"data": {"k": stamp_of}})
    return views.source_view("ConfigMap", {"metadata": {"name": "conf", "namespace": "ns", "resourceVersion": rv,
                                                        "annotations": {DATA_STAMP: stamp}},
                                           "data": {"k": value}})


def test_a_copy_drifted_from_its_stamp_holds_the_workload_until_repaired_or_the_grace_ends() -> None:
    assert not stamped("v1", "v1").drifted and stamped("edited", "v1").drifted and not configmap("x").drifted
    recorded = decide(view(), stamped("v1", "v1"))
    assert recorded.sighting is not None and recorded.sighting.pending is not None
    baselined = view(dict(recorded.sighting.pending))
    since = {("ConfigMap", "conf"): 100.0}
    # The hand edit: nothing now (neither a rollout nor a new baseline), a look when the grace ends.
    held = decisions.decide(baselined, lookup(stamped("edited", "v1")), OPTIONS, None, 110.0, drift_since=since)
    assert held.plan is None and held.look_in == decisions.DRIFT_GRACE_SECONDS - 10.0
    # Put back by its writer: the data is the baseline's, nothing to do.
    repaired = decisions.decide(baselined, lookup(stamped("v1", "v1")), OPTIONS, None, 111.0)
    assert repaired.plan is not None and repaired.plan.action is Action.NONE
    # Never put back: after the grace the edit stands and rolls.
    stands = decisions.decide(baselined, lookup(stamped("edited", "v1")), OPTIONS, None,
                              100.0 + decisions.DRIFT_GRACE_SECONDS, drift_since=since)
    assert stands.plan is not None and stands.plan.action is Action.ROLL
    # A new source edit reaching the copy carries its own stamp: it rolls at once.
    follows = decisions.decide(baselined, lookup(stamped("v2", "v2")), OPTIONS, None, 110.0)
    assert follows.plan is not None and follows.plan.action is Action.ROLL


def test_without_sync_after_restart_the_first_look_records_a_change_made_while_down() -> None:
    recorded = decide(view(), configmap("v1"))
    assert recorded.sighting is not None and recorded.sighting.pending is not None
    baselined = view(dict(recorded.sighting.pending))
    reloaders = settings.Options.from_env({"REROLLER_SYNC_AFTER_RESTART": "false"})
    assert not reloaders.sync_after_restart and settings.Options.from_env({}).sync_after_restart
    absorbed = decisions.decide(baselined, lookup(configmap("v2")), reloaders, None, 100.0, first_look=True)
    assert absorbed.plan is not None and absorbed.plan.action is Action.BASELINE
    assert absorbed.plan.new_hash == decide(baselined, configmap("v2")).snap.hash
    later = decisions.decide(baselined, lookup(configmap("v2")), reloaders, None, 100.0)  # after the first look
    assert later.plan is not None and later.plan.action is Action.ROLL
    ours = decisions.decide(baselined, lookup(configmap("v2")), OPTIONS, None, 100.0, first_look=True)
    assert ours.plan is not None and ours.plan.action is Action.ROLL


# --- decide_pass: the whole pass, one call ---------------------------------------------------------

def step(workload: views.WorkloadView, source: views.SourceView | None, last_roll: float | None = None,
         now: float = 100.0, wall: float = 1_800_000_000.0) -> decisions.Step:
    return decisions.decide_pass(workload, lookup(source), OPTIONS, None, last_roll, now, wall)


def baselined(value: str = "v1", **extra: str) -> views.WorkloadView:
    recorded = decide(view(), configmap(value))
    assert recorded.sighting is not None and recorded.sighting.pending is not None
    return view({**recorded.sighting.pending, **extra})


def test_a_pass_writes_the_baseline_rolls_a_change_and_otherwise_writes_nothing() -> None:
    first = step(view(), configmap("v1"))
    assert first.do is decisions.Do.BASELINE and first.release and first.sighting is not None
    unchanged = step(baselined(), configmap("v1"))
    assert unchanged.do is decisions.Do.NOTHING and unchanged.look_in == () and unchanged.release
    changed = step(baselined(), configmap("v2"))
    assert changed.do is decisions.Do.ROLL and changed.plan.changed == ("configmap/conf",) and not changed.release


def test_a_rollout_within_the_per_workload_interval_looks_again_when_it_ends() -> None:
    soon = step(baselined(), configmap("v2"), last_roll=95.0, now=100.0)
    assert soon.do is decisions.Do.NOTHING and not soon.release
    assert soon.look_in == (OPTIONS.min_interval_seconds - 5.0,)
    assert step(baselined(), configmap("v2"), last_roll=100.0 - OPTIONS.min_interval_seconds).do is decisions.Do.ROLL


def test_a_held_rollout_is_pended_and_looked_at_when_its_window_opens_and_cleared_once_not_due() -> None:
    window = '{"timezone": "UTC", "windows": [{"cron": "0 0 * * *", "duration": "1m"}]}'  # midnight
    held = step(baselined(**{settings.RESTART_WINDOW: window}), configmap("v2"), wall=1_800_000_000.0)  # 08:00 UTC
    assert held.do is decisions.Do.PEND and held.release and held.held is not None
    assert held.held.look_in is not None and held.look_in == (held.held.look_in + decisions.WINDOW_MARGIN,)
    # Reverted before the window: nothing to roll, and the pending annotation goes.
    reverted = step(baselined(**{settings.RESTART_WINDOW: window, REROLLER_PENDING: "waiting"}), configmap("v1"))
    assert reverted.do is decisions.Do.PEND and reverted.held is None


def test_a_deployment_we_paused_is_resumed_first_when_its_period_is_over() -> None:
    paused_at = {settings.PAUSE_PERIOD: "5m", settings.PAUSED_AT: "2027-01-15T08:00:00Z"}
    workload = baselined(**paused_at)
    workload = dataclasses.replace(workload, paused=True)
    at = datetime.datetime(2027, 1, 15, 8, tzinfo=datetime.UTC).timestamp()
    assert step(workload, configmap("v2"), wall=at + 301).do is decisions.Do.UNPAUSE
    waiting = step(workload, configmap("v2"), wall=at + 60)
    assert waiting.do is decisions.Do.ROLL and waiting.look_in == (240.0,)
