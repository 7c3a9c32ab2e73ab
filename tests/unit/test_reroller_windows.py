"""The re-roller's restart windows and CronJob modes: the window syntax (and what it refuses), when a
window is open, which rollouts are held, and what the controller writes for a held, a released and a
reverted change, and for each CronJob mode."""

from __future__ import annotations

import asyncio
import calendar
import json
import time
from typing import Any

import pytest

from kopf_operators.core import background as toolkit
from kopf_operators.core.conventions import REROLLER_PENDING
from kopf_operators.reroller import controller as reroller
from kopf_operators.reroller import plans, settings, views
from kopf_operators.reroller.controller import RerollerController
from kopf_operators.reroller.patches import (
    active_job,
    baseline_annotations,
    cronjob_template_patch,
    env_vars_patch,
    recreated_job,
)
from kopf_operators.reroller.plans import Action
from kopf_operators.reroller.views import API_VERSIONS
from kopf_operators.reroller.windows import RestartWindow, cronjob_mode, hold, is_open, next_opening, parse_window
from tests.unit.fake_access import FakeAccess

OPTIONS = settings.Options()
CHANGED = plans.Plan(Action.ROLL, new_hash="h", changed=("configmap/conf",))


def utc(text: str) -> float:
    """Epoch seconds of "YYYY-MM-DD HH:MM:SS" UTC."""
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")))


def policy(timezone: str = "UTC", *windows: tuple[str, str]) -> str:
    return json.dumps({"timezone": timezone,
                       "windows": [{"cron": cron, "duration": duration} for cron, duration in windows]})


NIGHTLY = policy("UTC", ("0 2 * * *", "1h"))


@pytest.mark.parametrize(("text", "problem"), [
    ("2am", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"windows": [{"cron": "0 2 * * *", "duration": "1h"}]}', "no timezone"),
    (policy("Mars/Olympus", ("0 2 * * *", "1h")), "unknown timezone"),
    (policy("UTC"), "1 to 16 windows"),
    (policy("UTC", *[("0 2 * * *", "1h")] * 17), "1 to 16 windows"),
    (policy("UTC", ("0 2 * *", "1h")), "five-field cron"),
    (policy("UTC", ("0 2 * * * 2030", "1h")), "five-field cron"),
    (policy("UTC", ("61 2 * * *", "1h")), "five-field cron"),
    (policy("UTC", ("0 2 * * *", "30s")), "between 1m and 24h"),
    (policy("UTC", ("0 2 * * *", "25h")), "between 1m and 24h"),
    (policy("UTC", ("0 2 * * *", "1 hour")), "between 1m and 24h"),
    ('{"timezone": "UTC", "windows": [{"cron": "0 2 * * *", "duration": "1h"}], "tz": "x"}', "unknown field"),
    ('{"timezone": "UTC", "windows": [{"cron": "0 2 * * *"}]}', "exactly the fields"),
])
def test_a_malformed_window_is_refused_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_window(text)


def test_a_window_is_half_open_and_says_when_it_opens_next() -> None:
    window = parse_window(NIGHTLY)
    assert window == RestartWindow("UTC", (("0 2 * * *", 3600.0),))
    assert not is_open(window, utc("2026-11-27 01:59:59"))
    assert is_open(window, utc("2026-11-27 02:00:00"))
    assert is_open(window, utc("2026-11-27 02:59:59"))
    assert not is_open(window, utc("2026-11-27 03:00:00"))
    assert next_opening(window, utc("2026-11-27 03:00:00")) == utc("2026-11-28 02:00:00")
    # Several windows: any one opens it; the next opening is the earliest.
    two = parse_window(policy("UTC", ("0 2 * * *", "1h"), ("30 12 * * 1-5", "15m")))
    friday_noon = utc("2026-11-27 12:40:00")  # a Friday
    assert is_open(two, friday_noon)
    assert next_opening(two, utc("2026-11-27 13:00:00")) == utc("2026-11-28 02:00:00")


def test_a_window_reads_its_time_zone_and_keeps_its_elapsed_duration_across_dst() -> None:
    berlin = parse_window(policy("Europe/Berlin", ("0 2 * * *", "1h")))
    assert is_open(berlin, utc("2026-11-27 01:30:00"))  # 02:30 in Berlin (CET, UTC+1)
    assert not is_open(berlin, utc("2026-11-27 02:30:00"))
    # 2026-10-25: clocks go back at 03:00 CEST; a window opening at 01:00 for 3h ends 3 hours later.
    night = parse_window(policy("Europe/Berlin", ("0 1 * * *", "3h")))
    assert is_open(night, utc("2026-10-24 23:00:00"))   # 01:00 CEST
    assert is_open(night, utc("2026-10-25 01:59:00"))   # 02:59 CET: still in the 3 elapsed hours
    assert not is_open(night, utc("2026-10-25 02:00:00"))


def test_day_of_month_and_day_of_week_match_either_one_as_in_cron() -> None:
    window = parse_window(policy("UTC", ("0 2 1 * 1", "1h")))  # the 1st, or any Monday
    assert is_open(window, utc("2026-11-30 02:10:00"))  # a Monday, not the 1st
    assert is_open(window, utc("2026-12-01 02:10:00"))  # the 1st, a Tuesday
    assert not is_open(window, utc("2026-12-02 02:10:00"))


def deployment(annotations: dict[str, str] | None = None, kind: str = "Deployment",
               spec: dict[str, Any] | None = None) -> dict[str, Any]:
    template = {"metadata": {"annotations": {}}, "spec": {"containers": [
        {"name": "c", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}}
    body_spec: dict[str, Any] = {"template": template}
    if kind == "CronJob":
        body_spec = {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": template}}}
    return {"apiVersion": API_VERSIONS[kind], "kind": kind,
            "metadata": {"name": "web", "namespace": "ns", "uid": "web-uid", "resourceVersion": "5",
                         "annotations": {settings.AUTO: "true", **(annotations or {})}},
            "spec": {**body_spec, **(spec or {})}}


def view_of(body: dict[str, Any], options: settings.Options = OPTIONS) -> views.WorkloadView:
    found = views.workload_view(body["kind"], body, options)
    assert found is not None
    return found


def test_only_a_rollout_is_held_and_only_outside_the_window() -> None:
    closed, opened = utc("2026-11-27 06:00:00"), utc("2026-11-27 02:10:00")
    windowed = view_of(deployment({settings.RELOADER_RESTART_WINDOW: NIGHTLY}))
    held = hold(windowed, CHANGED, OPTIONS, closed)
    assert held is not None and held.reason == "restart_window"
    assert held.look_in == utc("2026-11-28 02:00:00") - closed
    assert held.pending == "waiting for the restart window (opens 2026-11-28T02:00:00Z); changed: configmap/conf"
    assert hold(windowed, CHANGED, OPTIONS, opened) is None
    assert hold(windowed, plans.Plan(Action.BASELINE, new_hash="h"), OPTIONS, closed) is None
    assert hold(view_of(deployment()), CHANGED, OPTIONS, closed) is None
    # Ours has the same meaning, and wins over Reloader's.
    ours = view_of(deployment({settings.RESTART_WINDOW: policy("UTC", ("0 6 * * *", "1h")),
                               settings.RELOADER_RESTART_WINDOW: NIGHTLY}))
    assert hold(ours, CHANGED, OPTIONS, closed) is None


def test_a_malformed_window_or_cronjob_mode_holds_every_rollout() -> None:
    broken = view_of(deployment({settings.RESTART_WINDOW: policy("UTC", ("0 2 * *", "1h"))}))
    held = hold(broken, CHANGED, OPTIONS, utc("2026-11-27 02:10:00"))
    assert held is not None and held.reason == "invalid" and held.look_in is None
    assert "five-field cron" in held.message and held.pending.startswith("blocked: invalid restart window")
    mode = view_of(deployment({settings.CRONJOB_MODE: "later"}, kind="CronJob"))
    held = hold(mode, CHANGED, OPTIONS, 0.0)
    assert held is not None and held.reason == "invalid" and "'later' is not one of run-now" in held.message


def test_the_cronjob_mode_is_the_annotation_else_the_operators_default() -> None:
    options = settings.Options.from_env({"REROLLER_CRONJOB_MODE": "next-run"})
    assert cronjob_mode(view_of(deployment(kind="CronJob"), options), options) == "next-run"
    assert cronjob_mode(view_of(deployment(kind="CronJob")), OPTIONS) == "run-now"
    allowed = settings.Options.from_env({"REROLLER_CRONJOB_MODE": "next-run", "REROLLER_ALLOW_RESTART_ACTIVE": "true"})
    annotated = view_of(deployment({settings.CRONJOB_MODE: "Restart-Active"}, kind="CronJob"))
    assert cronjob_mode(annotated, allowed) == "restart-active"
    with pytest.raises(ValueError, match="REROLLER_CRONJOB_MODE"):
        settings.Options.from_env({"REROLLER_CRONJOB_MODE": "sometimes"})


def test_restart_active_deletes_pods_so_it_is_off_unless_the_installation_allows_it() -> None:
    with pytest.raises(ValueError, match="REROLLER_ALLOW_RESTART_ACTIVE=true"):
        settings.Options.from_env({"REROLLER_CRONJOB_MODE": "restart-active"})
    default = settings.Options.from_env({"REROLLER_CRONJOB_MODE": "restart-active",
                                         "REROLLER_ALLOW_RESTART_ACTIVE": "1"})
    assert cronjob_mode(view_of(deployment(kind="CronJob")), default) == "restart-active"
    # A CronJob that asks for it where it is off: its rollout is held, with the reason and the switch.
    asked = view_of(deployment({settings.CRONJOB_MODE: "restart-active"}, kind="CronJob"))
    held = hold(asked, CHANGED, OPTIONS, 0.0)
    assert held is not None and held.reason == "invalid"
    assert "restart-active is off" in held.message and "allowRestartActive" in held.message
    assert hold(asked, CHANGED, default, 0.0) is None


def test_active_jobs_are_the_unfinished_ones_the_cronjob_controls() -> None:
    def job(uid: str, conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
        return {"metadata": {"name": "j", "ownerReferences": [{"uid": uid, "controller": True}]},
                "status": {"conditions": conditions or []}}
    assert active_job(job("web-uid"), "web-uid")
    assert not active_job(job("other"), "web-uid")
    assert not active_job(job("web-uid", [{"type": "Complete", "status": "True"}]), "web-uid")


# --- the controller --------------------------------------------------------------------------------


def configmap(value: str) -> views.SourceView:
    return views.source_view("ConfigMap", {"metadata": {"name": "conf", "namespace": "ns", "resourceVersion": "3"},
                                           "data": {"k": value}})


def baseline(body: dict[str, Any], value: str) -> dict[str, str]:
    view = view_of(body)
    lookup = {("ConfigMap", "conf"): configmap(value)}
    snap = plans.snapshot(views.effective_sources(view, lookup, OPTIONS), lookup)
    return baseline_annotations(plans.plan({}, snap), snap)


def controller(access: FakeAccess, body: dict[str, Any], value: str,
               options: settings.Options = OPTIONS) -> RerollerController:
    view = view_of(body, options)
    indexes: dict[str, Any] = {index_id: {} for index_id in reroller.INDEXES}
    indexes[reroller.SOURCE_INDEXES["ConfigMap"]] = {("ConfigMap", "ns", "conf"): [configmap(value)]}
    indexes[reroller.WORKLOAD_INDEXES[body["kind"]]] = {
        key: [entry] for key, entry in views.workload_index_entries(view).items()}
    return RerollerController(access, options, indexes)  # type: ignore[arg-type]


def windowed(window: str, value: str = "v1", pending: str | None = None, kind: str = "Deployment",
             extra: dict[str, str] | None = None) -> dict[str, Any]:
    annotations = {settings.RELOADER_RESTART_WINDOW: window, **(extra or {})}
    body = deployment(annotations, kind=kind)
    body["metadata"]["annotations"].update(baseline(body, value))
    if pending is not None:
        body["metadata"]["annotations"][REROLLER_PENDING] = pending
    return body


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)


@pytest.fixture
def at(monkeypatch: pytest.MonkeyPatch) -> Any:
    def set_clock(text: str) -> None:
        monkeypatch.setattr(reroller.time, "time", lambda: utc(text))
    return set_clock


def patches(access: FakeAccess) -> list[Any]:
    return [call[4] for call in access.made("patch")]


def pass_once(access: FakeAccess, body: dict[str, Any], value: str, options: settings.Options = OPTIONS) -> None:
    async def go() -> None:
        control = controller(access, body, value, options)
        await control.guarded((body["kind"], "ns", "web"), "resync")
        await control.stop()
    asyncio.run(go())


def test_a_change_outside_the_window_is_pending_on_the_workload_said_once(at: Any) -> None:
    at("2026-11-27 06:00:00")
    access = FakeAccess()
    pass_once(access, windowed(NIGHTLY), "v2")
    [patch] = patches(access)
    assert set(patch["metadata"]["annotations"]) == {REROLLER_PENDING}  # no rollout, no new baseline
    pending = patch["metadata"]["annotations"][REROLLER_PENDING]
    assert "opens 2026-11-28T02:00:00Z" in pending
    assert access.events == [("Normal", "RerollDeferred")]
    # The same pending state (a restarted operator, a second change of the same source): nothing written.
    again = FakeAccess()
    pass_once(again, windowed(NIGHTLY, pending=pending), "v3")
    assert again.calls == [] and again.events == []


def test_the_window_opening_rolls_once_and_clears_the_pending_state(at: Any) -> None:
    at("2026-11-28 02:00:01")
    access = FakeAccess()
    pass_once(access, windowed(NIGHTLY, pending="waiting ..."), "v2")
    [patch] = patches(access)
    assert patch["metadata"]["annotations"][REROLLER_PENDING] is None
    assert settings.CONFIG_HASH in patch["spec"]["template"]["metadata"]["annotations"]
    assert access.events == [("Normal", "Rerolled")]


def test_a_change_reverted_before_the_window_opens_rolls_nothing(at: Any) -> None:
    at("2026-11-27 06:00:00")
    access = FakeAccess()
    pass_once(access, windowed(NIGHTLY, pending="waiting ..."), "v1")  # back to the baseline's data
    assert patches(access) == [{"metadata": {"annotations": {REROLLER_PENDING: None}, "resourceVersion": "5"}}]
    assert access.events == [("Normal", "RerollDropped")]


def test_a_malformed_window_blocks_with_a_warning(at: Any) -> None:
    at("2026-11-27 02:10:00")
    access = FakeAccess()
    pass_once(access, windowed('{"timezone": "UTC"}'), "v2")
    [patch] = patches(access)
    assert patch["metadata"]["annotations"][REROLLER_PENDING].startswith("blocked: invalid restart window")
    assert access.events == [("Warning", "RerollBlocked")]


def test_each_cronjob_mode_rolls_its_way() -> None:
    body = windowed(policy("UTC", ("* * * * *", "24h")), kind="CronJob")  # always open
    run_now = FakeAccess()
    pass_once(run_now, body, "v2")
    assert [c[1] for c in run_now.made("create")] == ["Job"]
    next_run = FakeAccess()
    pass_once(next_run, body, "v2", settings.Options(cronjob_mode="next-run"))
    [patch] = patches(next_run)
    assert settings.CONFIG_HASH in patch["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]
    assert next_run.made("create") == []
    restart = FakeAccess()
    active = {"metadata": {"name": "web-1", "uid": "job-uid", "ownerReferences": [
        {"uid": "web-uid", "controller": True}]}, "status": {}}
    pod = {"metadata": {"name": "web-1-abc", "uid": "pod-uid"}}
    restart.answer("list", [active], [pod])
    pass_once(restart, windowed(policy("UTC", ("* * * * *", "24h")), kind="CronJob",
                                extra={settings.CRONJOB_MODE: "restart-active"}), "v2",
              settings.Options(allow_restart_active=True))
    assert restart.made("delete") == [("delete", "Pod", "ns", "web-1-abc")]
    assert restart.made("create") == []


def test_every_kind_of_rollout_clears_the_pending_state() -> None:
    snap = plans.Snapshot(per_source={"configmap/conf": "abcd1234"}, missing=[])
    env_options = settings.Options(reload_strategy="env-vars")
    env_view = view_of(windowed(NIGHTLY, pending="waiting ..."), env_options)
    ops = env_vars_patch(env_view, CHANGED, snap, 0.0, env_view.rv)
    assert {"op": "remove", "path": "/metadata/annotations/reroller.kopf-operators.dev~1pending"} in ops
    job = view_of(windowed(NIGHTLY, pending="waiting ...", kind="Job"))
    recreated = recreated_job(job, baseline_annotations(CHANGED, snap))
    assert REROLLER_PENDING not in recreated["metadata"]["annotations"]
    assert settings.RELOADER_RESTART_WINDOW in recreated["metadata"]["annotations"]
    cron = view_of(windowed(NIGHTLY, pending="waiting ...", kind="CronJob"))
    patch = cronjob_template_patch(cron, CHANGED, snap, 0.0, cron.rv)
    assert patch["metadata"]["annotations"][REROLLER_PENDING] is None
    # Without a pending annotation nothing is removed (a JSON patch's remove of a missing key fails).
    plain = view_of(windowed(NIGHTLY), env_options)
    assert not [op for op in env_vars_patch(plain, CHANGED, snap, 0.0) if op["op"] == "remove"]


@pytest.mark.parametrize("mode", settings.CRONJOB_MODES)
def test_a_suspended_cronjob_gets_nothing_in_any_mode(mode: str) -> None:
    body = windowed(policy("UTC", ("* * * * *", "24h")), kind="CronJob", extra={settings.CRONJOB_MODE: mode})
    body["spec"]["suspend"] = True
    access = FakeAccess()
    access.answer("list", [{"metadata": {"name": "web-1", "uid": "job-uid", "ownerReferences": [
        {"uid": "web-uid", "controller": True}]}, "status": {}}], [{"metadata": {"name": "p", "uid": "u"}}])
    pass_once(access, body, "v2")
    [patch] = patches(access)
    assert "spec" not in patch  # the baseline only
    assert access.made("create") == access.made("delete") == access.made("list") == []
    assert access.events == [("Normal", "RerollSkipped")]
