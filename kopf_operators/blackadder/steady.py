"""Blackadder's steady state and game days: pure decisions (no API calls here).

An agent with ``spec.steadyState``, ``spec.duration`` or ``spec.maxActions`` runs a *run*: it starts
with the first cycle, checks its steady-state hypothesis before each cycle and every few seconds in
between, and ends Halted (a check failed ``failureThreshold`` times in a row), or Finished (its
duration elapsed or it took ``maxActions`` actions). The run's record lives in the agent's ledger
(``ledger["run"]``) and is reported as ``status.run``. Everything here is a plain function of data.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import statistics
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kopf_operators.core.conventions import iso_to_epoch
from kopf_operators.core.http import credentials_refusal

DEFAULT_INTERVAL_SECONDS = 5
DEFAULT_FAILURE_THRESHOLD = 3
DEFAULT_HTTP_TIMEOUT_SECONDS = 2.0
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ImmortalContainer")
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
# The key of a check's Secret holding its URL (as the webhook's).
URL_SECRET_KEY = "address"
ANSWER_LIMIT = 200  # characters of a check's last answer kept in status
RECOVERY_LIMIT = 50  # recovery times kept per workload (p50 and max are over these)

HALTED, FINISHED = "Halted", "Finished"
STEADY_STATE_BROKEN, DURATION_ELAPSED, MAX_ACTIONS = "SteadyStateBroken", "DurationElapsed", "MaxActionsReached"

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    kind: str  # "workload", "http" or "prometheus"
    spec: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class GameDay:
    """An agent's steady state and run limits, normalised (all optional: an empty one changes nothing)."""

    checks: tuple[Check, ...] = ()
    interval: float = DEFAULT_INTERVAL_SECONDS
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD
    revert_on_halt: bool = True
    duration: float | None = None  # seconds
    max_actions: int | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.checks) or self.duration is not None or self.max_actions is not None


def parse_duration(text: Any) -> float | None:
    """"90s", "10m", "1h30m" (Go's style, whole units) -> seconds; None when unset or unreadable."""
    if text is None or text == "":
        return None
    if isinstance(text, int | float):
        return float(text)
    match = _DURATION.match(str(text).strip())
    if not match or not any(match.groups()):
        return None
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def game_day_from_spec(spec: Mapping[str, Any], namespace: str | None = None) -> GameDay:
    """Read the spec defensively. ``namespace``: a TenantChaosAgent's own namespace, where every
    workload check is confined whatever it names (the schema has no namespace field for tenants)."""
    steady = spec.get("steadyState") or {}
    checks = []
    for raw in steady.get("checks") or ():
        raw = json.loads(json.dumps(raw))
        kind = next((k for k in ("workload", "http", "prometheus") if raw.get(k)), "")
        body = dict(raw.get(kind) or {})
        if kind == "workload" and namespace is not None:
            body["namespace"] = namespace
        checks.append(Check(str(raw.get("name") or kind), kind, body))
    max_actions = spec.get("maxActions")
    return GameDay(
        checks=tuple(checks),
        interval=max(1.0, float(steady.get("intervalSeconds") or DEFAULT_INTERVAL_SECONDS)),
        failure_threshold=max(1, int(steady.get("failureThreshold") or DEFAULT_FAILURE_THRESHOLD)),
        revert_on_halt=bool(steady.get("revertOnHalt", True)),
        duration=parse_duration(spec.get("duration")),
        max_actions=None if max_actions is None else max(0, int(max_actions)),
    )


# --- Judging one answer ---------------------------------------------------------------------------


def minimum_available(wanted: Any, desired: int) -> int:
    """``minAvailable``: a count, or a percentage of the desired replicas (rounded up); default all."""
    if wanted is None or wanted == "":
        return desired
    text = str(wanted).strip()
    if text.endswith("%"):
        percent = int(text[:-1])
        return -(-desired * percent // 100)
    return int(text)


def workload_answer(kind: str, obj: Mapping[str, Any] | None, min_available: Any) -> tuple[bool, str]:
    """Whether a workload is available enough, and what it answered (for status)."""
    if obj is None:
        return False, f"{kind} not found"
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    if kind == "ImmortalContainer":
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
        return ready, "Ready" if ready else "not Ready"
    if kind == "DaemonSet":
        desired = int(status.get("desiredNumberScheduled") or 0)
        available = int(status.get("numberAvailable") or 0)
    else:
        desired = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        available = int(status.get("availableReplicas") or 0)
    needed = minimum_available(min_available, desired)
    return available >= needed, f"{available}/{desired} available (needs {needed})"


def compare(value: float, op: str, threshold: float) -> bool:
    return {"<": value < threshold, "<=": value <= threshold, ">": value > threshold, ">=": value >= threshold,
            "==": value == threshold, "!=": value != threshold}[op]


def prometheus_answer(payload: Mapping[str, Any], op: str, threshold: float) -> tuple[bool, str]:
    """An instant query's answer (Prometheus' JSON) against the threshold: a scalar, or a vector whose
    every sample must pass. No sample at all fails (a query that finds nothing proves nothing)."""
    if payload.get("status") != "success":
        return False, f"query failed: {str(payload.get('error') or payload.get('status'))[:100]}"
    data = payload.get("data") or {}
    result = data.get("result")
    if data.get("resultType") == "scalar":
        samples = [result]
    elif data.get("resultType") == "vector":
        samples = [item.get("value") for item in result or ()]
    else:
        return False, f"unsupported result type {data.get('resultType')!r}"
    values: list[float] = []
    for sample in samples:
        try:
            values.append(float(sample[1]))  # type: ignore[index]
        except (TypeError, ValueError, IndexError):
            return False, "unreadable sample"
    if not values:
        return False, "no data"
    failing = [v for v in values if not compare(v, op, threshold)]
    shown = failing[0] if failing else values[0]
    return not failing, f"{shown:g} {'' if not failing else 'not '}{op} {threshold:g}"


def http_answer(status: int | None, error: str = "") -> tuple[bool, str]:
    if status is None:
        return False, error or "no answer"
    return 200 <= status < 300, f"HTTP {status}"


def url_refusal(url: str, allowed_hosts: Sequence[str], what: str = "check",
                hosts_setting: str = "CHAOS_CHECK_HOSTS") -> str | None:
    """Why an HTTP check's URL may not be used: http(s) only, no credentials in it, and only allowed
    hosts (an empty allow-list allows none: a check makes the operator send requests from inside the
    cluster). ``hosts_setting``: the allow-list's name (the tenants have their own). Never shows
    more of the URL than its host."""
    credentials = credentials_refusal(url, what)
    if credentials:
        return credentials
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"the {what} URL must be an http:// or https:// URL"
    if parsed.hostname.lower() not in allowed_hosts:
        return f"host {parsed.hostname} is not in the operator's {hosts_setting}"
    return None


def safe_url(url: str) -> str:
    """A URL as it may appear in status, Events and logs: scheme, host and port only (a URL from a
    Secret may carry a token in its user, path, query or fragment)."""
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        return "(an unreadable URL)"
    try:
        port = f":{parsed.port}" if parsed.port else ""
    except ValueError:
        port = ""
    return f"{parsed.scheme}://{parsed.hostname}{port}"


# --- The run --------------------------------------------------------------------------------------


def new_run(now: float, generation: int | None) -> dict[str, Any]:
    return {"start": now, "end": None, "state": None, "why": None, "message": "", "generation": generation,
            "actions": {}, "checks": {}, "workloads": {}, "pending": []}


def run_for(ledger: dict[str, Any], game: GameDay, now: float, generation: int | None) -> dict[str, Any] | None:
    """The agent's current run (started now when there is none). A Halted run stays so until the
    spec changes (a new generation: any edit, e.g. a new value of ``spec.resume``); then a new run
    starts. A Finished run reopens when its limits are raised (duration, maxActions)."""
    if not game.enabled:
        return None
    run: dict[str, Any] | None = ledger.get("run")
    resumed = run is not None and run.get("state") == HALTED and generation is not None and generation != run.get(
        "generation")
    if not run or resumed:
        run = ledger["run"] = new_run(now, generation)
    elif run.get("state") == FINISHED and limit_reached(run, game, now) is None:
        run.update(end=None, state=None, message="", why=None)
    run["generation"] = generation
    return run


def actions_taken(run: Mapping[str, Any]) -> int:
    return sum(int(n) for n in (run.get("actions") or {}).values())


def actions_left(run: Mapping[str, Any], game: GameDay) -> int | None:
    return None if game.max_actions is None else max(0, game.max_actions - actions_taken(run))


def limit_reached(run: Mapping[str, Any], game: GameDay, now: float) -> tuple[str, str] | None:
    """(why, message) when the run must finish now: its duration elapsed, or maxActions taken."""
    if game.duration is not None and now >= float(run["start"]) + game.duration:
        return DURATION_ELAPSED, f"duration {game.duration:g}s elapsed"
    if game.max_actions is not None and actions_taken(run) >= game.max_actions:
        return MAX_ACTIONS, f"{actions_taken(run)} of maxActions {game.max_actions} taken"
    return None


def end_run(run: dict[str, Any], now: float, state: str, why: str, message: str) -> None:
    run.update(end=now, state=state, why=why, message=message[:300])


def ended(run: Mapping[str, Any] | None) -> bool:
    return bool(run) and run.get("end") is not None  # type: ignore[union-attr]


def add_actions(run: dict[str, Any], done: Mapping[str, int]) -> None:
    actions = run.setdefault("actions", {})
    for mode, n in done.items():
        if n:
            actions[mode] = int(actions.get(mode, 0)) + int(n)


def record_check(run: dict[str, Any], name: str, ok: bool, answer: str) -> int:
    """Count one evaluation; returns the check's consecutive failures (0 after a pass)."""
    tally = run.setdefault("checks", {}).setdefault(name, {"pass": 0, "fail": 0, "consecutive": 0, "last": ""})
    tally["pass" if ok else "fail"] += 1
    tally["consecutive"] = 0 if ok else int(tally["consecutive"]) + 1
    tally["last"] = answer[:ANSWER_LIMIT]
    return int(tally["consecutive"])


def broken_check(run: Mapping[str, Any], game: GameDay) -> tuple[str, str] | None:
    """(name, last answer) of the first check at or past failureThreshold consecutive failures."""
    for check in game.checks:
        tally = (run.get("checks") or {}).get(check.name) or {}
        if int(tally.get("consecutive", 0)) >= game.failure_threshold:
            return check.name, str(tally.get("last", ""))
    return None


def failing_checks(run: Mapping[str, Any], game: GameDay) -> list[str]:
    """Checks whose last evaluation failed (no chaos while one does)."""
    return [c.name for c in game.checks if int(((run.get("checks") or {}).get(c.name) or {}).get("consecutive", 0))]


# --- Recovery -------------------------------------------------------------------------------------


def pod_ready_since(pod: Mapping[str, Any]) -> float | None:
    """When the Pod became Ready (its condition's lastTransitionTime), None when it is not Ready."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return iso_to_epoch(cond.get("lastTransitionTime")) if cond.get("status") == "True" else None
    return None


def owned_by(pod: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in (pod.get("metadata") or {}).get("ownerReferences") or ())


def recovery(killed_at: float, killed_uid: str, pods: Iterable[Mapping[str, Any]]) -> tuple[float | None, int, int]:
    """A workload after one kill: (seconds from the kill until all its Pods were Ready again, or None
    while they are not; Pods ready; Pods). Recovered means: no Pod terminating, the killed one gone,
    every Pod Ready, and at least one Pod Ready since the kill (its replacement); the time is when the
    last of them became Ready, from the Pods' own conditions (whole seconds)."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    terminating = any((p.get("metadata") or {}).get("deletionTimestamp") for p in pods)
    readies = [pod_ready_since(p) for p in live]
    ready = sum(1 for r in readies if r is not None)
    if (terminating or not live or ready < len(live)
            or any((p.get("metadata") or {}).get("uid") == killed_uid for p in live)):
        return None, ready, len(live)
    last = max(r for r in readies if r is not None)
    if last < int(killed_at):  # no Pod became Ready since the kill: its replacement is yet to come
        return None, ready, len(live)
    return max(0.0, last - killed_at), ready, len(live)


def note_kill(run: dict[str, Any], workload: str, owner_uid: str, namespace: str, pod_uid: str, at: float) -> None:
    """Remember a kill until its workload is whole again."""
    if owner_uid:
        run.setdefault("pending", []).append({"workload": workload, "owner": owner_uid, "namespace": namespace,
                                              "pod": pod_uid, "at": at})


def note_availability(run: dict[str, Any], workload: str, ready: int, total: int) -> None:
    entry = run.setdefault("workloads", {}).setdefault(workload, {"lowest": None, "recoveries": []})
    share = ready / total if total else 0.0
    if entry["lowest"] is None or share < float(entry["lowest"]):
        entry["lowest"] = round(share, 3)


def note_recovery(run: dict[str, Any], workload: str, seconds: float) -> None:
    entry = run.setdefault("workloads", {}).setdefault(workload, {"lowest": None, "recoveries": []})
    entry["recoveries"] = [*entry["recoveries"], round(seconds, 3)][-RECOVERY_LIMIT:]


def recovery_summary(recoveries: Sequence[float]) -> dict[str, Any]:
    if not recoveries:
        return {"recovered": 0}
    return {"recovered": len(recoveries), "p50Seconds": round(statistics.median(recoveries), 3),
            "maxSeconds": round(max(recoveries), 3)}


# --- Status -----------------------------------------------------------------------------------------


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).replace(microsecond=0).isoformat().replace(
        "+00:00", "Z")


def verdict(run: Mapping[str, Any]) -> str:
    """The short verdict `kubectl get` shows."""
    checks = run.get("checks") or {}
    failed = sum(int(t.get("fail", 0)) for t in checks.values())
    passed = sum(int(t.get("pass", 0)) for t in checks.values())
    if run.get("state") == HALTED:
        return f"halted: {run.get('message', '')}"[:80]
    held = f"held {passed}/{passed + failed} checks" if checks else f"{actions_taken(run)} actions"
    return ("finished, " if run.get("state") == FINISHED else "running, ") + held


def run_status(run: Mapping[str, Any]) -> dict[str, Any]:
    """``status.run``: the run's report."""
    workloads = {name: {"lowestAvailability": entry.get("lowest"),
                        **recovery_summary(entry.get("recoveries") or ())}
                 for name, entry in sorted((run.get("workloads") or {}).items())[:50]}
    checks = {name: {"passed": t.get("pass", 0), "failed": t.get("fail", 0), "last": t.get("last", "")}
              for name, t in sorted((run.get("checks") or {}).items())}
    return {"start": _iso(run.get("start")), "end": _iso(run.get("end")), "state": run.get("state") or "Running",
            "reason": run.get("why"),
            "message": run.get("message") or "", "actions": dict(run.get("actions") or {}),
            "workloads": workloads, "checks": checks, "verdict": verdict(run)}
