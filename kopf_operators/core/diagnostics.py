"""Opt-in diagnostics of the process itself, for a soak (``make soak``): what grows while it runs.

With DIAGNOSTICS_FILE set, the shared startup handler (``process.configure``) starts tracemalloc and a
task that appends one JSON line to that file every DIAGNOSTICS_SECONDS (60 unless set): RSS, the Python
heap (tracemalloc's total and its ten biggest growers by source line, since the first sample and since
the previous one), the asyncio tasks (by coroutine), open file descriptors and sockets, the entries of
each Kopf index, the size of every container a controller in ``memo`` keeps (its per-key state), and
the number of series of every metric. Off by default: tracemalloc costs CPU on every allocation and
memory per live block, and a sample blocks the event loop for as long as the heap takes to walk.

Each line is a sample of the process as it is, not an interpretation: the soak's report (bench/soak.py)
fits the slopes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import time
import tracemalloc
from collections.abc import Mapping, Sized
from pathlib import Path
from typing import Any

import kopf
import prometheus_client

from kopf_operators.core import metrics

logger = logging.getLogger("kopf_operators.diagnostics")

TOP = 10  # heap growers per sample
DEPTH = 3  # how deep into a controller's attributes its containers are counted
SPREAD = 8  # a map this small, keyed by names, is looked into: a map of parts by kind, not of objects


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def descriptors() -> dict[str, int]:
    """Open file descriptors, and how many of them are sockets (connections, listeners)."""
    fds = sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        fds += 1
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own descriptor)
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return {"fds": fds, "sockets": sockets}


def tasks() -> dict[str, Any]:
    names = collections.Counter(getattr(t.get_coro(), "__qualname__", "?") for t in asyncio.all_tasks())
    return {"total": sum(names.values()), "by_coroutine": dict(names.most_common(TOP))}


def index_sizes(indexes: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per Kopf index: its keys, and the values under them."""
    return {name: {"keys": len(index), "values": sum(len(store) for store in index.values())}
            for name, index in sorted(indexes.items())}


def container_sizes(obj: Any, prefix: str = "", depth: int = DEPTH, seen: set[int] | None = None) -> dict[str, int]:
    """The length of everything sized among ``obj``'s attributes, and, ``depth`` levels down, among
    those of the project's own objects it holds (not a library's: a session's or a loop's internals):
    a controller's per-key maps, sets, timers, backoffs, known versions. Each object once (``seen``:
    the access layer every part of a controller holds is counted where it is first met); Kopf's
    indexes are counted apart (``index_sizes``)."""
    sizes: dict[str, int] = {}
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return sizes
    seen.add(id(obj))
    try:
        attributes = vars(obj)
    except TypeError:
        return sizes
    for attr, value in attributes.items():
        if isinstance(value, kopf.Index | str | bytes | type) or id(value) in seen:
            continue
        name = f"{prefix}{attr}"
        if isinstance(value, Sized):
            with contextlib.suppress(Exception):  # a foreign object's __len__ may refuse
                sizes[name] = len(value)
        if depth <= 1:
            continue
        if isinstance(value, dict) and len(value) <= SPREAD:  # a map of parts (kind -> its versions), not of objects
            for key, item in list(value.items()):
                if isinstance(key, str) and ours(item):
                    sizes.update(container_sizes(item, f"{name}[{key}].", depth - 1, seen))
        elif ours(value):
            sizes.update(container_sizes(value, f"{name}.", depth - 1, seen))
    return sizes


def ours(value: Any) -> bool:
    """An object of the project's own classes (worth looking into for per-key state)."""
    return type(value).__module__.startswith("kopf_operators.") and hasattr(value, "__dict__")


def metric_series() -> tuple[dict[str, int], bool]:
    """Series (label sets; a histogram's buckets count once) per metric of the default registry, and
    whether this replica acts (its leader gauge: a standby's state differs from the holder's)."""
    series: dict[str, int] = {}
    for family in prometheus_client.REGISTRY.collect():
        label_sets = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in family.samples}
        series[family.name] = len(label_sets)
    acting = any(s.value == 1 for family in metrics.LEADER.collect() for s in family.samples)
    return series, acting


HeapStats = dict[str, tuple[int, int]]  # "file:line" -> (bytes, blocks)


def heap_stats() -> HeapStats:
    stats: HeapStats = {}
    for stat in tracemalloc.take_snapshot().statistics("lineno"):
        frame = stat.traceback[0]
        stats[f"{frame.filename}:{frame.lineno}"] = (stat.size, stat.count)
    return stats


def growers(now: HeapStats, then: HeapStats, top: int = TOP) -> list[dict[str, Any]]:
    """The ``top`` source lines whose live bytes grew most from ``then`` to ``now``."""
    diffs = [(size - then.get(where, (0, 0))[0], count - then.get(where, (0, 0))[1], where, size)
             for where, (size, count) in now.items()]
    diffs.sort(reverse=True)
    return [{"where": where, "grew_bytes": grew, "grew_blocks": blocks, "bytes": size}
            for grew, blocks, where, size in diffs[:top] if grew > 0]


class Sampler:
    """Samples the process every ``period`` seconds into ``path`` (one JSON line each)."""

    def __init__(self, path: Path, period: float, memo: Mapping[str, Any], indexes: Mapping[str, Any]) -> None:
        self.path = path
        self.period = period
        self.memo = memo
        self.indexes = dict(indexes)
        self.started = time.monotonic()
        self.first: HeapStats | None = None
        self.previous: HeapStats | None = None

    def sample(self) -> dict[str, Any]:
        began = time.perf_counter()
        heap = heap_stats() if tracemalloc.is_tracing() else {}
        self.first = heap if self.first is None else self.first
        previous, self.previous = self.previous if self.previous is not None else heap, heap
        traced, peak = tracemalloc.get_traced_memory()
        seen: set[int] = set()
        series, acting = metric_series()
        controllers = {name: container_sizes(obj, seen=seen) for name, obj in sorted(self.memo.items())
                       if hasattr(obj, "__dict__") and not isinstance(obj, type)}
        return {
            "time": time.time(), "acting": acting, "uptime_s": round(time.monotonic() - self.started, 1),
            "rss_kb": rss_kb(),
            "heap": {"traced_bytes": traced, "peak_bytes": peak, "growers_since_start": growers(heap, self.first),
                     "growers_since_last": growers(heap, previous)},
            "tasks": tasks(), **descriptors(), "indexes": index_sizes(self.indexes),
            "controllers": {name: sizes for name, sizes in controllers.items() if sizes},
            "metric_series": series, "sample_ms": round((time.perf_counter() - began) * 1000, 1),
        }

    def write(self) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(self.sample(), sort_keys=True) + "\n")

    async def run(self) -> None:
        while True:
            try:
                self.write()
            except Exception as exc:  # a diagnostics failure must never stop the operator
                logger.warning("Diagnostics sample failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.period)


def start(path: str, period: float, memo: Mapping[str, Any], indexes: Mapping[str, Any]) -> asyncio.Task[None]:
    """Start tracing and sampling; the task is the caller's to cancel at cleanup."""
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    sampler = Sampler(Path(path), period, memo, indexes)
    logger.info("Diagnostics on: a sample every %g s to %s (tracemalloc on)", period, path)
    return asyncio.create_task(sampler.run(), name="kopf-operators-diagnostics")
