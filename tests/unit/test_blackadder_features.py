"""Blackadder's issue #23 decisions: chaoskube's filters and per-target frequency (fixed clocks and seeds)."""

from __future__ import annotations

import asyncio
import datetime
import random
import zoneinfo
from typing import Any

import pytest

from kopf_operators.blackadder import decisions, targets
from kopf_operators.blackadder.controller import BlackadderController
from kopf_operators.blackadder.decisions import Inventory
from kopf_operators.blackadder.settings import (
    KILL_MODE_LABEL,
    KILL_VALUE_LABEL,
    MTBF_LABEL,
    TANTRUM,
    AgentSettings,
    Options,
    settings_from_spec,
)
from kopf_operators.blackadder.targets import PodRef
from kopf_operators.core.conventions import Config


def epoch(text: str, zone: str = "UTC") -> float:
    """A fixed clock: the epoch of a local time in ``zone``."""
    return datetime.datetime.fromisoformat(text).replace(tzinfo=zoneinfo.ZoneInfo(zone)).timestamp()


def pod_obj(name: str, owner_kind: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels or {},
                            "creationTimestamp": "2026-01-01T00:00:00Z"}
    if owner_kind:
        meta["ownerReferences"] = [{"kind": owner_kind, "uid": f"owner-{owner_kind}", "controller": True}]
    return {"metadata": meta}


# --- 1. chaoskube's filters --------------------------------------------------------------------------


def test_owner_kinds_include_and_exclude_with_bare_pods_as_none() -> None:
    spec = {"eagerness": 1, "ownerKinds": {"exclude": ["DaemonSet"]}}
    settings = settings_from_spec(spec)
    now = epoch("2026-06-01T12:00:00")
    assert not targets.pod_selected(pod_obj("ds-1", "DaemonSet"), settings, now)
    assert targets.pod_selected(pod_obj("rs-1", "ReplicaSet"), settings, now)
    assert targets.pod_selected(pod_obj("bare"), settings, now)

    only = settings_from_spec({"eagerness": 1, "ownerKinds": {"include": ["StatefulSet", "None"]}})
    assert targets.pod_selected(pod_obj("db-0", "StatefulSet"), only, now)
    assert targets.pod_selected(pod_obj("bare"), only, now)
    assert not targets.pod_selected(pod_obj("rs-1", "ReplicaSet"), only, now)
    assert targets.pod_ref(pod_obj("db-0", "StatefulSet")).owner_kind == "StatefulSet"


def test_pod_name_patterns_are_searched_and_exclude_wins() -> None:
    settings = settings_from_spec({"eagerness": 1, "podNames": {"include": "^web-", "exclude": "canary"}})
    now = epoch("2026-06-01T12:00:00")
    assert targets.pod_selected(pod_obj("web-abc"), settings, now)
    assert not targets.pod_selected(pod_obj("api-web-1"), settings, now)  # anchored include
    assert not targets.pod_selected(pod_obj("web-canary-1"), settings, now)
    assert decisions.spec_problem(settings) is None


def test_invalid_pod_name_regex_stalls_the_agent_with_a_readable_problem() -> None:
    settings = settings_from_spec({"eagerness": 1, "podNames": {"exclude": "web-(["}})
    problem = decisions.spec_problem(settings)
    assert problem and problem.startswith("podNames.exclude 'web-([' is not a valid regular expression")
    assert decisions.cycle_step(settings, epoch("2026-06-01T12:00:00")) == decisions.INVALID_STEP
    status = decisions.simple_status(None, settings, 3, False, "InvalidSpec", problem)
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True" and status["state"] == "Failed"
    # The emergency stops still win over an invalid spec.
    assert decisions.cycle_step(settings_from_spec({"eagerness": 1, "podNames": {"include": "("}, "paused": True}),
                                0) == decisions.PAUSED_STEP


def test_excluded_dates_in_the_agents_time_zone_yearly_and_once() -> None:
    settings = settings_from_spec({"eagerness": 1, "timeZone": "Europe/Berlin",
                                   "excludedDates": ["12-25", "2026-04-06"]})
    # 23:30 UTC on 24 Dec is already 25 Dec in Berlin.
    christmas_eve_utc = epoch("2026-12-24T23:30:00")
    assert decisions.excluded_date(settings.excluded_dates, "Europe/Berlin", christmas_eve_utc) == "12-25"
    assert decisions.cycle_step(settings, christmas_eve_utc) == decisions.EXCLUDED_DATE_STEP
    assert decisions.cycle_step(settings, epoch("2026-12-24T22:30:00")) == decisions.CHAOS_STEP  # 23:30 in Berlin
    assert decisions.cycle_step(settings, epoch("2031-12-25T12:00:00", "Europe/Berlin")) == decisions.EXCLUDED_DATE_STEP
    assert decisions.cycle_step(settings, epoch("2026-04-06T09:00:00", "Europe/Berlin")) == decisions.EXCLUDED_DATE_STEP
    assert decisions.cycle_step(settings, epoch("2027-04-06T09:00:00", "Europe/Berlin")) == decisions.CHAOS_STEP
    status = decisions.simple_status(None, settings, 1, True, "ExcludedDate", "today is an excluded date")
    assert status["state"] == "Idle"
    # An excluded date wins over an open window; revert and pause over the date.
    windowed = settings_from_spec({"eagerness": 1, "excludedDates": ["06-01"],
                                   "activeWindows": [{"from": "00:00", "to": "23:59"}]})
    assert decisions.cycle_step(windowed, epoch("2026-06-01T12:00:00")) == decisions.EXCLUDED_DATE_STEP
    assert decisions.cycle_step(settings_from_spec({"eagerness": 1, "excludedDates": ["06-01"], "revert": True}),
                                epoch("2026-06-01T12:00:00")) == decisions.REVERT_STEP


def test_unknown_time_zone_with_excluded_dates_is_invalid() -> None:
    settings = settings_from_spec({"eagerness": 1, "timeZone": "Mars/Olympus", "excludedDates": ["01-01"]})
    assert decisions.cycle_step(settings, 0) == decisions.INVALID_STEP
    assert "Mars/Olympus" in (decisions.spec_problem(settings) or "")
    # Without windows or dates the zone is unused, as before.
    assert decisions.cycle_step(settings_from_spec({"eagerness": 1, "timeZone": "Mars/Olympus"}), 0) == \
        decisions.CHAOS_STEP


def test_grace_period_is_read_from_the_spec() -> None:
    assert settings_from_spec({"eagerness": 1}).grace_period is None
    assert settings_from_spec({"eagerness": 1, "gracePeriodSeconds": 0}).grace_period == 0
    assert settings_from_spec({"eagerness": 1, "gracePeriodSeconds": 30}).grace_period == 30


# --- 2. per-target frequency ---------------------------------------------------------------------------


def workload(name: str, n: int, mtbf: str = "", mode: str = "", value: str = "") -> list[PodRef]:
    return [PodRef("ns", f"{name}-{i}", f"{name}-uid-{i}", owner=f"rs-{name}", mtbf=mtbf, kill_mode=mode,
                   kill_value=value) for i in range(n)]


@pytest.mark.parametrize(("labels", "expected"), [
    (("1", "", ""), targets.Frequency(86400, "fixed", 1)),  # kube-monkey's days
    (("3d", "", ""), targets.Frequency(3 * 86400, "fixed", 1)),
    (("12h", "fixed", "2"), targets.Frequency(12 * 3600, "fixed", 2)),
    (("90m", "kill-all", ""), targets.Frequency(5400, "kill-all", 0)),
    (("600s", "fixed-percent", "50"), targets.Frequency(600, "fixed-percent", 50)),
    (("2h", "random-max-percent", "100"), targets.Frequency(7200, "random-max-percent", 100)),
])
def test_frequency_labels_parse(labels: tuple[str, str, str], expected: targets.Frequency) -> None:
    assert targets.parse_frequency(*labels) == (expected, None)


@pytest.mark.parametrize(("labels", "says"), [
    (("0", "", ""), "blackadder.io/mtbf='0'"),
    (("soon", "", ""), "blackadder.io/mtbf='soon'"),
    (("1h", "kill-some", ""), "blackadder.io/kill-mode='kill-some'"),
    (("1h", "fixed", "0"), "fixed needs at least 1"),
    (("1h", "fixed-percent", "150"), "percentage from 0 to 100"),
    (("1h", "random-max-percent", ""), "needs a whole number"),
])
def test_bad_frequency_labels_say_why(labels: tuple[str, str, str], says: str) -> None:
    frequency, problem = targets.parse_frequency(*labels)
    assert frequency is None and problem and says in problem


def test_failure_probability_follows_the_mtbf_and_the_clock() -> None:
    assert targets.failure_probability(3600, 0) == 0.0
    assert targets.failure_probability(3600, 3600) == pytest.approx(0.632, abs=0.001)
    assert targets.failure_probability(60, 600) > 0.9999
    # A fixed clock: the time since the last chaos cycle, capped at two pauses; a first cycle is one pause.
    assert targets.frequency_elapsed(None, 1000.0, 60) == 60.0
    assert targets.frequency_elapsed(970.0, 1000.0, 60) == 30.0
    assert targets.frequency_elapsed(0.0, 86400.0, 60) == 120.0


def test_kill_counts_per_mode() -> None:
    rng = random.Random(1)
    assert targets.kill_count(targets.Frequency(1, "kill-all"), 5, rng) == 5
    assert targets.kill_count(targets.Frequency(1, "fixed", 2), 5, rng) == 2
    assert targets.kill_count(targets.Frequency(1, "fixed", 9), 5, rng) == 5
    assert targets.kill_count(targets.Frequency(1, "fixed-percent", 50), 5, rng) == 2
    assert targets.kill_count(targets.Frequency(1, "fixed-percent", 1), 5, rng) == 1  # at least one above 0 %
    assert targets.kill_count(targets.Frequency(1, "fixed-percent", 0), 5, rng) == 0
    up_to_60 = targets.Frequency(1, "random-max-percent", 60)
    counts = {targets.kill_count(up_to_60, 5, random.Random(s)) for s in range(50)}
    assert counts == {0, 1, 2, 3}


def test_labelled_workload_follows_its_mtbf_not_the_agents_eagerness() -> None:
    """Eagerness 0 kills nothing, yet a workload with a 1-minute MTBF fails on nearly every 10-minute
    cycle, and one with a 30-day MTBF nearly never; all deterministic for a seed."""
    settings = AgentSettings(tantrum=True, eagerness=0, max_kills=None, seed=4)
    inventory = Inventory(pods=tuple(workload("hot", 3, "60s") + workload("cold", 3, "30d") + workload("plain", 3)))
    hits: dict[str, int] = {"hot": 0, "cold": 0, "plain": 0}
    for cycle in range(1, 101):
        plan = decisions.plan_cycle(inventory, settings, cycle, elapsed=600)
        assert plan == decisions.plan_cycle(inventory, settings, cycle, elapsed=600)  # same seed, same decisions
        for pod in plan.kills:
            hits[pod.name.split("-")[0]] += 1
    assert hits["plain"] == 0
    assert hits["hot"] == 100  # fixed, one Pod per failure, on every cycle (p > 0.9999)
    assert hits["cold"] <= 2
    # Ignore: the labels are not read; eagerness alone decides.
    ignoring = AgentSettings(tantrum=True, eagerness=0, max_kills=None, seed=4, target_frequency="Ignore")
    assert decisions.plan_cycle(inventory, ignoring, 1, elapsed=600).kills == ()


def test_frequency_rate_over_many_cycles_matches_the_mtbf() -> None:
    """With 1-minute cycles and a 10-minute MTBF, a workload fails on ~9.5 % of cycles."""
    settings = AgentSettings(tantrum=True, eagerness=100, max_kills=None, seed=11)
    inventory = Inventory(pods=tuple(workload("web", 2, "10m")))
    failures = sum(bool(decisions.plan_cycle(inventory, settings, c, elapsed=60).kills) for c in range(1, 2001))
    assert 150 < failures < 230  # 1 - e^-0.1 = 9.5 % of 2000 = 190


def test_caps_still_apply_to_a_kill_all_workload() -> None:
    pods = workload("web", 4, "1s", "kill-all")
    capped = decisions.plan_cycle(Inventory(pods=tuple(pods)), AgentSettings(tantrum=True, seed=1, max_kills=1), 1,
                                  elapsed=60)
    assert len(capped.kills) == 1  # maxKillsPerCycle
    # Even uncapped, the last ready replica stays unless allowSingleReplica; tolerance too.
    ready = [PodRef(p.namespace, p.name, p.uid, owner=p.owner, mtbf=p.mtbf, kill_mode=p.kill_mode) for p in pods]
    uncapped = AgentSettings(tantrum=True, seed=1, max_kills=None)
    assert len(decisions.plan_cycle(Inventory(pods=tuple(ready)), uncapped, 1, elapsed=60).kills) == 3
    assert len(decisions.plan_cycle(Inventory(pods=tuple(ready)), AgentSettings(
        tantrum=True, seed=1, max_kills=None, allow_single_replica=True), 1, elapsed=60).kills) == 4
    assert len(decisions.plan_cycle(Inventory(pods=tuple(ready)), AgentSettings(
        tantrum=True, seed=1, max_kills=None, tolerance=3, allow_single_replica=True), 1, elapsed=60).kills) == 1


def test_unreadable_labels_leave_the_workload_alone_and_are_reported() -> None:
    inventory = Inventory(pods=tuple(workload("odd", 2, "often") + workload("plain", 2)))
    plan = decisions.plan_cycle(inventory, AgentSettings(tantrum=True, eagerness=100, max_kills=None,
                                                         allow_single_replica=True, seed=1), 1, elapsed=60)
    assert {p.name for p in plan.kills} == {"plain-0", "plain-1"}
    assert plan.frequency_problems == ("ns/odd-0: blackadder.io/mtbf='often' is not a duration like 3 (days), 3d, "
                                       "12h, 90m or 600s",)
    status = decisions.cycle_status(None, AgentSettings(), 1, {"cycle": 1, "lastCycleAt": "x", "counts": {},
                                                               "wouldBe": {}},
                                {"tantrum": 2}, 0, {"pods": 4}, "ns/ledger", plan.frequency_problems)
    assert status["lastCycle"]["invalidFrequencyLabels"] == list(plan.frequency_problems)


def test_without_labels_the_decisions_are_those_of_before() -> None:
    """No workload carries the labels: eagerness decides exactly as it did (same draws)."""
    pods = workload("a", 5) + workload("b", 5)
    settings = AgentSettings(tantrum=True, eagerness=50, max_kills=None, allow_single_replica=True, seed=9)
    expected = targets.pick_pods(pods, 0, 50, targets.rng_for(9, 3, TANTRUM), cap=None, allow_single_replica=True)
    assert list(decisions.plan_cycle(Inventory(pods=tuple(pods)), settings, 3, elapsed=60).kills) == expected


def test_pod_ref_reads_the_frequency_labels() -> None:
    ref = targets.pod_ref(pod_obj("web-1", "ReplicaSet", {MTBF_LABEL: "2h", KILL_MODE_LABEL: "fixed",
                                                          KILL_VALUE_LABEL: "2"}))
    assert (ref.mtbf, ref.kill_mode, ref.kill_value, ref.owner_kind) == ("2h", "fixed", "2", "ReplicaSet")


# --- the hot path: the new filters cost no request ------------------------------------------------------


def test_new_filters_add_no_listing_and_filter_the_listed_pods() -> None:
    """The controller's inventory with every new filter set lists exactly what it listed before (one
    Pod listing for the target namespace) and filters the listed objects client-side."""
    listed = [pod_obj("web-1", "ReplicaSet"), pod_obj("web-canary-1", "ReplicaSet"), pod_obj("web-ds", "DaemonSet"),
              pod_obj("web-bare"), pod_obj("api-1", "ReplicaSet")]
    calls: list[tuple[Any, ...]] = []

    def inventory(spec: dict[str, Any]) -> list[str]:
        controller = BlackadderController(None, Config(), Options(), {})  # type: ignore[arg-type]

        async def fake_list(*args: Any) -> list[dict[str, Any]]:
            calls.append(args)
            return listed

        controller.chaos._list = fake_list  # type: ignore[method-assign, assignment]
        settings = settings_from_spec({"tantrumMode": True, "eagerness": 1, "targetNamespaces": ["ns"], **spec})
        result = asyncio.run(controller.chaos.inventory(settings, epoch("2026-06-01T12:00:00")))
        return sorted(p.name for p in result.pods)

    assert inventory({}) == ["api-1", "web-1", "web-bare", "web-canary-1", "web-ds"]
    before = list(calls)
    calls.clear()
    assert inventory({"ownerKinds": {"exclude": ["DaemonSet", "None"]}, "podNames": {"include": "^web",
                                                                                     "exclude": "canary"},
                      "excludedDates": ["01-01"], "gracePeriodSeconds": 5}) == ["web-1"]
    assert calls == before and len(calls) == 1
