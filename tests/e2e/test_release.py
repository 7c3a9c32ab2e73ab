"""A release as a platform team gets it (`make release-e2e`; not in `make test`: README, "Releases").

release/release.sh builds the images for linux/amd64 and linux/arm64 (the arm64 one under qemu-user-static),
attests an SBOM to each, signs them and the chart with cosign, and pushes everything to a registry on
127.0.0.1 (CNCF Distribution, built from its Go module). Then, as a user would: the signatures verify with
the release's public key (and not with another key); the chart installs with
`helm install oci://127.0.0.1:PORT/charts/kopf-operators --version X`, its image pulled from that registry
by the real node's containerd; the operators in the pod act. The tree is not written (RELEASE_WRITE_TREE=0)
and the signing key is the test's own.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.e2e.realnode import (
    NODE,
    all_ready,
    copy_rule_yaml,
    helm,
    ic_status,
    immortal_yaml,
    restricted_namespace,
    uninstall_release,
    watched_namespaces,
)
from tests.kube import wait_for
from testsupport.kubectl import apply_yaml, kubectl
from testsupport.paths import CLUSTER_DIR, REPO

# The first test also runs the release (both image builds: long on a cold machine, see README).
pytestmark = [pytest.mark.e2e, pytest.mark.release, pytest.mark.timeout(5400)]

REGISTRY = os.environ.get("REGISTRY", "127.0.0.1:5000")  # the node's containerd pulls from it (node.sh)
RELEASE = "kopf-released"
NAMESPACE = "kopf-released"
TEST_LABEL = "kopf-operators.dev/release-test"
# What release.sh builds (its PLATFORMS): both by default; PLATFORMS=amd64 skips the emulated build.
PLATFORMS = set(os.environ.get("PLATFORMS", "amd64 arm64").split())


def run(*command: str, check: bool = True, timeout: float = 300, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if check:
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


# cosign would look up Sigstore's trust root on the internet first (release/release.sh says why not).
OFFLINE = {"TUF_MIRROR": "http://127.0.0.1:9"}


def cosign() -> str:
    return str(Path(run(str(REPO / "cluster" / "release-tools.sh"), timeout=3600).stdout.strip()) / "cosign")


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, real_node: str) -> Iterator[dict[str, str]]:
    """`make release` of this tree to the local registry: image=REF@DIGEST, chart=oci://..., public_key=..."""
    work = tmp_path_factory.mktemp("release")
    env = {"REGISTRY": REGISTRY, "RELEASE_DIR": str(work / "out"), "COSIGN_KEY_DIR": str(work / "key"),
           "COSIGN_PASSWORD": "", "RELEASE_WRITE_TREE": "0",
           # The pipeline is what this test checks; `make compat` is run per commit before a real release.
           "RELEASE_REQUIRE_COMPAT": "0"}
    result = run(str(REPO / "release" / "release.sh"), env=env, timeout=5400)
    print(result.stderr[-6000:])
    found = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert {"image", "chart", "chart_digest", "version", "public_key"} <= set(found), result.stdout
    yield found
    run(str(REPO / "release" / "registry.sh"), "down", env=env)


def registry_get(path: str, accept: str) -> Any:
    request = urllib.request.Request(f"http://{REGISTRY}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def test_one_manifest_list_for_the_platforms_with_licence_and_version(released: dict[str, str]) -> None:
    digest = released["image"].split("@", 1)[1]
    index = registry_get(f"kopf-operators/manifests/{digest}", "application/vnd.oci.image.index.v1+json")
    platforms = {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]
                 if m["platform"]["architecture"] != "unknown"}
    assert set(platforms) == PLATFORMS
    for arch, manifest_digest in platforms.items():
        manifest = registry_get(f"kopf-operators/manifests/{manifest_digest}",
                                "application/vnd.oci.image.manifest.v1+json")
        config = registry_get(f"kopf-operators/blobs/{manifest['config']['digest']}", "*/*")
        assert config["architecture"] == arch
        labels = config["config"]["Labels"]
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        assert labels["org.opencontainers.image.version"] == released["version"]


def test_image_chart_and_sboms_verify_with_the_release_key_and_not_another(
        released: dict[str, str], tmp_path: Path) -> None:
    key = released["public_key"]
    common = ["--insecure-ignore-tlog=true", "--allow-http-registry"]
    run(cosign(), "verify", "--key", key, *common, released["image"], env=OFFLINE)
    chart_ref = f"{released['chart'].removeprefix('oci://')}@{released['chart_digest']}"
    run(cosign(), "verify", "--key", key, *common, chart_ref, env=OFFLINE)
    # The attestations are on the platform images (each SBOM is its own image's): verify each.
    digest = released["image"].split("@", 1)[1]
    index = registry_get(f"kopf-operators/manifests/{digest}", "application/vnd.oci.image.index.v1+json")
    repo = released["image"].split("@")[0].rsplit(":", 1)[0]
    for entry in index["manifests"]:
        if entry["platform"]["architecture"] not in PLATFORMS:
            continue
        result = run(cosign(), "verify-attestation", "--key", key, "--type", "cyclonedx", *common,
                     f"{repo}@{entry['digest']}", env=OFFLINE)
        statement = json.loads(base64.b64decode(json.loads(result.stdout.splitlines()[0])["payload"]))
        sbom = statement["predicate"]
        names = {c["name"] for c in sbom["components"]}
        assert {"kopf", "kubernetes", "aiohttp"} <= names, names
        assert sbom["metadata"]["component"]["version"] == released["version"]
    # Another key: no signature of the image verifies.
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run([cosign(), "generate-key-pair"], cwd=other, env={**os.environ, **OFFLINE, "COSIGN_PASSWORD": ""},
                   check=True, capture_output=True, timeout=60)
    wrong = run(cosign(), "verify", "--key", str(other / "cosign.pub"), *common, released["image"], check=False,
                env=OFFLINE)
    assert wrong.returncode != 0 and "no matching signatures" in wrong.stderr, wrong.stderr


@pytest.fixture(scope="module")
def installed(released: dict[str, str], host_operator_paused: None, crds: None,
              core: kubernetes.client.CoreV1Api) -> Iterator[tuple[str, str]]:
    """The chart installed from the registry, as the README says, on the real node; two watched namespaces."""
    tag = uuid.uuid4().hex[:5]
    with watched_namespaces(core, (f"rel-a-{tag}", f"rel-b-{tag}"), {TEST_LABEL: tag}) as spaces:
        restricted_namespace(NAMESPACE)
        helm("install", RELEASE, released["chart"], "--version", released["version"], "--plain-http",
             "--namespace", NAMESPACE, "--set", f"watchNamespaces={{{','.join(spaces)}}}",
             "--set", "replicaCount=1",
             # Only where the pod runs: the real node (its taint tolerated); the image comes from the chart.
             "--set-string", "nodeSelector.kopf-operators\\.dev/real-node=true",
             "--set", "tolerations[0].key=kopf-operators.dev/real-node", "--set", "tolerations[0].operator=Exists",
             "--set", "tolerations[0].effect=NoSchedule")
        try:
            wait_for(lambda: all_ready(core, NAMESPACE, RELEASE, 1), timeout=300,
                     what="the released operator's pod Ready on the real node (its image pulled from the registry)")
            yield spaces[0], spaces[1]
        finally:
            uninstall_release(RELEASE, NAMESPACE, spaces)


def test_installed_release_pulls_its_image_by_digest_and_the_operators_act(
        released: dict[str, str], installed: tuple[str, str], core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    (pod,) = all_ready(core, NAMESPACE, RELEASE, 1) or []
    assert pod.spec.node_name == NODE
    assert pod.spec.containers[0].image == released["image"]  # REGISTRY/kopf-operators:X@sha256:...
    assert pod.spec.containers[0].image_pull_policy == "IfNotPresent"
    # Pulled by the node's containerd from the registry: it holds the release's index by its digest.
    digest = released["image"].split("@", 1)[1]
    assert pod.status.container_statuses[0].image_id.endswith(digest)
    ctr = run("ctr", "--address", str(CLUSTER_DIR / "node" / "containerd.sock"), "-n", "k8s.io", "images", "ls")
    assert f"{REGISTRY}/kopf-operators@{digest}" in ctr.stdout, ctr.stdout
    ns_a, ns_b = installed
    run_label = ns_a.rsplit("-", 1)[1]
    apply_yaml(immortal_yaml("sleeper"), namespace=ns_a)
    wait_for(lambda: ic_status(custom, ns_a, "sleeper").get("startTimes") == 1, timeout=90, what="immortal start")
    apply_yaml(copy_rule_yaml(ns_a, TEST_LABEL, run_label), namespace=ns_a)
    wait_for(lambda: core.read_namespaced_config_map("shared", ns_b).data == {"greeting": "hello"},
             timeout=90, what="the copy in namespace B")


def test_kustomization_applies_on_this_cluster(released: dict[str, str]) -> None:
    # manifests/ names the image the last release recorded (by version and digest): the API server takes it all.
    rendered = kubectl("kustomize", str(REPO / "manifests")).stdout
    assert f"image: {REGISTRY}/kopf-operators:" in rendered and "@sha256:" in rendered
    # A dry run creates nothing, so the kustomization's objects would not find its own namespace: that is
    # applied for real first (as the kustomization has it: restricted Pod Security) and removed afterwards.
    spaces = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "Namespace"]
    made = [doc for doc in spaces if kubectl("get", "namespace", doc["metadata"]["name"], check=False).returncode]
    try:
        for doc in made:
            apply_yaml(yaml.safe_dump(doc))
        kubectl("apply", "-k", str(REPO / "manifests"), "--dry-run=server", timeout=120)
    finally:
        for doc in made:
            kubectl("delete", "namespace", doc["metadata"]["name"], "--wait=false", check=False)
