"""The re-roller next to stakater Reloader built from source (issue #13): ``make reloader-bench``.

    .venv/bin/python -m bench.reloader_bench [--n 20] [--flap-seconds 60]   # JSON figures on stdout

``reloader_latency()`` measures an isolated ConfigMap edit -> pod template changed, for Reloader
(``--reload-strategy=annotations``, scoped by ``--namespaces`` to its own namespace) and for our operator
(told to ignore that namespace, REROLLER_NAMESPACES_TO_IGNORE), edits alternating between the two so that
both see the same noise, never both acting on one workload. Both are watched for the same thing:
Reloader's pod-template annotation ``reloader.stakater.com/last-reloaded-from`` (our operator writes it
for workloads opted in with Reloader's keys), on workloads opted in with
``reloader.stakater.com/auto: "true"``. Reloader is built by testsupport/peer_build.py (its source: see there).
Percentiles are nearest-rank (testsupport/stats.py), as in ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from bench.kube import Kube, Watcher
from testsupport import peer_build
from testsupport.kubectl import kubectl
from testsupport.launcher import KopfProcess, port_free
from testsupport.paths import KUBECONFIG, LOGS, REPO, cluster_script
from testsupport.stats import summary_ms

LAST_RELOADED_FROM = "reloader.stakater.com/last-reloaded-from"


def _deployment(name: str, cm: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"metadata": {"name": name, "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                                           "envFrom": [{"configMapRef": {"name": cm}}]}]}}}}


def _summary(values: list[float]) -> dict[str, Any]:
    return {**summary_ms(values, (0.5, 0.9)), "all_ms": [round(v * 1000, 1) for v in values]}


async def reloader_latency(kubeconfig: Path, ours_ns: str, reloader_ns: str, n: int = 20,
                           settle: float = 2.0) -> dict[str, Any]:
    """An isolated ConfigMap edit -> pod template changed, n times each, alternating: one Deployment
    and one ConfigMap per edit (an isolated change: nothing else happened to that workload), in
    ``ours_ns`` (our operator) and ``reloader_ns`` (Reloader). Both namespaces must exist; Reloader
    must be scoped to ``reloader_ns`` and our operator must ignore it."""
    kube = Kube(kubeconfig)
    try:
        for ns in (ours_ns, reloader_ns):
            for i in range(n):
                await kube.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": f"cm-{i}"},
                                                                          "data": {"v": "0"}})
                await kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", _deployment(f"d-{i}", f"cm-{i}"))
        await asyncio.sleep(settle)  # first sightings (our baselines) done; Reloader's caches synced
        results: dict[str, list[float]] = {"ours": [], "reloader": []}
        watchers = {ns: await Watcher(kube, f"/apis/apps/v1/namespaces/{ns}/deployments").start()
                    for ns in (ours_ns, reloader_ns)}
        for i in range(n):
            for side, ns in ((("ours", ours_ns), ("reloader", reloader_ns)) if i % 2 == 0
                             else (("reloader", reloader_ns), ("ours", ours_ns))):
                name = f"d-{i}"

                def rolled(_t: str, obj: dict[str, Any], _now: float, name: str = name) -> bool:
                    annotations = obj["spec"]["template"]["metadata"].get("annotations") or {}
                    return bool(obj["metadata"]["name"] == name and annotations.get(LAST_RELOADED_FROM))

                done = watchers[ns].expect(rolled)
                t0 = time.monotonic()
                await kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/cm-{i}", {"data": {"v": "1"}})
                t1 = await asyncio.wait_for(done, 60)
                results[side].append(t1 - t0)
                await asyncio.sleep(0.2)
        for watcher in watchers.values():
            await watcher.stop()
        return {"what": "isolated ConfigMap edit (PATCH sent) -> the Deployment's pod-template annotation "
                        f"{LAST_RELOADED_FROM} seen on a watch; alternating, one workload per edit",
                "ours": _summary(results["ours"]), "reloader": _summary(results["reloader"])}
    finally:
        await kube.close()


async def flapping_rollouts(kubeconfig: Path, ns: str, seconds: float = 60.0, per_second: float = 10.0,
                            tail: float = 15.0) -> dict[str, Any]:
    """A ConfigMap flapping ``per_second`` times a second for ``seconds``: how many times its workload
    rolled (distinct values of the pod-template annotation, seen on a watch), counting ``tail``
    seconds after the flapping stopped (the merged trailing rollout)."""
    kube = Kube(kubeconfig)
    try:
        await kube.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "flap"}, "data": {"v": "0"}})
        await kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", _deployment("flap", "flap"))
        await asyncio.sleep(2)
        values: list[str] = []
        watcher = await Watcher(kube, f"/apis/apps/v1/namespaces/{ns}/deployments").start()

        def seen(_t: str, obj: dict[str, Any], _now: float) -> None:
            value = (obj["spec"]["template"]["metadata"].get("annotations") or {}).get(LAST_RELOADED_FROM)
            if obj["metadata"]["name"] == "flap" and value and value not in values:
                values.append(value)
        watcher.listeners.append(seen)
        started = time.monotonic()
        i = 0
        while time.monotonic() - started < seconds:
            i += 1
            await kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/flap", {"data": {"v": str(i)}})
            await asyncio.sleep(max(0.0, started + i / per_second - time.monotonic()))
        await asyncio.sleep(tail)
        await watcher.stop()
        return {"what": f"ConfigMap edited {per_second:g}/s for {seconds:g} s (+{tail:g} s) -> workload rollouts",
                "edits": i, "rollouts": len(values)}
    finally:
        await kube.close()


def measure(n: int = 20, env: dict[str, str] | None = None, flap_seconds: float = 60.0) -> dict[str, Any]:
    """The whole comparison on the local cluster: build Reloader, start it and our operator (the
    re-roller alone, shipped defaults unless ``env`` says otherwise), measure the isolated-change
    latency and (``flap_seconds`` > 0) the rollouts of a workload whose source flaps 10 times a
    second, clean up."""
    cluster_script("up")
    built = peer_build.build("reloader")
    for _ in range(60):  # Reloader's metrics port is hard-coded; it exits at once when another process holds it
        if port_free(9090):
            break
        time.sleep(1)
    else:
        raise RuntimeError("port 9090 (hard-coded in Reloader) stayed busy for 60 s: is another Reloader running?")
    run = uuid.uuid4().hex[:5]
    ours_ns, reloader_ns = f"peer-ours-{run}", f"peer-reloader-{run}"
    for ns in (ours_ns, reloader_ns):
        kubectl("create", "namespace", ns)
    operator = KopfProcess([str(REPO / "operators" / "reroller.py")], KUBECONFIG,
                           LOGS / f"reloader-bench-operator-{run}.log",
                           {"REROLLER_NAMESPACES_TO_IGNORE": reloader_ns, **(env or {})}, verbose=False,
                           metrics_port=False, log_env=True)
    try:
        operator.start()
        with peer_build.PeerProcess(built.binary, ["--reload-strategy=annotations", f"--namespaces={reloader_ns}"],
                                    {"KUBECONFIG": str(KUBECONFIG)}, peer_build.RELOADER_HEALTH_URL,
                                    LOGS / f"reloader-bench-reloader-{run}.log"):
            time.sleep(5)  # Reloader is live before its informers listed: give them their initial listing
            result = asyncio.run(reloader_latency(KUBECONFIG, ours_ns, reloader_ns, n))
            if flap_seconds:
                result["flapping_ours"] = asyncio.run(flapping_rollouts(KUBECONFIG, ours_ns, flap_seconds))
                result["flapping_reloader"] = asyncio.run(flapping_rollouts(KUBECONFIG, reloader_ns, flap_seconds))
    finally:
        operator.stop()
        for ns in (ours_ns, reloader_ns):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)
    ours, theirs = result["ours"]["p50_ms"], result["reloader"]["p50_ms"]
    target = max(2 * theirs, theirs + 50)
    result.update({"reloader_commit": built.commit, "operator_env": env or "shipped defaults",
                   "percentiles": "nearest-rank", "target_p50_ms": round(target, 1), "pass": ours <= target})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reloader_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--flap-seconds", type=float, default=60.0)
    args = parser.parse_args()
    print(json.dumps(measure(args.n, flap_seconds=args.flap_seconds), indent=2))


if __name__ == "__main__":
    main()
