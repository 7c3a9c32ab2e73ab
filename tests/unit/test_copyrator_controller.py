"""The Copyrator controller with a fake access layer and plain dict indexes: the writes it makes from
index state, a foreign object in the way, retries with backoff, and its stop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Coroutine, Hashable
from typing import Any, TypeVar

import pytest

from kopf_operators.copyrator import controller as copyrator
from kopf_operators.copyrator import rules, tally
from kopf_operators.copyrator.controller import CopyratorController
from kopf_operators.copyrator.copies import CopyView, copy_view, desired_copy
from kopf_operators.copyrator.places import Result, copy_index_keys
from kopf_operators.core import background as toolkit
from kopf_operators.core.api import ApiError
from tests.unit.fake_access import FakeAccess, conflict_on_create, server_error

T = TypeVar("T")
RULE_KEY = ("src", "rule")
RULE: dict[str, Any] = {
    "apiVersion": "flant.com/v1", "kind": "CopyratorRule",
    "metadata": {"namespace": "src", "name": "rule", "uid": "rule-uid", "generation": 1, "resourceVersion": "4",
                 "creationTimestamp": "2026-11-01T00:00:00Z"},
    "spec": {"ruleType": "configmap", "selector": {"app": "web"}, "namespace": "src", "targetNamespaces": ["t"]},
}
SOURCE: dict[str, Any] = {
    "kind": "ConfigMap", "metadata": {"namespace": "src", "name": "conf", "uid": "src-uid", "resourceVersion": "2",
                                      "labels": {"app": "web"}},
    "data": {"colour": "blue"}}


def copy_in_index(data: dict[str, str]) -> CopyView:
    copy = desired_copy(rules.parse_rule(RULE), {**SOURCE, "data": data}, "t")
    copy["metadata"].update(uid="copy-uid", resourceVersion="3")
    return copy_view(copy)


def controller(access: FakeAccess, copies: tuple[CopyView, ...] = (),
               options: rules.Options | None = None) -> CopyratorController:
    index: dict[Any, list[CopyView]] = {}
    for view in copies:
        for key, value in copy_index_keys(view).items():
            index.setdefault(key, []).append(value)
    namespaces = {name: [rules.NamespaceInfo(name, {}, True)] for name in ("src", "t")}
    ctl = CopyratorController(access, options or rules.Options(), {RULE_KEY: [tally.rule_snapshot(RULE)]},  # type: ignore[arg-type]
                              namespaces, {"ConfigMap": index, "Secret": {}})
    ctl.sources.put("ConfigMap", rules.source_entry(SOURCE))
    return ctl


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)


def writes(access: FakeAccess) -> list[tuple[Any, ...]]:
    return [call[:4] for call in access.calls if call[0] in ("create", "patch", "delete")]


def test_a_missing_copy_is_created_and_the_rule_status_counts_it() -> None:
    access = FakeAccess()
    run(controller(access).passes(RULE_KEY, "resync"))
    assert writes(access) == [("create", "ConfigMap", "t", "conf")]
    [status] = access.made("patch_status")
    assert status[1:4] == ("CopyratorRule", "src", "rule")


def test_a_copy_in_sync_in_the_index_costs_no_write() -> None:
    access = FakeAccess()
    run(controller(access, (copy_in_index({"colour": "blue"}),)).passes(RULE_KEY, "resync"))
    assert writes(access) == []


def test_a_stale_copy_is_patched_in_place() -> None:
    access = FakeAccess()
    run(controller(access, (copy_in_index({"colour": "red"}),)).passes(RULE_KEY, "resync"))
    assert writes(access) == [("patch", "ConfigMap", "t", "conf")]


def test_a_planned_write_is_decided_again_when_another_pass_wrote_the_place_meanwhile() -> None:
    """The sweep decides its writes in one call; one waits for its place's lock while another pass
    makes that copy in sync: under the lock the place looks different, so it is decided again (no write)."""
    ctl: CopyratorController

    class Racing(FakeAccess):
        @contextlib.asynccontextmanager
        async def serialised(self, key: Hashable) -> AsyncIterator[None]:
            newer = dataclasses.replace(copy_in_index({"colour": "blue"}), resource_version="10")
            ctl.places.written.remember(("ConfigMap", "t", "conf"), newer)
            yield

    racing = Racing()
    ctl = controller(racing, (copy_in_index({"colour": "red"}),))
    run(ctl.passes(RULE_KEY, "resync"))
    assert writes(racing) == []
    # Without the other pass, the planned patch is made as decided.
    access = FakeAccess()
    run(controller(access, (copy_in_index({"colour": "red"}),)).passes(RULE_KEY, "resync"))
    assert writes(access) == [("patch", "ConfigMap", "t", "conf")]


def test_a_foreign_object_in_the_way_is_read_once_and_left_untouched() -> None:
    access = FakeAccess()
    access.answer("create", conflict_on_create())
    access.answer("read", {"kind": "ConfigMap", "metadata": {"namespace": "t", "name": "conf", "uid": "theirs",
                                                              "resourceVersion": "1"}, "data": {"x": "y"}})
    ctl = controller(access)
    run(ctl.passes(RULE_KEY, "resync"))
    assert writes(access) == [("create", "ConfigMap", "t", "conf")]  # no patch, no delete of theirs
    assert access.made("read") == [("read", "ConfigMap", "t", "conf")]
    assert ctl.status.tally(rules.parse_rule(RULE)).conflicts == ["t/conf"]


def test_a_failed_sweep_is_retried_with_doubling_backoff_and_a_success_resets_it() -> None:
    async def scenario() -> tuple[list[float | None], int]:
        access = FakeAccess()
        access.answer("create", server_error(), server_error())
        ctl = controller(access)
        delays: list[float | None] = []
        for _ in range(2):
            await ctl.passes(RULE_KEY, "retry")
            delays.append(ctl.passes.timers.due_in(RULE_KEY))
            ctl.passes.timers.cancel(RULE_KEY)  # as if it had fired
        await ctl.passes(RULE_KEY, "retry")  # the third try succeeds
        failures = ctl.passes.failures(RULE_KEY)
        await ctl.stop()
        return delays, failures

    delays, failures = run(scenario())
    first, _cap = copyrator.RETRY_SECONDS
    assert delays == [pytest.approx(first, abs=0.05), pytest.approx(2 * first, abs=0.05)]
    assert failures == 0


def test_a_refused_copy_is_retried_with_backoff_and_does_not_fail_the_handler() -> None:
    """A target namespace's quota refuses the copy (403): the rule's status says so and the operator
    retries; Kopf's handler neither fails permanently (an ERROR line, no retry) nor retries hot."""

    async def scenario() -> tuple[float | None, list[tuple[Any, ...]]]:
        access = FakeAccess()
        quota = ApiError(403, "Forbidden", 'configmaps "conf" is forbidden: exceeded quota: no-more')
        access.answer("list", [SOURCE])
        access.answer("create", quota)
        ctl = controller(access)
        await ctl.rule_changed(RULE, "rule created")  # raises nothing
        due = ctl.passes.timers.due_in(RULE_KEY)
        await ctl.stop()
        return due, access.made("create")

    due, creates = run(scenario())
    assert due == pytest.approx(copyrator.RETRY_SECONDS[0], abs=0.05)
    assert len(creates) == 1


def test_a_standby_sweeps_nothing() -> None:
    access = FakeAccess()
    access.paused = True
    run(controller(access).passes(RULE_KEY, "resync"))
    assert access.calls == []


def test_stop_cancels_the_status_flush_and_retries() -> None:
    async def scenario() -> tuple[bool, bool, list[tuple[Any, ...]]]:
        access = FakeAccess()
        ctl = controller(access, options=rules.Options(status_delay_seconds=0.01))
        ctl.status.schedule_status(tally.rule_snapshot(RULE))
        ctl.passes.retry_later(RULE_KEY)
        await ctl.stop()
        await asyncio.sleep(0.05)  # past the flush it would have made
        return ctl.status.flush.pending(RULE_KEY), ctl.passes.timers.pending(RULE_KEY), access.calls

    flush_pending, retry_pending, calls = run(scenario())
    assert not flush_pending and not retry_pending
    assert calls == []  # the cancelled flush wrote no status


def test_a_standbys_rule_handler_waits_to_act_and_then_converges() -> None:
    """On a warm standby a rule's create handler neither writes nor fails (Kopf would log each refused
    write as an error and retry it): it waits, and converges once this replica takes the Lease."""

    async def scenario() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        access = FakeAccess()
        access.answer("list", [SOURCE])
        access.paused = True
        ctl = controller(access)
        handler = asyncio.ensure_future(ctl.rule_changed(RULE, "rule created"))
        await asyncio.sleep(0.2)
        while_standby = access.made("create") + access.made("list")
        access.paused = False
        await asyncio.wait_for(handler, 5)
        await ctl.stop()
        return while_standby, access.made("create")

    while_standby, creates = run(scenario())
    assert while_standby == [] and len(creates) == 1


def test_the_writer_returns_what_it_did_at_a_place_and_changes_no_one_s_state() -> None:
    """A pass at a place answers with its ``Outcome``; ``Places`` and the status reporter change only when
    the controller hands it to them."""
    async def scenario() -> None:
        access = FakeAccess()
        ctl = controller(access)
        rule = rules.parse_rule(RULE)
        key = ("ConfigMap", "t", "conf")
        created = await ctl.writer.sync_copy(rule, "t", "conf")
        assert (created.key, created.result, created.writes, created.counted) == (key, Result.DONE, 1, ("created",))
        [seen] = created.seen
        assert seen.view is not None and seen.view.rule_uid == "rule-uid"
        assert ctl.places.copy(*key) is None and not ctl.status.done  # nothing recorded by the writer
        ctl.places.record(created)
        ctl.status.record(created)
        assert ctl.places.copy(*key) == seen.view and ctl.status.done["rule-uid"] == {"created": 1}

        # A refusal: reported once (one Event), kept only once recorded; the same refusal again changes nothing.
        refused = ApiError(422, "Invalid", "metadata.annotations: Too long")
        access.answer("create", refused, refused)
        ctl.places.written.forget(key)
        first = await ctl.writer.sync_copy(rule, "t", "conf")
        assert first.result is Result.REFUSED and "HTTP 422 Invalid" in first.refusal
        assert ctl.places.refusal("rule-uid", key) is None
        ctl.places.record(first)
        assert ctl.places.refusal("rule-uid", key) == first.refusal
        again = await ctl.writer.sync_copy(rule, "t", "conf")
        assert again.result is Result.UNCHANGED
        assert access.events == [("Warning", "CopyRefused")]

        # A failure: the error is in the outcome (the sweep retries the rule), not raised.
        access.answer("create", server_error())
        failed = await ctl.writer.sync_copy(rule, "t", "conf")
        assert failed.result is Result.FAILED and failed.error is not None and failed.error.transient
        assert "rule-uid" not in ctl.places.failed
        await ctl.stop()

    run(scenario())
