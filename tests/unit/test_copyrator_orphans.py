"""Copyrator's orphan sweep (controller logic, a fake access layer): copies of a rule that is gone are
pruned, and nothing else is touched or even read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from typing import Any

from kopf_operators.copyrator import copies
from kopf_operators.copyrator.controller import CopyratorController
from kopf_operators.copyrator.places import copy_index_keys
from kopf_operators.copyrator.rules import RULE_ANNOTATION, Options
from kopf_operators.core.api import ApiError
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL


class FakeAccess:
    """Records every request; ``rules`` is what the API server holds: (namespace, name) -> uid."""

    def __init__(self, rules: dict[tuple[str, str], str], failing: bool = False) -> None:
        self.rules = rules
        self.failing = failing
        self.paused = False  # Kopf's peering pause (Access.paused)
        self.calls: list[tuple[str, ...]] = []

    async def list(self, kind: Any, namespace: str | None = None, *, labels: str = "",
                   fields: str = "") -> list[dict[str, Any]]:
        self.calls.append(("list", kind.plural, str(namespace), fields))
        if self.failing:
            raise ApiError(503, "ServiceUnavailable")
        name = fields.removeprefix("metadata.name=")
        uid = self.rules.get((str(namespace), name))
        return [{"metadata": {"namespace": namespace, "name": name, "uid": uid}}] if uid else []

    async def delete(self, kind: Any, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", kind.plural, str(namespace), name, str(uid)))
        return True

    @contextlib.asynccontextmanager
    async def serialised(self, key: Hashable) -> AsyncIterator[None]:
        yield


def copy_view(namespace: str, name: str, rule_uid: str, rule: str) -> copies.CopyView:
    return copies.copy_view({"kind": "ConfigMap", "metadata": {
        "namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}", "resourceVersion": "5",
        "labels": {COPYRATOR_RULE_UID_LABEL: rule_uid}, "annotations": {RULE_ANNOTATION: rule}}})


def controller(access: FakeAccess, live: dict[tuple[str, str], str],
               views: list[copies.CopyView]) -> CopyratorController:
    rules = {key: [{"metadata": {"namespace": key[0], "name": key[1], "uid": uid}}] for key, uid in live.items()}
    index: dict[Any, list[copies.CopyView]] = {}
    for view in views:
        for key, value in copy_index_keys(view).items():
            index.setdefault(key, []).append(value)
    return CopyratorController(access, Options(), rules, {}, {"ConfigMap": index, "Secret": {}})  # type: ignore[arg-type]


def test_only_copies_of_rules_confirmed_gone_are_pruned() -> None:
    views = [copy_view("t", "live", "u-live", "a/live"),        # its rule is in the index: no request
             copy_view("t", "gone", "u-gone", "a/gone"),        # deleted while the operator was down
             copy_view("t", "reborn", "u-old", "a/reborn"),     # deleted and re-created: another uid
             copy_view("t", "elsewhere", "u-else", "b/else"),   # alive outside this process's view
             copy_view("t", "nameless", "u-what", "not a key")]  # cannot be confirmed: never touched
    access = FakeAccess({("a", "live"): "u-live", ("a", "reborn"): "u-new", ("b", "else"): "u-else"})
    pruned = asyncio.run(controller(access, {("a", "live"): "u-live"}, views).prune_orphans())
    assert pruned == 2
    deletes = sorted(c for c in access.calls if c[0] == "delete")
    assert deletes == [("delete", "configmaps", "t", "gone", "uid-t-gone"),
                       ("delete", "configmaps", "t", "reborn", "uid-t-reborn")]
    lists = sorted(c[2:] for c in access.calls if c[0] == "list")
    assert lists == [("a", "metadata.name=gone"), ("a", "metadata.name=reborn"), ("b", "metadata.name=else")]


def test_an_idle_sweep_makes_no_request() -> None:
    access = FakeAccess({("a", "live"): "u-live"})
    sweep = controller(access, {("a", "live"): "u-live"}, [copy_view("t", "live", "u-live", "a/live")])
    assert asyncio.run(sweep.prune_orphans()) == 0
    assert access.calls == []


def test_a_failed_confirmation_deletes_nothing() -> None:
    access = FakeAccess({}, failing=True)
    sweep = controller(access, {}, [copy_view("t", "gone", "u-gone", "a/gone")])
    assert asyncio.run(sweep.prune_orphans()) == 0
    assert [c[0] for c in access.calls] == ["list"]


def test_a_deletion_seen_by_the_operator_needs_no_confirmation() -> None:
    access = FakeAccess({})
    sweep = controller(access, {}, [copy_view("t", "gone", "u-gone", "a/gone")])
    sweep.sources.deleting.add("u-gone")  # its DELETED event was handled, but that prune failed
    assert asyncio.run(sweep.prune_orphans()) == 1
    assert [c[0] for c in access.calls] == ["delete"]


def test_a_paused_standby_sweeps_nothing() -> None:
    access = FakeAccess({})
    access.paused = True  # Kopf paused this replica in favour of a peer
    sweep = controller(access, {}, [copy_view("t", "gone", "u-gone", "a/gone")])
    assert asyncio.run(sweep.prune_orphans()) == 0
    assert access.calls == []
