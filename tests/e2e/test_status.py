"""Status that GitOps tools can trust, judged by the real tools' own logic on objects read from the
real cluster in each state (docs/observability.md):

- kstatus: sigs.k8s.io/cli-utils' ``pkg/kstatus/status`` (what Flux, kpt and cli-utils use), built
  from tests/kstatus into the project cache; its verdict must be Current, InProgress or Failed;
- Argo CD: docs/argocd/health.lua run under a real Lua 5.1 runtime (Argo CD's gopher-lua is 5.1);
- ``kubectl wait --for=condition=Ready`` returns for a working object and times out for a broken one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from lupa import lua51

from kopf_operators.blackadder import settings
from kopf_operators.copyrator import rules
from kopf_operators.immortal import decisions as immortal
from tests.e2e.realnode import NODE, script
from tests.kube import OperatorProcess, wait_for
from testsupport.kubectl import kubectl, kubectl_json
from testsupport.paths import REPO

CHECKER_SOURCE = REPO / "tests" / "kstatus"
HEALTH_LUA = REPO / "docs" / "argocd" / "health.lua"
# What Argo CD shows for each kstatus verdict (a paused ChaosAgent is Suspended, see below).
ARGO_FOR = {"Current": "Healthy", "InProgress": "Progressing", "Failed": "Degraded"}
REAL_NODE_TAINT = "kopf-operators.dev/real-node"


# --- the judges -------------------------------------------------------------------------------------


def apply(obj: dict[str, Any], namespace: str | None = None) -> None:
    where = ["-n", namespace] if namespace else []
    result = kubectl("apply", *where, "-f", "-", input=json.dumps(obj), check=False)
    assert result.returncode == 0, result.stderr


def cache_root() -> Path:
    """The project's cache, as cluster/build.sh computes it."""
    if os.environ.get("KOPF_OPERATORS_CACHE"):
        return Path(os.environ["KOPF_OPERATORS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kopf-operators"


@pytest.fixture(scope="session")
def kstatus_checker() -> Path:
    """tests/kstatus built with the local Go (modules from the proxy), once per source version, into
    the project cache (never committed); concurrent sessions wait for one build."""
    digest = hashlib.sha256(b"".join((CHECKER_SOURCE / f).read_bytes()
                                     for f in ("go.mod", "go.sum", "main.go"))).hexdigest()[:16]
    root = cache_root()
    binary = root / f"kstatus-{digest}" / "kstatus"
    if binary.exists():
        return binary
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"kstatus-{digest}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}
        try:
            result = subprocess.run(["go", "build", "-trimpath", "-o", str(partial), "."], cwd=CHECKER_SOURCE,
                                    env=env, capture_output=True, text=True, timeout=1200)
        except FileNotFoundError:
            pytest.fail("building the kstatus checker needs Go >= 1.26 on PATH (`go` not found)", pytrace=False)
        if result.returncode != 0:
            pytest.fail(f"building the kstatus checker (tests/kstatus, sigs.k8s.io/cli-utils) failed; it needs "
                        f"Go >= 1.26 and the Go module proxy:\n{result.stderr[-3000:]}", pytrace=False)
        partial.rename(binary)
    return binary


def kstatus(checker: Path, obj: dict[str, Any]) -> dict[str, str]:
    result = subprocess.run([str(checker)], input=json.dumps(obj), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def argo_health(obj: dict[str, Any]) -> dict[str, str]:
    """docs/argocd/health.lua on ``obj``, as Argo CD runs it: a global ``obj`` (JSON as Lua tables)."""
    lua = lua51.LuaRuntime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    answer = lua.execute(HEALTH_LUA.read_text())
    return {"status": str(answer["status"]), "message": str(answer["message"])}


def judged(checker: Path, obj: dict[str, Any], verdict: str, argo: str | None = None) -> dict[str, Any]:
    """Assert kstatus' verdict and Argo CD's health of one object read from the cluster."""
    ks, health = kstatus(checker, obj), argo_health(obj)
    where = f"{obj['kind']} {obj['metadata']['name']}: status {json.dumps(obj.get('status'))}"
    assert ks["status"] == verdict, f"kstatus says {ks}, expected {verdict}; {where}"
    assert health["status"] == (argo or ARGO_FOR[verdict]), f"Argo CD health {health}; {where}"
    return obj


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}


def observed(resource: str, name: str, namespace: str | None, reason: str,
             timeout: float = 60) -> dict[str, Any]:
    """The object once its status describes its current generation with this Ready reason."""
    where = ["-n", namespace] if namespace else []

    def probe() -> dict[str, Any]:
        obj: dict[str, Any] = kubectl_json("get", resource, name, *where)
        ready = conditions(obj).get("Ready") or {}
        current = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and ready.get("reason") == reason else {}

    return wait_for(probe, timeout=timeout, what=f"{resource} {name} to report {reason}")


def kubectl_wait_ready(resource: str, name: str, namespace: str | None, seconds: int
                       ) -> subprocess.CompletedProcess[str]:
    where = ["-n", namespace] if namespace else []
    return kubectl("wait", "--for=condition=Ready", f"--timeout={seconds}s", resource, name, *where,
                   check=False, timeout=seconds + 30)


def columns(resource: str, name: str, namespace: str | None) -> list[str]:
    """``kubectl get`` as a person reads it: the printer columns of one object."""
    where = ["-n", namespace] if namespace else []
    return kubectl("get", resource, name, *where, "--no-headers").stdout.split()


def assert_times_out(resource: str, name: str, namespace: str | None) -> None:
    waited = kubectl_wait_ready(resource, name, namespace, 3)
    assert waited.returncode != 0 and "timed out" in waited.stderr, waited


def events(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> list[tuple[str, str]]:
    items = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [(e.type, e.reason) for e in items]


# --- ImmortalContainer ------------------------------------------------------------------------------


def immortal_container(namespace: str, name: str, spec: dict[str, Any]) -> None:
    apply({"apiVersion": immortal.API_VERSION, "kind": immortal.KIND, "metadata": {"name": name}, "spec": spec},
          namespace)


def test_immortal_container_states(operator: OperatorProcess, namespace: str, kstatus_checker: Path,
                                   core: kubernetes.client.CoreV1Api) -> None:
    # Current: the pod is Ready (KWOK marks its pods Ready; real readiness probes: the real-node test).
    immortal_container(namespace, "working", {"image": "busybox:1.36"})
    judged(kstatus_checker, observed("ic", "working", namespace, "PodReady"), "Current")
    assert kubectl_wait_ready("ic", "working", namespace, 30).returncode == 0
    # InProgress: the pod cannot be scheduled yet (no node has that label): work under way.
    immortal_container(namespace, "pending", {"template": {"spec": {
        "nodeSelector": {"kopf-operators.dev/no-such-node": "true"},
        "containers": [{"name": "main", "image": "busybox:1.36"}]}}})
    pending = judged(kstatus_checker, observed("ic", "pending", namespace, "PodStarting"), "InProgress")
    assert conditions(pending)["Reconciling"]["status"] == "True"
    assert_times_out("ic", "pending", namespace)
    # Failed: a template the API server refuses (422), with its reason for a person to act on.
    immortal_container(namespace, "refused", {"template": {"spec": {
        "containers": [{"name": "Bad_Name", "image": "busybox:1.36"}]}}})
    refused = judged(kstatus_checker, observed("ic", "refused", namespace, "InvalidTemplate"), "Failed")
    assert "Bad_Name" in conditions(refused)["Stalled"]["message"]
    assert kstatus(kstatus_checker, refused)["message"] == conditions(refused)["Stalled"]["message"]
    assert_times_out("ic", "refused", namespace)
    assert columns("ic", "refused", namespace)[-3:-1] == ["False", "InvalidTemplate"]  # READY, REASON, AGE
    # Failed: someone else's pod holds the name; it is never touched. Then it goes: Ready again.
    core.create_namespaced_pod(namespace, {"metadata": {"name": immortal.pod_name("blocked")},
                                           "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}})
    immortal_container(namespace, "blocked", {"image": "busybox:1.36"})
    judged(kstatus_checker, observed("ic", "blocked", namespace, "ForeignPod"), "Failed")
    wait_for(lambda: ("Warning", "Stalled") in events(core, namespace, "blocked"), timeout=10,
             what="a Warning Event Stalled")
    core.delete_namespaced_pod(immortal.pod_name("blocked"), namespace, grace_period_seconds=0)
    judged(kstatus_checker, observed("ic", "blocked", namespace, "PodReady", timeout=90), "Current")
    wait_for(lambda: ("Normal", "Recovered") in events(core, namespace, "blocked"), timeout=10,
             what="a Normal Event Recovered")
    assert operator.errors(namespace) == []


# --- CopyratorRule ----------------------------------------------------------------------------------


def rule(namespace: str, name: str, spec: dict[str, Any]) -> None:
    apply({"apiVersion": rules.API_VERSION, "kind": rules.KIND, "metadata": {"name": name}, "spec": spec},
          namespace)


def config_map(core: kubernetes.client.CoreV1Api, namespace: str, name: str, labels: dict[str, str]) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": labels},
                                                  "data": {"key": "value"}})


def test_copyrator_rule_states(operator: OperatorProcess, namespace: str, kstatus_checker: Path,
                               core: kubernetes.client.CoreV1Api, make_namespace: Callable[..., str]) -> None:
    target, crowded, quota, elsewhere = (make_namespace("status") for _ in range(4))
    # Current: every wanted copy in sync.
    config_map(core, namespace, "shared", {"copy": "shared"})
    rule(namespace, "synced", {"ruleType": "configmap", "selector": {"copy": "shared"}, "namespace": namespace,
                               "targetNamespaces": [target]})
    judged(kstatus_checker, observed("copyr", "synced", namespace, "Synced"), "Current")
    assert kubectl_wait_ready("copyr", "synced", namespace, 30).returncode == 0
    # Failed: one of two wanted copies blocked by someone else's ConfigMap (left untouched).
    config_map(core, namespace, "taken", {"copy": "taken"})
    config_map(core, crowded, "taken", {})
    rule(namespace, "blocked", {"ruleType": "configmap", "selector": {"copy": "taken"}, "namespace": namespace,
                                "targetNamespaces": [target, crowded]})
    blocked = judged(kstatus_checker, observed("copyr", "blocked", namespace, "ForeignObject"), "Failed")
    assert f"{crowded}/taken" in conditions(blocked)["Stalled"]["message"]
    assert (blocked["status"]["copied"], blocked["status"]["desired"]) == (1, 2)
    assert_times_out("copyr", "blocked", namespace)
    assert columns("copyr", "blocked", namespace)[-3:-1] == ["False", "ForeignObject"]  # READY, REASON, AGE
    wait_for(lambda: ("Warning", "Stalled") in events(core, namespace, "blocked"), timeout=10,
             what="a Warning Event Stalled")
    # Failed: a source in another namespace whose owner has not consented.
    config_map(core, elsewhere, "private", {"copy": "private"})
    rule(namespace, "unconsented", {"ruleType": "configmap", "selector": {"copy": "private"},
                                    "namespace": elsewhere, "targetNamespaces": [target]})
    judged(kstatus_checker, observed("copyr", "unconsented", namespace, "Refused"), "Failed")
    # InProgress: the target's quota refuses the copy; the operator retries (it may be freed).
    core.create_namespaced_resource_quota(quota, {"metadata": {"name": "no-more"},
                                                  "spec": {"hard": {"configmaps": "1"}}})
    wait_for(lambda: core.read_namespaced_resource_quota("no-more", quota).status.used, timeout=30,
             what="the quota's usage")
    rule(namespace, "over-quota", {"ruleType": "configmap", "selector": {"copy": "shared"}, "namespace": namespace,
                                   "targetNamespaces": [quota]})
    judged(kstatus_checker, observed("copyr", "over-quota", namespace, "SyncFailed"), "InProgress")
    for name in ("synced", "blocked", "unconsented", "over-quota"):
        kubectl("delete", "copyr", name, "-n", namespace, "--timeout=60s")


# --- ChaosAgent -------------------------------------------------------------------------------------


@pytest.fixture
def agent_names(operator: OperatorProcess) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    operator.start()  # the finalizer needs a running operator
    for name in names:
        kubectl("delete", "chaosagent", name, "--ignore-not-found", "--timeout=60s")


def chaos_agent(names: list[str], spec: dict[str, Any]) -> str:
    name = f"status-{uuid.uuid4().hex[:6]}"
    names.append(name)
    apply({"apiVersion": f"{settings.GROUP}/{settings.VERSION}", "kind": settings.KIND,
           "metadata": {"name": name}, "spec": spec})
    return name


def test_chaos_agent_states(operator: OperatorProcess, namespace: str, kstatus_checker: Path,
                            agent_names: list[str], core: kubernetes.client.CoreV1Api) -> None:
    confined = {"tantrumMode": True, "eagerness": 100, "podTolerance": 0, "dryRun": True,
                "targetNamespaces": [namespace], "pauseDuration": 3600}
    # Current: the last cycle succeeded.
    working = chaos_agent(agent_names, confined)
    judged(kstatus_checker, observed("chaosagent", working, None, "CycleDone"), "Current")
    assert kubectl_wait_ready("chaosagent", working, None, 30).returncode == 0
    # InProgress: a spec change that the next cycle (an hour away) applies.
    kubectl("patch", "chaosagent", working, "--type=merge", "-p", '{"spec": {"eagerness": 10}}')
    changed = kubectl_json("get", "chaosagent", working)
    assert changed["status"]["observedGeneration"] < changed["metadata"]["generation"]
    judged(kstatus_checker, changed, "InProgress")
    # Current while idle by design: paused (Argo CD: Suspended).
    paused = chaos_agent(agent_names, {**confined, "paused": True})
    judged(kstatus_checker, observed("chaosagent", paused, None, "Paused"), "Current", argo="Suspended")
    # Failed: activeWindows in a time zone that does not exist; a person must fix the spec.
    lost = chaos_agent(agent_names, {**confined, "timeZone": "Mars/Olympus_Mons",
                                     "activeWindows": [{"from": "09:00", "to": "17:00"}]})
    stalled = judged(kstatus_checker, observed("chaosagent", lost, None, "InvalidSpec"), "Failed")
    assert "Mars/Olympus_Mons" in conditions(stalled)["Stalled"]["message"]
    assert_times_out("chaosagent", lost, None)
    assert columns("chaosagent", lost, None)[-3:-1] == ["False", "Failed"]  # READY, STATE, AGE
    wait_for(lambda: ("Warning", "Stalled") in events(core, "default", lost), timeout=10,
             what="a Warning Event Stalled")


def test_argocd_health_before_the_operator_writes_a_status() -> None:
    """An object the operator has not seen yet is Progressing, never Healthy."""
    fresh = {"apiVersion": immortal.API_VERSION, "kind": immortal.KIND,
             "metadata": {"name": "x", "namespace": "n", "generation": 1}, "spec": {"image": "busybox"}}
    assert argo_health(fresh)["status"] == "Progressing"


# --- before the operator's first status write ------------------------------------------------------


@pytest.mark.usefixtures("crds")
def test_an_object_the_operator_has_not_observed_yet_is_in_progress(namespace: str, kstatus_checker: Path) -> None:
    """Until the operator writes a status (it is down, or has not got to the object yet), every read
    shows the CRDs' default ``status: {observedGeneration: 0}``: kstatus says InProgress, as it must,
    not the Current it says of an object with no status at all; Argo CD says Progressing. The API
    server's own dry-run create shows what a read would (no operator involved)."""
    new_objects = [
        ({"apiVersion": immortal.API_VERSION, "kind": immortal.KIND, "metadata": {"name": "unseen"},
          "spec": {"image": "busybox:1.36"}}, namespace),
        ({"apiVersion": rules.API_VERSION, "kind": rules.KIND, "metadata": {"name": "unseen"},
          "spec": {"ruleType": "configmap", "selector": {"copy": "unseen"}, "namespace": namespace}}, namespace),
        ({"apiVersion": f"{settings.GROUP}/{settings.VERSION}", "kind": settings.KIND,
          "metadata": {"name": f"unseen-{uuid.uuid4().hex[:6]}"}, "spec": {"eagerness": 1, "dryRun": True}}, None),
        ({"apiVersion": f"{settings.GROUP}/{settings.VERSION}", "kind": settings.TENANT_KIND,
          "metadata": {"name": "unseen"}, "spec": {"eagerness": 1, "dryRun": True}}, namespace),
    ]
    for obj, where in new_objects:
        scope = ["-n", where] if where else []
        read = json.loads(kubectl("create", "--dry-run=server", "-o", "json", *scope, "-f", "-",
                                  input=json.dumps(obj)).stdout)
        assert read["status"] == {"observedGeneration": 0}, read["kind"]
        judged(kstatus_checker, read, "InProgress")
        assert kstatus(kstatus_checker, {k: v for k, v in read.items() if k != "status"})["status"] == "Current"


# --- the real kubelet: readiness probes that really run -----------------------------------------------


@pytest.mark.usefixtures("real_node")
def test_immortal_container_ready_means_the_pods_readiness_probe_passes(
        operator: OperatorProcess, namespace: str, kstatus_checker: Path) -> None:
    image = script("image.sh", "base")
    script("node.sh", "load", image)

    def on_the_real_node(name: str, probe: list[str]) -> None:
        immortal_container(namespace, name, {"template": {"spec": {
            "nodeName": NODE,
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "readinessProbe": {"exec": {"command": probe}, "periodSeconds": 1}}]}}})

    on_the_real_node("serving", ["true"])
    on_the_real_node("not-serving", ["false"])
    judged(kstatus_checker, observed("ic", "serving", namespace, "PodReady", timeout=120), "Current")
    assert kubectl_wait_ready("ic", "serving", namespace, 30).returncode == 0
    # Running, but its readiness probe fails: not Ready, work under way (kstatus: InProgress).
    not_serving = judged(kstatus_checker, observed("ic", "not-serving", namespace, "PodNotReady", timeout=120),
                         "InProgress")
    pod = kubectl_json("get", "pod", immortal.pod_name("not-serving"), "-n", namespace)
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == NODE
    assert conditions(pod)["Ready"]["status"] == "False"
    assert conditions(not_serving)["Ready"]["status"] == "False"
    assert_times_out("ic", "not-serving", namespace)
    kubectl("delete", "ic", "serving", "not-serving", "-n", namespace, "--timeout=60s")
    with contextlib.suppress(subprocess.CalledProcessError):
        kubectl("wait", "--for=delete", "pod", "-l", immortal.OWNER_LABEL, "-n", namespace, "--timeout=60s")

