"""Hash shards: the slices cover every hash exactly once, and a namespace's shard is the one the API
server's shard selector gives it (64-bit FNV-1a of the name)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest

from kopf_operators.core import metrics, process
from kopf_operators.core.conventions import (
    HASH_SPACE,
    Config,
    fnv1a64,
    namespace_shard,
    serves_namespace,
    shard_bounds,
    shard_selector,
)
from kopf_operators.core.kopf_patches.shards import (
    SHARD_MEMBERSHIP_ATTR,
    filter_shards_in_process,
    serve_shard_in_process,
    shard_filtered,
)

_NAMESPACED = kopf.Resource("", "v1", "configmaps", namespaced=True)


@pytest.mark.parametrize("count", [1, 2, 3, 7, 16])
def test_shards_slice_the_whole_hash_space_without_gaps_or_overlaps(count: int) -> None:
    bounds = [shard_bounds(i, count) for i in range(count)]
    assert bounds[0][0] == 0 and bounds[-1][1] == HASH_SPACE
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(count - 1))


def test_fnv1a64_matches_the_reference_vectors() -> None:
    assert fnv1a64("") == 0xCBF29CE484222325
    assert fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a64("foobar") == 0x85944171F73967E8


def test_namespace_shards_as_the_api_server_assigned_them() -> None:
    # Seen on the local API server with the two selectors below (tests/e2e/test_sharding.py re-checks
    # the assignment against the server for fresh names).
    assert namespace_shard("kube-node-lease", 2) == 0
    assert {namespace_shard(ns, 2) for ns in ("default", "kube-public", "kube-system")} == {1}
    assert shard_selector(0, 2) == \
        "shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000')"
    assert shard_selector(1, 2) == \
        "shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')"


def test_shard_settings_are_checked() -> None:
    assert Config.from_env({"SHARD_INDEX": "1", "SHARD_COUNT": "2"}).shard_index == 1
    with pytest.raises(ValueError, match="SHARD_INDEX=2 must be below SHARD_COUNT=2"):
        Config.from_env({"SHARD_INDEX": "2", "SHARD_COUNT": "2"})


@pytest.mark.parametrize("count", [2, 3, 5])
def test_every_namespace_is_served_by_exactly_one_shard_and_cluster_scoped_objects_by_all(count: int) -> None:
    for i in range(300):
        namespace = f"team-{i}"
        serving = [index for index in range(count) if serves_namespace(namespace, index, count)]
        assert serving == [namespace_shard(namespace, count)]
    for index in range(count):
        assert serves_namespace(None, index, count) and serves_namespace("", index, count)
    assert serves_namespace("anything", 0, 1)


def test_the_shard_filtering_setting_is_checked() -> None:
    assert Config.from_env({}).shard_filtering == "auto"
    assert Config.from_env({"SHARD_FILTERING": " Client "}).shard_filtering == "client"
    with pytest.raises(ValueError, match="SHARD_FILTERING=both must be one of auto, server, client"):
        Config.from_env({"SHARD_FILTERING": "both"})


def _events(*namespaces: str | None) -> list[dict[str, Any]]:
    return [{"type": "ADDED", "object": {"metadata": {"name": "x", **({"namespace": ns} if ns else {})}}}
            for ns in namespaces]


def _watched(events: list[Any], settings: kopf.OperatorSettings) -> list[Any]:
    async def watch(**_: Any) -> AsyncIterator[Any]:
        for event in events:
            yield event

    async def collect() -> list[Any]:
        return [event async for event in shard_filtered(watch)(settings=settings)]

    return asyncio.run(collect())


def test_the_process_filter_drops_only_other_shards_namespaced_events() -> None:
    mine = next(f"ns-{i}" for i in range(100) if namespace_shard(f"ns-{i}", 3) == 1)
    other = next(f"ns-{i}" for i in range(100) if namespace_shard(f"ns-{i}", 3) != 1)
    events = [*_events(mine, other, None), "LISTED-bookmark"]
    settings = kopf.OperatorSettings()
    assert _watched(events, settings) == events  # no shard named: everything passes
    serve_shard_in_process(settings, functools.partial(serves_namespace, index=1, count=3))
    assert _watched(events, settings) == [events[0], events[2], events[3]]


class _Server:
    def __init__(self, honours: bool) -> None:
        self.honours, self.asked = honours, 0

    async def honours_shard_selectors(self) -> bool:
        self.asked += 1
        return self.honours


def _serve(filtering: str, honours: bool) -> tuple[kopf.OperatorSettings, _Server]:
    settings, server = kopf.OperatorSettings(), _Server(honours)
    config = Config(shard_index=1, shard_count=3, shard_filtering=filtering)
    asyncio.run(process.serve_one_shard(settings, config, server))  # type: ignore[arg-type]
    return settings, server


def _mode(index: int, count: int) -> dict[str, float]:
    return {filtering: metrics.SHARD.labels(str(index), str(count), filtering)._value.get()
            for filtering in ("server", "client")}


def test_a_server_that_honours_the_selector_filters_the_watches() -> None:
    metrics.SHARD.clear()
    settings, server = _serve("auto", honours=True)
    assert server.asked == 1
    assert settings.watching.shard_selectors.collect(_NAMESPACED) == [shard_selector(1, 3)]
    assert not hasattr(settings.watching, SHARD_MEMBERSHIP_ATTR)
    assert _mode(1, 3) == {"server": 1, "client": 0}


@pytest.mark.parametrize(("filtering", "honours"), [("auto", False), ("client", True)])
def test_without_the_servers_filter_the_process_filters(filtering: str, honours: bool,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A server without the feature gate (or SHARD_FILTERING=client): no selector is sent, the process
    drops the other shards' events, says so once, and the gauge shows it."""
    metrics.SHARD.clear()
    filter_shards_in_process()
    with caplog.at_level(logging.INFO, logger="kopf_operators"):
        settings, server = _serve(filtering, honours)
    assert server.asked == (1 if filtering == "auto" else 0)
    assert settings.watching.shard_selectors.collect(_NAMESPACED) == []
    serves = getattr(settings.watching, SHARD_MEMBERSHIP_ATTR)
    assert [serves(f"ns-{i}") for i in range(50)] == [namespace_shard(f"ns-{i}", 3) == 1 for i in range(50)]
    lines = [r.getMessage() for r in caplog.records if "Serving shard" in r.getMessage()]
    assert len(lines) == 1 and "filtered by this process" in lines[0], lines
    assert _mode(1, 3) == {"server": 0, "client": 1}


def test_a_server_filter_that_is_demanded_but_missing_refuses_to_start() -> None:
    with pytest.raises(kopf.PermanentError, match="SHARD_FILTERING=server needs the API server's ShardedListAndWatch"):
        _serve("server", honours=False)
