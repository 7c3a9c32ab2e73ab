"""Summarise a ``py-spy record --format raw --threads`` profile (BENCH_PYSPY) by where the event loop's
time goes, in percent of its samples (the machine is shared, so absolute times mean little).

    .venv/bin/python -m bench.profile_summary /tmp/profile.txt
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# (label, a substring of a frame): a sample counts for every label one of its frames matches (inclusive).
CATEGORIES: list[tuple[str, str]] = [
    ("kopf: per-object worker (queueing.worker), all below", "worker (kopf/_core/reactor/queueing.py"),
    ("kopf: indexing (index_resource: indexer call + index update)", "index_resource (kopf/_core/engines/indexing.py"),
    ("kopf: cause detection (_detect_causes: diff-base build and diff)", "_detect_causes (kopf/"),
    ("kopf: on.event handlers (process_watching_cause), all below", "process_watching_cause (kopf/"),
    ("kopf: handler invocation machinery (execute_handlers_once)", "execute_handlers_once (kopf/"),
    ("kopf: patch application (application.apply)", "apply (kopf/_core/actions/application.py"),
    ("kopf: watch stream (watching.py: reading and JSON decoding)", "kopf/_cogs/clients/watching.py"),
    ("kopf: queueing and batching (watcher/worker glue)", "kopf/_core/reactor/queueing.py"),
    ("kopf: event poster (posting.py)", "kopf/_core/engines/posting.py"),
    ("kopf: object loggers (loggers.py)", "kopf/_core/actions/loggers.py"),
    ("logging (stdlib)", "logging/__init__.py"),
    ("json (stdlib)", "json/"),
    ("copy.deepcopy", "deepcopy (copy.py"),
    ("project: immortal controller", "kopf_operators/immortal/controller.py"),
    ("project: immortal decisions", "kopf_operators/immortal/decisions.py"),
    ("project: access layer (event loop side)", "kopf_operators/core/access.py"),
    ("project: operators/immortal.py handlers", "operators/immortal.py"),
    ("project: metrics (prometheus_client)", "prometheus_client/"),
    ("aiohttp", "aiohttp/"),
]


def summarise(path: Path) -> str:
    per_thread: Counter[str] = Counter()
    loop: Counter[str] = Counter()
    loop_total = 0
    leaf: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1]
        per_thread["MainThread (event loop)" if thread == "MainThread" else "worker threads"] += n
        if thread != "MainThread":
            continue
        loop_total += n
        leaf[frames[-1]] += n
        for label, needle in CATEGORIES:
            if any(needle in f for f in frames[1:]):
                loop[label] += n
    total = sum(per_thread.values())
    out = [f"samples: {total} (event loop {per_thread['MainThread (event loop)']}, "
           f"worker threads {per_thread['worker threads']})", "",
           "| where (inclusive) | % of the event loop's samples |", "|---|---|"]
    for label, _ in CATEGORIES:
        out.append(f"| {label} | {100 * loop[label] / max(loop_total, 1):.1f} |")
    out += ["", "| top leaf frames | % |", "|---|---|"]
    for frame, n in leaf.most_common(15):
        out.append(f"| `{frame}` | {100 * n / max(loop_total, 1):.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(summarise(Path(sys.argv[1])))
