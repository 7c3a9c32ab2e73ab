"""Switching install methods (issue #18, item 3): `kubectl apply -k manifests/` and `make deploy`
(the Helm chart) take over each other's objects, as docs/deploy.md ("Switching install methods")
says, step by step.

The operator pod is not what this is about: `make deploy` is pointed at a copy of the local
kubeconfig, so cluster/deploy.sh treats the cluster as "anywhere else" and the pod lands on the KWOK
node (which only pretends to run it), like the kustomization's pod. Nothing acts on objects meanwhile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from tests.kube import wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, REPO, helm_binary

NAMESPACE = RELEASE = "kopf-operators"  # what manifests/ is rendered for, and `make deploy`'s defaults
# The chart's objects, as kubectl names them (kind/name; namespaced ones in NAMESPACE).
OBJECTS = ("serviceaccount/kopf-operators", "role.rbac.authorization.k8s.io/kopf-operators-ledger",
           "rolebinding.rbac.authorization.k8s.io/kopf-operators-ledger",
           "clusterrole.rbac.authorization.k8s.io/kopf-operators",
           "clusterrolebinding.rbac.authorization.k8s.io/kopf-operators", "deployment.apps/kopf-operators",
           "role.rbac.authorization.k8s.io/kopf-operators-lease",
           "rolebinding.rbac.authorization.k8s.io/kopf-operators-lease")


def namespace_gone(core: kubernetes.client.CoreV1Api) -> bool:
    return not [n for n in core.list_namespace().items if n.metadata.name == NAMESPACE]


@pytest.fixture
def elsewhere(tmp_path: Path, crds: None, core: kubernetes.client.CoreV1Api) -> Iterator[Path]:
    """A kubeconfig for the local cluster at another path (deploy.sh's "anywhere else"); afterwards
    the release, its objects and the namespace are removed."""
    # test_deploy's kustomization test may have just deleted the namespace: let it finish.
    wait_for(lambda: namespace_gone(core), timeout=120, what=f"namespace {NAMESPACE} from an earlier test gone")
    config = tmp_path / "kubeconfig"
    shutil.copy(KUBECONFIG, config)
    yield config
    helm("uninstall", RELEASE, "--namespace", NAMESPACE, check=False)
    for obj in OBJECTS:
        kubectl("delete", obj, "-n", NAMESPACE, "--ignore-not-found", check=False)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "KUBECONFIG": str(KUBECONFIG)})
    assert result.returncode == 0 or not check, result.stderr
    return result


def make_deploy(kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    # "Anywhere else" is a cluster make asks about first; a script confirms it with CONFIRM_CLUSTER=no.
    return subprocess.run(["make", "-s", "deploy"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KUBECONFIG": str(kubeconfig), "CLUSTER_DIR": str(CLUSTER_DIR),
                               "CONFIRM_CLUSTER": "no"})


def uids() -> dict[str, str]:
    """The chart's objects that exist now: kind/name -> uid."""
    found = {}
    for obj in OBJECTS:
        result = kubectl("get", obj, "-n", NAMESPACE, "-o", "jsonpath={.metadata.uid}", check=False)
        if result.returncode == 0:
            found[obj] = result.stdout
    return found


def releases() -> list[str]:
    return helm("list", "--namespace", NAMESPACE, "--short").stdout.split()


def test_kustomization_then_make_deploy_and_back(elsewhere: Path) -> None:
    # 1. Installed with kustomize.
    kubectl("apply", "-k", str(REPO / "manifests"), timeout=120)
    installed = uids()
    assert set(installed) == set(OBJECTS)

    # 2. `make deploy`: Helm adopts every object (same uids: nothing deleted or re-created).
    deployed = make_deploy(elsewhere)
    assert deployed.returncode == 0, deployed.stderr
    assert "cannot be imported" not in deployed.stderr
    assert releases() == [RELEASE]
    assert uids() == installed
    manifest = helm("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout
    for obj in OBJECTS:
        assert f"name: {obj.split('/')[1]}" in manifest

    # 3. Back to kustomize: apply it, then make Helm forget the release (its records are Secrets);
    # the objects stay, owned by nothing but the kustomization.
    kubectl("apply", "-k", str(REPO / "manifests"), timeout=120)
    kubectl("delete", "secret", "-n", NAMESPACE, "-l", f"owner=helm,name={RELEASE}")
    assert releases() == []
    assert uids() == installed

    # 4. ...and Helm can take it over again.
    again = make_deploy(elsewhere)
    assert again.returncode == 0, again.stderr
    assert releases() == [RELEASE] and uids() == installed
