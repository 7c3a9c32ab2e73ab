"""Scale out past one process: hash shards by namespace (the API server filters each shard's watches),
together they serve every namespace, and never both act on one object. The local cluster runs with the
ShardedListAndWatch feature gate."""

from __future__ import annotations

import functools
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kopf_operators.core.conventions import namespace_shard, shard_selector
from tests.kube import OperatorProcess, delete_namespaces, wait_for
from testsupport.kubectl import apply_yaml, kubectl

SHARDS = 2


@pytest.fixture
def shards(operator_process: OperatorProcess) -> Iterator[list[OperatorProcess]]:
    operator_process.stop()  # the session's unsharded operator would serve the same objects
    procs: list[OperatorProcess] = []
    for index in range(SHARDS):
        # As the chart does: cluster-scoped ChaosAgents only in shard 0.
        files = [f for f in OperatorProcess().files if index == 0 or "blackadder" not in f]
        procs.append(OperatorProcess(files=files, log_name=f"shard-{index}",
                                     env={"SHARD_INDEX": str(index), "SHARD_COUNT": str(SHARDS)}))
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def served_by_server(namespace: str, index: int) -> bool:
    """The API server's own answer: does shard ``index``'s selector stream this namespace's objects?"""
    out = kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/configmaps?shardSelector="
                  + urllib.parse.quote(shard_selector(index, SHARDS))).stdout
    return "kube-root-ca.crt" in out


def test_shards_together_serve_every_namespace_and_never_both_act(shards: list[OperatorProcess],
                                                                   core: Any, custom: Any) -> None:
    suffix = uuid.uuid4().hex[:5]
    # Two namespaces per shard: pick names by their hash, so that both shards always get work.
    names: list[str] = []
    for i in range(1000):
        name = f"shard-probe-{i}-{suffix}"
        if sum(namespace_shard(n, SHARDS) == namespace_shard(name, SHARDS) for n in names) < 2:
            names.append(name)
        if len(names) == 2 * SHARDS:
            break
    owner = {ns: namespace_shard(ns, SHARDS) for ns in names}
    assert sorted(owner.values()) == sorted(list(range(SHARDS)) * 2), owner
    for ns in names:
        core.create_namespace({"metadata": {"name": ns, "labels": {"kopf-operators.dev/test": "true"}}})
    try:
        for ns in names:  # our hash agrees with the server's filter
            wait_for(functools.partial(served_by_server, ns, owner[ns]), timeout=30, what=f"kube-root-ca.crt in {ns}")
            assert not served_by_server(ns, 1 - owner[ns])
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
            wait_for(functools.partial(converged, ns), timeout=60, what=f"the ImmortalContainer in {ns}")
        for ns in names:  # ... by its own shard only
            for index, proc in enumerate(shards):
                mentions = [line for line in proc.output().splitlines() if f"{ns}/sharded" in line]
                if index == owner[ns]:
                    assert any("Created pod" in line for line in mentions), (index, ns, proc.tail())
                else:
                    assert not mentions, (index, ns, mentions)
        for proc in shards:
            assert not proc.errors(), proc.errors()
    finally:
        delete_namespaces(core, names)
