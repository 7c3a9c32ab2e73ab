"""memory: RSS after a fresh start with one object per operator (idle), then growth with 10,000 unrelated
pods and 2,500 ConfigMaps + 2,500 Secrets, once the process is quiet again; then a start of a new process
with those objects in place (time until quiet, high-water mark against the chart's limit)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import yaml

from bench.harness import Bench
from bench.kube import bounded
from testsupport.paths import REPO

IDLE_TARGET_MB = 85
GROWTH_TARGET_MB = 15


def chart_limit_mb() -> float:
    """The chart's memory limit (values.yaml, resources.limits.memory, in Mi) in MB."""
    values = yaml.safe_load((REPO / "charts" / "kopf-operators" / "values.yaml").read_text())
    limit = str(values["resources"]["limits"]["memory"])
    if not limit.endswith("Mi"):
        raise ValueError(f"resources.limits.memory {limit!r}: the bench reads Mi only")
    return int(limit.removesuffix("Mi")) * 1.048576


CHART_LIMIT_MB = chart_limit_mb()


async def run(b: Bench) -> dict[str, Any]:
    b.restart_operator()
    assert b.operator
    warm = await b.steady_state("mem")
    await asyncio.sleep(5)
    await b.operator.settle()
    idle = b.operator.status()
    ns_pods = await b.namespace(f"bench-mem-pods-{b.run}")
    ns_cfg = await b.namespace(f"bench-mem-cfg-{b.run}")
    t0 = time.monotonic()
    pod_body = {"metadata": {"labels": {"app": "unrelated"}},
                "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "c", "image": "busybox:1.36"}]}}

    async def pod(j: int) -> None:
        body = json.loads(json.dumps(pod_body))
        body["metadata"]["name"] = f"p-{j}"
        await b.create_retrying(f"/api/v1/namespaces/{ns_pods}/pods", body)

    async def cm(j: int) -> None:
        await b.create_retrying(f"/api/v1/namespaces/{ns_cfg}/configmaps",
                                {"metadata": {"name": f"cm-{j}"}, "data": {"key": f"value-{j}" * 8}})

    async def secret(j: int) -> None:
        await b.create_retrying(f"/api/v1/namespaces/{ns_cfg}/secrets",
                                {"metadata": {"name": f"s-{j}"}, "stringData": {"key": f"value-{j}" * 8}})

    await bounded(64, [pod(j) for j in range(b.n["pods"])])
    pods_s = time.monotonic() - t0
    await bounded(64, [cm(j) for j in range(b.n["configmaps"])] + [secret(j) for j in range(b.n["secrets"])])
    created_s = time.monotonic() - t0
    await asyncio.sleep(5)
    settle = await b.operator.settle(timeout=300)
    after = b.operator.status()
    growth = (after["VmRSS"] - idle["VmRSS"]) / 1024
    result = {"idle_rss_mb": round(idle["VmRSS"] / 1024, 1), "idle_hwm_mb": round(idle["VmHWM"] / 1024, 1),
              "loaded_rss_mb": round(after["VmRSS"] / 1024, 1), "loaded_hwm_mb": round(after["VmHWM"] / 1024, 1),
              "growth_mb": round(growth, 1),
              "objects": {"pods": b.n["pods"], "configmaps": b.n["configmaps"], "secrets": b.n["secrets"]},
              "pods_created_s": round(pods_s, 1), "all_created_s": round(created_s, 1),
              "settled_after_s": round(settle, 1), "operator_files": b.files,
              "target_idle_mb": IDLE_TARGET_MB, "target_growth_mb": GROWTH_TARGET_MB,
              "target_idle": idle["VmRSS"] / 1024 <= IDLE_TARGET_MB, "target_growth": growth <= GROWTH_TARGET_MB}
    # A start (restart, upgrade, takeover) with these objects in place: what sets the memory limit.
    quiet_after, start = await b.start_with_objects_in_place()
    result["start_with_objects"] = {
        "quiet_after_s": round(quiet_after, 1),
        "rss_mb": round(start["VmRSS"] / 1024, 1), "hwm_mb": round(start["VmHWM"] / 1024, 1),
        "chart_limit_mb": CHART_LIMIT_MB, "within_limit": start["VmHWM"] / 1024 <= CHART_LIMIT_MB}
    await b.kube.delete(f"/apis/flant.com/v1/namespaces/{warm}/copyrators/idle")
    await b.gone(f"/apis/flant.com/v1/namespaces/{warm}/copyrators/idle", 60)
    await b.cleanup([ns_pods, ns_cfg, warm], wait=300)
    return result
