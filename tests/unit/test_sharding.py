"""Hash shards: the slices cover every hash exactly once, and a namespace's shard is the one the API
server's shard selector gives it (64-bit FNV-1a of the name)."""

from __future__ import annotations

import pytest

from kopf_operators.core.conventions import HASH_SPACE, Config, fnv1a64, namespace_shard, shard_bounds, shard_selector


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
