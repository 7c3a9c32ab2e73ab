"""reroller_fairness: one namespace flaps m rollouts at once (one ConfigMap used by m Deployments); a
moment later a ConfigMap used by one Deployment in a quiet namespace is edited. Measured: the quiet
namespace's rollout latency (edit -> pod template changed) during the flood, next to the same edit with
no flood, against one token interval of the cluster-wide budget (the operator at the shipped rate and
burst, no debounce or minimum interval, so the budget alone paces the flood)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness import RR, Bench, deployment, log, within
from bench.kube import Watcher, bounded
from bench.sections.reroller_latency import template_annotations
from testsupport.stats import summary_ms

RATE, BURST = 20.0, 40.0  # the shipped REROLLER_CLUSTER_ROLLOUTS_PER_SECOND / _BURST
ENV = {"REROLLER_DEBOUNCE_SECONDS": "0", "REROLLER_MIN_INTERVAL_SECONDS": "0",
       "REROLLER_CLUSTER_ROLLOUTS_PER_SECOND": str(RATE), "REROLLER_CLUSTER_BURST": str(BURST)}


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("reroller"):
        return skipped
    m, rounds = b.n["fairness_deployments"], b.n["fairness_rounds"]
    b.restart_operator(env=ENV)
    try:
        return await _measure(b, m, rounds)
    finally:
        b.restart_operator()


async def _measure(b: Bench, m: int, rounds: int) -> dict[str, Any]:
    flapping = await b.namespace(f"bench-rrf-flap-{b.run}")
    quiet = await b.namespace(f"bench-rrf-quiet-{b.run}")
    for ns in (flapping, quiet):
        await b.kube.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "cfg"}, "data": {"v": "0"}})
    templates: dict[tuple[str, str], dict[str, str]] = {}
    baselined: set[tuple[str, str]] = set()

    def listener(t: str, o: dict[str, Any], _: float) -> None:
        key = (o["metadata"]["namespace"], o["metadata"]["name"])
        templates[key] = template_annotations(o)
        if f"{RR}/observed-hash" in (o["metadata"].get("annotations") or {}):
            baselined.add(key)

    watchers = []
    for ns in (flapping, quiet):
        w = Watcher(b.kube, f"/apis/apps/v1/namespaces/{ns}/deployments")
        w.listeners.append(listener)
        watchers.append(await w.start())
    flap_w, quiet_w = watchers
    base = flap_w.expect(lambda t, o, _: sum(1 for k in baselined if k[0] == flapping) >= m)
    await bounded(32, [b.kube.create(f"/apis/apps/v1/namespaces/{flapping}/deployments",
                                     deployment(f"f-{j}", "cfg", True)) for j in range(m)]
                  + [b.kube.create(f"/apis/apps/v1/namespaces/{quiet}/deployments", deployment("q", "cfg", True))])
    try:
        await within(base, 300, f"the baselines of {m + 1} Deployments")
    except TimeoutError:
        log(f"  {len(baselined)}/{m + 1} baselined: waiting for the operator's quiet")
    assert b.operator
    await b.operator.settle()

    async def quiet_rollout(value: str) -> float:
        """Edit the quiet namespace's ConfigMap: seconds until its Deployment's template changes."""
        before = dict(templates.get((quiet, "q")) or {})
        done = quiet_w.expect(lambda t, o, _: o["metadata"]["name"] == "q" and template_annotations(o) != before)
        t0 = time.monotonic()
        await b.kube.merge_patch(f"/api/v1/namespaces/{quiet}/configmaps/cfg", {"data": {"v": value}})
        return float(await within(done, 120, "the quiet namespace's rollout")) - t0

    alone: list[float] = []
    flooded: list[float] = []
    flood_s: list[float] = []
    for i in range(1, rounds + 1):
        alone.append(await quiet_rollout(f"alone-{i}"))
        await asyncio.sleep(1 / RATE * BURST + 1)  # the bucket full again
        was = {k: dict(v) for k, v in templates.items() if k[0] == flapping}
        flood = flap_w.expect(lambda t, o, _, was=was: sum(1 for k, v in templates.items()
                                                           if k[0] == flapping and v != was.get(k)) >= m)
        t0 = time.monotonic()
        await b.kube.merge_patch(f"/api/v1/namespaces/{flapping}/configmaps/cfg", {"data": {"v": str(i)}})
        # In the middle of the flood: the burst is spent and the rest waits at the rate.
        await asyncio.sleep(min(1.0, (m - BURST) / RATE / 2) if m > BURST else 0.2)
        flooded.append(await quiet_rollout(f"flooded-{i}"))
        flood_s.append(float(await within(flood, 600, f"{m} flapping rollouts")) - t0)
        await b.operator.settle()
    for w in watchers:
        await w.stop()
    await b.cleanup([flapping, quiet], wait=300)
    interval_ms = 1000 / RATE
    delay = [(f - a) * 1000 for f, a in zip(flooded, alone, strict=True)]
    worst = max(f * 1000 for f in flooded) - min(a * 1000 for a in alone)
    return {
        "what": (f"{m} rollouts flooding one namespace at once (rate {RATE:g}/s, burst {BURST:g}); meanwhile one "
                 f"ConfigMap edited in another namespace -> its Deployment's pod template changed; {rounds} rounds, "
                 "each with the same edit alone first"),
        "alone": summary_ms(alone),
        "flooded": summary_ms(flooded),
        "extra_delay": summary_ms([d / 1000 for d in delay]),
        "token_interval_ms": interval_ms,
        "flood_s": round(max(flood_s), 2),
        "flood_floor_s": round(max(0.0, (m - BURST) / RATE), 2),
        "unfair_wait_s": round(max(0.0, (m - BURST) / RATE - 1.0), 2),
        "target_within_one_interval": worst <= interval_ms,
        "worst_extra_ms": round(worst, 1),
    }
