"""The floor: minimal clients that watch the same event and make the same write as an operator.

Each mode is the fastest reasonable hand-written controller for one benchmark: one asyncio process,
raw aiohttp watches (bench/kube.py), no framework, no extra reads, state kept from its own watches,
writes at most ``--concurrency`` in flight (16, as the operator's thread pool). The harness starts it
as a subprocess (``python -m bench.floor MODE ...``) and waits for the line ``ready`` on stdout.

Modes:
  immortal   pods labelled bench.kopf-operators.dev/floor=immortal in --namespace: on DELETED, create
             a pod with the same name, labels and containers (what the immortal operator does).
  immortal-cr  ImmortalContainers in --namespace: on ADDED, create the pod and patch status
             startTimes=1 (the immortal operator's writes on creation; run with the operator stopped).
  copyrator  namespaces labelled --ns-label: copy ConfigMap --source (in --source-namespace) into each
             as --copy-name, on a new namespace and on every change of the source's data.
  reroller   Deployments labelled --workload-label in --namespace: when ConfigMap --source's data
             changes, merge-patch each pod template's annotation (what the re-roller does). With
             --cluster-wide it watches every Deployment and ConfigMap of the cluster and picks its
             own client-side, as a re-roller must (opt-in is an annotation: no server-side selector),
             so it decodes a flood in another namespace as the operator does.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from typing import Any

from bench.kube import ApiError, Kube

FLOOR_LABEL = "bench.kopf-operators.dev/floor"
IC_PATH = "/apis/immortalcontainer.flugel.it/v1alpha1"


def _ready() -> None:
    print("ready", flush=True)


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


async def immortal(kube: Kube, ns: str, concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def recreate(pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": meta["name"], "labels": meta.get("labels") or {}},
                "spec": {"containers": [{"name": c["name"], "image": c["image"]}
                                        for c in pod["spec"]["containers"]]}}
        async with sem:
            try:
                await kube.create(f"/api/v1/namespaces/{ns}/pods", body)
            except ApiError as exc:
                if exc.status != 409:
                    print(f"floor: {exc}", file=sys.stderr)

    params = {"labelSelector": f"{FLOOR_LABEL}=immortal"}
    tasks: set[asyncio.Task[None]] = set()
    listing = await kube.get(f"/api/v1/namespaces/{ns}/pods", **params)
    _ready()
    async for type_, obj, _ in kube.stream(f"/api/v1/namespaces/{ns}/pods", params,
                                           resource_version=listing["metadata"]["resourceVersion"]):
        if type_ == "DELETED":
            task = asyncio.create_task(recreate(obj))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


async def immortal_cr(kube: Kube, ns: str, concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)
    path = f"{IC_PATH}/namespaces/{ns}/immortalcontainers"

    async def start(ic: dict[str, Any]) -> None:
        meta = ic["metadata"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{meta['name']}-immortalpod", "labels": {"controller": meta["name"]},
                            "ownerReferences": [{"apiVersion": ic["apiVersion"], "kind": ic["kind"],
                                                 "name": meta["name"], "uid": meta["uid"], "controller": True}]},
               "spec": {"containers": [{"name": "acontainer", "image": ic["spec"]["image"]}]}}
        async with sem:
            try:
                await kube.create(f"/api/v1/namespaces/{ns}/pods", pod)
                await kube.merge_patch(f"{path}/{meta['name']}/status", {"status": {"startTimes": 1}})
            except ApiError as exc:
                print(f"floor: {exc}", file=sys.stderr)

    tasks: set[asyncio.Task[None]] = set()
    listing = await kube.get(path)
    _ready()
    async for type_, obj, _ in kube.stream(path, resource_version=listing["metadata"]["resourceVersion"]):
        if type_ == "ADDED" and not (obj.get("status") or {}).get("startTimes"):
            task = asyncio.create_task(start(obj))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


async def copyrator(kube: Kube, source_ns: str, source: str, ns_label: str, copy_name: str,
                    concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)
    namespaces: set[str] = set()
    copied: dict[str, str] = {}  # namespace -> data hash written
    state: dict[str, Any] = {"data": None}

    async def write(ns: str) -> None:
        data = state["data"]
        if data is None or copied.get(ns) == _hash(data):
            return
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": copy_name, "namespace": ns, "labels": {FLOOR_LABEL: "copy"}},
                "data": data}
        async with sem:
            try:
                if ns in copied:
                    await kube.request("PUT", f"/api/v1/namespaces/{ns}/configmaps/{copy_name}", body)
                else:
                    await kube.create(f"/api/v1/namespaces/{ns}/configmaps", body)
                copied[ns] = _hash(data)
            except ApiError as exc:
                if exc.status == 409:
                    await kube.request("PUT", f"/api/v1/namespaces/{ns}/configmaps/{copy_name}", body)
                    copied[ns] = _hash(data)
                elif exc.status not in (403, 404):  # 403/404: the namespace is going away
                    print(f"floor: {exc}", file=sys.stderr)

    tasks: set[asyncio.Task[None]] = set()

    def spawn(ns: str) -> None:
        task = asyncio.create_task(write(ns))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def watch_namespaces(rv: str) -> None:
        async for type_, obj, _ in kube.stream("/api/v1/namespaces", {"labelSelector": ns_label},
                                               resource_version=rv):
            name = obj["metadata"]["name"]
            if type_ == "DELETED" or obj["metadata"].get("deletionTimestamp"):
                namespaces.discard(name)
                copied.pop(name, None)
            elif name not in namespaces:
                namespaces.add(name)
                spawn(name)

    async def watch_source(rv: str) -> None:
        async for type_, obj, _ in kube.stream(f"/api/v1/namespaces/{source_ns}/configmaps",
                                               {"fieldSelector": f"metadata.name={source}"},
                                               resource_version=rv):
            if type_ == "DELETED":
                state["data"] = None
                continue
            state["data"] = obj.get("data") or {}
            for ns in list(namespaces):
                spawn(ns)

    ns_list = await kube.get("/api/v1/namespaces", labelSelector=ns_label)
    for ns in ns_list["items"]:
        namespaces.add(ns["metadata"]["name"])
    src = await kube.get(f"/api/v1/namespaces/{source_ns}/configmaps",
                         fieldSelector=f"metadata.name={source}")
    for obj in src["items"]:
        state["data"] = obj.get("data") or {}
        copied.update({ns: _hash(state["data"]) for ns in namespaces})  # assume already converged
    _ready()
    await asyncio.gather(watch_namespaces(ns_list["metadata"]["resourceVersion"]),
                         watch_source(src["metadata"]["resourceVersion"]))


async def reroller(kube: Kube, ns: str, source: str, workload_label: str, concurrency: int,
                   cluster_wide: bool = False) -> None:
    sem = asyncio.Semaphore(concurrency)
    workloads: set[str] = set()
    seen: dict[str, str] = {}
    label, _, value = workload_label.partition("=")
    deployments = "/apis/apps/v1/deployments" if cluster_wide else f"/apis/apps/v1/namespaces/{ns}/deployments"
    configmaps = "/api/v1/configmaps" if cluster_wide else f"/api/v1/namespaces/{ns}/configmaps"
    # Cluster-wide: everything comes, ours are picked here; else the API server picks them.
    wl_params = {} if cluster_wide else {"labelSelector": workload_label}
    cm_params = {} if cluster_wide else {"fieldSelector": f"metadata.name={source}"}

    def mine(obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        return bool(meta.get("namespace") == ns and (meta.get("labels") or {}).get(label) == value)

    def the_source(obj: dict[str, Any]) -> bool:
        return bool(obj["metadata"].get("namespace") == ns and obj["metadata"]["name"] == source)

    async def roll(name: str, digest: str) -> None:
        patch = {"metadata": {"annotations": {f"{FLOOR_LABEL}-observed-hash": digest}},
                 "spec": {"template": {"metadata": {"annotations": {f"{FLOOR_LABEL}-config-hash": digest}}}}}
        async with sem:
            try:
                await kube.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}", patch)
            except ApiError as exc:
                print(f"floor: {exc}", file=sys.stderr)

    tasks: set[asyncio.Task[None]] = set()

    async def watch_workloads(rv: str) -> None:
        async for type_, obj, _ in kube.stream(deployments, wl_params, resource_version=rv):
            if mine(obj):
                (workloads.discard if type_ == "DELETED" else workloads.add)(obj["metadata"]["name"])

    async def watch_source(rv: str) -> None:
        async for type_, obj, _ in kube.stream(configmaps, cm_params, resource_version=rv):
            if type_ == "DELETED" or not the_source(obj):
                continue
            digest = _hash(obj.get("data") or {})
            if seen.get("source") == digest:
                continue  # metadata-only change
            first = "source" not in seen
            seen["source"] = digest
            if first:
                continue  # the first sighting is the baseline
            for name in list(workloads):
                task = asyncio.create_task(roll(name, digest))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    wl = await kube.get(deployments, **wl_params)
    workloads.update(o["metadata"]["name"] for o in wl["items"] if mine(o))
    src = await kube.get(configmaps, **cm_params)
    for obj in src["items"]:
        if the_source(obj):
            seen["source"] = _hash(obj.get("data") or {})
    _ready()
    await asyncio.gather(watch_workloads(wl["metadata"]["resourceVersion"]),
                         watch_source(src["metadata"]["resourceVersion"]))


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["immortal", "immortal-cr", "copyrator", "reroller"])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", default="")
    parser.add_argument("--source-namespace", default="")
    parser.add_argument("--source", default="")
    parser.add_argument("--ns-label", default="")
    parser.add_argument("--copy-name", default="floor-copy")
    parser.add_argument("--workload-label", default="")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cluster-wide", action="store_true", help="reroller: watch every namespace")
    args = parser.parse_args(argv)
    kube = Kube(args.kubeconfig, limit=args.concurrency + 8)
    try:
        if args.mode == "immortal":
            await immortal(kube, args.namespace, args.concurrency)
        elif args.mode == "immortal-cr":
            await immortal_cr(kube, args.namespace, args.concurrency)
        elif args.mode == "copyrator":
            await copyrator(kube, args.source_namespace, args.source, args.ns_label, args.copy_name,
                            args.concurrency)
        else:
            await reroller(kube, args.namespace, args.source, args.workload_label, args.concurrency,
                           args.cluster_wide)
    finally:
        await kube.close()


if __name__ == "__main__":
    asyncio.run(main())
