"""push_bytes: a tenant's n ConfigMaps of ~1 MiB each (random data, one namespace), each with a
Copyrator ``push-to`` annotation naming namespaces that never consented; then a new operator process
starts over them (a restart, an upgrade, a takeover): its high-water mark (VmHWM) and its RSS once
quiet, against the chart's memory limit. What a tenant who may write only its own ConfigMaps can make
the shared process hold. The operator is stopped while the ConfigMaps are created (8 requests in
flight: ~1 MiB each); the section deletes them (and their namespace) at its end.

``BENCH_BASELINE_ROOT=<checkout>`` also starts that checkout's operator over the same objects first
(the figure before a change), so the 700 MiB are written to etcd once for both."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

from bench.harness import Bench, Operator, log
from bench.kube import bounded
from bench.sections.memory import CHART_LIMIT_MB
from kopf_operators.copyrator.rules import PUSH_TO_ANNOTATION
from testsupport.paths import CLUSTER_DIR

# Just under the API server's 1 MiB (1,048,576 bytes) per ConfigMap, metadata included.
DATA_BYTES = 1_040_000


async def start_over(b: Bench, root: Path, label: str) -> dict[str, Any]:
    """A fresh operator process of ``root`` over what is in place: its high-water mark and RSS once quiet."""
    b.stop_operator()
    started = time.monotonic()
    operator = Operator(b.sa_kubeconfig, b.operator_env, CLUSTER_DIR / "logs" / f"bench-operator-{b.run}-{label}.log",
                        b.files, root)
    operator.start(timeout=600)
    try:
        settle = await operator.settle(window=5.0, timeout=900)
        quiet = operator.status()
    finally:
        operator.stop()
    hwm = quiet["VmHWM"] / 1024
    return {"root": str(root), "quiet_after_s": round(time.monotonic() - started, 1), "settle_s": round(settle, 1),
            "hwm_mb": round(hwm, 1), "rss_mb": round(quiet["VmRSS"] / 1024, 1),
            "within_limit": hwm <= CHART_LIMIT_MB}


async def run(b: Bench) -> dict[str, Any]:
    n = b.n["push_bytes_configmaps"]
    b.stop_operator()
    ns = await b.namespace(f"bench-pushb-{b.run}")
    never = [await b.namespace(f"bench-pushb-{b.run}-{i}") for i in range(3)]  # they never consent
    t0 = time.monotonic()

    async def cm(j: int) -> None:
        data = base64.b64encode(os.urandom(DATA_BYTES * 3 // 4)).decode()  # incompressible, unique
        await b.create_retrying(f"/api/v1/namespaces/{ns}/configmaps", {
            "metadata": {"name": f"big-{j}", "annotations": {PUSH_TO_ANNOTATION: f"{never[0]},bench-pushb-*"}},
            "data": {"blob": data}})

    try:
        await bounded(8, [cm(j) for j in range(n)])
        created_s = time.monotonic() - t0
        log(f"  {n} ConfigMaps of {DATA_BYTES:,} bytes created in {created_s:.0f} s")
        result: dict[str, Any] = {
            "what": (f"{n} ConfigMaps of {DATA_BYTES:,} bytes of random data in one namespace, each pushing "
                     f"(push-to) to namespaces that never consented; a new operator process (all operators, "
                     f"the chart's defaults) starts over them"),
            "configmaps": n, "data_bytes": DATA_BYTES, "created_s": round(created_s, 1),
            "chart_limit_mb": CHART_LIMIT_MB}
        if baseline := os.environ.get("BENCH_BASELINE_ROOT"):
            result["baseline"] = await start_over(b, Path(baseline), "baseline")
            log(f"  baseline: {result['baseline']}")
        result["start"] = await start_over(b, b.root, "ours")
        return result
    finally:
        await b.cleanup([ns, *never], wait=600)
        b.start_operator(b.operator_env)
