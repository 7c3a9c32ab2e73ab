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
from kopf_operators.reroller.settings import PREFIX, WorkloadKey

# On a source (or cluster-wide: REROLLER_ROLLOUT): "progressive" fans its changes out in waves.
ROLLOUT = f"{PREFIX}/rollout"
PROGRESSIVE = "progressive"
# On a source: the first wave's size, "1" (workloads) or "10%" (of its users, at least one).
FIRST_WAVE = f"{PREFIX}/first-wave"
# On a source: how long a workload of a wave may take to finish its rollout ("10m"; Go's syntax).
WAVE_DEADLINE = f"{PREFIX}/wave-deadline"
# On a source: the data hash (short) whose held workloads an administrator releases: they roll.
RELEASE = f"{PREFIX}/release"
# On a workload: its place in every progression (lower first; unset: DEFAULT_PRIORITY).
WAVE = f"{PREFIX}/wave"
# Written with a progressive rollout, on the workload: "<observed hash>@<epoch seconds>".
ROLLED = f"{PREFIX}/rolled"

DEFAULT_PRIORITY = 100
MAX_PRIORITY = 1_000_000
MAX_PERCENT = 100.0


class Health(enum.Enum):
    DONE = "done"        # its rollout finished: the new pods are all updated and available
    ROLLING = "rolling"  # still rolling, within its deadline
    FAILED = "failed"    # its controller gave up (Deployment's progress deadline), or past the wave's


def health(status: RolloutStatus | None, rolled_at: float | None, now: float, deadline: float) -> tuple[Health, str]:
    """How a workload's last rollout went, and in words; ``rolled_at``/``now`` epoch seconds."""
    if status is None:
        return Health.DONE, "not gated (no pods rolled in place)"
    if status.failed:
        return Health.FAILED, status.failed
    caught_up = status.observed_generation >= status.generation
    if caught_up and status.updated >= status.desired and status.available >= status.desired:
        return Health.DONE, f"{status.available}/{status.desired} updated and available"
    how = (f"{status.updated}/{status.desired} updated, {status.available}/{status.desired} available"
           if caught_up else "its controller has not seen the change yet")
    if rolled_at is not None and now - rolled_at > deadline:
        return Health.FAILED, f"not finished {_duration(deadline)} after its rollout: {how}"
    return Health.ROLLING, how


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


# --- settings read from the source and the workload --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WaveSize:
    count: int | None = 1        # this many workloads
    percent: float | None = None  # or this share of the users (at least one)

    def first(self, users: int) -> int:
        if self.percent is not None:
            return max(1, math.ceil(users * self.percent / 100))
        return max(1, self.count or 1)


def parse_wave_size(text: str | None) -> WaveSize:
    """"3" or "25%"; ValueError naming the problem for anything else."""
    value = (text or "").strip()
    if not value:
        return WaveSize()
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            raise ValueError(f"{value!r} is not a percentage like 25%") from None
        if not 0 < percent <= MAX_PERCENT or not math.isfinite(percent):
            raise ValueError(f"{value!r}: a percentage must be above 0% and at most 100%")
        return WaveSize(count=None, percent=percent)
    if not value.isdigit() or int(value) < 1 or len(value) > 6:
        raise ValueError(f"{value!r} is not a count of workloads (1 to 999999) or a percentage like 25%")
    return WaveSize(count=int(value))


def parse_priority(text: str | None) -> int:
    """A workload's ``wave`` annotation: a small whole number; anything else is the default."""
    value = (text or "").strip()
    if value.isdigit() and len(value) <= 7 and int(value) <= MAX_PRIORITY:
        return int(value)
    return DEFAULT_PRIORITY


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
