"""The soak (``make soak``): the operator process under steady, mixed churn of all four operators for
an hour (``--quick``: 10 minutes), sampled from inside every minute, then a report of what grew.

    .venv/bin/python -m bench.soak                       # 60 minutes -> .bench/soak.{json,md}
    .venv/bin/python -m bench.soak --quick               # 10 minutes (a change that touches state)
    .venv/bin/python -m bench.soak --minutes 240 --ic-rate 60
    .venv/bin/python -m bench.soak --render .bench/soak.json   # re-render the markdown only

Two replicas on a Lease (the chart's HA), as in bench/sections/takeover.py, both with the process's
opt-in diagnostics on (DIAGNOSTICS_FILE, core/diagnostics.py: a JSON line per minute of RSS, heap
growers, tasks, descriptors, index and per-key state sizes, metric series). Every ``--takeover-minutes``
(``--quick``: once, at the middle) the holder gets SIGTERM (its pod deleted) and comes back as the
standby, a new process. The churn, each part at its own rate (per minute), in namespaces of the
soak's own (``soak-*``, labelled with the run id, deleted at the end):

- ImmortalContainers created, edited (their image) and deleted, and their pods deleted (timed: pod
  deleted -> its replacement ``ADDED``);
- namespaces created and deleted under a CopyratorRule (namespaceSelector) and a pushed ConfigMap
  (the targets consent with ``accept-from``) (timed: namespace created -> the rule's copy ``ADDED``);
- ConfigMaps and Secrets edited under re-rolled Deployments on the KWOK node (timed: edit -> pod
  template changed), and under Deployments with a restart window that opens and closes every 2 minutes;
- ChaosAgents cycling, alternately real and dry-run, confined to one namespace of the soak (one kill
  per cycle at most, podTolerance 1).

The report (bench/soak.py ``analyse``): the least-squares slope of every sampled series of each
process over the last 40 minutes (``--quick``: the last 80 %), the reactions' p50/p99 over the first
10 minutes against the last 10 (``--quick``: the first and last 2), and every ERROR/WARNING line of the
operator's logs; targets: RSS slope <= 1 MB/h, no count growing with time, p99 last <= 1.2x first, no
errors. Not in CI. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import json
import os
import random
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.harness import (
    BENCH_LABEL,
    IC_PATH,
    QUICK,
    RR,
    RULE_PATH,
    SA_NAMESPACE,
    Bench,
    Operator,
    log,
    on_kwok,
    operator_files,
)
from bench.kube import ApiError, Watcher
from bench.sections.takeover import acting, replica, until
from testsupport.paths import CLUSTER_DIR, REPO
from testsupport.stats import summary_ms

CHAOS_PATH = "/apis/blackadder.io/v1beta1/chaosagents"
# Opens at every even minute for one minute: rollouts held, then released, all through the soak.
WINDOW = json.dumps({"timezone": "UTC", "windows": [{"cron": "*/2 * * * *", "duration": "1m"}]})
LOG_PROBLEM = re.compile(r"\[(ERROR|WARNING|CRITICAL) *\]|Traceback")
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
WARM_UP_S = 120  # a process's first two minutes: its indexes fill, its watches open
# Slopes need this many samples of one role (10 minutes at the default period) to tell a slope of
# 1 MB per hour from noise; a shorter span (a --quick run's) lists them, not judged.
MIN_JUDGED_SAMPLES = 10
# A count may move with the live objects; growing by more than this over the window, it grows with time.
COUNT_TOLERANCE = (3, 0.10)  # absolute, and relative to the window's mean


def least_squares(points: list[tuple[float, float]]) -> float:
    """The slope of y over x (0 with fewer than 2 distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def flatten(sample: dict[str, Any]) -> dict[str, float]:
    """The numeric series of one diagnostics sample, by dotted name."""
    out: dict[str, float] = {"rss_kb": sample["rss_kb"], "heap.traced_bytes": sample["heap"]["traced_bytes"],
                             "tasks": sample["tasks"]["total"], "fds": sample["fds"], "sockets": sample["sockets"]}
    for name, sizes in sample["indexes"].items():
        out[f"index.{name}.keys"] = sizes["keys"]
        out[f"index.{name}.values"] = sizes["values"]
    for memo, sizes in sample["controllers"].items():
        for attr, n in sizes.items():
            out[f"state.{memo}.{attr}"] = n
    for metric, n in sample["metric_series"].items():
        out[f"series.{metric}"] = n
    return out


def trends(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per series of ``samples``: its slope per hour (least squares), its first and last value, and
    whether a count grows with time (beyond what the live objects move)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for name, value in flatten(s).items():
            series.setdefault(name, []).append(((s["time"] - samples[0]["time"]) / 3600, value))
    hours = (samples[-1]["time"] - samples[0]["time"]) / 3600
    out: dict[str, Any] = {}
    for name, points in sorted(series.items()):
        slope = least_squares(points)
        mean = sum(y for _, y in points) / len(points)
        entry: dict[str, Any] = {"slope_per_hour": round(slope, 2), "first": points[0][1], "last": points[-1][1],
                                 "samples": len(points)}
        if name not in ("rss_kb", "heap.traced_bytes"):
            entry["grows"] = slope * hours > max(COUNT_TOLERANCE[0], COUNT_TOLERANCE[1] * mean)
        out[name] = entry
    return {"minutes": round(hours * 60, 1), "samples": len(samples), "series": out,
            "top_growers_since_start": samples[-1]["heap"]["growers_since_start"]}


def spans(samples: list[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    """The process's samples between ``start`` and ``end`` (epoch seconds), past its warm-up, cut where
    its role changes (a standby keeps other state than the holder): each span of 3 samples or more,
    with its trends."""
    kept = [s for s in samples if start <= s["time"] <= end and s["uptime_s"] >= WARM_UP_S]
    cut: list[list[dict[str, Any]]] = []
    for s in kept:
        if cut and cut[-1][-1]["acting"] == s["acting"]:
            cut[-1].append(s)
        else:
            cut.append([s])
    return [{"role": "acting" if part[0]["acting"] else "standby", **trends(part)} for part in cut if len(part) >= 3]


def read_samples(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def log_problems(paths: list[Path], start: float, end: float) -> list[str]:
    """Every ERROR/WARNING/CRITICAL record (with its traceback) the operator's logs hold between
    ``start`` and ``end`` (epoch seconds: the churn, not the soak's own set-up and clean-up)."""
    found = []
    for path in paths:
        if not path.exists():
            continue
        records: list[str] = []
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("[", "=====")) or not records:
                records.append(line)
            else:
                records[-1] += "\n" + line
        for rec in records:
            stamp = LOG_TIME.match(rec)
            at = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S").timestamp() if stamp else 0
            if start <= at <= end and (LOG_PROBLEM.search(rec.partition("\n")[0]) or "Traceback" in rec):
                found.append(f"{path.name}: {rec}")
    return found


class Soak:
    """One soak: the churn's parts, the reactions it times, the takeovers, the replicas' files."""

    def __init__(self, b: Bench, args: argparse.Namespace) -> None:
        self.b = b
        self.args = args
        self.run = b.run
        self.started = 0.0
        self.deadline = 0.0
        self.epoch = (0.0, 0.0)
        self.reactions: dict[str, list[tuple[float, float]]] = {"immortal": [], "copyrator": [], "reroller": []}
        self.counts: dict[str, int] = {}
        self.takeovers: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.lease = f"soak-{self.run}"
        self.out = CLUSTER_DIR / "logs" / f"soak-{self.run}"
        self.replicas: dict[str, Operator] = {}
        self.diagnostics: list[Path] = []
        self.ns = {part: f"soak-{part}-{self.run}" for part in ("ic", "src", "rr", "chaos")}
        self.targets: list[str] = []
        self.target_seq = 0
        self.ics: set[str] = set()
        self.ic_seq = 0
        self.agent_seq = 0

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # --- the replicas -------------------------------------------------------------------------------

    def start_replica(self, side: str) -> Operator:
        """A replica with diagnostics on; a new file per process (a restart is a new process)."""
        starts = sum(1 for p in self.diagnostics if p.name.startswith(f"{side}-"))
        path = self.out / f"{side}-{starts + 1}.jsonl"
        self.diagnostics.append(path)
        self.b.operator_env = {"DIAGNOSTICS_FILE": str(path), "DIAGNOSTICS_SECONDS": str(self.args.sample_seconds)}
        kubeconfig = self.b.sa_kubeconfig if side == "a" else self.b.peer_kubeconfig
        op = replica(self.b, self.lease, kubeconfig, f"soak-{side}")
        op.log_path = self.out / f"{side}.log"
        op.start(timeout=300)
        self.replicas[side] = op
        return op

    def holder(self) -> str | None:
        return next((side for side, op in self.replicas.items() if acting(op, self.lease)), None)

    async def takeover(self) -> None:
        """SIGTERM of the holder (its pod deleted): the standby acts; the old holder comes back standing by."""
        side = self.holder()
        if side is None:
            self.failures.append("takeover: no replica acts")
            return
        other = "b" if side == "a" else "a"
        op = self.replicas[side]
        signalled = time.monotonic()
        assert op.proc is not None
        os.killpg(op.proc.pid, signal.SIGTERM)
        await until(lambda: acting(self.replicas[other], self.lease), 60, "the standby to act")
        acted = time.monotonic() - signalled
        await asyncio.to_thread(op.stop)
        await asyncio.to_thread(self.start_replica, side)
        self.takeovers.append({"at_minute": round((signalled - self.started) / 60, 1), "from": side, "to": other,
                               "acting_after_s": round(acted, 2)})
        log(f"  takeover {side} -> {other}: acting after {acted:.1f} s")

    # --- setup --------------------------------------------------------------------------------------

    async def setup(self) -> None:
        b = self.b
        await b.namespace(self.ns["ic"])
        await b.namespace(self.ns["chaos"])
        await b.namespace(self.ns["src"])
        await b.namespace(self.ns["rr"])
        src, rr = self.ns["src"], self.ns["rr"]
        await b.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
            "metadata": {"name": "soak-rule-src", "labels": {"soak-copy": self.run}}, "data": {"v": "0"}})
        await b.kube.create(f"{RULE_PATH}/namespaces/{src}/copyrators", {
            "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "soak"},
            "spec": {"ruleType": "configmap", "selector": {"soak-copy": self.run}, "namespace": [src],
                     "namespaceSelector": {"matchLabels": {"soak-target": self.run}}}})
        await b.kube.create(f"/api/v1/namespaces/{src}/configmaps", {
            "metadata": {"name": "soak-push-src",
                         "annotations": {"copyrator.kopf-operators.dev/push-to": f"soak-t-{self.run}-*"}},
            "data": {"v": "0"}})
        for i in range(self.args.workloads):
            windowed = i < self.args.windowed_workloads
            for kind in ("configmaps", "secrets"):
                body: dict[str, Any] = {"metadata": {"name": f"src-{i}"}}
                body["data"] = {"v": base64.b64encode(b"0").decode()} if kind == "secrets" else {"v": "0"}
                await b.kube.create(f"/api/v1/namespaces/{rr}/{kind}", body)
            await b.kube.create(f"/apis/apps/v1/namespaces/{rr}/deployments", workload(f"w-{i}", f"src-{i}", windowed))
        await b.kube.create(f"/apis/apps/v1/namespaces/{self.ns['chaos']}/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "victim"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "victim"}},
                     "template": {"metadata": {"labels": {"app": "victim"}}, "spec": on_kwok()}}})

    # --- the churn's parts --------------------------------------------------------------------------

    async def paced(self, per_minute: float, step: Callable[[], Awaitable[None]], what: str) -> None:
        """``step`` every 60/per_minute seconds (jittered) until the deadline; a failed step is counted."""
        if per_minute <= 0:
            return
        while time.monotonic() < self.deadline:
            await asyncio.sleep(random.uniform(0.5, 1.5) * 60 / per_minute)
            try:
                await step()
                self.count(what)
            except Exception as exc:
                self.count(f"{what} failed")
                if len(self.failures) < 50:
                    self.failures.append(f"{what}: {type(exc).__name__}: {exc}")

    def timed(self, kind: str, seconds: float) -> None:
        self.reactions[kind].append((time.monotonic() - self.started, seconds))

    async def ic_step(self, pods: Watcher) -> None:
        ns = self.ns["ic"]
        path = f"{IC_PATH}/namespaces/{ns}/immortalcontainers"
        choice = random.random()
        if len(self.ics) < self.args.ics // 2 or (choice < 0.25 and len(self.ics) < self.args.ics):
            self.ic_seq += 1
            name = f"ic-{self.ic_seq}"
            await self.b.kube.create(path, {"apiVersion": "immortalcontainer.flugel.it/v1alpha1",
                                            "kind": "ImmortalContainer", "metadata": {"name": name},
                                            "spec": {"image": "busybox:1.36"}})
            self.ics.add(name)
        elif choice < 0.4:
            name = random.choice(sorted(self.ics))
            await self.b.kube.merge_patch(f"{path}/{name}", {"spec": {"image": random.choice(
                ["busybox:1.36", "busybox:1.37"])}})
        elif choice < 0.55:
            name = random.choice(sorted(self.ics))
            self.ics.discard(name)
            await self.b.kube.delete(f"{path}/{name}")
        else:  # the pod of one, deleted: timed until its replacement is ADDED
            name = random.choice(sorted(self.ics))
            pod = f"{name}-immortalpod"
            found = await self.b.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}", ok_missing=True)
            if found is None or found["metadata"].get("deletionTimestamp"):
                return
            uid = found["metadata"]["uid"]
            replaced = pods.expect(lambda t, o, _: t == "ADDED" and o["metadata"]["name"] == pod
                                   and o["metadata"]["uid"] != uid)
            await self.b.kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}",
                                      params={"gracePeriodSeconds": "0"}, ok_missing=True)
            t0 = time.monotonic()
            try:
                self.timed("immortal", await asyncio.wait_for(replaced, 60) - t0)
            except TimeoutError:
                if name in self.ics:  # deleted meanwhile by the churn: not the operator's miss
                    raise TimeoutError(f"no replacement for {pod} within 60 s") from None

    async def namespace_step(self, copies: Watcher) -> None:
        """A target namespace created (timed: the rule's copy ADDED); the oldest deleted past the cap."""
        self.target_seq += 1
        ns = f"soak-t-{self.run}-{self.target_seq}"
        copied = copies.expect(lambda t, o, _: t == "ADDED" and o["metadata"]["namespace"] == ns
                               and o["metadata"]["name"] == "soak-rule-src")
        await self.b.kube.create("/api/v1/namespaces", {"metadata": {
            "name": ns, "labels": {BENCH_LABEL: self.run, "soak-target": self.run},
            "annotations": {"copyrator.kopf-operators.dev/accept-from": self.ns["src"]}}})
        t0 = time.monotonic()
        self.targets.append(ns)
        self.timed("copyrator", await asyncio.wait_for(copied, 60) - t0)
        while len(self.targets) > self.args.namespaces:
            await self.b.kube.delete(f"/api/v1/namespaces/{self.targets.pop(0)}")

    async def source_step(self, deployments: Watcher) -> None:
        """A ConfigMap or Secret edited under a re-rolled Deployment (timed when it has no window)."""
        rr = self.ns["rr"]
        i = random.randrange(self.args.workloads)
        kind = random.choice(("configmaps", "secrets"))
        value = str(time.time_ns())
        name = f"w-{i}"
        before = (await self.b.kube.get(f"/apis/apps/v1/namespaces/{rr}/deployments/{name}"))
        template = before["spec"]["template"]["metadata"].get("annotations") or {}
        rolled = deployments.expect(lambda t, o, _: o["metadata"]["name"] == name and (
            o["spec"]["template"]["metadata"].get("annotations") or {}) != template)
        data = {"v": base64.b64encode(value.encode()).decode() if kind == "secrets" else value}
        await self.b.kube.merge_patch(f"/api/v1/namespaces/{rr}/{kind}/src-{i}", {"data": data})
        t0 = time.monotonic()
        if i < self.args.windowed_workloads:  # held until its window opens: counted, not timed
            rolled.cancel()
            return
        self.timed("reroller", await asyncio.wait_for(rolled, 60) - t0)

    async def source_copy_step(self) -> None:
        """The rule's and the push's sources edited: every copy is rewritten."""
        src = self.ns["src"]
        for name in ("soak-rule-src", "soak-push-src"):
            await self.b.kube.merge_patch(f"/api/v1/namespaces/{src}/configmaps/{name}",
                                          {"data": {"v": str(time.time_ns())}})

    async def agent_step(self) -> None:
        """A new ChaosAgent (real and dry-run in turn) on the soak's chaos namespace; the last one deleted."""
        self.agent_seq += 1
        if self.agent_seq > 1:
            await self.b.kube.delete(f"{CHAOS_PATH}/soak-{self.run}-{self.agent_seq - 1}")
        await self.b.kube.create(CHAOS_PATH, {
            "apiVersion": "blackadder.io/v1beta1", "kind": "ChaosAgent",
            "metadata": {"name": f"soak-{self.run}-{self.agent_seq}", "labels": {BENCH_LABEL: self.run}},
            "spec": {"targetNamespaces": [self.ns["chaos"]], "tantrumMode": True, "podTolerance": 1,
                     "maxKillsPerCycle": 1, "eagerness": 50, "pauseDuration": 10,
                     "dryRun": self.agent_seq % 2 == 0}})

    async def takeovers_loop(self) -> None:
        period = self.args.takeover_minutes * 60
        if self.args.quick:
            period = self.args.minutes * 30  # one, at the middle
        while period > 0 and time.monotonic() + period < self.deadline + 1:
            await asyncio.sleep(period)
            try:
                await self.takeover()
            except Exception as exc:
                self.failures.append(f"takeover: {type(exc).__name__}: {exc}")
            if self.args.quick:
                return

    async def churn(self) -> None:
        a = self.args
        watch = self.b.kube
        pods = await Watcher(watch, f"/api/v1/namespaces/{self.ns['ic']}/pods").start()
        copies = await Watcher(watch, "/api/v1/configmaps", {"fieldSelector": "metadata.name=soak-rule-src"}).start()
        deployments = await Watcher(watch, f"/apis/apps/v1/namespaces/{self.ns['rr']}/deployments").start()
        try:
            await asyncio.gather(
                self.paced(a.ic_rate, lambda: self.ic_step(pods), "immortal"),
                self.paced(a.namespace_rate, lambda: self.namespace_step(copies), "namespace"),
                self.paced(a.source_rate, lambda: self.source_step(deployments), "source edit"),
                self.paced(a.copy_source_rate, self.source_copy_step, "copy source edit"),
                self.paced(60 / a.agent_seconds, self.agent_step, "chaos agent"),
                self.takeovers_loop())
        finally:
            for w in (pods, copies, deployments):
                await w.stop()

    async def cleanup(self) -> None:
        b = self.b
        for i in range(self.agent_seq, 0, -1):
            with contextlib.suppress(ApiError):
                await b.kube.delete(f"{CHAOS_PATH}/soak-{self.run}-{i}")
        with contextlib.suppress(ApiError):
            await b.kube.delete(f"{RULE_PATH}/namespaces/{self.ns['src']}/copyrators/soak")
        listing = await b.kube.get("/api/v1/namespaces", labelSelector=f"{BENCH_LABEL}={self.run}")
        await b.cleanup({o["metadata"]["name"] for o in listing["items"]} | set(b.namespaces), wait=300)
        for op in self.replicas.values():
            await asyncio.to_thread(op.stop)
        with contextlib.suppress(ApiError):
            await b.kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/{SA_NAMESPACE}/leases/{self.lease}")

    async def main(self) -> dict[str, Any]:
        await self.b.setup()
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            await self.setup()
            self.start_replica("a")
            await until(lambda: acting(self.replicas["a"], self.lease), 120, "the first replica to act")
            self.start_replica("b")
            self.started = time.monotonic()
            self.deadline = self.started + self.args.minutes * 60
            self.epoch = (time.time(), time.time() + self.args.minutes * 60)  # the churn, on the logs' clock
            log(f"soak {self.run}: {self.args.minutes} min of churn; files in {self.out}")
            await self.churn()
            # One more sample of every replica at the end of the churn (the last minute's).
            await asyncio.sleep(max(0.0, self.deadline - time.monotonic()))
        finally:
            await self.cleanup()
            await self.b.kube.close()
        return self.analyse()

    def analyse(self) -> dict[str, Any]:
        a = self.args
        window_s = a.minutes * 60 * (0.8 if a.quick else 40 / 60)
        edge_s = min(600.0, a.minutes * 60 / 5)
        start, end = self.epoch
        processes = {}
        for path in self.diagnostics:
            samples = read_samples(path)
            processes[path.stem] = {"file": str(path), "samples": len(samples),
                                    "minutes": round((samples[-1]["time"] - samples[0]["time"]) / 60, 1)
                                    if samples else 0, "spans": spans(samples, end - window_s, end)}
        probes = [(s["time"], s.get("sample_ms", 0.0)) for path in self.diagnostics for s in read_samples(path)]
        reactions = {}
        for kind, series in self.reactions.items():
            # Each reaction as (ended, seconds, the diagnostics sample it overlapped, in ms, or None).
            timed = [(t, s, probed(probes, start + t - s, start + t)) for t, s in series]
            reactions[kind] = {**edges(timed, a.minutes * 60, edge_s), "events": len(series),
                               "outside_samples": edges([x for x in timed if x[2] is None], a.minutes * 60, edge_s),
                               "slowest": [{"minute": round(t / 60, 1), "ms": round(s * 1000, 1), "sample_ms": p}
                                           for t, s, p in sorted(timed, key=lambda x: -x[1])[:5]]}
        return {"meta": {"run": self.run, "minutes": a.minutes, "quick": a.quick, "rates": rates(a),
                         "window_minutes": round(window_s / 60, 1), "edge_minutes": round(edge_s / 60, 1),
                         "warm_up_s": WARM_UP_S, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                         "files": str(self.out)},
                "processes": processes, "reactions": reactions, "takeovers": self.takeovers,
                "churn": self.counts, "churn_failures": self.failures,
                "log_problems": log_problems([self.out / "a.log", self.out / "b.log"], start, end)}


def probed(probes: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The diagnostics sample (its length in ms) that held the event loop during [start, end], if one did.

    A sample walks the heap (tracemalloc) with the loop held, for up to a second on a grown heap; a
    reaction it overlaps measures the soak's own probe, which a process in production does not run. A
    sample's ``time`` is taken after the walk, so it spans about [time - sample_ms, time]."""
    for at, ms in probes:
        if at - ms / 1000 - 0.05 <= end and start <= at + 0.05:
            return ms
    return None


def edges(timed: list[tuple[float, float, float | None]], total_s: float, edge_s: float) -> dict[str, Any]:
    """The p50/p99 of the first and the last ``edge_s`` seconds of the churn, and the p99s' ratio."""
    first = [s for t, s, _ in timed if t <= edge_s]
    last = [s for t, s, _ in timed if t >= total_s - edge_s]
    f, la = summary_ms(first) if first else {}, summary_ms(last) if last else {}
    return {"first": f, "last": la,
            "p99_ratio": round(la["p99_ms"] / f["p99_ms"], 2) if f and la and f["p99_ms"] else None}


def workload(name: str, source: str, windowed: bool) -> dict[str, Any]:
    """An opted-in Deployment of one pod on the KWOK node reading ConfigMap and Secret ``source``."""
    annotations = {f"{RR}/auto": "true", **({f"{RR}/restart-window": WINDOW} if windowed else {})}
    spec = on_kwok()
    spec["containers"][0]["envFrom"] = [{"configMapRef": {"name": source}}, {"secretRef": {"name": source}}]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "annotations": annotations},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def rates(a: argparse.Namespace) -> dict[str, Any]:
    return {"ic_per_min": a.ic_rate, "namespaces_per_min": a.namespace_rate, "source_edits_per_min": a.source_rate,
            "copy_source_edits_per_min": a.copy_source_rate, "agent_every_s": a.agent_seconds,
            "takeover_every_min": "once, at the middle" if a.quick else a.takeover_minutes,
            "live_ics": a.ics, "live_target_namespaces": a.namespaces, "workloads": a.workloads,
            "windowed_workloads": a.windowed_workloads, "sample_s": a.sample_seconds}


# --- the report ----------------------------------------------------------------------------------------

def judged(r: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The span the targets are judged on: the longest acting one in the window (of any process)."""
    candidates = [(span["role"] == "acting", span["minutes"], f"{name} ({span['role']})", span)
                  for name, p in r["processes"].items() for span in p["spans"]]
    if not candidates:
        return "none", {}
    best = max(candidates, key=lambda c: (c[0], c[1]))
    return best[2], best[3]


def verdicts(r: dict[str, Any]) -> dict[str, Any]:
    """The targets, each pass or fail."""
    name, span = judged(r)
    series = span.get("series", {})
    rss = series.get("rss_kb", {}).get("slope_per_hour", 0) / 1024
    growing = sorted(n for n, s in series.items() if s.get("grows"))
    ratios = {k: v["p99_ratio"] for k, v in r["reactions"].items() if v["p99_ratio"] is not None}
    # Judged without the reactions a diagnostics sample held up (``probed``): the probe is the soak's.
    unprobed = {k: v.get("outside_samples", v)["p99_ratio"] for k, v in r["reactions"].items()
                if v.get("outside_samples", v)["p99_ratio"] is not None}
    errors = [p for p in r["log_problems"] if re.search(r"\[(ERROR|CRITICAL) *\]|Traceback", p)]
    # None: not judged (too few samples of one role for a slope).
    long_enough = span.get("samples", 0) >= MIN_JUDGED_SAMPLES
    return {"judged": f"{name}, {span.get('samples', 0)} samples over {span.get('minutes', 0)} min",
            "rss_slope_mb_per_hour": {"value": round(rss, 2), "target": "<= 1",
                                      "pass": (rss <= 1) if long_enough else None},
            "counts_growing_with_time": {"value": growing, "target": "none",
                                         "pass": (not growing) if long_enough else None},
            "p99_last_vs_first": {"value": {"all": ratios, "outside diagnostics samples": unprobed},
                                  "target": "<= 1.2x outside samples",
                                  "pass": bool(unprobed) and all(v <= 1.2 for v in unprobed.values())},
            "errors": {"value": len(errors), "target": 0, "pass": not errors}}


def render(r: dict[str, Any]) -> str:
    m = r["meta"]
    v = verdicts(r)
    out = [f"# Soak {m['run']}: {m['minutes']} minutes{' (--quick)' if m['quick'] else ''}, {m['date']}\n\n",
           f"Rates: {json.dumps(m['rates'])}\n\n", f"Churn done: {json.dumps(r['churn'])}\n\n",
           f"Takeovers: {json.dumps(r['takeovers'])}\n",
           "\n## Targets\n\n| target | value | wanted | result |\n|---|---|---|---|\n"]
    for name in ("rss_slope_mb_per_hour", "counts_growing_with_time", "p99_last_vs_first", "errors"):
        t = v[name]
        result = "NOT JUDGED (too few samples)" if t["pass"] is None else "PASS" if t["pass"] else "FAIL"
        out.append(f"| {name} | {json.dumps(t['value'])} | {t['target']} | {result} |\n")
    out.append(f"\nJudged on {v['judged']}: the longest span of one role (acting first) in the last "
               f"{m['window_minutes']} min, past each process's first {m['warm_up_s']} s.\n")
    out.append(f"\n## Reactions (first {m['edge_minutes']} min against the last {m['edge_minutes']})\n\n"
               "| reaction | events | first p50/p99 ms | last p50/p99 ms | p99 last/first |\n|---|---|---|---|---|\n")
    for kind, x in r["reactions"].items():
        f, la = x["first"], x["last"]
        out.append(f"| {kind} | {x['events']} | {f.get('p50_ms', '-')} / {f.get('p99_ms', '-')} | "
                   f"{la.get('p50_ms', '-')} / {la.get('p99_ms', '-')} | {x['p99_ratio']} |\n")
    if all("outside_samples" in x for x in r["reactions"].values()):
        out.append("\nOutside the diagnostics samples (a sample holds the event loop while it walks the heap):\n\n"
                   "| reaction | first p50/p99 ms | last p50/p99 ms | p99 last/first | slowest (minute: ms, "
                   "sample ms if one held it) |\n|---|---|---|---|---|\n")
        for kind, x in r["reactions"].items():
            f, la = x["outside_samples"]["first"], x["outside_samples"]["last"]
            slow = ", ".join(f"{e['minute']}: {e['ms']}"
                             + (f" ({e['sample_ms']})" if e["sample_ms"] is not None else "") for e in x["slowest"])
            out.append(f"| {kind} | {f.get('p50_ms', '-')} / {f.get('p99_ms', '-')} | {la.get('p50_ms', '-')} / "
                       f"{la.get('p99_ms', '-')} | {x['outside_samples']['p99_ratio']} | {slow} |\n")
    for name, p in r["processes"].items():
        out.append(f"\n## Process {name} ({p['samples']} samples over {p['minutes']} min)\n")
        for span in p["spans"]:
            out.append(f"\n### {span['role']}: {span['samples']} samples over {span['minutes']} min\n\n"
                       "| series | first | last | slope per hour | grows |\n|---|---|---|---|---|\n")
            for s, x in span["series"].items():
                if x["first"] or x["last"] or x["slope_per_hour"]:
                    out.append(f"| {s} | {x['first']} | {x['last']} | {x['slope_per_hour']} | "
                               f"{x.get('grows', '')} |\n")
            growers = span.get("top_growers_since_start") or []
            if growers:
                out.append("\nHeap growers since the process started (tracemalloc, by line):\n\n")
                out += [f"- {g['where']}: +{g['grew_bytes']:,} B, +{g['grew_blocks']:,} blocks\n" for g in growers]
    out.append(f"\n## Log records at WARNING or above during the churn ({len(r['log_problems'])})\n\n")
    out += [f"    {line}\n" for p in r["log_problems"] for line in p.splitlines()[:12]]
    if r["churn_failures"]:
        out.append(f"\n## Churn steps that failed ({len(r['churn_failures'])}, first 50)\n\n")
        out += [f"- {f}\n" for f in r["churn_failures"]]
    return "".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 minutes, one takeover at the middle")
    parser.add_argument("--minutes", type=float, help="minutes of churn (default 60; 10 with --quick)")
    parser.add_argument("--ic-rate", type=float, default=30, help="ImmortalContainer steps per minute")
    parser.add_argument("--namespace-rate", type=float, default=6, help="target namespaces created per minute")
    parser.add_argument("--source-rate", type=float, default=20, help="ConfigMap/Secret edits per minute")
    parser.add_argument("--copy-source-rate", type=float, default=2, help="copied sources' edits per minute")
    parser.add_argument("--agent-seconds", type=float, default=120, help="seconds between ChaosAgents")
    parser.add_argument("--takeover-minutes", type=float, default=15, help="minutes between takeovers (0: none)")
    parser.add_argument("--ics", type=int, default=30, help="most ImmortalContainers alive at once")
    parser.add_argument("--namespaces", type=int, default=10, help="most target namespaces alive at once")
    parser.add_argument("--workloads", type=int, default=8, help="re-rolled Deployments")
    parser.add_argument("--windowed-workloads", type=int, default=2, help="of which with a restart window")
    parser.add_argument("--sample-seconds", type=float, default=60, help="the diagnostics' period")
    parser.add_argument("--operators", help="operator files (default: $OPERATOR_FILES, else operators/*.py)")
    parser.add_argument("--output", help="results prefix (default .bench/soak)")
    parser.add_argument("--render", metavar="JSON", help="only re-render the markdown of a soak JSON file")
    args = parser.parse_args()
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
        print(path.with_suffix(".md").read_text())
        return
    args.minutes = args.minutes or (10 if args.quick else 60)
    bench = Bench(dict(QUICK), [], operator_files(args.operators))
    results = asyncio.run(Soak(bench, args).main())
    prefix = Path(args.output) if args.output else REPO / ".bench" / "soak"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    prefix.with_suffix(".md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
