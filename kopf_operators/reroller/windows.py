"""Re-roller: restart windows and CronJob modes (pure).

A restart window (``reloader.stakater.com/restart-window``, or ours with the same meaning, on the
workload's metadata) says when a rollout may start. Its value is JSON: an explicit IANA time zone and
1 to 16 windows, each a five-field cron expression (when a window opens) and a duration (1m to 24h):

    {"timezone": "Europe/Berlin", "windows": [{"cron": "0 2 * * *", "duration": "1h"}]}

A window is half-open, [opening, opening + duration); the duration is elapsed time, also across a
daylight-saving change. Day of month and day of week match as in cron (either one). A rollout that
may not start now is held: the workload's baseline stays as it was, so the change (or several piled
up) rolls once when a window opens, and a change reverted meanwhile rolls nothing. A window that does
not parse holds every rollout (fail closed), as does a CronJob mode that is not one of ours.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import zoneinfo
from collections.abc import Iterable

from croniter import croniter

from kopf_operators.core.conventions import epoch_to_iso
from kopf_operators.reroller.plans import Action, Plan
from kopf_operators.reroller.settings import CRONJOB_MODE, CRONJOB_MODES, Options
from kopf_operators.reroller.views import WorkloadView, parse_duration

MAX_WINDOWS = 16
MIN_DURATION = 60.0
MAX_DURATION = 24 * 3600.0


@dataclasses.dataclass(frozen=True)
class RestartWindow:
    timezone: str
    windows: tuple[tuple[str, float], ...]  # (cron expression, duration in seconds)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)


def parse_window(text: str) -> RestartWindow:
    """The annotation's value; ValueError naming the problem for anything else (unknown fields
    too: a typo must not widen a window silently)."""
    try:
        policy = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    except RecursionError:  # nested deeper than the parser's stack
        raise ValueError("not JSON (nested too deep)") from None
    if not isinstance(policy, dict):
        raise ValueError('not a JSON object like {"timezone": "UTC", "windows": [...]}')
    unknown = sorted(set(policy) - {"timezone", "windows"})
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    timezone = policy.get("timezone")
    if not isinstance(timezone, str) or not timezone.strip():
        raise ValueError("no timezone (an IANA name such as UTC or Europe/Berlin is required)")
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file
        raise ValueError(f"unknown timezone {timezone[:80]!r}") from None
    windows = policy.get("windows")
    if not isinstance(windows, list) or not 1 <= len(windows) <= MAX_WINDOWS:
        raise ValueError(f"windows must be a list of 1 to {MAX_WINDOWS} windows")
    parsed: list[tuple[str, float]] = []
    for number, window in enumerate(windows, 1):
        if not isinstance(window, dict) or set(window) != {"cron", "duration"}:
            raise ValueError(f"window {number}: needs exactly the fields cron and duration")
        cron, duration = window["cron"], window["duration"]
        if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
            raise ValueError(f"window {number}: {cron!r} is not a five-field cron expression")
        seconds = parse_duration(duration) if isinstance(duration, str) else None
        if seconds is None or not MIN_DURATION <= seconds <= MAX_DURATION:
            raise ValueError(f"window {number}: duration {duration!r} is not between 1m and 24h (such as 30m, 1h)")
        parsed.append((" ".join(cron.split()), seconds))
    return RestartWindow(timezone, tuple(parsed))


def _next_fire(cron: str, zone: zoneinfo.ZoneInfo, after: float) -> float:
    """The first opening strictly after ``after`` (epoch seconds)."""
    return float(croniter(cron, datetime.datetime.fromtimestamp(after, zone)).get_next(float))


def is_open(window: RestartWindow, now: float) -> bool:
    """A rollout may start now: an opening in (now - duration, now] of some window."""
    zone = window.zone
    return any(_next_fire(cron, zone, now - duration) <= now for cron, duration in window.windows)


def next_opening(window: RestartWindow, now: float) -> float:
    zone = window.zone
    return min(_next_fire(cron, zone, now) for cron, _ in window.windows)


def cronjob_mode(view: WorkloadView, options: Options) -> str:
    """A CronJob's mode: its annotation, else the operator's default; ValueError for a bad value."""
    if view.cronjob_mode is None:
        return options.cronjob_mode
    mode = view.cronjob_mode.strip().lower()
    if mode not in CRONJOB_MODES:
        raise ValueError(f"{CRONJOB_MODE} {view.cronjob_mode!r} is not one of {', '.join(CRONJOB_MODES)}")
    if mode == "restart-active" and not options.allow_restart_active:
        raise ValueError(f"{CRONJOB_MODE} restart-active is off in this installation (it deletes pods; an "
                         "administrator turns it on with REROLLER_ALLOW_RESTART_ACTIVE, the chart's "
                         "operators.reroller.allowRestartActive)")
    return mode


@dataclasses.dataclass(frozen=True)
class Hold:
    """A rollout held back. ``reason``: the metric's (restart_window, or invalid for a bad setting);
    ``pending``: the workload's pending annotation; ``look_in``: seconds until a window opens."""

    reason: str
    message: str
    pending: str
    look_in: float | None = None


def _refs(changed: Iterable[str]) -> str:
    return ", ".join(changed) or "sources"


def hold(view: WorkloadView, plan_: Plan, options: Options, now: float) -> Hold | None:
    """Whether the rollout ``plan_`` asks for must wait (``now``: epoch seconds); None: roll."""
    if plan_.action is not Action.ROLL:
        return None
    refs = _refs(plan_.changed)
    problem = ""
    if view.kind == "CronJob":
        try:
            cronjob_mode(view, options)
        except ValueError as exc:
            problem = str(exc)
    window: RestartWindow | None = None
    if not problem and view.restart_window is not None:
        try:
            window = parse_window(view.restart_window)
            opened = is_open(window, now)
            opens = next_opening(window, now)
        except (ValueError, KeyError, OverflowError) as exc:  # croniter: no opening in reach
            problem = f"invalid restart window: {exc}"
    if problem:
        return Hold("invalid", f"Not re-rolling {view.kind} {view.name} (data changed in {refs}): {problem}",
                    f"blocked: {problem}; changed: {refs}")
    if window is None or opened:
        return None
    at = epoch_to_iso(opens)
    return Hold("restart_window", f"Data changed in {refs}: {view.kind} {view.name} rolls when its restart "
                f"window opens at {at}", f"waiting for the restart window (opens {at}); changed: {refs}",
                look_in=max(opens - now, 0.0))
