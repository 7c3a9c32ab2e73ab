"""Kubeconfigs that authenticate as a ServiceAccount, so that RBAC and the audit log see that identity."""

from __future__ import annotations

from pathlib import Path

import yaml

from testsupport.kubectl import kubectl
from testsupport.paths import KUBECONFIG


def token_kubeconfig(service_account: str, namespace: str, path: Path) -> Path:
    """Write a kubeconfig for the local cluster that authenticates as the given ServiceAccount (a 48 h token)."""
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
