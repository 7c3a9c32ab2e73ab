"""Summarise a ``py-spy record --format raw --threads`` profile (BENCH_PYSPY) by where the event loop's
busy time goes, in percent of its busy samples (the machine is shared, so absolute times mean little).
Each sample is counted once, in the first bucket one of its frames matches (project code first, so
an indexer's own work counts as the project's, not as Kopf's indexing machinery).

    .venv/bin/python -m bench.profile_summary /tmp/profile.txt [/tmp/other-profile.txt ...]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

IDLE = "idle: waiting in select()"
BUCKETS: list[tuple[str, str]] = [
    (IDLE, "EpollSelector.select"),
    ("project: immortal handlers, controller, decisions (indexers included)", "kopf_operators/immortal/"),
    ("project: access layer, metrics (event-loop side)", "kopf_operators/core/"),
    ("kopf: indexing machinery (index_resource)", "index_resource (kopf/"),
    ("kopf: cause detection, diff base (_detect_causes)", "_detect_causes (kopf/"),
    ("kopf: handler invocation machinery (execute_handlers_once)", "execute_handlers_once (kopf/"),
    ("kopf: event poster (posting.py)", "kopf/_core/engines/posting.py"),
    ("kopf: watch streams, JSON decoding (watching.py)", "kopf/_cogs/clients/watching.py"),
    ("kopf: per-object worker, the rest (memories, loggers, patch)", "worker (kopf/_core/reactor/queueing.py"),
    ("kopf: queueing, watcher side", "kopf/_core/reactor/queueing.py"),
    ("asyncio: sockets/TLS of the watches, thread hand-offs, timers", ""),
]


def summarise(path: Path) -> str:
    counts: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames, n = stack.split(";"), int(count)
        main = frames[0].endswith(": MainThread")
        threads["event loop" if main else "worker threads"] += n
        if not main:
            continue
        for label, needle in BUCKETS:
            if not needle or any(needle in frame for frame in frames[1:]):
                counts[label] += n
                if label != IDLE:
                    leaves[frames[-1]] += n
                break
    loop = threads["event loop"]
    busy = max(loop - counts[IDLE], 1)
    out = [f"{path}: {sum(threads.values())} samples; event loop {loop}, busy in {100 * busy / max(loop, 1):.0f}% "
           f"of them; worker threads {threads['worker threads']} (mostly waiting on the API server's answers)", "",
           "| where the event loop's busy time goes | % |", "|---|---|"]
    out += [f"| {label} | {100 * counts[label] / busy:.1f} |" for label, _ in BUCKETS[1:]]
    out += ["", "| top leaf frames (busy) | % |", "|---|---|"]
    out += [f"| `{frame}` | {100 * n / busy:.1f} |" for frame, n in leaves.most_common(10)]
    return "\n".join(out)


if __name__ == "__main__":
    print("\n\n".join(summarise(Path(arg)) for arg in sys.argv[1:]))
