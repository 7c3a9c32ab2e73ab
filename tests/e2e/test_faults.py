"""Cross-operator fault suite: SIGKILL at random moments, the API server unreachable, two replicas.

All four operators run in one process, as in production. The assertions are on the final state users
rely on: one pod per ImmortalContainer with every start counted once, every Copyrator copy present and
up to date (and nothing more), every ConfigMap change rolled exactly once by the re-roller.
"""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kubernetes
import pytest

from kopf_operators.copyrator import rules
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL
from kopf_operators.immortal import decisions as ic
from kopf_operators.reroller import settings
from tests.e2e.faultkit import ApiProxy, proxied_kubeconfig, upstream_of
from tests.kube import (
    E2E_LEASE,
    OperatorProcess,
    PodCreations,
    PodLife,
    delete_lease,
    delete_namespaces,
    lease_env,
    lease_holder,
    stays,
    wait_for,
)
from testsupport.paths import CLUSTER_DIR

SEED = int(os.environ.get("FAULT_SEED", "20240509"))
TEST_LABEL = {"kopf-operators.dev/test": "true"}


# --- building blocks --------------------------------------------------------------------------


def make_ics(custom: Any, namespace: str, names: list[str], image: str = "busybox:1.36") -> None:
    for name in names:
        custom.create_namespaced_custom_object(ic.GROUP, ic.VERSION, namespace, ic.PLURAL, {
            "apiVersion": ic.API_VERSION, "kind": ic.KIND, "metadata": {"name": name}, "spec": {"image": image}})


def make_rule(custom: Any, namespace: str, name: str, selector: dict[str, str], targets: list[str]) -> str:
    body = {"apiVersion": f"{rules.GROUP}/{rules.VERSION}", "kind": rules.KIND, "metadata": {"name": name},
            "spec": {"ruleType": "configmap", "selector": selector, "namespace": namespace,
                     "targetNamespaces": targets}}
    return str(custom.create_namespaced_custom_object(rules.GROUP, rules.VERSION, namespace, rules.PLURAL, body)
               ["metadata"]["uid"])


def make_workload(core: Any, apps: Any, namespace: str, name: str) -> None:
    """A re-roller-annotated Deployment reading ConfigMap ``<name>-conf``."""
    core.create_namespaced_config_map(namespace, {"metadata": {"name": f"{name}-conf"}, "data": {"v": "0"}})
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": name, "annotations": {settings.AUTO: "true"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                                       "envFrom": [{"configMapRef": {"name": f"{name}-conf"}}]}]}}}})


def make_namespaces(core: Any, names: list[str]) -> None:
    for name in names:
        core.create_namespace({"metadata": {"name": name, "labels": TEST_LABEL}})


def converge(check: Callable[[], list[str]], timeout: float, what: str) -> float:
    """Poll ``check`` (which lists what is still wrong) until it lists nothing; return the time taken."""
    start = time.monotonic()
    problems: list[str] = []
    while time.monotonic() - start < timeout:
        problems = check()
        if not problems:
            return time.monotonic() - start
        time.sleep(0.5)
    raise AssertionError(f"{what}: not converged after {timeout}s; {len(problems)} problem(s), e.g.:\n"
                         + "\n".join(problems[:15]))


def counted_pod_uid(custom: Any, core: Any, namespace: str, name: str) -> str | None:
    """The uid of the IC's pod when that pod is alive and already counted in status (else None)."""
    obj = custom.get_namespaced_custom_object(ic.GROUP, ic.VERSION, namespace, ic.PLURAL, name)
    uid = (obj.get("status") or {}).get("currentPodUID")
    try:
        pod = core.read_namespaced_pod(ic.pod_name(name), namespace)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    if pod.metadata.uid != uid or pod.metadata.deletion_timestamp:
        return None
    return str(uid)


def counted_pods(custom: Any, core: Any, namespace: str) -> dict[str, str]:
    """IC name -> uid of its live pod, for the ICs whose current pod is already counted in status."""
    counted = {obj["metadata"]["name"]: (obj.get("status") or {}).get("currentPodUID")
               for obj in custom.list_namespaced_custom_object(ic.GROUP, ic.VERSION, namespace, ic.PLURAL)["items"]}
    result = {}
    for pod in core.list_namespaced_pod(namespace, label_selector=ic.OWNER_LABEL).items:
        name = pod.metadata.labels[ic.OWNER_LABEL]
        if not pod.metadata.deletion_timestamp and counted.get(name) == pod.metadata.uid:
            result[name] = str(pod.metadata.uid)
    return result


def delete_counted_pod(custom: Any, core: Any, namespace: str, name: str, uid: str | None = None) -> bool:
    """Delete the IC's pod if its start was counted (a replacement then must count exactly +1)."""
    uid = uid or counted_pod_uid(custom, core, namespace, name)
    if uid is None:
        return False
    options = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid=uid))
    try:
        core.delete_namespaced_pod(ic.pod_name(name), namespace, body=options)
    except kubernetes.client.ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def ic_problems(custom: Any, core: Any, namespace: str, expected_starts: Mapping[str, int | range]) -> list[str]:
    """What is wrong with the ImmortalContainers: ``expected_starts`` gives each one's exact start
    count, or the range it may be in."""
    problems: list[str] = []
    items = custom.list_namespaced_custom_object(ic.GROUP, ic.VERSION, namespace, ic.PLURAL)["items"]
    pods = core.list_namespaced_pod(namespace, label_selector=ic.OWNER_LABEL).items
    live: dict[str, list[Any]] = {}
    for pod in pods:
        if not pod.metadata.deletion_timestamp:
            live.setdefault(pod.metadata.labels[ic.OWNER_LABEL], []).append(pod)
    names = {obj["metadata"]["name"] for obj in items}
    if names != set(expected_starts):
        problems.append(f"ImmortalContainers {sorted(names ^ set(expected_starts))} unexpected/missing")
    for orphan in sorted(set(live) - names):
        problems.append(f"orphan pod(s) for {orphan}")
    for obj in items:
        name, st = obj["metadata"]["name"], obj.get("status") or {}
        mine = live.get(name, [])
        if len(mine) != 1:
            problems.append(f"{name}: {len(mine)} live pods")
            continue
        allowed = expected_starts.get(name)
        if (st.get("startTimes") not in allowed) if isinstance(allowed, range) else (st.get("startTimes") != allowed):
            problems.append(f"{name}: startTimes {st.get('startTimes')} != {allowed}")
        if st.get("currentPodUID") != mine[0].metadata.uid:
            problems.append(f"{name}: currentPodUID {st.get('currentPodUID')} is not the live pod")
        if mine[0].status.phase != "Running":
            problems.append(f"{name}: pod {mine[0].status.phase}")
    return problems


def copy_problems(core: Any, namespace: str, rule_uid: str, selector: str, targets: list[str]) -> list[str]:
    problems: list[str] = []
    sources = {cm.metadata.name: cm.data or {} for cm in core.list_namespaced_config_map(
        namespace, label_selector=selector).items}
    copies = core.list_config_map_for_all_namespaces(label_selector=f"{COPYRATOR_RULE_UID_LABEL}={rule_uid}").items
    seen: dict[tuple[str, str], int] = {}
    for copy in copies:
        key = (copy.metadata.namespace, copy.metadata.name)
        seen[key] = seen.get(key, 0) + 1
        if copy.metadata.namespace not in targets or copy.metadata.name not in sources:
            problems.append(f"stray copy {key}")
        elif (copy.data or {}) != sources[copy.metadata.name]:
            problems.append(f"stale copy {key}: {copy.data} != {sources[copy.metadata.name]}")
    for target in targets:
        for name in sources:
            if seen.get((target, name)) != 1:
                problems.append(f"copy {target}/{name}: {seen.get((target, name), 0)} present")
    return problems


def rollout_problems(apps: Any, namespace: str, changed: set[str], all_names: list[str]) -> list[str]:
    """Every changed workload rolled exactly once (one new ReplicaSet), the others not at all."""
    problems: list[str] = []
    deployments = {d.metadata.name: d for d in apps.list_namespaced_deployment(namespace).items}
    owners: dict[str, int] = {}
    for rs in apps.list_namespaced_replica_set(namespace).items:
        for ref in rs.metadata.owner_references or ():
            owners[ref.uid] = owners.get(ref.uid, 0) + 1
    for name in all_names:
        dep = deployments.get(name)
        if dep is None:
            problems.append(f"deployment {name} missing")
            continue
        want = 2 if name in changed else 1
        hashed = settings.CONFIG_HASH in (dep.spec.template.metadata.annotations or {})
        if owners.get(dep.metadata.uid, 0) != want:
            problems.append(f"{name}: {owners.get(dep.metadata.uid, 0)} ReplicaSets, want {want}")
        if hashed != (name in changed):
            problems.append(f"{name}: config-hash annotation {hashed}, ConfigMap changed {name in changed}")
    return problems


@pytest.fixture
def extra_namespaces(core: Any, namespace: str) -> Iterator[Callable[[int], list[str]]]:
    made: list[str] = []

    def make(count: int) -> list[str]:
        names = [f"{namespace[:50]}-t{i}" for i in range(len(made), len(made) + count)]
        make_namespaces(core, names)
        made.extend(names)
        return names

    yield make
    delete_namespaces(core, made)


# --- SIGKILL at random moments ------------------------------------------------------------------

IC_COUNT, SOURCES, TARGETS, WORKLOADS, KILLS = 100, 10, 5, 20, 6
# A pod the operator created is counted at the latest by the status write TRANSIENT_SECONDS later; a
# restarted operator's watches list within a few seconds of its liveness endpoint answering.
UNCOUNTED_SECONDS = ic.TRANSIENT_SECONDS + 1.0
WATCH_START_SECONDS = 2.0


def test_sigkill_at_random_moments_converges_exactly(
        operator: OperatorProcess, namespace: str, core: Any, apps: Any, custom: Any,
        extra_namespaces: Callable[[int], list[str]]) -> None:
    rng = random.Random(SEED)
    print(f"FAULT_SEED={SEED}")
    targets = extra_namespaces(TARGETS)

    # The re-roller's baselines must exist before the changes (a first sighting never rolls).
    workloads = [f"web-{i}" for i in range(WORKLOADS)]
    for name in workloads:
        make_workload(core, apps, namespace, name)
    wait_for(lambda: all(settings.OBSERVED_HASH in (d.metadata.annotations or {})
                         for d in apps.list_namespaced_deployment(namespace).items),
             timeout=60, interval=0.5, what="the re-roller's baselines")
    to_change = workloads[:]
    rng.shuffle(to_change)
    changed: set[str] = set()

    # Then everything else at once, and the chaos starts while it converges.
    ic_names = [f"ic-{i}" for i in range(IC_COUNT)]
    # At least the first pod plus one per pod the test deletes. The exact figure is every pod ever
    # created for the IC, from a watch: KWOK, too, sometimes deletes a just-recreated pod of the same
    # name, and that replacement is a real start the operator must count as well. Only a pod no process
    # could know of may be missing from the count (``unseeable``).
    at_least = dict.fromkeys(ic_names, 1)
    creations = PodCreations(core, namespace, label_selector=ic.OWNER_LABEL)
    downtimes: list[tuple[float, float]] = []  # (killed, the next process healthy), monotonic
    deleted_counted: set[str] = set()  # uids of the counted pods the test deleted

    def unseeable(life: PodLife) -> bool:
        """Created by a process in the moments before it was killed, before a status write counted it,
        and deleted (not by the test: by KWOK's retried deletion) before the next process watched: no
        process can know of it (docs/immortal.md, "What the start count can miss")."""
        return life.gone_at is not None and life.uid not in deleted_counted and any(
            killed - UNCOUNTED_SECONDS <= life.seen_at and life.gone_at <= healthy + WATCH_START_SECONDS
            for killed, healthy in downtimes)

    def created() -> dict[str, int]:
        return {name: len(creations.uids(ic.pod_name(name))) for name in ic_names}

    def expected() -> dict[str, int | range]:
        allowed: dict[str, int | range] = {}
        for name in ic_names:
            lives = creations.lives(ic.pod_name(name))
            unknowable = sum(map(unseeable, lives))
            allowed[name] = range(len(lives) - unknowable, len(lives) + 1) if unknowable else len(lives)
        return allowed

    make_ics(custom, namespace, ic_names)
    selector = {"fault-src": "yes"}
    for i in range(SOURCES):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": f"src-{i}", "labels": selector},
                                                      "data": {"v": "0"}})
    rule_uid = make_rule(custom, namespace, "fault-rule", selector, targets)
    total = IC_COUNT + 1 + SOURCES + SOURCES * TARGETS + 2 * WORKLOADS
    print(f"{total} objects (plus {IC_COUNT + WORKLOADS} pods)")
    assert total >= 200

    edits = 0

    def mutate() -> None:
        nonlocal edits
        counted = counted_pods(custom, core, namespace)
        for name in rng.sample(sorted(counted), min(4, len(counted))):
            if delete_counted_pod(custom, core, namespace, name, counted[name]):
                at_least[name] += 1
                deleted_counted.add(counted[name])
        for _ in range(rng.randint(1, 2)):
            edits += 1
            core.patch_namespaced_config_map(f"src-{rng.randrange(SOURCES)}", namespace,
                                             {"data": {"v": str(edits)}})
        if rng.random() < 0.5:  # a user deletes a copy: it must come back
            copies = core.list_namespaced_config_map(rng.choice(targets),
                                                     label_selector=f"{COPYRATOR_RULE_UID_LABEL}={rule_uid}").items
            if copies:
                victim = rng.choice(copies).metadata
                core.delete_namespaced_config_map(victim.name, victim.namespace)
        for _ in range(2):
            if to_change:
                name = to_change.pop()
                core.patch_namespaced_config_map(f"{name}-conf", namespace, {"data": {"v": "1"}})
                changed.add(name)

    started = time.monotonic()
    for round_ in range(KILLS):
        time.sleep(rng.uniform(0.2, 2.5))  # let it work for a random while
        mutate()
        time.sleep(rng.uniform(0.0, 1.0))
        operator.kill()
        killed = time.monotonic()
        print(f"kill #{round_ + 1} at {killed - started:.1f}s")
        mutate()  # changes while it is down
        operator.start()
        downtimes.append((killed, time.monotonic()))
    while to_change:
        mutate()

    def problems() -> list[str]:
        return (ic_problems(custom, core, namespace, expected())
                + copy_problems(core, namespace, rule_uid, "fault-src=yes", targets)
                + rollout_problems(apps, namespace, changed, workloads))

    took = converge(problems, timeout=120, what="the final state after the kills")
    starts = created()
    unknowable = {name: allowed for name, allowed in expected().items() if isinstance(allowed, range)}
    print(f"unseeable pods (may be uncounted): {unknowable}")
    print(f"converged {took:.1f}s after the last restart; {sum(starts.values()) - IC_COUNT} replacements counted "
          f"({sum(at_least.values()) - IC_COUNT} caused by the test)")
    assert all(starts[name] >= at_least[name] for name in ic_names), (starts, at_least)
    # And it stays exact: no late double counts, no late extra rollouts or copies.
    stays(lambda: problems() == [], seconds=3, what="the exact final state")
    creations.stop()
    assert operator.tracebacks(namespace) == [], operator.tail(100)


# --- the API server unreachable -------------------------------------------------------------------

OUTAGE_SECONDS = 10


def test_api_server_outage_reconnects_and_loses_nothing(
        operator: OperatorProcess, namespace: str, core: Any, apps: Any, custom: Any,
        extra_namespaces: Callable[[int], list[str]]) -> None:
    operator.stop()  # this test runs its own operator, behind the proxy
    proxy = ApiProxy(*upstream_of(operator.kubeconfig))
    proxy.start()
    kubeconfig = proxied_kubeconfig(operator.kubeconfig, proxy,
                                    CLUSTER_DIR / f"proxied-kubeconfig-{uuid.uuid4().hex[:6]}")
    proc = OperatorProcess(kubeconfig=kubeconfig, log_name=f"operator-proxied-{uuid.uuid4().hex[:6]}")
    try:
        proc.start()
        targets = extra_namespaces(1)
        names = [f"ic-{i}" for i in range(5)]
        creations = PodCreations(core, namespace, label_selector=ic.OWNER_LABEL)

        def expected() -> dict[str, int]:  # every pod ever created counts once (see the SIGKILL test)
            return {name: len(creations.uids(ic.pod_name(name))) for name in names}

        make_ics(custom, namespace, names)
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "src", "labels": {"fault-src": "yes"}},
                                                      "data": {"v": "0"}})
        rule_uid = make_rule(custom, namespace, "outage-rule", {"fault-src": "yes"}, targets)
        make_workload(core, apps, namespace, "web")
        wait_for(lambda: settings.OBSERVED_HASH in (apps.read_namespaced_deployment("web", namespace)
                                                    .metadata.annotations or {}), timeout=30, what="the baseline")

        def problems(changed: set[str]) -> list[str]:
            return (ic_problems(custom, core, namespace, expected())
                    + copy_problems(core, namespace, rule_uid, "fault-src=yes", targets)
                    + rollout_problems(apps, namespace, changed, ["web"]))

        converge(lambda: problems(set()), timeout=60, what="the initial state")

        proxy.cut()
        cut_at = time.monotonic()
        for name in names:  # the work piles up while the operator cannot see or act
            assert delete_counted_pod(custom, core, namespace, name)
        core.patch_namespaced_config_map("src", namespace, {"data": {"v": "during-outage"}})
        core.patch_namespaced_config_map("web-conf", namespace, {"data": {"v": "1"}})
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - cut_at)))
        assert proc.running, proc.tail()
        assert ic_problems(custom, core, namespace, expected()), "nothing should have happened while cut off"
        proxy.restore()

        took = converge(lambda: problems({"web"}), timeout=60, what="the state after the outage")
        print(f"converged {took:.1f}s after the API server came back (outage {OUTAGE_SECONDS}s)")
        assert proc.running
        assert all(n >= 2 for n in expected().values()), expected()  # each deleted pod was replaced
        stays(lambda: problems({"web"}) == [], seconds=2, what="the converged state")
        creations.stop()
        assert operator.tracebacks(namespace) == [], operator.tail(100)
    finally:
        proc.stop()
        proxy.close()
        kubeconfig.unlink(missing_ok=True)


# --- two replicas: only one acts --------------------------------------------------------------

@pytest.fixture
def lease() -> Iterator[str]:
    delete_lease()
    yield E2E_LEASE
    delete_lease()


ACTIONS = "kopf_operators_actions_total"


def acting(replica: OperatorProcess) -> bool:
    """The replica holds the Lease and acts (its leader gauge; the metrics endpoint answers in standby too)."""
    return replica.metric("kopf_operators_leader", lease=E2E_LEASE) == 1


def replica(name: str) -> OperatorProcess:
    return OperatorProcess(env=lease_env(), log_name=f"replica-{name}-{uuid.uuid4().hex[:6]}")


def test_two_replicas_only_one_acts_and_the_other_takes_over(
        operator: OperatorProcess, namespace: str, core: Any, custom: Any, lease: str) -> None:
    operator.stop()  # the session's operator runs without a Lease: it would act regardless
    high, low = replica("first"), replica("second")
    try:
        # The first replica takes the Lease and acts; the second stands by, warm, and silent.
        high.start()
        wait_for(lambda: acting(high), timeout=30, what="the first replica to take the Lease")
        low.start()
        assert lease_holder().startswith(socket.gethostname())

        names = [f"ic-{i}" for i in range(3)]
        creations = PodCreations(core, namespace, label_selector=ic.OWNER_LABEL)
        make_ics(custom, namespace, names)
        converge(lambda: ic_problems(custom, core, namespace, dict.fromkeys(names, 1)), timeout=30,
                 what="pods by the active replica")
        # A double actor would show up as a second start, or as an action of the standby's.
        stays(lambda: ic_problems(custom, core, namespace, dict.fromkeys(names, 1)) == [], seconds=2,
              what="one pod and one start per ImmortalContainer")
        assert high.metric(ACTIONS, operator="immortal", action="create-pod") >= len(names)
        # The warm standby indexes the objects, nothing more: it stood by all along, and did nothing.
        assert not acting(low) and low.metric(ACTIONS) == 0, low.metrics()
        # The active replica dies without a goodbye: the other one takes over once its claim expires.
        high.kill()
        killed = time.monotonic()
        wait_for(lambda: acting(low), timeout=30, interval=0.5, what="the remaining replica to take over")
        print(f"takeover {time.monotonic() - killed:.1f}s after SIGKILL of the active replica (lease 15 s)")
        assert delete_counted_pod(custom, core, namespace, names[0])
        make_ics(custom, namespace, ["ic-after"])

        def expected() -> dict[str, int]:  # every pod ever created counts once (see the SIGKILL test)
            return {name: len(creations.uids(ic.pod_name(name))) for name in [*names, "ic-after"]}

        converge(lambda: ic_problems(custom, core, namespace, expected()), timeout=30,
                 what="pods by the replica that took over")
        assert expected()[names[0]] >= 2
        creations.stop()
        # Both new pods (ic-after's, ic-0's replacement) are the new active replica's.
        assert low.metric(ACTIONS, operator="immortal", action="create-pod") >= 2, low.metrics()
        assert low.tracebacks(namespace) == [] and high.tracebacks(namespace) == []
    finally:
        high.stop()
        low.stop()
