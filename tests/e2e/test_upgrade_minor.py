"""A live cluster upgraded from one supported minor to the next (``make compat-upgrade``; not in
``make test``: it needs the next minor's build and the machine's real node, and it leaves the cluster on
the new minor).

The cluster starts on the pinned release (versions.env's KUBERNETES_VERSION) with the real node. The
session's host operator (``kopf run operators/*.py``, the chart's ServiceAccount) runs throughout and
is never restarted. In place beforehand: two ImmortalContainers whose pods run on the real node, a
CopyratorRule with copies in three namespaces and a push, a Deployment and a StatefulSet each re-rolled
once for their ConfigMap and Secret, and a ChaosAgent that killed one pod and waits an hour for its next
cycle. Then the control plane is upgraded as an administrator does it (``cluster.sh
upgrade-control-plane``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, one at a time,
on the same etcd data), then the node (``node.sh upgrade``: the kubelet restarted on the new build; the
containers keep running under containerd).

Nothing is lost or done twice: every pod, copy, workload and ledger is as it was (uids, start counts,
resourceVersions, generations, template annotations, the journal); the operator made no write at all
while the cluster was upgraded (the API server's audit log) and logged no error but Kopf's own
retries of the requests the API server refused while it restarted (each at ERROR, as Kopf logs them;
none escalated: a request failing all of Kopf's retries would be an error). Then each operator works
on the new minor: a deleted pod is replaced and counted once, a source change is copied, a ConfigMap
change rolls its Deployment once, a new ChaosAgent kills once, while the objects left alone stay as
they were.

A missing prerequisite (the next minor's build, the real node, a cluster already upgraded) fails the
test, never skips it.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import pytest
import yaml

from kopf_operators.blackadder import settings as chaos
from kopf_operators.copyrator.rules import ACCEPT_FROM_ANNOTATION, PUSH_TO_ANNOTATION
from kopf_operators.immortal import decisions as immortal
from kopf_operators.reroller import settings as reroller
from release.compat import supported_versions
from tests.e2e.realnode import NODE, script
from tests.kube import OperatorProcess, delete_namespaces, operator_namespace, stays, wait_for
from testsupport.audit import CHART_USER_PREFIX, AuditLog, resource_of
from testsupport.launcher import TRANSIENT_API_RETRY
from testsupport.paths import CLUSTER_DIR, REPO, kube_version

pytestmark = [pytest.mark.upgrade, pytest.mark.timeout(1800)]

REAL_NODE_TAINT = "kopf-operators.dev/real-node"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
ICS = ("sleeper-a", "sleeper-b")  # a's pod is deleted after the upgrade; b is left alone
TARGETS = 3  # namespaces the rule copies into


def upgrade_path() -> tuple[str, str]:
    """The pinned release and the next supported minor's release (versions.env's COMPAT_VERSIONS)."""
    versions = supported_versions()
    pinned = f"v{kube_version()}"
    assert pinned in versions, f"the pinned {pinned} is not among the supported {versions}"
    later = versions[versions.index(pinned) + 1:]
    assert later, f"no supported minor after {pinned} ({versions}) to upgrade to"
    return pinned, later[0]


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """A cluster/ script for this CLUSTER_DIR; its stderr (the scripts' log lines)."""
    done = subprocess.run([str(REPO / "cluster" / args[0]), *args[1:]], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "CLUSTER_DIR": str(CLUSTER_DIR), **(env or {})})
    assert done.returncode == 0, f"cluster/{' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return done.stderr


# --- prerequisites: fail, never skip ----------------------------------------------------------------


@pytest.fixture(scope="module")
def versions(cluster: str, core: kubernetes.client.CoreV1Api) -> tuple[str, str]:
    source, target = upgrade_path()
    running = kubernetes.client.VersionApi().get_code().git_version
    if running != source:
        pytest.fail(f"the cluster in {CLUSTER_DIR} runs {running}, not {source}: the upgrade starts from a "
                    f"fresh cluster (`make compat-upgrade` starts one)")
    status = subprocess.run([str(REPO / "cluster" / "node.sh"), "status"], capture_output=True, text=True,
                            env={**os.environ, "CLUSTER_DIR": str(CLUSTER_DIR)})
    if status.returncode != 0:
        pytest.fail(f"the cluster in {CLUSTER_DIR} has no Ready real node (start it as root with REAL_NODE=1; "
                    f"node.sh owner: {script('node.sh', 'owner') or 'none'}):\n{status.stderr}")
    # The next minor's control plane and kubelet, from build.sh's cache (built now if missing).
    run("build.sh", env={"KUBERNETES_VERSION": target}, timeout=1500)
    return source, target


@pytest.fixture(scope="module")
def image(versions: tuple[str, str]) -> str:
    """The local base image (Debian with a shell), loaded into the real node's containerd."""
    base = script("image.sh", "base")
    script("node.sh", "load", base)
    return base


# --- what is measured while the cluster is upgraded -------------------------------------------------


@dataclass
class Outages:
    """Polls ``probe`` every 0.2 s in a thread; the intervals (monotonic) during which it failed."""
    probe: Callable[[], bool]
    spans: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        down_since: float | None = None
        while not self._stop.is_set():
            try:
                up = self.probe()
            except Exception:
                up = False
            now = time.monotonic()
            if not up and down_since is None:
                down_since = now
            elif up and down_since is not None:
                self.spans.append((down_since, now))
                down_since = None
            self._stop.wait(0.2)
        if down_since is not None:
            self.spans.append((down_since, time.monotonic()))

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join()
        return self.spans

    @staticmethod
    def describe(spans: list[tuple[float, float]]) -> str:
        if not spans:
            return "never down"
        return f"down {sum(b - a for a, b in spans):.1f} s in {len(spans)} span(s): " + ", ".join(
            f"{b - a:.1f} s" for a, b in spans)


def api_ready(api: kubernetes.client.ApiClient) -> Callable[[], bool]:
    """/readyz through a client of its own that never retries (each probe is one request)."""
    configuration = copy.copy(api.configuration)
    configuration.retries = False
    client = kubernetes.client.ApiClient(configuration)

    def probe() -> bool:
        response = client.call_api("GET", f"{configuration.host}/readyz", _request_timeout=(1, 1))
        return bool(response.status == 200)
    return probe


def kubelet_healthy() -> bool:
    port = yaml.safe_load((CLUSTER_DIR / "node" / "kubelet.yaml").read_text())["healthzPort"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
        return bool(response.status == 200)


# --- the live objects -------------------------------------------------------------------------------


@dataclass
class Live:
    ic: str  # the ImmortalContainers' namespace
    source: str  # the rule's and the push's namespace
    targets: list[str]
    push_target: str
    workloads: str  # the re-rolled Deployment and StatefulSet
    victims: str  # where the ChaosAgent kills
    agent: str
    namespaces: list[str]


def pod_spec(image: str) -> dict[str, Any]:
    """A pod on the real node (its taint tolerated) whose container runs until it is stopped."""
    return {"nodeName": NODE,
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"]}]}


def ic_status(custom: Any, ns: str, name: str) -> dict[str, Any]:
    body = custom.get_namespaced_custom_object(immortal.GROUP, immortal.VERSION, ns, immortal.PLURAL, name)
    return dict(body.get("status") or {})


def running_pod(core: Any, ns: str, name: str, not_uid: str | None = None) -> Any:
    def probe() -> Any:
        pods = core.list_namespaced_pod(ns, field_selector=f"metadata.name={name}").items
        pod = pods[0] if pods else None
        statuses = (pod.status.container_statuses or []) if pod else []
        ok = (pod is not None and pod.metadata.uid != not_uid and pod.metadata.deletion_timestamp is None
              and statuses and statuses[0].state.running is not None)
        return pod if ok else None
    return wait_for(probe, timeout=90, interval=0.1, what=f"pod {ns}/{name} running (uid != {not_uid})")


def counted(custom: Any, core: Any, ns: str, name: str, starts: int, not_uid: str | None = None) -> Any:
    """The IC's pod once it runs and the IC counts exactly ``starts`` starts, the last being this pod."""
    pod = running_pod(core, ns, immortal.pod_name(name), not_uid)
    wait_for(lambda: (lambda st: st.get("startTimes") == starts and st.get("currentPodUID") == pod.metadata.uid)(
        ic_status(custom, ns, name)), timeout=60, what=f"{name}: {starts} start(s), the last {pod.metadata.uid}")
    return pod


def ledger(core: Any, agent: str) -> dict[str, Any]:
    secret = core.read_namespaced_secret(chaos.ledger_name(agent), chaos.ledger_namespace(operator_namespace()))
    return dict(json.loads(base64.b64decode(secret.data[chaos.LEDGER_KEY])))


def agent_status(custom: Any, name: str) -> dict[str, Any]:
    return dict(custom.get_cluster_custom_object(chaos.GROUP, chaos.VERSION, chaos.PLURAL, name).get("status") or {})


def bounded_agent(custom: Any, name: str, target: str) -> None:
    """A real ChaosAgent: one pod killed at once, then an hour's pause (nothing due during the upgrade)."""
    custom.create_cluster_custom_object(chaos.GROUP, chaos.VERSION, chaos.PLURAL, {
        "apiVersion": f"{chaos.GROUP}/{chaos.VERSION}", "kind": "ChaosAgent", "metadata": {"name": name},
        "spec": {"tantrumMode": True, "eagerness": 100, "podTolerance": 0, "maxKillsPerCycle": 1,
                 "pauseDuration": 3600, "targetNamespaces": [target]}})


def killed_once(custom: Any, core: Any, name: str) -> dict[str, Any]:
    """The agent's first cycle done, with exactly one kill in its ledger's journal."""
    wait_for(lambda: int(agent_status(custom, name).get("cycle") or 0) >= 1, timeout=60,
             what=f"{name}'s first cycle")
    book: dict[str, Any] = wait_for(lambda: (lambda b: b if b.get("journal") else {})(ledger(core, name)),
                                    timeout=30, what=f"{name}'s ledger journal")
    assert len(book["journal"]) == 1, book["journal"]
    return book


def rerolled(apps: Any, ns: str, kind: str, name: str, previous: str | None) -> str:
    read = apps.read_namespaced_deployment if kind == "Deployment" else apps.read_namespaced_stateful_set
    def probe() -> str | None:
        value = (read(name, ns).spec.template.metadata.annotations or {}).get(reroller.CONFIG_HASH)
        return value if value and value != previous else None
    return str(wait_for(probe, timeout=60, what=f"{kind} {name} re-rolled"))


@pytest.fixture(scope="module")
def live(core: Any, apps: Any, custom: Any, image: str, operator_process: OperatorProcess) -> Iterator[Live]:
    """The objects of all four operators, each having acted once, with the host operator running."""
    operator_process.start()
    run_id = uuid.uuid4().hex[:5]
    live = Live(ic=f"up-ic-{run_id}", source=f"up-src-{run_id}",
                targets=[f"up-tgt{i}-{run_id}" for i in range(TARGETS)], push_target=f"up-push-{run_id}",
                workloads=f"up-roll-{run_id}", victims=f"up-chaos-{run_id}", agent=f"up-agent-{run_id}",
                namespaces=[])
    label = {"kopf-operators.dev/test": "true"}
    for ns in (live.ic, live.source, live.workloads, live.victims):
        core.create_namespace({"metadata": {"name": ns, "labels": label}})
    for ns in live.targets:
        core.create_namespace({"metadata": {"name": ns, "labels": {**label, "upgrade-target": run_id}}})
    core.create_namespace({"metadata": {"name": live.push_target, "labels": label,
                                        "annotations": {ACCEPT_FROM_ANNOTATION: live.source}}})
    live.namespaces = [live.ic, live.source, live.workloads, live.victims, *live.targets, live.push_target]
    for ns in live.namespaces:
        wait_for(lambda ns=ns: core.read_namespaced_service_account("default", ns), timeout=30,  # type: ignore[misc]
                 what=f"the default ServiceAccount in {ns}")
    try:
        # Immortal: two pods on the real node, each started and counted once.
        for name in ICS:
            custom.create_namespaced_custom_object(immortal.GROUP, immortal.VERSION, live.ic, immortal.PLURAL, {
                "apiVersion": immortal.API_VERSION, "kind": immortal.KIND, "metadata": {"name": name},
                "spec": {"template": {"spec": pod_spec(image)}}})
        for name in ICS:
            counted(custom, core, live.ic, name, 1)
        # Copyrator: a rule into three namespaces, and a push into a fourth that accepts it.
        core.create_namespaced_config_map(live.source, {"metadata": {"name": "shared", "labels": {"upgrade": run_id}},
                                                        "data": {"greeting": "hello"}})
        custom.create_namespaced_custom_object("flant.com", "v1", live.source, "copyrators", {
            "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "to-targets"},
            "spec": {"ruleType": "configmap", "selector": {"upgrade": run_id}, "namespace": [live.source],
                     "namespaceSelector": {"matchLabels": {"upgrade-target": run_id}}}})
        core.create_namespaced_config_map(live.source, {
            "metadata": {"name": "pushed", "annotations": {PUSH_TO_ANNOTATION: live.push_target}},
            "data": {"pushed": "yes"}})
        for ns, name in copy_places(live):
            wait_for(lambda ns=ns, name=name: core.list_namespaced_config_map(  # type: ignore[misc]
                ns, field_selector=f"metadata.name={name}").items, timeout=60, what=f"the copy {ns}/{name}")
        # Re-roller: a Deployment on a ConfigMap and a StatefulSet on a Secret, each re-rolled once.
        core.create_namespaced_config_map(live.workloads, {"metadata": {"name": "app-conf"}, "data": {"level": "1"}})
        core.create_namespaced_secret(live.workloads, {"metadata": {"name": "db-secret"},
                                                       "stringData": {"password": "one"}})
        auto = {reroller.AUTO: "true"}
        container = {"name": "main", "image": "busybox:1.36"}
        apps.create_namespaced_deployment(live.workloads, {
            "metadata": {"name": "app", "annotations": auto},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "app"}}, "template": {
                "metadata": {"labels": {"app": "app"}},
                "spec": {"containers": [{**container, "envFrom": [{"configMapRef": {"name": "app-conf"}}]}]}}}})
        apps.create_namespaced_stateful_set(live.workloads, {
            "metadata": {"name": "db", "annotations": auto},
            "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{**container, "envFrom": [{"secretRef": {"name": "db-secret"}}]}]}}}})
        for kind, name in (("Deployment", "app"), ("StatefulSet", "db")):
            read = apps.read_namespaced_deployment if kind == "Deployment" else apps.read_namespaced_stateful_set
            wait_for(lambda read=read, name=name: reroller.OBSERVED_HASH in (  # type: ignore[misc]
                read(name, live.workloads).metadata.annotations or {}), timeout=60, what=f"{name}'s baseline")
        core.patch_namespaced_config_map("app-conf", live.workloads, {"data": {"level": "2"}})
        rerolled(apps, live.workloads, "Deployment", "app", None)
        core.patch_namespaced_secret("db-secret", live.workloads, {"stringData": {"password": "two"}})
        rerolled(apps, live.workloads, "StatefulSet", "db", None)
        # Blackadder: three pods to kill from, one killed, the next cycle an hour away.
        apps.create_namespaced_deployment(live.victims, {
            "metadata": {"name": "victims"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "victims"}}, "template": {
                "metadata": {"labels": {"app": "victims"}}, "spec": {"containers": [container]}}}})
        wait_for(lambda: (apps.read_namespaced_deployment("victims", live.victims).status.ready_replicas or 0) == 3,
                 timeout=60, what="three victims ready")
        bounded_agent(custom, live.agent, live.victims)
        killed_once(custom, core, live.agent)
        yield live
    finally:
        for agent in (live.agent, f"{live.agent}-after"):  # the operator reverts and drops its ledger
            subprocess.run(["kubectl", "delete", "chaosagents.blackadder.io", agent, "--ignore-not-found",
                            "--timeout=60s"], capture_output=True, timeout=70)
        delete_namespaces(core, live.namespaces)


def copy_places(live: Live) -> list[tuple[str, str]]:
    return [(ns, "shared") for ns in live.targets] + [(live.push_target, "pushed")]


# --- what must not change -----------------------------------------------------------------------------


def snapshot(core: Any, apps: Any, custom: Any, live: Live) -> dict[str, Any]:
    """Everything an operator could lose or do twice, as the API shows it."""
    state: dict[str, Any] = {}
    for name in ICS:
        st = ic_status(custom, live.ic, name)
        pod = core.read_namespaced_pod(immortal.pod_name(name), live.ic)
        container = pod.status.container_statuses[0]
        state[f"ic/{name}"] = {
            "startTimes": st.get("startTimes"), "currentPodUID": st.get("currentPodUID"), "pod": pod.metadata.uid,
            "node": pod.spec.node_name, "container": container.container_id, "restarts": container.restart_count,
            "running_since": str(container.state.running.started_at) if container.state.running else None}
    for ns, name in copy_places(live):
        copy = core.read_namespaced_config_map(name, ns)
        state[f"copy/{ns}/{name}"] = (copy.metadata.uid, copy.metadata.resource_version, copy.data)
    for kind, name in (("Deployment", "app"), ("StatefulSet", "db")):
        read = apps.read_namespaced_deployment if kind == "Deployment" else apps.read_namespaced_stateful_set
        obj = read(name, live.workloads)
        state[f"{kind}/{name}"] = {"generation": obj.metadata.generation,
                                   "template": obj.spec.template.metadata.annotations,
                                   "observed": (obj.metadata.annotations or {}).get(reroller.OBSERVED_HASH)}
    state["replicasets/app"] = sorted(r.metadata.name for r in apps.list_namespaced_replica_set(live.workloads).items)
    state["revisions/db"] = sorted(r.metadata.name
                                   for r in apps.list_namespaced_controller_revision(live.workloads).items)
    book = ledger(core, live.agent)
    state[f"agent/{live.agent}"] = {"cycle": agent_status(custom, live.agent).get("cycle"),
                                    "ledger_cycle": book.get("cycle"), "journal": book.get("journal")}
    return state


def differences(before: dict[str, Any], after: dict[str, Any], keys: Any = None) -> dict[str, Any]:
    return {k: (before[k], after.get(k)) for k in (keys or before) if before[k] != after.get(k)}


def operator_writes(audit: AuditLog, start: int, end: int | None = None) -> list[str]:
    """Every write the operator's ServiceAccount made between two marks of the audit log."""
    return [f"{e['verb']} {resource_of(e)} {(e.get('objectRef') or {}).get('namespace', '')}/"
            f"{(e.get('objectRef') or {}).get('name', '')} -> {(e.get('responseStatus') or {}).get('code')}"
            for e in audit.entries(start, end)
            if e.get("verb") in WRITES and e.get("user", {}).get("username", "").startswith(CHART_USER_PREFIX)]


def log_lines(operator: OperatorProcess, start: int) -> dict[str, list[str]]:
    """The operator's log lines from ``start`` (an offset in its log): Kopf's retries of a request the
    API server refused or could not answer (logged at ERROR, retried up to 8 times over ~54 s), other
    errors and tracebacks, warnings."""
    lines = operator.output()[start:].splitlines()
    return {"retries": [line for line in lines if TRANSIENT_API_RETRY.search(line)],
            "errors": [line for line in lines if ("[ERROR" in line or "Traceback" in line)
                       and not TRANSIENT_API_RETRY.search(line)],
            "warnings": [line for line in lines if "[WARNING" in line]}


def retried(lines: list[str]) -> str:
    """How many requests Kopf retried, how often at most, and over which seconds of the log."""
    if not lines:
        return "none"
    attempts = [int(m.group(1)) for line in lines if (m := re.search(r"attempt #(\d+)/", line))]
    stamps = [line[1:20] for line in lines]
    return (f"{len(lines)} retry lines ({attempts.count(1)} requests; at most attempt #{max(attempts)}), "
            f"from {stamps[0]} to {stamps[-1]}")


# --- the upgrade -------------------------------------------------------------------------------------


def test_a_live_cluster_upgraded_a_minor_loses_nothing_and_does_nothing_twice(
        versions: tuple[str, str], live: Live, api: kubernetes.client.ApiClient, core: Any, apps: Any,
        custom: Any, operator_process: OperatorProcess) -> None:
    source, target = versions
    operator = operator_process
    before = snapshot(core, apps, custom, live)
    audit = AuditLog()
    audit_start, log_start = audit.mark(), len(operator.output())
    api_outages, kubelet_outages = Outages(api_ready(api)), Outages(kubelet_healthy)

    started = time.monotonic()
    said = run("cluster.sh", "upgrade-control-plane", env={"KUBERNETES_VERSION": target})
    control_plane_seconds = time.monotonic() - started
    assert kubernetes.client.VersionApi().get_code().git_version == target
    assert operator.running, operator.tail()
    node = core.read_node(NODE)
    assert node.status.node_info.kubelet_version == source, "the node is upgraded after the control plane"
    # Nothing lost while only the control plane is new (the kubelet, still on the old minor, reports).
    assert differences(before, snapshot(core, apps, custom, live)) == {}

    started = time.monotonic()
    said += run("node.sh", "upgrade", env={"KUBERNETES_VERSION": target})
    node_seconds = time.monotonic() - started
    assert core.read_node(NODE).status.node_info.kubelet_version == target
    api_spans, kubelet_spans = api_outages.stop(), kubelet_outages.stop()

    # The kubelet on the new minor has seen every container again (its status reports the same ones):
    # still the same pods, the same containers, never restarted, each start counted once.
    stays(lambda: differences(before, snapshot(core, apps, custom, live)) == {}, seconds=10,
          what="every object as it was before the upgrade")
    after = snapshot(core, apps, custom, live)
    assert differences(before, after) == {}
    writes = operator_writes(audit, audit_start)
    logged = log_lines(operator, log_start)
    print(f"\nupgrade {source} -> {target}\n{said.strip()}\n"
          f"control plane: {control_plane_seconds:.1f} s; the API server {Outages.describe(api_spans)}\n"
          f"node: {node_seconds:.1f} s; the kubelet {Outages.describe(kubelet_spans)}\n"
          f"the operator's writes during the upgrade: {writes or 'none'}\n"
          f"the operator's requests retried: {retried(logged['retries'])}\n"
          f"the operator's other ERROR lines: {len(logged['errors'])}, WARNING lines: {len(logged['warnings'])}")
    for line in logged["errors"] + logged["warnings"]:
        print(f"  {line}")
    assert writes == [], writes
    assert logged["errors"] == [], logged["errors"]
    assert operator.running

    # --- each operator works on the new minor; what is left alone stays as it was ----------------
    audit_after = audit.mark()
    ic_before = before["ic/sleeper-a"]
    core.delete_namespaced_pod(immortal.pod_name("sleeper-a"), live.ic)
    replaced = counted(custom, core, live.ic, "sleeper-a", 2, not_uid=ic_before["pod"])
    assert replaced.spec.node_name == NODE

    core.patch_namespaced_config_map("shared", live.source, {"data": {"greeting": f"hello from {target}"}})
    for ns in live.targets:
        wait_for(lambda ns=ns: core.read_namespaced_config_map("shared", ns).data.get("greeting")  # type: ignore[misc]
                 == f"hello from {target}", timeout=60, what=f"the change copied into {ns}")

    app_hash = before["Deployment/app"]["template"][reroller.CONFIG_HASH]
    core.patch_namespaced_config_map("app-conf", live.workloads, {"data": {"level": "3"}})
    new_hash = rerolled(apps, live.workloads, "Deployment", "app", app_hash)
    generation = before["Deployment/app"]["generation"]
    stays(lambda: (lambda d: d.metadata.generation == generation + 1
                   and d.spec.template.metadata.annotations[reroller.CONFIG_HASH] == new_hash)(
        apps.read_namespaced_deployment("app", live.workloads)), seconds=5, what="exactly one rollout of app")

    second = f"{live.agent}-after"
    bounded_agent(custom, second, live.victims)
    killed_once(custom, core, second)

    left_alone = ["ic/sleeper-b", f"copy/{live.push_target}/pushed", "StatefulSet/db", "revisions/db",
                  f"agent/{live.agent}"]
    assert differences(before, snapshot(core, apps, custom, live), left_alone) == {}
    replaced_status = ic_status(custom, live.ic, "sleeper-a")
    assert (replaced_status["startTimes"], replaced_status["currentPodUID"]) == (2, replaced.metadata.uid)
    kinds = sorted({" ".join(w.split()[:2]) for w in operator_writes(audit, audit_after)})
    print(f"after the upgrade, the operator's kinds of writes: {kinds}")
    assert log_lines(operator, log_start)["errors"] == [], operator.tail(100)
    assert operator.tracebacks() == []
