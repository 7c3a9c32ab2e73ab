"""Re-roller pure logic: reference discovery, opt-in, hashing, and the rollout decision."""

from __future__ import annotations

import dataclasses
import heapq
import json
from typing import Any, Final

import pytest

from kopf_operators.core.conventions import epoch_to_iso
from kopf_operators.reroller import pacing, patches, plans, views
from kopf_operators.reroller.plans import Action
from kopf_operators.reroller.settings import (
    ABSENT,
    AUTO,
    CONFIG_HASH,
    CONFIGMAPS,
    CRONJOB_INSTANTIATE,
    LAST_RELOADED_FROM,
    OBSERVED_HASH,
    OBSERVED_SOURCES,
    PAUSE_PERIOD,
    PAUSED_AT,
    RELOADER_AUTO,
    RELOADER_CONFIGMAP_AUTO,
    RELOADER_CONFIGMAPS,
    RELOADER_CONFIGMAPS_EXCLUDE,
    RELOADER_SEARCH,
    RELOADER_SECRET_AUTO,
    RELOADER_SECRETS,
    RELOADER_SECRETS_EXCLUDE,
    ROLLOUT_STRATEGY,
    SECRETS,
    USED_KEYS_ONLY,
    Options,
    parse_selector,
    selector_matches,
)
from kopf_operators.reroller.views import Source

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
    assert views.references(pod_spec) == expected


def workload(annotations: dict[str, str] | None = None, template_annotations: dict[str, str] | None = None,
             pod_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"template": {"metadata": {"annotations": template_annotations or {}},
                                  "spec": pod_spec or {"containers": [{"name": "c"}]}}}}


POD = {"volumes": [{"name": "v", "configMap": {"name": "nginx-conf"}}],
       "containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "creds"}}]}]}


def watched(body: dict[str, Any], lookup: dict[tuple[str, str], views.SourceView] | None = None,
            settings: Options | None = None) -> set[Source]:
    view = views.workload_view("Deployment", body, settings)
    return set() if view is None else views.effective_sources(view, lookup or {}, settings)


@pytest.mark.parametrize(("annotations", "template_annotations", "expected"), [
    ({}, {}, set()),
    ({AUTO: "true"}, {}, {Source(CM, "nginx-conf"), Source(SEC, "creds")}),
    ({AUTO: "false"}, {}, set()),
    ({}, {AUTO: "True"}, {Source(CM, "nginx-conf"), Source(SEC, "creds")}),
    ({RELOADER_AUTO: "true"}, {}, {Source(CM, "nginx-conf"), Source(SEC, "creds")}),
    ({CONFIGMAPS: "nginx-conf, other"}, {}, {Source(CM, "nginx-conf"), Source(CM, "other")}),
    ({SECRETS: "creds"}, {}, {Source(SEC, "creds")}),
    ({RELOADER_CONFIGMAPS: "nginx-conf"}, {}, {Source(CM, "nginx-conf")}),
    ({RELOADER_SECRETS: "x,y"}, {}, {Source(SEC, "x"), Source(SEC, "y")}),
    ({CONFIGMAPS: " , "}, {}, set()),
    # Reloader's typed auto keys: one kind only.
    ({RELOADER_CONFIGMAP_AUTO: "true"}, {}, {Source(CM, "nginx-conf")}),
    ({RELOADER_SECRET_AUTO: "true"}, {}, {Source(SEC, "creds")}),
    # Reloader reads the pod template's keys only when the workload has none for that kind.
    ({}, {RELOADER_CONFIGMAPS: "nginx-conf"}, {Source(CM, "nginx-conf")}),
    ({RELOADER_SECRETS: "creds"}, {RELOADER_CONFIGMAPS: "nginx-conf"},
     {Source(CM, "nginx-conf"), Source(SEC, "creds")}),
    # Exclusions (auto mode).
    ({RELOADER_AUTO: "true", RELOADER_CONFIGMAPS_EXCLUDE: "nginx-conf"}, {}, {Source(SEC, "creds")}),
    ({RELOADER_AUTO: "true", RELOADER_SECRETS_EXCLUDE: "creds"}, {}, {Source(CM, "nginx-conf")}),
    # Search mode without a matching source watches nothing.
    ({RELOADER_SEARCH: "true"}, {}, set()),
])
def test_watched_sources(annotations: dict[str, str], template_annotations: dict[str, str],
                         expected: set[Source]) -> None:
    body = workload(annotations, template_annotations, POD)
    assert watched(body) == expected


def test_reloader_keys_write_reloaders_annotation_ours_write_ours() -> None:
    ours = views.workload_view("Deployment", workload({AUTO: "true"}, pod_spec=POD))
    theirs = views.workload_view("Deployment", workload({RELOADER_AUTO: "true"}, pod_spec=POD))
    assert ours is not None and ours.ours and not ours.reloader
    assert theirs is not None and theirs.reloader and not theirs.ours
    assert views.workload_view("Deployment", workload({AUTO: "maybe"}, pod_spec=POD)) is None


def test_search_match_and_ignore_on_sources() -> None:
    body = workload({RELOADER_SEARCH: "true"}, pod_spec=POD)
    matched = {(CM, "nginx-conf"): views.SourceView("1" * 16, 1, match=True)}
    assert watched(body, matched) == {Source(CM, "nginx-conf")}
    ignored = {(CM, "nginx-conf"): views.SourceView("1" * 16, 1, ignore=True)}
    assert watched(workload({AUTO: "true"}, pod_spec=POD), ignored) == {Source(SEC, "creds")}
    unselected = {(SEC, "creds"): views.SourceView("1" * 16, 1, selected=False)}
    assert watched(workload({AUTO: "true"}, pod_spec=POD), unselected) == {Source(CM, "nginx-conf")}


def test_regex_names_are_anchored() -> None:
    body = workload({RELOADER_CONFIGMAPS: "app-config-.*"}, pod_spec=POD)
    view = views.workload_view("Deployment", body)
    assert view is not None and view.patterns == (("ConfigMap", "app-config-.*"),)
    lookup = {(CM, n): views.SourceView("1" * 16, 1) for n in ("app-config-a", "other-app-config-b", "app-config")}
    assert views.effective_sources(view, lookup) == {Source(CM, "app-config-a")}
    entries = views.workload_index_entries(view)
    assert entries[(CM, "ns", "*")] == ("Deployment", "ns", "w")


def test_operator_wide_options() -> None:
    settings = Options(auto_reload_all=True)
    assert watched(workload(pod_spec=POD), settings=settings) == {Source(CM, "nginx-conf"), Source(SEC, "creds")}
    assert watched(workload({RELOADER_AUTO: "false"}, pod_spec=POD), settings=settings) == set()
    assert views.workload_view("Job", workload({AUTO: "true"}, pod_spec=POD),
                               Options(ignored_workload_types=("jobs",))) is None
    assert views.workload_view("Deployment", workload({AUTO: "true"}, pod_spec=POD),
                               Options(namespaces_to_ignore=("ns",))) is None
    assert watched(workload({AUTO: "true"}, pod_spec=POD),
                   settings=Options(resources_to_ignore=("secrets",))) == {Source(CM, "nginx-conf")}


def test_settings_from_env() -> None:
    settings = Options.from_env({
        "REROLLER_DEBOUNCE_SECONDS": "0", "REROLLER_AUTO_RELOAD_ALL": "true",
        "REROLLER_NAMESPACES_TO_IGNORE": "a, b", "REROLLER_IGNORED_WORKLOAD_TYPES": "jobs,cronjobs",
        "REROLLER_NAMESPACE_SELECTOR": "team=web,env in (prod, stage),!legacy"})
    assert settings.debounce_seconds == 0 and settings.auto_reload_all
    assert settings.namespaces_to_ignore == ("a", "b") and settings.ignored_workload_types == ("jobs", "cronjobs")
    for bad in ({"REROLLER_RESOURCES_TO_IGNORE": "configmaps,secrets"}, {"REROLLER_IGNORED_WORKLOAD_TYPES": "pods"},
                {"REROLLER_NAMESPACE_SELECTOR": "a=(b"}, {"REROLLER_MIN_INTERVAL_SECONDS": "soon"}):
        with pytest.raises(ValueError):
            Options.from_env(bad)


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    ("", {}, True), ("a=b", {"a": "b"}, True), ("a=b", {"a": "c"}, False), ("a==b", {"a": "b"}, True),
    ("a!=b", {}, True), ("a!=b", {"a": "b"}, False), ("a", {"a": ""}, True), ("!a", {"a": "x"}, False),
    ("a in (x, y)", {"a": "y"}, True), ("a notin (x,y),b=c", {"b": "c"}, True), ("a in (x)", {}, False),
])
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert selector_matches(parse_selector(selector), labels) is expected


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10), ("5m", 300), ("1h30m", 5400), ("1.5h", 5400),
                                                ("", None), ("soon", None), ("5 m", None)])
def test_parse_duration(text: str, seconds: float | None) -> None:
    assert views.parse_duration(text) == seconds


def test_source_hash_is_stable_and_order_independent() -> None:
    a = {"data": {"x": "1", "y": "2"}, "metadata": {"uid": "u1", "resourceVersion": "1"}}
    b = {"data": {"y": "2", "x": "1"}, "metadata": {"uid": "u2", "resourceVersion": "99",
                                                   "labels": {"new": "label"}}}
    assert views.source_hash(CM, a) == views.source_hash(CM, b)
    assert views.source_hash(CM, a) == views.source_hash(CM, json.loads(json.dumps(a)))


def test_source_hash_differs_on_data_change() -> None:
    base = {"data": {"nginx.conf": "worker_processes 1;"}}
    h = views.source_hash(CM, base)
    assert h != views.source_hash(CM, {"data": {"nginx.conf": "worker_processes 2;"}})
    assert h != views.source_hash(CM, {"data": {"other.conf": "worker_processes 1;"}})
    assert h != views.source_hash(CM, {**base, "binaryData": {"b": "AAE="}})
    assert views.source_hash(CM, {}) == views.source_hash(CM, {"data": None})


def test_secret_hash_never_contains_the_value() -> None:
    h = views.source_hash(SEC, {"data": {"password": "c2VjcmV0"}})
    assert "c2VjcmV0" not in h and "secret" not in h and len(h) == 16


def test_combined_hash_is_order_independent() -> None:
    assert plans.combined_hash({"a": "1", "b": "2"}) == plans.combined_hash({"b": "2", "a": "1"})
    assert plans.combined_hash({"a": "1"}) != plans.combined_hash({"a": "2"})


SOURCES = {Source(CM, "nginx-conf"), Source(SEC, "creds")}
LOOKUP = {(CM, "nginx-conf"): "1111111111111111", (SEC, "creds"): "2222222222222222"}


def observed(snap: plans.Snapshot) -> dict[str, str]:
    return patches.metadata_patch(plans.Plan(Action.BASELINE, new_hash=snap.hash), snap)["metadata"]["annotations"]


def test_first_sighting_records_the_baseline_without_rolling() -> None:
    snap = plans.snapshot(SOURCES, LOOKUP)
    plan = plans.plan({}, snap)
    assert plan.action is Action.BASELINE
    patch = patches.metadata_patch(plan, snap)
    assert "spec" not in patch  # the pod template is not touched: no rollout
    assert patch["metadata"]["annotations"][OBSERVED_HASH] == snap.hash


def test_unchanged_data_is_a_noop() -> None:
    snap = plans.snapshot(SOURCES, LOOKUP)
    assert plans.plan(observed(snap), snap).action is Action.NONE


def test_changed_data_rolls_and_names_the_source() -> None:
    before = observed(plans.snapshot(SOURCES, LOOKUP))
    snap = plans.snapshot(SOURCES, {**LOOKUP, (CM, "nginx-conf"): "3333333333333333"})
    plan = plans.plan(before, snap)
    assert plan.action is Action.ROLL and plan.changed == ("configmap/nginx-conf",)
    view = views.workload_view("Deployment", workload({AUTO: "true"}, pod_spec=POD))
    assert view is not None
    patch = patches.roll_patch(view, plan, snap, 0.0)
    assert patch["spec"]["template"]["metadata"]["annotations"] == {CONFIG_HASH: snap.hash}
    assert patch["metadata"]["annotations"][OBSERVED_HASH] == snap.hash


def test_missing_required_source_waits_and_keeps_the_baseline() -> None:
    before = observed(plans.snapshot(SOURCES, LOOKUP))
    snap = plans.snapshot(SOURCES, {(SEC, "creds"): LOOKUP[(SEC, "creds")]})
    plan = plans.plan(before, snap)
    assert plan.action is Action.WAIT_MISSING and plan.missing == ("configmap/nginx-conf",)
    # Recreated with the same data: nothing to do.
    assert plans.plan(before, plans.snapshot(SOURCES, LOOKUP)).action is Action.NONE


def test_missing_optional_source_is_hashed_as_absent() -> None:
    sources = {Source(CM, "opt", optional=True)}
    snap = plans.snapshot(sources, {})
    assert snap.per_source == {"configmap/opt": ABSENT} and not snap.missing
    later = plans.snapshot(sources, {(CM, "opt"): "4444444444444444"})
    assert plans.plan(observed(snap), later).action is Action.ROLL


def test_changed_set_of_sources_rebaselines_without_a_second_rollout() -> None:
    before = observed(plans.snapshot({Source(CM, "nginx-conf")}, LOOKUP))
    plan = plans.plan(before, plans.snapshot(SOURCES, LOOKUP))
    assert plan.action is Action.BASELINE


def test_foreign_baseline_without_per_source_hashes_rolls() -> None:
    snap = plans.snapshot(SOURCES, LOOKUP)
    plan = plans.plan({OBSERVED_HASH: "something-else"}, snap)
    assert plan.action is Action.ROLL and set(plan.changed) == {"configmap/nginx-conf", "secret/creds"}


def test_first_sighting_rolls_a_change_made_after_the_workload() -> None:
    """A source whose resourceVersion is newer than the workload's first-seen one changed after the
    workload existed: never absorbed into the baseline."""
    snap = plans.snapshot(SOURCES, LOOKUP)
    plan = plans.plan({}, snap, newer=["configmap/nginx-conf"])
    assert plan.action is Action.ROLL and plan.changed == ("configmap/nginx-conf",)


def test_first_sighting_with_a_missing_source_records_it_absent() -> None:
    snap = plans.snapshot(SOURCES, {(SEC, "creds"): LOOKUP[(SEC, "creds")]})
    plan = plans.plan({}, snap)
    assert plan.action is Action.BASELINE and plan.missing == ("configmap/nginx-conf",)
    # It appears: re-baseline, no rollout (pods could not have run without it) ...
    assert plans.plan(observed(snap), plans.snapshot(SOURCES, LOOKUP)).action is Action.BASELINE
    # ... unless reload-on-create.
    assert plans.plan(observed(snap), plans.snapshot(SOURCES, LOOKUP), reload_on_create=True).action is Action.ROLL


def test_reload_on_delete_rolls_instead_of_holding() -> None:
    before = observed(plans.snapshot(SOURCES, LOOKUP))
    gone = plans.snapshot(SOURCES, {(SEC, "creds"): LOOKUP[(SEC, "creds")]})
    assert plans.plan(before, gone).action is Action.WAIT_MISSING
    plan = plans.plan(before, gone, reload_on_delete=True)
    assert plan.action is Action.ROLL and plan.changed == ("configmap/nginx-conf",)


def test_last_reloaded_from_is_reloaders_format() -> None:
    view = views.workload_view("Deployment", workload({RELOADER_AUTO: "true"}, pod_spec=POD))
    assert view is not None
    before = observed(plans.snapshot(SOURCES, LOOKUP))
    snap = plans.snapshot(SOURCES, {**LOOKUP, (SEC, "creds"): "3333333333333333"})
    plan = plans.plan(before, snap)
    patch = patches.roll_patch(view, plan, snap, 1700000000.0, rv=42)
    annotations = patch["spec"]["template"]["metadata"]["annotations"]
    assert CONFIG_HASH not in annotations
    value = annotations[LAST_RELOADED_FROM]
    assert list(json.loads(value)) == ["type", "name", "namespace", "hash", "containerRefs", "observedAt"]
    assert json.loads(value) == {"type": "SECRET", "name": "creds", "namespace": "ns", "hash": "33333333",
                                 "containerRefs": ["c"], "observedAt": 1700000000}
    assert patch["metadata"]["resourceVersion"] == "42"


def test_pause_period_pauses_and_resumes() -> None:
    body = workload({RELOADER_AUTO: "true", PAUSE_PERIOD: "10s"}, pod_spec=POD)
    view = views.workload_view("Deployment", body)
    assert view is not None and view.pause_period == 10
    snap = plans.snapshot(SOURCES, LOOKUP)
    rolled = plans.Plan(Action.ROLL, new_hash=snap.hash, changed=("secret/creds",))
    patch = patches.roll_patch(view, rolled, snap, 1000.0)
    assert patch["spec"]["paused"] is True and patch["metadata"]["annotations"][PAUSED_AT]
    body["metadata"]["annotations"][PAUSED_AT] = epoch_to_iso(1000.0)
    body["spec"]["paused"] = True
    paused = views.workload_view("Deployment", body)
    assert paused is not None and patches.unpause_due(paused, 1004.0) == 6.0
    assert patches.unpause_patch()["spec"] == {"paused": False}


def test_cronjob_job_and_recreated_job() -> None:
    cron = {"metadata": {"name": "nightly", "namespace": "ns", "uid": "u1",
                         "annotations": {RELOADER_AUTO: "true"}},
            "spec": {"jobTemplate": {"metadata": {"labels": {"a": "b"}},
                                     "spec": {"template": {"spec": POD}}}}}
    view = views.workload_view("CronJob", cron)
    assert view is not None and view.sources == SOURCES
    job = patches.cronjob_job(view, "abcde", {})
    assert job["metadata"]["name"] == "nightly-abcde"
    assert job["metadata"]["annotations"][CRONJOB_INSTANTIATE] == "manual"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u1" and job["spec"]["template"]["spec"] == POD
    labels = {"controller-uid": "x", "batch.kubernetes.io/job-name": "j", "app": "a"}
    body = {"metadata": {"name": "j", "namespace": "ns", "uid": "u2", "labels": dict(labels),
                         "annotations": {RELOADER_AUTO: "true"}},
            "spec": {"selector": {"matchLabels": {"controller-uid": "x"}},
                     "template": {"metadata": {"labels": dict(labels)}, "spec": POD}}}
    job_view = views.workload_view("Job", body)
    assert job_view is not None
    again = patches.recreated_job(job_view, {OBSERVED_HASH: "h"})
    assert "selector" not in again["spec"] and again["spec"]["template"]["metadata"]["labels"] == {"app": "a"}
    assert again["metadata"]["annotations"] == {RELOADER_AUTO: "true", OBSERVED_HASH: "h"}


def test_suspended_cronjob_holds_the_rollout() -> None:
    """Issue #20: a suspended CronJob gets no Job; the change is only recorded."""
    cron: dict[str, Any] = {
        "metadata": {"name": "nightly", "namespace": "ns", "uid": "u1", "annotations": {AUTO: "true"}},
            "spec": {"suspend": True, "jobTemplate": {"spec": {"template": {"spec": POD}}}}}
    roll = plans.Plan(Action.ROLL, new_hash="h", changed=("configmap/nginx-conf",))
    suspended = views.workload_view("CronJob", cron)
    assert suspended is not None and plans.held_by_suspend(suspended, roll)
    assert not plans.held_by_suspend(suspended, plans.Plan(Action.BASELINE, new_hash="h"))
    cron["spec"]["suspend"] = False
    active = views.workload_view("CronJob", cron)
    assert active is not None and not plans.held_by_suspend(active, roll)
    # A Deployment's spec.suspend means nothing (there is no such field): never held.
    body = workload({AUTO: "true"}, pod_spec=POD)
    body["spec"]["suspend"] = True
    deployment = views.workload_view("Deployment", body)
    assert deployment is not None and not plans.held_by_suspend(deployment, roll)


def test_pacing_leading_edge_then_one_trailing_rollout() -> None:
    settings = Options(debounce_seconds=2, min_interval_seconds=10)
    assert pacing.next_rollout_at(None, 100.0, settings) == 100.0          # first change: at once
    assert pacing.next_rollout_at(100.0, 100.5, settings) == 110.0         # within the window: later
    assert pacing.next_rollout_at(100.0, 200.0, settings) == 200.0         # quiet again: at once
    # A source flapping 10 times a second for a minute: at most 60 / 10 + 1 rollouts.
    rolls: list[float] = []
    t = 0.0
    while t < 60:
        if pacing.next_rollout_at(rolls[-1] if rolls else None, t, settings) <= t:
            rolls.append(t)
        t += 0.1
    assert len(rolls) <= 7 and rolls[0] == 0.0


def simulate(bucket: pacing.TokenBucket, arrivals: list[tuple[float, str, str]]) -> dict[str, float]:
    """Each rollout asks at its arrival and again whenever the bucket says (as the controller's timers
    do); the time each one is granted."""
    queue = [(at, ns, key) for at, ns, key in arrivals]
    heapq.heapify(queue)
    granted: dict[str, float] = {}
    while queue:
        at, ns, key = heapq.heappop(queue)
        wait = bucket.ask(ns, key, at)
        if wait == 0:
            granted[key] = at
        else:
            heapq.heappush(queue, (at + wait, ns, key))
    return granted


def test_token_bucket_spreads_mass_rollouts() -> None:
    bucket = pacing.TokenBucket(rate=20, burst=40, now=0.0)
    granted = simulate(bucket, [(0.0, "ns", f"w{i}") for i in range(500)])
    times = sorted(granted.values())
    assert times[:40] == [0.0] * 40 and times[40] > 0
    assert times[-1] == pytest.approx((500 - 40) / 20, abs=0.01)
    # Never faster than the rate: any window of one second holds at most rate (+ burst at the start).
    assert all(times[i + 20] - times[i] >= 1 - 0.01 for i in range(40, len(times) - 20))
    assert pacing.TokenBucket(rate=0, burst=1, now=0).ask("ns", "k", 0) == 0.0
    assert not bucket.waiting


def test_a_flapping_namespace_delays_another_namespaces_first_rollout_by_at_most_one_token_interval() -> None:
    rate = 20
    for arrival in (0.0, 0.01, 2.0, 5.333, 11.9):
        bucket = pacing.TokenBucket(rate=rate, burst=40, now=0.0)
        flapping = [(i * 0.001, "flapping", f"f{i}") for i in range(300)]  # 300 rollouts at once: ~13 s of tokens
        granted = simulate(bucket, [*flapping, (arrival, "quiet", "q0"), (arrival + 0.5, "other", "o0")])
        assert granted["q0"] - arrival <= 1 / rate + 1e-9, arrival
        assert granted["o0"] - (arrival + 0.5) <= 1 / rate + 1e-9, arrival
        # The flapping namespace still gets every rollout, at the rate overall.
        assert len(granted) == 302 and max(granted.values()) == pytest.approx((302 - 40) / rate, abs=0.06)


def test_namespaces_waiting_together_take_turns() -> None:
    bucket = pacing.TokenBucket(rate=10, burst=1, now=0.0)
    arrivals = [(0.0, ns, f"{ns}{i}") for ns in ("a", "b", "c") for i in range(4)]
    granted = simulate(bucket, arrivals)
    order = [key for key, _at in sorted(granted.items(), key=lambda item: item[1])]
    # After the one burst token, round-robin: no namespace gets two before the others got one.
    firsts = [key[0] for key in order[1:]]
    for i in range(0, len(firsts) - 2, 3):
        assert len(set(firsts[i:i + 3])) == 3, firsts


def test_a_cancelled_waiter_frees_its_place() -> None:
    bucket = pacing.TokenBucket(rate=1, burst=1, now=0.0)
    assert bucket.ask("a", "a0", 0.0) == 0.0
    assert bucket.ask("a", "a1", 0.0) == pytest.approx(1.0)
    assert bucket.ask("a", "a2", 0.0) == pytest.approx(2.0)
    bucket.cancel("a", "a1")
    assert bucket.ask("a", "a2", 0.0) == pytest.approx(1.0)
    bucket.cancel("a", "a2")
    assert not bucket.waiting


def test_workload_index_entries() -> None:
    body = workload({AUTO: "true"}, pod_spec=POD)
    entries = views.workload_index_entries(views.workload_view("Deployment", body))
    assert entries[(CM, "ns", "nginx-conf")] == ("Deployment", "ns", "w")
    assert entries[(SEC, "ns", "creds")] == ("Deployment", "ns", "w")
    assert isinstance(entries[("view", "Deployment", "ns", "w")], views.WorkloadView)
    assert views.workload_index_entries(views.workload_view("Deployment", workload(pod_spec=POD))) == {}


def test_huge_baselines_keep_the_combined_hash_only() -> None:
    sources = {Source(CM, f"missing-{i:05d}-" + "x" * 80) for i in range(1500)}
    snap = plans.snapshot(sources, {})
    annotations = patches.baseline_annotations(plans.plan({}, snap), snap)
    assert annotations[OBSERVED_SOURCES] == "{}" and annotations[OBSERVED_HASH] == snap.hash


def test_many_long_named_sources_keep_per_source_hashes_by_digest() -> None:
    """130 sources with 253-character names: the refs do not fit, their digests do. Adding a source
    (a template edit, which rolls by itself) re-baselines; a data change rolls and names the source."""
    names = [f"p{i:03d}-" + "x" * 248 for i in range(130)]
    lookup = {(CM, n): views.source_view(CM, {"metadata": {"name": n, "resourceVersion": "1"}, "data": {"k": "1"}})
              for n in [*names, "extra"]}
    snap = plans.snapshot({Source(CM, n) for n in names}, lookup)
    stored = patches.baseline_annotations(plans.plan({}, snap), snap)
    assert stored[OBSERVED_SOURCES] != "{}" and len(stored[OBSERVED_SOURCES]) <= patches.MAX_OBSERVED_SOURCES
    assert plans.ref_digest(f"configmap/{names[0]}") in stored[OBSERVED_SOURCES]

    more = plans.snapshot({Source(CM, n) for n in [*names, "extra"]}, lookup)
    assert plans.plan(stored, more).action is Action.BASELINE

    lookup[(CM, names[99])] = views.source_view(CM, {"metadata": {"name": names[99], "resourceVersion": "2"},
                                                     "data": {"k": "2"}})
    changed = plans.plan(stored, plans.snapshot({Source(CM, n) for n in names}, lookup))
    assert changed.action is Action.ROLL and changed.changed == (f"configmap/{names[99]}",)


# --- the env-vars strategy (Reloader's --reload-strategy=env-vars) -----------------------------------


@pytest.mark.parametrize(("kind", "name", "expected"), [
    (CM, "nginx-conf", "STAKATER_NGINX_CONF_CONFIGMAP"),
    (SEC, "db.creds", "STAKATER_DB_CREDS_SECRET"),
    (CM, "a--b..c", "STAKATER_A_B_C_CONFIGMAP"),      # a run of other characters: one "_"
    (CM, "app-", "STAKATER_APP__CONFIGMAP"),          # a trailing one stays, as in Reloader
    (CM, "0cfg", "STAKATER_0CFG_CONFIGMAP"),
])
def test_env_var_name_is_reloaders(kind: str, name: str, expected: str) -> None:
    assert patches.env_var_name(kind, name) == expected


def test_reload_strategy_setting() -> None:
    assert Options.from_env({}).reload_strategy == "annotations"
    assert Options.from_env({"REROLLER_RELOAD_STRATEGY": "env-vars"}).env_vars
    with pytest.raises(ValueError, match="REROLLER_RELOAD_STRATEGY"):
        Options.from_env({"REROLLER_RELOAD_STRATEGY": "envvars"})


ENV_SETTINGS = Options(reload_strategy="env-vars")


def env_view(pod_spec: dict[str, Any], annotations: dict[str, str] | None = None) -> views.WorkloadView:
    view = views.workload_view("Deployment", workload(annotations or {AUTO: "true"}, pod_spec=pod_spec),
                               ENV_SETTINGS)
    assert view is not None
    return view


def test_env_vars_patch_adds_then_replaces_the_variable() -> None:
    pod: dict[str, Any] = {"volumes": [{"name": "v", "configMap": {"name": "conf"}}],
                           "containers": [{"name": "side"},
                                          {"name": "app", "volumeMounts": [{"name": "v", "mountPath": "/c"}]}]}
    view = env_view(pod)
    snap = plans.Snapshot(per_source={"configmap/conf": "1a2b3c4d"}, missing=[])
    plan = plans.Plan(Action.ROLL, new_hash="h2", changed=("configmap/conf",))
    ops = patches.env_vars_patch(view, plan, snap, 0.0, rv=7)
    assert ops[0] == {"op": "replace", "path": "/metadata/resourceVersion", "value": "7"}
    # The container mounting the volume (index 1), which had no env: the list is created.
    assert ops[-1] == {"op": "add", "path": "/spec/template/spec/containers/1/env",
                       "value": [{"name": "STAKATER_CONF_CONFIGMAP", "value": "1a2b3c4d"}]}
    assert {"op": "add", "path": "/metadata/annotations/reroller.kopf-operators.dev~1observed-hash",
            "value": "h2"} in ops
    assert not any("template/metadata" in op["path"] for op in ops), "no pod-template annotation"
    # The variable already there: its value is replaced in place; other variables are kept.
    pod["containers"][1]["env"] = [{"name": "X", "value": "1"}, {"name": "STAKATER_CONF_CONFIGMAP", "value": "old"}]
    ops = patches.env_vars_patch(env_view(pod), plan, snap, 0.0)
    assert ops[-1] == {"op": "replace", "path": "/spec/template/spec/containers/1/env/1/value", "value": "1a2b3c4d"}


def test_env_vars_patch_picks_containers_as_reloader_does() -> None:
    pod = {"initContainers": [{"name": "init", "envFrom": [{"secretRef": {"name": "s"}}]}],
           "containers": [{"name": "a", "env": []}, {"name": "b", "envFrom": [{"configMapRef": {"name": "c"}}]}]}
    view = env_view(pod, {AUTO: "true", CONFIGMAPS: "named"})
    snap = plans.Snapshot(per_source={"configmap/c": "11", "secret/s": "22", "configmap/named": "33"}, missing=[])
    plan = plans.Plan(Action.ROLL, new_hash="h", changed=("configmap/c", "configmap/named", "secret/s"))
    env_ops = [op for op in patches.env_vars_patch(view, plan, snap, 0.0) if "/env" in op["path"]]
    assert env_ops == [
        {"op": "add", "path": "/spec/template/spec/containers/1/env", "value": [{"name": "STAKATER_C_CONFIGMAP",
                                                                                  "value": "11"}]},
        # Not referenced (a named source) and used by an init container only: the first container.
        {"op": "add", "path": "/spec/template/spec/containers/0/env/-",
         "value": {"name": "STAKATER_NAMED_CONFIGMAP", "value": "33"}},
        {"op": "add", "path": "/spec/template/spec/containers/0/env/-",
         "value": {"name": "STAKATER_S_SECRET", "value": "22"}},
    ]


def test_env_vars_patch_without_annotations_and_with_a_pause_period() -> None:
    view = env_view(POD, {AUTO: "true"})
    bare = dataclasses.replace(view, has_annotations=False, pause_period=60.0)
    snap = plans.Snapshot(per_source={"configmap/nginx-conf": "aa"}, missing=[])
    roll = plans.Plan(Action.ROLL, new_hash="h", changed=("configmap/nginx-conf",))
    ops = patches.env_vars_patch(bare, roll, snap, 0.0)
    added = next(op for op in ops if op["path"] == "/metadata/annotations")
    assert added["value"][OBSERVED_HASH] == "h" and PAUSED_AT in added["value"]
    assert {"op": "add", "path": "/spec/paused", "value": True} in ops


def test_annotations_strategy_keeps_no_container_state() -> None:
    view = views.workload_view("Deployment", workload({AUTO: "true"}, pod_spec=POD))
    assert view is not None and view.env_containers == ()


# --- key-scoped reloads (reroller.kopf-operators.dev/used-keys-only) --------------------------------

USED_KEYS_TABLE: list[tuple[str, dict[str, Any], dict[tuple[str, str], frozenset[str] | None]]] = [
    ("configMapKeyRef", {"containers": [{"name": "c", "env": [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "b"}}}]}]},
     {(CM, "cm"): frozenset({"a", "b"})}),
    ("secretKeyRef", {"containers": [{"name": "c", "env": [
        {"name": "P", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}}]}]},
     {(SEC, "s"): frozenset({"password"})}),
    ("volume items", {"volumes": [{"name": "v", "configMap": {"name": "cm", "items": [
        {"key": "nginx.conf", "path": "nginx.conf"}]}}, {"name": "w", "secret": {"secretName": "s", "items": [
            {"key": "tls.crt", "path": "crt"}]}}]},
     {(CM, "cm"): frozenset({"nginx.conf"}), (SEC, "s"): frozenset({"tls.crt"})}),
    ("projected items and whole", {"volumes": [{"name": "v", "projected": {"sources": [
        {"configMap": {"name": "cm", "items": [{"key": "x", "path": "x"}]}}, {"secret": {"name": "s"}}]}}]},
     {(CM, "cm"): frozenset({"x"}), (SEC, "s"): None}),
    ("whole volume", {"volumes": [{"name": "v", "configMap": {"name": "cm"}}]}, {(CM, "cm"): None}),
    ("envFrom", {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "cm"}},
                                                          {"secretRef": {"name": "s"}}]}]},
     {(CM, "cm"): None, (SEC, "s"): None}),
    ("a key plus every key: every key", {"volumes": [{"name": "v", "configMap": {"name": "cm"}}],
                                         "initContainers": [{"name": "i", "env": [
                                             {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm",
                                                                                             "key": "a"}}}]}]},
     {(CM, "cm"): None}),
    ("every key, then a key: still every key", {"containers": [{"name": "c", "envFrom": [
        {"configMapRef": {"name": "cm"}}], "env": [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}}]}]}, {(CM, "cm"): None}),
    ("same name, both kinds", {"containers": [{"name": "c", "env": [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "a"}}},
        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "x", "key": "b"}}}]}]},
     {(CM, "x"): frozenset({"a"}), (SEC, "x"): frozenset({"b"})}),
]


@pytest.mark.parametrize(("pod_spec", "expected"), [(s, e) for _, s, e in USED_KEYS_TABLE],
                         ids=[n for n, _, _ in USED_KEYS_TABLE])
def test_used_keys(pod_spec: dict[str, Any], expected: dict[tuple[str, str], frozenset[str] | None]) -> None:
    assert views.used_keys(pod_spec) == expected


KEYED_POD = {"containers": [{"name": "c", "env": [
    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "shared", "key": "a"}}}]}]}


def keyed_snapshot(data: dict[str, str], annotations: dict[str, str], pod: dict[str, Any] | None = None
                   ) -> plans.Snapshot:
    view = views.workload_view("Deployment", workload(annotations, pod_spec=pod or KEYED_POD))
    assert view is not None
    body = {"data": data}
    found = views.SourceView(views.source_hash(CM, body), 1, keys=views.key_hashes(CM, body))
    return plans.snapshot(view.sources, {(CM, "shared"): found}, view.key_scopes)


SCOPED = {AUTO: "true", USED_KEYS_ONLY: "true"}


def test_key_scoped_snapshot_ignores_unused_keys() -> None:
    before = keyed_snapshot({"a": "1", "b": "1"}, SCOPED)
    assert keyed_snapshot({"a": "1", "b": "2"}, SCOPED).hash == before.hash     # b is not used
    assert keyed_snapshot({"a": "2", "b": "1"}, SCOPED).hash != before.hash     # a is
    assert keyed_snapshot({"b": "1"}, SCOPED).hash != before.hash               # a removed
    # Without the opt-in, any key rolls.
    plain = keyed_snapshot({"a": "1", "b": "1"}, {AUTO: "true"})
    assert keyed_snapshot({"a": "1", "b": "2"}, {AUTO: "true"}).hash != plain.hash


def test_key_scope_change_is_no_data_change() -> None:
    """Switching the opt-in on or off, or the template starting to use another key, re-records the
    baseline (the template edit rolls by itself), never a second rollout."""
    data = {"a": "1", "b": "1"}
    plain, scoped = keyed_snapshot(data, {AUTO: "true"}), keyed_snapshot(data, SCOPED)
    more = {"containers": [{"name": "c", "env": [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "shared", "key": "a"}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "shared", "key": "b"}}}]}]}
    wider = keyed_snapshot(data, SCOPED, more)
    for old, new in ((plain, scoped), (scoped, plain), (scoped, wider)):
        stored = patches.baseline_annotations(plans.Plan(Action.BASELINE, new_hash=old.hash), old)
        assert plans.plan(stored, new).action is Action.BASELINE
    stored = patches.baseline_annotations(plans.Plan(Action.BASELINE, new_hash=scoped.hash), scoped)
    assert plans.plan(stored, keyed_snapshot({"a": "2", "b": "1"}, SCOPED)).action is Action.ROLL


def test_key_hashes_never_hold_values() -> None:
    keys = views.key_hashes(SEC, {"data": {"password": "aHVudGVyMg=="}})
    assert [k for k, _ in keys] == ["password"] and "aHVudGVyMg==" not in str(keys)


def test_argo_rollout_restart_strategy_sets_restart_at() -> None:
    body = workload({RELOADER_AUTO: "true", ROLLOUT_STRATEGY: "restart"}, pod_spec=POD)
    view = views.workload_view("Rollout", body)
    assert view is not None and view.restart
    snap = plans.Snapshot(per_source={"configmap/nginx-conf": "aa"}, missing=[])
    patch = patches.roll_patch(view, plans.Plan(Action.ROLL, new_hash="h", changed=("configmap/nginx-conf",)), snap,
                               1_700_000_000.0, rv=3)
    assert patch["spec"] == {"restartAt": "2023-11-14T22:13:20Z"}
    assert patch["metadata"]["annotations"][OBSERVED_HASH] == "h"
    # Default ("rollout" or absent): the pod template, as for a Deployment; the key means nothing elsewhere.
    body["metadata"]["annotations"][ROLLOUT_STRATEGY] = "rollout"
    default = views.workload_view("Rollout", body)
    assert default is not None and not default.restart
    assert LAST_RELOADED_FROM in patches.roll_patch(default, plans.Plan(Action.ROLL, new_hash="h"), snap, 0.0)[
        "spec"]["template"]["metadata"]["annotations"]
    body["metadata"]["annotations"][ROLLOUT_STRATEGY] = "restart"
    deployment = views.workload_view("Deployment", body)
    assert deployment is not None and not deployment.restart
