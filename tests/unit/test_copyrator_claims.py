"""Copyrator's controller on two rules that want one target name, and on a renamed copy (a fake access
layer): only the older rule writes a free name, the holder keeps it, and a renamed copy is deleted only
after its replacement is written; no reads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from typing import Any

from kopf_operators.copyrator import copies
from kopf_operators.copyrator.controller import CopyratorController
from kopf_operators.copyrator.places import copy_index_keys
from kopf_operators.copyrator.rules import NamespaceInfo, Options, parse_rule, source_entry
from kopf_operators.copyrator.tally import rule_snapshot
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL


class FakeAccess:
    paused = False  # the replica acts

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    async def create(self, kind: Any, body: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        self.calls.append(("create", meta["namespace"], meta["name"], meta["labels"][COPYRATOR_RULE_UID_LABEL]))
        return {**body, "metadata": {**meta, "uid": f"copy-{meta['name']}", "resourceVersion": "9"}}

    async def delete(self, kind: Any, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", str(namespace), name))
        return True

    async def read(self, kind: Any, namespace: str, name: str) -> None:
        self.calls.append(("read", namespace, name))

    @contextlib.asynccontextmanager
    async def serialised(self, key: Hashable) -> AsyncIterator[None]:
        yield

    async def list(self, kind: Any, namespace: str | None = None, *, labels: str = "") -> list[dict[str, Any]]:
        """The sources in ``namespace`` that match ``labels`` (colour=...); blue answers last."""
        colour = labels.partition("=")[2]
        await asyncio.sleep(0.05 if colour == "blue" else 0)
        return [source(colour, colour)]

    async def patch_status(self, kind: Any, namespace: str | None, name: str, status: Any, **_: Any) -> dict[str, Any]:
        return {"status": status}

    def event(self, body: Any, type_: str, reason: str, message: str) -> None:
        pass

    def defer_echo(self, answer: Any) -> None:
        pass  # only Kopf's event processing asks about it (tests/unit/test_process.py)


def rule(name: str, uid: str, created: str, colour: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "flant.com/v1", "kind": "CopyratorRule",
            "metadata": {"namespace": "src", "name": name, "uid": uid, "generation": 1, "creationTimestamp": created},
            "spec": {"ruleType": "configmap", "selector": {"colour": colour}, "namespace": "src",
                     "targetNamespaces": ["t"], **spec}}


def source(name: str, colour: str) -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {"namespace": "src", "name": name, "uid": f"uid-{name}",
                                              "resourceVersion": "2", "labels": {"colour": colour}},
            "data": {"colour": colour}}


def controller(access: FakeAccess, rules: list[dict[str, Any]], views: list[copies.CopyView]) -> CopyratorController:
    index: dict[Any, list[copies.CopyView]] = {}
    for view in views:
        for key, value in copy_index_keys(view).items():
            index.setdefault(key, []).append(value)
    namespaces = {name: [NamespaceInfo(name, {}, True)] for name in ("src", "t")}
    snapshots = {(r["metadata"]["namespace"], r["metadata"]["name"]): [rule_snapshot(r)] for r in rules}
    ctl = CopyratorController(access, Options(), snapshots, namespaces,  # type: ignore[arg-type]
                              {"ConfigMap": index, "Secret": {}})
    for body in (source("blue", "blue"), source("green", "green")):
        ctl.sources.put("ConfigMap", source_entry(body))
    return ctl


def made(body: dict[str, Any], colour: str, uid: str) -> copies.CopyView:
    """The copy ``body``'s rule made of the ``colour`` source in namespace t, as the index shows it."""
    copy = copies.desired_copy(parse_rule(body), source(colour, colour), "t")
    copy["metadata"].update(uid=uid, resourceVersion="3")
    return copies.copy_view(copy)


def sweep(ctl: CopyratorController, body: dict[str, Any]) -> None:
    parsed = parse_rule(body)
    asyncio.run(ctl.sweep(parsed, "test"))


OLDER = rule("z-older", "u-old", "2026-11-01T00:00:00Z", "blue", target={"name": "app"})
NEWER = rule("a-newer", "u-new", "2026-11-02T00:00:00Z", "green", target={"name": "app"})


def test_a_free_name_goes_to_the_older_rule_whichever_syncs_first() -> None:
    for order in ([NEWER, OLDER], [OLDER, NEWER]):
        access = FakeAccess()
        ctl = controller(access, [OLDER, NEWER], [])
        for body in order:
            sweep(ctl, body)
        assert access.calls == [("create", "t", "app", "u-old")]
        tally = ctl.status.tally(parse_rule(NEWER))
        assert tally.contested == ["t/app (held by src/z-older)"], tally


def test_two_rules_created_together_the_free_name_goes_to_the_older_whose_sources_list_slower() -> None:
    """Both rules' handlers run at once, each listing its sources first (the older's answer comes
    last): the newer waits for the older's sources before it claims the name, so it never takes it."""
    access = FakeAccess()
    ctl = controller(access, [OLDER, NEWER], [])
    ctl.sources.clear("ConfigMap")  # neither rule's sources listed yet

    async def both() -> None:
        await asyncio.gather(ctl.rule_changed(OLDER, "rule create"), ctl.rule_changed(NEWER, "rule create"))

    asyncio.run(both())
    assert access.calls == [("create", "t", "app", "u-old")]


def test_the_holder_keeps_the_name_and_the_older_rule_is_refused() -> None:
    access = FakeAccess()
    ctl = controller(access, [OLDER, NEWER], [made(NEWER, "green", "c")])
    sweep(ctl, OLDER)
    sweep(ctl, NEWER)
    assert access.calls == []
    assert ctl.status.tally(parse_rule(OLDER)).contested == ["t/app (held by src/a-newer)"]


def test_a_renamed_copy_is_deleted_only_after_its_replacement_is_written() -> None:
    before = rule("r", "u-r", "2026-11-01T00:00:00Z", "blue", target={"namePrefix": "old-"})
    old = made(before, "blue", "c-old")
    after = rule("r", "u-r", "2026-11-01T00:00:00Z", "blue", target={"namePrefix": "new-"})
    access = FakeAccess()
    ctl = controller(access, [after], [old])
    sweep(ctl, after)
    assert access.calls == [("create", "t", "new-blue", "u-r"), ("delete", "t", "old-blue")]
