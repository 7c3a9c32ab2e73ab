"""The benchmark's sections, one module each; ``SECTIONS`` is the order a full run takes.

Each section is ``async def run(b: Bench) -> dict`` (bench/harness.py): it works in namespaces of its
own and deletes them at its end; an exception is recorded as the section's error and the run goes on.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from bench.harness import Bench

Section = Callable[[Bench], Awaitable[dict[str, Any]]]

# name -> "module:function"
SECTIONS: dict[str, str] = {
    "idle": "idle:run",
    "immortal_latency": "immortal_latency:run",
    "copyrator_latency": "copyrator_latency:run",
    "reroller_latency": "reroller_latency:run",
    "immortal_convergence": "immortal_convergence:run",
    "copyrator_convergence": "copyrator_convergence:run",
    "reroller_convergence": "reroller_convergence:run",
    "reroller_latency_defaults": "reroller_latency:run_defaults",
    "reroller_fairness": "reroller_fairness:run",
    "reroller_waves": "reroller_waves:run",
    "tenant_abuse": "tenant_abuse:run",
    "memory": "memory:run",
    "restart_configmaps": "restart_configmaps:run",
    "push_bytes": "push_bytes:run",
    "takeover": "takeover:run",
    "quiet_logs": "quiet_logs:run",
    "scale": "scale:run",
    "sharding": "sharding:run",
    "peers": "go_peers:run",  # side by side with the Go peers
}


def get(name: str) -> Section:
    module, _, function = SECTIONS[name].partition(":")
    fn: Section = getattr(importlib.import_module(f"bench.sections.{module}"), function)
    return fn
