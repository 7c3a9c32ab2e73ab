"""Re-roller: progressive rollouts, a change fanned out in waves gated on health (pure).

A source opted in (``rollout: progressive`` on the ConfigMap/Secret, or cluster-wide) does not roll
every workload that uses it at once. Its users are put in a fixed order (their ``wave`` annotation,
lowest first, then namespace, kind and name) and cut into waves: the first holds ``first-wave``
workloads (a count, or a percentage of the users), and each next wave twice the one before. A
workload rolls only when every workload of the earlier waves has caught up with the change and
finished its rollout; when one of them failed, the rest are held.

Everything a gate needs lives on the objects, so a restart or a takeover resumes a progression where
it stood: whether a workload caught up with the change (its baseline annotations), when it last rolled
and for which data (``ROLLED``, written with the rollout), and how its rollout went (its status, as its
own controller reports it). Nothing here reads the cluster or the clock.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable

from kopf_operators.core.rollouts import RolloutStatus
from kopf_operators.reroller.plans import Plan, keyed_digest, short
from kopf_operators.reroller.settings import (
    DEFAULT_PRIORITY,
    FIRST_WAVE,
    MIN_RELEASE_CHARS,
    RELEASE,
    ROLLOUT,
    WAVE_DEADLINE,
    Options,
    WaveSize,
    WorkloadKey,
    parse_wave_size,
)
from kopf_operators.reroller.views import SourceView, WorkloadView, parse_duration
from kopf_operators.reroller.windows import Hold

PROGRESSIVE, IMMEDIATE = "progressive", "immediate"
# The pending annotation's value on a workload held by a halted progression starts with this.
HALTED = "halted"


class Health(enum.Enum):
    DONE = "done"        # its rollout finished: the new pods are all updated and available
    ROLLING = "rolling"  # still rolling, within its deadline
    FAILED = "failed"    # its controller gave up (Deployment's progress deadline), or past the wave's


def health(status: RolloutStatus | None, rolled_at: float | None, now: float, deadline: float) -> tuple[Health, str]:
    """How a workload's last rollout went, and in words; ``rolled_at``/``now`` epoch seconds, ``rolled_at``
    None when its last baseline was not written by a progressive rollout (nothing to wait for, unless
    its controller says it failed)."""
    if status is None:
        return Health.DONE, "not gated (no pods rolled in place)"
    if status.failed:
        return Health.FAILED, status.failed
    if status.finished:
        return Health.DONE, f"{status.available}/{status.desired} updated and available"
    old = (status.total or 0) - status.updated
    how = (f"{status.updated}/{status.desired} updated, {status.available}/{status.desired} available"
           + (f", {old} of an older revision left" if old > 0 else "")
           if status.observed_generation >= status.generation else "its controller has not seen the change yet")
    if rolled_at is None:  # it did not roll for this change: not this progression's to judge
        return Health.DONE, f"did not roll for this change ({how})"
    if now - rolled_at > deadline:
        return Health.FAILED, f"not finished {_duration(deadline)} after its rollout: {how}"
    return Health.ROLLING, how


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


# --- settings read from the source and the workload --------------------------------------------------


def parse_rolled(text: str | None) -> tuple[str, float] | None:
    """``ROLLED``'s value, "<observed hash>@<epoch seconds>"; None when missing or malformed."""
    hash_, sep, at = (text or "").partition("@")
    try:
        when = float(at)
    except ValueError:
        return None
    return (hash_, when) if sep and hash_ and math.isfinite(when) else None


def rolled_value(observed_hash: str, now: float) -> str:
    return f"{observed_hash}@{now:.0f}"


# --- the gate -------------------------------------------------------------------------------------


def wave_sizes(users: int, first: int) -> list[int]:
    """The waves' sizes for ``users`` workloads: ``first``, then each twice the one before."""
    sizes, left, size = [], users, max(1, first)
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
        size *= 2
    return sizes


@dataclasses.dataclass(frozen=True)
class Member:
    """A user of the changed source, as its gate sees it: ``caught_up``: nothing of this change is left
    to roll on it (rolled, or its baseline written without a rollout); ``health``: how its rollout for
    this change went (DONE when it did not roll for it)."""

    key: WorkloadKey
    priority: int = DEFAULT_PRIORITY
    caught_up: bool = False
    health: Health = Health.DONE
    how: str = ""

    @property
    def order(self) -> tuple[int, str, str, str]:
        kind, namespace, name = self.key
        return (self.priority, namespace, kind, name)


class Gate(enum.Enum):
    GO = "go"        # its wave may roll now
    WAIT = "wait"    # an earlier wave is still rolling (or has not rolled yet)
    HALT = "halt"    # an earlier wave failed: held until a new change or a release


@dataclasses.dataclass(frozen=True)
class Verdict:
    gate: Gate
    wave: int                         # the workload's wave, from 1
    waves: int
    blocker: WorkloadKey | None = None  # the earlier workload it waits for, or the one that failed
    how: str = ""                       # the blocker's state, in words
    source: tuple[str, str, str] | None = None  # the progressive source (kind, namespace, name)
    token: str = ""                     # its change's short hash (``change_token``)

    @property
    def message(self) -> str:
        if self.blocker is None:
            return f"wave {self.wave} of {self.waves}"
        kind, namespace, name = self.blocker
        what = "failed its rollout" if self.gate is Gate.HALT else "is still rolling"
        return f"wave {self.wave} of {self.waves}: {kind} {namespace}/{name} of an earlier wave {what}: {self.how}"


def gate(members: Iterable[Member], me: WorkloadKey, size: WaveSize, *, released: bool = False) -> Verdict:
    """Whether the workload ``me`` may roll now, among the change's users ``members`` (``me`` among
    them). A failed workload of an earlier wave halts the later ones; an earlier one still rolling, or
    not caught up yet, makes them wait; ``released`` (an administrator's release of this change) lets
    them all roll."""
    ordered = sorted(members, key=lambda m: m.order)
    sizes = wave_sizes(len(ordered), size.first(len(ordered)))
    place = next((i for i, m in enumerate(ordered) if m.key == me), None)
    if place is None:  # not (or no longer) a user of the change: nothing to gate
        return Verdict(Gate.GO, 1, len(sizes))
    wave, start = 0, 0
    while start + sizes[wave] <= place:
        start += sizes[wave]
        wave += 1
    if released or wave == 0:
        return Verdict(Gate.GO, wave + 1, len(sizes))
    earlier = ordered[:start]
    failed = next((m for m in earlier if m.caught_up and m.health is Health.FAILED), None)
    if failed is not None:
        return Verdict(Gate.HALT, wave + 1, len(sizes), failed.key, failed.how)
    waiting = next((m for m in earlier if not m.caught_up or m.health is not Health.DONE), None)
    if waiting is not None:
        how = waiting.how if waiting.caught_up else "its rollout has not started"
        return Verdict(Gate.WAIT, wave + 1, len(sizes), waiting.key, how)
    return Verdict(Gate.GO, wave + 1, len(sizes))


def worst(verdicts: Iterable[Verdict]) -> Verdict | None:
    """Of a workload's progressions (one per progressive source that changed), the one that holds it
    most: HALT over WAIT over GO; None when there is none."""
    rank = {Gate.HALT: 2, Gate.WAIT: 1, Gate.GO: 0}
    return max(verdicts, key=lambda v: rank[v.gate], default=None)


# --- a source's progression settings ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Progression:
    """How a progressive source's changes fan out: ``problems``, its settings that could not be read
    (said once, as a Warning Event on the source; the safe value is used instead)."""

    size: WaveSize
    deadline: float
    problems: tuple[str, ...] = ()


def progressive(source: SourceView, options: Options) -> bool:
    """Whether the source's changes roll in waves: its own ``rollout`` annotation, else the
    installation's REROLLER_ROLLOUT. A value that is neither mode is read as progressive (the safer)."""
    if source.rollout is None:
        return options.rollout == PROGRESSIVE
    return source.rollout.lower() != IMMEDIATE


def progression(source: SourceView, options: Options) -> Progression:
    problems = []
    if source.rollout is not None and source.rollout.lower() not in (PROGRESSIVE, IMMEDIATE):
        problems.append(f"{ROLLOUT} {source.rollout!r} is not {PROGRESSIVE} or {IMMEDIATE}: rolling in waves")
    size = options.first_wave
    if source.first_wave is not None:
        try:
            size = parse_wave_size(source.first_wave)
        except ValueError as exc:
            size = WaveSize()
            problems.append(f"{FIRST_WAVE} {exc}: a first wave of 1")
    deadline = options.wave_deadline_seconds
    if source.wave_deadline is not None:
        parsed = parse_duration(source.wave_deadline)
        if parsed is None or parsed < 1:
            problems.append(f"{WAVE_DEADLINE} {source.wave_deadline!r} is not a duration like 10m (at least 1s): "
                            f"{_duration(deadline)}")
        else:
            deadline = parsed
    return Progression(size, deadline, tuple(problems))


def change_token(kind: str, source: SourceView, digest_key: bytes | None) -> str:
    """The change's short hash as its users' observed-sources annotation shows it (a Secret's keyed
    with the installation's key): what an administrator writes in ``RELEASE`` to release it."""
    if digest_key is not None and kind == "Secret":
        return keyed_digest(digest_key, source.hash)
    return short(source.hash)


def released(kind: str, source: SourceView, digest_key: bytes | None) -> bool:
    token = (source.release or "").strip()
    return len(token) >= MIN_RELEASE_CHARS and change_token(kind, source, digest_key).startswith(token)


# --- what is said about a held workload ---------------------------------------------------------------


def _refs(plan_: Plan) -> str:
    return ", ".join(plan_.changed) or "sources"


def _blocker(verdict: Verdict) -> str:
    if verdict.blocker is None:
        return "an earlier wave"
    kind, namespace, name = verdict.blocker
    return f"{kind} {namespace}/{name}"


def release_hint(verdict: Verdict) -> str:
    assert verdict.source is not None
    kind, namespace, name = verdict.source
    return f"kubectl annotate {kind.lower()} {name} -n {namespace} {RELEASE}={verdict.token}"


def halted_hold(view: WorkloadView, plan_: Plan, verdict: Verdict) -> Hold:
    """A workload held by a halted progression: its pending annotation (stable while the halt lasts:
    written once) and the Warning's message (naming what failed, and how)."""
    pending = (f"{HALTED}: wave {verdict.wave} of {verdict.waves}, {_blocker(verdict)} of an earlier wave failed "
               f"its rollout; changed: {_refs(plan_)}")
    how = verdict.how.rstrip(".")
    message = (f"Rollout of {view.kind} {view.name} held (data changed in {_refs(plan_)}): wave {verdict.wave} of "
               f"{verdict.waves}, and {_blocker(verdict)} of an earlier wave failed its rollout: {how}. A new "
               f"change of the data starts the waves again; to roll it anyway: {release_hint(verdict)}")
    return Hold(HALTED, message[:1000], pending[:1000])


def waiting_hold(view: WorkloadView, plan_: Plan, verdict: Verdict) -> Hold:
    """A workload that was held by a halt and now waits for an earlier wave of a new change."""
    message = (f"Data changed in {_refs(plan_)}: {view.kind} {view.name} is in wave {verdict.wave} of "
               f"{verdict.waves} and rolls when the earlier waves have finished their rollouts")
    pending = f"waiting for wave {verdict.wave - 1} of {verdict.waves}; changed: {_refs(plan_)}"
    return Hold("wave", message[:1000], pending[:1000])


def source_halt_message(verdict: Verdict) -> str:
    """The Warning on the source, once per change a progression halts."""
    how = verdict.how.rstrip(".")
    return (f"Progressive rollout of change {verdict.token} halted: {_blocker(verdict)} failed its rollout: "
            f"{how}; the workloads of the later waves are held. Fix the data (a new change starts the "
            f"waves again), or roll them anyway: {release_hint(verdict)}")[:1000]


# A member that failed while a ChaosAgent disrupts it: its state in words starts with this.
UNDER_CHAOS = "disrupted by "


def under_chaos(agent: str, how: str) -> str:
    return f"{UNDER_CHAOS}{agent}, so not judged until that ends: {how}"


def is_under_chaos(how: str) -> bool:
    return how.startswith(UNDER_CHAOS)


def source_chaos_message(verdict: Verdict) -> str:
    """The Normal Event on the source when an earlier wave fails under chaos: the waves wait."""
    return (f"Progressive rollout of change {verdict.token} waits: {_blocker(verdict)} of an earlier wave has "
            f"not finished its rollout and is {verdict.how}")[:1000]
