"""Peers built from source and measured next to our operator (issue #13: stakater Reloader).

    .venv/bin/python -m bench.peers reloader-latency [--n 20]   # JSON figures on stdout
    .venv/bin/python -m bench.peers build-reloader              # path of the built binary

Reusable from ``make bench`` (bench/run.py): ``build_reloader()`` builds Reloader from its source
(never vendored: the source is a bare git directory left by the search tool's ``fetch``,
``RELOADER_GIT_DIR``, default /work/.mirror/stakater+Reloader/repo), pinned to that commit, under
~/.cache/kopf-operators/peers/; ``reloader_latency()`` measures an isolated ConfigMap edit -> pod
template changed, for Reloader (``--reload-strategy=annotations``, scoped by ``--namespaces`` to its own
namespace) and for our operator (told to ignore that namespace, REROLLER_NAMESPACES_TO_IGNORE), edits
alternating between the two so that both see the same noise, never both acting on one workload.
Both are watched for the same thing: Reloader's pod-template annotation
``reloader.stakater.com/last-reloaded-from`` (our operator writes it for workloads opted in with
Reloader's keys), on workloads opted in with ``reloader.stakater.com/auto: "true"``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.kube import Kube, Watcher

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("KOPF_OPERATORS_CACHE", Path.home() / ".cache" / "kopf-operators")) / "peers"
RELOADER_GIT_DIR = Path(os.environ.get("RELOADER_GIT_DIR", "/work/.mirror/stakater+Reloader/repo"))
# go.mod pins an openshift/api version the module proxy refuses; this is the one its own
# openshift/client-go asks for (see ../shared/notes/peers.md).
OPENSHIFT_API = "github.com/openshift/api@v0.0.0-20260326111139-30c2ef7a272e"
LAST_RELOADED_FROM = "reloader.stakater.com/last-reloaded-from"
GO_ENV = {"GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], cwd: Path, timeout: float = 3600) -> str:
    env = {**os.environ, **GO_ENV}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed in {cwd}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def reloader_tree(git_dir: Path = RELOADER_GIT_DIR) -> tuple[Path, str]:
    """Reloader's source at the fetched commit, extracted (once) under the cache: (tree, commit)."""
    if not (git_dir / "HEAD").exists():
        raise FileNotFoundError(f"no Reloader source at {git_dir}: fetch github:stakater/Reloader first "
                                f"(the Go module proxy refuses github.com/stakater/Reloader) or set RELOADER_GIT_DIR")
    commit = _run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"], cwd=Path("/")).strip()
    tree = CACHE / f"reloader-{commit[:12]}"
    if not (tree / "go.mod").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.Popen(["git", "--git-dir", str(git_dir), "archive", commit], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
        archive.wait()
    gomod = (tree / "go.mod").read_text()
    if "replace github.com/openshift/api" not in gomod:
        _run(["go", "mod", "edit", "-replace", f"github.com/openshift/api={OPENSHIFT_API}"], tree)
        _run(["go", "mod", "download", OPENSHIFT_API], tree)
    return tree, commit


def build_reloader(git_dir: Path = RELOADER_GIT_DIR) -> tuple[Path, str]:
    """Build Reloader's binary from source (cached per commit): (binary, commit)."""
    tree, commit = reloader_tree(git_dir)
    binary = tree / "bin" / "reloader"
    if not binary.exists():
        log(f"building Reloader {commit[:12]} in {tree}")
        _run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), "."], tree)
    return binary, commit


def build_reloader_e2e(suite: str, git_dir: Path = RELOADER_GIT_DIR) -> tuple[Path, Path, str]:
    """Build Reloader's own Ginkgo e2e suite ``suite`` (core, annotations, flags, advanced) as a test
    binary: (binary, source tree, commit). The suite must run from its package directory."""
    tree, commit = reloader_tree(git_dir)
    binary = tree / "bin" / f"e2e-{suite}"
    if not binary.exists():
        log(f"building Reloader's e2e suite {suite} ({commit[:12]})")
        _run(["go", "test", "-c", "-o", str(binary), f"./test/e2e/{suite}/"], tree)
    return binary, tree, commit


@contextlib.contextmanager
def reloader_process(binary: Path, kubeconfig: Path, namespaces: list[str], log_path: Path,
                     *flags: str) -> Iterator[subprocess.Popen[bytes]]:
    """Reloader running against the cluster with the annotations strategy, scoped to ``namespaces``
    (it reads KUBECONFIG; its metrics port 9090 is fixed)."""
    cmd = [str(binary), "--reload-strategy=annotations", f"--namespaces={','.join(namespaces)}", *flags]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(cmd, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _deployment(name: str, cm: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"metadata": {"name": name, "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                                           "envFrom": [{"configMapRef": {"name": cm}}]}]}}}}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _summary(values: list[float]) -> dict[str, Any]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "p90_ms": round(_pct(ms, 0.9), 1),
            "max_ms": round(max(ms), 1), "all_ms": [round(v, 1) for v in ms]}


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


def _kubectl(kubeconfig: Path, *args: str) -> None:
    subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], check=True, capture_output=True)


def measure(n: int = 20, env: dict[str, str] | None = None, flap_seconds: float = 60.0) -> dict[str, Any]:
    """The whole comparison on the local cluster: build Reloader, start it and our operator (the
    re-roller alone, shipped defaults unless ``env`` says otherwise), measure the isolated-change
    latency and (``flap_seconds`` > 0) the rollouts of a workload whose source flaps 10 times a
    second, clean up."""
    cluster_dir = Path(os.environ.get("CLUSTER_DIR", REPO / ".cluster")).resolve()
    subprocess.run([str(REPO / "cluster" / "cluster.sh"), "up"], check=True, capture_output=True)
    kubeconfig = cluster_dir / "kubeconfig"
    binary, commit = build_reloader()
    run = uuid.uuid4().hex[:5]
    ours_ns, reloader_ns = f"peer-ours-{run}", f"peer-reloader-{run}"
    for ns in (ours_ns, reloader_ns):
        _kubectl(kubeconfig, "create", "namespace", ns)
    logs = cluster_dir / "logs"
    operator_env = {**os.environ, "KUBECONFIG": str(kubeconfig), "REROLLER_NAMESPACES_TO_IGNORE": reloader_ns,
                    **(env or {})}
    kopf = Path(sys.executable).parent / "kopf"
    with (logs / f"peers-operator-{run}.log").open("ab") as out:
        operator = subprocess.Popen([str(kopf), "run", "--standalone", "--all-namespaces", str(REPO / "operators"
                                                                                                / "reroller.py")],
                                    cwd=REPO, env=operator_env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    try:
        with reloader_process(binary, kubeconfig, [reloader_ns], logs / f"peers-reloader-{run}.log"):
            time.sleep(5)  # both watching
            result = asyncio.run(reloader_latency(kubeconfig, ours_ns, reloader_ns, n))
            if flap_seconds:
                result["flapping_ours"] = asyncio.run(flapping_rollouts(kubeconfig, ours_ns, flap_seconds))
                result["flapping_reloader"] = asyncio.run(flapping_rollouts(kubeconfig, reloader_ns, flap_seconds))
    finally:
        operator.terminate()
        operator.wait(timeout=30)
        for ns in (ours_ns, reloader_ns):
            subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "delete", "namespace", ns, "--wait=false"],
                           capture_output=True)
    ours, theirs = result["ours"]["p50_ms"], result["reloader"]["p50_ms"]
    target = max(2 * theirs, theirs + 50)
    result.update({"reloader_commit": commit, "operator_env": env or "shipped defaults",
                   "target_p50_ms": round(target, 1), "pass": ours <= target})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["build-reloader", "reloader-latency"])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--flap-seconds", type=float, default=60.0)
    args = parser.parse_args()
    if args.what == "build-reloader":
        binary, commit = build_reloader()
        print(json.dumps({"binary": str(binary), "commit": commit}))
    else:
        print(json.dumps(measure(args.n, flap_seconds=args.flap_seconds), indent=2))


if __name__ == "__main__":
    main()
