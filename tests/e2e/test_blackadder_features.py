# ruff: noqa: F811  (the fixtures imported from blackadder_helpers are parameters here)
"""Blackadder, issue #23: chaoskube's remaining filters (owner kinds, pod-name patterns, excluded
dates, the grace period) and per-target frequency (blackadder.io/mtbf labels). Real local API server,
KWOK-backed pods; every agent is confined to its test's namespace.
"""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from kopf_operators.blackadder import settings
from tests.e2e.blackadder_helpers import (  # noqa: F401 (fixtures)
    GREEDY,
    PAUSE,
    Agents,
    agents,
    assert_field_rejected,
    condition,
    events,
    live_pods,
    make_pod,
    make_pods,
    next_cycles,
    replicas,
)
from tests.kube import stays, wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import REPO

HOLD = "kopf-operators.dev/test-hold"


def make_workload(apps: kubernetes.client.AppsV1Api, ns: str, name: str, replicas: int,
                  labels: dict[str, str] | None = None) -> None:
    """A Deployment whose pod template carries ``labels`` (as kube-monkey's users label theirs)."""
    selector = {"app": name}
    apps.create_namespaced_deployment(ns, {
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": {**selector, **(labels or {})}},
                              "spec": {"containers": [{"name": "c", "image": "test"}]}}}})


def pods_of(core: kubernetes.client.CoreV1Api, ns: str, prefix: str) -> dict[str, str]:
    return {k: v for k, v in live_pods(core, ns).items() if k.startswith(prefix)}


def killed(core: kubernetes.client.CoreV1Api, ns: str, reason: str = "PodKilled") -> set[str]:
    """The names of the Pods the agent reported killing (or would kill, in dry-run) in ``ns``."""
    return {e.involved_object.name for e in events(core, reason, namespace=ns) if e.involved_object.kind == "Pod"}


@pytest.fixture
def held_pods(core: kubernetes.client.CoreV1Api) -> Iterator[list[tuple[str, str]]]:
    """Pods kept Terminating by a finalizer, released at the end (the namespace can then go)."""
    held: list[tuple[str, str]] = []
    yield held
    for ns, name in held:
        try:
            core.patch_namespaced_pod(name, ns, {"metadata": {"finalizers": None}})
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise


# --- 1. chaoskube's filters ---------------------------------------------------------------------------


def test_owner_kind_and_pod_name_filters_choose_the_victims(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api) -> None:
    make_workload(apps, namespace, "web", 2)
    make_workload(apps, namespace, "web-canary", 2)
    make_workload(apps, namespace, "api", 2)
    make_pod(core, namespace, "web-bare")
    wait_for(lambda: len(live_pods(core, namespace)) == 7, timeout=60, what="all pods")
    spared = {k: v for k, v in live_pods(core, namespace).items() if not k.startswith("web-") or
              k.startswith(("web-canary", "web-bare"))}
    name = agents.create({**GREEDY, "tantrumMode": True, "targetNamespaces": [namespace],
                          "ownerKinds": {"exclude": ["None"]},  # no bare pods
                          "podNames": {"include": "^web", "exclude": "canary"}})
    wait_for(lambda: len(killed(core, namespace)) >= 2, timeout=30, what="web's pods killed")
    next_cycles(agents, name, 2)
    assert all(n.startswith("web-") and "canary" not in n and n != "web-bare" for n in killed(core, namespace))
    assert {k: v for k, v in live_pods(core, namespace).items() if k in spared} == spared

    # Only ReplicaSets' Pods, and excluding them instead: nothing is a candidate any more.
    generation = agents.patch_spec(name, {"ownerKinds": {"include": ["ReplicaSet"], "exclude": ["ReplicaSet"]}})
    wait_for(lambda: agents.status(name).get("observedGeneration") == generation, timeout=20, what="edit seen")
    assert agents.status(name)["lastCycle"]["candidates"]["pods"] == 0


def test_invalid_pod_name_pattern_stalls_with_an_event_until_fixed(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    make_pod(core, namespace, "victim")
    pods = live_pods(core, namespace)
    name = agents.create({**GREEDY, "tantrumMode": True, "targetNamespaces": [namespace],
                          "podNames": {"include": "victim-(["}})
    wait_for(lambda: condition(agents.status(name), "Stalled").get("status") == "True", timeout=20,
             what="Stalled for the invalid regex")
    status = agents.status(name)
    assert condition(status, "Ready")["reason"] == "InvalidSpec" and status["state"] == "Failed"
    assert "podNames.include 'victim-([' is not a valid regular expression" in condition(status, "Ready")["message"]
    wait_for(lambda: events(core, "InvalidSpec", agent=name), timeout=10, what="an InvalidSpec Event")
    assert kubectl("wait", "--for=condition=Stalled", f"chaosagent/{name}", "--timeout=5s").returncode == 0
    assert live_pods(core, namespace) == pods

    agents.patch_spec(name, {"podNames": {"include": "^victim$"}})
    wait_for(lambda: live_pods(core, namespace) == {}, timeout=20, what="the fixed agent acting")
    wait_for(lambda: condition(agents.status(name), "Stalled")["status"] == "False", timeout=10,
             what="Stalled cleared")


def test_excluded_date_idles_the_agent_all_day(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    make_pods(core, namespace, "pod", 2)
    pods = live_pods(core, namespace)
    # Today (and tomorrow, should the test run over midnight) in the agent's zone: once, and every year.
    zone = "Pacific/Kiritimati"  # UTC+14: not the machine's day, proving the zone is used
    today = datetime.datetime.now(zoneinfo.ZoneInfo(zone)).date()
    tomorrow = today + datetime.timedelta(days=1)
    name = agents.create({**GREEDY, "tantrumMode": True, "targetNamespaces": [namespace], "timeZone": zone,
                          "excludedDates": [today.isoformat(), tomorrow.isoformat()[5:]]})
    wait_for(lambda: agents.status(name).get("state") == "Idle", timeout=20, what="idle on the excluded date")
    ready = condition(agents.status(name), "Ready")
    assert ready["status"] == "True" and ready["reason"] == "ExcludedDate" and zone in ready["message"]
    stays(lambda: live_pods(core, namespace) == pods, seconds=PAUSE + 1, what="no chaos on a holiday")

    agents.patch_spec(name, {"excludedDates": ["01-01"] if today.strftime("%m-%d") != "01-01" else ["01-02"]})
    wait_for(lambda: live_pods(core, namespace) == {}, timeout=20, what="chaos on an ordinary day")
    wait_for(lambda: agents.status(name)["state"] == "Active", timeout=10, what="state Active")


@pytest.mark.parametrize("evict", [False, True], ids=["delete", "evict"])
def test_grace_period_reaches_the_deletion(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
        held_pods: list[tuple[str, str]], evict: bool) -> None:
    # Bound to a node KWOK does not run, and held by a finalizer: the Pod stays Terminating with the
    # grace period the deletion asked for (KWOK would otherwise remove it at once).
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "slow", "finalizers": [HOLD]},
        "spec": {"nodeName": "no-such-node", "containers": [{"name": "c", "image": "test"}]}})
    held_pods.append((namespace, "slow"))
    agents.create({**GREEDY, "tantrumMode": True, "targetNamespaces": [namespace], "gracePeriodSeconds": 7,
                   "evictPods": evict})
    pod = wait_for(lambda: (p := core.read_namespaced_pod("slow", namespace)).metadata.deletion_timestamp and p,
                   timeout=20, what="the pod killed")
    assert pod.metadata.deletion_grace_period_seconds == 7
    # The Event is posted after the deletion (Kopf's event queue): waited for, not read at once.
    wait_for(lambda: any("grace period 7s" in e.message for e in events(core, "PodKilled", namespace=namespace)),
             timeout=10, what="the PodKilled Event naming the grace period")


# --- 2. per-target frequency ------------------------------------------------------------------------


def test_workload_mtbf_labels_beat_eagerness_and_honour_dry_run(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api) -> None:
    # "hot" fails on every cycle (1 s MTBF over a 5 s cycle: p > 0.99); "plain" follows eagerness 0;
    # "odd" has a label that says nothing readable: left alone and reported.
    make_workload(apps, namespace, "hot", 2, {settings.MTBF_LABEL: "1s", settings.KILL_MODE_LABEL: "fixed",
                                              settings.KILL_VALUE_LABEL: "1"})
    make_workload(apps, namespace, "plain", 2)
    make_workload(apps, namespace, "odd", 2, {settings.MTBF_LABEL: "often"})
    wait_for(lambda: len(live_pods(core, namespace)) == 6, timeout=60, what="all pods")
    before = live_pods(core, namespace)
    name = agents.create({**GREEDY, "eagerness": 0, "tantrumMode": True, "targetNamespaces": [namespace],
                          "dryRun": True, "seed": 5})
    wait_for(lambda: killed(core, namespace, "WouldKillPod"), timeout=20, what="a would-be kill")
    assert all(n.startswith("hot-") for n in killed(core, namespace, "WouldKillPod"))
    assert live_pods(core, namespace) == before  # dry-run: nothing happened
    invalid = agents.status(name)["lastCycle"]["invalidFrequencyLabels"]
    assert len(invalid) == 1 and f"{namespace}/odd-" in invalid[0] and "blackadder.io/mtbf='often'" in invalid[0]
    assert "unreadable blackadder.io/mtbf labels" in condition(agents.status(name), "Ready")["message"]

    agents.patch_spec(name, {"dryRun": False})
    wait_for(lambda: len(killed(core, namespace)) >= 2, timeout=30, what="hot's pods killed, one per cycle")
    assert all(n.startswith("hot-") for n in killed(core, namespace))
    spared = {k: v for k, v in before.items() if not k.startswith("hot-")}
    assert {k: v for k, v in live_pods(core, namespace).items() if k in spared} == spared

    # Ignore: the labels are not read, eagerness 0 kills nothing; paused stops the labelled ones too.
    generation = agents.patch_spec(name, {"targetFrequency": "Ignore"})
    wait_for(lambda: agents.status(name).get("observedGeneration") == generation, timeout=20, what="edit seen")
    count = len(killed(core, namespace))
    next_cycles(agents, name)
    assert len(killed(core, namespace)) == count and agents.status(name)["lastCycle"]["tantrum"] == 0
    agents.patch_spec(name, {"targetFrequency": "Honour", "paused": True})
    wait_for(lambda: agents.status(name).get("state") == "Paused", timeout=20, what="paused")
    stays(lambda: len(killed(core, namespace)) == count, seconds=PAUSE + 1, what="no kill while paused")


def test_kill_all_is_still_capped_by_the_agent(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api) -> None:
    make_workload(apps, namespace, "all", 4, {settings.MTBF_LABEL: "1s", settings.KILL_MODE_LABEL: "kill-all"})
    wait_for(lambda: len(live_pods(core, namespace)) == 4, timeout=60, what="all pods")
    name = agents.create({"eagerness": 0, "pauseDuration": 30, "tantrumMode": True, "maxKillsPerCycle": 2,
                          "targetNamespaces": [namespace], "seed": 1})
    wait_for(lambda: agents.status(name).get("cycle") == 1, timeout=20, what="the first cycle")
    # kill-all, capped at maxKillsPerCycle (the last-ready-replica guard alone would allow 3)
    assert agents.status(name)["lastCycle"]["tantrum"] == 2
    assert len(killed(core, namespace)) == 2


def test_examples_of_issue_23_are_accepted(crds: Any) -> None:
    path = REPO / "manifests" / "examples" / "blackadder-filtered.yaml"
    result = kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("field", "needle"), [
    ("ownerKinds: {exclude: [daemonset]}", "spec.ownerKinds.exclude[0]: Invalid value"),
    ("podNames: {include: 42}", "spec.podNames.include: Invalid value: \"integer\""),
    ('excludedDates: ["24.12."]', "spec.excludedDates[0]: Invalid value"),
    ('excludedDates: ["2026-13-01"]', "spec.excludedDates[0]: Invalid value"),
    ("gracePeriodSeconds: -1", "should be greater than or equal to 0"),
    ("gracePeriodSeconds: 86400", "should be less than or equal to 3600"),
    ("targetFrequency: Sometimes", 'supported values: "Honour", "Ignore"'),
])
def test_bad_filter_fields_are_rejected_with_a_readable_message(crds: Any, field: str, needle: str) -> None:
    assert_field_rejected("bad-filter", field, needle)
