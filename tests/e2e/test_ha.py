"""High availability from the chart, for real: the chart as shipped (2 replicas, peering, priorities
the pods take themselves) on the real node. One replica acts and the other writes nothing; a SIGKILL
of the active one hands over to the standby within 15 s with nothing done twice; a replica paused
after it has acted exits (its timers and resync loops with it), and its restart stands by. Writes are counted
per pod in the API server's audit log: a kubelet-mounted token names its pod in every line."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from kopf_operators.core import process
from kopf_operators.immortal import decisions as ic
from tests.e2e.realnode import (
    RESUMED,
    acting,
    all_ready,
    audit_writes,
    ic_status,
    immortal_yaml,
    install_release,
    logs,
    not_peering,
    observed_hash,
    release_pods,
    rerolled_app_yaml,
    sigkill,
    template_hash,
    uninstall_release,
    watched_namespaces,
)
from tests.kube import OperatorProcess, PodCreations, stays, wait_for
from testsupport.audit import audit_now
from testsupport.kubectl import apply_yaml, kubectl

RELEASE = NAMESPACE = "kopf-ha"
PEERING = "kopf-operators"  # the chart's ClusterKopfPeering
LOST_ROLE = process.PeeringState.LOST_ROLE
TAKEOVER_LIMIT = 15.0  # seconds from a SIGKILL of the active pod until the standby acts (issue #18)
MIN_INTERVAL = 30  # the re-roller's least time between two rollouts here: a timer pending that long


@pytest.fixture(scope="module")
def space(core: kubernetes.client.CoreV1Api, crds: None) -> Iterator[str]:
    with watched_namespaces(core, [f"ha-{uuid.uuid4().hex[:5]}"]) as names:
        yield names[0]


@pytest.fixture(scope="module")
def release(operator_image: str, host_operator_paused: None, space: str,
            core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    # The chart's defaults for replicas and peering; this module's namespace only; short resyncs and a
    # long re-roller interval, so that a paused replica has loops and a timer that would act.
    install_release(core, RELEASE, NAMESPACE, [space],
                    "operators.copyrator.resyncSeconds=5", "operators.reroller.resyncSeconds=5",
                    f"operators.reroller.minIntervalSeconds={MIN_INTERVAL}", replicas=2)
    yield RELEASE
    uninstall_release(RELEASE, NAMESPACE, [space])


def roles(core: kubernetes.client.CoreV1Api) -> tuple[Any, Any] | None:
    """(active pod, standby pod) once exactly one of the two acts, by their own logs."""
    pods = all_ready(core, NAMESPACE, RELEASE, 2)
    if not pods:
        return None
    active = [p for p in pods if acting(logs(NAMESPACE, p.metadata.name))]
    if len(active) != 1:
        return None
    return active[0], next(p for p in pods if p is not active[0])


def wait_roles(core: kubernetes.client.CoreV1Api) -> tuple[Any, Any]:
    found = wait_for(lambda: roles(core), timeout=30, what="one replica to act, the other to stand by")
    assert found is not None
    return found


def make_ic(space: str, name: str) -> None:
    apply_yaml(immortal_yaml(name), namespace=space)


def starts(custom: kubernetes.client.CustomObjectsApi, space: str, name: str) -> int:
    return int(ic_status(custom, space, name).get("startTimes") or 0)


def pod_uid(core: kubernetes.client.CoreV1Api, space: str, name: str) -> str | None:
    pods = core.list_namespaced_pod(space, field_selector=f"metadata.name={ic.pod_name(name)}").items
    return pods[0].metadata.uid if pods else None


def restarts(core: kubernetes.client.CoreV1Api, pod: str) -> int:
    statuses = core.read_namespaced_pod(pod, NAMESPACE).status.container_statuses or []
    return sum(status.restart_count for status in statuses)


def created_pods(writes: list[tuple[str, str, str, str]]) -> list[str]:
    return [name for _t, verb, resource, name in writes if verb == "create" and resource == "pods"]


def test_two_replicas_one_acts_the_standby_writes_nothing(
        release: str, space: str, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    pods = release_pods(core, NAMESPACE, RELEASE)
    def peering_entries() -> dict[str, Any]:
        body = custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", PEERING)
        return dict(body.get("status") or {})

    wait_for(lambda: len(peering_entries()) == 2, timeout=30, what="both replicas in the peering")
    peers = peering_entries()
    priorities = [peer["priority"] for peer in peers.values()]
    assert len(set(priorities)) == 2, peers  # distinct, with no --priority in the chart
    assert all(peer["lifetime"] == process.PEERING_LIFETIME_SECONDS for peer in peers.values()), peers
    budget = kubectl("get", "pdb", "-n", NAMESPACE, "-o", "jsonpath={.items[0].status.disruptionsAllowed}").stdout
    assert budget == "1", "the PodDisruptionBudget lets a drain take one replica at a time"
    assert {p.spec.node_name for p in pods} == {"kopf-real-node"}
    active, standby = wait_roles(core)

    since = audit_now()
    make_ic(space, "first")
    wait_for(lambda: starts(custom, space, "first") == 1, timeout=60, what="the active replica to start a pod")
    # Longer than the resync loops' period here (5 s): a standby's loops would have run.
    stays(lambda: starts(custom, space, "first") == 1, seconds=12, interval=0.5, what="one start")
    assert created_pods(audit_writes(since, active.metadata.name)) == [ic.pod_name("first")]
    standby_writes = audit_writes(since, standby.metadata.name)
    assert standby_writes, "the audit log names the standby's requests (its keep-alives at least)"
    assert not_peering(standby_writes) == [], standby_writes


def test_sigkill_of_the_active_pod_the_standby_acts_within_15s_nothing_twice(
        release: str, space: str, core: kubernetes.client.CoreV1Api,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    active, standby = wait_roles(core)
    first_pod = pod_uid(core, space, "first")
    assert first_pod and starts(custom, space, "first") == 1
    creations = PodCreations(core, space, label_selector=ic.OWNER_LABEL)
    since = audit_now()
    try:
        sigkill(active)
        killed = time.monotonic()
        make_ic(space, "after-kill")  # created right after the kill: only the standby can start it
        wait_for(lambda: pod_uid(core, space, "after-kill"), timeout=60, interval=0.1,
                 what="the standby to start a pod for an object created after the kill")
        took = time.monotonic() - killed
        print(f"\nSIGKILL of the active pod -> the standby created a pod for a new object in {took:.1f}s "
              f"(peering lifetime {process.PEERING_LIFETIME_SECONDS}s)")
        assert took <= TAKEOVER_LIMIT, f"takeover took {took:.1f}s"
        # Nothing done twice: one pod and one start each, the old object's pod untouched.
        stays(lambda: (starts(custom, space, "first") == 1 and pod_uid(core, space, "first") == first_pod
                       and starts(custom, space, "after-kill") in (0, 1)
                       and len(creations.uids(ic.pod_name("after-kill"))) == 1
                       and set(creations.uids(ic.pod_name("first"))) <= {first_pod}),
              seconds=12, interval=0.5, what="one pod and one start per ImmortalContainer")
        assert starts(custom, space, "after-kill") == 1
        assert created_pods(audit_writes(since, standby.metadata.name)) == [ic.pod_name("after-kill")]
    finally:
        creations.stop()
    # The killed container restarts in its pod, a newer process: it stands by (Kopf starts it paused
    # and it finds an older peer), and writes nothing.
    def restarted_and_standing_by() -> bool:
        restarted = core.read_namespaced_pod(active.metadata.name, NAMESPACE).status.container_statuses[0]
        now = roles(core)
        return bool(restarted.restart_count >= 1 and restarted.ready and now
                    and now[0].metadata.name == standby.metadata.name)

    wait_for(restarted_and_standing_by, timeout=90, what="the restarted process to stand by")
    assert not_peering(audit_writes(since, active.metadata.name)) == []


def test_a_replica_paused_after_acting_writes_nothing(
        release: str, space: str, core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    """Kopf pauses a replica in favour of a higher priority (here a developer's `kopf run --priority`).
    Having acted, it exits (its re-roller timer and resync loops with it), and the kubelet restarts it
    as a standby that never acted: no write from either process, one rollout for the held change."""
    active, standby = wait_roles(core)
    apply_yaml(rerolled_app_yaml("conf"), namespace=space)

    def current_hash() -> str | None:
        return template_hash(apps, space)

    def generation() -> int:
        return int(apps.read_namespaced_deployment("app", space).metadata.generation)

    wait_for(lambda: observed_hash(apps, space), timeout=60, what="the re-roller's baseline")
    core.patch_namespaced_config_map("conf", space, {"data": {"level": "2"}})
    rolled = wait_for(current_hash, timeout=60, what="the first rollout (at once)")
    rolled_at = time.monotonic()
    # A second change within the interval: the active replica holds it in a timer until the interval ends.
    core.patch_namespaced_config_map("conf", space, {"data": {"level": "3"}})
    dev = OperatorProcess(standalone=False, extra_args=[f"--peering={PEERING}", "--priority=100"],
                          namespaces=[space], log_name=f"ha-dev-{uuid.uuid4().hex[:6]}")
    try:
        dev.start()
        since = audit_now()
        wait_for(lambda: restarts(core, active.metadata.name) >= 1, timeout=60,
                 what="the active replica to exit in favour of the higher priority (and be restarted)")
        assert LOST_ROLE in logs(NAMESPACE, active.metadata.name, previous=True)
        wait_for(lambda: RESUMED in dev.output(), timeout=30, what="the higher priority to act")
        # The new actor rolls the second change (once), from its own listing.
        wait_for(lambda: current_hash() not in (None, rolled), timeout=60, what="the second rollout")
        after = (current_hash(), generation())
        # Past the paused replica's timer, and a few of its 5-s resync passes: no second rollout...
        remaining = MIN_INTERVAL - (time.monotonic() - rolled_at) + 10
        stays(lambda: (current_hash(), generation()) == after, seconds=max(remaining, 12), interval=0.5,
              what="one rollout for the second change")
        # ...and no write at all from the paused replica, nor from the standby.
        paused_writes = audit_writes(since, active.metadata.name)
        assert paused_writes and not_peering(paused_writes) == [], paused_writes
        assert not_peering(audit_writes(since, standby.metadata.name)) == []
    finally:
        dev.stop()
    # The developer's run exits (and says goodbye in the peering): the oldest process acts, the one
    # that stood by all along (the other one's restart is newer).
    wait_for(lambda: (r := roles(core)) and r[0].metadata.name == standby.metadata.name, timeout=30,
             what="the oldest replica to resume")
    make_ic(space, "after-resume")
    wait_for(lambda: pod_uid(core, space, "after-resume"), timeout=30, what="the resumed replica to act")
