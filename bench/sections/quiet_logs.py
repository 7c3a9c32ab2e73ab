"""quiet_logs: lines the operator writes at the default log level (no --verbose) while the harness makes
45 changes to objects no operator cares about (target: none).

The changes: ConfigMaps, Secrets, Deployments (not opted in), pods (not an ImmortalContainer's) and
namespaces (matching no CopyratorRule): each created, edited (a label) and deleted, 3 of each kind, in a
namespace of their own, with one object per operator present (the steady state).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness import Bench, deployment

TARGET_LINES = 0


async def run(b: Bench) -> dict[str, Any]:
    assert b.operator
    warm = await b.steady_state("logs")
    ns = await b.namespace(f"bench-logs-{b.run}")
    await asyncio.sleep(3)
    await b.operator.settle()
    offset = b.operator.log_size()
    per_kind = max(1, b.n["unrelated_changes"] // 15)
    kinds: dict[str, tuple[str, Any]] = {
        "configmap": (f"/api/v1/namespaces/{ns}/configmaps", lambda name: {"metadata": {"name": name},
                                                                            "data": {"k": "v"}}),
        "secret": (f"/api/v1/namespaces/{ns}/secrets", lambda name: {"metadata": {"name": name},
                                                                      "stringData": {"k": "v"}}),
        "deployment": (f"/apis/apps/v1/namespaces/{ns}/deployments",
                       lambda name: deployment(name, "absent", False)),
        "pod": (f"/api/v1/namespaces/{ns}/pods",
                lambda name: {"metadata": {"name": name},
                              "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}),
        "namespace": ("/api/v1/namespaces", None),
    }
    changes = 0
    t0 = time.monotonic()
    for kind, (path, body) in kinds.items():
        names = [f"unrelated-{kind}-{j}" for j in range(per_kind)]
        for name in names:
            if kind == "namespace":
                name = f"bench-logs-{b.run}-{name}"
                await b.namespace(name)
                await b.kube.merge_patch(f"{path}/{name}", {"metadata": {"labels": {"edited": "yes"}}})
                await b.kube.delete(f"{path}/{name}")
            else:
                await b.kube.create(path, body(name))
                await b.kube.merge_patch(f"{path}/{name}", {"metadata": {"labels": {"edited": "yes"}}})
                await b.kube.delete(f"{path}/{name}", {"gracePeriodSeconds": 0})
            changes += 3
    made_s = time.monotonic() - t0
    await asyncio.sleep(5)
    await b.operator.settle()
    lines = b.operator.log_lines_since(offset)
    await b.end_steady_state(warm)
    await b.cleanup([ns])
    return {"changes": changes, "changes_made_s": round(made_s, 1), "lines": len(lines),
            "sample": lines[:20], "target_lines": TARGET_LINES, "target": len(lines) <= TARGET_LINES,
            "log_level": "default (info; no --verbose)",
            "what": f"{changes} changes (create, label edit, delete) to ConfigMaps, Secrets, Deployments not "
                    "opted in, pods of no ImmortalContainer and namespaces of no rule -> lines in the "
                    "operator's stdout+stderr"}
