"""The re-roller's history and restore: the pure decisions (kopf_operators/reroller/history.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kopf_operators.core.conventions import data_hash
from kopf_operators.reroller import history, settings, views
from kopf_operators.reroller.history import Snapshot
from tests.unit.fake_access import FakeAccess


@pytest.mark.parametrize("value, count", [("5", 5), (" 1 ", 1), ("20", 20)])
def test_a_count_of_versions_is_read(value: str, count: int) -> None:
    assert history.parse_limit(value) == (count, "")


@pytest.mark.parametrize("value, says", [("21", "not between 1 and 20"), ("0", "not between 1 and 20"),
                                         ("five", "not a number"), ("-3", "not a number"), ("", "not a number"),
                                         ("2.5", "not a number")])
def test_a_count_beyond_the_bound_or_not_a_number_is_refused_with_a_reason(value: str, says: str) -> None:
    count, message = history.parse_limit(value)
    assert count is None and says in message and settings.HISTORY in message


def test_a_snapshot_is_named_after_its_source_and_data() -> None:
    assert history.snapshot_name("app-conf", "0123456789abcdef") == "app-conf-0123456789abcdef"


def test_a_long_name_is_bounded_and_two_long_names_with_one_prefix_stay_apart() -> None:
    one, two = "a" * 250, "a" * 249 + "b"
    names = {history.snapshot_name(n, "0123456789abcdef") for n in (one, two)}
    assert len(names) == 2
    for name in names:
        assert len(name) <= 253 and name.endswith("-0123456789abcdef")
    # A prefix cut at a dot or a dash is not left dangling before the separator.
    dotted = history.snapshot_name("x" * 225 + ".-" + "y" * 30, "0123456789abcdef")
    assert len(dotted) <= 253 and ".-" not in dotted and "--" not in dotted


def test_the_label_is_the_source_name_or_bounded_as_a_label_value_may_be() -> None:
    assert history.snapshot_label("app-conf") == "app-conf"
    long = history.snapshot_label("a" * 53 + "." + "b" * 100)
    assert len(long) <= 63 and long[-1].isalnum() and ".-" not in long
    assert long != history.snapshot_label("a" * 53 + "." + "b" * 99 + "c")
    body = history.snapshot_body("ConfigMap", {"metadata": {"name": "a" * 200, "namespace": "n", "uid": "u"}}, "h", 1)
    assert body["metadata"]["labels"][settings.SNAPSHOT_OF] == history.snapshot_label("a" * 200)
    assert history.snapshot_of({**body, "metadata": {**body["metadata"], "uid": "s"}}, "a" * 200, "u") is not None


def source(kind: str = "ConfigMap", **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind,
            "metadata": {"name": "conf", "namespace": "team", "uid": "u-1", "resourceVersion": "42",
                         "labels": {"team": "a"}, "annotations": {settings.HISTORY: "3", "other": "x"}},
            **fields}


def test_a_configmap_snapshot_holds_its_data_and_binary_data_immutably_owned_by_the_source() -> None:
    body = source(data={"a": "1"}, binaryData={"b": "AAE="})
    digest = data_hash("ConfigMap", body)
    snap = history.snapshot_body("ConfigMap", body, digest, 42)
    assert snap["immutable"] is True and snap["kind"] == "ConfigMap"
    assert snap["data"] == {"a": "1"} and snap["binaryData"] == {"b": "AAE="}
    meta = snap["metadata"]
    assert meta["namespace"] == "team" and meta["name"] == f"conf-{digest}"
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "ConfigMap", "name": "conf", "uid": "u-1"}]
    assert meta["labels"] == {settings.SNAPSHOT_OF: "conf"}  # the source's own labels and annotations: none
    assert meta["annotations"] == {settings.SNAPSHOT_HASH: digest, settings.SNAPSHOT_VERSION: "42"}
    # Its data hash the same as the source's: what the re-roller compares.
    assert data_hash("ConfigMap", snap) == digest


def test_a_secret_snapshot_is_a_secret_of_its_type() -> None:
    body = source("Secret", type="kubernetes.io/tls", data={"tls.crt": "Yw==", "tls.key": "aw=="})
    snap = history.snapshot_body("Secret", body, "h", 1)
    assert snap["kind"] == "Secret" and snap["type"] == "kubernetes.io/tls" and "binaryData" not in snap
    assert data_hash("Secret", snap) == data_hash("Secret", body)


def test_only_objects_with_our_label_and_an_owner_reference_to_the_source_are_its_snapshots() -> None:
    ours = history.snapshot_body("ConfigMap", source(data={"a": "1"}), "h1", 7)
    ours["metadata"]["uid"] = "s-1"
    assert history.snapshot_of(ours, "conf", "u-1") == Snapshot(ours["metadata"]["name"], "s-1", "h1", 7)
    assert history.snapshot_of(ours, "conf", "another-uid") is None  # a recreated source's, or forged
    assert history.snapshot_of(ours, "other", "u-1") is None
    unlabelled = {**ours, "metadata": {**ours["metadata"], "labels": {}}}
    assert history.snapshot_of(unlabelled, "conf", "u-1") is None


def snaps(*pairs: tuple[str, int]) -> list[Snapshot]:
    return [Snapshot(f"conf-{h}", f"uid-{h}", h, v) for h, v in pairs]


def test_pruning_drops_the_oldest_beyond_the_limit_and_never_the_current() -> None:
    kept = snaps(("a", 10), ("b", 20), ("c", 30), ("d", 40))
    assert [s.hash for s in history.to_prune(kept, 2, "d")] == ["b", "a"]
    assert history.to_prune(kept, 4, "d") == []
    # The current data's snapshot is kept even when its version says otherwise (a moment before it is re-ordered).
    assert [s.hash for s in history.to_prune(kept, 1, "a")] == ["d", "c", "b"]


def test_previous_is_the_newest_version_of_other_data() -> None:
    kept = snaps(("a", 10), ("b", 20), ("c", 30))
    assert history.resolve_restore("previous", "c", kept) == (kept[1], "")
    assert history.resolve_restore(" Previous ", "b", kept) == (kept[2], "")  # after a restore of b: back to c
    target, message = history.resolve_restore("previous", "c", snaps(("c", 30)))
    assert target is None and "no previous version" in message


def test_a_restore_names_a_hash_or_a_unique_prefix() -> None:
    kept = snaps(("0123456789abcdef", 10), ("0123456fffffffff", 20), ("fedcba9876543210", 30))
    assert history.resolve_restore("0123456789abcdef", "x", kept)[0] == kept[0]
    assert history.resolve_restore("FEDCBA9", "x", kept)[0] == kept[2]
    target, message = history.resolve_restore("0123456", "x", kept)
    assert target is None and "more than one" in message
    target, message = history.resolve_restore("fedcba", "x", kept)  # too short to be a prefix
    assert target is None and "no kept version has hash 'fedcba'" in message
    target, message = history.resolve_restore("nope", "x", [])
    assert target is None and "(kept: none)" in message


def test_a_restore_is_one_patch_on_the_resource_version_removing_the_annotation_and_extra_keys() -> None:
    current = source(data={"a": "2", "new": "x"}, binaryData={"b": "AA=="})
    kept = {"data": {"a": "1"}}
    patch = history.restore_patch("ConfigMap", current, kept, "42")
    assert patch == {"metadata": {"resourceVersion": "42", "annotations": {settings.RESTORE: None}},
                     "data": {"a": "1", "new": None}, "binaryData": {"b": None}}
    secret = history.restore_patch("Secret", source("Secret", data={"k": "Mg=="}), {"data": {"k": "MQ=="}}, "9")
    assert secret["data"] == {"k": "MQ=="} and "binaryData" not in secret


def test_the_sweep_reads_only_the_sources_with_history_work_not_done_here() -> None:
    """After a takeover (or a failed handling), the resync's sweep finds from the index the sources
    with a restore asked for or a version not kept by this process, and only those are read."""
    def source(name: str, **annotations: str) -> tuple[tuple[str, str, str], list[views.SourceView]]:
        body = {"metadata": {"name": name, "namespace": "ns", "annotations": annotations}, "data": {"k": name}}
        return ("ConfigMap", "ns", name), [views.source_view("ConfigMap", body)]

    index = dict([source("plain"), source("kept", **{settings.HISTORY: "3"}),
                  source("restoring", **{settings.RESTORE: "previous"})])
    access = FakeAccess()
    keeper = history.History(access, enabled=True)  # type: ignore[arg-type]
    kept = index[("ConfigMap", "ns", "kept")][0]
    keeper._kept[("ConfigMap", "ns", "kept")] = ("uid", kept.hash, 3)  # this process kept its version
    asyncio.run(keeper.sweep({"ConfigMap": index, "Secret": {}}))
    assert [call[3] for call in access.made("read")] == ["restoring"]  # gone meanwhile (read: None)
    access.paused = True  # a standby sweeps nothing
    asyncio.run(keeper.sweep({"ConfigMap": {**index, **dict([source("new", **{settings.HISTORY: "3"})])}}))
    assert len(access.made("read")) == 1
