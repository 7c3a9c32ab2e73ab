"""Scale out past one process: hash shards by namespace. Where the API server honours the shard selector
(the ShardedListAndWatch feature gate, on in the local cluster by default) it filters each shard's
watches; where it does not (`KUBE_FEATURE_GATES=ShardedListAndWatch=false cluster/cluster.sh up`, or a
minor before 1.36) each shard filters in the process. Either way the shards together serve every
namespace, each exactly once, and never two of them act on one object."""

from __future__ import annotations

import functools
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kopf_operators.core.conventions import namespace_shard, shard_selector
from tests.kube import OperatorProcess, delete_namespaces, wait_for
from testsupport.kubectl import apply_yaml, kubectl

StartShards = Callable[..., list[OperatorProcess]]


@pytest.fixture
def start_shards(operator_process: OperatorProcess) -> Iterator[StartShards]:
    """``start_shards(count, **env)``: the session's operator stopped (it would serve the same objects),
    ``count`` shards started; all stopped at the end."""
    procs: list[OperatorProcess] = []

    def start(count: int, **env: str) -> list[OperatorProcess]:
        operator_process.stop()
        for index in range(count):
            # As the chart does: cluster-scoped ChaosAgents only in shard 0.
            files = [f for f in OperatorProcess().files if index == 0 or "blackadder" not in f]
            procs.append(OperatorProcess(files=files, log_name=f"shard-{index}-of-{count}",
                                         env={"SHARD_INDEX": str(index), "SHARD_COUNT": str(count), **env}))
        for proc in procs:
            proc.start()
        return procs

    try:
        yield start
    finally:
        for proc in procs:
            proc.stop()


def served_by_server(namespace: str, index: int, count: int) -> bool:
    """The API server's own answer: does shard ``index``'s selector stream this namespace's objects?"""
    out = kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/configmaps?shardSelector="
                  + urllib.parse.quote(shard_selector(index, count))).stdout
    return "kube-root-ca.crt" in out


def server_filters_shards() -> bool:
    """Whether this cluster's API server applies shard selectors (a selector matching no namespace's
    slice of the hash space still returning objects: it was ignored)."""
    out = kubectl("get", "--raw", "/api/v1/configmaps?limit=5&shardSelector=" + urllib.parse.quote(
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x0000000000000001')")).stdout
    return "kube-root-ca.crt" not in out


def probe_namespaces(count: int, per_shard: int = 2) -> dict[str, int]:
    """``per_shard`` fresh namespace names for each shard, chosen by their hash: every shard gets work."""
    suffix = uuid.uuid4().hex[:5]
    owner: dict[str, int] = {}
    for i in range(1000):
        name = f"shard-probe-{i}-{suffix}"
        shard = namespace_shard(name, count)
        if sum(s == shard for s in owner.values()) < per_shard:
            owner[name] = shard
        if len(owner) == per_shard * count:
            break
    assert sorted(owner.values()) == sorted(list(range(count)) * per_shard), owner
    return owner


def assert_every_namespace_served_once(shards: list[OperatorProcess], owner: dict[str, int],
                                       core: Any, custom: Any, *, check_server: bool) -> None:
    count = len(shards)
    for ns in owner:
        core.create_namespace({"metadata": {"name": ns, "labels": {"kopf-operators.dev/test": "true"}}})
    try:
        if check_server:
            for ns, index in owner.items():  # our hash agrees with the server's filter
                wait_for(functools.partial(served_by_server, ns, index, count), timeout=30,
                         what=f"kube-root-ca.crt in {ns}")
                assert not any(served_by_server(ns, other, count) for other in range(count) if other != index)
        for ns in owner:
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

        for ns in owner:  # every namespace is served ...
            wait_for(functools.partial(converged, ns), timeout=60, what=f"the ImmortalContainer in {ns}")
        for ns, owning in owner.items():  # ... by its own shard only
            for index, proc in enumerate(shards):
                mentions = [line for line in proc.output().splitlines() if f"{ns}/sharded" in line]
                if index == owning:
                    assert sum("Created pod" in line for line in mentions) == 1, (index, ns, proc.tail())
                else:
                    assert not mentions, (index, ns, mentions)
        for proc in shards:
            assert not proc.errors(), proc.errors()
    finally:
        delete_namespaces(core, list(owner))


def mode_lines(proc: OperatorProcess) -> list[str]:
    return [line for line in proc.output().splitlines() if "Serving shard" in line]


def test_shards_together_serve_every_namespace_and_never_both_act(start_shards: StartShards,
                                                                   core: Any, custom: Any) -> None:
    """Two shards as the server allows: filtered by the API server where it has the feature gate (the
    local cluster's default), else by each process; every shard says which, once."""
    server = server_filters_shards()
    shards = start_shards(2)
    for proc in shards:
        wait_for(functools.partial(mode_lines, proc), timeout=60, what="the shard's mode line")
        lines = mode_lines(proc)
        assert len(lines) == 1, lines
        assert ("filtered by the API server" if server else "filtered by this process") in lines[0], lines
    assert_every_namespace_served_once(shards, probe_namespaces(2), core, custom, check_server=server)


def test_three_shards_filtered_in_the_process_serve_every_namespace_exactly_once(
        start_shards: StartShards, core: Any, custom: Any) -> None:
    """Three shards that filter in the process, as on a server without the feature gate (on a server
    with it, SHARD_FILTERING=client makes them): every event reaches every shard, and each acts only
    on its own namespaces."""
    env = {"SHARD_FILTERING": "client"} if server_filters_shards() else {}
    shards = start_shards(3, **env)
    for proc in shards:
        wait_for(functools.partial(mode_lines, proc), timeout=60, what="the shard's mode line")
        assert "filtered by this process" in mode_lines(proc)[0], mode_lines(proc)
    assert_every_namespace_served_once(shards, probe_namespaces(3), core, custom, check_server=False)
