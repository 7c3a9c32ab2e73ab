"""Blackadder's decision functions, with fixed seeds (no cluster)."""

from __future__ import annotations

import dataclasses
import datetime
import re
import zoneinfo
from typing import Any

import pytest

from kopf_operators.blackadder import decisions, targets
from kopf_operators.blackadder.settings import (
    CANCER,
    IPSUM,
    JOURNAL_LIMIT,
    KILL_SWITCH_LABEL,
    MIN_PAUSE_SECONDS,
    AgentSettings,
    Options,
    ledger_label,
    ledger_name,
    settings_from_spec,
)
from kopf_operators.blackadder.targets import ConfigMapRef, DeploymentRef, PodRef
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL


def pods(n: int, ns: str = "ns", terminating: int = 0) -> list[PodRef]:
    return [PodRef(ns, f"p{i:02d}", f"uid-{i}", terminating=i < terminating) for i in range(n)]


def deps(*replicas: int) -> list[DeploymentRef]:
    return [DeploymentRef("ns", f"d{i}", f"uid-{i}", r) for i, r in enumerate(replicas)]


def test_eagerness_zero_never_and_hundred_always() -> None:
    for seed in range(20):
        assert targets.pick_pods(pods(30), 0, 0, targets.rng_for(seed, 1, "tantrum")) == []
        assert len(targets.pick_pods(pods(30), 0, 100, targets.rng_for(seed, 1, "tantrum"))) == 30
        assert targets.pick_deployments(deps(1, 2, 3), 0, targets.rng_for(seed, 1, "cancer")) == []
        assert len(targets.pick_deployments(deps(1, 2, 3), 100, targets.rng_for(seed, 1, "cancer"))) == 3


def test_eagerness_is_a_probability() -> None:
    picked = sum(len(targets.pick_pods(pods(100), 0, 20, targets.rng_for(s, 1, "tantrum"))) for s in range(50))
    assert 800 < picked < 1200  # 20% of 5000


def test_tolerance_respected() -> None:
    rng = targets.rng_for(1, 1, "tantrum")
    assert targets.pick_pods(pods(9), 10, 100, rng) == []  # fewer than tolerance: nothing
    assert targets.pick_pods(pods(10), 10, 100, rng) == []  # never below tolerance
    assert len(targets.pick_pods(pods(13), 10, 100, rng)) == 3
    for seed in range(30):
        assert len(targets.pick_pods(pods(15), 10, 70, targets.rng_for(seed, 2, "tantrum"))) <= 5


def test_terminating_pods_skipped_and_not_counted() -> None:
    picked = targets.pick_pods(pods(5, terminating=2), 1, 100, targets.rng_for(1, 1, "tantrum"))
    assert len(picked) == 2 and {p.name for p in picked} <= {"p02", "p03", "p04"}  # 3 alive, keep 1


def test_a_capped_eager_agent_takes_every_pod_in_turn_not_the_first_by_name() -> None:
    # eagerness 100 and a cap of one, as chaoskube's one pod per interval: over cycles, each pod is hit.
    hit = {p.name for cycle in range(60)
           for p in targets.pick_pods(pods(6), 0, 100, targets.rng_for(3, cycle, "tantrum"), cap=1)}
    assert hit == {p.name for p in pods(6)}


def test_same_seed_same_decisions_regardless_of_order() -> None:
    inventory = pods(40)
    a = targets.pick_pods(inventory, 0, 50, targets.rng_for(7, 3, "tantrum"))
    b = targets.pick_pods(list(reversed(inventory)), 0, 50, targets.rng_for(7, 3, "tantrum"))
    c = targets.pick_pods(inventory, 0, 50, targets.rng_for(7, 4, "tantrum"))
    assert a == b
    assert a != c  # another cycle, other decisions


def test_cancer_doubles_capped_and_zero_stays_zero() -> None:
    assert targets.doubled(0) == 0
    assert targets.doubled(1) == 2
    assert targets.doubled(3) == 6
    assert targets.doubled(64) == 128
    assert targets.doubled(100) == 128
    assert targets.doubled(128) == 128
    assert targets.doubled(300) == 300  # never shrinks
    picked = targets.pick_deployments(deps(0, 1, 128, 70), 100, targets.rng_for(1, 1, "cancer"))
    assert [(d.name, r) for d, r in picked] == [("d1", 2), ("d3", 128)]


def test_ipsum_skips_immutable_and_empty() -> None:
    cms = [ConfigMapRef("ns", "a", "u1", {"k": "v"}), ConfigMapRef("ns", "b", "u2", {"k": "v"}, immutable=True),
           ConfigMapRef("ns", "c", "u3", None), ConfigMapRef("ns", "d", "u4", {})]
    picked = targets.pick_configmaps(cms, 100, targets.rng_for(1, 1, "ipsum"))
    assert [c.name for c in picked] == ["a"]
    assert targets.ipsum_data({"x": "1", "y": "2"}, lambda: "lorem") == {"x": "lorem", "y": "lorem"}


def test_field_selector_string() -> None:
    assert targets.namespace_field_selector(["b", "a", "a"]) == "metadata.namespace!=a,metadata.namespace!=b"
    assert targets.namespace_field_selector([]) == ""


def test_listing_plan_includes_deny_list() -> None:
    namespaces, selector = targets.listing_plan(AgentSettings(excluded=("team-x",)), "chaos-operator")
    assert namespaces is None
    assert selector == ",".join(f"metadata.namespace!={ns}" for ns in sorted(
        ["chaos-operator", "kube-node-lease", "kube-public", "kube-system", "team-x"]))
    local = targets.listing_plan(AgentSettings(), "")[1]
    assert "metadata.namespace!=blackadder-system" in local  # the local ledger namespace
    namespaces, selector = targets.listing_plan(
        AgentSettings(targets=("a", "kube-system", "x", "chaos-operator"), excluded=("x",)), "chaos-operator")
    assert namespaces == ["a"] and selector == ""


def test_deny_list_no_spec_can_override() -> None:
    s = AgentSettings(targets=("kube-system", "kube-public", "kube-node-lease", "op", "apps"))
    assert not targets.namespace_allowed("kube-system", s, "op")
    assert not targets.namespace_allowed("op", s, "op")
    assert targets.namespace_allowed("apps", s, "op")
    assert not targets.namespace_allowed("other", s, "op")  # not a target
    assert not targets.pod_allowed(PodRef("op", "operator-0", "u"), AgentSettings(), "op", "operator-0")
    assert not targets.pod_allowed(PodRef("apps", "operator-0", "u"), AgentSettings(), "", "operator-0")
    assert not targets.configmap_allowed(ConfigMapRef("apps", "kube-root-ca.crt", "u", {"a": "b"}), s, "op")
    assert not targets.configmap_allowed(ConfigMapRef("apps", "blackadder-ledger-x", "u", {"a": "b"}), s, "op")
    assert targets.configmap_allowed(ConfigMapRef("apps", "settings", "u", {"a": "b"}), s, "op")


def test_settings_from_spec_and_forced_dry_run() -> None:
    spec = {"tantrumMode": True, "podTolerance": 10, "eagerness": 20, "pauseDuration": 30,
            "excludedNamespaces": ["kube-system"], "cancerMode": True, "ipsumMode": True}
    s = settings_from_spec(spec)
    assert (s.tantrum, s.cancer, s.ipsum, s.tolerance, s.eagerness, s.pause) == (True, True, True, 10, 20, 30)
    assert not s.dry_run and s.targets is None and s.revert_on_delete
    forced = settings_from_spec(spec, forced_dry_run=True)
    assert forced.dry_run and forced.dry_run_reason == "OperatorForced"
    assert settings_from_spec({"pauseDuration": 1}).pause == MIN_PAUSE_SECONDS


def test_undo_keeps_the_original_before_state() -> None:
    ledger = decisions.empty_ledger("a", "uid")
    key = decisions.target_key("Deployment", "ns", "d")
    decisions.record_undo(ledger, key, {"uid": "d1", "before": 1, "written": 2}, current_fingerprint=1)
    decisions.record_undo(ledger, key, {"uid": "d1", "before": 2, "written": 4}, current_fingerprint=2)
    assert ledger["undo"][key]["before"] == 1 and ledger["undo"][key]["written"] == 4
    # Someone scaled it to 3 in between: their value is the new "before".
    decisions.record_undo(ledger, key, {"uid": "d1", "before": 3, "written": 6}, current_fingerprint=3)
    assert ledger["undo"][key]["before"] == 3


def test_revert_verdicts() -> None:
    dep = {"kind": "Deployment", "uid": "u", "before": 1, "written": 2, "generation": 5}
    cur = {"metadata": {"uid": "u", "generation": 5}, "spec": {"replicas": 2}}
    assert decisions.revert_verdict(dep, cur) == decisions.RESTORE
    for gen, replicas in ((6, 2), (6, 3), (5, 3)):
        changed = {"metadata": {"uid": "u", "generation": gen}, "spec": {"replicas": replicas}}
        assert decisions.revert_verdict(dep, changed) == decisions.CHANGED
    assert decisions.revert_verdict(dep, {"metadata": {"uid": "other"}, "spec": {"replicas": 2}}) == decisions.GONE
    assert decisions.revert_verdict(dep, None) == decisions.GONE
    cm = {"kind": "ConfigMap", "uid": "u", "before": {"k": "v"}, "written": decisions.data_fingerprint({"k": "lorem"})}
    assert decisions.revert_verdict(cm, {"metadata": {"uid": "u"}, "data": {"k": "lorem"}}) == decisions.RESTORE
    assert decisions.revert_verdict(cm, {"metadata": {"uid": "u"}, "data": {"k": "edited"}}) == decisions.CHANGED
    pending = {**cm, "pending": True}
    assert decisions.revert_verdict(pending, {"metadata": {"uid": "u"}, "data": {"k": "v"}}) == decisions.UNCHANGED


def test_ledger_of_a_recreated_agent_starts_afresh() -> None:
    old = decisions.empty_ledger("a", "old-uid") | {"cycle": 9}
    assert decisions.normalise_ledger(old, "a", "new-uid")["cycle"] == 0
    assert decisions.normalise_ledger(old, "a", "old-uid")["cycle"] == 9


def test_journal_is_bounded() -> None:
    ledger = decisions.empty_ledger("a", "u")
    for i in range(JOURNAL_LIMIT + 20):
        decisions.journal(ledger, {"i": i})
    assert len(ledger["journal"]) == JOURNAL_LIMIT and ledger["journal"][-1] == {"i": JOURNAL_LIMIT + 19}


def test_restart_waits_out_the_pause() -> None:
    assert decisions.seconds_until_next_cycle(None, 100.0, 30) == 0
    assert decisions.seconds_until_next_cycle(90.0, 100.0, 30) == 20
    assert decisions.seconds_until_next_cycle(10.0, 100.0, 30) == 0
    assert decisions.seconds_until_next_cycle(200.0, 100.0, 30) == 30  # clock skew: at most one pause


# --- issue #14: the guards (chaoskube's filters in the project's own words) --------------------------



def workload_pods(owner: str, n: int, ready: int | None = None, ns: str = "ns") -> list[PodRef]:
    ready = n if ready is None else ready
    return [PodRef(ns, f"{owner}-{i}", f"{owner}-uid-{i}", owner=owner, ready=i < ready) for i in range(n)]


def test_selector_strings_are_the_api_syntax() -> None:
    selector = {"matchLabels": {"app": "web", "tier": "front"},
                "matchExpressions": [{"key": "env", "operator": "In", "values": ["qa", "dev"]},
                                     {"key": "team", "operator": "NotIn", "values": ["core"]},
                                     {"key": "chaos", "operator": "Exists"},
                                     {"key": "critical", "operator": "DoesNotExist"}]}
    assert targets.selector_string(selector) == "app=web,tier=front,env in (dev,qa),team notin (core),chaos,!critical"
    assert targets.selector_string(None) == ""


def test_label_selectors_per_kind_with_opt_in_and_copies() -> None:
    base = AgentSettings(pod_selector={"matchLabels": {"app": "web"}})
    assert targets.label_selector_for("Pod", base) == "blackadder.io/chaos!=false,app=web"
    assert targets.label_selector_for("Deployment", base) == "blackadder.io/chaos!=false"
    assert targets.label_selector_for("ConfigMap", base) == "blackadder.io/chaos!=false,!" + COPYRATOR_RULE_UID_LABEL
    opted = AgentSettings(require_opt_in=True, shared_configmaps="Include")
    assert targets.label_selector_for("ConfigMap", opted) == "blackadder.io/chaos=true"


def test_namespace_selector_lists_only_matching_allowed_namespaces() -> None:
    labels = {"a": {"chaos": "yes"}, "b": {"chaos": "no"}, "c": {"chaos": "yes"}, "kube-system": {"chaos": "yes"}}
    settings = AgentSettings(namespace_selector={"matchLabels": {"chaos": "yes"}}, excluded=("c",))
    assert targets.listing_plan_for(settings, "op", labels) == (["a"], "")
    both = dataclasses.replace(settings, excluded=(), targets=("b", "c"))
    assert targets.listing_plan_for(both, "op", labels) == (["c"], "")
    assert targets.listing_plan_for(AgentSettings(), "op", labels)[0] is None  # no selector: cluster-wide


def test_pod_filters_annotations_and_minimum_age() -> None:
    now = 1_700_000_000.0
    created = datetime.datetime.fromtimestamp(now - 120, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod = {"metadata": {"name": "p", "namespace": "ns", "creationTimestamp": created,
                        "annotations": {"chaos.alpha.kubernetes.io/enabled": "true"}}}
    assert targets.pod_selected(pod, AgentSettings(min_pod_age=120), now)
    assert not targets.pod_selected(pod, AgentSettings(min_pod_age=121), now)
    wanted = {"matchLabels": {"chaos.alpha.kubernetes.io/enabled": "true"}}
    assert targets.pod_selected(pod, AgentSettings(annotation_selector=wanted), now)
    assert not targets.pod_selected({"metadata": {}}, AgentSettings(annotation_selector=wanted), now)


def test_deployments_match_the_pod_selector_by_their_template() -> None:
    dep = {"spec": {"template": {"metadata": {"labels": {"app": "web"}}}}}
    assert targets.deployment_selected(dep, AgentSettings(pod_selector={"matchLabels": {"app": "web"}}))
    assert not targets.deployment_selected(dep, AgentSettings(pod_selector={"matchLabels": {"app": "db"}}))


def test_max_kills_per_cycle_count_and_percentage() -> None:
    assert targets.max_kills(3, 10) == 3
    assert targets.max_kills("25%", 10) == 2
    assert targets.max_kills("10%", 3) == 1  # at least one when above 0 %
    assert targets.max_kills("0%", 10) == 0
    assert targets.max_kills(None, 10) is None
    rng = targets.rng_for(1, 1, "tantrum")
    assert len(targets.pick_pods(pods(30), 0, 100, rng, cap=4)) == 4


def test_eagerness_100_tolerance_0_no_longer_kills_everything() -> None:
    settings = settings_from_spec({"tantrumMode": True, "eagerness": 100, "podTolerance": 0})
    plan = decisions.plan_cycle(decisions.Inventory(pods=tuple(workload_pods("rs", 20))), settings, 1)
    assert len(plan.kills) == 1  # the default cap, as chaoskube's


def test_single_ready_replica_and_bare_pods_are_skipped_unless_allowed() -> None:
    inventory = [*workload_pods("single", 1), *workload_pods("three", 3), *workload_pods("halfready", 3, ready=1),
                 PodRef("ns", "bare", "bare-uid", owner="")]
    rng = targets.rng_for(1, 1, "tantrum")
    picked = targets.pick_pods(inventory, 0, 100, rng, allow_single_replica=False)
    # Each workload keeps one ready replica: 2 of "three", none of the others.
    assert sorted(p.name for p in picked) == ["three-0", "three-1"]
    everything = targets.pick_pods(inventory, 0, 100, targets.rng_for(1, 1, "tantrum"), allow_single_replica=True)
    assert len(everything) == len(inventory)


def test_cluster_wide_cap_on_added_replicas() -> None:
    ledgers: list[dict[str, Any]] = [
        {"undo": {"a": {"kind": "Deployment", "before": 2, "written": 8},
                  "c": {"kind": "ConfigMap", "before": {}, "written": "h"}}},
        {"undo": {"b": {"kind": "Deployment", "before": 1, "written": 2}}}]
    assert targets.added_replicas(ledgers) == 7
    picked = targets.pick_deployments(deps(4, 4, 4), 100, targets.rng_for(1, 1, "cancer"), budget=6)
    assert [(d.name, r) for d, r in picked] == [("d0", 8), ("d1", 6)]  # 4 + 2 added, then nothing left
    assert targets.pick_deployments(deps(4), 100, targets.rng_for(1, 1, "cancer"), budget=0) == []
    env = Options.from_env({"CHAOS_MAX_ADDED_REPLICAS": "10", "CHAOS_WEBHOOK_HOSTS": "127.0.0.1, Hooks.local"})
    assert env.max_added_replicas == 10 and env.webhook_hosts == ("127.0.0.1", "hooks.local")


BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def at(year: int, month: int, day: int, hour: int, minute: int = 0, zone: Any = BERLIN) -> float:
    return datetime.datetime(year, month, day, hour, minute, tzinfo=zone).timestamp()


def test_time_windows_with_a_fixed_clock() -> None:
    office = [{"weekdays": ["Mon", "Tue", "Wed", "Thu", "Fri"], "from": "09:00", "to": "17:00"}]
    # 2026-11-23 is a Monday.
    assert decisions.in_windows(office, "Europe/Berlin", at(2026, 11, 23, 9, 0))
    assert decisions.in_windows(office, "Europe/Berlin", at(2026, 11, 23, 16, 59))
    assert not decisions.in_windows(office, "Europe/Berlin", at(2026, 11, 23, 17, 0))  # to is exclusive
    assert not decisions.in_windows(office, "Europe/Berlin", at(2026, 11, 28, 12, 0))  # Saturday
    # The same instant in UTC is 08:30, outside; in Berlin 09:30, inside.
    instant = at(2026, 11, 23, 8, 30, zone=datetime.UTC)
    assert not decisions.in_windows(office, "UTC", instant) and decisions.in_windows(office, "Europe/Berlin", instant)
    # Summer time: 09:00 Berlin is 07:00 UTC.
    assert decisions.in_windows(office, "Europe/Berlin", at(2026, 7, 6, 7, 0, zone=datetime.UTC))
    night = [{"weekdays": ["Fri"], "from": "22:00", "to": "02:00"}]
    assert decisions.in_windows(night, "UTC", at(2026, 11, 27, 23, 0, zone=datetime.UTC))  # Friday night
    assert decisions.in_windows(night, "UTC", at(2026, 11, 28, 1, 59, zone=datetime.UTC))  # Saturday small hours
    assert not decisions.in_windows(night, "UTC", at(2026, 11, 28, 22, 30, zone=datetime.UTC))
    assert decisions.next_window_start(office, "Europe/Berlin", at(2026, 11, 27, 18, 0)) == "2026-11-30T09:00+01:00"


def test_windows_decide_the_cycle_step_and_a_bad_zone_is_reported() -> None:
    windows = ({"from": "09:00", "to": "10:00"},)
    settings = AgentSettings(windows=windows, time_zone="UTC")
    assert decisions.cycle_step(settings, at(2026, 11, 23, 9, 30, zone=datetime.UTC)) == decisions.CHAOS_STEP
    assert decisions.cycle_step(settings, at(2026, 11, 23, 11, 0, zone=datetime.UTC)) == decisions.IDLE_STEP
    assert decisions.cycle_step(dataclasses.replace(settings, paused=True), 0) == decisions.PAUSED_STEP
    bad_zone = dataclasses.replace(settings, time_zone="Mars/Olympus")
    assert decisions.window_problem(bad_zone) is not None
    assert decisions.cycle_step(bad_zone, 0) == decisions.INVALID_STEP
    # still revertible
    assert decisions.cycle_step(dataclasses.replace(bad_zone, revert=True), 0) == decisions.REVERT_STEP
    idle = decisions.simple_status(None, settings, 1, True, "OutsideWindow", "idle")
    assert idle["state"] == "Idle"
    assert [c["status"] for c in idle["conditions"] if c["type"] == "Active"] == ["False"]
    # An idle agent does not patch its status every cycle: only when something but a timestamp changes.
    again = decisions.simple_status(idle["conditions"], settings, 1, True, "OutsideWindow", "idle")
    assert not decisions.status_changed({**idle, "cycle": 4}, again)
    next_generation = decisions.simple_status(idle["conditions"], settings, 2, True, "OutsideWindow", "idle")
    assert decisions.status_changed(idle, next_generation)


def test_copyrator_sources_are_recognised() -> None:
    rule = {"metadata": {"name": "r", "namespace": "src"},
            "spec": {"ruleType": "configmap", "selector": {"copy": "yes"}, "namespace": "src"}}
    sources = decisions.copyrator_sources(rule)
    assert sources == [{"namespace": "src", "selector": {"copy": "yes"}}]
    assert decisions.is_copyrator_source("src", {"copy": "yes", "x": "y"}, sources)
    assert not decisions.is_copyrator_source("other", {"copy": "yes"}, sources)
    assert not decisions.is_copyrator_source("src", {"copy": "no"}, sources)
    assert decisions.copyrator_sources({"ruleType": "secret", "selector": {"a": "b"}, "namespace": "x"}) == []


@pytest.mark.parametrize(("url", "hosts", "refused"), [
    ("http://127.0.0.1:8080/hook", ("127.0.0.1",), False),
    ("http://example.com/hook", ("127.0.0.1",), True),
    ("ftp://127.0.0.1/x", (), True),
    ("https://hooks.local/x", (), False),
])
def test_webhook_hosts_are_checked(url: str, hosts: tuple[str, ...], refused: bool) -> None:
    assert (decisions.webhook_refusal(url, hosts) is not None) == refused


def test_webhook_payload_carries_names_never_values() -> None:
    entry = {"cycle": 3, "at": "t", "mode": "ipsum", "kind": "ConfigMap", "namespace": "ns", "name": "cm",
             "outcome": "ipsumed", "dryRun": False, "before": "hash", "after": "hash2"}
    payload = decisions.webhook_payload("edmund", entry)
    assert payload["agent"] == "edmund" and "before" not in payload and "after" not in payload


@pytest.mark.parametrize("namespace", [7, True, None, {"a": "b"}, [1, "ok"]])
def test_malformed_copyrator_rules_name_no_sources_and_never_raise(namespace: object) -> None:
    rule = {"spec": {"ruleType": "configmap", "selector": {"copy": "yes"}, "namespace": namespace}}
    sources = decisions.copyrator_sources(rule)
    assert sources == ([{"namespace": "ok", "selector": {"copy": "yes"}}] if namespace == [1, "ok"] else [])


def kstatus_triad(status: dict[str, Any]) -> tuple[str, str, str]:
    conds = {c["type"]: c["status"] for c in status["conditions"]}
    return conds["Ready"], conds["Reconciling"], conds["Stalled"]


@pytest.mark.parametrize(("ready", "reason", "stalled", "expected"), [
    (True, "Paused", None, ("True", "False", "False")),  # idle by design
    (True, "OutsideWindow", None, ("True", "False", "False")),
    (True, "Reverted", None, ("True", "False", "False")),
    (False, "InvalidSpec", None, ("False", "False", "True")),  # an unknown timeZone: a person must fix it
    (False, "CycleFailed", False, ("False", "True", "False")),  # the next cycle retries
    (False, "CycleFailed", True, ("False", "False", "True")),  # refused by the API server (403...)
])
def test_agent_conditions_follow_kstatus(ready: bool, reason: str, stalled: bool | None,
                                         expected: tuple[str, str, str]) -> None:
    status = decisions.simple_status([], AgentSettings(), 4, ready, reason, "why", stalled=stalled)
    assert kstatus_triad(status) == expected
    assert status["observedGeneration"] == 4


def test_a_cycle_that_succeeded_is_ready() -> None:
    ledger = {"cycle": 3, "lastCycleAt": "T", "counts": {}, "wouldBe": {}}
    status = decisions.cycle_status([], AgentSettings(dry_run=True), 2, ledger, {"pods": 1}, 0, {"pods": 2}, "ns/l")
    assert kstatus_triad(status) == ("True", "False", "False")


# --- issues #18 and #20 -------------------------------------------------------------------------------

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.mark.parametrize("length", [1, 63, 64, 235, 236, 253])
def test_ledger_names_and_labels_fit_the_api_for_every_agent_name(length: int) -> None:
    for agent in ("a" * length, ("ab." * 100)[:length - 1] + "z", ("a-" * 130)[:length - 1] + "z"):
        name, label = ledger_name(agent), ledger_label(agent)
        assert len(name) <= 253 and DNS_SUBDOMAIN.match(name), name
        assert len(label) <= 63 and LABEL_VALUE.match(label), label
        if length <= 235:
            assert name == f"blackadder-ledger-{agent}"  # unchanged for every name that fits
        if length <= 63:
            assert label == agent
    assert ledger_name("x" * 240 + "a") != ledger_name("x" * 240 + "b")
    assert ledger_label("x" * 70 + "a") != ledger_label("x" * 70 + "b")


def test_kill_switch_and_emergency_stops() -> None:
    assert not decisions.kill_switch_on({}, False) and not decisions.kill_switch_on(None, False)
    assert decisions.kill_switch_on({KILL_SWITCH_LABEL: "true"}, False)
    assert not decisions.kill_switch_on({KILL_SWITCH_LABEL: "false"}, False)
    assert decisions.kill_switch_on({}, True)  # CHAOS_STOP_ALL
    assert Options.from_env({"CHAOS_STOP_ALL": "true"}).stop_all
    settings = AgentSettings(cancer=True, eagerness=100)
    assert decisions.cycle_step(settings, 0, kill_switch=True) == decisions.STOPPED_STEP
    reverting = dataclasses.replace(settings, revert=True)
    assert decisions.cycle_step(reverting, 0, kill_switch=True) == decisions.REVERT_STEP
    assert not decisions.must_halt(settings, False)
    assert decisions.must_halt(settings, True)
    assert decisions.must_halt(dataclasses.replace(settings, paused=True), False)
    assert decisions.must_halt(dataclasses.replace(settings, revert=True), False)


def test_webhook_comes_from_a_secret_reference_never_an_inline_url() -> None:
    spec = {"eagerness": 1, "webhook": {"secretRef": {"name": "hook"}}}
    assert settings_from_spec(spec).webhook_secret == "hook"
    inline = {"eagerness": 1, "webhook": {"url": "https://example.invalid/x?token=secret"}}
    assert settings_from_spec(inline).webhook_secret == ""
    assert "token=" not in repr(settings_from_spec(inline))


def test_an_edit_mid_cycle_keeps_only_actions_the_live_spec_still_wants() -> None:
    planned = AgentSettings(ipsum=True, cancer=True, eagerness=100, targets=("a", "b"))
    assert decisions.still_wanted(planned, planned, IPSUM, "b", "")
    assert not decisions.still_wanted(dataclasses.replace(planned, targets=("a",)), planned, IPSUM, "b", "")
    assert not decisions.still_wanted(dataclasses.replace(planned, excluded=("b",)), planned, IPSUM, "b", "")
    assert not decisions.still_wanted(dataclasses.replace(planned, ipsum=False), planned, IPSUM, "a", "")
    assert decisions.still_wanted(dataclasses.replace(planned, ipsum=False), planned, CANCER, "a", "")
    assert not decisions.still_wanted(dataclasses.replace(planned, dry_run=True), planned, CANCER, "a", "")
    assert not decisions.still_wanted(planned, planned, IPSUM, "kube-system", "")  # the deny-list, always


def test_one_cycle_is_decided_in_one_call() -> None:
    windows = ({"from": "09:00", "to": "10:00"},)
    settings = AgentSettings(windows=windows, time_zone="UTC")
    inside, outside = at(2026, 11, 23, 9, 30, zone=datetime.UTC), at(2026, 11, 23, 11, 0, zone=datetime.UTC)
    chaos = decisions.decide_cycle(settings, inside, False, None, 1, "ops")
    assert chaos.step == decisions.CHAOS_STEP and chaos.status is None
    revert = decisions.decide_cycle(dataclasses.replace(settings, revert=True), inside, True, None, 1, "ops")
    assert revert.step == decisions.REVERT_STEP and revert.status is None  # revert goes on under the kill switch
    stopped = decisions.decide_cycle(settings, inside, True, None, 1, "ops")
    assert stopped.status is not None and stopped.status["state"] == "Paused"
    assert "blackadder.io/stop=true on namespace ops" in condition_of(stopped.status, "Ready")["message"]
    paused = decisions.decide_cycle(dataclasses.replace(settings, paused=True), inside, False, None, 1, "ops")
    assert paused.status is not None and condition_of(paused.status, "Ready")["reason"] == "Paused"
    assert paused.say is None  # paused by its own spec: nothing more to say
    # Outside the window: said once (a log line: nothing is wrong), not again while it lasts.
    idle = decisions.decide_cycle(settings, outside, False, None, 1, "ops")
    assert idle.step == decisions.IDLE_STEP and idle.say == "log" and idle.reason == "OutsideWindow"
    assert idle.status is not None and idle.status["state"] == "Idle"
    again = decisions.decide_cycle(settings, outside, False, idle.status["conditions"], 1, "ops")
    assert again.say is None and again.status == idle.status
    # An invalid spec: a Warning Event, once.
    invalid = decisions.decide_cycle(dataclasses.replace(settings, time_zone="Mars/Olympus"), 0, False, None, 1, "ops")
    assert invalid.say == "Warning" and invalid.reason == "InvalidSpec"
    assert condition_of(invalid.status or {}, "Stalled")["status"] == "True"


def condition_of(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_the_status_after_a_revert_and_after_a_failed_cycle() -> None:
    settings = AgentSettings(revert=True)
    summary: dict[str, Any] = {"processed": 2, "restored": ["a"], "failed": [{"key": "b", "error": "HTTP 403"}]}
    failed = decisions.revert_status(None, settings, 1, summary)
    assert failed["state"] == "RevertFailed" and failed["revert"] == summary
    assert "1 change(s) could not be restored yet" in condition_of(failed, "Ready")["message"]
    done = decisions.revert_status(None, settings, 1, {"processed": 0, "failed": []})
    assert done["state"] == "Reverted" and "revert" not in done
    retried = decisions.failed_status(None, AgentSettings(), 1, "HTTP 503 Service Unavailable" + "x" * 400, True)
    assert condition_of(retried, "Ready")["reason"] == "CycleFailed"
    assert len(condition_of(retried, "Ready")["message"]) == 300
    assert condition_of(retried, "Stalled")["status"] == "False"
    refused = decisions.failed_status(None, AgentSettings(), 1, "HTTP 403 Forbidden", False)
    assert condition_of(refused, "Stalled")["status"] == "True"  # only a person can help
