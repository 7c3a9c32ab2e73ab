"""The soak's opt-in diagnostics (core.diagnostics): what one sample holds, and that it is off by default."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from pathlib import Path

import prometheus_client

from kopf_operators.core import diagnostics
from kopf_operators.core.background import Backoff
from kopf_operators.core.conventions import Config
from kopf_operators.core.state import KeyedState, PerKey


class Foreign:
    """A library's object: its internals are not a controller's state."""

    def __init__(self) -> None:
        self.internals: dict[str, int] = {"x": 1}


class Controller:
    def __init__(self) -> None:
        self.state: KeyedState[str] = KeyedState()
        self.seen: PerKey[str, int] = self.state.map()
        self.seen.update(x=1, y=2, z=3)
        self.backoff: Backoff[str] = Backoff(1.0, 2.0)
        self.backoff.next_delay("a")
        self.backoff.next_delay("b")
        self.foreign = Foreign()
        self.name = "not a container"


def test_off_by_default_and_read_from_the_environment() -> None:
    assert Config.from_env({}).diagnostics_file == ""
    config = Config.from_env({"DIAGNOSTICS_FILE": "/tmp/d.jsonl", "DIAGNOSTICS_SECONDS": "5"})
    assert (config.diagnostics_file, config.diagnostics_seconds) == ("/tmp/d.jsonl", 5.0)


def test_a_controllers_containers_are_counted_in_its_own_parts_only() -> None:
    sizes = diagnostics.container_sizes(Controller())
    assert sizes["seen"] == 3
    assert sizes["backoff._failures"] == 2  # a part of the project's own
    assert "foreign.internals" not in sizes  # a library's internals
    assert "name" not in sizes


def test_growers_are_the_lines_that_grew_most() -> None:
    then = {"a.py:1": (100, 1), "b.py:2": (100, 1)}
    now = {"a.py:1": (1100, 5), "b.py:2": (50, 1), "c.py:3": (300, 2)}
    grown = diagnostics.growers(now, then)
    assert [g["where"] for g in grown] == ["a.py:1", "c.py:3"]
    assert grown[0]["grew_bytes"] == 1000 and grown[0]["grew_blocks"] == 4


def test_metric_series_count_label_sets_not_buckets() -> None:
    histogram = prometheus_client.Histogram("diag_test_seconds", "a test", ["who"], buckets=(1.0, 2.0),
                                            registry=None)
    prometheus_client.REGISTRY.register(histogram)
    try:
        histogram.labels(who="a").observe(1)
        histogram.labels(who="b").observe(1)
        # _bucket, _count, _sum (and _created) share one label set per child: 2 series, not 8.
        assert diagnostics.metric_series()[0]["diag_test_seconds"] == 2
    finally:
        prometheus_client.REGISTRY.unregister(histogram)


def test_a_sample_is_one_json_line_of_the_process(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    memo = {"ctl": Controller()}
    index = {("ConfigMap", "ns", "a"): ["v1"], ("ConfigMap", "ns", "b"): ["v2", "v3"]}

    async def two_samples() -> None:
        tracemalloc.start()
        try:
            sampler = diagnostics.Sampler(path, 60, memo, {"sources": index})
            sampler.write()
            sampler.write()
        finally:
            tracemalloc.stop()

    asyncio.run(two_samples())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    sample = lines[1]
    assert sample["rss_kb"] > 0 and sample["fds"] > 0
    assert sample["indexes"]["sources"] == {"keys": 2, "values": 3}
    assert sample["controllers"]["ctl"]["seen"] == 3
    assert sample["tasks"]["total"] >= 1
    assert sample["heap"]["traced_bytes"] > 0
    assert "kopf_operators_actions" in sample["metric_series"]
    assert isinstance(sample["acting"], bool)
