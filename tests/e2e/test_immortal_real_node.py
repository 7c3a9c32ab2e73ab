"""Immortal containers on the local cluster's real kubelet node (cluster/node.sh), where users run them.

A real kubelet does what KWOK does not: since Kubernetes 1.27 it moves a deleted or evicted pod to a
terminal phase (here Failed: ``sleep`` ignores SIGTERM and is killed after the 1 s grace period) before
the pod is removed, and it runs containers that really end. The session's host operator
(``kopf run operators/*.py``) acts; the pods run on the real node (``nodeName`` and its taint's
toleration), from the local base image loaded there. Everything is asserted through the API: the pods
(a watch: ``PodCreations``), the ImmortalContainer's status and its Events.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

from kopf_operators.immortal import decisions
from tests.e2e.immortal_helpers import events_for, ready, status
from tests.e2e.realnode import NODE, script
from tests.kube import OperatorProcess, PodCreations, PodLife, wait_for
from testsupport.kubectl import kubectl

G, V, P = decisions.GROUP, decisions.VERSION, decisions.PLURAL
REAL_NODE_TAINT = "kopf-operators.dev/real-node"


@pytest.fixture(scope="module")
def image(real_node: str) -> str:
    """The local base image (Debian with a shell), loaded into the real node's containerd."""
    base = script("image.sh", "base")
    script("node.sh", "load", base)
    return base


def pod_spec(image: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {"nodeName": NODE,
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}],
            **extra}


def create_ic(custom: Any, namespace: str, name: str, spec: dict[str, Any]) -> None:
    custom.create_namespaced_custom_object(G, V, namespace, P, {
        "apiVersion": decisions.API_VERSION, "kind": decisions.KIND, "metadata": {"name": name},
        "spec": {"template": {"spec": spec}}})


def running_pod(core: kubernetes.client.CoreV1Api, namespace: str, name: str, not_uid: str | None = None) -> Any:
    """The pod ``name`` once it runs (a uid other than ``not_uid``, not being deleted)."""
    def probe() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        ok = (pod.metadata.uid != not_uid and pod.metadata.deletion_timestamp is None
              and pod.status.phase == "Running")
        return pod if ok else None
    return wait_for(probe, timeout=60, interval=0.05, what=f"pod {name} running (uid != {not_uid})")


def backoff_events(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    return sorted((e for e in events_for(core, namespace, name) if e.reason == "BackOff"),
                  key=lambda e: e.metadata.creation_timestamp)


# --- pods taken away are not ends ----------------------------------------------------------------------


@pytest.fixture
def agents(custom: kubernetes.client.CustomObjectsApi) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for agent in names:  # the operator is running: its finalizer goes with it
        kubectl("delete", "chaosagents.blackadder.io", agent, "--ignore-not-found", "--timeout=60s", check=False)


def test_pods_taken_away_are_replaced_at_once_and_counted_once(
        core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi, namespace: str,
        operator: OperatorProcess, image: str, agents: list[str]) -> None:
    """A hand deletion, ``kubectl drain`` of the node, an eviction through the Eviction API and a
    ChaosAgent's kill (tantrum, allowSingleReplica): each pod is reported Failed by the kubelet on its
    way out, and each is replaced at once (well under the 10 s a second end in a row would wait), with
    no BackOff and no end counted in status.backoff; startTimes is exactly the pods started."""
    name, pod_name = "taken", decisions.pod_name("taken")
    creations = PodCreations(core, namespace, field_selector=f"metadata.name={pod_name}")
    create_ic(custom, namespace, name, pod_spec(image, ["sleep", "3600"]))
    pod = running_pod(core, namespace, pod_name)

    def drain() -> None:
        try:
            kubectl("drain", NODE, f"--pod-selector={decisions.OWNER_LABEL}={name}", "--timeout=60s", timeout=70)
        finally:
            kubectl("uncordon", NODE, check=False)

    def evict() -> None:
        core.create_namespaced_pod_eviction(pod_name, namespace, kubernetes.client.V1Eviction(
            metadata=kubernetes.client.V1ObjectMeta(name=pod_name, namespace=namespace)))

    def chaos_agent() -> None:
        agent = f"immortal-real-{uuid.uuid4().hex[:6]}"
        custom.create_cluster_custom_object("blackadder.io", "v1beta1", "chaosagents", {
            "apiVersion": "blackadder.io/v1beta1", "kind": "ChaosAgent", "metadata": {"name": agent},
            "spec": {"tantrumMode": True, "eagerness": 100, "podTolerance": 0, "pauseDuration": 300,
                     "allowSingleReplica": True, "maxKillsPerCycle": 1, "targetNamespaces": [namespace]}})
        agents.append(agent)

    ways: list[tuple[str, Callable[[], None]]] = [
        ("hand deletion", lambda: core.delete_namespaced_pod(pod_name, namespace)),
        ("kubectl drain", drain), ("Eviction API", evict), ("ChaosAgent kill", chaos_agent)]
    for way, take_away in ways:
        old = pod.metadata.uid
        take_away()
        pod = running_pod(core, namespace, pod_name, not_uid=old)
        new = creations.life(pod_name, pod.metadata.uid)
        gone = creations.life(pod_name, old)
        assert gone.ended_deleting, f"{way}: the kubelet did not report the pod ended on its way out: {gone}"
        assert gone.gone_at is not None
        assert new.seen_at - gone.gone_at < 2.0, f"{way}: replaced {new.seen_at - gone.gone_at:.1f} s after"
        print(f"{way}: ended as {gone.ended_phase} on its way out; replaced {new.seen_at - gone.gone_at:.3f} s after")
        if way == "ChaosAgent kill":
            kubectl("delete", "chaosagents.blackadder.io", agents[-1], "--timeout=60s")

    def counted_exactly() -> dict[str, Any]:
        st = status(custom, namespace, name)
        created = creations.uids(pod_name)
        return st if st.get("startTimes") == len(created) and st.get("currentPodUID") == created[-1] else {}

    st = wait_for(counted_exactly, what="every pod started counted once")
    assert st["startTimes"] == len(ways) + 1, creations.uids(pod_name)
    assert not (st.get("backoff") or {}).get("failures"), st.get("backoff")
    wait_for(lambda: ready(status(custom, namespace, name))["status"] == "True", what="Ready again")
    assert backoff_events(core, namespace, name) == []
    creations.stop()


# --- a container that ends by itself, again and again ---------------------------------------------------


def test_a_pod_that_keeps_failing_backs_off_10_20_40_seconds(
        core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi, namespace: str,
        operator: OperatorProcess, image: str) -> None:
    """restartPolicy Never and a container that exits 1: each pod ends by itself. The first end is
    replaced at once, the next ones 10, 20 and 40 s after the end was seen (with a second of tolerance
    below: nextAttempt has second precision), each with a BackOff Event."""
    name, pod_name = "crashing", decisions.pod_name("crashing")
    creations = PodCreations(core, namespace, field_selector=f"metadata.name={pod_name}")
    create_ic(custom, namespace, name, pod_spec(image, ["sh", "-c", "exit 1"], restartPolicy="Never"))

    def lives(count: int) -> list[PodLife]:
        known = creations.lives(pod_name)
        return known if len(known) >= count else []

    pods = wait_for(lambda: lives(5), timeout=120, interval=0.2, what="five pods, four ends")
    gaps = [later.seen_at - (earlier.ended_at or 0) for earlier, later in itertools.pairwise(pods[:5])]
    for gap, delay in zip(gaps, (0, 10, 20, 40), strict=True):
        assert delay - 1.5 <= gap <= delay + 3, (gaps, pods)
    assert all(life.ended_phase == "Failed" and not life.ended_deleting for life in pods[:4]), pods
    messages = [e.message for e in backoff_events(core, namespace, name)]
    assert [m.split("replacing it in ")[1].split(" s,")[0] for m in messages[:3]] == ["10", "20", "40"], messages
    print(f"gaps between an end and the next pod: {', '.join(f'{gap:.1f}' for gap in gaps)} s")

    def five_counted() -> dict[str, Any]:
        st = status(custom, namespace, name)
        return st if st.get("startTimes", 0) >= 5 else {}

    st = wait_for(five_counted, what="the fifth start counted")
    assert st["backoff"]["failures"] >= 4, st
    custom.delete_namespaced_custom_object(G, V, namespace, P, name)
    creations.stop()


# --- a foreign pod in the way ---------------------------------------------------------------------------


def test_our_pod_starts_within_2_s_of_a_foreign_pod_leaving_the_name(
        core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi, namespace: str,
        operator: OperatorProcess, image: str) -> None:
    """A pod we do not own holds the name; once it is deleted, ours exists within 2 s. The operator
    follows the foreign pod with a watch of its name from the version it read, with no timer, so the
    wait does not depend on how long the pod held the name (the watch is resumed after the server's
    290 s timeout: a unit test). The hold here is 20 s rather than 2 minutes: long enough that the
    doubling retry of before (1, 2, 4, 8, 16 s, ±20 %: looks at ~15 s and ~31 s) would have been at
    least 5 s late, short enough for CI."""
    name, pod_name = "blocked", decisions.pod_name("blocked")
    creations = PodCreations(core, namespace, field_selector=f"metadata.name={pod_name}")
    foreign = core.create_namespaced_pod(namespace, {"metadata": {"name": pod_name, "labels": {"app": "not-ours"}},
                                                     "spec": pod_spec(image, ["sleep", "3600"])})
    create_ic(custom, namespace, name, pod_spec(image, ["sleep", "3600"]))
    wait_for(lambda: ready(status(custom, namespace, name)).get("reason") == "ForeignPod"
             if status(custom, namespace, name).get("conditions") else False, what="Ready=False, ForeignPod")
    held_since = time.monotonic()
    wait_for(lambda: time.monotonic() - held_since >= 20 and core.read_namespaced_pod(pod_name, namespace)
             .metadata.uid == foreign.metadata.uid, timeout=30, interval=0.5, what="the foreign pod held 20 s")
    core.delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)

    def ours() -> list[PodLife]:
        return [life for life in creations.lives(pod_name) if life.uid != foreign.metadata.uid]

    [mine, *_] = wait_for(ours, timeout=10, interval=0.05, what="our pod")
    [theirs] = [life for life in creations.lives(pod_name) if life.uid == foreign.metadata.uid]
    assert theirs.gone_at is not None
    print(f"our pod {mine.seen_at - theirs.gone_at:.3f} s after the foreign pod was gone")
    assert mine.seen_at - theirs.gone_at <= 2.0
    owner = core.read_namespaced_pod(pod_name, namespace).metadata.owner_references[0]
    assert owner.name == name
    wait_for(lambda: status(custom, namespace, name).get("startTimes") == 1, what="one start counted")
    creations.stop()
