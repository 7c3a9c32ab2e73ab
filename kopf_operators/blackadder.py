"""Blackadder: pure decision logic of the ChaosAgent operator (no API calls here).

Everything the handlers decide (which namespaces are candidates, which pods die, how far a
Deployment grows, what a ConfigMap becomes, what the ledger remembers and what a revert may
restore) is a plain function of data, so it is unit-tested with a fixed seed.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kopf_operators.common import DOMAIN, env_bool, set_condition, stable_hash

GROUP = "blackadder.io"
VERSION = "v1beta1"
PLURAL = "chaosagents"
KIND = "ChaosAgent"

# Namespaces no spec can make a target (the operator's own namespace is added at runtime).
DENIED_NAMESPACES: frozenset[str] = frozenset({"kube-system", "kube-public", "kube-node-lease"})
# ConfigMaps no spec can make a target, in any namespace (the cluster's CA bundle).
DENIED_CONFIGMAPS: frozenset[str] = frozenset({"kube-root-ca.crt"})
# Where the ledgers live when the operator runs outside the cluster (OPERATOR_NAMESPACE="").
DEFAULT_LEDGER_NAMESPACE = "blackadder-system"
LEDGER_PREFIX = "blackadder-ledger-"
LEDGER_KEY = "ledger.json"
LEDGER_LABEL = f"{DOMAIN}/blackadder-ledger"
MAX_REPLICAS = 128
MIN_PAUSE_SECONDS = 5
JOURNAL_LIMIT = 100
# A Secret holds at most 1 MiB; keep the ledger well below that and refuse actions that would not fit.
LEDGER_BUDGET_BYTES = 700_000

TANTRUM, CANCER, IPSUM = "tantrum", "cancer", "ipsum"
MODES = (TANTRUM, CANCER, IPSUM)


# --- Settings -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    """Operator-wide options of Blackadder (environment variables, documented in docs/blackadder.md)."""

    dry_run: bool = False  # CHAOS_DRY_RUN: forces dry-run on every agent (the chart sets it)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(dry_run=env_bool(env, "CHAOS_DRY_RUN", False))



@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """A ChaosAgent's spec, normalised (the CRD schema already applied defaults and bounds)."""

    tantrum: bool = False
    cancer: bool = False
    ipsum: bool = False
    tolerance: int = 0
    eagerness: int = 0
    pause: int = 60
    excluded: tuple[str, ...] = ()
    targets: tuple[str, ...] | None = None
    dry_run: bool = False
    dry_run_reason: str = ""
    paused: bool = False
    revert: bool = False
    revert_on_delete: bool = True
    seed: int | None = None


def settings_from_spec(spec: Mapping[str, Any], forced_dry_run: bool = False) -> AgentSettings:
    """Read a spec defensively: objects stored before a schema change may lack fields."""
    targets = spec.get("targetNamespaces")
    seed = spec.get("seed")
    dry_spec = bool(spec.get("dryRun", False))
    reason = "OperatorForced" if forced_dry_run else ("Spec" if dry_spec else "")
    return AgentSettings(
        tantrum=bool(spec.get("tantrumMode", False)),
        cancer=bool(spec.get("cancerMode", False)),
        ipsum=bool(spec.get("ipsumMode", False)),
        tolerance=max(0, int(spec.get("podTolerance", 0) or 0)),
        eagerness=min(100, max(0, int(spec.get("eagerness", 0) or 0))),
        pause=max(MIN_PAUSE_SECONDS, int(spec.get("pauseDuration", 60) or 60)),
        excluded=tuple(sorted(set(spec.get("excludedNamespaces") or ()))),
        targets=None if targets is None else tuple(sorted(set(targets))),
        dry_run=forced_dry_run or dry_spec,
        dry_run_reason=reason,
        paused=bool(spec.get("paused", False)),
        revert=bool(spec.get("revert", False)),
        revert_on_delete=bool(spec.get("revertOnDelete", True)),
        seed=None if seed is None else int(seed),
    )


# --- Scope: namespaces, deny-list, field selectors -----------------------------------------------


def ledger_namespace(operator_namespace: str) -> str:
    return operator_namespace or DEFAULT_LEDGER_NAMESPACE


def ledger_name(agent: str) -> str:
    return f"{LEDGER_PREFIX}{agent}"


def denied_namespaces(operator_namespace: str) -> frozenset[str]:
    """The hard deny-list: system namespaces, the operator's own and the ledgers' namespace."""
    return DENIED_NAMESPACES | {ledger_namespace(operator_namespace)}


def namespace_field_selector(excluded: Iterable[str]) -> str:
    """The article's server-side filter: ``metadata.namespace!=a,metadata.namespace!=b`` (sorted)."""
    return ",".join(f"metadata.namespace!={ns}" for ns in sorted(set(excluded)))


def listing_plan(settings: AgentSettings, operator_namespace: str) -> tuple[list[str] | None, str]:
    """How to list candidates: (namespaces to list one by one, or None for all), field selector."""
    excluded = set(settings.excluded) | denied_namespaces(operator_namespace)
    if settings.targets is not None:
        return [ns for ns in settings.targets if ns not in excluded], ""
    return None, namespace_field_selector(excluded)


def namespace_allowed(namespace: str, settings: AgentSettings, operator_namespace: str) -> bool:
    """Client-side double check of what the server-side selectors already filtered."""
    if namespace in denied_namespaces(operator_namespace) or namespace in settings.excluded:
        return False
    return settings.targets is None or namespace in settings.targets


# --- Inventory ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    terminating: bool = False


@dataclasses.dataclass(frozen=True)
class DeploymentRef:
    namespace: str
    name: str
    uid: str
    replicas: int
    resource_version: str = ""
    generation: int = 0


@dataclasses.dataclass(frozen=True)
class ConfigMapRef:
    namespace: str
    name: str
    uid: str
    data: Mapping[str, str] | None
    immutable: bool = False
    resource_version: str = ""


def pod_ref(obj: Mapping[str, Any]) -> PodRef:
    meta = obj.get("metadata", {})
    return PodRef(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                  bool(meta.get("deletionTimestamp")))


def deployment_ref(obj: Mapping[str, Any]) -> DeploymentRef:
    meta = obj.get("metadata", {})
    replicas = (obj.get("spec") or {}).get("replicas")
    return DeploymentRef(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                         1 if replicas is None else int(replicas), meta.get("resourceVersion", ""),
                         int(meta.get("generation") or 0))


def configmap_ref(obj: Mapping[str, Any]) -> ConfigMapRef:
    meta = obj.get("metadata", {})
    return ConfigMapRef(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                        obj.get("data"), bool(obj.get("immutable")), meta.get("resourceVersion", ""))


def pod_allowed(pod: PodRef, settings: AgentSettings, operator_namespace: str, operator_pod: str) -> bool:
    if operator_pod and pod.name == operator_pod and (not operator_namespace or pod.namespace == operator_namespace):
        return False
    return namespace_allowed(pod.namespace, settings, operator_namespace)


def configmap_allowed(cm: ConfigMapRef, settings: AgentSettings, operator_namespace: str) -> bool:
    if cm.name in DENIED_CONFIGMAPS or cm.name.startswith(LEDGER_PREFIX):
        return False
    return namespace_allowed(cm.namespace, settings, operator_namespace)


# --- Decisions ------------------------------------------------------------------------------------


def rng_for(seed: int | None, cycle: int, mode: str) -> random.Random:
    """One RNG per (seed, cycle, mode): the same seed and inventory give the same decisions, and
    toggling one mode does not change the others' draws. No seed: fresh OS entropy."""
    if seed is None:
        return random.Random()
    return random.Random(f"blackadder:{seed}:{cycle}:{mode}")


def eager(rng: random.Random, eagerness: int) -> bool:
    """True with probability eagerness/100: exactly never at 0, exactly always at 100."""
    return rng.random() * 100 < eagerness


def _key(obj: Any) -> tuple[str, str]:
    return (obj.namespace, obj.name)


def pick_pods(pods: Sequence[PodRef], tolerance: int, eagerness: int, rng: random.Random) -> list[PodRef]:
    """Pods to kill: only when at least ``tolerance`` live pods match, never below ``tolerance``,
    never pods already being deleted."""
    alive = sorted((p for p in pods if not p.terminating), key=_key)
    if len(alive) < tolerance:
        return []
    budget = len(alive) - tolerance
    picked: list[PodRef] = []
    for pod in alive:
        chosen = eager(rng, eagerness)  # draw for every pod, so decisions do not shift with budget
        if chosen and len(picked) < budget:
            picked.append(pod)
    return picked


def doubled(replicas: int) -> int:
    """The cancer growth: double, capped at MAX_REPLICAS; 0 stays 0; never shrink."""
    if replicas <= 0:
        return 0
    return max(replicas, min(replicas * 2, MAX_REPLICAS))


def pick_deployments(deployments: Sequence[DeploymentRef], eagerness: int,
                     rng: random.Random) -> list[tuple[DeploymentRef, int]]:
    picked: list[tuple[DeploymentRef, int]] = []
    for dep in sorted(deployments, key=_key):
        chosen = eager(rng, eagerness)
        target = doubled(dep.replicas)
        if chosen and target != dep.replicas:
            picked.append((dep, target))
    return picked


def ipsum_eligible(cm: ConfigMapRef) -> bool:
    return not cm.immutable and bool(cm.data)


def pick_configmaps(configmaps: Sequence[ConfigMapRef], eagerness: int, rng: random.Random) -> list[ConfigMapRef]:
    picked: list[ConfigMapRef] = []
    for cm in sorted(configmaps, key=_key):
        chosen = eager(rng, eagerness)
        if chosen and ipsum_eligible(cm):
            picked.append(cm)
    return picked


def ipsum_data(data: Mapping[str, str], paragraph: Callable[[], str]) -> dict[str, str]:
    """The same keys, every value replaced by a lorem paragraph."""
    return {key: paragraph() for key in data}


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


def iso_to_epoch(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None


def epoch_to_iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(int(epoch), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- A cycle, step by step (the controller applies what these return) ------------------------------

REVERT_STEP, PAUSED_STEP, CHAOS_STEP = "revert", "paused", "chaos"


def cycle_step(settings: AgentSettings) -> str:
    """What this cycle does: revert wins over pause, pause over chaos."""
    if settings.revert:
        return REVERT_STEP
    if settings.paused:
        return PAUSED_STEP
    return CHAOS_STEP


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The candidates of one cycle, after the deny-list and the spec's scope."""

    pods: tuple[PodRef, ...] = ()
    deployments: tuple[DeploymentRef, ...] = ()
    configmaps: tuple[ConfigMapRef, ...] = ()

    def counts(self) -> dict[str, int]:
        return {"pods": len(self.pods), "deployments": len(self.deployments), "configMaps": len(self.configmaps)}


@dataclasses.dataclass(frozen=True)
class Plan:
    kills: tuple[PodRef, ...] = ()
    scales: tuple[tuple[DeploymentRef, int], ...] = ()
    writes: tuple[ConfigMapRef, ...] = ()


def plan_cycle(inventory: Inventory, settings: AgentSettings, cycle: int) -> Plan:
    """Which candidates each enabled mode acts on in this cycle."""
    kills = pick_pods(inventory.pods, settings.tolerance, settings.eagerness,
                      rng_for(settings.seed, cycle, TANTRUM)) if settings.tantrum else []
    scales = pick_deployments(inventory.deployments, settings.eagerness,
                              rng_for(settings.seed, cycle, CANCER)) if settings.cancer else []
    writes = pick_configmaps(inventory.configmaps, settings.eagerness,
                             rng_for(settings.seed, cycle, IPSUM)) if settings.ipsum else []
    return Plan(tuple(kills), tuple(scales), tuple(writes))


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


def conditions_for(previous: Any, settings: AgentSettings, generation: int | None,
                   ready: bool, reason: str, message: str) -> list[dict[str, Any]]:
    conds = set_condition(previous, "Ready", ready, reason, message, generation)
    conds = set_condition(conds, "Paused", settings.paused, "Spec" if settings.paused else "Running",
                          "paused: true in the spec" if settings.paused else "acting every pauseDuration",
                          generation)
    dry_msg = {"OperatorForced": "CHAOS_DRY_RUN=true forces dry-run for every agent",
               "Spec": "dryRun: true in the spec"}.get(settings.dry_run_reason, "actions are real")
    return set_condition(conds, "DryRun", settings.dry_run, settings.dry_run_reason or "Off", dry_msg, generation)


def simple_status(previous: Any, settings: AgentSettings, generation: int | None, ready: bool, reason: str,
                  message: str) -> dict[str, Any]:
    """The status of a cycle that did no chaos (revert, paused, failed)."""
    status: dict[str, Any] = {"observedGeneration": generation,
                              "conditions": conditions_for(previous, settings, generation, ready, reason, message)}
    if ready:
        status["dryRun"] = settings.dry_run
    return status


def cycle_status(previous: Any, settings: AgentSettings, generation: int | None, ledger: Mapping[str, Any],
                 done: Mapping[str, int], skipped: int, candidates: Mapping[str, int],
                 ledger_ref: str) -> dict[str, Any]:
    cycle = ledger["cycle"]
    done_msg = ", ".join(f"{m} {n}" for m, n in done.items())
    return {
        "observedGeneration": generation, "cycle": cycle, "lastCycleTime": ledger["lastCycleAt"],
        "dryRun": settings.dry_run, "actions": ledger["counts"], "wouldBe": ledger["wouldBe"],
        "lastCycle": {"cycle": cycle, "dryRun": settings.dry_run, "skipped": skipped,
                      "candidates": dict(candidates), **done},
        "ledger": ledger_ref,
        "conditions": conditions_for(previous, settings, generation, True, "CycleDone",
                                     f"cycle {cycle}: {'would ' if settings.dry_run else ''}{done_msg}"),
    }
