"""The immortal controller with a fake access layer and plain dict indexes: what it writes for a given
index state, how it retries, and its stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from kopf_operators.core import access as k8s
from kopf_operators.core import background as toolkit
from kopf_operators.core.api import ApiError
from kopf_operators.immortal import controller as immortal
from kopf_operators.immortal import decisions
from kopf_operators.immortal.controller import ImmortalController
from tests.unit.fake_access import FakeAccess, conflict_on_create, in_flight, server_error

T = TypeVar("T")
KEY = ("ns1", "app")
IC: dict[str, Any] = {
    "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
    "metadata": {"name": "app", "namespace": "ns1", "uid": "ic-uid", "generation": 1, "resourceVersion": "5"},
    "spec": {"image": "nginx:1"},
}


def pod(image: str = "nginx:1", owner: str = "ic-uid", uid: str = "pod-1", phase: str = "Running",
        version: str = "7", ready: bool = False) -> dict[str, Any]:
    summary = decisions.pod_summary({
        "metadata": {"name": decisions.pod_name("app"), "namespace": "ns1", "uid": uid, "resourceVersion": version,
                     "ownerReferences": [{"controller": True, "uid": owner}]},
        "spec": {"containers": [{"name": "acontainer", "image": image}]},
        "status": {"phase": phase}})
    return {**summary, "status": {**summary["status"], "ready": True}} if ready else summary


def controller(access: FakeAccess, pods: list[dict[str, Any]] | None = None) -> ImmortalController:
    objects = {KEY: [decisions.snapshot(IC)]}
    return ImmortalController(access, objects, {KEY: pods or []})  # type: ignore[arg-type]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)


def test_no_pod_in_the_index_creates_one_and_one_status_write_reports_it_running() -> None:
    """The create and the pod's Running event cost one status write between them (not two)."""
    access = FakeAccess()
    created_uid = f"uid-{decisions.pod_name('app')}"  # the fake create's answer

    async def scenario() -> None:
        ctl = controller(access)
        await ctl.converge(KEY)
        assert access.made("create") == [("create", "Pod", "ns1", decisions.pod_name("app"), False)]
        assert ("Normal", "PodCreated") in access.events
        assert access.made("patch_status") == []  # not yet: its Running event follows
        await ctl.converge(KEY, pod_event=("MODIFIED", pod(uid=created_uid, version="150", ready=True)))
        await ctl.stop()

    run(scenario())
    [status_patch] = access.made("patch_status")
    assert status_patch[4]["currentPodUID"] == created_uid and status_patch[4]["startTimes"] == 1
    assert decisions.ready_reason(status_patch[4]) == "PodReady"


def test_a_pod_we_created_that_is_deleted_before_it_ran_is_still_counted() -> None:
    """Created, deleted before the write that would count it (KWOK and users do this), replaced: the one
    status write that reports the replacement running counts both starts."""
    access = FakeAccess()

    def created_as(uid: str, version: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda default: {**default, "metadata": {**default["metadata"], "uid": uid, "resourceVersion": version}}

    access.answer("create", created_as("first", "100"), created_as("second", "120"))

    async def scenario() -> None:
        ctl = controller(access)
        await ctl.converge(KEY)
        await ctl.converge(KEY, pod_event=("DELETED", pod(uid="first", phase="Pending", version="110")))
        assert len(access.made("create")) == 2 and access.made("patch_status") == []
        await ctl.converge(KEY, pod_event=("MODIFIED", pod(uid="second", version="130", ready=True)))
        await ctl.stop()

    run(scenario())
    [status_patch] = access.made("patch_status")
    assert status_patch[4]["startTimes"] == 2 and status_patch[4]["currentPodUID"] == "second"


def test_a_pod_that_does_not_start_soon_is_reported_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A created pod that is not Running within TRANSIENT_SECONDS is counted and reported as starting."""
    monkeypatch.setattr(decisions, "TRANSIENT_SECONDS", 0.05)
    access = FakeAccess()

    async def scenario() -> None:
        ctl = controller(access)
        await ctl.converge(KEY)
        for _ in range(100):
            if access.made("patch_status"):
                break
            await asyncio.sleep(0.01)
        await ctl.stop()

    run(scenario())
    [status_patch] = access.made("patch_status")
    assert status_patch[4]["currentPodUID"] == f"uid-{decisions.pod_name('app')}"  # the create's answer
    assert status_patch[4]["startTimes"] == 1
    assert decisions.ready_reason(status_patch[4]) == "PodStarting"


def test_our_running_pod_in_the_index_costs_no_request() -> None:
    access = FakeAccess()
    # The status patch answers with the whole object at a newer version (newer than the index).
    access.answer("patch_status", lambda default: {**IC, "metadata": {**IC["metadata"], "resourceVersion": "6"},
                                                   "status": default["status"]})
    ctl = controller(access, [pod()])
    run(ctl.converge(KEY))  # the first pass writes the status it observed
    written = list(access.calls)
    run(ctl.converge(KEY))  # nothing changed since: no request at all
    assert access.calls == written
    assert not access.made("create") and not access.made("delete")


def test_a_pod_running_the_wrong_image_is_replaced_after_a_dry_run() -> None:
    access = FakeAccess()
    run(controller(access, [pod(image="nginx:0")]).converge(KEY))
    assert [c[0] for c in access.calls if c[0] in ("create", "delete")] == ["create", "delete"]
    assert access.made("create")[0][4] is True  # the replacement was only validated


def test_a_spec_change_replaces_a_pod_that_matched_the_spec_before() -> None:
    """The template's hash is kept per spec generation: a new generation is hashed anew."""
    access = FakeAccess()
    running = pod(image="nginx:1")
    running["metadata"]["annotations"] = {decisions.TEMPLATE_HASH_ANNOTATION: decisions.template_hash(IC["spec"])}
    ctl = controller(access, [running])
    run(ctl.converge(KEY))
    assert not access.made("delete")
    template = {"metadata": {"labels": {"tier": "web"}}, "spec": {"containers": [{"name": "acontainer"}]}}
    changed = {**IC, "metadata": {**IC["metadata"], "generation": 2, "resourceVersion": "9"},
               "spec": {"image": "nginx:1", "template": template}}  # the same image, a new label
    run(ctl.converge(KEY, body=decisions.snapshot(changed)))
    assert access.made("delete")


FOREIGN: dict[str, Any] = {"metadata": {"name": decisions.pod_name("app"), "uid": "someone-else",
                                        "resourceVersion": "3"},
                           "spec": {"containers": [{"name": "c", "image": "busybox"}]}, "status": {"phase": "Running"}}


def at_version(version: str) -> dict[str, Any]:
    return {**FOREIGN, "metadata": {**FOREIGN["metadata"], "resourceVersion": version}}


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


def test_a_foreign_pod_in_the_way_is_followed_by_a_watch_of_its_name_and_its_deletion_starts_ours() -> None:
    """The pods watch sees only pods with our label: the foreign pod's DELETED comes from a watch of its
    name alone, from the version read after the 409 (nothing is missed in between), and starts our pod
    at once; no timer polls meanwhile."""
    async def scenario() -> FakeAccess:
        access = FakeAccess()
        access.answer("create", conflict_on_create())
        access.answer("read", FOREIGN)
        ctl = controller(access)
        await ctl.guarded(KEY, "object")
        await until(lambda: bool(access.made("watch")))
        assert access.made("watch") == [("watch", "Pod", "ns1", f"metadata.name={decisions.pod_name('app')}", "3")]
        assert not ctl.passes.timers.pending(KEY)
        assert access.watch_events is not None
        # The server ends the watch after its timeout: resumed from the newest version (a bookmark's).
        await access.watch_events.put(("BOOKMARK", {"metadata": {"resourceVersion": "40"}}))
        await access.watch_events.put(("MODIFIED", at_version("41")))
        await until(lambda: access.watch_events is not None and access.watch_events.empty())
        await access.watch_events.put(("DELETED", at_version("50")))
        await until(lambda: len(access.made("create")) == 2)
        assert not ctl._followers and not ctl.passes.timers.pending(KEY)
        await ctl.stop()
        return access

    access = run(scenario())
    assert [c[1:4] for c in access.made("create")] == [("Pod", "ns1", decisions.pod_name("app"))] * 2
    assert ("Normal", "PodCreated") in access.events
    assert not access.made("delete")  # never touches a pod it does not own


def test_a_watch_that_ends_is_resumed_from_the_newest_version() -> None:
    async def scenario() -> list[tuple[Any, ...]]:
        access = FakeAccess()
        access.answer("create", conflict_on_create())
        access.answer("read", FOREIGN)
        ctl = controller(access)
        await ctl.guarded(KEY, "object")
        await until(lambda: access.watch_events is not None)
        assert access.watch_events is not None
        await access.watch_events.put(("BOOKMARK", {"metadata": {"resourceVersion": "40"}}))
        await asyncio.sleep(1.05)  # a watch that lasted (the server's timeout), then ends
        await access.watch_events.put(None)
        await until(lambda: len(access.made("watch")) == 2)
        assert ctl._followers and not ctl.passes.timers.pending(KEY)
        await ctl.stop()
        return access.made("watch")

    watches = run(scenario())
    assert [w[4] for w in watches] == ["3", "40"]


def test_a_failed_watch_falls_back_to_the_doubling_retry() -> None:
    async def scenario() -> list[float | None]:
        access = FakeAccess()
        access.answer("create", conflict_on_create(), conflict_on_create())
        access.answer("read", FOREIGN, FOREIGN)
        ctl = controller(access)
        delays: list[float | None] = []
        for _ in range(2):
            await ctl.guarded(KEY, "object")
            await until(lambda: access.watch_events is not None)
            assert access.watch_events is not None
            await access.watch_events.put(ApiError(410, "Gone"))  # e.g. the version is too old
            await until(lambda: ctl.passes.timers.pending(KEY))
            delays.append(ctl.passes.timers.due_in(KEY))
            ctl.passes.timers.cancel(KEY)  # as if it had fired
        await ctl.stop()
        return delays

    delays = run(scenario())
    first, _cap = immortal.RETRY_SECONDS
    assert delays[0] == pytest.approx(first, abs=0.05)
    assert delays[1] == pytest.approx(2 * first, abs=0.05)


def test_more_foreign_pods_than_watch_connections_fall_back_to_the_retry() -> None:
    async def scenario() -> tuple[int, int]:
        access = FakeAccess()
        keys = [("ns1", f"app{i}") for i in range(k8s.WATCH_CONNECTIONS + 2)]
        objects = {key: [decisions.snapshot({**IC, "metadata": {**IC["metadata"], "name": key[1],
                                                                 "uid": f"u{key[1]}"}})]
                   for key in keys}
        ctl = ImmortalController(access, objects, {})  # type: ignore[arg-type]
        for key in keys:
            access.answer("create", conflict_on_create())
            access.answer("read", {**FOREIGN, "metadata": {**FOREIGN["metadata"], "name": decisions.pod_name(key[1])}})
            await ctl.guarded(key, "object")
        followed, retried = len(ctl._followers), sum(ctl.passes.timers.pending(key) for key in keys)
        await ctl.stop()
        return followed, retried

    assert run(scenario()) == (k8s.WATCH_CONNECTIONS, 2)


def test_a_failed_pass_is_retried_and_a_success_resets_the_backoff() -> None:
    async def scenario() -> tuple[int, int, int]:
        access = FakeAccess()
        access.answer("create", server_error())
        ctl = controller(access)
        await ctl.guarded(KEY, "object")  # fails: a retry is scheduled
        failures_after_error = ctl.passes.failures(KEY)
        pending = int(ctl.passes.timers.pending(KEY))
        ctl.passes.timers.cancel(KEY)
        await ctl.guarded(KEY, "retry")  # succeeds
        failures_after_success = ctl.passes.failures(KEY)
        await ctl.stop()
        return failures_after_error, pending, failures_after_success

    assert run(scenario()) == (1, 1, 0)


def test_a_standby_writes_nothing() -> None:
    access = FakeAccess()
    access.paused = True
    run(controller(access).guarded(KEY, "object"))
    assert access.calls == []


def test_deletion_forgets_the_object_and_cancels_its_timers() -> None:
    async def scenario() -> bool:
        access = FakeAccess()
        ctl = controller(access)
        ctl.passes.retry_later(KEY)
        ctl._wake_later(KEY, 30)
        await ctl.deleted(KEY)
        pending = ctl.passes.timers.pending(KEY) or ctl._wakes.pending(KEY)
        await ctl.stop()
        return pending

    assert run(scenario()) is False


def test_stop_cancels_pending_retries_and_waits_for_passes_in_flight() -> None:
    async def scenario() -> tuple[bool, bool]:
        access = FakeAccess()
        ctl = controller(access)
        ctl.passes.retry_later(KEY)
        finished = in_flight(ctl.background)
        await asyncio.sleep(0)
        await ctl.stop()
        return ctl.passes.timers.pending(KEY), finished.is_set()

    assert run(scenario()) == (False, True)
