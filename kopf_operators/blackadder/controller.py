"""Blackadder: the controller of ChaosAgents (decisions in ``decisions``; API via ``core.access``).

One agent's cycle is one pass of the one reconcile shape (``core.controller``): observe (its live
settings, its ledger, the clock, the kill switch) -> decide (``decisions.decide_cycle``: one call) -> act
(write the status, revert, or the chaos of ``cycle.ChaosCycle``, itself observe -> plan -> act). The
daemon runs it as a ``GuardedPass``: a crash is counted and logged, and the next cycle is its retry.

The controller's seams, one module each:
- ``ledger``: the ledger store (one Secret per agent; read once, then our own last write is newest);
- ``cycle``: the chaos cycle (the inventory listed with pykube-ng, the plan, the actions);
- ``revert``: restoring what an agent changed, and letting go when that keeps being refused;
- ``notify``: notifications (Events with their log line, status, webhooks).

munch gives the agent's spec its attribute view (``spec.tantrumMode``) before it is normalised; lorem
writes the text of ipsum mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import lorem
import munch

from kopf_operators.blackadder import decisions, sparing
from kopf_operators.blackadder.cycle import ChaosCycle, Stopped, namespace_labels
from kopf_operators.blackadder.gameday import GameDays
from kopf_operators.blackadder.ledger import LedgerHandle, LedgerStore, LedgerTaken
from kopf_operators.blackadder.notify import Logger, Notifications
from kopf_operators.blackadder.probes import Probes
from kopf_operators.blackadder.revert import Reverter, RevertIncomplete
from kopf_operators.blackadder.settings import (
    GROUP,
    KIND,
    PLURAL,
    REVERT_ATTEMPTS,
    TENANT_KIND,
    TENANT_LEDGER_UID_LABEL,
    TENANT_PLURAL,
    VERSION,
    AgentSettings,
    Options,
    ledger_name,
    ledger_namespace,
    orphaned_tenant_ledgers,
    settings_from_spec,
    tenant_agent_id,
    tenant_agents_problem,
    tenant_ledger_name,
    tenant_settings,
)
from kopf_operators.core import api as k8s
from kopf_operators.core import conventions, metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.background import Background
from kopf_operators.core.controller import DONE, GuardedPass, PassSettings, Result
from kopf_operators.core.conventions import Config
from kopf_operators.core.http import HttpClient
from kopf_operators.core.state import Index, KeyedState, MemoSlot

__all__ = ["AGENTS", "NAMESPACES_INDEX", "SOURCES_INDEX", "TENANT_AGENTS", "BlackadderController", "LedgerHandle",
           "LedgerTaken", "Logger", "RevertIncomplete", "TenantChaosController"]

OPERATOR = "blackadder"
NAMESPACES_INDEX = "blackadder-namespaces"
# Outbound HTTP (core.http): the administrators' pool; the tenants' pool, and each tenant namespace's
# requests in flight at once (its checks beyond that wait for their turn, within their own deadline).
ADMIN_HTTP_CONNECTIONS = 32
TENANT_HTTP_CONNECTIONS = 64
TENANT_REQUESTS_PER_NAMESPACE = 4
SOURCES_INDEX = "blackadder-copyrator-sources"
# A sleeping agent looks at its live spec and the kill switch this often (in memory, no request):
# an emergency stop acts within about a second instead of at the next cycle.
WAKE_POLL_SECONDS = 1.0
CHAOSAGENT = k8s.Kind(f"{GROUP}/{VERSION}", PLURAL, KIND, namespaced=False)
TENANTCHAOSAGENT = k8s.Kind(f"{GROUP}/{VERSION}", TENANT_PLURAL, TENANT_KIND, namespaced=True)

logger = logging.getLogger("kopf_operators.blackadder")


def spec_view(body: Mapping[str, Any]) -> munch.Munch:
    """The article's view of an agent's spec: attribute access on a detached copy."""
    return munch.munchify(copy.deepcopy(dict(body.get("spec") or {})))


def _crashed(key: str, trigger: str, exc: Exception, delay: float | None) -> str:
    return f"cycle crashed: {exc}"


class BlackadderController:
    kind = CHAOSAGENT

    def __init__(self, access: Access, config: Config, options: Options,
                 namespaces: Index[str, dict[str, Any]],
                 sources: Index[tuple[str, str], list[dict[str, Any]]] | None = None) -> None:
        self.access = access
        self.config = config
        self.options = options
        self.namespaces = namespaces  # Kopf's live index: name -> {"labels": ..., "terminating": bool}
        # Kopf's live index: Copyrator rule -> its ConfigMap sources (an empty index is falsy: no `or`).
        self.sources = {} if sources is None else sources
        self.background = Background(OPERATOR)  # webhook notifications in flight
        self.state: KeyedState[str] = KeyedState()  # per agent uid
        self.ledgers = self.state.track(LedgerStore(access, config, self.kind, namespaces, self.ledger_name))
        # Outbound HTTP (checks, webhooks) on a connection pool of this controller's own: administrators'
        # agents and tenants' never share one (``http_client``).
        self.http = self.http_client()
        self.notes = Notifications(access, self.kind, options, config.operator_namespace, self.agent_id,
                                   self.background, self.http)
        self.chaos = ChaosCycle(access, config, options, namespaces, self.sources, self.ledgers, self.notes,
                                self.agent_settings)
        self.reverter = Reverter(access, self.ledgers, self.notes)
        tenant = self.kind.namespaced
        probes = Probes(access, options.tenant_http_hosts if tenant else options.check_hosts, options.prometheus_url,
                        ledger_namespace(config.operator_namespace), tenant=tenant, http=self.http,
                        max_timeout=float(options.tenant_max_check_timeout) if tenant else None)
        self.games = GameDays(probes, self.ledgers, self.notes, self.reverter, self.agent_id, tenant=tenant,
                              may_act=lambda body: not decisions.spec_problem(self.agent_settings(body)))
        # A cycle that crashes is counted and logged with its traceback; the next cycle is its retry.
        self.passes: GuardedPass[str] = self.state.track(GuardedPass(self.background, self._cycle_pass, PassSettings(
            OPERATOR, say=_crashed, catch=(Exception,), error_kind="cycle-crash", traceback=True,
            paused=lambda: bool(getattr(self.access, "paused", False)))))  # a standby: no cycle

    # --- settings and scope -----------------------------------------------------------------------

    def http_client(self) -> HttpClient:
        return HttpClient("blackadder", connections=ADMIN_HTTP_CONNECTIONS)

    def agent_settings(self, body: Mapping[str, Any]) -> AgentSettings:
        return settings_from_spec(spec_view(body), self.options.dry_run)

    def agent_id(self, meta: Mapping[str, Any]) -> str:
        """The agent's name in its ledger, Events and logs."""
        return str(meta["name"])

    def ledger_name(self, agent: str) -> str:
        return ledger_name(agent)

    def kill_switch(self) -> bool:
        """The global kill switch: CHAOS_STOP_ALL, or the label blackadder.io/stop=true on the
        operator's namespace (from the namespaces index: no request)."""
        entries = self.namespaces.get(self.ledgers.namespace) or ()
        labels = next((entry.get("labels") for entry in entries), None)
        return decisions.kill_switch_on(labels, self.options.stop_all)

    def _halt_state(self, body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
        return decisions.halt_state(self.agent_settings(body), self.kill_switch())

    async def _sleep(self, body: Mapping[str, Any], seconds: float, ran_with: tuple[bool, bool, bool],
                     wait: Callable[[float], Any]) -> bool:
        """Sleep until the next cycle; True when stopped. Wakes early when an emergency stop
        (paused, revert, the kill switch) is switched on after the last cycle decided without it."""
        deadline = time.monotonic() + seconds
        # A run that had to end already when the sleep began is not woken for (the cycle could not end
        # it, e.g. the API is down): it is retried at the normal pace, never hot.
        ending = self.games.must_stop(body)
        while (left := deadline - time.monotonic()) > 0:
            if await wait(min(WAKE_POLL_SECONDS, left)):
                return True
            now = self._halt_state(body)
            if now != ran_with and any(now):
                return False
            if not any(now) and not ending and self.games.must_stop(body):  # a broken check, the run's end
                return False
        return False

    # --- the daemon --------------------------------------------------------------------------------

    async def agent_loop(self, body: Mapping[str, Any], stopped: Stopped,
                         wait: Callable[[float], Any], log: Logger) -> None:
        """The agent's loop: wait out the pause left from before a restart, then cycle until stopped.
        ``body`` is Kopf's live view: spec edits apply on the next cycle."""
        try:
            delay = await self.initial_delay(body)
        except ApiError as exc:  # the API is down: start now, the cycle will report it
            log.warning(f"could not read the ledger before the first cycle: {exc}")
            delay = 0.0
        if delay and await self._sleep(body, delay, (False, False, False), wait):
            return
        # The steady-state checks and the recoveries, beside the cycles (only while a run goes on).
        watch = asyncio.create_task(self.games.watch(body, stopped, wait, log))
        try:
            while not stopped():
                ran_with = self._halt_state(body)
                await self.passes(str(body["metadata"]["uid"]), "cycle", body, stopped, log, log=log)
                if await self._sleep(body, self.agent_settings(body).pause, ran_with, wait):
                    break
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def _cycle_pass(self, uid: str, trigger: str, body: Mapping[str, Any], stopped: Stopped,
                          log: Logger) -> Result:
        await self.cycle(body, stopped, log)
        return DONE  # the next cycle comes from the daemon's loop

    async def initial_delay(self, body: Mapping[str, Any]) -> float:
        """After an operator restart, wait out the rest of the pause instead of acting at once."""
        settings = self.agent_settings(body)
        meta = body["metadata"]
        async with self.access.serialised((OPERATOR, meta["uid"])):
            handle = await self.ledgers.get(self.agent_id(meta), meta["uid"])
        last = handle.data.get("lastCycleEpoch")
        if last is None:
            last = conventions.iso_to_epoch((body.get("status") or {}).get("lastCycleTime"))
        return decisions.seconds_until_next_cycle(last, time.time(), settings.pause)

    # --- one cycle: observe -> decide -> act -------------------------------------------------------

    async def cycle(self, body: Mapping[str, Any], stopped: Stopped, log: Logger,
                    paragraph: Callable[[], str] = lorem.paragraph) -> None:
        """One cycle of one agent: revert, pause, or chaos; then the status. API errors of single
        actions are reported and skipped; a failed listing or ledger write makes Ready=False."""
        meta = body["metadata"]
        uid, generation = meta["uid"], meta.get("generation")
        settings = self.agent_settings(body)
        previous = (body.get("status") or {}).get("conditions")
        async with self.access.serialised((OPERATOR, uid)):
            if stopped():
                return
            try:
                handle = await self.ledgers.get(self.agent_id(meta), uid)
                now = time.time()
                decision = decisions.decide_cycle(settings, now, self.kill_switch(), previous, generation,
                                                  self.ledgers.namespace)
                if decision.step == decisions.REVERT_STEP:
                    summary = await self.reverter.revert_all(body, handle, settings, log)
                    await self.notes.patch_status(
                        meta, decisions.revert_status(previous, settings, generation, summary), body)
                    return
                if decision.step not in (decisions.PAUSED_STEP, decisions.STOPPED_STEP, decisions.INVALID_STEP):
                    # A game day's run: started, ended (duration, maxActions, a broken check) or held.
                    # Not for an agent that may not act (a TenantChaosAgent outside an allowed namespace,
                    # over the limits, a check URL with credentials): it runs nothing, its checks neither.
                    held = await self.games.gate(body, handle, settings, previous, log)
                    if held is not None:
                        await self.notes.patch_status(meta, held, body)
                        return
                if decision.status is not None:  # no chaos this cycle, for a reason said once per episode
                    if decision.say == "log":
                        log.info(decision.message)
                    elif decision.say:
                        self.notes.announce(body, None, decision.say, decision.reason, decision.message, log)
                    await self.notes.patch_status(meta, decision.status, body)
                    return

                def halted() -> bool:  # checked before every action: an emergency stop acts mid-cycle
                    return (stopped() or decisions.must_halt(self.agent_settings(body), self.kill_switch())
                            or self.games.must_stop(body))

                outcome = await self.chaos.run(body, handle, settings, now, halted, log, paragraph,
                                               self.games.actions_left(body))
                run = await self.games.after_cycle(handle, outcome)
                if self.games.must_stop(body):  # stopped mid-cycle by a broken check or the run's end: end it now
                    held = await self.games.gate(body, handle, settings, previous, log)
                    if held is not None:
                        await self.notes.patch_status(meta, held, body)
                        return
            except ApiError as exc:
                metrics.error(OPERATOR, "cycle")
                self.notes.announce(body, None, "Warning", "CycleFailed", f"cycle failed: {exc}", log)
                retried = exc.transient or exc.status in (404, 409)
                await self.notes.patch_status(meta, decisions.failed_status(previous, settings, generation, str(exc),
                                                                            retried), body)
                return
            disrupting = sparing.disrupting((body.get("status") or {}).get("disrupting"), outcome.disrupted,
                                            time.time(), sparing.disruption_seconds(settings.pause))
            status = decisions.cycle_status(previous, settings, generation, handle.data, outcome.done, outcome.skipped,
                                            outcome.counts, f"{handle.namespace}/{handle.name}",
                                            outcome.frequency_problems, len(outcome.spared), disrupting)
            await self.notes.patch_status(meta, {**status, "run": run} if run is not None else status, body)

    # --- delete: revert, then the ledger goes --------------------------------------------------------

    async def revert_on_delete(self, body: Mapping[str, Any], log: Logger, attempt: int = 0) -> None:
        """Undo what the agent did, then delete its ledger. Raises RevertIncomplete while some change
        could not be restored; after ``REVERT_ATTEMPTS`` refusals it lets go instead (the agent can
        always be deleted): what is left is named in an Event and in status, and the ledger Secret
        stays (ownerReference removed, so the garbage collector keeps it) for an administrator."""
        meta = body["metadata"]
        settings = self.agent_settings(body)
        # A standby (its delete handlers run too): the holder reverts; this one waits for the Lease.
        if not await self.access.until_acting_or_gone(self.kind, meta.get("namespace"), meta["name"], meta["uid"]):
            return  # reverted and gone, by the holder
        async with self.access.serialised((OPERATOR, meta["uid"])):
            try:
                handle = await self.ledgers.get(self.agent_id(meta), meta["uid"])
            except LedgerTaken as exc:  # not ours to revert from, nor to delete
                self.notes.announce(body, None, "Warning", "LedgerTaken",
                                    f"deleted without revert: {exc.where} {exc.why}", log)
                self.forget(meta)
                return
            if settings.revert_on_delete and handle.data.get("undo"):
                summary = await self.reverter.revert_all(body, handle, settings, log)
                failed = summary["failed"]
                if failed:
                    incomplete = RevertIncomplete(failed)
                    if attempt + 1 < REVERT_ATTEMPTS or not incomplete.refused:
                        # While it is retried, the Terminating agent says what is still left.
                        await self.notes.patch_status(meta, {"revert": summary, "state": "RevertFailed"})
                        raise incomplete
                    await self.reverter.abandon(body, handle, summary, attempt + 1, log)
                    self.forget(meta)
                    return
            if handle.exists:
                await self.access.delete(k8s.SECRET, handle.namespace, handle.name, uid=handle.uid or None)
            self.forget(meta)

    def forget(self, meta: Mapping[str, Any]) -> None:
        """A deleted agent: its per-agent state and its series go."""
        self.state.forget(meta["uid"])
        metrics.forget_agent(self.agent_id(meta))

    async def stop(self) -> None:
        """Notifications still in flight are dropped when the operator exits."""
        await self.background.stop()
        await self.http.close()


class TenantChaosController(BlackadderController):
    """TenantChaosAgents: the same cycle, ledger and actions, with the settings confined to the
    agent's own namespace and bounded by the administrator's limits (settings.tenant_settings). The
    ledger stays in the operator's namespace (a tenant could otherwise write it)."""

    kind = TENANTCHAOSAGENT

    def __init__(self, access: Access, config: Config, options: Options,
                 namespaces: Index[str, dict[str, Any]],
                 sources: Index[tuple[str, str], list[dict[str, Any]]] | None = None) -> None:
        # The live agents per namespace (uid -> (creationTimestamp, name)): the oldest
        # CHAOS_TENANTS_MAX_AGENTS_PER_NAMESPACE act, the others say why they do not.
        self.live: dict[str, dict[str, tuple[str, str]]] = {}
        super().__init__(access, config, options, namespaces, sources)

    def http_client(self) -> HttpClient:
        """The tenants' own pool; a few requests at a time per namespace (its lane): a tenant whose host
        is slow waits for its own requests, never another tenant's nor an administrator's."""
        return HttpClient("blackadder-tenants", connections=TENANT_HTTP_CONNECTIONS,
                          per_lane=TENANT_REQUESTS_PER_NAMESPACE)

    def agent_settings(self, body: Mapping[str, Any]) -> AgentSettings:
        namespace = str(body["metadata"]["namespace"])
        settings = tenant_settings(spec_view(body), namespace, self.options, self.config.operator_namespace,
                                   namespace_labels(self.namespaces).get(namespace))
        if not settings.scope_problem:
            crowded = tenant_agents_problem(self.live.get(namespace) or {}, str(body["metadata"]["uid"]),
                                            namespace, self.options.tenant_max_agents)
            if crowded:
                return dataclasses.replace(settings, scope_problem=crowded)
        return settings

    async def agent_loop(self, body: Mapping[str, Any], stopped: Stopped,
                         wait: Callable[[float], Any], log: Logger) -> None:
        meta = body["metadata"]
        namespace, uid = str(meta["namespace"]), str(meta["uid"])
        self.live.setdefault(namespace, {})[uid] = (str(meta.get("creationTimestamp") or ""), str(meta["name"]))
        try:
            await super().agent_loop(body, stopped, wait, log)
        finally:
            mine = self.live.get(namespace) or {}
            mine.pop(uid, None)
            if not mine:
                self.live.pop(namespace, None)

    def agent_id(self, meta: Mapping[str, Any]) -> str:
        return tenant_agent_id(str(meta["namespace"]), str(meta["name"]))

    def ledger_name(self, agent: str) -> str:
        return tenant_ledger_name(agent)

    async def sweep_ledgers(self) -> int:
        """At start-up: delete the ledgers of TenantChaosAgents that are gone (normally the delete
        handler does; not when the finalizer was removed by hand). Ledgers are listed before agents.
        Nothing while Kopf has paused this process (a standby: ``Access.paused``, as Copyrator's sweep)."""
        if getattr(self.access, "paused", False):
            return 0
        namespace = self.ledgers.namespace
        ledgers = await self.access.list(k8s.SECRET, namespace, labels=TENANT_LEDGER_UID_LABEL)
        if not ledgers:
            return 0
        agents = await self.access.list(TENANTCHAOSAGENT)
        orphans = orphaned_tenant_ledgers(ledgers, (a["metadata"]["uid"] for a in agents))
        for secret in orphans:
            meta = secret["metadata"]
            if await self.access.delete(k8s.SECRET, namespace, meta["name"], uid=meta.get("uid")):
                logger.info(f"deleted the ledger {namespace}/{meta['name']}: its TenantChaosAgent is gone")
        return len(orphans)


# The controllers in Kopf's memo, typed: operators/blackadder.py reaches them as ``AGENTS(memo)`` and
# ``TENANT_AGENTS(memo)``.
AGENTS = MemoSlot("blackadder", BlackadderController)
TENANT_AGENTS = MemoSlot("blackadder_tenants", TenantChaosController)
