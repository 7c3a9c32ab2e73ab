"""One tenant cannot stall, starve or steer the shared process (decisions, and the controller with a fake
access layer): a TenantChaosAgent that may not act runs no check; tenants have their own hosts and
limits; URLs with credentials are refused unseen and every failure of a request is reported by its
type; a ledger is read only when the operator wrote it, and a revert writes only where the agent may act."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any

import pytest

from kopf_operators.blackadder import decisions, steady
from kopf_operators.blackadder.controller import BlackadderController, TenantChaosController
from kopf_operators.blackadder.probes import Probes
from kopf_operators.blackadder.settings import (
    LEDGER_KEY,
    LEDGER_LABEL,
    TENANT_KIND,
    TENANT_LEDGER_UID_LABEL,
    TENANT_NAMESPACE_LABEL,
    TENANT_NAMESPACE_VALUE,
    WEBHOOK_SECRET_KEY,
    Options,
    settings_from_spec,
    tenant_agents_problem,
    tenant_settings,
)
from kopf_operators.core.conventions import Config
from kopf_operators.core.http import Answer, HttpClient
from kopf_operators.reroller.alerts import AlertSettings
from tests.unit.fake_access import FakeAccess

TOKEN = "s3cr3t-T0KEN"
ON = Options(tenants=True, tenant_http_hosts=("tenant-host",), check_hosts=("admin-host",),
             tenant_max_checks=2, tenant_max_check_timeout=5, tenant_min_check_interval=10, tenant_max_agents=2)
ALLOWED = {"team-a": [{"labels": {TENANT_NAMESPACE_LABEL: TENANT_NAMESPACE_VALUE}}], "team-b": [{}],
           "shop": [{}], "ops": [{}]}
LOG = logging.getLogger("test-shared-process")


class Recording(HttpClient):
    """Records each request instead of sending it; answers ``answer`` (an exception is raised)."""

    def __init__(self, answer: Any = None) -> None:
        super().__init__("recording")
        self.sent: list[tuple[str, str]] = []
        self.answer = Answer(204) if answer is None else answer

    async def request(self, method: str, url: str, timeout: float, **_: Any) -> Answer:
        self.sent.append((method, url))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def http_check(url: str, name: str = "h", timeout: int = 2) -> dict[str, Any]:
    return {"name": name, "http": {"url": url, "timeoutSeconds": timeout}}


def tenant_body(namespace: str, spec: dict[str, Any], name: str = "gremlin", uid: str = "uid-t",
                created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {"kind": TENANT_KIND, "metadata": {"name": name, "namespace": namespace, "uid": uid,
                                              "generation": 1, "creationTimestamp": created},
            "spec": spec}


def tenants(access: FakeAccess, options: Options = ON) -> tuple[TenantChaosController, Recording]:
    ctl = TenantChaosController(access, Config(operator_namespace="ops"), options, ALLOWED)  # type: ignore[arg-type]
    recording = Recording()
    ctl.games.probes.http = recording
    ctl.chaos._list_sync = lambda *args: []  # type: ignore[method-assign]  # an empty inventory, no pykube
    return ctl, recording


# --- a tenant agent that may not act runs nothing, its checks neither ----------------------------------


def test_a_tenant_agent_outside_an_allowed_namespace_sends_no_check() -> None:
    access = FakeAccess()
    ctl, sent = tenants(access)
    spec = {"eagerness": 100, "steadyState": {"intervalSeconds": 10, "checks": [http_check("http://tenant-host/x")]}}
    body = tenant_body("team-b", spec)  # not labelled by the administrator
    asyncio.run(ctl.cycle(body, lambda: False, LOG))
    assert sent.sent == []
    status = access.made("patch_status")[-1][4]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and TENANT_NAMESPACE_LABEL in ready["message"]
    assert not ctl.games.may_act(body)  # and the watch between cycles asks the same
    allowed = tenant_body("team-a", spec)
    asyncio.run(ctl.cycle(allowed, lambda: False, LOG))
    assert sent.sent == [("GET", "http://tenant-host/x")]  # the same agent, allowed: its check runs


def test_a_tenant_check_may_ask_only_the_tenants_hosts() -> None:
    probes = Probes(FakeAccess(), ON.tenant_http_hosts, "", "ops", tenant=True,  # type: ignore[arg-type]
                    http=Recording(), max_timeout=5)
    passed, answer = asyncio.run(probes.evaluate(steady.Check("h", "http", {"url": "http://admin-host/x"}), "team-a"))
    assert not passed and "admin-host is not in the operator's CHAOS_TENANT_HTTP_HOSTS" in answer
    assert asyncio.run(probes.evaluate(steady.Check("h", "http", {"url": "http://tenant-host/x"}), "team-a"))[0]


@pytest.mark.parametrize(("steady_state", "problem"), [
    ({"checks": [http_check("http://tenant-host/a", "a"), http_check("http://tenant-host/b", "b"),
                 http_check("http://tenant-host/c", "c")]}, "3 checks; TenantChaosAgents may have at most 2"),
    ({"checks": [http_check("http://tenant-host/a", timeout=30)]}, "timeoutSeconds 30; TenantChaosAgents may wait"),
    ({"intervalSeconds": 1, "checks": [http_check("http://tenant-host/a")]}, "intervalSeconds is 1"),
])
def test_a_tenant_agent_over_the_administrators_limits_does_not_act(steady_state: dict[str, Any],
                                                                     problem: str) -> None:
    settings = tenant_settings({"steadyState": {"intervalSeconds": 10, **steady_state}}, "team-a", ON, "ops",
                               {TENANT_NAMESPACE_LABEL: TENANT_NAMESPACE_VALUE})
    assert problem in settings.scope_problem and decisions.cycle_step(settings) == decisions.INVALID_STEP


def test_only_the_oldest_tenant_agents_of_a_namespace_act() -> None:
    live = {"u3": ("2026-01-03T00:00:00Z", "c"), "u1": ("2026-01-01T00:00:00Z", "a"),
            "u2": ("2026-01-02T00:00:00Z", "b")}
    assert tenant_agents_problem(live, "u1", "team-a", 2) == ""
    assert tenant_agents_problem(live, "u2", "team-a", 2) == ""
    assert "has 3 TenantChaosAgents; at most 2 act" in tenant_agents_problem(live, "u3", "team-a", 2)
    ctl, _ = tenants(FakeAccess())
    ctl.live["team-a"] = live
    assert ctl.agent_settings(tenant_body("team-a", {}, uid="u3")).scope_problem
    assert not ctl.agent_settings(tenant_body("team-a", {}, uid="u1")).scope_problem


# --- URLs with credentials -------------------------------------------------------------------------


def test_a_check_url_with_credentials_is_an_invalid_spec_that_never_shows_them() -> None:
    spec = {"steadyState": {"checks": [http_check(f"http://user:{TOKEN}@admin-host/x")]}}
    problem = decisions.spec_problem(settings_from_spec(spec))
    assert problem and "credentials" in problem and TOKEN not in problem
    refusal = steady.url_refusal(f"https://{TOKEN}@admin-host/x", ("admin-host",))
    assert refusal and TOKEN not in refusal and "admin-host" not in refusal


def test_a_webhook_or_alert_url_with_credentials_is_refused_unseen() -> None:
    refusal = decisions.webhook_refusal(f"http://user:{TOKEN}@hooks.example/x", ())
    assert refusal and "credentials" in refusal and TOKEN not in refusal
    with pytest.raises(ValueError, match="credentials") as caught:
        AlertSettings.from_env({"REROLLER_ALERT_SINK": "webhook",
                                "REROLLER_ALERT_WEBHOOK_URL": f"https://user:{TOKEN}@hooks.example/x"})
    assert TOKEN not in str(caught.value)


def test_any_exception_of_a_check_fails_it_by_its_type_only() -> None:
    raising = Recording(ValueError(f"http://user:{TOKEN}@admin-host/x is not a URL"))
    probes = Probes(FakeAccess(), ("admin-host",), "http://admin-host:9090", "ops",  # type: ignore[arg-type]
                    http=raising)
    passed, answer = asyncio.run(probes.evaluate(steady.Check("h", "http", {"url": "http://admin-host/x?t=1"})))
    assert not passed and answer == "ValueError from http://admin-host" and TOKEN not in answer
    query = steady.Check("p", "prometheus", {"query": "up", "op": "==", "threshold": 1})
    assert asyncio.run(probes.evaluate(query)) == (False, "could not evaluate: Prometheus unreachable (ValueError)")


def test_any_exception_of_a_webhook_is_a_warning_with_its_type_only(caplog: pytest.LogCaptureFixture) -> None:
    access = FakeAccess()
    ctl = BlackadderController(access, Config(operator_namespace="ops"), Options(), {})  # type: ignore[arg-type]
    ctl.notes.http = Recording(RuntimeError(f"cannot reach http://user:{TOKEN}@hooks.example/x"))
    address = base64.b64encode(b"http://hooks.example/x?token=" + TOKEN.encode()).decode()
    access.answer("read", {"data": {WEBHOOK_SECRET_KEY: address}})
    body = {"kind": "ChaosAgent", "metadata": {"name": "a", "uid": "uid-a"}}

    async def send() -> None:
        ctl.notes.webhook(body, "hook", [{"cycle": 1}], LOG)
        for _ in range(100):  # the POST is sent in the background
            if access.events:
                return
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.INFO):
        asyncio.run(send())
    assert access.events == [("Warning", "WebhookFailed")]
    assert [r.getMessage() for r in caplog.records if "WebhookFailed" in r.getMessage()]
    assert not [r for r in caplog.records if TOKEN in r.getMessage()]


# --- ledgers and reverts ----------------------------------------------------------------------------


def ledger_secret(agent_uid: str, claimed_uid: str, **meta: Any) -> dict[str, Any]:
    data = {"agent": "a", "agentUid": claimed_uid, "undo": {}}
    return {"metadata": {"namespace": "ops", "name": "blackadder-ledger-a",
                         "labels": {LEDGER_LABEL: "a", **meta.pop("labels", {})}, **meta},
            "data": {LEDGER_KEY: base64.b64encode(json.dumps(data).encode()).decode()}}


def test_a_ledger_is_trusted_only_when_the_operator_wrote_it_for_this_agent() -> None:
    owner = {"ownerReferences": [{"uid": "uid-a", "kind": "ChaosAgent", "name": "a"}]}
    assert decisions.ledger_trust_problem(ledger_secret("uid-a", "uid-a", **owner), "uid-a", False, "ops") is None
    # A previous same-named agent's ledger (the garbage collector is about to take it): read, starts afresh.
    assert decisions.ledger_trust_problem(ledger_secret("uid-old", "uid-old"), "uid-a", False, "ops") is None
    forged = ledger_secret("uid-a", "uid-a")  # claims this agent, without the ownerReference only we set
    assert "not written by the operator" in str(decisions.ledger_trust_problem(forged, "uid-a", False, "ops"))
    copy = ledger_secret("uid-a", "uid-a", labels={"copyrator.kopf-operators.dev/rule-uid": "r"}, **owner)
    assert "Copyrator copy" in str(decisions.ledger_trust_problem(copy, "uid-a", False, "ops"))
    tenant = ledger_secret("uid-t", "uid-t", labels={TENANT_LEDGER_UID_LABEL: "uid-t"})
    assert decisions.ledger_trust_problem(tenant, "uid-t", True, "ops") is None
    assert decisions.ledger_trust_problem(ledger_secret("uid-t", "uid-t"), "uid-t", True, "ops") is not None
    elsewhere = {**forged, "metadata": {**forged["metadata"], "namespace": "team-a"}}
    assert "not in the operator's namespace" in str(decisions.ledger_trust_problem(elsewhere, "uid-a", False, "ops"))


def test_a_forged_ledger_is_never_read_and_nothing_is_written() -> None:
    access = FakeAccess()
    ctl = BlackadderController(access, Config(operator_namespace="ops"), Options(), ALLOWED)  # type: ignore[arg-type]
    forged = ledger_secret("uid-a", "uid-a", labels={"copyrator.kopf-operators.dev/rule-uid": "r"})
    access.answer("read", forged)
    body = {"kind": "ChaosAgent", "metadata": {"name": "a", "uid": "uid-a", "generation": 1},
            "spec": {"revert": True, "targetNamespaces": ["shop"]}}
    asyncio.run(ctl.cycle(body, lambda: False, LOG))
    assert not access.made("patch") and not access.made("replace") and not access.made("create")
    assert ("Warning", "CycleFailed") in access.events


@pytest.mark.parametrize(("entry", "refused"), [
    ({"kind": "Deployment", "namespace": "shop", "name": "web"}, None),
    ({"kind": "Deployment", "namespace": "elsewhere", "name": "web"}, "not one this agent may target"),
    ({"kind": "Deployment", "namespace": "kube-system", "name": "coredns"}, "deny-list"),
    ({"kind": "ConfigMap", "namespace": "ops", "name": "settings"}, "deny-list"),
    ({"kind": "ConfigMap", "namespace": "shop", "name": "kube-root-ca.crt"}, "never a target"),
    ({"kind": "Secret", "namespace": "shop", "name": "s"}, "nothing a revert restores"),
])
def test_a_revert_writes_only_where_the_agent_may_act_now(entry: dict[str, Any], refused: str | None) -> None:
    settings = settings_from_spec({"targetNamespaces": ["shop"], "excludedNamespaces": []})
    problem = decisions.revert_refusal(entry, settings, "ops")
    assert problem is None if refused is None else refused in str(problem)


def test_a_revert_skips_and_reports_an_entry_outside_the_agents_targets() -> None:
    access = FakeAccess()
    ctl = BlackadderController(access, Config(operator_namespace="ops"), Options(), ALLOWED)  # type: ignore[arg-type]
    body = {"kind": "ChaosAgent", "metadata": {"name": "a", "uid": "uid-a", "generation": 1},
            "spec": {"revert": True, "targetNamespaces": ["shop"]}}

    async def scenario() -> dict[str, Any]:
        handle = await ctl.ledgers.get("a", "uid-a")
        handle.data["undo"] = {"Deployment/kube-system/coredns": {
            "kind": "Deployment", "namespace": "kube-system", "name": "coredns", "uid": "u", "before": 0,
            "written": 2}}
        return await ctl.reverter.revert_all(body, handle, ctl.agent_settings(body), LOG)

    summary = asyncio.run(scenario())
    assert summary["refused"] == ["Deployment/kube-system/coredns"] and not summary["restored"]
    assert not access.made("patch") and ("Warning", "RevertRefused") in access.events
    assert [c for c in access.made("read") if c[1] == "Deployment"] == []  # not even read
