"""Progressive rollouts in the re-roller controller, with a fake access layer and plain dict indexes: a
progressive source's change rolls its first wave only; the next waits for it, goes when it is healthy,
and is held (pending annotation, Warnings, gauge) when it failed; a release lets the held roll."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

from kopf_operators.core import background as toolkit
from kopf_operators.core import metrics
from kopf_operators.core.conventions import COPY_SOURCE, DATA_STAMP, REROLLER_PENDING, data_hash, epoch_to_iso
from kopf_operators.reroller import controller as reroller
from kopf_operators.reroller import plans, progressions, settings, views, waves
from kopf_operators.reroller.controller import RerollerController
from kopf_operators.reroller.patches import baseline_annotations
from tests.unit.fake_access import FakeAccess

OPTIONS = settings.Options()
DONE = {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1,
        "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}
STUCK = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1,
         "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                         "message": 'ReplicaSet "a-2" has timed out progressing.'}]}


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolkit.random, "uniform", lambda low, high: 1.0)


def configmap(value: str, **annotations: str) -> views.SourceView:
    return views.source_view("ConfigMap", {"metadata": {"name": "conf", "namespace": "ns", "resourceVersion": "3",
                                                        "annotations": annotations}, "data": {"k": value}})


PROGRESSIVE = {settings.ROLLOUT: "progressive"}


def deployment(name: str, annotations: dict[str, str], status: dict[str, Any] | None = None,
               generation: int = 2) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "ns", "uid": f"{name}-uid", "resourceVersion": "5",
                         "generation": generation, "annotations": {settings.AUTO: "true", **annotations}},
            "spec": {"replicas": 1, "template": {"metadata": {"annotations": {}}, "spec": {"containers": [
                {"name": "c", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}}},
            "status": status or DONE}


def baseline(source: views.SourceView) -> dict[str, str]:
    view = views.workload_view("Deployment", deployment("x", {}), OPTIONS)
    assert view is not None
    lookup = {("ConfigMap", "conf"): source}
    snap = plans.snapshot(views.effective_sources(view, lookup, OPTIONS), lookup, view.key_scopes)
    return baseline_annotations(plans.plan({}, snap), snap)


class Server(FakeAccess):
    """A fake access layer that answers a workload's patch with its body, the patch's annotations merged."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: dict[str, dict[str, Any]] = {}

    async def patch(self, kind: Any, namespace: str | None, name: str, patch: Any, **options: Any) -> Any:
        await super().patch(kind, namespace, name, patch, **options)
        body = copy.deepcopy(self.bodies[name])
        annotations = body["metadata"]["annotations"]
        for key, value in patch["metadata"]["annotations"].items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        self.bodies[name] = body
        return body


class Cluster:
    """The indexes as Kopf would hold them: three users of ConfigMap conf, a first by its wave annotation."""

    def __init__(self, source: views.SourceView, old: views.SourceView, options: settings.Options = OPTIONS) -> None:
        self.indexes: dict[str, Any] = {index_id: {} for index_id in reroller.INDEXES}
        self.access = Server()
        self.rv = 10
        self.ctl = RerollerController(self.access, options, self.indexes)  # type: ignore[arg-type]
        self.source(source)
        for name in ("a", "b", "c"):
            self.workload(deployment(name, {**baseline(old), **({settings.WAVE: "1"} if name == "a" else {})}))

    def source(self, view: views.SourceView) -> None:
        self.indexes[reroller.SOURCE_INDEXES["ConfigMap"]][("ConfigMap", "ns", "conf")] = [view]

    def workload(self, body: dict[str, Any]) -> None:
        """A new version of a workload in its index (each with a newer resourceVersion, as the watch has it)."""
        self.rv += 10
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.access.bodies[body["metadata"]["name"]] = body
        index = self.indexes[reroller.WORKLOAD_INDEXES["Deployment"]]
        view = views.workload_view("Deployment", body, OPTIONS)
        for key, value in views.workload_index_entries(view).items():
            if key[0] == "view":
                index[key] = [value]
            else:
                index.setdefault(key, [])
                index[key] = [k for k in index[key] if k != value] + [value]

    async def look(self, name: str) -> list[tuple[Any, ...]]:
        before = len(self.access.calls)
        await self.ctl.guarded(("Deployment", "ns", name), "test")
        return [call for call in self.access.calls[before:] if call[0] == "patch"]


async def failed_first_wave(options: settings.Options = OPTIONS) -> Cluster:
    """A progressive change whose first wave (a) rolled, and its Deployment gave up."""
    cluster = Cluster(configmap("v2", **PROGRESSIVE), configmap("v1"), options)
    [patch] = await cluster.look("a")
    after = {**baseline(configmap("v2")), settings.WAVE: "1",
             settings.ROLLED: patch[4]["metadata"]["annotations"][settings.ROLLED]}
    cluster.workload(deployment("a", after, STUCK, 3))
    return cluster


def rolled(patch: dict[str, Any]) -> bool:
    return "template" in patch.get("spec", {})


def held_gauge() -> float:
    [family] = metrics.HELD_ROLLOUTS.collect()
    [sample] = family.samples
    return sample.value


def test_the_first_wave_rolls_alone_and_the_next_waits_for_its_rollout() -> None:
    async def scenario() -> None:
        cluster = Cluster(configmap("v2", **PROGRESSIVE), configmap("v1"))
        assert await cluster.look("b") == []  # wave 2 of 3: a has not rolled yet; nothing said
        [patch] = await cluster.look("a")
        assert rolled(patch[4])
        rolled_value = patch[4]["metadata"]["annotations"][settings.ROLLED]
        assert waves.parse_rolled(rolled_value) is not None
        # a rolled, its Deployment still rolling: b still waits.
        after = {**baseline(configmap("v2")), settings.WAVE: "1", settings.ROLLED: rolled_value}
        cluster.workload(deployment("a", after, {**DONE, "observedGeneration": 3, "updatedReplicas": 0}, 3))
        assert await cluster.look("b") == []
        # a finished its rollout: b and c (wave 2 of 2 sizes: 1, 2) roll.
        cluster.workload(deployment("a", after, {**DONE, "observedGeneration": 3}, 3))
        [patch_b] = await cluster.look("b")
        [patch_c] = await cluster.look("c")
        assert rolled(patch_b[4]) and rolled(patch_c[4])
        assert cluster.access.events.count(("Normal", "Rerolled")) == 3
        await cluster.ctl.stop()

    asyncio.run(scenario())


def test_a_failed_first_wave_holds_the_rest_until_released() -> None:
    async def scenario() -> None:
        cluster = await failed_first_wave()
        [held_b] = await cluster.look("b")
        [held_c] = await cluster.look("c")
        for held in (held_b, held_c):
            pending = held[4]["metadata"]["annotations"][REROLLER_PENDING]
            assert pending.startswith("halted: wave 2 of 2, Deployment ns/a of an earlier wave failed")
            assert "spec" not in held[4]
        # A Warning on each held workload, and one on the source for the change.
        assert cluster.access.events.count(("Warning", "RerollHalted")) == 3
        assert held_gauge() == 2
        # Looked at again, still held: nothing more written or said.
        pending = held_b[4]["metadata"]["annotations"][REROLLER_PENDING]
        cluster.workload(deployment("b", {**baseline(configmap("v1")), REROLLER_PENDING: pending}))
        assert await cluster.look("b") == []
        assert cluster.access.events.count(("Warning", "RerollHalted")) == 3
        # An administrator releases this change: b rolls (and its pending annotation goes with the rollout).
        token = waves.change_token("ConfigMap", configmap("v2"), None)
        cluster.source(configmap("v2", **PROGRESSIVE, **{settings.RELEASE: token}))
        [patch_b] = await cluster.look("b")
        assert rolled(patch_b[4]) and patch_b[4]["metadata"]["annotations"][REROLLER_PENDING] is None
        assert held_gauge() == 1  # c not looked at again yet
        await cluster.ctl.stop()

    asyncio.run(scenario())


def test_a_wave_past_its_deadline_fails_and_an_immediate_source_is_not_gated() -> None:
    async def scenario() -> None:
        cluster = Cluster(configmap("v2", **PROGRESSIVE, **{settings.WAVE_DEADLINE: "1m"}), configmap("v1"))
        long_ago = waves.rolled_value(baseline(configmap("v2"))[settings.OBSERVED_HASH], time.time() - 61)
        after = {**baseline(configmap("v2")), settings.WAVE: "1", settings.ROLLED: long_ago}
        cluster.workload(deployment("a", after, {**DONE, "observedGeneration": 3, "availableReplicas": 0}, 3))
        [held] = await cluster.look("b")
        assert "failed" in held[4]["metadata"]["annotations"][REROLLER_PENDING]
        # The same change on a source that rolls immediately: every user rolls at once.
        other = Cluster(configmap("v2"), configmap("v1"))
        for name in ("b", "c"):
            [patch] = await other.look(name)
            assert rolled(patch[4]) and settings.ROLLED not in patch[4]["metadata"]["annotations"]
        await cluster.ctl.stop()
        await other.ctl.stop()

    asyncio.run(scenario())


def test_an_unreadable_setting_is_said_once_and_the_safe_value_used() -> None:
    async def scenario() -> None:
        cluster = Cluster(configmap("v2", **{settings.ROLLOUT: "progresive", settings.FIRST_WAVE: "0"}),
                          configmap("v1"))
        assert await cluster.look("b") == []  # read as progressive, first wave 1: b waits for a
        assert await cluster.look("c") == []
        assert cluster.access.events.count(("Warning", "RolloutSettingInvalid")) == 1
        await cluster.ctl.stop()

    asyncio.run(scenario())


def agent(until: float) -> dict[str, Any]:
    """A ChaosAgent as listed: its status says it disrupts Deployment ns/a until then."""
    return {"metadata": {"name": "smoke"}, "status": {"disrupting": [
        {"kind": "Deployment", "namespace": "ns", "name": "a", "until": epoch_to_iso(until)}]}}


def test_a_first_wave_failing_under_chaos_makes_the_rest_wait_not_halt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a halt the ChaosAgents are listed: one disrupts the failed workload now, so the later waves
    wait, said once on the source; listed again once the disruption is over, it still fails: held."""
    clock = [1000.0]
    monkeypatch.setattr(progressions.time, "monotonic", lambda: clock[0])

    async def scenario() -> None:
        cluster = await failed_first_wave(settings.Options(chaos_aware=True))
        cluster.access.answer("list", [agent(time.time() + 60)])
        assert await cluster.look("b") == [] and await cluster.look("c") == []
        assert cluster.access.events.count(("Normal", "RerollWaitingForChaos")) == 1
        assert ("Warning", "RerollHalted") not in cluster.access.events
        assert len(cluster.access.made("list")) == 1  # listed once, not per workload
        clock[0] += progressions.CHAOS_LIST_SECONDS
        cluster.access.answer("list", [agent(time.time() - 1)])  # the disruption is over
        [held] = await cluster.look("b")
        assert held[4]["metadata"]["annotations"][REROLLER_PENDING].startswith("halted: ")
        await cluster.ctl.stop()

    asyncio.run(scenario())


def test_without_chaos_awareness_no_agent_is_asked() -> None:
    async def scenario() -> None:
        cluster = await failed_first_wave()
        [held] = await cluster.look("b")
        assert held[4]["metadata"]["annotations"][REROLLER_PENDING].startswith("halted: ")
        assert cluster.access.made("list") == []
        await cluster.ctl.stop()

    asyncio.run(scenario())


def test_an_event_of_the_awaited_workload_wakes_the_waiting_ones_at_once() -> None:
    """b waits for a (looked at again in 5 s); an event of a brings b's look forward to WAKE_SECONDS."""
    async def scenario() -> None:
        cluster = Cluster(configmap("v2", **PROGRESSIVE), configmap("v1"))
        b = ("Deployment", "ns", "b")
        assert await cluster.look("b") == []
        assert cluster.ctl.passes.timers.due_in(b) == pytest.approx(progressions.WAVE_LOOK_SECONDS, abs=0.5)
        a = deployment("a", {**baseline(configmap("v1")), settings.WAVE: "1"})
        await cluster.ctl.workload_event(("Deployment", "ns", "a"), "MODIFIED", a)
        woken = cluster.ctl.passes.timers.due_in(b)
        assert woken is not None and woken <= progressions.WAKE_SECONDS
        await cluster.ctl.stop()

    asyncio.run(scenario())


def test_a_copys_users_follow_its_sources_rollout_settings() -> None:
    """A Copyrator copy (stamped, naming its source) carries none of the project's annotations; its
    users roll in waves when the source it copies is progressive, and at once when it is not."""
    async def scenario(origin_annotations: dict[str, str]) -> list[Any]:
        copy = {"metadata": {"name": "conf", "namespace": "ns", "resourceVersion": "3", "annotations": {
            DATA_STAMP: data_hash("ConfigMap", {"data": {"k": "v2"}}), COPY_SOURCE: "team/conf"}},
            "data": {"k": "v2"}}
        cluster = Cluster(views.source_view("ConfigMap", copy), configmap("v1"))
        origin = views.source_view("ConfigMap", {"metadata": {"name": "conf", "namespace": "team",
                                                               "annotations": origin_annotations},
                                                  "data": {"k": "v2"}})
        cluster.indexes[reroller.SOURCE_INDEXES["ConfigMap"]][("ConfigMap", "team", "conf")] = [origin]
        written = await cluster.look("b")
        await cluster.ctl.stop()
        return written

    assert asyncio.run(scenario(PROGRESSIVE)) == []  # wave 2: waits for a
    [patch] = asyncio.run(scenario({}))  # the source rolls at once: so does its copy
    assert rolled(patch[4])
