"""Re-roller: progressive rollouts, the controller's side (decisions in ``reroller.waves``, pure).

A rollout due because a progressive source changed asks ``gate`` first. The gate's members are the
source's users in its namespace (from the workload indexes), each with whether it caught up with the
change and how its rollout went (from its view: baseline, ``ROLLED`` and status). Whether a member
caught up is decided once per (member resourceVersion, source hash): a wave of hundreds costs no
decision per member per pass. A workload that waits is looked at again every ``WAVE_LOOK_SECONDS``
and sooner when the workload it waits for changes (``wake``, from its event). Everything it decides
from lives on the objects, so a restart or a takeover resumes a progression where it stood.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.controller import Requeues
from kopf_operators.core.state import Index, KeyedState, PerKey, first
from kopf_operators.reroller import chaos, decisions, plans, settings, views, waves
from kopf_operators.reroller.windows import Hold

OPERATOR = "reroller"
# A workload waiting for an earlier wave looks again this often (a wave's deadline passes with no
# event); an event of the workload it waits for wakes it sooner (``WAKE_SECONDS``: a burst of them
# wakes it once). A held one looks again less often: only a deadline or a release lifts a halt
# without an event of the source.
WAVE_LOOK_SECONDS = 5.0
HELD_LOOK_SECONDS = 30.0
WAKE_SECONDS = 0.2
# A halt asks the ChaosAgents what they disrupt, at most this often (a list of a few objects).
CHAOS_LIST_SECONDS = 10.0

logger = logging.getLogger("kopf_operators.reroller")
Key = settings.WorkloadKey
SourceKey = tuple[str, str, str]  # (source kind, namespace, name)


class Progressions:
    def __init__(self, state: KeyedState[Key], requeues: Requeues[Key], look_in: Callable[[Key, float], None],
                 access: Access, options: settings.Options,
                 sources: Mapping[str, Index[SourceKey, views.SourceView]],
                 current: Callable[[Key], views.WorkloadView | None],
                 lookup: Callable[[views.WorkloadView], Mapping[tuple[str, str], views.SourceView]],
                 affected: Callable[[str, str, str], set[Key]],
                 sightings: Mapping[Key, decisions.FirstSighting]) -> None:
        self.requeues = requeues  # a pass's own look again
        self.look_in = look_in  # another key's look again, asked outside its pass (``GuardedPass.look_in``)
        self.access = access
        self.options = options
        self.sources = sources
        self.current = current
        self.lookup = lookup
        self.affected = affected
        self.sightings = sightings
        # What ChaosAgents disrupt (``chaos.disruptions``), as last listed (monotonic time; REROLLER_CHAOS_AWARE).
        self.chaos: chaos.Disruptions = {}
        self._chaos_listed = -math.inf
        self._chaos_refused = False  # said once: the listing was refused (no CRD, no RBAC)
        # Per member: progressive source -> (member rv, source hash, uses it, caught up).
        self._caught: PerKey[Key, dict[SourceKey, tuple[int, str, bool, bool]]] = state.map()
        # Per workload: those waiting for it (woken by its events, and when it is forgotten).
        self._waiters: PerKey[Key, set[Key]] = state.map()
        # The workloads a halted progression holds now (the held-rollouts gauge).
        self._halted: PerKey[Key, SourceKey] = state.map()
        # Per source: the change whose halt was said, and the unreadable settings said (once each).
        self._halt_said: dict[SourceKey, str] = {}
        self._problems_said: dict[SourceKey, tuple[str, ...]] = {}
        # Per source: the (change, workload) whose failure under chaos was said (once each).
        self._chaos_said: dict[SourceKey, tuple[str, Key]] = {}
        metrics.held_rollouts(lambda: len(self._halted))
        state.on_forget(self.wake)

    def wake(self, key: Key) -> None:
        """The workloads waiting for this one look again, soon (each pass that waits again waits anew)."""
        for waiter in self._waiters.pop(key, None) or ():
            self.look_in(waiter, WAKE_SECONDS)

    def source_gone(self, source_key: SourceKey) -> None:
        """What was said about a source goes with it."""
        for said in (self._halt_said, self._problems_said, self._chaos_said):
            said.pop(source_key, None)

    def not_held(self, key: Key) -> None:
        self._halted.pop(key, None)

    async def decide(self, view: views.WorkloadView, plan_: plans.Plan, wall: float,
                     digest_key: bytes | None) -> waves.Verdict | None:
        """``gate``; before a halt, or a wait for a workload under chaos, with REROLLER_CHAOS_AWARE, the
        ChaosAgents are asked (at most every ``CHAOS_LIST_SECONDS``) what they disrupt, and the gate asked
        again: a workload an agent disrupts now holds the later waves only as long as it does, not as a
        failure of the configuration."""
        verdict = self.gate(view, plan_, wall, digest_key)
        judged_by_chaos = verdict is not None and (verdict.gate is waves.Gate.HALT or waves.is_under_chaos(verdict.how))
        if judged_by_chaos and self.options.chaos_aware and await self._list_chaos():
            verdict = self.gate(view, plan_, wall, digest_key)  # an agent deleted or reverted since: no more
        return verdict

    async def _list_chaos(self) -> bool:
        """The ChaosAgents listed anew, unless they were a moment ago; whether they were."""
        now = time.monotonic()
        if now - self._chaos_listed < CHAOS_LIST_SECONDS:
            return False
        self._chaos_listed = now
        try:
            self.chaos = chaos.disruptions(await self.access.list(chaos.CHAOS_AGENTS))
        except ApiError as exc:
            if not self._chaos_refused:
                self._chaos_refused = True
                logger.warning(f"ChaosAgents could not be listed ({exc}): a failed wave is not told from chaos")
            return False
        return True

    def gate(self, view: views.WorkloadView, plan_: plans.Plan, wall: float,
             digest_key: bytes | None) -> waves.Verdict | None:
        """Whether the rollout may go now, for each source that changed and rolls in waves (the one that
        holds it most wins); None when none of them does. ``wall``: epoch seconds."""
        verdicts = []
        for ref in plan_.changed:
            kind_lower, _, name = ref.partition("/")
            kind = "Secret" if kind_lower == "secret" else "ConfigMap"
            source_key: SourceKey = (kind, view.namespace, name)
            source = first(self.sources[kind], source_key)
            if source is not None:
                source = self._with_origin(kind, source)
            if source is None or not waves.progressive(source, self.options):
                continue
            progression = waves.progression(source, self.options)
            self._say_problems(source_key, progression.problems)
            members = [m for key in self.affected(*source_key)
                       if (m := self._member(key, source_key, source, progression.deadline, wall, digest_key))]
            verdict = waves.gate(members, view.key, progression.size,
                                 released=waves.released(kind, source, digest_key))
            verdicts.append(dataclasses.replace(verdict, source=source_key,
                                                token=waves.change_token(kind, source, digest_key)))
        return waves.worst(verdicts)

    def _with_origin(self, kind: str, source: views.SourceView) -> views.SourceView:
        """A Copyrator copy without rollout settings of its own follows its source's (a copy never
        takes the project's annotations from its source, so its users would otherwise roll at once);
        a release may be written on either."""
        if source.origin is None or any((source.rollout, source.first_wave, source.wave_deadline)):
            return source
        origin = first(self.sources[kind], (kind, *source.origin))
        if origin is None:
            return source
        return dataclasses.replace(source, rollout=origin.rollout, first_wave=origin.first_wave,
                                   wave_deadline=origin.wave_deadline, release=source.release or origin.release)

    def _member(self, key: Key, source_key: SourceKey, source: views.SourceView, deadline: float, wall: float,
                digest_key: bytes | None) -> waves.Member | None:
        """A user of the changed source as the gate sees it; None when it does not use it now."""
        view = self.current(key)
        if view is None or view.deleting:
            return None
        known = self._caught.setdefault(key, {})
        cached = known.get(source_key)
        if cached is not None and cached[:2] == (view.rv, source.hash):
            uses, caught_up = cached[2:]
        else:
            decision = decisions.decide(view, self.lookup(view), self.options, self.sightings.get(key),
                                        time.monotonic(), digest_key=digest_key)
            ref = f"{source_key[0].lower()}/{source_key[2]}"
            uses = ref in decision.snap.per_source
            plan_ = decision.plan
            # Caught up: nothing of this source's change is left to roll on it (another source's may be).
            caught_up = plan_ is not None and not (plan_.action is plans.Action.ROLL and ref in plan_.changed)
            known[source_key] = (view.rv, source.hash, uses, caught_up)
        if not uses:
            return None
        rolled = waves.parse_rolled(view.rolled)
        rolled_at = rolled[1] if rolled is not None and rolled[0] == view.observed_hash else None
        health, how = waves.health(view.status, rolled_at, wall, deadline)
        if health is waves.Health.FAILED and (agent := chaos.disrupted_by(self.chaos, key, wall)) is not None:
            # Not its configuration's failure, perhaps: judged again when the disruption is over.
            health, how = waves.Health.ROLLING, waves.under_chaos(agent, how)
        return waves.Member(key, view.priority, caught_up, health, how)

    def hold(self, view: views.WorkloadView, plan_: plans.Plan, verdict: waves.Verdict) -> Hold | None:
        """A rollout the gate does not let go. WAIT: look again soon (and when the workload it waits for
        changes), saying nothing unless it was held by a halt before. HALT: held (the pending annotation
        and a Warning on the workload; once per change, a Warning on the source)."""
        key = view.key
        if verdict.blocker is not None:
            self._waiters.setdefault(verdict.blocker, set()).add(key)
        if verdict.gate is waves.Gate.WAIT:
            self._halted.pop(key, None)
            self._say_chaos(verdict)
            self.requeues.after(key, WAVE_LOOK_SECONDS)
            if view.pending is None or not view.pending.startswith(waves.HALTED):
                return None  # waiting for a wave is a progression's normal course
            return waves.waiting_hold(view, plan_, verdict)  # a new change lifted its halt: say so
        assert verdict.source is not None
        self.requeues.after(key, HELD_LOOK_SECONDS)
        self._halted[key] = verdict.source
        self._say_halt(verdict)
        return waves.halted_hold(view, plan_, verdict)

    def _say_halt(self, verdict: waves.Verdict) -> None:
        """A Warning on the source, once per change it halts."""
        assert verdict.source is not None
        if self._halt_said.get(verdict.source) == verdict.token:
            return
        self._halt_said[verdict.source] = verdict.token
        message = waves.source_halt_message(verdict)
        logger.warning(f"{_where(verdict.source)}: {message}"[:1000])
        self.access.event(_source_ref(verdict.source), "Warning", "RerollHalted", message)

    def _say_chaos(self, verdict: waves.Verdict) -> None:
        """A Normal Event on the source, once per change and workload: an earlier wave failed while a
        ChaosAgent disrupts it, so the progression waits instead of halting."""
        if verdict.source is None or verdict.blocker is None or not waves.is_under_chaos(verdict.how):
            return
        if self._chaos_said.get(verdict.source) == (verdict.token, verdict.blocker):
            return
        self._chaos_said[verdict.source] = (verdict.token, verdict.blocker)
        message = waves.source_chaos_message(verdict)
        logger.info(f"{_where(verdict.source)}: {message}")
        self.access.event(_source_ref(verdict.source), "Normal", "RerollWaitingForChaos", message)

    def _say_problems(self, source_key: SourceKey, problems: tuple[str, ...]) -> None:
        if self._problems_said.get(source_key, ()) == problems:
            return
        self._problems_said[source_key] = problems
        if problems:
            message = "; ".join(problems)
            metrics.error(OPERATOR, "rollout-setting-invalid")
            logger.warning(f"{_where(source_key)}: {message}"[:1000])
            self.access.event(_source_ref(source_key), "Warning", "RolloutSettingInvalid", message)


def _where(source_key: SourceKey) -> str:
    kind, namespace, name = source_key
    return f"{kind} {namespace}/{name}"


def _source_ref(source_key: SourceKey) -> dict[str, Any]:
    kind, namespace, name = source_key
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": namespace}}
