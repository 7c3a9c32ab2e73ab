"""What every benchmark section shares: the operator and floor processes, process sampling (RSS, CPU),
the audit log's counts, namespaces of the run and their cleanup, and the figures' arithmetic.

Paths, kubectl, tokens, the ``kopf run`` launcher, the audit log reader and percentiles come from
testsupport/ (shared with tests/); nothing here imports from tests/. bench/kube.py is its client.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp

from bench.kube import ApiError, Kube, bounded
from testsupport.audit import AuditLog
from testsupport.kubectl import kubectl, wait_crds_served
from testsupport.launcher import KopfProcess
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, REPO
from testsupport.stats import summary_ms
from testsupport.tokens import token_kubeconfig

SA_NAMESPACE = "kopf-bench"
SA_NAME = "kopf-bench-operator"
PEER_SA_NAME = "kopf-bench-peer"  # the Go peers' identity, so the audit log attributes their requests too
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"
PEER_USER = f"system:serviceaccount:{SA_NAMESPACE}:{PEER_SA_NAME}"
IC_PATH = "/apis/immortalcontainer.flugel.it/v1alpha1"
RULE_PATH = "/apis/flant.com/v1"
FLOOR_LABEL = "bench.kopf-operators.dev/floor"
BENCH_LABEL = "bench.kopf-operators.dev/run"
RR = "reroller.kopf-operators.dev"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
READ_VERBS = {"get", "list"}
OPERATORS = ("immortal", "copyrator", "reroller", "blackadder")

FULL: dict[str, Any] = dict(
    events=100, ics=1000, namespaces=500, deployments=200, pods=10000, configmaps=2500, secrets=2500, idle=60,
    default_events=10, unrelated_changes=45, fairness_deployments=300, fairness_rounds=5, restart_configmaps=50000,
    restart_ics=0, push_bytes_configmaps=700, takeover_configmaps=10000, takeover_ics=50,
    scale_events=50, scale_foreign_events=10,
    scale_pods=[0, 10000, 20000], scale_namespaces=[0, 1000, 3000, 5000], memory_namespaces=3000,
    peer_events=50, tenant_baseline=30, tenant_abuse=90,
    shard_namespaces=60, shard_configmaps=50, shard_changes=1500, shard_reactions=15, wave_deployments=200)
QUICK: dict[str, Any] = dict(
    events=10, ics=50, namespaces=20, deployments=10, pods=300, configmaps=100, secrets=100, idle=10,
    default_events=3, unrelated_changes=45, fairness_deployments=100, fairness_rounds=2, restart_configmaps=2000,
    restart_ics=0, push_bytes_configmaps=700, takeover_configmaps=500, takeover_ics=5,
    scale_events=10, scale_foreign_events=3,
    scale_pods=[0, 300, 600], scale_namespaces=[0, 50, 100, 150], memory_namespaces=100,
    peer_events=10, tenant_baseline=30, tenant_abuse=60,
    shard_namespaces=12, shard_configmaps=10, shard_changes=120, shard_reactions=6, wave_deployments=40)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


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


async def within(fut: Awaitable[Any], timeout: float, what: str) -> Any:
    try:
        return await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}") from None


def operator_files(spec: str | None, root: Path = REPO) -> list[str]:
    """The operator files to load, relative to ``root``: ``spec`` (comma/space separated), else
    $OPERATOR_FILES, else all of operators/*.py."""
    spec = spec or os.environ.get("OPERATOR_FILES", "")
    if spec.strip():
        files = [f for f in spec.replace(",", " ").split() if f]
    else:
        files = sorted(str(p.relative_to(root)) for p in (root / "operators").glob("*.py"))
    for f in files:
        if not (root / f).is_file():
            raise SystemExit(f"no such operator file: {root / f}")
    return files


# --- processes -----------------------------------------------------------------------------------


class Proc:
    """Figures of a running process from /proc: RSS, CPU seconds, quiet-waiting."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def status(self) -> dict[str, int]:
        """VmRSS and VmHWM in kB, from /proc/<pid>/status."""
        values = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
        return values

    def rss_mb(self) -> float:
        return round(self.status()["VmRSS"] / 1024, 1)

    def cpu_seconds(self) -> float:
        """utime + stime of the process (all its threads), from /proc/<pid>/stat."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def main_thread_cpu_seconds(self) -> float:
        """utime + stime of the main thread only (the event loop of an asyncio process)."""
        fields = Path(f"/proc/{self.pid}/task/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
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


class Operator(KopfProcess):
    """``kopf-operators run`` as the chart runs it (all namespaces, info logs), as a ServiceAccount;
    ``files`` are the operator files it loads (all four by default), relative to ``root``."""

    def __init__(self, kubeconfig: Path, env: dict[str, str], log_path: Path, files: list[str],
                 root: Path = REPO) -> None:
        # Metrics served, as the chart ships them (on a free port).
        super().__init__(files, kubeconfig, log_path, env, verbose=False, root=root, log_env=True)

    def start(self, timeout: float = 90) -> None:
        super().start(timeout)

    @property
    def p(self) -> Proc:
        assert self.proc is not None, "the operator is not running"
        return Proc(self.proc.pid)

    def status(self) -> dict[str, int]:
        return self.p.status()

    def cpu_seconds(self) -> float:
        return self.p.cpu_seconds()

    async def settle(self, quiet: float = 0.02, window: float = 3.0, timeout: float = 300) -> float:
        return await self.p.settle(quiet, window, timeout)

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_lines_since(self, offset: int) -> list[str]:
        with self.log_path.open("rb") as fh:
            fh.seek(offset)
            return [ln for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]


class Floor:
    """A floor client (bench/floor.py) as a subprocess, ready once it printed ``ready``."""

    def __init__(self, mode: str, *args: str, kubeconfig: Path = KUBECONFIG) -> None:
        """``kubeconfig``: the admin's by default (unaudited); the peer's ServiceAccount to see its
        requests in the audit log."""
        self.cmd = [sys.executable, "-m", "bench.floor", mode, "--kubeconfig", str(kubeconfig), *args]
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Floor:
        self.proc = await asyncio.create_subprocess_exec(*self.cmd, cwd=REPO, stdout=asyncio.subprocess.PIPE)
        assert self.proc.stdout is not None
        line = await within(self.proc.stdout.readline(), 60, "the floor to be ready")
        if line.strip() != b"ready":
            raise RuntimeError(f"floor {self.cmd} failed to start")
        return self

    @property
    def p(self) -> Proc:
        assert self.proc is not None
        return Proc(self.proc.pid)

    async def __aexit__(self, *_: Any) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


# --- the audit log ------------------------------------------------------------------------------


class Audit(AuditLog):
    """The audit log, counted per ServiceAccount (the benchmark's operator by default)."""

    def requests(self, start: int, end: int | None = None, user: str = SA_USER) -> Counter[str]:
        return super().requests(start, end, user)

    async def count(self, start: int, end: int | None = None, user: str = SA_USER) -> dict[str, Any]:
        """The requests between two marks: by verb, and by verb+resource (after the server flushed)."""
        await asyncio.sleep(1.0)  # let the API server flush its audit writes
        return totals(self.requests(start, end, user))


def totals(detail: Counter[str]) -> dict[str, Any]:
    verbs: Counter[str] = Counter()
    for key, n in detail.items():
        verbs[key.split()[0]] += n
    return {"by_verb": dict(sorted(verbs.items())), "by_verb_resource": dict(sorted(detail.items())),
            "writes": sum(n for v, n in verbs.items() if v in WRITE_VERBS),
            "reads": sum(n for v, n in verbs.items() if v in READ_VERBS),
            "total": sum(verbs.values())}


def per_change(counts: dict[str, Any], changes: int) -> dict[str, Any]:
    return {"changes": changes, "total_per_change": round(counts["total"] / changes, 2),
            "writes_per_change": round(counts["writes"] / changes, 2),
            "by_verb_per_change": {v: round(n / changes, 2) for v, n in counts["by_verb"].items()},
            "by_verb_resource": counts["by_verb_resource"]}


def api_per_change(audit: Counter[str], n: int) -> dict[str, Any]:
    """Requests per change from summed "verb resource" counts (the latency sections' format)."""
    t = totals(audit)
    return {"changes": n, "requests": round(t["total"] / n, 2), "writes": round(t["writes"] / n, 2),
            "reads": round(t["reads"] / n, 2),
            "by_verb": {v: round(c / n, 2) for v, c in t["by_verb"].items()},
            "by_verb_resource": {k: round(c / n, 2) for k, c in sorted(audit.items())}}


def latency(op: list[float], floor: list[float], audit: Counter[str], n: int, what: str) -> dict[str, Any]:
    o, f = summary_ms(op), summary_ms(floor)
    return {"what": what, "operator": o, "floor": f,
            "ratio_p50": round(o["p50_ms"] / f["p50_ms"], 2), "ratio_p99": round(o["p99_ms"] / f["p99_ms"], 2),
            "target_p50_2x_floor": o["p50_ms"] <= 2 * f["p50_ms"], "target_p99_250ms": o["p99_ms"] <= 250,
            "api_per_change": api_per_change(audit, n)}


async def timed_change(b: Bench, change: Awaitable[Any], done: asyncio.Future[float], seen: asyncio.Future[float],
                       what: str, into: list[float], audit: Counter[str] | None) -> None:
    """One measured change: the write ``change`` (a coroutine, run here), then its effect ``done`` (60 s at
    most). The latency, from the write's response or its own event ``seen`` (``origin``), goes into
    ``into``; with ``audit``, the operator's requests meanwhile are counted there (50 ms later, so that
    the last ones are in the log)."""
    mark = b.a.mark()
    await change
    t0 = time.monotonic()
    t1 = await within(done, 60, what)
    t0 = await origin(t0, seen)
    into.append(t1 - t0)
    if audit is not None:
        await asyncio.sleep(0.05)
        audit.update(b.a.requests(mark, b.a.mark()))


async def sub_sections(b: Bench, section: str,
                       parts: Iterable[tuple[str, Callable[[Bench], Awaitable[dict[str, Any]]]]]) -> dict[str, Any]:
    """A section made of parts run one after the other: each part's figures and seconds, or its error
    (logged with its traceback); one part failing keeps the others' figures."""
    results: dict[str, Any] = {}
    for name, fn in parts:
        started = time.monotonic()
        try:
            results[name] = await fn(b)
        except Exception as exc:
            log(f"  {section}/{name} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.monotonic() - started, 1)
    return results


def convergence(op_s: float, floor_s: float, extra: dict[str, Any], what: str) -> dict[str, Any]:
    return {"what": what, "operator_s": round(op_s, 2), "floor_s": round(floor_s, 2),
            "ratio": round(op_s / floor_s, 2), "target_1_5x_floor": op_s <= 1.5 * floor_s, **extra}


KWOK_NODE = "kwok-node-0"


def on_kwok() -> dict[str, Any]:
    """A pod spec bound to the KWOK node (which marks its pods Running and Ready)."""
    return {"nodeName": KWOK_NODE, "containers": [{"name": "c", "image": "busybox:1.36"}],
            "tolerations": [{"operator": "Exists"}]}


def deployment(name: str, cm: str, opted_in: bool, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Deployment with no replicas (no pod churn) whose container reads ConfigMap ``cm``."""
    ann = {f"{RR}/auto": "true"} if opted_in else {}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "annotations": {**ann, **(annotations or {})}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                                           "envFrom": [{"configMapRef": {"name": cm}}]}]}}}}


# --- the run's context ---------------------------------------------------------------------------


class Bench:
    """One benchmark run: its id, client, audit log, operator process and namespaces."""

    def __init__(self, counts: dict[str, Any], sections: list[str], files: list[str], root: Path = REPO) -> None:
        self.n = counts
        self.sections = sections
        self.files = files
        self.root = root  # the checkout the operator runs from (its files, package and CRDs)
        self.run = uuid.uuid4().hex[:5]
        self.kube = Kube(KUBECONFIG, limit=80)
        self.results: dict[str, Any] = {}
        self.audit: Audit | None = None
        self.operator: Operator | None = None
        self.sa_kubeconfig = CLUSTER_DIR / "bench-operator-kubeconfig"
        self.peer_kubeconfig = CLUSTER_DIR / "bench-peer-kubeconfig"
        self.namespaces: list[str] = []
        self.operator_env: dict[str, str] = {}

    @property
    def a(self) -> Audit:
        assert self.audit is not None
        return self.audit

    def loaded(self, operator: str) -> bool:
        """Whether the operator process loads operators/<operator>.py."""
        return any(Path(f).stem == operator for f in self.files)

    def not_loaded(self, *operators: str) -> dict[str, Any] | None:
        missing = [o for o in operators if not self.loaded(o)]
        if missing:
            return {"skipped": f"operator(s) not loaded in this run: {', '.join(missing)} "
                               f"(operator files: {' '.join(self.files)})"}
        return None

    async def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        await self.create_retrying("/api/v1/namespaces", {"metadata": {
            "name": name, "labels": {BENCH_LABEL: self.run, **(labels or {})}}})
        self.namespaces.append(name)
        return name

    async def create_retrying(self, path: str, body: dict[str, Any]) -> None:
        """Create under load: the API server may drop a keep-alive connection or answer 429/5xx; retry.
        409 means an earlier attempt got through."""
        for attempt in range(5):
            try:
                await self.kube.create(path, body)
                return
            except ApiError as exc:
                if exc.status == 409:
                    return
                if exc.status < 500 and exc.status != 429:
                    raise
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5 * (attempt + 1))
        await self.kube.create(path, body)

    async def cleanup(self, names: Iterable[str], wait: float = 180) -> None:
        """Delete namespaces (pods first, with no grace, so KWOK has nothing to wait for)."""
        names = list(names)

        async def one(ns: str) -> None:
            try:  # a collection of thousands can outlast the API server's request timeout: then the
                # namespace deletion finishes the job
                await self.kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                        params={"gracePeriodSeconds": "0"})
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log(f"  deleting the pods of {ns}: {type(exc).__name__}: {exc}")
            try:
                await self.kube.delete(f"/api/v1/namespaces/{ns}")
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log(f"  deleting {ns}: {type(exc).__name__}: {exc}")

        await bounded(16, [one(ns) for ns in names])
        deadline = time.monotonic() + wait
        pending = set(names)
        while pending and time.monotonic() < deadline:
            listing = await self.kube.get("/api/v1/namespaces", labelSelector=f"{BENCH_LABEL}={self.run}")
            pending &= {o["metadata"]["name"] for o in listing["items"]}
            if pending:
                await asyncio.sleep(1)
        gone = set(names)
        self.namespaces = [ns for ns in self.namespaces if ns not in gone]
        if pending:
            log(f"  {len(pending)} namespace(s) still terminating; moving on")

    async def gone(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.kube.request("GET", path, ok_missing=True) is None:
                return
            await asyncio.sleep(0.5)
        log(f"  {path} still there after {timeout}s")

    def start_operator(self, env: dict[str, str] | None = None) -> None:
        if env is None:  # {} means the shipped defaults
            # Unthrottled, as the floor is: no merge window, no per-workload or cluster-wide rate limit.
            env = {"REROLLER_DEBOUNCE_SECONDS": "0", "REROLLER_MIN_INTERVAL_SECONDS": "0",
                   "REROLLER_CLUSTER_ROLLOUTS_PER_SECOND": "0"}
        self.operator_env = env
        self.operator = Operator(self.sa_kubeconfig, env, CLUSTER_DIR / "logs" / f"bench-operator-{self.run}.log",
                                 self.files, self.root)
        self.operator.start()

    def stop_operator(self) -> None:
        if self.operator:
            self.operator.stop()

    def restart_operator(self, env: dict[str, str] | None = None) -> None:
        self.stop_operator()
        self.start_operator(env)

    async def start_with_objects_in_place(self, timeout: float = 600) -> tuple[float, dict[str, int]]:
        """A new operator process (same environment) over what the section created: seconds until it
        is quiet, and its VmRSS/VmHWM then. Kopf holds every listed object's event until all indexes
        are filled, so this high-water mark, not the growth at rest, is what a memory limit must fit."""
        self.restart_operator(self.operator_env)
        assert self.operator is not None
        started = time.monotonic()
        await self.operator.settle(timeout=timeout)
        return time.monotonic() - started, self.operator.status()

    async def setup(self) -> None:
        subprocess.run([str(REPO / "cluster" / "cluster.sh"), "up"], check=True, timeout=3600,
                       env={**os.environ, "CLUSTER_DIR": str(CLUSTER_DIR)})
        self.audit = Audit()
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(self.root / "manifests" / "crds"), timeout=300)
        wait_crds_served(self.root / "manifests" / "crds")
        items: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SA_NAMESPACE}}]
        for sa in (SA_NAME, PEER_SA_NAME):
            items += [
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": SA_NAMESPACE}},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": sa},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                 "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": SA_NAMESPACE}]}]
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
                timeout=300)
        token_kubeconfig(SA_NAME, SA_NAMESPACE, self.sa_kubeconfig)
        token_kubeconfig(PEER_SA_NAME, SA_NAMESPACE, self.peer_kubeconfig)

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

    async def end_steady_state(self, ns: str) -> None:
        await self.kube.delete(f"{RULE_PATH}/namespaces/{ns}/copyrators/idle")
        await self.gone(f"{RULE_PATH}/namespaces/{ns}/copyrators/idle", 60)
        await self.cleanup([ns])


async def py_spy(pid: int) -> asyncio.subprocess.Process | None:
    """``py-spy record`` attached to ``pid`` when BENCH_PYSPY names an output file (raw format, at
    BENCH_PYSPY_RATE samples per second, 50 unless set), else None. Stop it with ``py_spy_stop``."""
    out = os.environ.get("BENCH_PYSPY")
    if not out:
        return None
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    rate = os.environ.get("BENCH_PYSPY_RATE", "50")
    proc = await asyncio.create_subprocess_exec(exe, "record", "--pid", str(pid), "--format", "raw", "--threads",
                                                "--rate", rate, "--output", out, "--nonblocking",
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    await asyncio.sleep(1)  # attached
    return proc


async def py_spy_stop(spy: asyncio.subprocess.Process | None) -> None:
    if spy is not None:
        spy.send_signal(2)  # py-spy writes its profile on SIGINT
        await spy.wait()
