"""Fixtures of the tests on the real node (test_real_node, test_ha, test_upgrade, test_uninstall; their
shared set-up is in realnode.py): the node itself, the image built from this tree (once per session), and
the session's host operator paused."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e.realnode import IMAGE_REPO, TAG, script
from tests.kube import OperatorProcess
from testsupport.paths import CLUSTER_DIR, REPO


@pytest.fixture(scope="session")
def real_node(cluster: str) -> str:
    if os.environ.get("REAL_NODE", "auto").lower() in {"0", "no", "false", "off"}:
        pytest.skip("REAL_NODE=0: this cluster has no real node")
    if os.geteuid() != 0:
        pytest.skip("the real node needs root")
    status = subprocess.run([str(REPO / "cluster" / "node.sh"), "status"], capture_output=True, text=True,
                            env={**os.environ, "CLUSTER_DIR": str(CLUSTER_DIR)})
    if status.returncode != 0:
        owner = script("node.sh", "owner")
        if owner and owner != str(CLUSTER_DIR) and os.environ.get("REAL_NODE", "auto").lower() != "1":
            pytest.skip(f"this machine's real node belongs to another cluster ({owner})")
        pytest.fail(f"the local cluster has no Ready real node:\n{status.stderr}")
    return "kopf-real-node"


@pytest.fixture(scope="session")
def operator_image(real_node: str) -> str:
    """The image built from this tree's Dockerfile (cluster/image.sh), loaded into the real node."""
    image = f"{IMAGE_REPO}:{TAG}"
    script("image.sh", "build", image)
    script("node.sh", "load", image)
    return image


@pytest.fixture(scope="module")
def host_operator_paused(operator_process: OperatorProcess) -> Iterator[None]:
    """The session's operator (standalone, all namespaces) stops while a module deploys its own:
    two operators on the same objects would both act."""
    operator_process.stop()
    yield
    operator_process.start()
