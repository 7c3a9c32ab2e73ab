"""Fixtures: the real local cluster (started once, reused), CRDs, a namespace per test, the operator.

Unit tests (tests/unit) use none of these and need no cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator

import kubernetes
import pytest

from tests.kube import OperatorProcess, delete_namespaces, service_account_kubeconfig, wait_for
from tests.scheduling import FIRST_WORKER, start_run_clusters, stop_run_clusters, worker_id
from testsupport.kubectl import kubectl, wait_crds_served
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, REPO

_STARTED = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)


def pytest_configure(config: pytest.Config) -> None:
    # Scripts and tools the tests start act on this worker's cluster (tests/scheduling.py).
    os.environ["CLUSTER_DIR"] = str(CLUSTER_DIR)
    if worker_id() not in ("", FIRST_WORKER):
        os.environ["REAL_NODE"] = "0"  # the machine's one real node belongs to gw0's cluster
    if not worker_id():  # the controller (or a run without xdist): every cluster of this run, for its workers
        config.stash[_STARTED] = start_run_clusters(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    stop_run_clusters(config.stash.get(_STARTED, []))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`pytest -n N`: whole modules, one cluster per worker, the real node's modules on gw0 and the RBAC
    audit last (tests/scheduling.py)."""
    from tests.scheduling import ClusterScheduling

    return ClusterScheduling(config, log)


@pytest.fixture(scope="session")
def cluster() -> str:
    """Start the local control plane (a no-op when it is already up) and point clients at it."""
    subprocess.run([str(REPO / "cluster" / "cluster.sh"), "up"], check=True, timeout=3600)
    os.environ["KUBECONFIG"] = str(KUBECONFIG)
    kubernetes.config.load_kube_config(config_file=str(KUBECONFIG))
    return str(KUBECONFIG)


@pytest.fixture(scope="session")
def crds(cluster: str) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crds"))
    wait_crds_served(REPO / "manifests" / "crds")


@pytest.fixture(scope="session")
def api(cluster: str) -> kubernetes.client.ApiClient:
    return kubernetes.client.ApiClient()


@pytest.fixture(scope="session")
def core(api: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api)


@pytest.fixture(scope="session")
def apps(api: kubernetes.client.ApiClient) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(api)


@pytest.fixture(scope="session")
def custom(api: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api)


@pytest.fixture(scope="session")
def operator_identity(crds: None) -> str:
    """The kubeconfig the operator runs with: by default the chart's own ServiceAccount, so every
    end-to-end test also proves the chart's RBAC sufficient (OPERATOR_IDENTITY=admin skips that)."""
    if os.environ.get("OPERATOR_IDENTITY", "serviceaccount") == "admin":
        return str(KUBECONFIG)
    return str(service_account_kubeconfig())


@pytest.fixture(scope="session")
def operator_process(operator_identity: str) -> Iterator[OperatorProcess]:
    """One ``kopf run operators/*.py`` for the session; tests may stop, kill and restart it."""
    proc = OperatorProcess(files=os.environ.get("OPERATOR_FILES", "").split() or None)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def operator(operator_process: OperatorProcess) -> Iterator[OperatorProcess]:
    """The running operator; restarted if a previous test left it stopped."""
    operator_process.start()
    yield operator_process
    operator_process.start()


@pytest.fixture
def make_namespace(core: kubernetes.client.CoreV1Api) -> Iterator[Callable[..., str]]:
    """Extra namespaces for one test (the ``namespace`` fixture gives one): ``make(prefix, **labels)``,
    ``accept_from``: the namespaces whose Copyrator pushes it accepts; deleted afterwards."""
    made: list[str] = []

    def make(prefix: str = "extra", accept_from: str | None = None, **labels: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        annotations = {} if accept_from is None else {"copyrator.kopf-operators.dev/accept-from": accept_from}
        core.create_namespace({"metadata": {"name": name, "annotations": annotations,
                                            "labels": {"kopf-operators.dev/test": "true", **labels}}})
        made.append(name)
        return name

    yield make
    delete_namespaces(core, made)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (KWOK lets the deletion complete)."""
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"kopf-operators.dev/test": "true"}}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), timeout=30,
             what=f"the default ServiceAccount in {name}")
    yield name
    delete_namespaces(core, [name])
