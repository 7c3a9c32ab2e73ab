"""The re-roller controller with a fake access layer and plain dict indexes: what it writes for a given
index state, which failures it retries (with backoff) and which it does not, and its stop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from kopf_operators.core import background as toolkit
from kopf_operators.core import metrics
from kopf_operators.core.api import ApiError, Conflict
from kopf_operators.core.controller import Result
from kopf_operators.core.conventions import DATA_STAMP, data_hash
from kopf_operators.reroller import controller as reroller
from kopf_operators.reroller import decisions, plans, settings, views
from kopf_operators.reroller.controller import RerollerController
from kopf_operators.reroller.patches import baseline_annotations
from tests.unit.fake_access import FakeAccess, in_flight, server_error

T = TypeVar("T")
KEY = ("Deployment", "ns", "web")
OPTIONS = settings.Options()


def configmap(value: str, rv: str = "3") -> views.SourceView:
    return views.source_view("ConfigMap", {"metadata": {"name": "conf", "namespace": "ns", "uid": "conf-uid",
                                                        "resourceVersion": rv}, "data": {"k": value}})


def deployment(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "uid": "web-uid", "resourceVersion": "5",
                         "annotations": {settings.AUTO: "true", **(annotations or {})}},
            "spec": {"template": {"metadata": {"annotations": {}}, "spec": {"containers": [
                {"name": "c", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}}}}


def baseline_for(source: views.SourceView) -> dict[str, str]:
    """The annotations a workload carries once the re-roller has recorded ``source`` as its baseline."""
    view = views.workload_view("Deployment", deployment(), OPTIONS)
    assert view is not None
    lookup = {("ConfigMap", "conf"): source}
    snap = plans.snapshot(views.effective_sources(view, lookup, OPTIONS), lookup, view.key_scopes)
    return baseline_annotations(plans.plan({}, snap), snap)


def controller(access: FakeAccess, workload: dict[str, Any], source: views.SourceView | None,
               indexes: dict[str, Any] | None = None) -> RerollerController:
    """``source`` None: the ConfigMap is not (or not yet) in the index. ``indexes``: Kopf's, empty, to
    be filled later by the test (as Kopf fills them after the startup handler has run)."""
    view = views.workload_view("Deployment", workload, OPTIONS)
    workloads: dict[Any, list[Any]] = {key: [value] for key, value in views.workload_index_entries(view).items()}
    if indexes is None:
        indexes = {}
    indexes.update({index_id: {} for index_id in reroller.INDEXES})
    indexes[reroller.SOURCE_INDEXES["ConfigMap"]] = {("ConfigMap", "ns", "conf"): [source]} if source else {}
    indexes[reroller.WORKLOAD_INDEXES["Deployment"]] = workloads
    return RerollerController(access, OPTIONS, indexes)  # type: ignore[arg-type]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)


def patches(access: FakeAccess) -> list[dict[str, Any]]:
    return [call[4] for call in access.made("patch")]


def test_the_first_sighting_records_the_baseline_and_rolls_nothing() -> None:
    access = FakeAccess()
    run(controller(access, deployment(), configmap("v1")).guarded(KEY, "workload event"))
    [patch] = patches(access)
    assert settings.OBSERVED_HASH in patch["metadata"]["annotations"]
    assert "spec" not in patch  # the pod template is untouched: no rollout


def test_a_workload_whose_baseline_matches_its_sources_costs_no_request() -> None:
    access = FakeAccess()
    run(controller(access, deployment(baseline_for(configmap("v1"))), configmap("v1")).guarded(KEY, "resync"))
    assert access.calls == []


def test_a_changed_source_rolls_the_workload_once() -> None:
    access = FakeAccess()
    run(controller(access, deployment(baseline_for(configmap("v1"))), configmap("v2")).guarded(KEY, "source event"))
    [patch] = patches(access)
    assert patch["spec"]["template"]["metadata"]["annotations"]  # the pod template changes: a rollout
    assert access.events == [("Normal", "Rerolled")]  # the rollout is announced once


def test_a_transient_failure_is_retried_with_doubling_backoff() -> None:
    async def scenario() -> list[float | None]:
        access = FakeAccess()
        access.answer("patch", server_error(), server_error())
        ctl = controller(access, deployment(), configmap("v1"))
        delays: list[float | None] = []
        for _ in range(2):
            await ctl.guarded(KEY, "workload event")
            delays.append(ctl.passes.timers.due_in(KEY))
            ctl.passes.timers.cancel(KEY)  # as if it had fired
        await ctl.stop()
        return delays

    first, _cap = reroller.RETRY_SECONDS
    assert run(scenario()) == [pytest.approx(first, abs=0.05), pytest.approx(2 * first, abs=0.05)]


def test_a_refused_write_is_not_retried_until_something_changes() -> None:
    async def scenario() -> bool:
        access = FakeAccess()
        access.answer("patch", ApiError(422, "Unprocessable Entity", "metadata.annotations: Too long"))
        ctl = controller(access, deployment(), configmap("v1"))
        await ctl.guarded(KEY, "workload event")
        pending = ctl.passes.timers.pending(KEY)
        await ctl.stop()
        return pending

    assert run(scenario()) is False


def test_a_standby_writes_nothing() -> None:
    access = FakeAccess()
    access.paused = True
    run(controller(access, deployment(), configmap("v1")).guarded(KEY, "workload event"))
    assert access.calls == []


def test_stop_cancels_pending_looks_and_waits_for_passes_in_flight() -> None:
    async def scenario() -> tuple[bool, bool]:
        ctl = controller(FakeAccess(), deployment(), configmap("v1"))
        ctl.passes.retry_later(KEY)
        finished = in_flight(ctl.background)
        await asyncio.sleep(0)
        await ctl.stop()
        return ctl.passes.timers.pending(KEY), finished.is_set()

    assert run(scenario()) == (False, True)


def test_a_source_missing_at_the_first_sighting_is_recorded_absent_only_once_it_has_settled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At first the source may only be late in its own watch stream: nothing is written (no baseline, no
    SourceMissing Event) until ABSENT_SETTLE_SECONDS later, when the timer's pass records "absent"."""
    clock = [1000.0]
    monkeypatch.setattr(reroller.time, "monotonic", lambda: clock[0])

    async def scenario() -> tuple[list[Any], float | None, list[dict[str, Any]], list[tuple[str, str]]]:
        access = FakeAccess()
        ctl = controller(access, deployment(), None)
        await ctl.guarded(KEY, "workload event")
        await ctl.guarded(KEY, "workload event")  # say, the Deployment's own status update
        early, due = list(access.calls), ctl.passes.timers.due_in(KEY)
        clock[0] += decisions.ABSENT_SETTLE_SECONDS
        await ctl.guarded(KEY, "timer")
        await ctl.stop()
        return early, due, patches(access), access.events

    early, due, [patch], events = run(scenario())
    assert early == [] and due == pytest.approx(decisions.ABSENT_SETTLE_SECONDS, abs=0.05)
    assert settings.ABSENT in patch["metadata"]["annotations"][settings.OBSERVED_SOURCES] and "spec" not in patch
    assert events == [("Warning", "SourceMissing")]


def test_a_source_late_in_its_watch_stream_becomes_the_baseline_without_a_rollout() -> None:
    async def scenario() -> list[dict[str, Any]]:
        access = FakeAccess()
        ctl = controller(access, deployment(), None)
        await ctl.guarded(KEY, "workload event")
        ctl.sources["ConfigMap"] = {("ConfigMap", "ns", "conf"): [configmap("v1")]}  # its ADDED event
        await ctl.guarded(KEY, "configmap event")
        await ctl.stop()
        return patches(access)

    [patch] = run(scenario())
    baseline = baseline_for(configmap("v1"))
    assert patch["metadata"]["annotations"][settings.OBSERVED_HASH] == baseline[settings.OBSERVED_HASH]
    assert "spec" not in patch


def test_after_a_process_that_stopped_before_settling_a_source_changed_since_the_workload_rolls_it() -> None:
    """The CI failure of 24 Nov: a stopping process (its ConfigMap stream already closed) saw the new
    Deployment but not its ConfigMap; it used to record "absent", so the next process took the edited
    ConfigMap for a creation and rolled nothing. Now nothing is recorded, and the next process sees a
    source newer than the workload (resourceVersion 7 > 5) at the first sighting: a rollout."""
    async def scenario() -> list[dict[str, Any]]:
        stopping = FakeAccess()
        ctl = controller(stopping, deployment(), None)
        await ctl.guarded(KEY, "workload event")
        await ctl.stop()
        assert stopping.calls == []
        access = FakeAccess()
        ctl = controller(access, deployment(), configmap("v2", rv="7"))
        await ctl.guarded(KEY, "workload event")
        await ctl.stop()
        return patches(access)

    [patch] = run(scenario())
    assert patch["spec"]["template"]["metadata"]["annotations"]  # the pod template changes: a rollout


def test_an_event_that_must_wait_for_a_write_slot_gives_its_event_slot_back_and_rolls_in_its_namespaces_turn(
        ) -> None:
    """Every write slot is held (by a flooding namespace, and the one slot it may not take by a pass of
    another), and more of the flood's passes wait: a workload event in a third namespace returns at once
    (Kopf's event slot is free again), and its rollout is the first or second pass to get a slot after,
    ahead of the flood's waiting passes. Events for a key whose pass waits add none."""
    async def scenario() -> tuple[list[str], list[dict[str, Any]]]:
        access = FakeAccess()
        workload = deployment(baseline_for(configmap("v1")))
        ctl = controller(access, workload, configmap("v2"))
        order: list[str] = []
        release = asyncio.Event()
        reconcile = ctl.passes.run

        async def pass_of(key: Any, *args: Any) -> Result:
            order.append(key[1])
            return await reconcile(key, *args)

        ctl.passes.run = pass_of

        async def flood_pass() -> None:
            async with ctl._limit.hold("flood"):
                order.append("flood")
                await release.wait()

        async def other_pass() -> None:
            async with ctl._limit.hold("other"):
                order.append("other")
                await release.wait()

        flood = [asyncio.create_task(flood_pass()) for _ in range(reroller.CONCURRENCY + 4)]
        flood.append(asyncio.create_task(other_pass()))
        await asyncio.sleep(0)
        for _ in range(3):  # the workload's own status updates, say
            await asyncio.wait_for(ctl.workload_event(KEY, "MODIFIED", workload), 1)
        handed = set(ctl.background.tasks)
        assert len(handed) == 1 and patches(access) == []
        release.set()
        await asyncio.gather(*flood, *handed)
        await ctl.stop()
        return order, patches(access)

    order, [patch] = run(scenario())
    assert order.index("ns") <= reroller.CONCURRENCY + 1 < len(order) - 1
    assert patch["spec"]["template"]["metadata"]["annotations"]  # the rollout


def edited_copy(value: str, stamped_value: str) -> views.SourceView:
    """A Copyrator copy holding ``value`` with the data stamp of ``stamped_value``."""
    stamp = data_hash("ConfigMap", {"data": {"k": stamped_value}})
    return views.source_view("ConfigMap", {"metadata": {"name": "conf", "namespace": "ns", "resourceVersion": "4",
                                                        "annotations": {DATA_STAMP: stamp}}, "data": {"k": value}})


def test_a_hand_edited_copy_writes_nothing_and_looks_again_when_the_grace_ends() -> None:
    async def scenario() -> tuple[list[Any], float | None]:
        access = FakeAccess()
        ctl = controller(access, deployment(baseline_for(configmap("v1"))), edited_copy("by hand", "v1"))
        await ctl.source_event("ConfigMap", "ns", "conf")
        due = ctl.passes.timers.due_in(KEY)
        await ctl.stop()
        return access.calls, due

    calls, due = run(scenario())
    assert calls == [] and due == pytest.approx(decisions.DRIFT_GRACE_SECONDS, abs=0.5)


def test_without_sync_after_restart_the_first_look_records_the_change_even_after_a_conflict() -> None:
    workload = deployment(baseline_for(configmap("v1")))
    access = FakeAccess()
    access.answer("patch", Conflict(409, "Conflict", "changed"))
    access.answer("read", workload)
    ctl = controller(access, workload, configmap("v2"))
    ctl.options = settings.Options(sync_after_restart=False)
    run(ctl.guarded(KEY, "workload event"))
    assert [call[0] for call in access.calls] == ["patch", "read", "patch"]
    assert all("spec" not in patch for patch in patches(access))  # baselines only: no rollout
    # A later look is no first look: against the baseline the fake still answers with (v1), the change rolls.
    run(ctl.guarded(KEY, "source event"))
    assert "spec" in patches(access)[-1]


def test_a_deleted_namespace_takes_its_reload_series_with_it() -> None:
    """REROLLER_METRICS_BY_NAMESPACE: one series per namespace, gone with the namespace."""
    ctl = controller(FakeAccess(), deployment(), configmap("v"))
    ctl.options = dataclasses.replace(OPTIONS, metrics_by_namespace=True)
    metrics.reload_by_namespace("ns", "Deployment", "success")
    metrics.reload_by_namespace("elsewhere", "Deployment", "success")
    ctl.namespace_deleted("ns")
    namespaces = {s.labels["namespace"] for family in metrics.RELOADS_BY_NAMESPACE.collect() for s in family.samples}
    assert "ns" not in namespaces and "elsewhere" in namespaces
    metrics.forget_namespace("elsewhere")


def test_a_source_gone_with_its_namespace_is_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace being deleted loses its objects in any order: a Deployment whose ConfigMap went first
    gets no SourceMissing warning (nor its Event, refused in a terminating namespace anyway)."""
    clock = [1000.0]
    monkeypatch.setattr(reroller.time, "monotonic", lambda: clock[0])

    async def scenario() -> list[tuple[str, str]]:
        access = FakeAccess()
        indexes: dict[str, Any] = {}
        ctl = controller(access, deployment(), None, indexes)
        indexes[reroller.TERMINATING_INDEX]["ns"] = [True]  # filled after the start, as Kopf does
        await ctl.guarded(KEY, "workload event")
        clock[0] += decisions.ABSENT_SETTLE_SECONDS
        await ctl.guarded(KEY, "timer")
        await ctl.stop()
        return access.events

    assert run(scenario()) == []
