"""Scale out past one process: shards split the namespaces by Kopf namespace globs (the chart's shipped
split), each with a peering of its own; together they serve every namespace, and never both act on
one object (issue #11, item 7)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kube import REPO, OperatorProcess, apply_yaml, delete_namespaces, kubectl, wait_for
from tests.unit.test_sharding import serving, shipped_shards


@pytest.fixture
def shards(operator_process: OperatorProcess) -> Iterator[dict[str, OperatorProcess]]:
    operator_process.stop()  # the session's all-namespaces operator would serve the same objects
    procs: dict[str, OperatorProcess] = {}
    for shard in shipped_shards():
        name = str(shard["name"])
        peering = f"kopf-operators-shard-{name}"
        apply_yaml(f"apiVersion: kopf.dev/v1\nkind: ClusterKopfPeering\nmetadata: {{name: {peering}}}\n")
        files = ["operators/immortal.py", "operators/copyrator.py", "operators/reroller.py"]
        if shard.get("clusterScoped"):
            files.append("operators/blackadder.py")
        procs[name] = OperatorProcess(files=[str(REPO / f) for f in files], log_name=f"shard-{name}",
                                      namespaces=[str(p) for p in shard["namespaces"]],  # type: ignore[attr-defined]
                                      standalone=False, extra_args=[f"--peering={peering}"])
    try:
        for proc in procs.values():
            proc.start()
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()
        for name in procs:
            kubectl("delete", "clusterkopfpeering", f"kopf-operators-shard-{name}", "--ignore-not-found")


def test_shards_together_serve_every_namespace_and_never_both_act(shards: dict[str, OperatorProcess],
                                                                   core: Any, custom: Any) -> None:
    suffix = uuid.uuid4().hex[:5]
    # Namespaces on both sides of the split, starting with a letter and with a digit.
    names = [f"amber-{suffix}", f"7seas-{suffix}", f"zinc-{suffix}", f"nova-{suffix}"]
    owner = {ns: serving(ns, shipped_shards())[0] for ns in names}
    assert set(owner.values()) == set(shards)  # both shards get work
    for ns in names:
        core.create_namespace({"metadata": {"name": ns, "labels": {"kopf-operators.dev/test": "true"}}})
    try:
        for ns in names:
            apply_yaml("""
apiVersion: immortalcontainer.flugel.it/v1alpha1
kind: ImmortalContainer
metadata: {name: sharded}
spec: {image: nginx:latest}
""", ns)

        def converged(ns: str) -> bool:
            ic = custom.get_namespaced_custom_object("immortalcontainer.flugel.it", "v1alpha1", ns,
                                                     "immortalcontainers", "sharded")
            return (ic.get("status") or {}).get("startTimes") == 1

        for ns in names:  # every namespace is served ...
            wait_for(lambda ns=ns: converged(ns), timeout=60, what=f"the ImmortalContainer in {ns}")
            assert core.read_namespaced_pod("sharded-immortalpod", ns).status.phase in ("Pending", "Running")
        for ns in names:  # ... by its own shard only
            for name, proc in shards.items():
                mentions = [line for line in proc.output().splitlines() if f"{ns}/sharded" in line]
                if name == owner[ns]:
                    assert any("Created pod" in line for line in mentions), (name, ns, proc.tail())
                else:
                    assert not mentions, (name, ns, mentions)
        for proc in shards.values():
            assert not proc.errors(), proc.errors()
    finally:
        delete_namespaces(core, names)
