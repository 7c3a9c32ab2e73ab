"""takeover: two replicas on a Lease (the chart's HA), then n ConfigMaps and k ImmortalContainers.
What a warm standby costs (its requests per minute, its writes, its RSS, against the holder's), and
how long a takeover takes: SIGKILL of the holder (no release: the standby waits out the lease
duration, 15 s) and SIGTERM (released at the signal), each timed from the signal to the new holder's
first write, the pod of an ImmortalContainer created right after the signal.

The two replicas run as two ServiceAccounts (the operator's and the peers'), so that the audit log
tells their requests apart; the section's Lease, namespace and objects are deleted at its end, and the
run's own operator (no Lease) is stopped meanwhile."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from bench.harness import (
    IC_PATH,
    PEER_USER,
    SA_NAMESPACE,
    SA_USER,
    Bench,
    Operator,
    log,
    within,
)
from bench.kube import Watcher, bounded
from testsupport.paths import CLUSTER_DIR


def replica(b: Bench, lease: str, kubeconfig: Any, side: str) -> Operator:
    env = {**b.operator_env, "LEADER_ELECTION": "true", "LEASE_NAME": lease, "LEASE_NAMESPACE": SA_NAMESPACE}
    return Operator(kubeconfig, env, CLUSTER_DIR / "logs" / f"bench-takeover-{side}-{b.run}.log", b.files, b.root)


def acting(op: Operator, lease: str) -> bool:
    """The replica acts now: its leader gauge (set as it takes the Lease, reset as it loses it)."""
    try:
        return op.metric("kopf_operators_leader", lease=lease) == 1
    except OSError:  # not serving metrics (yet)
        return False


async def until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def run(b: Bench) -> dict[str, Any]:
    if skipped := b.not_loaded("immortal"):
        return skipped
    n, k, window = b.n["takeover_configmaps"], b.n["takeover_ics"], b.n["idle"]
    lease = f"bench-takeover-{b.run}"
    b.stop_operator()  # it acts without a Lease: the section's two replicas are the only operators
    ns = await b.namespace(f"bench-takeover-{b.run}")

    async def cm(j: int) -> None:
        await b.create_retrying(f"/api/v1/namespaces/{ns}/configmaps",
                                {"metadata": {"name": f"cm-{j}"}, "data": {"key": f"value-{j}" * 8}})

    def ic(name: str) -> Any:
        return b.create_retrying(f"{IC_PATH}/namespaces/{ns}/immortalcontainers", {
            "apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
            "metadata": {"name": name}, "spec": {"image": "busybox:1.36"}})

    a = replica(b, lease, b.sa_kubeconfig, "a")
    s = replica(b, lease, b.peer_kubeconfig, "b")
    pods = await Watcher(b.kube, f"/api/v1/namespaces/{ns}/pods").start()
    try:
        # Both replicas first, then the objects: each replica follows them as they come (the steady
        # state a takeover meets). A start over them in place is a burst of its own (restart_configmaps).
        a.start(timeout=300)
        await until(lambda: acting(a, lease), 120, "the first replica to act")
        s.start(timeout=300)
        t0 = time.monotonic()
        await bounded(64, [cm(j) for j in range(n)] + [ic(f"ic-{j}") for j in range(k)])
        log(f"  {n} ConfigMaps and {k} ImmortalContainers created in {time.monotonic() - t0:.0f} s")
        await a.settle(timeout=600)
        await s.settle(timeout=600)  # a warm standby: it has indexed everything
        assert not acting(s, lease), "the second replica acts while the first holds the Lease"

        # What a standby costs, beside the holder, at rest.
        start = b.a.mark()
        began = time.monotonic()
        await asyncio.sleep(window)
        standby = await b.a.count(start, user=PEER_USER)
        holder = await b.a.count(start, user=SA_USER)
        minutes = (time.monotonic() - began) / 60
        standby_writes = {key: v for key, v in standby["by_verb_resource"].items()
                          if key.split()[0] in ("create", "update", "patch", "delete") and not key.endswith(" leases")}
        cost = {"window_seconds": round(minutes * 60, 1),
                "standby_requests_per_minute": round(standby["total"] / minutes, 1),
                "standby_writes_but_the_lease": sum(standby_writes.values()),
                "standby_rss_mb": s.p.rss_mb(), "holder_requests_per_minute": round(holder["total"] / minutes, 1),
                "holder_rss_mb": a.p.rss_mb()}
        log(f"  standby: {cost}")

        async def takeover(holder_op: Operator, standby_op: Operator, user: str, sig: int,
                           name: str) -> dict[str, Any]:
            created = pods.expect(lambda t, o, _: t == "ADDED" and o["metadata"]["name"] == f"{name}-immortalpod")
            mark = b.a.mark()
            assert holder_op.proc is not None
            os.killpg(holder_op.proc.pid, sig)
            signalled = time.monotonic()
            await ic(name)  # created right after the signal: only the new holder can start its pod
            await until(lambda: acting(standby_op, lease), 60, "the standby to act")
            acted = time.monotonic()
            first_write = await within(created, 60, f"{name}'s pod")
            await asyncio.to_thread(holder_op.stop)  # reaped (a SIGTERMed one exits by itself)
            writes = (await b.a.count(mark, user=user))["by_verb_resource"]
            return {"acting_after_s": round(acted - signalled, 2),
                    "first_write_after_s": round(first_write - signalled, 2),
                    "pod_creates_by_new_holder": writes.get("create pods", 0)}

        killed = await takeover(a, s, PEER_USER, signal.SIGKILL, "after-kill")
        log(f"  SIGKILL: {killed}")
        a.start(timeout=300)  # the killed replica comes back over the objects in place and stands by
        await a.settle(timeout=600)
        assert not acting(a, lease), "the restarted replica acts while the other holds the Lease"
        termed = await takeover(s, a, SA_USER, signal.SIGTERM, "after-term")
        log(f"  SIGTERM: {termed}")
    finally:
        for op in (a, s):
            await asyncio.to_thread(op.stop)
        await pods.stop()
        await b.kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/{SA_NAMESPACE}/leases/{lease}")
        await b.cleanup([ns], wait=600)
        b.start_operator(b.operator_env)
    return {
        "what": (f"{n:,} ConfigMaps (~90 bytes) and {k} ImmortalContainers in one namespace; two replicas (all "
                 "operators, a Lease of 15/10/2 s); the new holder's first write is the pod of an "
                 "ImmortalContainer created right after the signal"),
        "configmaps": n, "immortalcontainers": k, **cost, "sigkill": killed, "sigterm": termed,
    }
