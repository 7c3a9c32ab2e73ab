"""Copyrator's push sweep (controller logic, a fake access layer): copies made by a push annotation
whose source pushes no more are pruned; the rules' orphan sweep leaves them alone; a source out of
view is read once to confirm; nothing else is touched or read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from typing import Any

from kopf_operators.copyrator import copies, rules
from kopf_operators.copyrator.controller import CopyratorController
from kopf_operators.copyrator.places import copy_index_keys


class FakeAccess:
    """Records every request; ``objects`` is what the API server holds: (namespace, name) -> body."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.paused = False
        self.calls: list[tuple[str, ...]] = []

    async def read(self, kind: Any, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("read", namespace, name))
        return self.objects.get((namespace, name))

    async def list(self, kind: Any, namespace: str | None = None, **_: Any) -> list[dict[str, Any]]:
        self.calls.append(("list", str(namespace)))
        return []

    async def delete(self, kind: Any, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", str(namespace), name, str(uid)))
        return True

    @contextlib.asynccontextmanager
    async def serialised(self, key: Hashable) -> AsyncIterator[None]:
        yield


def source(name: str, uid: str, push: str | None) -> dict[str, Any]:
    annotations = {rules.PUSH_TO_ANNOTATION: push} if push else {}
    return {"kind": "ConfigMap", "metadata": {"namespace": "src", "name": name, "uid": uid,
                                              "resourceVersion": "3", "annotations": annotations},
            "data": {"k": "v"}}


def pushed_copy(name: str, source_uid: str, namespace: str = "t") -> copies.CopyView:
    rule = rules.push_rule(source(name, source_uid, namespace))
    assert isinstance(rule, rules.Rule)
    body = copies.desired_copy(rule, source(name, source_uid, namespace), namespace)
    body["metadata"].update(uid=f"copy-{name}", resourceVersion="5")
    return copies.copy_view(body)


def controller(access: FakeAccess, views: list[copies.CopyView],
               in_view: list[dict[str, Any]]) -> CopyratorController:
    index: dict[Any, list[copies.CopyView]] = {}
    for view in views:
        for copy_key, value in copy_index_keys(view).items():
            index.setdefault(copy_key, []).append(value)
    namespaces = {name: [rules.NamespaceInfo(name, {}, True, accept_from=("src",))] for name in ("src", "t")}
    ctl = CopyratorController(access, rules.Options(), {}, namespaces,  # type: ignore[arg-type]
                              {"ConfigMap": index, "Secret": {}})
    for body in in_view:
        rule = rules.push_rule(body)
        key = ("src", body["metadata"]["name"])
        ctl.sources.put("ConfigMap", rules.source_entry(body))
        if isinstance(rule, rules.Rule):
            ctl.sources.pushes["ConfigMap"][key] = rule
    return ctl


def test_pushed_copies_of_sources_that_push_no_more_are_pruned_and_only_those() -> None:
    views = [pushed_copy("live", "u-live"),        # its source pushes here: in sync, nothing to do
             pushed_copy("stopped", "u-stopped"),  # in view, annotation removed while the operator was down
             pushed_copy("gone", "u-gone"),        # source deleted (out of view): one read confirms
             pushed_copy("reborn", "u-old"),       # source re-created with another uid
             pushed_copy("elsewhere", "u-else")]   # out of view (another shard) and still pushing
    access = FakeAccess({("src", "reborn"): source("reborn", "u-new", "t"),
                         ("src", "elsewhere"): source("elsewhere", "u-else", "t")})
    ctl = controller(access, views, [source("live", "u-live", "t"), source("stopped", "u-stopped", None)])
    asyncio.run(ctl._resync_pushes())
    deletes = sorted(c for c in access.calls if c[0] == "delete")
    assert deletes == [("delete", "t", "gone", "copy-gone"), ("delete", "t", "reborn", "copy-reborn"),
                       ("delete", "t", "stopped", "copy-stopped")]
    reads = sorted(c for c in access.calls if c[0] == "read")
    assert reads == [("read", "src", "elsewhere"), ("read", "src", "gone"), ("read", "src", "reborn")]


def test_an_idle_push_sweep_and_the_rules_orphan_sweep_make_no_request() -> None:
    access = FakeAccess({})
    ctl = controller(access, [pushed_copy("live", "u-live")], [source("live", "u-live", "t")])
    asyncio.run(ctl._resync_pushes())
    # A pushed copy's uid is no rule's: the rules' orphan sweep must not list rules for it, nor prune it.
    assert asyncio.run(ctl.prune_orphans()) == 0
    assert access.calls == []


def test_a_standby_prunes_nothing() -> None:
    access = FakeAccess({})
    access.paused = True
    asyncio.run(controller(access, [pushed_copy("gone", "u-gone")], [])._resync_pushes())
    assert access.calls == []
