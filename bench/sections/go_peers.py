"""The section "peers": Go controllers doing the same job, built from source in the run
(testsupport/peer_build.py), side by side with ours, each in namespaces of its own (never two controllers on
the same objects).

- reloader: stakater Reloader (``--reload-strategy=annotations --namespaces=<its namespace>``) next to our
  re-roller (at debounce 0, then at the shipped defaults): an isolated ConfigMap's data edited -> the
  Deployment's pod template changed. Edits alternate between the two, each on its own Deployment.
- replicator: mittwald kubernetes-replicator (push by ``replicator.v1.mittwald.de/replicate-to``) next to
  Copyrator: a namespace created -> the copy exists. Namespaces alternate between the two.

Per side: latency, CPU per event (utime+stime of the process over the event), requests per event (audit
log; the peers run as the ServiceAccount kopf-bench/kopf-bench-peer, ours as kopf-bench-operator) and RSS.
A peer that cannot be built is recorded as "peer not available: <why>", never as a figure.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.harness import (
    BENCH_LABEL,
    PEER_USER,
    RULE_PATH,
    SA_USER,
    Bench,
    Proc,
    api_per_change,
    deployment,
    log,
    origin,
    sub_sections,
    within,
)
from bench.kube import Watcher
from bench.sections.reroller_latency import baseline, template_annotations, template_changed
from testsupport import peer_build
from testsupport.launcher import free_port, port_free
from testsupport.paths import CLUSTER_DIR
from testsupport.stats import percentile, summary_ms


async def run(b: Bench) -> dict[str, Any]:
    return await sub_sections(b, "peers", (("reloader", reloader), ("replicator", replicator)))


class GoPeer(peer_build.PeerProcess):
    """A peer's binary as a subprocess, healthy once ``health_url`` answers 200 (started and stopped in a
    thread, so that the run's watches keep reading meanwhile)."""

    def __init__(self, built: peer_build.Built, args: list[str], env: dict[str, str], health_url: str,
                 log_path: Path) -> None:
        super().__init__(built.binary, args, env, health_url, log_path)
        self.built = built

    async def __aenter__(self) -> GoPeer:
        await asyncio.to_thread(self.start)
        return self

    @property
    def p(self) -> Proc:
        assert self.proc is not None
        return Proc(self.proc.pid)

    async def __aexit__(self, *_: Any) -> None:
        await asyncio.to_thread(self.stop)


class Side:
    """One controller's figures: latency, CPU per event, requests per event (by audit user), RSS."""

    def __init__(self, label: str, user: str) -> None:
        self.label, self.user = label, user
        self.lat: list[float] = []
        self.cpu: list[float] = []
        self.audit: Counter[str] = Counter()
        self.rss_mb: float | None = None

    async def event(self, b: Bench, proc: Proc, change: Callable[[], Awaitable[None]],
                    done: asyncio.Future[float], seen: asyncio.Future[float], what: str) -> None:
        mark = b.a.mark()
        c0 = proc.cpu_seconds()
        await change()
        t0 = time.monotonic()
        t1 = await within(done, 60, what)
        t0 = await origin(t0, seen)
        await asyncio.sleep(0.05)
        self.lat.append(t1 - t0)
        self.cpu.append(proc.cpu_seconds() - c0)
        self.audit.update(b.a.requests(mark, b.a.mark(), self.user))
        self.rss_mb = proc.rss_mb()

    def result(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        n = len(self.lat)
        return {"latency": summary_ms(self.lat),
                "cpu_per_event": {"mean_ms": round(statistics.fmean(self.cpu) * 1000, 2),
                                  "median_ms": round(percentile(self.cpu, 0.5) * 1000, 2)},
                "api_per_event": api_per_change(self.audit, n), "rss_mb": self.rss_mb, **(extra or {})}


def unavailable(peer: str) -> tuple[peer_build.Built | None, str | None]:
    try:
        built = peer_build.build(peer)
        log(f"  {peer}: {built.describe()}")
        return built, None
    except peer_build.PeerUnavailable as exc:
        log(f"  {peer}: peer not available: {exc}")
        return None, f"peer not available: {exc}"


# --- Reloader vs the re-roller ----------------------------------------------------------------------


async def reloader(b: Bench) -> dict[str, Any]:
    built, why = unavailable("reloader")
    op_on = b.loaded("reroller")
    n, n_defaults = b.n["peer_events"], b.n["default_events"]
    result: dict[str, Any] = {
        "what": "ConfigMap data edited (from the PATCH response) -> the Deployment's pod-template annotations "
                "changed, seen on a watch; each controller on a Deployment of its own in a namespace of its own"}
    ns_op = await b.namespace(f"bench-prr-op-{b.run}")
    ns_rl = await b.namespace(f"bench-prr-rl-{b.run}")
    for ns in (ns_op, ns_rl):
        await b.kube.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "cfg"}, "data": {"v": "0"}})
    await b.kube.create(f"/apis/apps/v1/namespaces/{ns_op}/deployments", deployment("web", "cfg", True))
    await b.kube.create(f"/apis/apps/v1/namespaces/{ns_rl}/deployments",
                        deployment("web", "cfg", False, {"reloader.stakater.com/auto": "true"}))
    deps = {ns: await Watcher(b.kube, f"/apis/apps/v1/namespaces/{ns}/deployments").start() for ns in (ns_op, ns_rl)}
    cms = {ns: await Watcher(b.kube, f"/api/v1/namespaces/{ns}/configmaps").start() for ns in (ns_op, ns_rl)}
    last: dict[str, dict[str, Any]] = {ns_op: {}, ns_rl: {}}
    for ns in (ns_op, ns_rl):
        last[ns]["web"] = template_annotations(await b.kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/web"))
    version = {"v": 0}

    async def edit(side: Side, ns: str, proc: Proc) -> None:
        version["v"] += 1
        v = str(version["v"])
        done = deps[ns].expect(template_changed("web", last[ns]))
        seen = cms[ns].expect(lambda t, o, _, v=v: o["metadata"]["name"] == "cfg"
                              and (o.get("data") or {}).get("v") == v)

        async def change() -> None:
            await b.kube.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/cfg", {"data": {"v": v}})
        await side.event(b, proc, change, done, seen, f"{side.label}: the pod template of {ns}/web to change")

    rl_side = Side("reloader", PEER_USER)
    op0 = Side("re-roller (debounce 0)", SA_USER)
    opd = Side("re-roller (shipped defaults)", SA_USER)
    try:
        if op_on:
            assert b.operator
            await baseline(b, deps[ns_op], "web")
        if built is None:
            result["peer"] = why
        else:
            if not port_free(9090):  # Reloader's metrics port is fixed; it exits when that is taken
                for _ in range(60):
                    await asyncio.sleep(1)
                    if port_free(9090):
                        break
            if not port_free(9090):
                result["peer"] = "peer not available: port 9090 (hard-coded in Reloader) stayed busy for 60 s"
                built = None
        if built is not None:
            result["peer"] = {"repo": built.repo, "commit": built.commit, "binary": str(built.binary),
                              "args": ["--reload-strategy=annotations", f"--namespaces={ns_rl}"]}
            async with GoPeer(built, ["--reload-strategy=annotations", f"--namespaces={ns_rl}"],
                              {"KUBECONFIG": str(b.peer_kubeconfig), "RELOADER_NAMESPACE": ns_rl},
                              "http://127.0.0.1:9090/live",
                              CLUSTER_DIR / "logs" / f"bench-peer-reloader-{b.run}.log") as peer:
                await asyncio.sleep(2)  # its informers' initial listing
                warm = Side("warm-up", PEER_USER)
                await edit(warm, ns_rl, peer.p)  # the first edit proves it watches
                for i in range(n):
                    order = ("op", "rl") if i % 2 == 0 else ("rl", "op")
                    for side in order:
                        if side == "rl":
                            await edit(rl_side, ns_rl, peer.p)
                        elif op_on and b.operator:
                            await edit(op0, ns_op, b.operator.p)
                result["reloader"] = rl_side.result({"warm_up_ms": round(warm.lat[0] * 1000, 1)})
        elif op_on and b.operator:
            for _ in range(n):
                await edit(op0, ns_op, b.operator.p)
        if op_on and b.operator:
            result["ours_debounce_0"] = op0.result({"env": dict(b.operator_env)})
            b.restart_operator(env={})
            try:
                await b.operator.settle()
                for _ in range(n_defaults):
                    await edit(opd, ns_op, b.operator.p)
                    await asyncio.sleep(11)  # past the 10 s minimum interval
                result["ours_defaults"] = opd.result({"env": "shipped defaults (debounce 2 s, min interval 10 s)",
                                                      "note": "edits 11 s apart"})
            finally:
                b.restart_operator()
        else:
            result["ours"] = "re-roller not loaded in this run"
    finally:
        for w in (*deps.values(), *cms.values()):
            await w.stop()
        await b.cleanup([ns_op, ns_rl])
    return result


# --- replicator vs Copyrator --------------------------------------------------------------------------


async def replicator(b: Bench) -> dict[str, Any]:
    built, why = unavailable("replicator")
    op_on = b.loaded("copyrator")
    n = b.n["peer_events"]
    run_id = b.run
    result: dict[str, Any] = {
        "what": "namespace created (from the POST response) -> the copy ADDED on a watch; each controller "
                "copies its own source into namespaces of its own"}
    src_op = await b.namespace(f"bench-prc-src-{run_id}")
    src_rep = await b.namespace(f"bench-prc-rsrc-{run_id}")
    await b.kube.create(f"/api/v1/namespaces/{src_op}/configmaps", {
        "metadata": {"name": "op-src", "labels": {"bench-prc": run_id}}, "data": {"k": "v"}})
    rep_pattern = f"bench-prc-rep-{run_id}-[0-9]+"
    await b.kube.create(f"/api/v1/namespaces/{src_rep}/configmaps", {
        "metadata": {"name": "rep-src", "annotations": {"replicator.v1.mittwald.de/replicate-to": rep_pattern}},
        "data": {"k": "v"}})
    await b.kube.create(f"{RULE_PATH}/namespaces/{src_op}/copyrators", {
        "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "peer"},
        "spec": {"ruleType": "configmap", "selector": {"bench-prc": run_id}, "namespace": [src_op],
                 "namespaceSelector": {"matchLabels": {"bench-prc-target": run_id}}}})
    op_w = await Watcher(b.kube, "/api/v1/configmaps", {"fieldSelector": "metadata.name=op-src"}).start()
    rep_w = await Watcher(b.kube, "/api/v1/configmaps", {"fieldSelector": "metadata.name=rep-src"}).start()
    nss = await Watcher(b.kube, "/api/v1/namespaces", {"labelSelector": f"{BENCH_LABEL}={run_id}"}).start()
    created: list[str] = []
    counter = {"i": 0}

    async def new_namespace(side: Side, watcher: Watcher, prefix: str, labels: dict[str, str], proc: Proc) -> None:
        counter["i"] += 1
        ns = f"{prefix}-{counter['i']}"
        done = watcher.expect(lambda t, o, _, ns=ns: o["metadata"]["namespace"] == ns and t != "DELETED")
        seen = nss.expect(lambda t, o, _, ns=ns: t == "ADDED" and o["metadata"]["name"] == ns)

        async def change() -> None:
            await b.namespace(ns, labels)
            created.append(ns)
        await side.event(b, proc, change, done, seen, f"{side.label}: the copy in {ns}")

    rep_side = Side("replicator", PEER_USER)
    op_side = Side("copyrator", SA_USER)
    try:
        if built is None:
            result["peer"] = why
        else:
            port = free_port()
            args = [f"--kubeconfig={b.peer_kubeconfig}", f"--status-addr=127.0.0.1:{port}"]
            result["peer"] = {"repo": built.repo, "commit": built.commit, "binary": str(built.binary),
                              "args": ["--kubeconfig=<peer ServiceAccount>", "--status-addr=127.0.0.1:<port>"],
                              "source_annotation": f"replicator.v1.mittwald.de/replicate-to: {rep_pattern}"}
            async with GoPeer(built, args, {}, f"http://127.0.0.1:{port}/healthz",
                              CLUSTER_DIR / "logs" / f"bench-peer-replicator-{run_id}.log") as peer:
                await asyncio.sleep(2)
                warm = Side("warm-up", PEER_USER)
                await new_namespace(warm, rep_w, f"bench-prc-rep-{run_id}", {}, peer.p)
                for i in range(n):
                    for side in (("op", "rep") if i % 2 == 0 else ("rep", "op")):
                        if side == "rep":
                            await new_namespace(rep_side, rep_w, f"bench-prc-rep-{run_id}", {}, peer.p)
                        elif op_on and b.operator:
                            await new_namespace(op_side, op_w, f"bench-prc-op-{run_id}",
                                                {"bench-prc-target": run_id}, b.operator.p)
                result["replicator"] = rep_side.result({"warm_up_ms": round(warm.lat[0] * 1000, 1)})
        if built is None and op_on and b.operator:
            for _ in range(n):
                await new_namespace(op_side, op_w, f"bench-prc-op-{run_id}", {"bench-prc-target": run_id},
                                    b.operator.p)
        result["ours"] = op_side.result() if op_side.lat else "copyrator not loaded in this run"
    finally:
        for w in (op_w, rep_w, nss):
            await w.stop()
        await b.kube.delete(f"{RULE_PATH}/namespaces/{src_op}/copyrators/peer")
        await b.gone(f"{RULE_PATH}/namespaces/{src_op}/copyrators/peer", 120)
        await b.cleanup([src_op, src_rep, *created])
    return result
