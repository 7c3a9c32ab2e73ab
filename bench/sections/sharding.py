"""sharding: one process next to two and three hash shards, filtered by the API server (its shard
selector, the ShardedListAndWatch feature gate) and by each process (SHARD_FILTERING=client, what a
server without the gate gets), over the same objects on the same cluster: RSS of each process at rest,
CPU of all processes together per ConfigMap change, and the reaction p50 (an ImmortalContainer's pod
deleted -> its replacement ADDED)."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

from bench.harness import IC_PATH, Bench, Operator, log, within
from bench.kube import Watcher, bounded
from testsupport.paths import CLUSTER_DIR
from testsupport.stats import summary_ms

# What every shard process runs with, as the latency sections do (no re-roller throttling).
ENV = {"REROLLER_DEBOUNCE_SECONDS": "0", "REROLLER_MIN_INTERVAL_SECONDS": "0",
       "REROLLER_CLUSTER_ROLLOUTS_PER_SECOND": "0"}
POD = "shard-immortalpod"  # the pod of the ImmortalContainer "shard"


async def server_filters(b: Bench) -> bool:
    selector = "shardRange(object.metadata.uid, '0x0000000000000000', '0x0000000000000001')"
    page = await b.kube.get("/api/v1/configmaps", limit="5", shardSelector=selector)
    return not page.get("items")


async def populate(b: Bench, namespaces: int, configmaps: int) -> list[str]:
    names = [await b.namespace(f"bench-shard-{i}-{b.run}") for i in range(namespaces)]
    await bounded(32, [b.create_retrying(f"/api/v1/namespaces/{ns}/configmaps", {
        "metadata": {"name": f"cm-{j}"}, "data": {"k": "0"}}) for ns in names for j in range(configmaps)])
    await bounded(16, [b.create_retrying(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
        "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
        "metadata": {"name": "shard"}, "spec": {"image": "busybox:1.36"}}) for ns in names])
    return names


def start_shards(b: Bench, count: int, filtering: str) -> list[Operator]:
    procs = []
    for index in range(count):
        env = dict(ENV) if count == 1 else {**ENV, "SHARD_INDEX": str(index), "SHARD_COUNT": str(count),
                                            "SHARD_FILTERING": filtering}
        files = [f for f in b.files if index == 0 or "blackadder" not in f]  # as the chart loads them
        log_path = CLUSTER_DIR / "logs" / f"bench-shard-{count}-{filtering}-{index}-{b.run}.log"
        procs.append(Operator(b.sa_kubeconfig, env, log_path, files, b.root))
    for proc in procs:
        proc.start()
    return procs


def configmap_events(proc: Operator) -> int:
    """The ConfigMap events that reached the process's handlers and indexes (kopf_operators_events)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith('kopf_operators_events_total{') and 'resource="configmaps"' in line))


async def measure(b: Bench, names: list[str], count: int, filtering: str, pods: Watcher) -> dict[str, Any]:
    procs = start_shards(b, count, filtering)
    try:
        for proc in procs:
            await proc.settle(timeout=300)
        rss = [round(proc.status()["VmRSS"] / 1024, 1) for proc in procs]
        changes = b.n["shard_changes"]
        cpu = sum(proc.cpu_seconds() for proc in procs)
        seen = [configmap_events(proc) for proc in procs]
        started = time.monotonic()
        await bounded(32, [b.kube.merge_patch(f"/api/v1/namespaces/{names[i % len(names)]}/configmaps/"
                                              f"cm-{(i // len(names)) % b.n['shard_configmaps']}",
                                              {"data": {"k": f"{count}-{filtering}-{i}"}})  # a real change
                                 for i in range(changes)])
        for proc in procs:
            await proc.settle(timeout=300)
        cpu_ms = (sum(proc.cpu_seconds() for proc in procs) - cpu) * 1000
        seen = [configmap_events(proc) - before for proc, before in zip(procs, seen, strict=True)]
        seconds = time.monotonic() - started
        reactions: list[float] = []
        for ns in names[:b.n["shard_reactions"]]:
            created = pods.expect(lambda t, o, _, ns=ns: t == "ADDED" and o["metadata"]["namespace"] == ns
                                  and o["metadata"]["name"] == POD)
            await b.kube.delete(f"/api/v1/namespaces/{ns}/pods/{POD}", {"gracePeriodSeconds": 0})
            t0 = time.monotonic()
            reactions.append(await within(created, 60, f"a new pod in {ns}") - t0)
        return {"rss_mb": rss, "cpu_ms_per_change": round(cpu_ms / changes, 3), "configmap_events": seen,
                "changes_seconds": round(seconds, 1), "reaction": summary_ms(reactions)}
    finally:
        for proc in procs:
            proc.stop()


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("immortal"):
        return skipped
    server = await server_filters(b)
    pods = await Watcher(b.kube, "/api/v1/pods").start()
    first: set[str] = set()
    everyone = asyncio.Event()

    def first_pod(type_: str, obj: dict[str, Any], _: float) -> None:
        if type_ == "ADDED" and obj["metadata"]["name"] == POD:
            first.add(obj["metadata"]["namespace"])
            if len(first) >= b.n["shard_namespaces"]:
                everyone.set()

    pods.listeners.append(first_pod)
    names = await populate(b, b.n["shard_namespaces"], b.n["shard_configmaps"])
    await within(everyone.wait(), 300, "every ImmortalContainer's first pod (the run's unsharded operator)")
    pods.listeners.remove(first_pod)
    b.stop_operator()
    out: dict[str, Any] = {"server_filters_shards": server, "namespaces": len(names),
                           "configmaps": len(names) * b.n["shard_configmaps"], "ics": len(names)}
    try:
        for count, filtering in ((1, "-"), (2, "server"), (2, "client"), (3, "server"), (3, "client")):
            key = f"{count}_{filtering}" if count > 1 else "1"
            if filtering == "server" and not server:
                out[key] = {"skipped": "the API server does not filter by shard selectors"}
                continue
            log(f"  {count} process(es), filtered by {filtering}")
            out[key] = await measure(b, names, count, filtering, pods)
            log(f"  {key}: {out[key]}")
    finally:
        await pods.stop()
        b.start_operator(b.operator_env)
        await b.cleanup(names)
    out["what"] = ("RSS of each process at rest over the objects; CPU of all processes per ConfigMap change "
                   "(merge patches, spread over the namespaces); reaction: pod deleted -> replacement ADDED")
    return out


