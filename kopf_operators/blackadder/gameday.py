"""Blackadder's game days: an agent's run, its steady-state checks and its end (decisions in ``steady``).

- ``gate``, before each cycle (under the agent's lock): starts or reopens the run, ends it when its
  duration or maxActions is reached (Finished: reverted as on delete), evaluates the checks, halts it
  when one failed ``failureThreshold`` times in a row (Halted: reverted unless revertOnHalt is false),
  and holds the chaos back while a check fails;
- ``watch``, a task beside the agent's loop: evaluates the checks every ``intervalSeconds`` while the
  run goes on, and follows killed workloads until all their Pods are Ready again (time to recover);
- ``must_stop``: what the loop and the running cycle ask before each action (a broken check, or the
  run's end, stop the chaos at once, mid-cycle too; the next ``gate`` then halts or finishes).

The run lives in the agent's ledger (``ledger["run"]``; the operator is its only writer) and is
reported as ``status.run``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kopf_operators.blackadder import decisions, steady
from kopf_operators.blackadder.cycle import CycleOutcome, Stopped
from kopf_operators.blackadder.ledger import LedgerHandle, LedgerStore
from kopf_operators.blackadder.notify import Logger, Notifications
from kopf_operators.blackadder.probes import Probes
from kopf_operators.blackadder.revert import Reverter
from kopf_operators.blackadder.settings import AgentSettings
from kopf_operators.core import metrics
from kopf_operators.core.api import ApiError
from kopf_operators.core.conventions import now_iso

OPERATOR = "blackadder"
# Killed workloads are followed this long at most (one that never recovers is reported without a time).
RECOVERY_WATCH_SECONDS = 600

logger = logging.getLogger("kopf_operators.blackadder")


class GameDays:
    """The runs of one controller's agents. ``tenant``: a TenantChaosAgent's checks stay in its namespace."""

    def __init__(self, probes: Probes, ledgers: LedgerStore, notes: Notifications, reverter: Reverter,
                 agent_id: Callable[[Mapping[str, Any]], str], tenant: bool = False,
                 may_act: Callable[[Mapping[str, Any]], bool] = lambda _body: True) -> None:
        self.probes, self.ledgers, self.notes, self.reverter = probes, ledgers, notes, reverter
        self.agent_id, self.tenant = agent_id, tenant
        # Whether the agent may act at all (a TenantChaosAgent outside an allowed namespace may not):
        # the watch evaluates no check for one that may not.
        self.may_act = may_act

    def game(self, body: Mapping[str, Any]) -> steady.GameDay:
        namespace = str(body["metadata"].get("namespace") or "") if self.tenant else None
        return steady.game_day_from_spec(body.get("spec") or {}, namespace)

    def _run(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        handle = self.ledgers.handles.current(str(body["metadata"]["uid"]))
        run = handle.data.get("run") if handle is not None else None
        return run if isinstance(run, dict) else None

    def must_stop(self, body: Mapping[str, Any]) -> bool:
        """Whether the running run must end now (in memory, no request)."""
        game = self.game(body)
        run = self._run(body)
        if not game.enabled or run is None or steady.ended(run):
            return False
        return bool(steady.broken_check(run, game) or steady.limit_reached(run, game, time.time()))

    def actions_left(self, body: Mapping[str, Any]) -> int | None:
        run = self._run(body)
        return None if run is None else steady.actions_left(run, self.game(body))

    # --- before a cycle ----------------------------------------------------------------------------------

    async def gate(self, body: Mapping[str, Any], handle: LedgerHandle, settings: AgentSettings,
                   previous: Any, log: Logger) -> dict[str, Any] | None:
        """None: the cycle may go on (chaos). Else the status to write instead (no chaos)."""
        game = self.game(body)
        generation = body["metadata"].get("generation")
        run = steady.run_for(handle.data, game, time.time(), generation)
        if run is None:
            return None
        if not steady.ended(run):
            limit = steady.limit_reached(run, game, time.time())
            if limit is not None:
                await self._end(body, handle, run, settings, steady.FINISHED, *limit, log)
            else:
                # Broken already (the watch counted failureThreshold failures): a pass now does not undo that.
                broken = steady.broken_check(run, game)
                if broken is None and game.checks:
                    await self.evaluate(body, run, game, log)
                    broken = steady.broken_check(run, game)
                if broken is not None:
                    name, answer = broken
                    await self._end(body, handle, run, settings, steady.HALTED, steady.STEADY_STATE_BROKEN,
                                    f"check {name} failed {game.failure_threshold} time(s) in a row; last answer: "
                                    f"{answer}", log)
                elif failing := steady.failing_checks(run, game):
                    tally = run["checks"][failing[0]]
                    status = decisions.simple_status(previous, settings, generation, True, "SteadyStateFailing",
                                                     f"no chaos while check {failing[0]} fails: {tally['last']}")
                    return {**status, "state": "Waiting", "run": steady.run_status(run)}
                else:
                    return None
        return self.ended_status(run, settings, previous, generation)

    @staticmethod
    def ended_status(run: Mapping[str, Any], settings: AgentSettings, previous: Any,
                     generation: int | None) -> dict[str, Any]:
        """Halted: Stalled (a person decides when to go on: any edit of the spec). Finished: Ready."""
        halted = run.get("state") == steady.HALTED
        message = (f"halted: {run.get('message')}; edit the spec (e.g. set spec.resume) to start a new run"
                   if halted else f"finished: {run.get('message')}")
        status = decisions.simple_status(previous, settings, generation, not halted, str(run.get("why")), message,
                                         stalled=halted)
        return {**status, "state": run.get("state"), "run": steady.run_status(run)}

    async def _end(self, body: Mapping[str, Any], handle: LedgerHandle, run: dict[str, Any],
                   settings: AgentSettings, state: str, why: str, message: str, log: Logger) -> None:
        """End the run: revert (Halted: unless revertOnHalt is false; Finished: as on delete), say so
        (Event, log line, webhook), keep the record in the ledger."""
        steady.end_run(run, time.time(), state, why, message)
        game = self.game(body)
        revert = game.revert_on_halt if state == steady.HALTED else settings.revert_on_delete
        if revert and handle.data.get("undo"):
            summary = await self.reverter.revert_all(body, handle, settings, log)
            run["reverted"] = len(summary["restored"])
        await self.ledgers.save(handle)
        halted = state == steady.HALTED
        metrics.action(OPERATOR, "run-halted" if halted else "run-finished")
        self.notes.announce(body, None, "Warning" if halted else "Normal", why, f"run {state.lower()}: {message}",
                            log)
        if settings.webhook_secret:
            self.notes.webhook(body, settings.webhook_secret, [{
                "cycle": handle.data.get("cycle"), "at": now_iso(), "mode": "run", "kind": body.get("kind"),
                "namespace": body["metadata"].get("namespace") or "", "name": body["metadata"]["name"],
                "outcome": f"{state.lower()}: {why}", "dryRun": settings.dry_run}], log)

    # --- after a cycle -----------------------------------------------------------------------------------

    async def after_cycle(self, handle: LedgerHandle, outcome: CycleOutcome) -> dict[str, Any] | None:
        """Count the cycle's actions in the run and follow its kills; ``status.run`` (None: no run)."""
        run = handle.data.get("run")
        if not isinstance(run, dict) or steady.ended(run):
            return None
        steady.add_actions(run, outcome.done)
        for pod, at in outcome.killed:
            steady.note_kill(run, pod.workload_name or f"Pod/{pod.namespace}/{pod.name}", pod.owner, pod.namespace,
                             pod.uid, at)
        await self.ledgers.save(handle)
        return steady.run_status(run)

    # --- between cycles ----------------------------------------------------------------------------------

    async def evaluate(self, body: Mapping[str, Any], run: dict[str, Any], game: steady.GameDay,
                       log: Logger) -> None:
        namespace = str(body["metadata"].get("namespace") or "")
        answers = await asyncio.gather(*(self.probes.evaluate(check, namespace) for check in game.checks))
        agent = self.agent_id(body["metadata"])
        for check, (passed, answer) in zip(game.checks, answers, strict=True):
            failures = steady.record_check(run, check.name, passed, answer)
            metrics.check(agent, check.name, passed)
            if failures == 1:  # one line when a check starts failing, not one per evaluation
                log.warning(f"SteadyStateCheckFailed: check {check.name}: {answer}")

    async def follow_recoveries(self, run: dict[str, Any]) -> None:
        """Each pending kill: its workload's availability now, and its time to recover once whole."""
        pending = list(run.get("pending") or ())
        if not pending:
            return
        pods = {ns: await self.probes.pods(ns) for ns in sorted({str(p["namespace"]) for p in pending})}
        keep = []
        for kill in pending:
            mine = [pod for pod in pods[kill["namespace"]] if steady.owned_by(pod, kill["owner"])]
            seconds, ready, total = steady.recovery(float(kill["at"]), kill["pod"], mine)
            steady.note_availability(run, kill["workload"], ready, total)
            if seconds is not None:
                steady.note_recovery(run, kill["workload"], seconds)
                metrics.recovery(str(kill["workload"]).split("/")[0], seconds)
            elif time.time() - float(kill["at"]) < RECOVERY_WATCH_SECONDS:
                keep.append(kill)
        run["pending"] = keep

    async def watch(self, body: Mapping[str, Any], stopped: Stopped, wait: Callable[[float], Any],
                    log: Logger) -> None:
        """Beside the agent's loop until it stops: checks and recoveries every intervalSeconds."""
        while not stopped():
            game = self.game(body)
            if await wait(game.interval if game.enabled else steady.DEFAULT_INTERVAL_SECONDS):
                return
            run = self._run(body)
            if not game.enabled or run is None or not self.may_act(body):
                continue
            try:
                if game.checks and not steady.ended(run) and not steady.broken_check(run, game):
                    await self.evaluate(body, run, game, log)
                await self.follow_recoveries(run)  # the last kills recover after the run's end too
            except ApiError as exc:  # the next interval retries; a check's own failure is no exception
                log.warning(f"steady-state watch failed: {exc}")
