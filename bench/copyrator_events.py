"""Copyrator's cost per namespace event, at a given number of namespaces (a quick measurement).

    .venv/bin/python -m bench.copyrator_events --namespaces 0 --probes 20
    .venv/bin/python -m bench.copyrator_events --namespaces 1000 --probes 20

One rule copies one ConfigMap into every namespace labelled with the run's label; ``--namespaces``
such namespaces exist (and hold their copies) before the probes. Each probe creates one more
namespace and measures the time from the create's response to the copy's existence (polled every
5 ms), one probe at a time. The API server's audit log (``cluster/cluster.sh audit-log``) then gives
every request the operator made between the first probe and the copy of the last one, by verb and
resource: divided by the number of probes, the requests per namespace event.

The operator runs as ``kopf run --standalone --all-namespaces operators/copyrator.py`` authenticated
as the chart's ServiceAccount (so the audit log attributes its requests).

``--peer replicator`` measures mittwald/kubernetes-replicator instead (built from source, see
/work/shared/notes/peers.md; ConfigMaps only), pushing the same ConfigMap with
``replicator.v1.mittwald.de/replicate-to-matching: <the run's label>``, authenticated as the
ServiceAccount ``kopf-bench-peer/kopf-bench-peer`` (bound to cluster-admin).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import time
import uuid
from typing import Any

import kubernetes

from tests.kube import (
    CLUSTER_DIR,
    E2E_RELEASE,
    KUBECONFIG,
    REPO,
    OperatorProcess,
    free_port,
    kubectl,
    service_account_kubeconfig,
    token_kubeconfig,
    wait_for,
)

SOURCE_NS_PREFIX = "bench-copyr-src"
REPLICATOR = (pathlib.Path.home() / ".cache" / "kopf-operators" / "peers"
              / "mittwald-kubernetes-replicator-f535dd9d8b49" / "bin" / "kubernetes-replicator")
PEER = "kopf-bench-peer"


class Replicator:
    """The peer as a process, with the same start/stop/pid surface as OperatorProcess."""

    def __init__(self) -> None:
        kubectl("create", "namespace", PEER, check=False)
        kubectl("create", "serviceaccount", PEER, "-n", PEER, check=False)
        kubectl("create", "clusterrolebinding", PEER, "--clusterrole=cluster-admin",
                f"--serviceaccount={PEER}:{PEER}", check=False)
        self.kubeconfig = token_kubeconfig(PEER, PEER, CLUSTER_DIR / "peer-kubeconfig")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (CLUSTER_DIR / "logs" / "bench-replicator.log").open("ab")
        self.proc = subprocess.Popen([str(REPLICATOR), f"--kubeconfig={self.kubeconfig}",
                                      f"--status-addr=127.0.0.1:{free_port()}", "--replicate-secrets=false",
                                      "--replicate-roles=false", "--replicate-role-bindings=false",
                                      "--replicate-service-accounts=false"], stdout=log, stderr=log)
        time.sleep(2)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def audit_log_path() -> str:
    out = subprocess.run([str(REPO / "cluster" / "cluster.sh"), "audit-log"], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def requests_between(path: str, user: str, start: datetime.datetime, end: datetime.datetime
                     ) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    with open(path) as log:
        for line in log:
            entry = json.loads(line)
            if entry.get("user", {}).get("username") != user or entry.get("stage") != "ResponseComplete":
                continue
            when = datetime.datetime.fromisoformat(entry["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if not start <= when <= end:
                continue
            ref = entry.get("objectRef") or {}
            resource = ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            verb = entry["verb"]
            if verb == "watch":
                continue  # long-running streams opened earlier, not per event
            counts[f"{verb} {resource}"] += 1
    return counts


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespaces", type=int, default=0)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--peer", choices=["replicator"], default=None)
    parser.add_argument("--edits", type=int, default=0, help="source edits to time after the probes")
    args = parser.parse_args()

    kubernetes.config.load_kube_config(config_file=str(KUBECONFIG))
    core = kubernetes.client.CoreV1Api()
    custom = kubernetes.client.CustomObjectsApi()
    subprocess.run(["kubectl", "--kubeconfig", str(KUBECONFIG), "apply", "--server-side", "--force-conflicts",
                    "-f", str(REPO / "manifests" / "crds")], check=True, capture_output=True)
    peer = Replicator() if args.peer else None
    kubeconfig = service_account_kubeconfig()
    user = f"system:serviceaccount:{PEER}:{PEER}" if peer else f"system:serviceaccount:{E2E_RELEASE}:{E2E_RELEASE}"
    token = uuid.uuid4().hex[:6]
    label = {"bench.kopf-operators.dev/copyrator": token}
    source_ns = f"{SOURCE_NS_PREFIX}-{token}"
    made: list[str] = [source_ns]
    # A previous run's namespaces still terminating would load the cluster during this one.
    wait_for(lambda: not [ns for ns in core.list_namespace().items if ns.metadata.name.startswith("bench-copyr")],
             timeout=900, interval=5, what="earlier bench-copyr namespaces to be gone")
    proc: OperatorProcess | Replicator = peer or OperatorProcess(
        files=["operators/copyrator.py"], kubeconfig=kubeconfig, log_name="bench-copyrator")
    selector = ",".join(f"{k}={v}" for k, v in label.items())
    push = {"replicator.v1.mittwald.de/replicate-to-matching": selector} if peer else {}
    try:
        core.create_namespace({"metadata": {"name": source_ns}})
        core.create_namespaced_config_map(source_ns, {"metadata": {
            "name": "shared", "labels": {"copyrator": "true"}, "annotations": push}, "data": {"k": "v"}})
        if not peer:
            custom.create_namespaced_custom_object("flant.com", "v1", source_ns, "copyrators", {
                "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "bench"},
                "spec": {"ruleType": "configmap", "selector": {"copyrator": "true"}, "namespace": source_ns,
                         "namespaceSelector": {"matchLabels": label}}})
        for i in range(args.namespaces):
            name = f"bench-copyr-{token}-{i:05d}"
            core.create_namespace({"metadata": {"name": name, "labels": label}})
            made.append(name)
        proc.start()
        started = time.perf_counter()
        if args.namespaces:
            last = made[-1]
            wait_for(lambda: core.list_namespaced_config_map(last, field_selector="metadata.name=shared").items,
                     timeout=600, what="the background copies")
        converged = time.perf_counter() - started
        time.sleep(3)  # let the status flush and start-up settle
        latencies = []
        assert proc.proc is not None
        cpu_before = cpu_seconds(proc.proc.pid)
        start = datetime.datetime.now(datetime.UTC)
        for i in range(args.probes):
            name = f"bench-copyr-{token}-probe-{i:03d}"
            core.create_namespace({"metadata": {"name": name, "labels": label}})
            made.append(name)
            created = time.perf_counter()
            while not core.list_namespaced_config_map(name, field_selector="metadata.name=shared").items:
                time.sleep(0.005)
            latencies.append(time.perf_counter() - created)
            time.sleep(0.6)  # past the status window: each probe's status patch is its own
        time.sleep(1.5)
        end = datetime.datetime.now(datetime.UTC)
        cpu = cpu_seconds(proc.proc.pid) - cpu_before
        counts = requests_between(audit_log_path(), user, start, end)
        total = sum(counts.values())
        latencies.sort()
        result: dict[str, Any] = {
            "controller": "mittwald/kubernetes-replicator f535dd9d8b49" if peer else "copyrator",
            "namespaces": args.namespaces, "probes": args.probes,
            "latency_ms": {"p50": round(statistics.median(latencies) * 1000, 1),
                           "max": round(latencies[-1] * 1000, 1),
                           "p90": round(latencies[int(len(latencies) * 0.9) - 1] * 1000, 1)},
            "requests_per_namespace_event": round(total / args.probes, 2),
            # Includes the idle baseline over the probes' ~0.65 s each (watch keep-alives, Kopf).
            "operator_cpu_ms_per_namespace_event": round(cpu / args.probes * 1000, 1),
            "startup_convergence_s": round(converged, 1) if args.namespaces else None,
            "by_verb": {k: round(v / args.probes, 2) for k, v in sorted(counts.items())},
        }
        # Source edits: every copy (namespaces + probes) updated; requests per edit.
        edits = []
        start = datetime.datetime.now(datetime.UTC)
        for i in range(args.edits):
            value = f"edit-{i}"
            core.patch_namespaced_config_map("shared", source_ns, {"data": {"k": value}})
            edited = time.perf_counter()
            wait_for(lambda value=value: all(  # type: ignore[misc]
                (cm.data or {}).get("k") == value for cm in core.list_config_map_for_all_namespaces(
                    field_selector="metadata.name=shared").items), timeout=300, interval=0.05,
                what="every copy updated")
            edits.append(time.perf_counter() - edited)
            time.sleep(1)
        end = datetime.datetime.now(datetime.UTC)
        if edits:
            counts = requests_between(audit_log_path(), user, start, end)
            result["source_edit"] = {
                "copies": args.namespaces + args.probes,
                "all_copies_updated_s": [round(e, 2) for e in edits],
                "requests_per_edit": {k: round(v / len(edits), 2) for k, v in sorted(counts.items())},
            }
        print(json.dumps(result, indent=2))
    finally:
        # The rule first, while the operator runs (it prunes the copies and releases the finalizer).
        with contextlib.suppress(kubernetes.client.ApiException):
            custom.delete_namespaced_custom_object("flant.com", "v1", source_ns, "copyrators", "bench")
        with contextlib.suppress(Exception):
            wait_for(lambda: not custom.list_namespaced_custom_object("flant.com", "v1", source_ns,
                                                                      "copyrators")["items"],
                     timeout=300, what="the rule's deletion")
        proc.stop()
        for name in made:
            with contextlib.suppress(kubernetes.client.ApiException):
                core.delete_namespace(name)


if __name__ == "__main__":
    main()
