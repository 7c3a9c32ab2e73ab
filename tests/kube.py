"""Test helpers for talking to the real local control plane: kubectl, waiting, the operator process.

Nothing here mocks the API server: every call goes to the cluster started by ``cluster/cluster.sh``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import kubernetes

REPO = Path(__file__).resolve().parent.parent
CLUSTER_DIR = Path(os.environ.get("CLUSTER_DIR", REPO / ".cluster")).resolve()
KUBECONFIG = CLUSTER_DIR / "kubeconfig"
# The operator's own identity in tests: the chart's ServiceAccount, RBAC and all (see conftest).
OPERATOR_KUBECONFIG = CLUSTER_DIR / "operator-kubeconfig"
E2E_RELEASE = "kopf-operators-e2e"

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


class PodCreations:
    """Ground truth from a watch: the uid of every pod ever created in a namespace, by pod name.

    The watch resumes from its last resourceVersion when the stream breaks, so it has no gap; it runs
    in a thread until ``stop()``, unaffected by whatever happens to the operator."""

    def __init__(self, core: Any, namespace: str, label_selector: str = "", field_selector: str = "") -> None:
        self._uids: dict[str, list[str]] = {}
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
            except Exception:
                time.sleep(0.1)

    def uids(self, pod_name: str) -> list[str]:
        with self._lock:
            return list(self._uids.get(pod_name, []))

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


def kubectl(
    *args: str, input: str | None = None, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run kubectl against the local cluster; returns the completed process (text)."""
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(KUBECONFIG), *args],
        input=input, text=True, capture_output=True, check=check, timeout=timeout,
    )


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)


def apply_yaml(text: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    ns = ["-n", namespace] if namespace else []
    return kubectl("apply", *ns, "-f", "-", input=text, check=check)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def helm_binary() -> Path:
    out = subprocess.run([str(REPO / "cluster" / "build.sh")], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "helm"


def kube_version() -> str:
    """The pinned Kubernetes version (cluster/versions.env), for Helm's --kube-version."""
    for line in (REPO / "cluster" / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].lstrip("v")
    raise AssertionError("no KUBERNETES_VERSION in cluster/versions.env")


def chart_objects(release: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
    """The chart rendered by Helm (no CRDs), as objects."""
    import yaml

    flags = [arg for item in sets for arg in ("--set", item)]
    out = subprocess.run([str(helm_binary()), "template", release, str(REPO / "charts" / "kopf-operators"),
                          "--namespace", namespace, "--skip-crds", "--kube-version", kube_version(), *flags],
                         capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def service_account_kubeconfig() -> Path:
    """Install the chart's ServiceAccount and RBAC (release kopf-operators-e2e) and write a kubeconfig
    that authenticates with that ServiceAccount's token: the operator then has exactly the chart's
    permissions, as in a real deployment."""
    import yaml

    namespace = E2E_RELEASE
    kubectl("create", "namespace", namespace, check=False)
    rbac = [obj for obj in chart_objects(E2E_RELEASE, namespace)
            if obj["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}]
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(rbac))
    return token_kubeconfig(E2E_RELEASE, namespace, OPERATOR_KUBECONFIG)


def token_kubeconfig(service_account: str, namespace: str, path: Path) -> Path:
    """Write a kubeconfig for the local cluster that authenticates as the given ServiceAccount."""
    import yaml

    token = kubectl("create", "token", service_account, "-n", namespace, "--duration=48h").stdout.strip()
    admin = yaml.safe_load(KUBECONFIG.read_text())
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": service_account,
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": service_account, "context": {"cluster": "local", "user": service_account}}],
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# Kopf's API client logs each retried request at ERROR level ("Request attempt #1/9 failed; will
# retry"): a transient condition it handles (e.g. 429 while a CRD's storage re-initialises), not a fault.
TRANSIENT_API_RETRY = re.compile(r"Request attempt #\d+/\d+ failed; will retry")


def as_service_account() -> bool:
    """Whether test operators run as the chart's ServiceAccount (the default) rather than as admin."""
    return os.environ.get("OPERATOR_IDENTITY", "serviceaccount") != "admin" and OPERATOR_KUBECONFIG.exists()


def operator_namespace() -> str:
    """The OPERATOR_NAMESPACE test operators get: the ServiceAccount's namespace, as in a deployment."""
    return E2E_RELEASE if as_service_account() else ""


class OperatorProcess:
    """``kopf run`` of the operator files, as a user starts it, in a subprocess against the cluster."""

    def __init__(self, files: Sequence[str] | None = None, env: dict[str, str] | None = None,
                 kubeconfig: Path | None = None, log_name: str = "operator",
                 standalone: bool = True, extra_args: Sequence[str] = (), verbose: bool = True,
                 namespaces: Sequence[str] = ()) -> None:
        # Default: every operator file, or those named in OPERATOR_FILES (to test some operators alone).
        default = os.environ.get("OPERATOR_FILES", "").split() or sorted(
            str(p) for p in (REPO / "operators").glob("*.py"))
        self.files = list(files) if files else default
        self.extra_env = dict(env or {})
        # standalone=False plus e.g. extra_args=["--peering=NAME", "--priority=N"]: Kopf peering.
        self.standalone = standalone
        self.extra_args = list(extra_args)
        self.verbose = verbose  # False: the default log level, as the chart runs it
        self.namespaces = list(namespaces)  # Kopf namespace globs (a shard); empty: --all-namespaces
        # Same identity as the session's operator: the ServiceAccount when one was set up.
        self.kubeconfig = kubeconfig or (OPERATOR_KUBECONFIG if as_service_account() else KUBECONFIG)
        if as_service_account():  # as deployed: it knows its namespace (Blackadder keeps its ledger there)
            self.extra_env.setdefault("OPERATOR_NAMESPACE", operator_namespace())
        self.log_path = CLUSTER_DIR / "logs" / f"{log_name}-{os.getpid()}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.health_port = 0
        self.metrics_port = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60) -> None:
        if self.running:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.health_port = free_port()
        kopf = Path(sys.executable).parent / "kopf"
        mode = ["--standalone"] if self.standalone else []
        scope = [f"--namespace={pattern}" for pattern in self.namespaces] or ["--all-namespaces"]
        cmd = [str(kopf), "run", *mode, *scope, *(["--verbose"] if self.verbose else []), *self.extra_args,
               f"--liveness=http://127.0.0.1:{self.health_port}/healthz", *self.files]
        self.metrics_port = int(self.extra_env.get("METRICS_PORT") or free_port())
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "METRICS_PORT": str(self.metrics_port),
               **self.extra_env}
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n===== start #{self.starts}: {' '.join(cmd)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_for(self._healthy, timeout=timeout, what=f"the operator to be healthy (log: {self.log_path})")

    def _healthy(self) -> bool:
        if not self.running:
            raise AssertionError(f"operator exited with {self.proc and self.proc.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as when a node dies or the OOM killer strikes."""
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def metrics(self) -> str:
        """The operator's Prometheus text endpoint."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def records(self) -> list[str]:
        """Log records, each with its continuation lines (a traceback belongs to the line before it)."""
        records: list[str] = []
        for line in self.output().splitlines():
            if line.startswith("[") or not records:
                records.append(line)
            else:
                records[-1] += "\n" + line
        return records

    def errors(self, about: str | None = None) -> list[str]:
        """ERROR records and tracebacks in the log (tests assert there are none), optionally only those
        mentioning ``about`` (a namespace, say): in the full suite all four operators share one log."""
        return [rec for rec in self.records()
                if re.search(r"Traceback|\[ERROR", rec) and (about is None or about in rec)
                and not TRANSIENT_API_RETRY.search(rec)]


def audit_now() -> str:
    """A timestamp to count the operator's requests from (the audit log's own format)."""
    import datetime
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def operator_requests(namespace: str, since: str) -> list[tuple[str, str, str]]:
    """(verb, resource, name) of the operator's requests about ``namespace`` after ``since``, from the
    API server's audit log (Events excluded). The operator must run as the chart's ServiceAccount."""
    path = subprocess.run([str(REPO / "cluster" / "cluster.sh"), "audit-log"], capture_output=True, text=True,
                          check=True).stdout.strip()
    calls = []
    with open(path) as log:
        for line in log:
            entry = json.loads(line)
            ref = entry.get("objectRef") or {}
            if (entry.get("user", {}).get("username", "").startswith("system:serviceaccount:kopf-operators")
                    and ref.get("namespace") == namespace and entry.get("requestReceivedTimestamp", "") > since
                    and ref.get("resource") != "events"):
                calls.append((entry["verb"], ref.get("resource", "") + ("/" + ref["subresource"]
                                                                         if ref.get("subresource") else ""),
                              ref.get("name", "")))
    return calls
