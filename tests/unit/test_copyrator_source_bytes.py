"""Copyrator holds no tenant's bytes it has no use for: a source no target accepts is held as a digest
(its data read once a target accepts it), and a source over the size cap is never copied nor held with
its data, and its owner is told (a Warning ``SourceTooLarge``, a gauge). Pure decisions, and the
controller with a fake access layer."""

from __future__ import annotations

import asyncio
from typing import Any

from kopf_operators.copyrator.controller import CopyratorController
from kopf_operators.copyrator.rules import (
    ACCEPT_FROM_ANNOTATION,
    DIGEST,
    PUSH_TO_ANNOTATION,
    Options,
    Rule,
    copy_problem,
    data_keys,
    is_lean,
    namespace_info,
    push_rule,
    selects,
    source_entry,
    too_large,
)
from kopf_operators.copyrator.tally import Tally, decide_push, rule_snapshot
from kopf_operators.core import metrics
from kopf_operators.core.conventions import DATA_ELIDED, data_bytes, data_hash, elide_data
from tests.unit.fake_access import FakeAccess

CAP = 1000


def source(data: str = "v", *, push_to: str | None = "tenant-b", labels: dict[str, str] | None = None,
           rv: str = "2") -> dict[str, Any]:
    annotations = {"kubectl.kubernetes.io/last-applied-configuration": "{...}" * 50}
    if push_to is not None:
        annotations[PUSH_TO_ANNOTATION] = push_to
    return {"kind": "ConfigMap", "metadata": {"namespace": "tenant-a", "name": "cfg", "uid": "src-uid",
                                              "resourceVersion": rv, "labels": labels or {},
                                              "annotations": annotations},
            "data": {"k": data}}


def namespace(name: str, accept: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if accept is not None:
        meta["annotations"] = {ACCEPT_FROM_ANNOTATION: accept}
    return {"metadata": meta, "status": {"phase": "Active"}}


# --- decisions ----------------------------------------------------------------------------------

def test_the_size_of_a_source_counts_keys_and_decoded_values() -> None:
    assert data_bytes({"kind": "ConfigMap", "data": {"a": "abc"}, "binaryData": {"b": "YQ=="}}) == 6
    assert data_bytes({"kind": "Secret", "data": {"a": "YWJj", "b": "YQ=="}}) == 6  # base64, decoded
    assert data_bytes({"kind": "ConfigMap"}) == 0
    # A body handed on without its data says how big they were, and their digest.
    body = source("x" * 500)
    elided = elide_data(body, 100)
    assert "data" not in elided and data_bytes(elided) == 501 and elided[DATA_ELIDED]["hash"] == data_hash(
        "ConfigMap", body)
    assert elide_data(body, 501) is body


def test_a_listed_source_handed_on_without_its_data_is_held_lean_and_refused_by_its_size() -> None:
    entry = source_entry(elide_data(source("x" * 500), 100), max_bytes=CAP)  # keep_data: not possible
    assert is_lean(entry) and too_large(entry) is None and entry[DIGEST]["bytes"] == 501
    big = source_entry(elide_data(source("x" * CAP), 100), max_bytes=CAP)
    assert too_large(big) and str(CAP + 1) in str(too_large(big))


def test_a_lean_entry_holds_a_digest_and_only_copyrators_annotations() -> None:
    body = source("x" * 500)
    full = source_entry(body, max_bytes=CAP)
    assert full["data"] == body["data"] and not is_lean(full) and too_large(full) is None
    lean = source_entry(body, keep_data=False, max_bytes=CAP)
    assert "data" not in lean and is_lean(lean) and too_large(lean) is None
    assert lean["metadata"]["annotations"] == {PUSH_TO_ANNOTATION: "tenant-b"}  # not last-applied's copy
    assert lean[DIGEST]["bytes"] == 501 and data_keys(lean) == []  # its keys: once read
    assert lean[DIGEST]["hash"] == source_entry(source("x" * 500), keep_data=False)[DIGEST]["hash"]
    assert lean[DIGEST]["hash"] != source_entry(source("y" * 500), keep_data=False)[DIGEST]["hash"]
    # What selecting and pushing read is all there.
    rule = push_rule(lean)
    assert isinstance(rule, Rule) and selects(rule, "ConfigMap", lean)


def test_a_source_over_the_cap_is_refused_and_never_held_with_its_data() -> None:
    body = source("x" * CAP)
    entry = source_entry(body, max_bytes=CAP)  # even when its data would be kept
    assert "data" not in entry and data_keys(entry) == []
    refused = too_large(entry)
    assert refused == (f"source tenant-a/cfg: its data and binaryData hold {CAP + 1} bytes, more than the {CAP} a "
                       f"source may hold (COPYRATOR_MAX_SOURCE_BYTES): never copied")
    rule = push_rule(body)
    assert isinstance(rule, Rule)
    assert copy_problem(rule, entry) == refused  # what keeps any rule from copying it
    assert decide_push(rule, Tally(sources=1, targets=1, invalid=[refused]), entry) == (
        "SourceTooLarge", refused)
    assert Options().max_source_bytes == 262144
    assert Options.from_env({"COPYRATOR_MAX_SOURCE_BYTES": "1048576"}).max_source_bytes == 1048576


# --- the controller ---------------------------------------------------------------------------

class Recorder(FakeAccess):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple[str, str]] = []

    def event(self, obj: Any, type: str, reason: str, message: str) -> None:
        super().event(obj, type, reason, message)
        self.messages.append((reason, message))


def controller(access: FakeAccess, *namespaces: dict[str, Any], rules: dict[Any, Any] | None = None
               ) -> CopyratorController:
    infos = [namespace_info(ns) for ns in namespaces]
    return CopyratorController(access, Options(operator_namespace="kopf-operators", max_source_bytes=CAP,  # type: ignore[arg-type]
                                               status_delay_seconds=0),
                               rules or {}, {n.name: [n] for n in infos}, {"ConfigMap": {}, "Secret": {}})


def writes(access: FakeAccess) -> list[tuple[Any, ...]]:
    return [call[:4] for call in access.calls if call[0] in ("create", "patch", "delete")]


def held(ctl: CopyratorController) -> dict[str, Any]:
    entry = ctl.sources.get("ConfigMap", ("tenant-a", "cfg"))
    assert entry is not None
    return entry


def test_a_push_no_target_accepts_is_held_as_a_digest_and_read_once_a_target_consents() -> None:
    access = Recorder()
    ctl = controller(access, namespace("tenant-a"), namespace("tenant-b"))
    asyncio.run(ctl.object_event("ConfigMap", "ADDED", source("x" * 500)))
    assert is_lean(held(ctl)) and "data" not in held(ctl)
    assert writes(access) == [] and access.made("read") == []
    assert access.events == [("Warning", "PushRefused")]
    # The namespace consents: the source is read (one GET), and the copy made from what was read.
    access.answer("read", source("x" * 500, rv="3"))
    ctl.sources.namespaces["tenant-b"] = [namespace_info(namespace("tenant-b", "tenant-a"))]  # type: ignore[index]
    asyncio.run(ctl.namespace_event("MODIFIED", namespace("tenant-b", "tenant-a")))
    assert access.made("read") == [("read", "ConfigMap", "tenant-a", "cfg")]
    assert writes(access) == [("create", "ConfigMap", "tenant-b", "cfg")]
    assert held(ctl)["data"] == {"k": "x" * 500} and not is_lean(held(ctl))


def test_a_consented_push_is_held_with_its_data_and_copied_without_a_read() -> None:
    """The path of a source some target accepts is as before: its event's body is what it is built from."""
    access = Recorder()
    ctl = controller(access, namespace("tenant-a"), namespace("tenant-b", "tenant-a"))
    asyncio.run(ctl.object_event("ConfigMap", "ADDED", source("x" * 500)))
    assert writes(access) == [("create", "ConfigMap", "tenant-b", "cfg")] and access.made("read") == []
    assert not is_lean(held(ctl))


def test_a_push_over_the_cap_is_refused_on_its_source_never_read_nor_copied() -> None:
    access = Recorder()
    ctl = controller(access, namespace("tenant-a"), namespace("tenant-b", "*"))
    asyncio.run(ctl.object_event("ConfigMap", "ADDED", source("x" * CAP)))
    asyncio.run(ctl._resync_pushes())
    assert writes(access) == [] and access.made("read") == [] and "data" not in held(ctl)
    assert access.events == [("Warning", "SourceTooLarge")]  # once, not per resync
    assert f"hold {CAP + 1} bytes, more than the {CAP}" in access.messages[0][1]
    assert metrics.SOURCES_TOO_LARGE._value.get() == 1
    # Made smaller: copied; the gauge drops.
    asyncio.run(ctl.object_event("ConfigMap", "MODIFIED", source("small", rv="3")))
    assert writes(access) == [("create", "ConfigMap", "tenant-b", "cfg")]
    assert metrics.SOURCES_TOO_LARGE._value.get() == 0


def test_a_rules_source_over_the_cap_gets_the_warning_and_no_copy() -> None:
    rule_body = {"apiVersion": "flant.com/v1", "kind": "CopyratorRule",
                 "metadata": {"namespace": "tenant-a", "name": "r", "uid": "rule-uid", "generation": 1,
                              "resourceVersion": "1"},
                 "spec": {"ruleType": "configmap", "selector": {"copy": "yes"}, "namespace": "tenant-a"}}
    access = Recorder()
    ctl = controller(access, namespace("tenant-a"), namespace("tenant-b"),
                     rules={("tenant-a", "r"): [rule_snapshot(rule_body)]})
    asyncio.run(ctl.object_event("ConfigMap", "ADDED", source("x" * CAP, push_to=None, labels={"copy": "yes"})))
    assert writes(access) == [] and ("Warning", "SourceTooLarge") in access.events
    assert "data" not in held(ctl)
    tally = ctl.status.tally(ctl.sources.rule(rule_snapshot(rule_body)))  # type: ignore[arg-type]
    assert tally.invalid and "COPYRATOR_MAX_SOURCE_BYTES" in tally.invalid[0]  # the rule is Stalled, says why
    asyncio.run(ctl.object_event("ConfigMap", "DELETED", source("x" * CAP, push_to=None, labels={"copy": "yes"})))
    assert metrics.SOURCES_TOO_LARGE._value.get() == 0


def test_a_listed_source_that_came_without_its_data_is_read_once_before_its_copy() -> None:
    """At a start, a listed source's large data are not kept while its handlers wait for the indexes: a
    push some target accepts is read (one GET), then copied from what was read."""
    access = Recorder()
    ctl = controller(access, namespace("tenant-a"), namespace("tenant-b", "tenant-a"))
    listed = elide_data(source("x" * 500), 100)
    access.answer("read", source("x" * 500))
    asyncio.run(ctl.object_event("ConfigMap", None, listed))
    assert access.made("read") == [("read", "ConfigMap", "tenant-a", "cfg")]
    assert writes(access) == [("create", "ConfigMap", "tenant-b", "cfg")]
    assert held(ctl)["data"] == {"k": "x" * 500}
