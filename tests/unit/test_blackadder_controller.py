"""The Blackadder controller with a fake access layer and plain dict indexes: its inventory from index
state, its pykube-ng listings under the access layer's error model, and its stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pykube
import pytest
import requests

from kopf_operators.blackadder.controller import BlackadderController
from kopf_operators.blackadder.settings import Options, settings_from_spec
from kopf_operators.core import access as access_module
from kopf_operators.core import api, metrics
from kopf_operators.core.conventions import Config
from tests.unit.fake_access import FakeAccess

NOW = 1_800_000_000.0


def configmap(namespace: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}",
                                              "labels": labels or {}}, "data": {"k": "v"}}


def controller(access: FakeAccess, namespaces: dict[str, Any],
               sources: dict[Any, Any] | None = None) -> BlackadderController:
    return BlackadderController(access, Config(operator_namespace="ops"), Options(),  # type: ignore[arg-type]
                                namespaces, sources or {})


def http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    response.reason = "Service Unavailable" if status == 503 else "Forbidden"
    return requests.HTTPError(response=response)


def test_the_inventory_skips_terminating_namespaces_and_copyrators_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    namespaces = {"a": [{"labels": {}, "terminating": False}], "b": [{"labels": {}, "terminating": True}],
                  "ops": [{"labels": {}, "terminating": False}]}
    # A Copyrator rule copies the ConfigMaps labelled app=shared out of namespace a.
    sources = {("a", "rule"): [[{"namespace": "a", "selector": {"app": "shared"}}]]}
    access = FakeAccess()
    ctl = controller(access, namespaces, sources)
    listed = [configmap("a", "mine"), configmap("a", "shared", {"app": "shared"}), configmap("b", "going")]
    monkeypatch.setattr(ctl.chaos, "_list_sync", lambda *args: listed)
    settings = settings_from_spec({"ipsumMode": True, "eagerness": 1, "targetNamespaces": ["a", "b"]})
    inventory = asyncio.run(ctl.chaos.inventory(settings, NOW))
    assert [(cm.namespace, cm.name) for cm in inventory.configmaps] == [("a", "mine")]
    assert access.made("call")  # the listing went through the access layer


def test_a_listing_is_retried_by_the_access_layer_when_the_server_fails_transiently(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access_module, "BACKOFF_SECONDS", 0.0)
    layer = access_module.Access(client=None)
    answers: list[Any] = [http_error(503), pykube.exceptions.HTTPError(503, "unavailable"), ["listed"]]

    def listing() -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    before = metrics.API_ERRORS.labels(status="503")._value.get()
    assert asyncio.run(layer.call(listing)) == ["listed"]
    assert metrics.API_ERRORS.labels(status="503")._value.get() - before == 2  # each failed attempt counted


def test_a_refused_listing_is_an_api_error_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access_module, "BACKOFF_SECONDS", 0.0)
    layer = access_module.Access(client=None)
    attempts = 0

    def listing() -> list[str]:
        nonlocal attempts
        attempts += 1
        raise http_error(403)

    with pytest.raises(api.ApiError) as raised:
        asyncio.run(layer.call(listing))
    assert raised.value.status == 403 and attempts == 1


def test_stop_cancels_webhook_notifications_in_flight_and_waits_for_them() -> None:
    class SlowSecretRead(FakeAccess):
        async def read(self, kind: api.Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
            self.calls.append(("read", kind.kind, namespace, name))
            await asyncio.sleep(60)  # the webhook's Secret read hangs
            return None

    async def scenario() -> tuple[int, list[tuple[str, str]]]:
        access = SlowSecretRead()
        ctl = controller(access, {})
        body = {"metadata": {"name": "agent", "uid": "agent-uid"}}
        entries: list[Mapping[str, Any]] = [{"cycle": 1, "at": "t", "action": "pod-killed"}]
        ctl.notes.webhook(body, "hook", entries, logging.getLogger("test-blackadder"))
        while not access.made("read"):
            await asyncio.sleep(0)
        await ctl.stop()
        return len(ctl.background.tasks), access.events

    in_flight, events = asyncio.run(scenario())
    assert in_flight == 0
    assert events == []  # cancelled before it could report anything


def test_a_stalled_status_gets_its_event_even_when_the_live_body_catches_up_during_the_write() -> None:
    """Kopf updates a daemon's body in place: the event of our own status patch can land in it while
    the patch is awaited. The Stalled Event still follows the transition (CI once lost it this way)."""
    body: dict[str, Any] = {"apiVersion": "blackadder.io/v1beta1", "kind": "ChaosAgent",
                            "metadata": {"name": "lost", "uid": "uid-lost", "generation": 1}, "spec": {}}
    stalled = {"conditions": [{"type": "Stalled", "status": "True", "reason": "InvalidSpec", "message": "Mars"}]}

    def kopf_updates_the_body(default: dict[str, Any]) -> dict[str, Any]:
        body["status"] = stalled
        return default

    access = FakeAccess()
    access.answer("patch_status", kopf_updates_the_body)
    asyncio.run(controller(access, {}).notes.patch_status(body["metadata"], stalled, body))
    assert ("Warning", "Stalled") in access.events


def agent(name: str = "agent") -> dict[str, Any]:
    return {"apiVersion": "blackadder.io/v1beta1", "kind": "ChaosAgent",
            "metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "spec": {"paused": True}}


def test_a_crashing_cycle_is_counted_and_logged_and_the_loop_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    ctl = controller(FakeAccess(), {})
    cycles = 0

    async def crash(*args: Any, **kwargs: Any) -> None:
        nonlocal cycles
        cycles += 1
        raise KeyError("a bug")

    async def no_delay(body: Any) -> float:
        return 0.0

    async def sleep(body: Any, seconds: float, ran_with: Any, wait: Any) -> bool:  # True: stopped meanwhile
        return cycles >= 2

    monkeypatch.setattr(ctl, "cycle", crash)
    monkeypatch.setattr(ctl, "initial_delay", no_delay)
    monkeypatch.setattr(ctl, "_sleep", sleep)
    crashes = metrics.ERRORS.labels(operator="blackadder", kind="cycle-crash")
    before = crashes._value.get()
    log = logging.getLogger("test-blackadder-agent")
    with caplog.at_level(logging.ERROR, logger="test-blackadder-agent"):
        asyncio.run(ctl.agent_loop(agent(), lambda: False, asyncio.sleep, log))
    assert cycles == 2  # the crash did not end the loop
    assert crashes._value.get() - before == 2
    lines = [r for r in caplog.records if r.name == "test-blackadder-agent"]
    assert [r.getMessage() for r in lines] == ["cycle crashed: 'a bug'"] * 2 and all(r.exc_info for r in lines)


def test_the_ledger_is_read_once_then_our_own_write_is_the_newest_and_delete_forgets_it() -> None:
    async def scenario() -> tuple[FakeAccess, BlackadderController, list[str]]:
        access = FakeAccess()
        ctl = controller(access, {})
        body = agent()
        body["spec"] = {"paused": True, "revertOnDelete": True}
        await ctl.cycle(body, lambda: False, logging.getLogger("test"))
        await ctl.cycle(body, lambda: False, logging.getLogger("test"))
        handle = await ctl.ledgers.get("agent", "uid-agent")
        await ctl.ledgers.save(handle)  # created: the answer's version is ours now
        versions = [handle.resource_version]
        await ctl.ledgers.save(handle)  # replaced with the version of our own last write
        versions.append(handle.resource_version)
        assert [uid for uid, _ in ctl.ledgers.handles.held()] == ["uid-agent"]
        await ctl.revert_on_delete(body, logging.getLogger("test"))
        return access, ctl, versions

    access, ctl, versions = asyncio.run(scenario())
    assert len(access.made("read")) == 1  # two cycles and a delete: one read of the ledger
    assert versions == ["100", "100"] and access.made("create") and access.made("replace")
    assert access.made("delete")  # the ledger went with the agent
    assert ctl.ledgers.handles.held() == []  # and so did everything kept for it


def test_a_broken_check_halts_the_run_and_reverts_what_the_agent_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    namespaces = {"shop": [{"labels": {}, "terminating": False}], "ops": [{"labels": {}, "terminating": False}]}
    access = FakeAccess()
    ctl = controller(access, namespaces)
    victim = {"kind": "Deployment", "metadata": {"namespace": "shop", "name": "victim", "uid": "uid-victim",
                                                 "resourceVersion": "1"},
              "spec": {"replicas": 2, "template": {"metadata": {"labels": {}}}},
              "status": {"updatedReplicas": 2, "availableReplicas": 2}}  # rolled out: not spared
    monkeypatch.setattr(ctl.chaos, "_list_sync", lambda *args: [victim])
    body: dict[str, Any] = {"kind": "ChaosAgent", "metadata": {"name": "gd", "uid": "uid-gd", "generation": 1},
                            "spec": {"cancerMode": True, "eagerness": 100, "targetNamespaces": ["shop"],
                                     "steadyState": {"failureThreshold": 1, "checks": [{"name": "web", "workload": {
                                         "kind": "Deployment", "namespace": "shop", "name": "web"}}]}}}
    web_ok = {"spec": {"replicas": 1}, "status": {"availableReplicas": 1}}
    scaled = {"metadata": {"uid": "uid-victim"}, "spec": {"replicas": 4}}
    access.answer("read", None, web_ok, None, scaled)  # ledger; check passes; check fails; revert's read
    log = logging.getLogger("test")
    asyncio.run(ctl.cycle(body, lambda: False, log))
    assert access.made("patch")[0][4][1] == {"op": "replace", "path": "/spec/replicas", "value": 4}
    asyncio.run(ctl.cycle(body, lambda: False, log))
    assert access.made("patch")[-1][4][1] == {"op": "replace", "path": "/spec/replicas", "value": 2}  # reverted
    status = access.made("patch_status")[-1][4]
    assert status["state"] == "Halted" and status["run"]["reason"] == "SteadyStateBroken"
    assert status["run"]["checks"]["web"] == {"passed": 1, "failed": 1, "last": "Deployment not found"}
    assert ("Warning", "SteadyStateBroken") in access.events
    assert not ctl.games.must_stop(body)  # ended: nothing left to stop
    asyncio.run(ctl.cycle(body, lambda: False, log))  # halted stays halted: no new chaos
    assert len(access.made("patch")) == 2


def test_a_deleted_agent_takes_its_check_series_with_it() -> None:
    """One series per agent, check and result: those of a deleted agent go, another agent's stay."""
    metrics.check("agent", "web", True)
    metrics.check("agent", "web", False)
    metrics.check("other", "web", True)
    ctl = controller(FakeAccess(), {})
    asyncio.run(ctl.revert_on_delete(agent(), logging.getLogger("test")))
    agents = {s.labels["agent"] for family in metrics.CHECKS.collect() for s in family.samples}
    assert "agent" not in agents and "other" in agents
    metrics.forget_agent("other")


def test_a_standby_runs_no_cycle() -> None:
    """A warm standby runs the agents' daemons but no cycle (no refused write, no CycleFailed); the
    replica that acts cycles."""
    access = FakeAccess()
    access.paused = True
    ctl = controller(access, {})
    ran: list[str] = []

    async def cycle(body: Any, stopped: Any, log: Any) -> None:
        ran.append(body["metadata"]["name"])

    ctl.cycle = cycle  # type: ignore[method-assign,assignment]
    assert asyncio.run(ctl.passes("uid-agent", "cycle", agent(), lambda: False, logging.getLogger("t"))) is None
    assert ran == []
    access.paused = False
    asyncio.run(ctl.passes("uid-agent", "cycle", agent(), lambda: False, logging.getLogger("t")))
    assert ran == ["agent"]


def test_a_standby_leaves_a_deleted_agents_revert_to_the_holder_and_writes_nothing() -> None:
    """Kopf runs the delete handler on a warm standby too: it waits, without a refused write (an error
    and a retry in Kopf's log), until the holder has reverted and the agent is gone, or until it acts."""
    body = agent()
    body["spec"] = {"paused": True, "revertOnDelete": True}

    async def standby_then_gone() -> FakeAccess:
        access = FakeAccess()
        access.paused = True
        access.answer("read", body, None)  # still there (the holder reverting), then gone
        await controller(access, {}).revert_on_delete(body, logging.getLogger("test"))
        return access

    access = asyncio.run(standby_then_gone())
    assert [call[0] for call in access.calls] == ["read", "read"]  # the agent looked at; no ledger, no write

    async def standby_then_acting() -> FakeAccess:
        access = FakeAccess()
        access.paused = True
        ctl = controller(access, {})
        def lease_taken(default: Any) -> dict[str, Any]:
            access.paused = False
            return body

        access.answer("read", lease_taken)
        await ctl.revert_on_delete(body, logging.getLogger("test"))
        return access

    access = asyncio.run(standby_then_acting())
    assert [call[1] for call in access.made("read")] == ["ChaosAgent", "Secret"]  # acting: its ledger read

