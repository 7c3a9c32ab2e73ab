"""`kubectl apply -f manifests/examples/` works unchanged: the API server accepts every example.

The namespaces the examples live in are created for real (their own file); every other object is
applied with a server-side dry run, so the CRDs' schemas and CEL rules, admission and defaulting all
judge the examples as they are, and no chaos or copy is started in the shared test cluster.
"""

from __future__ import annotations

import yaml

from testsupport.kubectl import kubectl
from testsupport.paths import REPO

EXAMPLES = REPO / "manifests" / "examples"
NAMESPACES_FILE = EXAMPLES / "copyrator-namespaces.yaml"


def example_objects() -> list[dict[str, object]]:
    objects = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


def test_every_example_is_accepted_by_the_api_server(crds: None) -> None:
    namespaces = [doc["metadata"]["name"] for doc in yaml.safe_load_all(NAMESPACES_FILE.read_text()) if doc]
    existing = {ns for ns in namespaces if kubectl("get", "namespace", ns, check=False).returncode == 0}
    kubectl("apply", "-f", str(NAMESPACES_FILE))
    try:
        result = kubectl("apply", "--dry-run=server", "-f", str(EXAMPLES), check=False)
        assert result.returncode == 0, result.stderr
        accepted = [line for line in result.stdout.splitlines() if "(server dry run)" in line]
        assert len(accepted) == len(example_objects()), result.stdout
    finally:
        for ns in set(namespaces) - existing:
            kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)
