"""Benchmarks of the four-operator process against the local control plane, each next to its floor.

    .venv/bin/python -m bench.run            # full run (writes bench/results.json and bench/results.md)
    .venv/bin/python -m bench.run --quick    # small counts, results to bench/results-quick.*

Honours CLUSTER_DIR (the cluster is started if needed). The operator runs as in the Helm chart's
default (``kopf run --peering=kopf-operators --all-namespaces operators/*.py``, log level info), under a
ServiceAccount token so that the API server's audit log counts its requests; the floors
(bench/floor.py) run as separate processes with the admin credentials. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.kube import ApiError, Kube, Watcher, bounded

REPO = Path(__file__).resolve().parent.parent
CLUSTER_DIR = Path(os.environ.get("CLUSTER_DIR", REPO / ".cluster")).resolve()
os.environ["CLUSTER_DIR"] = str(CLUSTER_DIR)  # before tests.kube reads it
KUBECONFIG = CLUSTER_DIR / "kubeconfig"
SA_NAMESPACE = "kopf-bench"
SA_NAME = "kopf-bench-operator"
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"
IC_PATH = "/apis/immortalcontainer.flugel.it/v1alpha1"
RULE_PATH = "/apis/flant.com/v1"
FLOOR_LABEL = "bench.kopf-operators.dev/floor"
BENCH_LABEL = "bench.kopf-operators.dev/run"
RR = "reroller.kopf-operators.dev"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}

FULL = dict(events=100, ics=1000, namespaces=500, deployments=200, pods=10000, configmaps=2500,
            secrets=2500, idle=60, default_events=10)
QUICK = dict(events=10, ics=50, namespaces=20, deployments=10, pods=300, configmaps=100,
             secrets=100, idle=10, default_events=3)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, Any]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50_ms": round(pct(ms, 0.50), 1), "p99_ms": round(pct(ms, 0.99), 1),
            "max_ms": round(max(ms), 1), "min_ms": round(min(ms), 1)}


async def origin(responded: float, seen: asyncio.Future[float]) -> float:
    """When the change happened: the write's response, or its event on the harness's own watch if that
    arrived first (both stamps come from one event loop, so a busy loop cannot make latency negative)."""
    try:
        return min(responded, await asyncio.wait_for(asyncio.shield(seen), 5))
    except TimeoutError:
        return responded


def collect(into: set[str], when: Callable[[str, dict[str, Any]], bool],
            key: str = "name") -> Callable[[str, dict[str, Any], float], None]:
    """A watch listener adding the object's metadata[key] to ``into`` when ``when(type, object)``."""
    def listener(type_: str, obj: dict[str, Any], _: float) -> None:
        if when(type_, obj):
            into.add(obj["metadata"][key])
    return listener


def kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    out = subprocess.run(["kubectl", "--kubeconfig", str(KUBECONFIG), *args], input=input, text=True,
                         capture_output=True, check=False, timeout=300)
    if check and out.returncode:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr}")
    return out.stdout


async def within(fut: Awaitable[Any], timeout: float, what: str) -> Any:
    try:
        return await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}") from None


# --- the operator process ------------------------------------------------------------------------


class Operator:
    """``kopf run`` as the chart runs it (peering, all namespaces, info logs), as a ServiceAccount."""

    def __init__(self, kubeconfig: Path, env: dict[str, str], log_path: Path) -> None:
        self.kubeconfig, self.env, self.log_path = kubeconfig, env, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90) -> None:
        import urllib.request

        from tests.kube import free_port
        port = free_port()
        files = sorted(str(p.relative_to(REPO)) for p in (REPO / "operators").glob("*.py"))
        cmd = [str(Path(sys.executable).parent / "kopf"), "run", f"--liveness=http://127.0.0.1:{port}/healthz",
               "--peering=kopf-operators", "--all-namespaces", *files]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = self.log_path.open("ab")
        out.write(f"\n===== {' '.join(cmd)} env={self.env}\n".encode())
        out.flush()
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"operator not healthy after {timeout}s; log: {self.log_path}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def status(self) -> dict[str, int]:
        """VmRSS and VmHWM in kB, from /proc/<pid>/status."""
        assert self.proc is not None
        values = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
        return values

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def settle(self, quiet: float = 0.02, window: float = 3.0, timeout: float = 300) -> float:
        """Wait until the process uses under ``quiet`` of a core over ``window`` seconds."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            before = self.cpu_seconds()
            await asyncio.sleep(window)
            if (self.cpu_seconds() - before) / window < quiet:
                break
        return time.monotonic() - started


class Floor:
    def __init__(self, mode: str, *args: str) -> None:
        self.cmd = [sys.executable, "-m", "bench.floor", mode, "--kubeconfig", str(KUBECONFIG), *args]
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Floor:
        self.proc = await asyncio.create_subprocess_exec(*self.cmd, cwd=REPO, stdout=asyncio.subprocess.PIPE)
        assert self.proc.stdout is not None
        line = await within(self.proc.stdout.readline(), 60, "the floor to be ready")
        if line.strip() != b"ready":
            raise RuntimeError(f"floor {self.cmd} failed to start")
        return self

    async def __aexit__(self, *_: Any) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


# --- the audit log ------------------------------------------------------------------------------


class Audit:
    def __init__(self) -> None:
        out = subprocess.run([str(REPO / "cluster" / "cluster.sh"), "audit-log"], capture_output=True, text=True,
                             check=True, env={**os.environ, "CLUSTER_DIR": str(CLUSTER_DIR)})
        self.path = Path(out.stdout.strip())

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    async def count(self, start: int, end: int | None = None) -> dict[str, Any]:
        """The operator's requests between two marks: by verb, and by verb+resource.
        A watch counts when it starts; every other request when it completes."""
        await asyncio.sleep(1.0)  # let the API server flush its audit writes
        with self.path.open("rb") as fh:
            fh.seek(start)
            data = fh.read() if end is None else fh.read(end - start)
        verbs: Counter[str] = Counter()
        detail: Counter[str] = Counter()
        for raw in data.splitlines():
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if ev.get("user", {}).get("username") != SA_USER:
                continue
            verb, stage = ev.get("verb"), ev.get("stage")
            if (verb == "watch") != (stage == "ResponseStarted") and stage != "Panic":
                continue
            ref = ev.get("objectRef") or {}
            resource = ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            verbs[verb] += 1
            detail[f"{verb} {resource}"] += 1
        return {"by_verb": dict(sorted(verbs.items())), "by_verb_resource": dict(sorted(detail.items())),
                "writes": sum(n for v, n in verbs.items() if v in WRITE_VERBS),
                "total": sum(verbs.values())}


def per_change(counts: dict[str, Any], changes: int) -> dict[str, Any]:
    return {"changes": changes, "total_per_change": round(counts["total"] / changes, 2),
            "writes_per_change": round(counts["writes"] / changes, 2),
            "by_verb_per_change": {v: round(n / changes, 2) for v, n in counts["by_verb"].items()},
            "by_verb_resource": counts["by_verb_resource"]}


# --- the benchmark ------------------------------------------------------------------------------


class Bench:
    def __init__(self, counts: dict[str, int], sections: list[str]) -> None:
        self.n = counts
        self.sections = sections
        self.run = uuid.uuid4().hex[:5]
        self.kube = Kube(KUBECONFIG, limit=80)
        self.results: dict[str, Any] = {}
        self.audit = Audit()
        self.operator: Operator | None = None
        self.sa_kubeconfig = CLUSTER_DIR / "bench-operator-kubeconfig"
        self.namespaces: list[str] = []

    # helpers

    async def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        await self.kube.create("/api/v1/namespaces", {"metadata": {
            "name": name, "labels": {BENCH_LABEL: self.run, **(labels or {})}}})
        self.namespaces.append(name)
        return name

    async def cleanup(self, names: list[str], wait: float = 180) -> None:
        """Delete namespaces (pods first, with no grace, so KWOK has nothing to wait for)."""
        async def one(ns: str) -> None:
            try:  # a collection of thousands can outlast the API server's request timeout: then the
                # namespace deletion finishes the job
                await self.kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                        params={"gracePeriodSeconds": "0"})
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log(f"  deleting the pods of {ns}: {type(exc).__name__}: {exc}")
            await self.kube.delete(f"/api/v1/namespaces/{ns}")

        await bounded(16, [one(ns) for ns in names])
        deadline = time.monotonic() + wait
        pending = set(names)
        while pending and time.monotonic() < deadline:
            listing = await self.kube.get("/api/v1/namespaces", labelSelector=f"{BENCH_LABEL}={self.run}")
            pending &= {o["metadata"]["name"] for o in listing["items"]}
            if pending:
                await asyncio.sleep(1)
        for ns in names:
            if ns in self.namespaces:
                self.namespaces.remove(ns)
        if pending:
            log(f"  {len(pending)} namespace(s) still terminating; moving on")

    def start_operator(self, env: dict[str, str] | None = None) -> None:
        if env is None:  # {} means the shipped defaults
            env = {"REROLLER_DEBOUNCE_SECONDS": "0", "REROLLER_MIN_INTERVAL_SECONDS": "0"}
        self.operator = Operator(self.sa_kubeconfig, env, CLUSTER_DIR / "logs" / f"bench-operator-{self.run}.log")
        self.operator.start()

    def stop_operator(self) -> None:
        if self.operator:
            self.operator.stop()

    async def setup(self) -> None:
        subprocess.run([str(REPO / "cluster" / "cluster.sh"), "up"], check=True, timeout=3600)
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crds"))
        kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "manifests" / "crds"))
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SA_NAMESPACE}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA_NAME, "namespace": SA_NAMESPACE}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": SA_NAME},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
             "subjects": [{"kind": "ServiceAccount", "name": SA_NAME, "namespace": SA_NAMESPACE}]},
            {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "kopf-operators"}},
        ]}))
        from tests.kube import token_kubeconfig
        token_kubeconfig(SA_NAME, SA_NAMESPACE, self.sa_kubeconfig)

    async def timed_section(self, name: str, fn: Callable[[], Awaitable[Any]]) -> None:
        if name not in self.sections:
            return
        log(f"== {name}")
        started = time.monotonic()
        try:
            self.results[name] = await fn()
        except Exception as exc:  # one broken section must not lose the others' figures
            import traceback
            log(f"  {name} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            self.results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        self.results.setdefault(name, {})["section_seconds"] = round(time.monotonic() - started, 1)
        log(f"  {name}: {json.dumps(self.results[name])[:600]}")

    async def steady_state(self, label: str) -> str:
        """One object per operator in a fresh namespace: an ImmortalContainer, a CopyratorRule with one
        copy, an opted-in Deployment (so every operator has run its code paths once)."""
        ns = await self.namespace(f"bench-{label}-{self.run}", {"bench-idle-target": self.run})
        await self.kube.create(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
            "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
            "metadata": {"name": "idle"}, "spec": {"image": "busybox:1.36"}})
        await self.kube.create(f"/api/v1/namespaces/{ns}/configmaps", {
            "metadata": {"name": "idle-src", "labels": {"bench-idle": "true"}}, "data": {"k": "v"}})
        await self.kube.create(f"{RULE_PATH}/namespaces/{ns}/copyrators", {
            "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "idle"},
            "spec": {"ruleType": "configmap", "selector": {"bench-idle": "true"}, "namespace": [ns],
                     "namespaceSelector": {"matchLabels": {"bench-idle-target": self.run}}}})
        await self.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment("idle", "idle-src", True))
        return ns

    # idle: steady state with one object per operator, then a quiet window

    async def idle(self) -> dict[str, Any]:
        assert self.operator
        ns = await self.steady_state("idle")
        await asyncio.sleep(5)
        settle = await self.operator.settle()
        mem = self.operator.status()
        start = self.audit.mark()
        t0 = time.monotonic()
        await asyncio.sleep(self.n["idle"])
        counts = await self.audit.count(start)
        seconds = time.monotonic() - t0 - 1.0 + 1.0
        peering = counts["by_verb_resource"].get("patch clusterkopfpeerings", 0)
        result = {"window_seconds": round(seconds, 1), "settled_after_s": round(settle, 1),
                  "requests": counts, "writes": counts["writes"],
                  "writes_excluding_peering": counts["writes"] - peering,
                  "requests_per_minute": round(counts["total"] * 60 / seconds, 1),
                  "rss_mb": round(mem["VmRSS"] / 1024, 1), "hwm_mb": round(mem["VmHWM"] / 1024, 1)}
        await self.kube.delete(f"{RULE_PATH}/namespaces/{ns}/copyrators/idle")
        await self._gone(f"{RULE_PATH}/namespaces/{ns}/copyrators/idle", 60)
        await self.cleanup([ns])
        return result

    # latency: one change at a time, operator and floor alternating

    async def immortal_latency(self) -> dict[str, Any]:
        n = self.n["events"]
        ns = await self.namespace(f"bench-imml-{self.run}")
        pods = await Watcher(self.kube, f"/api/v1/namespaces/{ns}/pods").start()
        ics = await Watcher(self.kube, f"{IC_PATH}/namespaces/{ns}/immortalcontainers").start()
        expected = {"starts": 1}

        def starts_at(k: int) -> Callable[[str, dict[str, Any], float], bool]:
            # At least k: KWOK sometimes also deletes the fresh same-name replacement (a real extra
            # start, which the operator counts too), so the count may jump past k.
            return lambda t, o, _: (o["metadata"]["name"] == "lat"
                                    and ((o.get("status") or {}).get("startTimes") or 0) >= k)

        ready = ics.expect(starts_at(1))
        await self.kube.create(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
            "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
            "metadata": {"name": "lat"}, "spec": {"image": "busybox:1.36"}})
        await self.kube.create(f"/api/v1/namespaces/{ns}/pods", {"metadata": {
            "name": "floor-lat", "labels": {FLOOR_LABEL: "immortal"}},
            "spec": {"containers": [{"name": "acontainer", "image": "busybox:1.36"}]}})
        await within(ready, 60, "the ImmortalContainer's first pod")
        op_lat: list[float] = []
        floor_lat: list[float] = []
        audit_total: Counter[str] = Counter()
        async with Floor("immortal", "--namespace", ns):
            await asyncio.sleep(1)
            audit_counts: list[dict[str, Any]] = []
            for i in range(n):
                for side in (("op", "floor") if i % 2 == 0 else ("floor", "op")):
                    pod = "lat-immortalpod" if side == "op" else "floor-lat"
                    mark = self.audit.mark()
                    created = pods.expect(lambda t, o, _, pod=pod: t == "ADDED" and o["metadata"]["name"] == pod)
                    counted = ics.expect(starts_at(expected["starts"] + 1)) if side == "op" else None
                    gone = pods.expect(lambda t, o, _, pod=pod: t == "DELETED" and o["metadata"]["name"] == pod)
                    await self.kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod}", {"gracePeriodSeconds": 0})
                    t0 = time.monotonic()
                    t1 = await within(created, 30, f"a new {pod}")
                    t0 = await origin(t0, gone)
                    (op_lat if side == "op" else floor_lat).append(t1 - t0)
                    if counted is not None:
                        await within(counted, 30, "startTimes to count the restart")
                        ic = await self.kube.get(f"{IC_PATH}/namespaces/{ns}/immortalcontainers/lat")
                        expected["starts"] = int(ic["status"]["startTimes"])
                        await asyncio.sleep(0.05)
                        audit_counts.append({"start": mark, "end": self.audit.mark()})
            # the operator's requests during its own iterations only
            for span in audit_counts:
                audit_total.update(await self._count_quick(span["start"], span["end"]))
        await pods.stop()
        await ics.stop()
        await self.cleanup([ns])
        return self._latency(op_lat, floor_lat, audit_total, n,
                             "pod deleted (gracePeriodSeconds=0, from the DELETE response) -> "
                             "replacement pod ADDED on a watch")

    async def _count_quick(self, start: int, end: int) -> Counter[str]:
        with self.audit.path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(end - start)
        out: Counter[str] = Counter()
        for raw in data.splitlines():
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if ev.get("user", {}).get("username") != SA_USER:
                continue
            verb, stage = ev.get("verb"), ev.get("stage")
            if (verb == "watch") != (stage == "ResponseStarted"):
                continue
            ref = ev.get("objectRef") or {}
            out[f"{verb} {ref.get('resource', '?')}{'/' + ref['subresource'] if ref.get('subresource') else ''}"] += 1
        return out

    def _latency(self, op: list[float], floor: list[float], audit: Counter[str], n: int, what: str) -> dict[str, Any]:
        o, f = summary(op), summary(floor)
        by_verb: Counter[str] = Counter()
        for key, count in audit.items():
            by_verb[key.split()[0]] += count
        writes = sum(c for v, c in by_verb.items() if v in WRITE_VERBS)
        return {"what": what, "operator": o, "floor": f,
                "ratio_p50": round(o["p50_ms"] / f["p50_ms"], 2), "ratio_p99": round(o["p99_ms"] / f["p99_ms"], 2),
                "target_p50_2x_floor": o["p50_ms"] <= 2 * f["p50_ms"], "target_p99_250ms": o["p99_ms"] <= 250,
                "api_per_change": {"changes": n, "requests": round(sum(by_verb.values()) / n, 2),
                                   "writes": round(writes / n, 2),
                                   "by_verb": {v: round(c / n, 2) for v, c in sorted(by_verb.items())},
                                   "by_verb_resource": {k: round(c / n, 2) for k, c in sorted(audit.items())}}}

    async def copyrator_latency(self) -> dict[str, Any]:
        n = self.n["events"]
        run = self.run
        src = await self.namespace(f"bench-cpl-{run}")
        await self.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
            "metadata": {"name": "lat-src", "labels": {"bench-copy": run}}, "data": {"v": "0"}})
        await self.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
            "metadata": {"name": "floor-src"}, "data": {"v": "0"}})
        rule = await self.kube.create(f"{RULE_PATH}/namespaces/{src}/copyrators", {
            "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "lat"},
            "spec": {"ruleType": "configmap", "selector": {"bench-copy": run}, "namespace": [src],
                     "namespaceSelector": {"matchLabels": {"bench-cpl-target": f"op-{run}"}}}})
        from kopf_operators.copyrator import RULE_UID_LABEL
        op_cms = await Watcher(self.kube, "/api/v1/configmaps",
                               {"labelSelector": f"{RULE_UID_LABEL}={rule['metadata']['uid']}"}).start()
        floor_cms = await Watcher(self.kube, "/api/v1/configmaps", {"labelSelector": f"{FLOOR_LABEL}=copy"}).start()
        sources = await Watcher(self.kube, f"/api/v1/namespaces/{src}/configmaps").start()
        nss = await Watcher(self.kube, "/api/v1/namespaces", {"labelSelector": f"{BENCH_LABEL}={run}"}).start()
        created: list[str] = []
        results: dict[str, Any] = {}
        async with Floor("copyrator", "--source-namespace", src, "--source", "floor-src",
                         "--ns-label", f"bench-cpl-target=floor-{run}", "--copy-name", "floor-src"):
            # 1. source edited -> copies updated, with K target namespaces per side
            k = 5
            for side, watcher in (("op", op_cms), ("floor", floor_cms)):
                waits = [watcher.expect(lambda t, o, _, ns=f"bench-cpe-{run}-{side}-{j}":
                                        o["metadata"]["namespace"] == ns) for j in range(k)]
                for j in range(k):
                    created.append(await self.namespace(f"bench-cpe-{run}-{side}-{j}",
                                                        {"bench-cpl-target": f"{side}-{run}"}))
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
                        if (o.get("data") or {}).get("v") == value and t != "DELETED":
                            seen.add(o["metadata"]["namespace"])
                        return len(seen) >= k

                    done = watcher.expect(all_updated)
                    edited = sources.expect(lambda t, o, _, name=name, value=value: o["metadata"]["name"] == name
                                            and (o.get("data") or {}).get("v") == value)
                    mark = self.audit.mark()
                    await self.kube.merge_patch(f"/api/v1/namespaces/{src}/configmaps/{name}", {"data": {"v": value}})
                    t0 = time.monotonic()
                    t1 = await within(done, 60, f"{side} copies of v={value}")
                    t0 = await origin(t0, edited)
                    (op_lat if side == "op" else floor_lat).append(t1 - t0)
                    if side == "op":
                        await asyncio.sleep(0.05)
                        audit.update(await self._count_quick(mark, self.audit.mark()))
            results["source_edited"] = self._latency(
                op_lat, floor_lat, audit, n,
                f"source ConfigMap edited (from the PATCH response) -> all {k} copies show the new data on a watch")
            # 2. namespace created -> copy exists
            op_lat, floor_lat, audit = [], [], Counter()
            for i in range(n):
                for side in (("op", "floor") if i % 2 == 0 else ("floor", "op")):
                    watcher = op_cms if side == "op" else floor_cms
                    ns = f"bench-cpn-{run}-{side}-{i}"
                    done = watcher.expect(lambda t, o, _, ns=ns: o["metadata"]["namespace"] == ns)
                    added = nss.expect(lambda t, o, _, ns=ns: t == "ADDED" and o["metadata"]["name"] == ns)
                    mark = self.audit.mark()
                    await self.namespace(ns, {"bench-cpl-target": f"{side}-{run}"})
                    t0 = time.monotonic()
                    t1 = await within(done, 60, f"the {side} copy in {ns}")
                    t0 = await origin(t0, added)
                    created.append(ns)
                    (op_lat if side == "op" else floor_lat).append(t1 - t0)
                    if side == "op":
                        await asyncio.sleep(0.05)
                        audit.update(await self._count_quick(mark, self.audit.mark()))
            results["namespace_created"] = self._latency(
                op_lat, floor_lat, audit, n,
                "namespace created (from the POST response) -> the copy ADDED on a watch")
        for w in (op_cms, floor_cms, sources, nss):
            await w.stop()
        await self.kube.delete(f"{RULE_PATH}/namespaces/{src}/copyrators/lat")
        await self._gone(f"{RULE_PATH}/namespaces/{src}/copyrators/lat", 120)
        await self.cleanup([src, *created])
        return results

    async def _gone(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.kube.request("GET", path, ok_missing=True) is None:
                return
            await asyncio.sleep(0.5)
        log(f"  {path} still there after {timeout}s")

    async def reroller_latency(self, n: int | None = None, label: str = "", pause: float = 0.0) -> dict[str, Any]:
        n = n or self.n["events"]
        ns = await self.namespace(f"bench-rrl{label}-{self.run}")
        for cm in ("lat-cfg", "floor-cfg"):
            await self.kube.create(f"/api/v1/namespaces/{ns}/configmaps",
                                   {"metadata": {"name": cm}, "data": {"v": "0"}})
        deps = await Watcher(self.kube, f"/apis/apps/v1/namespaces/{ns}/deployments").start()
        cms = await Watcher(self.kube, f"/api/v1/namespaces/{ns}/configmaps").start()
        baseline = deps.expect(lambda t, o, _: o["metadata"]["name"] == "lat"
                               and f"{RR}/observed-hash" in (o["metadata"].get("annotations") or {}))
        await self.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment("lat", "lat-cfg", True))
        floor_dep = deployment("floor-lat", "floor-cfg", False)
        floor_dep["metadata"]["labels"] = {FLOOR_LABEL: "reroller"}
        await self.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", floor_dep)
        await within(baseline, 60, "the re-roller's baseline on the Deployment")
        op_lat: list[float] = []
        floor_lat: list[float] = []
        audit: Counter[str] = Counter()
        last: dict[str, Any] = {"lat": None, "floor-lat": None}
        key = {"lat": f"{RR}/config-hash", "floor-lat": f"{FLOOR_LABEL}-config-hash"}
        async with Floor("reroller", "--namespace", ns, "--source", "floor-cfg",
                         "--workload-label", f"{FLOOR_LABEL}=reroller"):
            await asyncio.sleep(1)
            for i in range(1, n + 1):
                for side in (("op", "floor") if i % 2 else ("floor", "op")):
                    dep, cm = ("lat", "lat-cfg") if side == "op" else ("floor-lat", "floor-cfg")

                    def rolled(t: str, o: dict[str, Any], _: float, dep: str = dep) -> bool:
                        if o["metadata"]["name"] != dep:
                            return False
                        value = (o["spec"]["template"]["metadata"].get("annotations") or {}).get(key[dep])
                        if value and value != last[dep]:
                            last[dep] = value
                            return True
                        return False

                    done = deps.expect(rolled)
                    edited = cms.expect(lambda t, o, _, cm=cm, v=str(i): o["metadata"]["name"] == cm
                                        and (o.get("data") or {}).get("v") == v)
                    mark = self.audit.mark()
                    await self.kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/{cm}", {"data": {"v": str(i)}})
                    t0 = time.monotonic()
                    t1 = await within(done, 60, f"{dep}'s pod template to change")
                    t0 = await origin(t0, edited)
                    (op_lat if side == "op" else floor_lat).append(t1 - t0)
                    if side == "op":
                        await asyncio.sleep(0.05)
                        audit.update(await self._count_quick(mark, self.audit.mark()))
                await asyncio.sleep(pause)
        await deps.stop()
        await cms.stop()
        await self.cleanup([ns])
        return self._latency(op_lat, floor_lat, audit, n,
                             "ConfigMap data edited (from the PATCH response) -> the Deployment's pod template "
                             "annotation changed, seen on a watch")

    async def reroller_latency_defaults(self) -> dict[str, Any]:
        """With the shipped defaults (debounce 2 s, min interval 10 s), edits 11 s apart."""
        self.stop_operator()
        self.start_operator(env={})
        try:
            result = await self.reroller_latency(n=self.n["default_events"], label="d", pause=11.0)
        finally:
            self.stop_operator()
            self.start_operator()
        result["note"] = ("operator with the defaults REROLLER_DEBOUNCE_SECONDS=2, REROLLER_MIN_INTERVAL_SECONDS=10; "
                          "edits 11 s apart so that the minimum interval does not add to the figure")
        return result

    # convergence

    async def immortal_convergence(self) -> dict[str, Any]:
        m = self.n["ics"]
        op_s, op_extra = await self._immortal_burst("op", m, lambda ns: contextlib.nullcontext())
        # the floor handles ImmortalContainers too: the operator must not run meanwhile
        self.stop_operator()
        try:
            floor_s, floor_extra = await self._immortal_burst(
                "fl", m, lambda ns: Floor("immortal-cr", "--namespace", ns))
        finally:
            self.start_operator()
        return self._convergence(op_s, floor_s, {"operator": op_extra, "floor": floor_extra},
                                 f"{m} ImmortalContainers created at once (32 concurrent POSTs) -> every one has "
                                 "its pod and status.startTimes 1 (seen on watches)")

    async def _immortal_burst(self, side: str, m: int,
                              runner: Callable[[str], contextlib.AbstractAsyncContextManager[Any]],
                              ) -> tuple[float, dict[str, Any]]:
        """Create m ImmortalContainers at once in a fresh namespace, with ``runner(ns)`` (the operator,
        already running, or a floor process) reacting; seconds until every one has its pod and
        startTimes 1."""
        ns = await self.namespace(f"bench-immc-{side}-{self.run}")
        pods_seen: set[str] = set()
        counted: set[str] = set()
        pods = Watcher(self.kube, f"/api/v1/namespaces/{ns}/pods")
        ics = Watcher(self.kube, f"{IC_PATH}/namespaces/{ns}/immortalcontainers")
        pods.listeners.append(collect(pods_seen, lambda t, o: t != "DELETED"))
        ics.listeners.append(collect(counted, lambda t, o: (o.get("status") or {}).get("startTimes") == 1))
        await pods.start()
        await ics.start()
        done = ics.expect(lambda t, o, _: len(counted) >= m and len(pods_seen) >= m)
        done_pods = pods.expect(lambda t, o, _: len(counted) >= m and len(pods_seen) >= m)
        async with runner(ns):
            mark = self.audit.mark()
            t0 = time.monotonic()
            await bounded(32, [self.kube.create(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
                "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
                "metadata": {"name": f"ic-{j}"}, "spec": {"image": "busybox:1.36"}}) for j in range(m)])
            created = time.monotonic() - t0
            finished, _ = await asyncio.wait([done, done_pods], timeout=600, return_when=asyncio.FIRST_COMPLETED)
            if not finished:
                raise TimeoutError(f"{side}: {len(counted)}/{m} counted, {len(pods_seen)}/{m} pods after 600 s")
            elapsed = next(iter(finished)).result() - t0
        extra: dict[str, Any] = {"creates_done_s": round(created, 2)}
        if side == "op":
            extra["api"] = per_change(await self.audit.count(mark), m)
        await pods.stop()
        await ics.stop()
        # ImmortalContainers carry no finalizer: they go whether or not an operator runs
        await self.kube.request("DELETE", f"{IC_PATH}/namespaces/{ns}/immortalcontainers")
        await self.cleanup([ns])
        return elapsed, extra

    async def _ns_gone(self, ns: str, timeout: float = 120) -> None:
        await self._gone(f"/api/v1/namespaces/{ns}", timeout)

    def _convergence(self, op_s: float, floor_s: float, extra: dict[str, Any], what: str) -> dict[str, Any]:
        return {"what": what, "operator_s": round(op_s, 2), "floor_s": round(floor_s, 2),
                "ratio": round(op_s / floor_s, 2), "target_1_5x_floor": op_s <= 1.5 * floor_s, **extra}

    async def copyrator_convergence(self) -> dict[str, Any]:
        m = self.n["namespaces"]
        run = self.run
        src = await self.namespace(f"bench-cpc-{run}")
        await self.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
            "metadata": {"name": "conv-src", "labels": {"bench-conv": run}}, "data": {"k": "v"}})
        targets = [f"bench-cpc-{run}-{j}" for j in range(m)]
        t_ns = time.monotonic()
        await bounded(32, [self.namespace(ns, {"bench-cpc-target": run}) for ns in targets])
        ns_created = time.monotonic() - t_ns
        await asyncio.sleep(2)
        if self.operator:
            await self.operator.settle()
        results: dict[str, Any] = {"namespaces_created_s": round(ns_created, 2)}
        timings: dict[str, float] = {}
        for side, copy_name in (("op", "conv-src"), ("floor", "floor-conv-src")):
            seen: set[str] = set()
            watcher = Watcher(self.kube, "/api/v1/configmaps", {"fieldSelector": f"metadata.name={copy_name}"})
            watcher.listeners.append(collect(seen, lambda t, o: o["metadata"]["namespace"] != src
                                             and t != "DELETED", key="namespace"))
            await watcher.start()
            done = watcher.expect(lambda t, o, _, seen=seen: len(seen) >= m)
            mark = self.audit.mark()
            if side == "op":
                t0 = time.monotonic()
                await self.kube.create(f"{RULE_PATH}/namespaces/{src}/copyrators", {
                    "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "conv"},
                    "spec": {"ruleType": "configmap", "selector": {"bench-conv": run}, "namespace": [src],
                             "namespaceSelector": {"matchLabels": {"bench-cpc-target": run}}}})
                timings[side] = await within(done, 600, f"{m} copies") - t0
                results["api"] = per_change(await self.audit.count(mark), m)
            else:
                async with Floor("copyrator", "--source-namespace", src, "--source", "floor-conv-src",
                                 "--ns-label", f"bench-cpc-target={run}", "--copy-name", "floor-conv-src"):
                    t0 = time.monotonic()
                    await self.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
                        "metadata": {"name": "floor-conv-src"}, "data": {"k": "v"}})
                    timings[side] = await within(done, 600, f"{m} floor copies") - t0
            await watcher.stop()
        await self.kube.delete(f"{RULE_PATH}/namespaces/{src}/copyrators/conv")
        await self._gone(f"{RULE_PATH}/namespaces/{src}/copyrators/conv", 300)
        await self.cleanup([src, *targets], wait=300)
        return {**self._convergence(timings["op"], timings["floor"], {},
                                    f"one CopyratorRule created -> its ConfigMap copied into {m} existing namespaces "
                                    "(floor: the source ConfigMap created -> the same copies; writes 16 at a time)"),
                **results}

    async def reroller_convergence(self) -> dict[str, Any]:
        m = self.n["deployments"]
        ns = await self.namespace(f"bench-rrc-{self.run}")
        for cm in ("conv-cfg", "floor-cfg"):
            await self.kube.create(f"/api/v1/namespaces/{ns}/configmaps",
                                   {"metadata": {"name": cm}, "data": {"v": "0"}})
        baselined: set[str] = set()
        rolled: dict[str, set[str]] = {"op": set(), "floor": set()}

        def listener(t: str, o: dict[str, Any], _: float) -> None:
            name = o["metadata"]["name"]
            if f"{RR}/observed-hash" in (o["metadata"].get("annotations") or {}):
                baselined.add(name)
            tmpl = o["spec"]["template"]["metadata"].get("annotations") or {}
            if name.startswith("op-") and f"{RR}/config-hash" in tmpl:
                rolled["op"].add(name)
            if name.startswith("floor-") and f"{FLOOR_LABEL}-config-hash" in tmpl:
                rolled["floor"].add(name)

        deps = Watcher(self.kube, f"/apis/apps/v1/namespaces/{ns}/deployments")
        deps.listeners.append(listener)
        await deps.start()
        base = deps.expect(lambda t, o, _: len(baselined) >= m)
        floor_deps = []
        for j in range(m):
            d = deployment(f"floor-{j}", "floor-cfg", False)
            d["metadata"]["labels"] = {FLOOR_LABEL: "reroller"}
            floor_deps.append(d)
        await bounded(32, [self.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                                            deployment(f"op-{j}", "conv-cfg", True)) for j in range(m)]
                      + [self.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", d) for d in floor_deps])
        await within(base, 300, f"the re-roller's baseline on {m} Deployments")
        assert self.operator
        await self.operator.settle()
        timings: dict[str, float] = {}
        results: dict[str, Any] = {}
        for side, cm in (("op", "conv-cfg"), ("floor", "floor-cfg")):
            done = deps.expect(lambda t, o, _, side=side: len(rolled[side]) >= m)
            mark = self.audit.mark()
            if side == "op":
                await self.kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/{cm}", {"data": {"v": "1"}})
                t0 = time.monotonic()
                timings[side] = await within(done, 600, f"{m} op rollouts") - t0
                await asyncio.sleep(1)
                results["api"] = per_change(await self.audit.count(mark), m)
            else:
                async with Floor("reroller", "--namespace", ns, "--source", cm,
                                 "--workload-label", f"{FLOOR_LABEL}=reroller"):
                    await self.kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/{cm}", {"data": {"v": "1"}})
                    t0 = time.monotonic()
                    timings[side] = await within(done, 600, f"{m} floor rollouts") - t0
        await deps.stop()
        await self.cleanup([ns], wait=300)
        return {**self._convergence(timings["op"], timings["floor"], {},
                                    f"one ConfigMap used by {m} Deployments edited -> all {m} pod templates patched "
                                    "(operator: REROLLER_DEBOUNCE_SECONDS=0, REROLLER_MIN_INTERVAL_SECONDS=0)"),
                **results}

    # memory

    async def memory(self) -> dict[str, Any]:
        self.stop_operator()
        self.start_operator()
        assert self.operator
        warm = await self.steady_state("mem")
        await asyncio.sleep(5)
        await self.operator.settle()
        idle = self.operator.status()
        ns_pods = await self.namespace(f"bench-mem-pods-{self.run}")
        ns_cfg = await self.namespace(f"bench-mem-cfg-{self.run}")
        t0 = time.monotonic()
        pod_body = {"metadata": {"labels": {"app": "unrelated"}},
                    "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "c", "image": "busybox:1.36"}]}}

        async def create(path: str, body: dict[str, Any]) -> None:
            # Under this load the API server may drop a keep-alive connection: retry; 409 = it got through.
            for attempt in range(5):
                try:
                    await self.kube.create(path, body)
                    return
                except ApiError as exc:
                    if exc.status == 409:
                        return
                    if exc.status < 500 and exc.status != 429:
                        raise
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5 * (attempt + 1))
            await self.kube.create(path, body)

        async def pod(j: int) -> None:
            body = json.loads(json.dumps(pod_body))
            body["metadata"]["name"] = f"p-{j}"
            await create(f"/api/v1/namespaces/{ns_pods}/pods", body)

        async def cm(j: int) -> None:
            await create(f"/api/v1/namespaces/{ns_cfg}/configmaps",
                         {"metadata": {"name": f"cm-{j}"}, "data": {"key": f"value-{j}" * 8}})

        async def secret(j: int) -> None:
            await create(f"/api/v1/namespaces/{ns_cfg}/secrets",
                         {"metadata": {"name": f"s-{j}"}, "stringData": {"key": f"value-{j}" * 8}})

        await bounded(64, [pod(j) for j in range(self.n["pods"])])
        pods_s = time.monotonic() - t0
        await bounded(64, [cm(j) for j in range(self.n["configmaps"])] + [secret(j) for j in range(self.n["secrets"])])
        created_s = time.monotonic() - t0
        await asyncio.sleep(5)
        settle = await self.operator.settle(timeout=300)
        after = self.operator.status()
        growth = (after["VmRSS"] - idle["VmRSS"]) / 1024
        result = {"idle_rss_mb": round(idle["VmRSS"] / 1024, 1), "idle_hwm_mb": round(idle["VmHWM"] / 1024, 1),
                  "loaded_rss_mb": round(after["VmRSS"] / 1024, 1), "loaded_hwm_mb": round(after["VmHWM"] / 1024, 1),
                  "growth_mb": round(growth, 1),
                  "objects": {"pods": self.n["pods"], "configmaps": self.n["configmaps"], "secrets": self.n["secrets"]},
                  "pods_created_s": round(pods_s, 1), "all_created_s": round(created_s, 1),
                  "settled_after_s": round(settle, 1),
                  "target_idle_80mb": idle["VmRSS"] / 1024 <= 80, "target_growth_20mb": growth <= 20}
        await self.kube.delete(f"{RULE_PATH}/namespaces/{warm}/copyrators/idle")
        await self._gone(f"{RULE_PATH}/namespaces/{warm}/copyrators/idle", 60)
        await self.cleanup([ns_pods, ns_cfg, warm], wait=300)
        return result

    async def main(self) -> dict[str, Any]:
        started = time.monotonic()
        await self.setup()
        self.start_operator()
        try:
            await self.timed_section("idle", self.idle)
            await self.timed_section("immortal_latency", self.immortal_latency)
            await self.timed_section("copyrator_latency", self.copyrator_latency)
            await self.timed_section("reroller_latency", self.reroller_latency)
            await self.timed_section("immortal_convergence", self.immortal_convergence)
            await self.timed_section("copyrator_convergence", self.copyrator_convergence)
            await self.timed_section("reroller_convergence", self.reroller_convergence)
            if self.operator and self.operator.proc:
                mem = self.operator.status()
                self.results["rss_after_sections"] = {"rss_mb": round(mem["VmRSS"] / 1024, 1),
                                                      "hwm_mb": round(mem["VmHWM"] / 1024, 1)}
            await self.timed_section("reroller_latency_defaults", self.reroller_latency_defaults)
            await self.timed_section("memory", self.memory)
        finally:
            self.stop_operator()
            if self.namespaces:
                await self.cleanup(list(self.namespaces), wait=60)
            await self.kube.close()
        self.results["meta"] = {
            "run": self.run, "counts": self.n, "total_seconds": round(time.monotonic() - started, 1),
            "machine": f"{os.cpu_count()} CPUs, {platform.platform()}", "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "operator": "kopf run --peering=kopf-operators --all-namespaces operators/*.py (all four operators, "
                        "log level info) as a cluster-admin ServiceAccount; latency and convergence runs with "
                        "REROLLER_DEBOUNCE_SECONDS=0 REROLLER_MIN_INTERVAL_SECONDS=0",
            "reloader": RELOADER_NOTE,
        }
        return self.results


RELOADER_NOTE = ("not measured: `GOTOOLCHAIN=local go install github.com/stakater/Reloader@latest` (and @v1.4.2, "
                 "@v1.0.119) fails: the Go module proxy answers `403 Forbidden: This module version is not "
                 "available` for github.com/stakater/Reloader (its version list too)")


def deployment(name: str, cm: str, opted_in: bool) -> dict[str, Any]:
    annotations = {f"{RR}/auto": "true"} if opted_in else {}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                                           "envFrom": [{"configMapRef": {"name": cm}}]}]}}}}


# --- the report ----------------------------------------------------------------------------------


def mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("pass" if ok else "**miss**")


def render(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    lines = [f"Benchmarks (`make bench`, run {meta.get('run')}, {meta.get('date')}, {meta.get('machine')}, "
             f"{meta.get('total_seconds')} s). Operator: {meta.get('operator')}. Each figure was measured in the "
             "same run as its floor (a minimal asyncio/aiohttp client making the same writes, bench/floor.py); "
             "latency alternates operator and floor event by event.", "",
             "| Measure | Operator | Floor | Ratio | Target | Result |", "|---|---|---|---|---|---|"]

    def lat(label: str, r: dict[str, Any] | None) -> None:
        if not r or "operator" not in r:
            lines.append(f"| {label} | error: {(r or {}).get('error', 'not run')} | | | | |")
            return
        o, f = r["operator"], r["floor"]
        by_design = "n/a (the 2 s debounce is by design)" if "defaults" in label else None
        lines.append(f"| {label}: p50 | {o['p50_ms']} ms | {f['p50_ms']} ms | {r['ratio_p50']}x | ≤ 2x floor | "
                     f"{by_design or mark(r['target_p50_2x_floor'])} |")
        lines.append(f"| {label}: p99 (n={o['n']}) | {o['p99_ms']} ms | {f['p99_ms']} ms | {r['ratio_p99']}x | "
                     f"≤ 250 ms | {by_design or mark(r['target_p99_250ms'])} |")

    lat("Immortal: pod deleted → replacement created", results.get("immortal_latency"))
    cp = results.get("copyrator_latency") or {}
    lat("Copyrator: namespace created → copy exists", cp.get("namespace_created") or cp or None)
    lat("Copyrator: source edited → 5 copies updated", cp.get("source_edited") or cp or None)
    lat("Re-roller: ConfigMap edited → template patched (debounce 0)", results.get("reroller_latency"))
    lat("Re-roller, defaults (debounce 2 s, min interval 10 s)", results.get("reroller_latency_defaults"))

    def conv(label: str, r: dict[str, Any] | None) -> None:
        if not r or "operator_s" not in r:
            lines.append(f"| {label} | error: {(r or {}).get('error', 'not run')} | | | | |")
            return
        lines.append(f"| {label} | {r['operator_s']} s | {r['floor_s']} s | {r['ratio']}x | ≤ 1.5x floor | "
                     f"{mark(r['target_1_5x_floor'])} |")

    n = meta.get("counts", {})
    conv(f"Convergence: {n.get('ics')} ImmortalContainers", results.get("immortal_convergence"))
    conv(f"Convergence: 1 CopyratorRule → {n.get('namespaces')} namespaces", results.get("copyrator_convergence"))
    conv(f"Convergence: 1 ConfigMap → {n.get('deployments')} Deployments", results.get("reroller_convergence"))
    mem = results.get("memory") or {}
    if "idle_rss_mb" in mem:
        lines.append(f"| Memory: idle RSS (HWM) | {mem['idle_rss_mb']} MB ({mem['idle_hwm_mb']} MB) | | | ≤ 80 MB | "
                     f"{mark(mem['target_idle_80mb'])} |")
        lines.append(f"| Memory: growth with {mem['objects']['pods']} pods + {mem['objects']['configmaps']} ConfigMaps"
                     f" + {mem['objects']['secrets']} Secrets (RSS {mem['loaded_rss_mb']} MB, HWM "
                     f"{mem['loaded_hwm_mb']} MB) | +{mem['growth_mb']} MB | | | ≤ 20 MB | "
                     f"{mark(mem['target_growth_20mb'])} |")
    else:
        lines.append(f"| Memory | error: {mem.get('error', 'not run')} | | | | |")
    idle = results.get("idle") or {}
    if "requests" in idle:
        verbs = ", ".join(f"{v} {c}" for v, c in idle["requests"]["by_verb"].items()) or "none"
        peering = (f" ({idle['writes_excluding_peering']} excluding the peering heartbeat)"
                   if idle["writes"] else "")
        lines.append(f"| API when idle ({idle['window_seconds']} s, 1 object per operator) | {verbs} "
                     f"({idle['requests_per_minute']}/min) | | | 0 writes | {mark(idle['writes'] == 0)}{peering} |")
    lines += ["", "API requests per handled change (operator, from the audit log):", "",
              "| Change | Requests | Writes | By verb |", "|---|---|---|---|"]
    for label, r in (("pod deleted (immortal)", results.get("immortal_latency")),
                     ("namespace created (copyrator)", cp.get("namespace_created")),
                     ("source edited, 5 copies (copyrator)", cp.get("source_edited")),
                     ("ConfigMap edited (re-roller)", results.get("reroller_latency"))):
        if r and "api_per_change" in r:
            a = r["api_per_change"]
            lines.append(f"| {label} | {a['requests']} | {a['writes']} | "
                         f"{', '.join(f'{v} {c}' for v, c in a['by_verb'].items())} |")
    conv_api = (("per ImmortalContainer (convergence)",
                 (results.get("immortal_convergence") or {}).get("operator", {}).get("api")),
                ("per namespace (copyrator convergence)", (results.get("copyrator_convergence") or {}).get("api")),
                ("per Deployment (re-roller convergence)", (results.get("reroller_convergence") or {}).get("api")))
    for label, r in conv_api:
        if r:
            lines.append(f"| {label} | {r['total_per_change']} | {r['writes_per_change']} | "
                         f"{', '.join(f'{v} {c}' for v, c in r['by_verb_per_change'].items())} |")
    for section, why in (meta.get("rerun_sections") or {}).items():
        lines.append(f"\n`{section}`: {why}.")
    lines += ["", f"stakater Reloader (peer): {meta.get('reloader')}.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts; results to bench/results-quick.*")
    parser.add_argument("--only", nargs="*", help="run only these sections")
    parser.add_argument("--output", help="results file prefix (default bench/results or bench/results-quick)")
    parser.add_argument("--render", metavar="JSON", help="only re-render the markdown of a results JSON file")
    args = parser.parse_args()
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
        print(path.with_suffix(".md").read_text())
        return
    sections = ["idle", "immortal_latency", "copyrator_latency", "reroller_latency", "immortal_convergence",
                "copyrator_convergence", "reroller_convergence", "reroller_latency_defaults", "memory"]
    bench = Bench(QUICK if args.quick else FULL, args.only or sections)
    results = asyncio.run(bench.main())
    prefix = Path(args.output) if args.output else REPO / "bench" / ("results-quick" if args.quick else "results")
    prefix.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    prefix.with_suffix(".md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
