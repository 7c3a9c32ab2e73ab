"""copyrator_latency: source edited -> all 5 copies updated; namespace created -> copy exists.
Operator and floor alternate event by event, each on objects of its own."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from bench.harness import BENCH_LABEL, FLOOR_LABEL, RULE_PATH, Bench, Floor, latency, timed_change, within
from bench.kube import Watcher


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("copyrator"):
        return skipped
    n = b.n["events"]
    run_id = b.run
    src = await b.namespace(f"bench-cpl-{run_id}")
    await b.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
        "metadata": {"name": "lat-src", "labels": {"bench-copy": run_id}}, "data": {"v": "0"}})
    await b.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
        "metadata": {"name": "floor-src"}, "data": {"v": "0"}})
    await b.kube.create(f"{RULE_PATH}/namespaces/{src}/copyrators", {
        "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "lat"},
        "spec": {"ruleType": "configmap", "selector": {"bench-copy": run_id}, "namespace": [src],
                 "namespaceSelector": {"matchLabels": {"bench-cpl-target": f"op-{run_id}"}}}})
    # The copies carry their source's name; the sources' own namespace is left out by the predicates.
    op_cms = await Watcher(b.kube, "/api/v1/configmaps", {"fieldSelector": "metadata.name=lat-src"}).start()
    floor_cms = await Watcher(b.kube, "/api/v1/configmaps", {"labelSelector": f"{FLOOR_LABEL}=copy"}).start()
    sources = await Watcher(b.kube, f"/api/v1/namespaces/{src}/configmaps").start()
    nss = await Watcher(b.kube, "/api/v1/namespaces", {"labelSelector": f"{BENCH_LABEL}={run_id}"}).start()
    created: list[str] = []
    results: dict[str, Any] = {}
    async with Floor("copyrator", "--source-namespace", src, "--source", "floor-src",
                     "--ns-label", f"bench-cpl-target=floor-{run_id}", "--copy-name", "floor-src"):
        # 1. source edited -> copies updated, with K target namespaces per side
        k = 5
        for side, watcher in (("op", op_cms), ("floor", floor_cms)):
            waits = [watcher.expect(lambda t, o, _, ns=f"bench-cpe-{run_id}-{side}-{j}":
                                    o["metadata"]["namespace"] == ns) for j in range(k)]
            for j in range(k):
                created.append(await b.namespace(f"bench-cpe-{run_id}-{side}-{j}",
                                                 {"bench-cpl-target": f"{side}-{run_id}"}))
            await within(asyncio.gather(*waits), 60, f"{side} copies into the first namespaces")
        op_lat: list[float] = []
        floor_lat: list[float] = []
        audit: Counter[str] = Counter()
        for i in range(1, n + 1):
            for side in (("op", "floor") if i % 2 else ("floor", "op")):
                watcher, name = (op_cms, "lat-src") if side == "op" else (floor_cms, "floor-src")
                value = str(i)
                seen: set[str] = set()

                def all_updated(t: str, o: dict[str, Any], _: float, value: str = value,
                                seen: set[str] = seen) -> bool:
                    if ((o.get("data") or {}).get("v") == value and t != "DELETED"
                            and o["metadata"]["namespace"] != src):
                        seen.add(o["metadata"]["namespace"])
                    return len(seen) >= k

                done = watcher.expect(all_updated)
                edited = sources.expect(lambda t, o, _, name=name, value=value: o["metadata"]["name"] == name
                                        and (o.get("data") or {}).get("v") == value)
                await timed_change(b, b.kube.merge_patch(f"/api/v1/namespaces/{src}/configmaps/{name}",
                                                         {"data": {"v": value}}),
                                   done, edited, f"{side} copies of v={value}",
                                   op_lat if side == "op" else floor_lat, audit if side == "op" else None)
        results["source_edited"] = latency(
            op_lat, floor_lat, audit, n,
            f"source ConfigMap edited (from the PATCH response) -> all {k} copies show the new data on a watch")
        results["source_edited"]["copies"] = k
        # 2. namespace created -> copy exists
        op_lat, floor_lat, audit = [], [], Counter()
        for i in range(n):
            for side in (("op", "floor") if i % 2 == 0 else ("floor", "op")):
                watcher = op_cms if side == "op" else floor_cms
                ns = f"bench-cpn-{run_id}-{side}-{i}"
                done = watcher.expect(lambda t, o, _, ns=ns: o["metadata"]["namespace"] == ns)
                added = nss.expect(lambda t, o, _, ns=ns: t == "ADDED" and o["metadata"]["name"] == ns)
                await timed_change(b, b.namespace(ns, {"bench-cpl-target": f"{side}-{run_id}"}),
                                   done, added, f"the {side} copy in {ns}",
                                   op_lat if side == "op" else floor_lat, audit if side == "op" else None)
                created.append(ns)
        results["namespace_created"] = latency(
            op_lat, floor_lat, audit, n, "namespace created (from the POST response) -> the copy ADDED on a watch")
    for w in (op_cms, floor_cms, sources, nss):
        await w.stop()
    await b.kube.delete(f"{RULE_PATH}/namespaces/{src}/copyrators/lat")
    await b.gone(f"{RULE_PATH}/namespaces/{src}/copyrators/lat", 120)
    await b.cleanup([src, *created])
    return results
