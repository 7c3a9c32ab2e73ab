"""Chaos for tenants (issue #23): a TenantChaosAgent's effective settings are confined to its own
namespace and bounded by the administrator's limits, whatever its spec says (pure decisions, and the
controller's listing with a fake lister)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kopf_operators.blackadder import decisions, targets
from kopf_operators.blackadder.controller import BlackadderController, TenantChaosController
from kopf_operators.blackadder.settings import (
    LEDGER_LABEL,
    LEDGER_PREFIX,
    MIN_PAUSE_SECONDS,
    TANTRUM,
    TENANT_LEDGER_UID_LABEL,
    TENANT_NAMESPACE_LABEL,
    TENANT_NAMESPACE_VALUE,
    AgentSettings,
    Options,
    ledger_name,
    orphaned_tenant_ledgers,
    tenant_agent_id,
    tenant_ledger_name,
    tenant_settings,
)
from kopf_operators.core.conventions import Config

ON = Options(tenants=True, tenant_max_kills=2, tenant_min_pause=60)
ALLOWED = {TENANT_NAMESPACE_LABEL: TENANT_NAMESPACE_VALUE}
# Every field a ChaosAgent knows, including those the TenantChaosAgent schema prunes (a stored object
# from before a schema change, or a CRD edited by hand, must still not reach another namespace).
EVERY_FIELD: dict[str, Any] = {
    "tantrumMode": True, "cancerMode": True, "ipsumMode": True, "eagerness": 100, "pauseDuration": 5,
    "targetNamespaces": ["kube-system", "other"], "excludedNamespaces": ["team-a"],
    "namespaceSelector": {"matchLabels": {"x": "y"}}, "webhook": {"secretRef": {"name": "hook"}},
    "maxKillsPerCycle": "100%", "revert": True, "revertOnDelete": True, "allowSingleReplica": True,
    "sharedConfigMaps": "Include",
}


def tenant(spec: dict[str, Any], namespace: str = "team-a", settings: Options = ON,
           labels: dict[str, str] | None = ALLOWED, operator_namespace: str = "ops") -> AgentSettings:
    return tenant_settings(spec, namespace, settings, operator_namespace, labels)


def test_every_field_is_confined_to_the_agents_own_namespace() -> None:
    settings = tenant(EVERY_FIELD)
    assert settings.targets == ("team-a",) and settings.excluded == () and settings.namespace_selector is None
    assert (settings.tantrum, settings.cancer, settings.ipsum) == (True, False, False)
    assert settings.webhook_secret == "" and not settings.revert and settings.scope_problem == ""
    assert targets.listing_plan_for(settings, "ops", {"other": {"x": "y"}, "team-a": {}}) == (["team-a"], "")
    assert targets.namespace_allowed("team-a", settings, "ops")
    assert not targets.namespace_allowed("other", settings, "ops")


@pytest.mark.parametrize(("spec", "kills", "pause"), [
    ({"maxKillsPerCycle": 10, "pauseDuration": 5}, 2, 60),
    ({"maxKillsPerCycle": 1, "pauseDuration": 600}, 1, 600),
    ({"maxKillsPerCycle": 0}, 0, 60),
    ({"maxKillsPerCycle": "100%"}, 2, 60),  # a percentage (not in the tenant schema) gets the limit
    ({}, 1, 60),  # the spec's default (1) under the limit (2)
])
def test_the_administrators_limits_cap_the_spec(spec: dict[str, Any], kills: int, pause: int) -> None:
    settings = tenant({"eagerness": 100, **spec})
    assert (settings.max_kills, settings.pause) == (kills, pause)
    assert targets.max_kills(settings.max_kills, alive=50) == kills


@pytest.mark.parametrize(("namespace", "settings", "labels", "problem"), [
    ("team-a", Options(tenants=False), ALLOWED, "chaos for tenants is switched off"),
    ("kube-system", ON, ALLOWED, "deny-list"),
    ("ops", ON, ALLOWED, "deny-list"),  # the operator's own namespace (the ledgers live there)
    ("team-a", ON, {}, "does not allow chaos for tenants"),
    ("team-a", ON, {TENANT_NAMESPACE_LABEL: "yes"}, "does not allow chaos for tenants"),
    ("team-a", ON, None, "does not allow chaos for tenants"),
])
def test_an_agent_outside_an_allowed_namespace_does_nothing(namespace: str, settings: Options,
                                                            labels: dict[str, str] | None, problem: str) -> None:
    agent = tenant({"eagerness": 100}, namespace, settings, labels)
    assert problem in agent.scope_problem
    assert decisions.cycle_step(agent, 0.0) == decisions.INVALID_STEP
    assert problem in (decisions.spec_problem(agent) or "")
    # A label removed in the middle of a cycle: the rest of the plan is dropped.
    assert not decisions.still_wanted(agent, tenant({"eagerness": 100}), TANTRUM, namespace, "ops")


def test_dry_run_and_the_kill_switch_apply_to_tenants() -> None:
    forced = tenant({"eagerness": 100, "dryRun": False}, settings=Options(
        tenants=True, dry_run=True))
    assert forced.dry_run and forced.dry_run_reason == "OperatorForced"
    agent = tenant({"eagerness": 100})
    assert decisions.cycle_step(agent, 0.0, kill_switch=True) == decisions.STOPPED_STEP
    assert decisions.must_halt(agent, kill_switch=True)
    assert decisions.cycle_step(tenant({"eagerness": 100, "paused": True}), 0.0) == decisions.PAUSED_STEP


def test_limits_come_from_the_environment() -> None:
    settings = Options.from_env({"CHAOS_TENANTS": "true", "CHAOS_TENANTS_MAX_KILLS_PER_CYCLE": "3",
                                 "CHAOS_TENANTS_MIN_PAUSE_SECONDS": "1"})
    assert (settings.tenants, settings.tenant_max_kills) == (True, 3)
    assert settings.tenant_min_pause == MIN_PAUSE_SECONDS
    default = Options.from_env({})
    assert (default.tenants, default.tenant_max_kills, default.tenant_min_pause) == (False, 1, 60)


def test_ledger_names_never_collide() -> None:
    # "a-b"/"c" and "a"/"b-c" would both be "a-b-c" with a dash; a namespace has no dot.
    first = tenant_ledger_name(tenant_agent_id("a-b", "c"))
    second = tenant_ledger_name(tenant_agent_id("a", "b-c"))
    assert first != second
    # No ChaosAgent name gives a tenant's ledger name (its own prefix).
    assert not first.startswith(LEDGER_PREFIX)
    assert ledger_name("tenant-ledger-a-b.c") != first
    long_a = tenant_ledger_name(tenant_agent_id("n" * 63, "x" * 253))
    long_b = tenant_ledger_name(tenant_agent_id("n" * 63, "x" * 252 + "y"))
    assert len(long_a) <= 253 and long_a != long_b


def test_the_controller_lists_only_the_agents_own_namespace() -> None:
    """Even when a listing returned another namespace's pods, none is a candidate."""
    def pod(namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name, "uid": f"{namespace}-{name}",
                             "ownerReferences": [{"controller": True, "uid": name, "kind": "ReplicaSet"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}

    index = {"team-a": [{"labels": ALLOWED}], "other": [{"labels": {}}]}
    controller = TenantChaosController(None, Config(operator_namespace="ops"), ON, index)  # type: ignore[arg-type]
    calls: list[tuple[Any, ...]] = []

    async def fake_list(*args: Any) -> list[dict[str, Any]]:
        calls.append(args)
        return [pod("team-a", "mine"), pod("other", "theirs"), pod("kube-system", "dns")]

    controller.chaos._list = fake_list  # type: ignore[method-assign, assignment]
    body = {"metadata": {"namespace": "team-a", "name": "chaos", "uid": "u"}, "spec": EVERY_FIELD}
    settings = controller.agent_settings(body)
    inventory = asyncio.run(controller.chaos.inventory(settings, 0.0))
    assert [p.name for p in inventory.pods] == ["mine"]
    assert inventory.deployments == () and inventory.configmaps == ()
    assert len(calls) == 1 and calls[0][1] == ["team-a"]  # one namespaced listing, never all namespaces
    assert controller.agent_id(body["metadata"]) == "team-a.chaos"
    assert controller.ledger_name("team-a.chaos") == "blackadder-tenant-ledger-team-a.chaos"
    cluster = BlackadderController(None, Config(operator_namespace="ops"), ON, index)  # type: ignore[arg-type]
    assert cluster.ledger_name(cluster.agent_id({"name": "chaos"})) == "blackadder-ledger-chaos"


def ledger_secret(name: str, agent_uid: str | None) -> dict[str, Any]:
    labels = {LEDGER_LABEL: name} | ({TENANT_LEDGER_UID_LABEL: agent_uid} if agent_uid else {})
    return {"metadata": {"name": name, "uid": f"secret-{name}", "labels": labels}}


def test_only_ledgers_whose_agent_is_gone_are_orphans() -> None:
    ledgers = [ledger_secret("alive", "u1"), ledger_secret("gone", "u2"), ledger_secret("unlabelled", None)]
    assert [s["metadata"]["name"] for s in orphaned_tenant_ledgers(ledgers, ["u1", "u3"])] == ["gone"]
    assert orphaned_tenant_ledgers(ledgers, ["u1", "u2"]) == []


class FakeAccess:
    """Lists and deletes, recorded (the sweep's only calls)."""

    def __init__(self, ledgers: list[dict[str, Any]], agents: list[dict[str, Any]], paused: bool = False) -> None:
        self.ledgers, self.agents, self.paused = ledgers, agents, paused
        self.calls: list[tuple[Any, ...]] = []

    async def list(self, kind: Any, namespace: str | None = None, *, labels: str = "") -> list[dict[str, Any]]:
        self.calls.append(("list", kind.plural, namespace, labels))
        return self.ledgers if kind.plural == "secrets" else self.agents

    async def delete(self, kind: Any, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", kind.plural, namespace, name, uid))
        return True


def test_the_start_up_sweep_deletes_only_orphaned_ledgers_listing_ledgers_first() -> None:
    access = FakeAccess([ledger_secret("alive", "u1"), ledger_secret("gone", "u2")],
                        [{"metadata": {"uid": "u1", "namespace": "team-a", "name": "a"}}])
    controller = TenantChaosController(access, Config(operator_namespace="ops"), ON, {})  # type: ignore[arg-type]
    assert asyncio.run(controller.sweep_ledgers()) == 1
    assert access.calls == [("list", "secrets", "ops", TENANT_LEDGER_UID_LABEL),
                            ("list", "tenantchaosagents", None, ""),
                            ("delete", "secrets", "ops", "gone", "secret-gone")]
    standby = FakeAccess([ledger_secret("gone", "u2")], [], paused=True)
    controller = TenantChaosController(standby, Config(operator_namespace="ops"), ON, {})  # type: ignore[arg-type]
    assert asyncio.run(controller.sweep_ledgers()) == 0 and standby.calls == []
