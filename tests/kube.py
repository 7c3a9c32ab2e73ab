"""The tests' own helpers on top of testsupport/: waiting (wait_for, stays), a pod-creation watch,
namespaces, the chart's objects and ServiceAccount, the operator process with the tests' defaults.
Paths, kubectl, tokens, the launcher and the audit log come from testsupport/ directly.

Nothing here mocks the API server: every call goes to the cluster started by ``cluster/cluster.sh``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import kubernetes

from testsupport.kubectl import kubectl
from testsupport.launcher import KopfProcess, all_operator_files
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, LOGS, REPO, helm_binary, kube_version
from testsupport.tokens import token_kubeconfig

__all__ = [
    "E2E_RELEASE", "E2E_VALUES", "OPERATOR_KUBECONFIG", "Grant", "OperatorProcess", "PodCreations", "PodLife",
    "Timeout", "account_grants", "as_service_account", "chart_objects", "delete_namespaces", "namespace_exists",
    "operator_namespace", "own_operators", "service_account_kubeconfig", "stays", "wait_for",
]

# The operator's own identity in tests: the chart's ServiceAccount, RBAC and all (see conftest).
OPERATOR_KUBECONFIG = CLUSTER_DIR / "operator-kubeconfig"
E2E_RELEASE = "kopf-operators-e2e"
# The chart values the tests' operator identity is rendered with: the suite runs real chaos, so the
# chart must not force Blackadder's dry-run (which withholds its destructive verbs).
E2E_VALUES = ("operators.blackadder.dryRun=false",)
# The chart's Lease for that release (its Role grants get/update on this name only), in its namespace.
E2E_LEASE = E2E_RELEASE

T = TypeVar("T")


class Timeout(AssertionError):
    pass


def wait_for(
    probe: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns something truthy; return that. API 404s count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            last = exc
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout}s waiting for {what}; last seen: {last!r}")
        time.sleep(interval)


def stays(probe: Callable[[], Any], seconds: float, interval: float = 0.2, what: str = "condition") -> None:
    """Assert that ``probe`` stays truthy for ``seconds`` (for "nothing happens" checks)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert probe(), f"{what} stopped holding"
        time.sleep(interval)


@dataclasses.dataclass
class PodLife:
    uid: str
    seen_at: float
    gone_at: float | None = None
    ended_at: float | None = None  # first seen in a terminal phase (Failed, Succeeded)
    ended_phase: str | None = None
    ended_deleting: bool = False  # that terminal phase came with a deletionTimestamp (a kubelet's way out)


class PodCreations:
    """Ground truth from a watch: the uid of every pod ever created in a namespace, by pod name.

    The watch resumes from its last resourceVersion when the stream breaks, so it has no gap; it runs
    in a thread until ``stop()``, unaffected by whatever happens to the operator."""

    def __init__(self, core: Any, namespace: str, label_selector: str = "", field_selector: str = "") -> None:
        self._uids: dict[str, list[str]] = {}
        self._lives: dict[str, PodLife] = {}  # by uid
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watch = kubernetes.watch.Watch()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        args=(core, namespace, label_selector, field_selector))
        self._thread.start()
        self._connected.wait(timeout=10)

    def _run(self, core: Any, namespace: str, label_selector: str, field_selector: str) -> None:
        version = core.list_namespaced_pod(namespace, label_selector=label_selector,
                                           field_selector=field_selector).metadata.resource_version
        self._connected.set()
        while not self._stopped.is_set():
            try:
                for event in self._watch.stream(core.list_namespaced_pod, namespace, resource_version=version,
                                                label_selector=label_selector, field_selector=field_selector,
                                                timeout_seconds=300):
                    meta = event["object"].metadata
                    version = meta.resource_version
                    with self._lock:
                        uids = self._uids.setdefault(meta.name, [])
                        if meta.uid not in uids:
                            uids.append(meta.uid)
                            self._lives[meta.uid] = PodLife(meta.uid, time.monotonic())
                        life = self._lives[meta.uid]
                        if event["type"] == "DELETED" and life.gone_at is None:
                            life.gone_at = time.monotonic()
                        phase = event["object"].status.phase if event["object"].status else None
                        if phase in ("Failed", "Succeeded") and life.ended_at is None:
                            life.ended_at, life.ended_phase = time.monotonic(), phase
                            life.ended_deleting = meta.deletion_timestamp is not None
            except Exception:
                time.sleep(0.1)

    def uids(self, pod_name: str) -> list[str]:
        with self._lock:
            return list(self._uids.get(pod_name, []))

    def lives(self, pod_name: str) -> list[PodLife]:
        """When each pod of that name was first seen, seen ended and seen deleted (this process's
        monotonic clock)."""
        with self._lock:
            return [dataclasses.replace(self._lives[uid]) for uid in self._uids.get(pod_name, [])]

    def life(self, pod_name: str, uid: str, timeout: float = 10) -> PodLife:
        """The life of that pod, once the watch has seen it: a direct read can return a pod before this
        watch has delivered its ADDED (and, being ordered, everything before it under the name)."""
        def seen() -> PodLife | None:
            return next((life for life in self.lives(pod_name) if life.uid == uid), None)
        life = wait_for(seen, timeout=timeout, interval=0.05, what=f"the watch to see pod {pod_name} {uid}")
        assert life is not None  # wait_for returns only what is truthy
        return life

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()


def delete_namespaces(core: Any, names: Sequence[str]) -> None:
    """Delete namespaces without waiting (KWOK lets the deletion complete); already gone is fine."""
    for name in names:
        try:
            core.delete_namespace(name)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise


def chart_objects(release: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
    """The chart rendered by Helm (no CRDs), as objects."""
    import yaml

    flags = [arg for item in sets for arg in ("--set", item)]
    out = subprocess.run([str(helm_binary()), "template", release, str(REPO / "charts" / "kopf-operators"),
                          "--namespace", namespace, "--skip-crds", "--kube-version", kube_version(), *flags],
                         capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


# (namespace, apiGroup, resource[/subresource], verb); namespace "*" for a ClusterRoleBinding's grant.
Grant = tuple[str, str, str, str]


def account_grants(objects: Sequence[dict[str, Any]]) -> dict[str, set[Grant]]:
    """What each ServiceAccount ("namespace/name") of rendered chart objects may do, through the
    bindings among them: a ClusterRoleBinding grants everywhere ("*"), a RoleBinding in its namespace."""
    roles = {(obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]): obj.get("rules") or []
             for obj in objects if obj["kind"] in {"ClusterRole", "Role"}}
    grants: dict[str, set[Grant]] = {}
    for obj in objects:
        if obj["kind"] not in {"ClusterRoleBinding", "RoleBinding"}:
            continue
        where = obj["metadata"].get("namespace", "") if obj["kind"] == "RoleBinding" else "*"
        ref = obj["roleRef"]
        rules = roles[(ref["kind"], where if ref["kind"] == "Role" else "", ref["name"])]
        for subject in obj["subjects"]:
            mine = grants.setdefault(f"{subject['namespace']}/{subject['name']}", set())
            mine.update((where, group, resource, verb) for rule in rules for group in rule["apiGroups"]
                        for resource in rule["resources"] for verb in rule["verbs"])
    return grants


def service_account_kubeconfig() -> Path:
    """Install the chart's ServiceAccount and RBAC (release kopf-operators-e2e) and write a kubeconfig
    that authenticates with that ServiceAccount's token: the operator then has exactly the chart's
    permissions, as in a real deployment."""
    import yaml

    namespace = E2E_RELEASE
    kubectl("create", "namespace", namespace, check=False)
    rbac = [obj for obj in chart_objects(E2E_RELEASE, namespace, *E2E_VALUES)
            if obj["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}]
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(rbac))
    return token_kubeconfig(E2E_RELEASE, namespace, OPERATOR_KUBECONFIG)


def as_service_account() -> bool:
    """Whether test operators run as the chart's ServiceAccount (the default) rather than as admin."""
    return os.environ.get("OPERATOR_IDENTITY", "serviceaccount") != "admin" and OPERATOR_KUBECONFIG.exists()


def operator_namespace() -> str:
    """The OPERATOR_NAMESPACE test operators get: the ServiceAccount's namespace, as in a deployment."""
    return E2E_RELEASE if as_service_account() else ""


class OperatorProcess(KopfProcess):
    """``kopf run`` of the operator files, as a user starts it, in a subprocess against the cluster, with
    the tests' defaults: every operator file (or $OPERATOR_FILES), the session's identity, verbose logs,
    a log file per test process under .cluster/logs."""

    def __init__(self, files: Sequence[str] | None = None, env: dict[str, str] | None = None,
                 kubeconfig: Path | None = None, log_name: str = "operator",
                 standalone: bool = True, extra_args: Sequence[str] = (), verbose: bool = True,
                 namespaces: Sequence[str] = ()) -> None:
        # Default: every operator file, or those named in OPERATOR_FILES (to test some operators alone).
        default = os.environ.get("OPERATOR_FILES", "").split() or all_operator_files()
        extra_env = dict(env or {})
        if as_service_account():  # as deployed: it knows its namespace (Blackadder keeps its ledger there)
            extra_env.setdefault("OPERATOR_NAMESPACE", operator_namespace())
        super().__init__(
            list(files) if files else default,
            # Same identity as the session's operator: the ServiceAccount when one was set up.
            kubeconfig or (OPERATOR_KUBECONFIG if as_service_account() else KUBECONFIG),
            LOGS / f"{log_name}-{os.getpid()}.log", extra_env,
            standalone=standalone, verbose=verbose, namespaces=namespaces, extra_args=extra_args)


def namespace_exists(core: kubernetes.client.CoreV1Api, name: str) -> bool:
    """Whether the namespace is there (terminating counts: it is there until it is gone)."""
    try:
        core.read_namespace(name)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def own_operators(shared: OperatorProcess, log_name: str, files: Sequence[str] | None = None
                  ) -> Iterator[Callable[..., OperatorProcess]]:
    """The body of a fixture that runs the operator (``files``, default: the shared one's) with an
    environment of the test's choosing: ``start(**env)`` stops the session's operator and any earlier one
    of these (one of each operator acts at a time) and starts a new one; at the end each is stopped and
    the session's operator runs again."""
    started: list[OperatorProcess] = []

    def start(**env: str) -> OperatorProcess:
        shared.stop()
        for earlier in started:
            earlier.stop()
        proc = OperatorProcess(files=list(files or shared.files), env=env, kubeconfig=shared.kubeconfig,
                               log_name=log_name)
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
    shared.start()


# --- replicas on a Lease (core/election.py) ---------------------------------------------------------

# What a replica logs when it takes the Lease and starts acting.
ACTING = "Acting: this replica"


def lease_env(name: str = E2E_LEASE) -> dict[str, str]:
    """The environment of a replica that elects on the Lease ``name`` in the e2e release's namespace,
    as the chart sets it (LEADER_ELECTION, LEASE_NAME, the pod's namespace)."""
    return {"LEADER_ELECTION": "true", "LEASE_NAME": name, "LEASE_NAMESPACE": E2E_RELEASE}


def delete_lease(name: str = E2E_LEASE, namespace: str = E2E_RELEASE) -> None:
    kubectl("create", "namespace", namespace, check=False)
    kubectl("delete", "lease", "-n", namespace, name, "--ignore-not-found")


def lease_holder(name: str = E2E_LEASE, namespace: str = E2E_RELEASE) -> str:
    """The Lease's holderIdentity ("" when absent or released)."""
    return kubectl("get", "lease", "-n", namespace, name, "-o", "jsonpath={.spec.holderIdentity}",
                   check=False).stdout.strip()
