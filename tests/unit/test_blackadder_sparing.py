"""Blackadder spares workloads in a rollout (pure decisions, and a cycle with a fake access layer), and
keeps ``status.disrupting``, what its recent cycles disrupted."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pykube
import pytest

from kopf_operators.blackadder import sparing
from kopf_operators.blackadder.controller import BlackadderController
from kopf_operators.blackadder.decisions import Inventory, revert_status
from kopf_operators.blackadder.settings import AgentSettings, Options
from kopf_operators.blackadder.targets import DeploymentRef, PodRef, pod_ref
from kopf_operators.core.conventions import REROLLER_PENDING, Config, epoch_to_iso
from tests.unit.fake_access import FakeAccess

NOW = 1_800_000_000.0


def deployment(name: str, *, rolling: bool = False, pending: bool = False, namespace: str = "shop") -> dict[str, Any]:
    return {"kind": "Deployment",
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                         "generation": 2, "annotations": {REROLLER_PENDING: "{}"} if pending else {}},
            "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": name}}}},
            "status": {"observedGeneration": 2, "replicas": 3 if rolling else 2, "updatedReplicas": 1 if rolling else 2,
                       "availableReplicas": 2}}


def pod(workload: str, index: int, namespace: str = "shop") -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {
        "namespace": namespace, "name": f"{workload}-abc12-{index}", "uid": f"uid-{workload}-{index}",
        "labels": {"app": workload, "pod-template-hash": "abc12"}, "creationTimestamp": "2020-01-01T00:00:00Z",
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{workload}-abc12", "uid": f"rs-{workload}",
                             "controller": True}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


# --- the pure decisions -----------------------------------------------------------------------------


def test_a_pods_workload_is_its_replicasets_deployment_without_a_read() -> None:
    assert sparing.pod_workload(pod_ref(pod("web", 0))) == ("Deployment", "shop", "web")
    assert sparing.pod_workload(PodRef("shop", "lonely", "u")) is None  # a bare Pod has no rollout
    assert sparing.pod_workload(PodRef("shop", "db-0", "u", workload_name="StatefulSet/shop/db")) == (
        "StatefulSet", "shop", "db")
    assert sparing.pod_workload(PodRef("shop", "j", "u", workload_name="Job/shop/j")) is None


def test_a_workload_is_busy_in_a_rollout_or_with_a_pending_change() -> None:
    assert sparing.busy("Deployment", deployment("calm")) is None
    assert sparing.busy("Deployment", deployment("web", rolling=True)) == "in a rollout"
    assert sparing.busy("Deployment", deployment("web", pending=True)) == "a change is pending"
    listed = [("Deployment", deployment("calm")), ("Deployment", deployment("web", rolling=True))]
    assert sparing.busy_workloads(listed) == {("Deployment", "shop", "web"): "in a rollout"}


def test_a_new_workloads_first_rollout_and_a_scale_are_no_rollout_to_spare() -> None:
    """Only pods of an older template left make a rollout: not a Deployment just created (its pods
    not ready yet), nor one scaled up (Blackadder's own doubling is one), nor a StatefulSet's first."""
    new = deployment("new")
    new["metadata"]["generation"] = 1
    new["status"] = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 0}
    assert sparing.busy("Deployment", new) is None
    new["status"] = {}  # its controller has not seen it yet
    assert sparing.busy("Deployment", new) is None
    scaled = deployment("scaled")
    scaled["spec"]["replicas"] = 4
    scaled["status"] = {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 4, "availableReplicas": 2}
    assert sparing.busy("Deployment", scaled) is None
    sts: dict[str, Any] = {"metadata": {"generation": 1}, "spec": {"replicas": 2},
           "status": {"observedGeneration": 1, "currentRevision": "db-1", "updateRevision": "db-1", "replicas": 2}}
    assert sparing.busy("StatefulSet", sts) is None
    sts["status"]["updateRevision"] = "db-2"  # a changed template, its pods not replaced yet
    assert sparing.busy("StatefulSet", sts) == "in a rollout"


def test_sparing_drops_the_pods_and_deployments_of_busy_workloads_and_names_each_once() -> None:
    pods = tuple(pod_ref(pod(w, i)) for w in ("web", "calm") for i in range(2))
    deps = (DeploymentRef("shop", "web", "uid-web", 2), DeploymentRef("shop", "calm", "uid-calm", 2))
    spared = sparing.spare(Inventory(pods, deps), {("Deployment", "shop", "web"): "in a rollout"})
    assert [p.name for p in spared.pods] == ["calm-abc12-0", "calm-abc12-1"]
    assert [d.name for d in spared.deployments] == ["calm"]
    assert spared.spared == ("Deployment/shop/web (in a rollout)",)
    assert sparing.spare(Inventory(pods, deps), {}).spared == ()


def test_only_the_workloads_the_cycle_did_not_list_are_needed() -> None:
    pods = [pod_ref(pod("web", 0)), pod_ref(pod("calm", 0, "other")), PodRef("shop", "bare", "u")]
    assert sparing.needed(pods, [("Deployment", "shop", "web")]) == {"Deployment": {"other"}}
    assert sparing.needed(pods, [("Deployment", "shop", "web"), ("Deployment", "other", "calm")]) == {}


def test_disrupting_keeps_what_still_runs_adds_this_cycles_and_caps_the_oldest() -> None:
    previous = [{"kind": "Deployment", "namespace": "shop", "name": "old", "until": epoch_to_iso(NOW - 1)},
                {"kind": "Deployment", "namespace": "shop", "name": "web", "until": epoch_to_iso(NOW + 60)},
                {"kind": "Deployment", "namespace": "shop", "name": "db", "until": epoch_to_iso(NOW + 90)},
                "garbage", {"kind": "", "name": "x", "until": epoch_to_iso(NOW + 60)}]
    now_list = sparing.disrupting(previous, [("Deployment", "shop", "web"), ("ConfigMap", "shop", "cfg")], NOW, 600)
    assert [(e["name"], e["until"]) for e in now_list] == [
        ("db", epoch_to_iso(NOW + 90)), ("web", epoch_to_iso(NOW + 600)), ("cfg", epoch_to_iso(NOW + 600))]
    many = [("Deployment", "shop", f"d{i}") for i in range(150)]
    capped = sparing.disrupting(None, many, NOW, 600)
    assert len(capped) == sparing.DISRUPTING_CAP and capped[-1]["name"] == "d149" and capped[0]["name"] == "d50"


def test_the_disruption_window_is_two_pauses_and_at_least_five_minutes() -> None:
    assert sparing.disruption_seconds(30) == 300
    assert sparing.disruption_seconds(600) == 1200


def test_a_revert_clears_disrupting() -> None:
    summary = {"failed": [], "processed": 0}
    assert revert_status(None, AgentSettings(), 1, summary)["disrupting"] == []


# --- a cycle: the listings it makes, what it spares, its status -----------------------------------------


def cycle(monkeypatch: pytest.MonkeyPatch, options: Options, cancer: bool = True) -> tuple[FakeAccess, list[str]]:
    """One chaos cycle (tantrum and cancer at eagerness 100) over two equal Deployments, one of them
    in the middle of its rollout; returns the access layer and the kinds it listed."""
    access = FakeAccess()
    ctl = BlackadderController(access, Config(operator_namespace="ops"), options,  # type: ignore[arg-type]
                               {"shop": [{"labels": {}, "terminating": False}]}, {})
    listed: list[str] = []
    objects = {pykube.Pod: [pod(w, i) for w in ("web", "calm") for i in range(2)],
               pykube.Deployment: [deployment("web", rolling=True), deployment("calm")]}

    def list_sync(kind: Any, namespaces: Any, field_selector: str, label_selector: str) -> list[dict[str, Any]]:
        listed.append(kind.kind)
        return objects.get(kind, [])

    monkeypatch.setattr(ctl.chaos, "_list_sync", list_sync)
    body: dict[str, Any] = {"kind": "ChaosAgent", "metadata": {"name": "a", "uid": "uid-a", "generation": 1},
                            "spec": {"tantrumMode": True, "cancerMode": cancer, "eagerness": 100, "tolerance": 0,
                                     "allowSingleReplica": True, "maxKillsPerCycle": 10,
                                     "targetNamespaces": ["shop"]}}
    asyncio.run(ctl.cycle(body, lambda: False, logging.getLogger("test")))
    return access, listed


def test_a_cycle_spares_the_deployment_in_a_rollout_and_says_so_in_its_status(monkeypatch: pytest.MonkeyPatch) -> None:
    access, listed = cycle(monkeypatch, Options())
    assert sorted(call[3] for call in access.made("delete") if call[1] == "Pod") == ["calm-abc12-0", "calm-abc12-1"]
    assert [call[3] for call in access.made("patch") if call[1] == "Deployment"] == ["calm"]
    assert listed == ["Pod", "Deployment"]  # the pods' Deployments were listed already: no extra listing
    status = access.made("patch_status")[-1][4]
    assert status["lastCycle"]["sparedRollouts"] == 1
    assert {(e["kind"], e["name"]) for e in status["disrupting"]} == {("Deployment", "calm")}
    assert access.events.count(("Normal", "RolloutsSpared")) == 1  # said: none were spared before


def test_without_cancer_the_pods_workloads_are_listed_once_per_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    access, listed = cycle(monkeypatch, Options(), cancer=False)
    assert listed == ["Pod", "Deployment"]  # one listing of Deployments, none of StatefulSets or DaemonSets
    assert sorted(call[3] for call in access.made("delete") if call[1] == "Pod") == ["calm-abc12-0", "calm-abc12-1"]


def test_without_spare_rollouts_the_cycle_acts_on_both(monkeypatch: pytest.MonkeyPatch) -> None:
    access, _ = cycle(monkeypatch, Options(spare_rollouts=False))
    assert len([call for call in access.made("delete") if call[1] == "Pod"]) == 4
    assert sorted(call[3] for call in access.made("patch") if call[1] == "Deployment") == ["calm", "web"]
    assert access.made("patch_status")[-1][4]["lastCycle"]["sparedRollouts"] == 0


def test_settings_read_spare_rollouts_from_the_environment() -> None:
    assert Options.from_env({}).spare_rollouts
    assert not Options.from_env({"CHAOS_SPARE_ROLLOUTS": "false"}).spare_rollouts
