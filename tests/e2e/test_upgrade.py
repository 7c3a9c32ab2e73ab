"""Upgrade with live objects, for real: the chart and image as they were at the commit issue #18 starts
from (0d890bd: one replica, no priorities), installed on the real node with its CRDs; objects of all
four operators; then the CRDs and `helm upgrade` of this tree (two replicas, this image), as a user
upgrades. Nothing is lost, nothing is done twice (start counts, pods, copies, rollouts unchanged), and
the upgraded operators act."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from kopf_operators.immortal import decisions as ic
from tests.e2e.realnode import (
    CHART,
    IMAGE_REPO,
    TAG,
    acting,
    agent_cycle,
    all_ready,
    apply_crds,
    chart_values,
    dry_run_agent_yaml,
    helm,
    ic_status,
    image_exists,
    immortal_yaml,
    install_release,
    observed_hash,
    one_of_each_yaml,
    script,
    template_hash,
    uninstall_release,
    watched_namespaces,
)
from tests.kube import stays, wait_for
from testsupport.kubectl import apply_yaml
from testsupport.paths import REPO

BASE_COMMIT = "0d890bd"
BASE_TAG = f"base-{BASE_COMMIT}"
RELEASE = NAMESPACE = "kopf-upgrade"
TEST_LABEL = "kopf-operators.dev/upgrade-test"


@pytest.fixture(scope="module")
def base_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository as it was at BASE_COMMIT (its chart, CRDs, Dockerfile and image script)."""
    root = tmp_path_factory.mktemp(f"base-{BASE_COMMIT}")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BASE_COMMIT], capture_output=True)
    assert archive.returncode == 0, f"git archive {BASE_COMMIT} (a full clone is needed): {archive.stderr!r}"
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


@pytest.fixture(scope="module")
def base_image(real_node: str, base_tree: Path) -> str:
    """The image of BASE_COMMIT, built by that commit's own script; built once per machine (by tag)."""
    image = f"{IMAGE_REPO}:{BASE_TAG}"
    if not image_exists(image):
        script("image.sh", "build", image, root=base_tree)
    script("node.sh", "load", image)
    return image


@pytest.fixture(scope="module")
def spaces(core: kubernetes.client.CoreV1Api, crds: None) -> Iterator[tuple[str, str, str]]:
    run = uuid.uuid4().hex[:5]
    with watched_namespaces(core, (f"up-a-{run}", f"up-b-{run}"), {TEST_LABEL: run}) as names:
        yield names[0], names[1], run


@pytest.fixture(scope="module")
def base_release(base_image: str, operator_image: str, base_tree: Path, host_operator_paused: None,
                 spaces: tuple[str, str, str], core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    ns_a, ns_b, run = spaces
    # The CRDs of that commit, as its users had them (Helm installs crds/ only when absent).
    apply_crds(base_tree / "manifests" / "crds")
    install_release(core, RELEASE, NAMESPACE, (ns_a, ns_b), replicas=1, tag=BASE_TAG,
                    chart=base_tree / "charts" / "kopf-operators")
    yield RELEASE
    uninstall_release(RELEASE, NAMESPACE, (ns_a, ns_b), agents=f"{TEST_LABEL}={run}")
    # The session's CRDs again (this tree's), whatever happened above.
    apply_crds()


def ic_pods(core: kubernetes.client.CoreV1Api, ns: str, name: str) -> list[str]:
    return [p.metadata.uid for p in core.list_namespaced_pod(ns, label_selector=f"{ic.OWNER_LABEL}={name}").items]


def test_helm_upgrade_from_the_base_commit_keeps_every_object_and_acts(
        base_release: str, spaces: tuple[str, str, str], core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api, custom: kubernetes.client.CustomObjectsApi) -> None:
    ns_a, ns_b, run = spaces
    agent = f"upgrade-dry-{run}"
    # --- objects of all four operators, handled by the base release -----------------------------------
    apply_yaml(one_of_each_yaml(ns_a, TEST_LABEL, run, immortal="keeper"), namespace=ns_a)
    apply_yaml(dry_run_agent_yaml(agent, TEST_LABEL, run, ns_a))

    def current_hash() -> str | None:
        return template_hash(apps, ns_a)

    wait_for(lambda: ic_status(custom, ns_a, "keeper").get("startTimes") == 1, timeout=60, what="the start")
    wait_for(lambda: core.read_namespaced_config_map("shared", ns_b).data == {"greeting": "hello"},
             timeout=60, what="the copy in namespace B")
    wait_for(lambda: observed_hash(apps, ns_a), timeout=60, what="the re-roller's baseline")
    core.patch_namespaced_config_map("app-conf", ns_a, {"data": {"level": "2"}})
    wait_for(current_hash, timeout=60, what="a rollout by the base release")
    wait_for(lambda: agent_cycle(custom, agent) >= 1, timeout=60, what="a dry-run cycle of the agent")

    def state() -> dict[str, Any]:
        copy = core.read_namespaced_config_map("shared", ns_b).metadata
        deployment = apps.read_namespaced_deployment("app", ns_a)
        return {
            "starts": ic_status(custom, ns_a, "keeper").get("startTimes"),
            "pods": ic_pods(core, ns_a, "keeper"),
            "copy": (copy.uid, copy.resource_version),
            "copies": sorted(cm.metadata.namespace for cm in core.list_config_map_for_all_namespaces(
                label_selector="copy-me=yes").items if cm.metadata.namespace in (ns_a, ns_b)),
            "rollout": (current_hash(), deployment.metadata.generation),
            "replicasets": len(apps.list_namespaced_replica_set(ns_a, label_selector="app=app").items),
            "rules": [r["metadata"]["name"] for r in custom.list_namespaced_custom_object(
                "flant.com", "v1", ns_a, "copyrators")["items"]],
        }

    before = state()
    assert len(before["pods"]) == 1 and before["copies"] == [ns_a, ns_b], before
    stays(lambda: state() == before, seconds=5, interval=0.5, what="the base release at rest")

    # --- the upgrade, as a user does it: this tree's CRDs, then the chart with the same values ---------
    apply_crds()
    old_pod = all_ready(core, NAMESPACE, RELEASE, 1)[0].metadata.uid  # type: ignore[index]
    helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, *chart_values(TAG, (ns_a, ns_b)))
    def upgraded() -> list[Any]:
        now = all_ready(core, NAMESPACE, RELEASE, 2) or []
        return now if old_pod not in {p.metadata.uid for p in now} else []

    pods = wait_for(upgraded, timeout=180, what="the upgraded release's two pods")
    assert {p.spec.containers[0].image for p in pods} == {f"{IMAGE_REPO}:{TAG}"}
    wait_for(lambda: [acting(NAMESPACE, p.metadata.name) for p in pods].count(True) == 1, timeout=60,
             what="one upgraded replica to act")
    # Nothing lost, nothing redone: longer than a dry-run agent cycle and the resume passes.
    cycle = agent_cycle(custom, agent)
    stays(lambda: state() == before, seconds=20, interval=0.5, what="every object as it was")
    # The upgraded operators act: the agent cycles, a new object gets its pod, changes are followed.
    wait_for(lambda: agent_cycle(custom, agent) > cycle, timeout=60, what="the agent's next cycle")
    apply_yaml(immortal_yaml("newcomer"), namespace=ns_a)
    wait_for(lambda: ic_status(custom, ns_a, "newcomer").get("startTimes") == 1, timeout=60, what="a new start")
    core.patch_namespaced_config_map("shared", ns_a, {"data": {"greeting": "again"}})
    wait_for(lambda: core.read_namespaced_config_map("shared", ns_b).data == {"greeting": "again"},
             timeout=60, what="the copy updated")
    core.patch_namespaced_config_map("app-conf", ns_a, {"data": {"level": "3"}})
    wait_for(lambda: current_hash() != before["rollout"][0], timeout=60, what="a rollout after the upgrade")
    assert ic_status(custom, ns_a, "keeper").get("startTimes") == 1
    assert ic_pods(core, ns_a, "keeper") == before["pods"]
