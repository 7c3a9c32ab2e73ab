"""Where things are: the checkout, the local cluster's directory and its admin kubeconfig, the pinned versions."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cluster_dir() -> Path:
    """$CLUSTER_DIR (default <repo>/.cluster); under pytest-xdist, workers other than gw0 get a cluster of
    their own beside it (``<dir>-gw1``, ...): tests/scheduling.py says why."""
    base = Path(os.environ.get("CLUSTER_DIR", REPO / ".cluster")).resolve()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return base if worker in ("", "gw0") else base.with_name(f"{base.name}-{worker}")


CLUSTER_DIR = _cluster_dir()
KUBECONFIG = CLUSTER_DIR / "kubeconfig"
LOGS = CLUSTER_DIR / "logs"


def cluster_script(*args: str) -> str:
    """Run cluster/cluster.sh for this CLUSTER_DIR; its stdout."""
    out = subprocess.run([str(REPO / "cluster" / "cluster.sh"), *args], capture_output=True, text=True,
                         check=True, env={**os.environ, "CLUSTER_DIR": str(CLUSTER_DIR)})
    return out.stdout


def helm_binary() -> Path:
    """The pinned helm, built into the shared cache on first use (cluster/build.sh)."""
    out = subprocess.run([str(REPO / "cluster" / "build.sh")], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "helm"


def kube_version() -> str:
    """The Kubernetes version of the cluster under test, for Helm's --kube-version: KUBERNETES_VERSION
    when set (`make compat` runs another minor), else the one cluster/versions.env pins."""
    if os.environ.get("KUBERNETES_VERSION"):
        return os.environ["KUBERNETES_VERSION"].lstrip("v")
    for line in (REPO / "cluster" / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].lstrip("v")
    raise AssertionError("no KUBERNETES_VERSION in cluster/versions.env")
