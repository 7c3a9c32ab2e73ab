"""Blackadder: pure decision logic of the ChaosAgent operator (no API calls here).

Everything the handlers decide (which namespaces are candidates, which pods die, how far a
Deployment grows, what a ConfigMap becomes, what the ledger remembers and what a revert may
restore) is a plain function of data, so it is unit-tested with a fixed seed.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import urllib.parse
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kopf_operators.blackadder.settings import (
    CANCER,
    DENIED_CONFIGMAPS,
    IPSUM,
    JOURNAL_LIMIT,
    KILL_SWITCH_LABEL,
    LEDGER_ABANDONED_ANNOTATION,
    LEDGER_BUDGET_BYTES,
    LEDGER_KEY,
    LEDGER_PREFIX,
    MODES,
    MTBF_LABEL,
    TANTRUM,
    TENANT_LEDGER_UID_LABEL,
    WEEKDAYS,
    AgentSettings,
    denied_namespaces,
)
from kopf_operators.blackadder.targets import (
    ConfigMapRef,
    DeploymentRef,
    PodRef,
    frequency_plan,
    ipsum_data,
    max_kills,
    namespace_allowed,
    pick_configmaps,
    pick_deployments,
    pick_pods,
    regex_problem,
    rng_for,
)
from kopf_operators.core.conventions import (
    COPYRATOR_PREFIX,
    kstatus_conditions,
    matches_label_selector,
    set_condition,
    stable_hash,
)
from kopf_operators.core.http import credentials_refusal

# --- Ledger ---------------------------------------------------------------------------------------


def target_key(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}"


def empty_ledger(agent: str, agent_uid: str) -> dict[str, Any]:
    return {"version": 1, "agent": agent, "agentUid": agent_uid, "cycle": 0, "lastCycleAt": None,
            "lastCycleEpoch": None,
            "counts": {m: 0 for m in MODES}, "wouldBe": {m: 0 for m in MODES},
            "undo": {}, "journal": []}


def normalise_ledger(raw: Mapping[str, Any] | None, agent: str, agent_uid: str) -> dict[str, Any]:
    """A ledger of another agent with the same name (deleted and recreated) starts afresh."""
    if not raw or raw.get("agentUid") != agent_uid:
        return empty_ledger(agent, agent_uid)
    ledger = empty_ledger(agent, agent_uid)
    ledger.update({k: v for k, v in raw.items() if k in ledger})
    return ledger


def ledger_trust_problem(obj: Mapping[str, Any], agent_uid: str, tenant: bool, namespace: str) -> str | None:
    """Why the Secret found under an agent's ledger name is no ledger the operator wrote for this
    agent (None: it is, or it is a previous same-named agent's, which starts afresh). What a revert
    would undo comes from here, so a ledger is trusted only when:
    - it is in the operator's namespace (no tenant can write there) and is no Copyrator copy (the one
      other writer there: a copy carries any label its source had, the ledger label too);
    - it is this agent's by what only the operator sets: a ChaosAgent's ledger has an ownerReference to
      the agent's uid (an abandoned one, none: kept for an administrator), a TenantChaosAgent's the uid
      label. Content claiming this agent without that proof is forged."""
    meta = obj.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if meta.get("namespace") and meta.get("namespace") != namespace:
        return f"is not in the operator's namespace {namespace}"
    if any(str(k).startswith(COPYRATOR_PREFIX) for k in (*labels, *annotations)):
        return "is a Copyrator copy, not a ledger the operator wrote"
    if tenant:
        owned = labels.get(TENANT_LEDGER_UID_LABEL) == agent_uid
    else:
        owned = (any(ref.get("uid") == agent_uid for ref in meta.get("ownerReferences") or ())
                 or LEDGER_ABANDONED_ANNOTATION in annotations)
    if not owned and _claimed_uid(obj) == agent_uid:
        return "claims this agent but was not written by the operator (no owner of this agent's uid)"
    return None


def _claimed_uid(obj: Mapping[str, Any]) -> str | None:
    encoded = (obj.get("data") or {}).get(LEDGER_KEY)
    try:
        raw = json.loads(base64.b64decode(encoded)) if encoded else None
    except ValueError:
        return None
    return str(raw.get("agentUid")) if isinstance(raw, Mapping) else None


def revert_refusal(entry: Mapping[str, Any], settings: AgentSettings, operator_namespace: str) -> str | None:
    """Why a ledger entry may not be restored whatever the ledger says (None: it may): only a
    Deployment or a ConfigMap, in a namespace this agent may target now, never on the deny-list (the
    system namespaces, the operator's own), never a ConfigMap no spec can make a target."""
    kind, namespace, name = str(entry.get("kind")), str(entry.get("namespace")), str(entry.get("name"))
    if kind not in ("Deployment", "ConfigMap"):
        return f"{kind} is nothing a revert restores"
    if namespace in denied_namespaces(operator_namespace):
        return f"namespace {namespace} is on Blackadder's deny-list"
    if not namespace_allowed(namespace, settings, operator_namespace):
        return f"namespace {namespace} is not one this agent may target"
    if kind == "ConfigMap" and (name in DENIED_CONFIGMAPS or name.startswith(LEDGER_PREFIX)):
        return f"ConfigMap {name} is never a target"
    return None


def journal(ledger: dict[str, Any], entry: Mapping[str, Any]) -> None:
    ledger["journal"] = [*ledger.get("journal", []), dict(entry)][-JOURNAL_LIMIT:]


def record_undo(ledger: dict[str, Any], key: str, entry: Mapping[str, Any],
                current_fingerprint: Any) -> None:
    """Remember the state before our write. When we already changed this object and it still shows
    what we wrote, keep the ORIGINAL before-state (4 -> 8 after 2 -> 4 still reverts to 2)."""
    undo = ledger.setdefault("undo", {})
    previous = undo.get(key)
    merged = dict(entry)
    if previous and previous.get("uid") == entry.get("uid") and previous.get("written") == current_fingerprint:
        merged["before"] = previous["before"]
        merged["firstAt"] = previous.get("firstAt")
        merged["actions"] = int(previous.get("actions", 1)) + 1
    undo[key] = merged


def ledger_size(ledger: Mapping[str, Any]) -> int:
    return len(json.dumps(ledger, separators=(",", ":")))


def data_fingerprint(data: Mapping[str, str] | None) -> str:
    return stable_hash(dict(data or {}))


# --- Revert ---------------------------------------------------------------------------------------

RESTORE, CHANGED, GONE, UNCHANGED = "restore", "changed", "gone", "unchanged"


def revert_verdict(entry: Mapping[str, Any], current: Mapping[str, Any] | None) -> str:
    """May we restore ``entry``'s before-state over ``current`` (the object as it is now)?

    Only when the object is the same one (uid) and still shows exactly what we wrote: for a
    Deployment the replicas we set and (when known) the generation our scale produced; for a
    ConfigMap the hash of the data we wrote. Anything else is someone else's change: reported."""
    if current is None:
        return GONE
    meta = current.get("metadata", {})
    if meta.get("uid") != entry.get("uid"):
        return GONE
    if entry.get("kind") == "Deployment":
        replicas = (current.get("spec") or {}).get("replicas")
        if entry.get("pending") and replicas == entry.get("before"):
            return UNCHANGED  # a crash before our write happened: nothing to undo
        if replicas != entry.get("written"):
            return CHANGED
        generation = entry.get("generation")
        if generation is not None and meta.get("generation") != generation:
            return CHANGED
        return RESTORE
    if entry.get("pending") and data_fingerprint(current.get("data")) == data_fingerprint(entry.get("before")):
        return UNCHANGED
    if data_fingerprint(current.get("data")) != entry.get("written"):
        return CHANGED
    return RESTORE


# --- Status ---------------------------------------------------------------------------------------


def seconds_until_next_cycle(last_cycle_epoch: float | None, now_epoch: float, pause: int) -> float:
    """After a restart, wait out the rest of the pause instead of running a cycle at once."""
    if last_cycle_epoch is None:
        return 0.0
    return max(0.0, min(float(pause), last_cycle_epoch + pause - now_epoch))


# --- A cycle, step by step (the controller applies what these return) ------------------------------

REVERT_STEP, PAUSED_STEP, INVALID_STEP, IDLE_STEP, CHAOS_STEP = "revert", "paused", "invalid", "idle", "chaos"
STOPPED_STEP = "stopped"  # the global kill switch
EXCLUDED_DATE_STEP = "excluded-date"  # today is one of excludedDates


def must_halt(settings: AgentSettings, kill_switch: bool) -> bool:
    """Whether a running cycle must stop before its next action (checked before every one): an
    emergency stop acts at once, not at the next cycle."""
    return kill_switch or settings.paused or settings.revert


def still_wanted(live: AgentSettings, planned: AgentSettings, mode: str, namespace: str,
                 operator_namespace: str) -> bool:
    """Whether a planned action still matches the agent's live spec (an edit in the middle of a cycle):
    its mode still on, its namespace still allowed, and no dry-run switched on since the plan."""
    enabled = {TANTRUM: live.tantrum, CANCER: live.cancer, IPSUM: live.ipsum}[mode]
    return (enabled and not live.scope_problem and namespace_allowed(namespace, live, operator_namespace)
            and (planned.dry_run or not live.dry_run))


def halt_state(settings: AgentSettings, kill_switch: bool) -> tuple[bool, bool, bool]:
    """What wakes a sleeping agent when it changes: the kill switch, paused, revert."""
    return (kill_switch, settings.paused, settings.revert)


def kill_switch_on(operator_namespace_labels: Mapping[str, str] | None, stop_all: bool) -> bool:
    """The global kill switch: the chart's stopAll, or the label on the operator's namespace."""
    return stop_all or str((operator_namespace_labels or {}).get(KILL_SWITCH_LABEL, "")).lower() == "true"


def revert_failures(summary: Mapping[str, Any]) -> list[str]:
    """The ledger entries a revert could not restore (kept in the ledger for the next try)."""
    return list(summary.get("failed") or ())


def cycle_step(settings: AgentSettings, now: float | None = None, kill_switch: bool = False) -> str:
    """What this cycle does: revert wins over pause (and over the kill switch: undoing is stopping),
    pause over a closed time window, then chaos. Windows in an unknown time zone: the agent idles and
    reports it (revert and pause still work)."""
    if settings.revert:
        return REVERT_STEP
    if kill_switch:
        return STOPPED_STEP
    if settings.paused:
        return PAUSED_STEP
    if spec_problem(settings):
        return INVALID_STEP
    if now is not None and settings.excluded_dates and excluded_date(settings.excluded_dates,
                                                                     settings.time_zone, now):
        return EXCLUDED_DATE_STEP
    if now is not None and settings.windows and not in_windows(settings.windows, settings.time_zone, now):
        return IDLE_STEP
    return CHAOS_STEP


def spec_problem(settings: AgentSettings) -> str | None:
    """What the schema could not check: the time zone (when windows or dates use it) and the
    pod-name regular expressions. The agent then idles, Stalled with reason InvalidSpec."""
    if settings.scope_problem:
        return settings.scope_problem
    if settings.steady_problem:
        return settings.steady_problem
    if settings.windows or settings.excluded_dates:
        problem = window_problem(settings)
        if problem:
            return problem
    return (regex_problem("podNames.include", settings.pod_names_included)
            or regex_problem("podNames.exclude", settings.pod_names_excluded))


def excluded_date(dates: Iterable[str], time_zone: str, now: float) -> str | None:
    """The entry of ``dates`` that today (``now`` in ``time_zone``) is: "YYYY-MM-DD" once, "MM-DD"
    every year (chaoskube's --excluded-days-of-year); None on any other day."""
    today = datetime.datetime.fromtimestamp(now, zoneinfo.ZoneInfo(time_zone)).date()
    for date in dates:
        if date in (today.isoformat(), today.isoformat()[5:]):
            return date
    return None


# --- Time windows ---------------------------------------------------------------------------------


def _minutes(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


def _window_days(window: Mapping[str, Any]) -> set[int]:
    days = window.get("weekdays") or WEEKDAYS
    return {WEEKDAYS.index(d[:3].title()) for d in days}


def in_windows(windows: Sequence[Mapping[str, Any]], time_zone: str, now: float) -> bool:
    """Whether ``now`` (epoch) falls in one of the windows, in ``time_zone`` (its daylight saving
    included). A window is weekdays (default all) and from/to times of day ("HH:MM", from inclusive,
    to exclusive); to <= from spans midnight (the weekday is the one it starts on)."""
    local = datetime.datetime.fromtimestamp(now, zoneinfo.ZoneInfo(time_zone))
    minute, day = local.hour * 60 + local.minute, local.weekday()
    for window in windows:
        start, end = _minutes(window.get("from", "00:00")), _minutes(window.get("to", "00:00"))
        days = _window_days(window)
        if start < end:
            if day in days and start <= minute < end:
                return True
        elif (day in days and minute >= start) or ((day - 1) % 7 in days and minute < end):
            return True
    return False


def next_window_start(windows: Sequence[Mapping[str, Any]], time_zone: str, now: float) -> str | None:
    """When the next window opens, in the windows' time zone (ISO, for status)."""
    zone = zoneinfo.ZoneInfo(time_zone)
    local = datetime.datetime.fromtimestamp(now, zone)
    starts = []
    for offset in range(8):
        date = (local + datetime.timedelta(days=offset)).date()
        for window in windows:
            if date.weekday() in _window_days(window):
                start = _minutes(window.get("from", "00:00"))
                at = datetime.datetime.combine(date, datetime.time(start // 60, start % 60), zone)
                if at > local:
                    starts.append(at)
    return min(starts).isoformat(timespec="minutes") if starts else None


def window_problem(settings: AgentSettings) -> str | None:
    """A timeZone or window the schema could not check (the agent idles and says so)."""
    try:
        zoneinfo.ZoneInfo(settings.time_zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"timeZone {settings.time_zone!r} is not a known IANA time zone (e.g. Europe/Berlin)"
    return None


# --- Other operators' objects ---------------------------------------------------------------------


def copyrator_sources(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a Copyrator rule reads (fields at the top level or under spec): its ConfigMap sources'
    namespaces and label selector. Small, for an index; empty when the rule is not about ConfigMaps."""
    spec = body.get("spec")
    fields: Mapping[str, Any] = spec if isinstance(spec, Mapping) else body
    if str(fields.get("ruleType", "")).lower() != "configmap" or not isinstance(fields.get("selector"), Mapping):
        return []
    namespaces = fields.get("namespace")
    # Malformed rules (Copyrator reports them) must not break this index: anything but a name or a
    # list of names names nothing.
    namespaces = [namespaces] if isinstance(namespaces, str) else namespaces if isinstance(namespaces, list) else []
    return [{"namespace": ns, "selector": dict(fields["selector"])} for ns in namespaces if isinstance(ns, str)]


def is_copyrator_source(namespace: str, labels: Mapping[str, str] | None,
                        sources: Iterable[Mapping[str, Any]]) -> bool:
    return any(src["namespace"] == namespace and matches_label_selector(labels, {"matchLabels": src["selector"]})
               for src in sources)


# --- Webhook --------------------------------------------------------------------------------------


def webhook_refusal(url: str, allowed_hosts: Sequence[str]) -> str | None:
    """Why a webhook URL may not be used (None: it may): http(s) only, no credentials in it (they
    would show in errors), and only the operator's allowed hosts when CHAOS_WEBHOOK_HOSTS is set."""
    credentials = credentials_refusal(url, "webhook")
    if credentials:
        return credentials
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return "the webhook address must be an http:// or https:// URL"
    if allowed_hosts and parsed.hostname.lower() not in allowed_hosts:
        return f"webhook host {parsed.hostname} is not in the operator's CHAOS_WEBHOOK_HOSTS"
    return None


def webhook_payload(agent: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One action as the webhook receives it (names and counts, never ConfigMap values)."""
    keys = ("cycle", "at", "mode", "kind", "namespace", "name", "outcome", "dryRun")
    return {"agent": agent, **{k: entry.get(k) for k in keys}}


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The candidates of one cycle, after the deny-list and the spec's scope."""

    pods: tuple[PodRef, ...] = ()
    deployments: tuple[DeploymentRef, ...] = ()
    configmaps: tuple[ConfigMapRef, ...] = ()
    spared: tuple[str, ...] = ()  # the workloads left alone in a rollout (sparing.spare), as said

    def counts(self) -> dict[str, int]:
        return {"pods": len(self.pods), "deployments": len(self.deployments), "configMaps": len(self.configmaps)}


@dataclasses.dataclass(frozen=True)
class Plan:
    kills: tuple[PodRef, ...] = ()
    scales: tuple[tuple[DeploymentRef, int], ...] = ()
    writes: tuple[ConfigMapRef, ...] = ()
    frequency_problems: tuple[str, ...] = ()  # blackadder.io/mtbf labels that could not be read


MTBF = "mtbf"  # the random source of per-target frequencies


def plan_cycle(inventory: Inventory, settings: AgentSettings, cycle: int,
               replica_budget: int | None = None, elapsed: float | None = None) -> Plan:
    """Which candidates each enabled mode acts on in this cycle. ``elapsed``: the seconds this
    cycle stands for (frequency_elapsed), for the workloads' own frequencies (default: pauseDuration)."""
    alive = sum(1 for p in inventory.pods if not p.terminating)
    frequency = None
    if settings.tantrum and settings.target_frequency == "Honour":
        frequency = frequency_plan(inventory.pods, settings.pause if elapsed is None else elapsed,
                                   rng_for(settings.seed, cycle, MTBF))
    kills = pick_pods(inventory.pods, settings.tolerance, settings.eagerness, rng_for(settings.seed, cycle, TANTRUM),
                      cap=max_kills(settings.max_kills, alive),
                      allow_single_replica=settings.allow_single_replica,
                      frequency=frequency) if settings.tantrum else []
    scales = pick_deployments(inventory.deployments, settings.eagerness, rng_for(settings.seed, cycle, CANCER),
                              budget=replica_budget) if settings.cancer else []
    writes = pick_configmaps(inventory.configmaps, settings.eagerness,
                             rng_for(settings.seed, cycle, IPSUM)) if settings.ipsum else []
    return Plan(tuple(kills), tuple(scales), tuple(writes), frequency.problems if frequency else ())


def deployment_undo(dep: DeploymentRef, wanted: int, now: str) -> dict[str, Any]:
    # The generation our scale will produce: one more than listed (a concurrent spec change makes it
    # differ, and revert then reports the Deployment as changed instead of overwriting it).
    generation = dep.generation + 1 if dep.generation else None
    return {"kind": "Deployment", "namespace": dep.namespace, "name": dep.name, "uid": dep.uid,
            "before": dep.replicas, "written": wanted, "generation": generation, "firstAt": now, "lastAt": now,
            "actions": 1, "pending": True}


def write_ahead(ledger: dict[str, Any], plan: Plan, now: str, paragraph: Callable[[], str]
                ) -> tuple[list[tuple[ConfigMapRef, dict[str, str]]], list[ConfigMapRef]]:
    """Record the before-state of every planned change in ``ledger`` BEFORE making it (a crash between
    the write and the ledger update never loses an original). Returns the ConfigMap writes with their
    new data, and the ConfigMaps refused because their undo would not fit the ledger."""
    for dep, wanted in plan.scales:
        record_undo(ledger, target_key("Deployment", dep.namespace, dep.name), deployment_undo(dep, wanted, now),
                    dep.replicas)
    planned: list[tuple[ConfigMapRef, dict[str, str]]] = []
    refused: list[ConfigMapRef] = []
    for cm in plan.writes:
        new_data = ipsum_data(cm.data or {}, paragraph)
        key = target_key("ConfigMap", cm.namespace, cm.name)
        trial = {**ledger, "undo": dict(ledger.get("undo") or {})}
        record_undo(trial, key, {"kind": "ConfigMap", "namespace": cm.namespace, "name": cm.name, "uid": cm.uid,
                                 "before": dict(cm.data or {}), "written": data_fingerprint(new_data),
                                 "firstAt": now, "lastAt": now, "actions": 1, "pending": True},
                    data_fingerprint(cm.data))
        if ledger_size(trial) > LEDGER_BUDGET_BYTES:
            refused.append(cm)
            continue
        ledger["undo"] = trial["undo"]
        planned.append((cm, new_data))
    return planned, refused


def forget_undo(ledger: dict[str, Any], previous_undo: Mapping[str, Any], key: str) -> None:
    """An action that did not happen: drop its write-ahead entry (keeping an older one if any)."""
    if key in previous_undo:
        ledger["undo"][key] = previous_undo[key]
    else:
        ledger["undo"].pop(key, None)


def scale_patch(expected: int, replicas: int) -> list[dict[str, Any]]:
    """A JSON patch that fails (422) unless the replicas are still what we expect."""
    return [{"op": "test", "path": "/spec/replicas", "value": expected},
            {"op": "replace", "path": "/spec/replicas", "value": replicas}]


# --- Status -----------------------------------------------------------------------------------------


# Reasons that need a person: the agent cannot act until its spec is fixed (kstatus: Failed).
STALLED_REASONS = frozenset({"InvalidSpec"})


def conditions_for(previous: Any, settings: AgentSettings, generation: int | None,
                   ready: bool, reason: str, message: str, stalled: bool = False) -> list[dict[str, Any]]:
    """Ready (the last cycle succeeded, or the agent idles by design: paused, outside its windows,
    reverted), Stalled (``stalled``: it cannot work until a person acts), else Reconciling (a failed
    cycle that the next one retries); plus Paused and DryRun."""
    conds = kstatus_conditions(previous, ready=ready, stalled=stalled, reason=reason, message=message,
                               observed_generation=generation)
    conds = set_condition(conds, "Paused", settings.paused, "Spec" if settings.paused else "Running",
                          "paused: true in the spec" if settings.paused else "acting every pauseDuration",
                          generation)
    dry_msg = {"OperatorForced": "CHAOS_DRY_RUN=true forces dry-run for every agent",
               "Spec": "dryRun: true in the spec"}.get(settings.dry_run_reason, "actions are real")
    return set_condition(conds, "DryRun", settings.dry_run, settings.dry_run_reason or "Off", dry_msg, generation)


STATES = {"Reverted": "Reverted", "Paused": "Paused", "KillSwitch": "Paused", "OutsideWindow": "Idle",
          "ExcludedDate": "Idle",
          "CycleFailed": "Failed", "InvalidSpec": "Failed"}


def simple_status(previous: Any, settings: AgentSettings, generation: int | None, ready: bool, reason: str,
                  message: str, stalled: bool | None = None) -> dict[str, Any]:
    """The status of a cycle that did no chaos (revert, paused, idle outside its windows, failed).
    ``stalled`` None: by the reason (STALLED_REASONS)."""
    stalled = reason in STALLED_REASONS if stalled is None else stalled
    conditions = conditions_for(previous, settings, generation, ready, reason, message, stalled)
    conditions = set_condition(conditions, "Active", False, reason, message, generation)
    status: dict[str, Any] = {"observedGeneration": generation, "state": STATES.get(reason, reason),
                              "conditions": conditions}
    if ready:
        status["dryRun"] = settings.dry_run
    return status


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether patching ``new`` over ``old`` changes anything but condition timestamps."""
    def comparable(status: Mapping[str, Any]) -> dict[str, Any]:
        view = {k: v for k, v in status.items() if k != "conditions"}
        view["conditions"] = sorted(sorted((k, str(v)) for k, v in c.items() if k != "lastTransitionTime")
                                     for c in status.get("conditions") or ())
        return view
    return comparable({k: old.get(k) for k in new}) != comparable(new)


def cycle_status(previous: Any, settings: AgentSettings, generation: int | None, ledger: Mapping[str, Any],
                 done: Mapping[str, int], skipped: int, candidates: Mapping[str, int],
                 ledger_ref: str, frequency_problems: Sequence[str] = (), spared: int = 0,
                 disrupting: Sequence[Mapping[str, str]] | None = None) -> dict[str, Any]:
    cycle = ledger["cycle"]
    done_msg = ", ".join(f"{m} {n}" for m, n in done.items())
    if frequency_problems:
        done_msg += (f"; {len(frequency_problems)} workload(s) left alone for unreadable {MTBF_LABEL} labels: "
                     + "; ".join(frequency_problems[:3]))
    return {
        "observedGeneration": generation, "cycle": cycle, "lastCycleTime": ledger["lastCycleAt"],
        "dryRun": settings.dry_run, "actions": ledger["counts"], "wouldBe": ledger["wouldBe"],
        "lastCycle": {"cycle": cycle, "dryRun": settings.dry_run, "skipped": skipped,
                      "candidates": dict(candidates), **done,
                      # always written, so that a fixed label clears it (a status patch merges)
                      "invalidFrequencyLabels": list(frequency_problems[:10]), "sparedRollouts": spared},
        **({"disrupting": list(disrupting)} if disrupting is not None else {}),
        "ledger": ledger_ref,
        "state": "Active",
        "conditions": set_condition(
            conditions_for(previous, settings, generation, True, "CycleDone",
                           f"cycle {cycle}: {'would ' if settings.dry_run else ''}{done_msg}"),
            "Active", True, "InWindow" if settings.windows else "Always",
            "inside activeWindows" if settings.windows else "no activeWindows: always active", generation),
    }


# --- One cycle's decision ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CycleDecision:
    """What a cycle does: ``step`` (chaos: plan and act, then ``cycle_status``; revert: restore the
    ledger, then ``revert_status``); for a cycle without chaos or revert, the ``status`` to write and
    what to say about it once per episode (``say``: "log" a line, or a "Warning" Event; ``reason``,
    ``message``)."""

    step: str
    status: dict[str, Any] | None = None
    say: str | None = None
    reason: str = ""
    message: str = ""


def _ready_reason(conditions: Any) -> str | None:
    return next((str(c.get("reason")) for c in conditions or () if c.get("type") == "Ready"), None)


def _waiting(step: str, settings: AgentSettings, now: float) -> tuple[bool, str, str] | None:
    """Why a cycle makes no chaos, as (ready, reason, message), or None when it does."""
    if step == INVALID_STEP:
        return False, "InvalidSpec", spec_problem(settings) or "invalid spec"
    if step == EXCLUDED_DATE_STEP:
        date = excluded_date(settings.excluded_dates, settings.time_zone, now)
        return True, "ExcludedDate", f"today is an excluded date ({date} in {settings.time_zone}): no chaos"
    if step == IDLE_STEP:
        opens = next_window_start(settings.windows, settings.time_zone, now)
        return True, "OutsideWindow", f"outside activeWindows ({settings.time_zone}); idle until {opens or 'never'}"
    return None


def decide_cycle(settings: AgentSettings, now: float, kill_switch: bool, previous: Any, generation: int | None,
                 ledger_namespace: str) -> CycleDecision:
    """One cycle of one agent, from what it observed: its settings, the clock, the kill switch and the
    conditions its status holds."""
    step = cycle_step(settings, now, kill_switch)
    if step in (REVERT_STEP, CHAOS_STEP):
        return CycleDecision(step)
    if step == STOPPED_STEP:
        return CycleDecision(step, simple_status(
            previous, settings, generation, True, "KillSwitch",
            f"stopped by the kill switch ({KILL_SWITCH_LABEL}=true on namespace {ledger_namespace}, or "
            "CHAOS_STOP_ALL) — no chaos"))
    if step == PAUSED_STEP:
        return CycleDecision(step, simple_status(previous, settings, generation, True, "Paused",
                                                 "paused: true — no chaos"))
    waiting = _waiting(step, settings, now)
    if waiting is None:  # a step this function does not know: no chaos rather than a guess
        return CycleDecision(CHAOS_STEP)
    ready, reason, message = waiting
    say = None if _ready_reason(previous) == reason else "log" if ready else "Warning"
    return CycleDecision(step, simple_status(previous, settings, generation, ready, reason, message), say,
                         reason, message)


def revert_status(previous: Any, settings: AgentSettings, generation: int | None,
                  summary: Mapping[str, Any]) -> dict[str, Any]:
    """The status after a cycle with revert: true (``summary``: what the revert did)."""
    failed = summary["failed"]
    status = simple_status(
        previous, settings, generation, not failed, "Reverted" if not failed else "RevertFailed",
        "revert: true — no chaos; the ledger has been reverted" if not failed else
        f"revert: true — no chaos; {len(failed)} change(s) could not be restored yet (retried "
        "every pauseDuration): see status.revert.failed")
    if summary["processed"]:
        status["revert"] = summary
    status["disrupting"] = []  # reverted: the agent disrupts nothing any more
    return status


def failed_status(previous: Any, settings: AgentSettings, generation: int | None, error: str,
                  retried: bool) -> dict[str, Any]:
    """The status after a failed cycle: retried by the next cycle (Reconciling), unless the API refused
    it (403, 422...): then only a person can help (Stalled)."""
    return simple_status(previous, settings, generation, False, "CycleFailed", error[:300], stalled=not retried)
