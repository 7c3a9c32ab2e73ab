"""Re-roller: pure decision logic (no API calls).

A workload (Deployment, StatefulSet, DaemonSet, CronJob, Job) opts in by annotation, with the
project's keys or with stakater Reloader's. The operator hashes the data of the ConfigMaps/Secrets it
watches and, when that data differs from the baseline stored on the workload (``observed-hash`` and
``observed-sources`` in ``metadata.annotations``), re-rolls it: a pod-template annotation changes
(``config-hash`` for our keys, Reloader's ``last-reloaded-from`` for Reloader's keys), a CronJob gets
a Job from its template, a Job is recreated. The first sighting records the baseline at once.

Everything here is data in, data out, in modules along its seams: ``settings`` (keys, options,
selectors), ``views`` (index entries: ``WorkloadView``, ``SourceView``; the watched set), ``plans``
(the snapshot and the plan), ``patches`` (the writes), ``windows`` (restart windows, CronJob modes:
rollouts held back) and ``pacing`` (leading edge, per-workload
interval, cluster token bucket). This module is what a pass asks: ``decide_pass`` (the one call: what
to write now and when to look again), built on ``decide`` (the plan for a workload, first sightings
included). Each name is imported from the module that defines it. All unit-tested without a cluster.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Mapping

from kopf_operators.reroller.pacing import next_rollout_at
from kopf_operators.reroller.patches import baseline_annotations, unpause_due
from kopf_operators.reroller.plans import Action, Plan, Snapshot, held_by_suspend, parse_observed, plan, snapshot
from kopf_operators.reroller.settings import OBSERVED_HASH, Options
from kopf_operators.reroller.views import Source, SourceView, WorkloadView, effective_sources
from kopf_operators.reroller.windows import Hold, hold

# --- a pass's decision ----------------------------------------------------------------------------

# A source missing at a workload's first sighting may only be late in its own watch stream (the
# streams are separate; at shutdown Kopf drains queued events after it has stopped them). "Absent" is
# recorded in the baseline only if it still is this much later; a process that stops first records
# nothing, so the next one decides from the first-sighting rules (a source newer than the workload
# rolls it) instead of from a wrong "absent".
ABSENT_SETTLE_SECONDS = 2.0
# A watched source whose data differs from its data stamp (``SourceView.drifted``: a hand edit of a
# Copyrator copy) is held this long, waiting for its writer to put it back: neither the edit nor the
# repair rolls. Still differing after that, the edit stands (its writer is not running or does not
# repair it), and it rolls like any change.
DRIFT_GRACE_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class FirstSighting:
    """What a process remembers of a workload it found without a baseline, until it has written one
    (in memory only: a process that stops first leaves nothing, and the next one starts afresh)."""

    rv: int                               # the workload's resourceVersion when first seen
    pending: Mapping[str, str] | None = None  # the baseline annotations decided, not written yet
    absent_until: float = 0.0             # a missing source counts as absent from then (monotonic)


@dataclasses.dataclass(frozen=True)
class Decision:
    plan: Plan | None                 # None: nothing now (a timer looks again in ``look_in``)
    snap: Snapshot
    sighting: FirstSighting | None    # what to remember of the first sighting (None: nothing)
    look_in: float | None = None


def drift_held(sources: Iterable[Source], lookup: Mapping[tuple[str, str], SourceView],
               drift_since: Mapping[tuple[str, str], float], now: float) -> float | None:
    """Seconds to hold a workload whose watched sources include a drifted one (``drift_since``:
    (kind, name) -> when its drift was first seen, monotonic); None: nothing drifted, or drifted
    longer than ``DRIFT_GRACE_SECONDS`` (the edit stands)."""
    waits = [DRIFT_GRACE_SECONDS - (now - drift_since.get((s.kind, s.name), now))
             for s in sources if (found := lookup.get((s.kind, s.name))) is not None and found.drifted]
    waits = [w for w in waits if w > 0]
    return max(waits) if waits else None


def decide(view: WorkloadView, lookup: Mapping[tuple[str, str], SourceView], options: Options,
           sighting: FirstSighting | None, now: float, *,
           drift_since: Mapping[tuple[str, str], float] | None = None, first_look: bool = False,
           digest_key: bytes | None = None) -> Decision:
    """The plan for a workload from its view, its sources' index entries (``lookup``: (kind, name) ->
    SourceView of the existing ones) and what was remembered of its first sighting; ``now`` monotonic.

    - with a baseline on the workload: the plan against it;
    - the first sighting: the baseline is the data now, remembered at once (a change from here on
      rolls, even while the write of the baseline is retried after a 409); a source newer than the
      workload's version first seen rolls it instead (a change right after creation is never
      absorbed); a missing source is recorded "absent" only ``ABSENT_SETTLE_SECONDS`` later;
    - a remembered baseline not written yet: still unchanged, it is written; changed, the plan
      against it (a rollout).

    Before any of that: a watched source drifted from its data stamp holds the workload (no rollout,
    no baseline) until its writer repairs it or ``DRIFT_GRACE_SECONDS`` pass (``drift_held``). And
    with ``sync_after_restart`` off, a rollout due at the process's first look at a workload
    (``first_look``: a change made while the operator was down) is recorded as the baseline instead.
    """
    sources = effective_sources(view, lookup, options)
    snap = snapshot(sources, lookup, view.key_scopes, digest_key)
    held = drift_held(sources, lookup, drift_since or {}, now)
    if held is not None:
        return Decision(None, snap, sighting, look_in=held)
    decision = _decide(view, sources, snap, lookup, options, sighting, now)
    if first_look and not options.sync_after_restart and decision.plan is not None \
            and decision.plan.action is Action.ROLL:
        absorbed = Plan(Action.BASELINE, new_hash=decision.plan.new_hash, missing=decision.plan.missing)
        return dataclasses.replace(decision, plan=absorbed)
    return decision


def _decide(view: WorkloadView, sources: Iterable[Source], snap: Snapshot,
            lookup: Mapping[tuple[str, str], SourceView], options: Options, sighting: FirstSighting | None,
            now: float) -> Decision:
    judge = functools.partial(plan, reload_on_create=options.reload_on_create,
                              reload_on_delete=options.reload_on_delete)
    if view.observed_hash is not None:
        return Decision(judge(view.baseline, snap), snap, sighting)
    if sighting is None or sighting.pending is None:
        first = sighting or FirstSighting(view.rv)
        newer = [s.ref for s in sources if (found := lookup.get((s.kind, s.name))) and found.rv > first.rv]
        plan_ = judge({}, snap, newer=newer)
        if plan_.action is not Action.BASELINE:
            return Decision(plan_, snap, first)
        first = dataclasses.replace(first, pending=baseline_annotations(plan_, snap))
        if plan_.missing:
            first = dataclasses.replace(first, absent_until=now + ABSENT_SETTLE_SECONDS)
            return Decision(None, snap, first, look_in=ABSENT_SETTLE_SECONDS)
        return Decision(plan_, snap, first)
    pending = sighting.pending
    plan_ = judge(pending, snap)
    if plan_.missing and now < sighting.absent_until:
        return Decision(None, snap, sighting)  # not settled yet: the timer looks again
    if plan_.action in (Action.NONE, Action.WAIT_MISSING):  # unchanged since the first sighting
        plan_ = Plan(Action.BASELINE, new_hash=pending[OBSERVED_HASH], missing=plan_.missing)
        snap = Snapshot(per_source=dict(parse_observed(pending)[1]) or snap.per_source,
                        missing=snap.missing, optional=snap.optional)
    return Decision(plan_, snap, sighting)


# --- a pass: everything it writes, from one call ----------------------------------------------------

# A held rollout looks again this long after its window opens (the clocks of one host).
WINDOW_MARGIN = 0.5


class Do(enum.Enum):
    UNPAUSE = "unpause"        # resume a Deployment we paused, and nothing else this pass
    NOTHING = "nothing"        # no write (the timers in ``look_in`` look again)
    SUSPENDED = "suspended"    # a suspended CronJob: the change recorded, no rollout
    PEND = "pend"              # the pending annotation written (a held rollout) or cleared
    BASELINE = "baseline"      # the baseline annotations written
    ROLL = "roll"              # a rollout, once the cluster-wide budget grants a token


@dataclasses.dataclass(frozen=True)
class Step:
    """What one pass does: ``do`` with ``decision``'s plan and snapshot; ``held``: why a rollout waits
    (PEND); ``sighting``: what to remember of a first sighting from now on; ``look_in``: the delays
    after which the workload is looked at again; ``release``: it no longer waits for a budget token."""

    do: Do
    decision: Decision | None = None
    sighting: FirstSighting | None = None
    held: Hold | None = None
    look_in: tuple[float, ...] = ()
    release: bool = False

    @property
    def plan(self) -> Plan:
        assert self.decision is not None and self.decision.plan is not None
        return self.decision.plan

    @property
    def snap(self) -> Snapshot:
        assert self.decision is not None
        return self.decision.snap


def decide_pass(view: WorkloadView, lookup: Mapping[tuple[str, str], SourceView], options: Options,
                sighting: FirstSighting | None, last_roll: float | None, now: float, wall: float, *,
                drift_since: Mapping[tuple[str, str], float] | None = None, first_look: bool = False,
                digest_key: bytes | None = None) -> Step:
    """A pass over a workload, decided at once: ``now`` monotonic, ``wall`` epoch seconds, ``last_roll``
    the monotonic time of its last rollout (the per-workload interval). In order: a Deployment we paused
    is resumed when its period is over; else the plan (``decide``); a suspended CronJob only records it;
    a rollout outside its restart window (or with a malformed setting) is held on the workload, and a
    held one no longer due is cleared; a baseline is written; a rollout waits for the per-workload
    interval, then asks the cluster-wide budget (the controller's ``TokenBucket``, shared state).
    ``digest_key``: the installation's key for Secrets' digests (``plans.keyed_digest``)."""
    looks: list[float] = []
    due = unpause_due(view, wall)
    if due is not None:
        if due <= 0:
            return Step(Do.UNPAUSE, sighting=sighting)
        looks.append(due)
    decision = decide(view, lookup, options, sighting, now, drift_since=drift_since, first_look=first_look,
                      digest_key=digest_key)
    if decision.look_in is not None:
        looks.append(decision.look_in)
    step = functools.partial(Step, decision=decision, sighting=decision.sighting)
    plan_ = decision.plan
    if plan_ is None:
        return step(Do.NOTHING, look_in=tuple(looks))
    if held_by_suspend(view, plan_):
        return step(Do.SUSPENDED, look_in=tuple(looks))
    held = hold(view, plan_, options, wall)
    if held is not None or (plan_.action is Action.NONE and view.pending is not None):
        if held is not None and held.look_in is not None:
            looks.append(held.look_in + WINDOW_MARGIN)
        return step(Do.PEND, held=held, look_in=tuple(looks), release=True)
    if plan_.action in (Action.NONE, Action.WAIT_MISSING):
        return step(Do.NOTHING, look_in=tuple(looks), release=True)
    if plan_.action is Action.BASELINE:
        return step(Do.BASELINE, look_in=tuple(looks), release=True)
    at = next_rollout_at(last_roll, now, options)
    if at > now:
        return step(Do.NOTHING, look_in=(*looks, at - now))
    return step(Do.ROLL, look_in=tuple(looks))
