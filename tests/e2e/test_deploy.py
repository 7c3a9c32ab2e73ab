"""The deployment surface, proven on the real API server: Helm chart, kustomization, Pod Security."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
import yaml

from tests.kube import wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import REPO, helm_binary, kube_version
from testsupport.tokens import token_kubeconfig

CHART = REPO / "charts" / "kopf-operators"
OPERATORS = ("immortal", "copyrator", "blackadder", "reroller")


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


def helm_run(helm: Path, *args: str) -> str:
    result = subprocess.run([str(helm), *args, "--kube-version", kube_version()],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(helm: Path, *sets: str) -> str:
    flags = [arg for s in sets for arg in ("--set", s)]
    return helm_run(helm, "template", "kopf-operators", str(CHART), "--namespace", "kopf-operators",
                    "--skip-crds", *flags)


VARIANTS = [pytest.param((), id="defaults")] + [
    pytest.param((f"operators.{name}.enabled=false",), id=f"without-{name}") for name in OPERATORS
] + [pytest.param(("watchNamespaces={a,b}", "leaderElection.enabled=false", "replicaCount=1", "rbac.create=false",
                   "metrics.enabled=false", "logLevel=debug"), id="namespaced-minimal")]


@pytest.mark.parametrize("sets", VARIANTS)
def test_chart_lints_and_the_api_server_accepts_it(helm: Path, crds: None, sets: tuple[str, ...]) -> None:
    flags = [arg for s in sets for arg in ("--set", s)]
    lint = helm_run(helm, "lint", "--strict", str(CHART), *flags)
    assert "0 chart(s) failed" in lint
    rendered = render(helm, *sets)
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    for name in OPERATORS:
        expected = f"operators.{name}.enabled=false" not in sets
        assert (f"/app/operators/{name}.py" in args) is expected, args
    if "rbac.create=false" not in sets:
        role = next(d for d in docs if d["kind"] == "ClusterRole")
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule.get(field, []), rule
    # Server-side dry run: the API server validates every object (schema, admission) and stores nothing.
    result = kubectl("apply", "--dry-run=server", "-n", "default", "-f", "-",
                     input=rendered.replace("namespace: kopf-operators", "namespace: default"), check=False)
    assert result.returncode == 0, result.stderr


def test_generated_manifests_match_the_chart(helm: Path) -> None:
    generated = (REPO / "manifests" / "operator.yaml").read_text()
    fresh = render(helm)
    body = "\n".join(line for line in generated.splitlines() if not line.startswith("# GENERATED")
                     and not line.startswith("# change the chart"))
    assert body.strip() == fresh.strip(), "manifests/operator.yaml is stale: run `make manifests`"


def test_chart_crds_are_the_manifests_crds() -> None:
    assert (CHART / "crds").resolve() == (REPO / "manifests" / "crds").resolve()
    kustomization = yaml.safe_load((REPO / "manifests" / "kustomization.yaml").read_text())
    listed = {r for r in kustomization["resources"] if r.startswith("crds/")}
    on_disk = {f"crds/{p.name}" for p in (REPO / "manifests" / "crds").glob("*.yaml")}
    assert listed == on_disk


@pytest.fixture
def kustomized(crds: None, core: kubernetes.client.CoreV1Api) -> Iterator[None]:
    yield
    kubectl("delete", "namespace", "kopf-operators", "--ignore-not-found", "--wait=false")
    for kind in ("clusterrolebinding", "clusterrole"):
        kubectl("delete", kind, "-l", "app.kubernetes.io/instance=kopf-operators", "--ignore-not-found")


def test_kustomization_installs_and_the_pod_is_admitted_under_restricted_pod_security(
        kustomized: None, core: kubernetes.client.CoreV1Api) -> None:
    result = kubectl("apply", "--server-side", "--force-conflicts", "-k", str(REPO / "manifests"), check=False)
    assert result.returncode == 0, result.stderr
    ns = core.read_namespace("kopf-operators")
    assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # The ReplicaSet's pod passes the restricted admission check (a refusal would leave no pod and
    # a FailedCreate event on the ReplicaSet).
    pods = wait_for(lambda: core.list_namespaced_pod(
        "kopf-operators", label_selector="app.kubernetes.io/name=kopf-operators").items,
        timeout=60, what="the operator pod to be admitted")
    spec = pods[0].spec
    container = spec.containers[0]
    assert spec.security_context.run_as_non_root is True
    assert spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert container.security_context.read_only_root_filesystem is True
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert container.liveness_probe.http_get.path == "/healthz"


def test_dockerfile_is_clean_and_its_command_starts_the_operators_outside_a_container(
        tmp_path: Path, crds: None) -> None:
    """No Docker engine here: lint the Dockerfile, then run its exact CMD from the repository root
    (the image's WORKDIR has the same operators/ folder) as a read-only identity, so this second
    operator can start, watch and report healthy but cannot touch what the session's operator owns."""
    lint = subprocess.run([str(REPO / ".venv" / "bin" / "hadolint"), str(REPO / "Dockerfile")],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    cmd_line = next(line for line in (REPO / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    cmd = json.loads(cmd_line[4:])
    assert cmd[:2] == ["sh", "-c"] and "operators/*.py" in cmd[2]
    kubeconfig = read_only_kubeconfig(tmp_path)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig),
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    log = (tmp_path / "cmd.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def healthy() -> bool:
            assert proc.poll() is None, (tmp_path / "cmd.log").read_text()
            try:
                with urllib.request.urlopen("http://127.0.0.1:8080/healthz", timeout=1) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False
        wait_for(healthy, timeout=60, what="the Dockerfile's command to serve /healthz")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    output = (tmp_path / "cmd.log").read_text()
    assert "Traceback" not in output, output


def read_only_kubeconfig(tmp_path: Path) -> Path:
    name = "dockerfile-cmd-probe"
    manifest = f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {name}, namespace: default}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {name}}}
rules:
  - apiGroups: ["*"]
    resources: ["*"]
    verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: default}}]
"""
    kubectl("apply", "-f", "-", input=manifest)
    return token_kubeconfig(name, "default", tmp_path / "kubeconfig")
