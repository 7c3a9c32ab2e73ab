"""Blackadder: the candidates and the victims (pure, no API calls): the listing's scope and selectors,
the references a cycle keeps of Pods, Deployments and ConfigMaps, which of them a spec allows, and
the seeded picks of each mode (tolerance, eagerness, per-target frequencies, the replica budget)."""

from __future__ import annotations

import collections
import dataclasses
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kopf_operators.blackadder.settings import (
    DENIED_CONFIGMAPS,
    KILL_ALL,
    KILL_FIXED,
    KILL_FIXED_PERCENT,
    KILL_MODE_LABEL,
    KILL_MODES,
    KILL_VALUE_LABEL,
    LEDGER_PREFIX,
    MAX_REPLICAS,
    MTBF_LABEL,
    OPT_LABEL,
    AgentSettings,
    denied_namespaces,
)
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL, iso_to_epoch, matches_label_selector
from kopf_operators.core.patterns import tenant_pattern


def namespace_field_selector(excluded: Iterable[str]) -> str:
    """The article's server-side filter: ``metadata.namespace!=a,metadata.namespace!=b`` (sorted)."""
    return ",".join(f"metadata.namespace!={ns}" for ns in sorted(set(excluded)))


def listing_plan(settings: AgentSettings, operator_namespace: str) -> tuple[list[str] | None, str]:
    """How to list candidates: (namespaces to list one by one, or None for all), field selector."""
    excluded = set(settings.excluded) | denied_namespaces(operator_namespace)
    if settings.targets is not None:
        return [ns for ns in settings.targets if ns not in excluded], ""
    return None, namespace_field_selector(excluded)


def listing_plan_for(settings: AgentSettings, operator_namespace: str,
                     namespace_labels: Mapping[str, Mapping[str, str]]) -> tuple[list[str] | None, str]:
    """``listing_plan`` with the namespaceSelector: then only the matching namespaces (from the
    namespaces index) are listed, one by one."""
    namespaces, selector = listing_plan(settings, operator_namespace)
    if settings.namespace_selector is None:
        return namespaces, selector
    matching = sorted(ns for ns, labels in namespace_labels.items()
                      if matches_label_selector(labels, settings.namespace_selector)
                      and namespace_allowed(ns, settings, operator_namespace))
    return [ns for ns in matching if namespaces is None or ns in namespaces], ""


def selector_string(selector: Mapping[str, Any] | None) -> str:
    """A LabelSelector (matchLabels, matchExpressions) as the API's labelSelector query string."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), sorted(expr.get("values") or ())
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def label_selector_for(kind: str, settings: AgentSettings) -> str:
    """The server-side label selector of a listing: the opt-in/opt-out label, the podSelector (Pods),
    and without sharedConfigMaps: Include, no Copyrator copies (ConfigMaps)."""
    parts = [f"{OPT_LABEL}=true" if settings.require_opt_in else f"{OPT_LABEL}!=false"]
    if kind == "Pod" and settings.pod_selector:
        parts.append(selector_string(settings.pod_selector))
    if kind == "ConfigMap" and settings.shared_configmaps != "Include":
        parts.append(f"!{COPYRATOR_RULE_UID_LABEL}")
    return ",".join(p for p in parts if p)


def pod_field_selector(namespace_selector: str) -> str:
    """Pods that have ended are no candidates (nothing to kill), filtered server-side too."""
    return ",".join(p for p in (namespace_selector, "status.phase!=Succeeded,status.phase!=Failed") if p)


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
    owner: str = ""  # uid of its controller (ReplicaSet, StatefulSet, ...); "" for a bare pod
    ready: bool = True
    created: float | None = None  # epoch seconds
    owner_kind: str = ""  # the kind of its controller; "" for a bare pod
    # Its own frequency (labels blackadder.io/mtbf, kill-mode, kill-value), "" when unlabelled.
    mtbf: str = ""
    kill_mode: str = ""
    kill_value: str = ""
    workload_name: str = ""  # "Kind/namespace/name" of what owns it (a ReplicaSet's Deployment), for reports

    @property
    def workload(self) -> str:
        return self.owner or f"bare:{self.namespace}/{self.name}"


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


def _controller(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((ref for ref in meta.get("ownerReferences") or () if ref.get("controller")), {})


def pod_ref(obj: Mapping[str, Any]) -> PodRef:
    meta = obj.get("metadata", {})
    controller = _controller(meta)
    conditions = (obj.get("status") or {}).get("conditions") or ()
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    labels = meta.get("labels") or {}
    return PodRef(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                  bool(meta.get("deletionTimestamp")), controller.get("uid", ""), ready,
                  iso_to_epoch(meta.get("creationTimestamp")), controller.get("kind", ""),
                  str(labels.get(MTBF_LABEL, "")), str(labels.get(KILL_MODE_LABEL, "")),
                  str(labels.get(KILL_VALUE_LABEL, "")), workload_of(meta, controller))


def workload_of(meta: Mapping[str, Any], controller: Mapping[str, Any]) -> str:
    """The workload a Pod belongs to, as reports name it: a ReplicaSet's Deployment (its name less the
    pod-template-hash), else the controller itself; "" for a bare Pod."""
    kind, name = str(controller.get("kind", "")), str(controller.get("name", ""))
    if not kind:
        return ""
    suffix = "-" + str((meta.get("labels") or {}).get("pod-template-hash", "-"))
    if kind == "ReplicaSet" and name.endswith(suffix):
        kind, name = "Deployment", name[:-len(suffix)]
    return f"{kind}/{meta.get('namespace', '')}/{name}"


# The owner kind of a Pod without a controller, in ownerKinds.include/exclude.
BARE_POD_KIND = "None"


def owner_kind_allowed(owner_kind: str, settings: AgentSettings) -> bool:
    """chaoskube's --kinds: include (when set) is the only kinds allowed, exclude never; a bare Pod
    has the kind "None"."""
    kind = owner_kind or BARE_POD_KIND
    if settings.owner_kinds_included and kind not in settings.owner_kinds_included:
        return False
    return kind not in settings.owner_kinds_excluded


def regex_problem(field: str, text: str) -> str | None:
    """Why ``text`` is no regular expression RE2 runs (the schema cannot tell; the agent idles and
    says so): RE2, as chaoskube's Go regexp, so a tenant's pattern takes linear time in the name."""
    if not text:
        return None
    problem = tenant_pattern(text).problem
    if problem is not None:
        return f"{field} {text[:80]!r} is not a valid regular expression: {problem}"
    return None


def pod_name_allowed(name: str, settings: AgentSettings) -> bool:
    """chaoskube's --included-pod-names / --excluded-pod-names: the regex is searched in the name
    (anchor it with ^...$ for a full match). Call only when spec_problem() found nothing (a refused
    pattern matches nothing: an include then allows no Pod)."""
    if settings.pod_names_included and not tenant_pattern(settings.pod_names_included).search(name):
        return False
    return not (settings.pod_names_excluded and tenant_pattern(settings.pod_names_excluded).search(name))


def pod_selected(obj: Mapping[str, Any], settings: AgentSettings, now: float) -> bool:
    """What the server-side selectors cannot express: the annotation selector, the minimum age, the
    owner kind and the pod-name patterns (all from the listed object: no request)."""
    meta = obj.get("metadata", {})
    if not matches_label_selector(meta.get("annotations") or {}, settings.annotation_selector):
        return False
    if not owner_kind_allowed(str(_controller(meta).get("kind", "")), settings):
        return False
    if not pod_name_allowed(str(meta.get("name", "")), settings):
        return False
    created = iso_to_epoch(meta.get("creationTimestamp"))
    return settings.min_pod_age <= 0 or (created is not None and now - created >= settings.min_pod_age)


def deployment_selected(obj: Mapping[str, Any], settings: AgentSettings) -> bool:
    """A Deployment is a candidate when the pods it makes match the podSelector."""
    template_labels = (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels")
    return matches_label_selector(template_labels or {}, settings.pod_selector)


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


def max_kills(value: int | str | None, alive: int) -> int | None:
    """maxKillsPerCycle: a count, or a percentage of the live candidates ("25%", rounded down but at
    least 1 when above 0 %); None: no cap."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        percent = float(value.strip()[:-1])
        return 0 if percent <= 0 else max(1, math.floor(alive * percent / 100))
    return max(0, int(value))


# --- Per-target frequency (kube-monkey's mtbf, kill-type, kill-value) ------------------------------

_DURATION = re.compile(r"^([1-9][0-9]{0,5})([smhd]?)$")
_UNIT_SECONDS = {"": 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}  # no unit: days, as kube-monkey


@dataclasses.dataclass(frozen=True)
class Frequency:
    """A workload's own frequency: its mean time between failures and how many Pods a failure kills."""

    mtbf_seconds: float
    mode: str = KILL_FIXED
    value: int = 1


def parse_frequency(mtbf: str, mode: str, value: str) -> tuple[Frequency | None, str | None]:
    """The labels as a Frequency, or why they are not one. ``mtbf``: "3" (days, as kube-monkey),
    "3d", "12h", "90m", "600s"; ``mode``: fixed (default, ``value`` Pods, default 1), kill-all,
    fixed-percent or random-max-percent (``value`` 0-100)."""
    match = _DURATION.match(mtbf.strip())
    if not match:
        return None, f"{MTBF_LABEL}={mtbf!r} is not a duration like 3 (days), 3d, 12h, 90m or 600s"
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    mode = mode.strip() or KILL_FIXED
    if mode not in KILL_MODES:
        return None, f"{KILL_MODE_LABEL}={mode!r} is not one of {', '.join(KILL_MODES)}"
    if mode == KILL_ALL:
        return Frequency(seconds, mode, 0), None
    text = value.strip() or ("1" if mode == KILL_FIXED else "")
    if not text.isdigit():
        return None, f"{KILL_VALUE_LABEL}={value!r}: {mode} needs a whole number"
    number = int(text)
    if mode == KILL_FIXED and number < 1:
        return None, f"{KILL_VALUE_LABEL}={value!r}: fixed needs at least 1"
    if mode != KILL_FIXED and number > 100:
        return None, f"{KILL_VALUE_LABEL}={value!r}: {mode} needs a percentage from 0 to 100"
    return Frequency(seconds, mode, number), None


def failure_probability(mtbf_seconds: float, elapsed: float) -> float:
    """The chance that a workload with this mean time between failures fails within ``elapsed``
    seconds (failures as a Poisson process: 1 - e^(-elapsed/mtbf))."""
    return 1.0 - math.exp(-max(0.0, elapsed) / mtbf_seconds)


def frequency_elapsed(last_cycle_epoch: float | None, now: float, pause: int) -> float:
    """The time this cycle stands for: since the last chaos cycle, at most two pauses (time the agent
    idled, was paused or the operator was down does not count), one pause for the first cycle."""
    if last_cycle_epoch is None:
        return float(pause)
    return min(max(0.0, now - last_cycle_epoch), 2.0 * pause)


def kill_count(frequency: Frequency, alive: int, rng: random.Random) -> int:
    """How many of a workload's ``alive`` Pods one failure kills (before the agent's caps)."""
    if frequency.mode == KILL_ALL:
        return alive
    if frequency.mode == KILL_FIXED:
        return min(alive, frequency.value)
    most = math.floor(alive * frequency.value / 100)
    if frequency.mode == KILL_FIXED_PERCENT:
        return min(alive, max(1, most)) if frequency.value > 0 else 0
    return rng.randint(0, most)  # random-max-percent, as kube-monkey: from none up to the percentage


@dataclasses.dataclass(frozen=True)
class FrequencyPlan:
    """Which workloads have their own frequency, which of their Pods fail this cycle, and the labels
    that could not be read (those workloads are left alone: never killed at the agent's eagerness)."""

    workloads: frozenset[str] = frozenset()
    chosen: frozenset[tuple[str, str]] = frozenset()
    problems: tuple[str, ...] = ()


def frequency_plan(pods: Sequence[PodRef], elapsed: float, rng: random.Random) -> FrequencyPlan:
    """Each labelled workload (in name order) fails with failure_probability(mtbf, elapsed); a failing
    one loses kill_count Pods, drawn at random. The labels of its first Pod (by name) count."""
    groups: dict[str, list[PodRef]] = {}
    for pod in sorted((p for p in pods if not p.terminating), key=_key):
        groups.setdefault(pod.workload, []).append(pod)
    workloads: set[str] = set()
    chosen: set[tuple[str, str]] = set()
    problems: list[str] = []
    for workload in sorted(groups, key=lambda w: _key(groups[w][0])):
        members = groups[workload]
        labelled = next((p for p in members if p.mtbf or p.kill_mode or p.kill_value), None)
        if labelled is None:
            continue
        workloads.add(workload)
        frequency, problem = parse_frequency(labelled.mtbf, labelled.kill_mode, labelled.kill_value)
        if frequency is None:
            problems.append(f"{labelled.namespace}/{labelled.name}: {problem}")
            continue
        if rng.random() < failure_probability(frequency.mtbf_seconds, elapsed):
            count = kill_count(frequency, len(members), rng)
            chosen.update(_key(p) for p in rng.sample(members, count))
    return FrequencyPlan(frozenset(workloads), frozenset(chosen), tuple(problems))


def pick_pods(pods: Sequence[PodRef], tolerance: int, eagerness: int, rng: random.Random,
              cap: int | None = None, allow_single_replica: bool = True,
              frequency: FrequencyPlan | None = None) -> list[PodRef]:
    """Pods to kill: only when at least ``tolerance`` live pods match, never below ``tolerance``,
    never pods already being deleted, at most ``cap``; without ``allow_single_replica`` never the
    last ready replica of a workload (a bare pod is a workload of one). The workloads of
    ``frequency`` follow their own frequency instead of ``eagerness`` and come first (the caps
    still apply to them)."""
    alive = sorted((p for p in pods if not p.terminating), key=_key)
    if len(alive) < tolerance:
        return []
    budget = len(alive) - tolerance
    if cap is not None:
        budget = min(budget, cap)
    ready = collections.Counter(p.workload for p in alive if p.ready)
    left = {w: n - 1 for w, n in ready.items()}  # each workload keeps at least one ready replica
    own = frequency or FrequencyPlan()
    planned = [p for p in alive if p.workload in own.workloads and _key(p) in own.chosen]
    # Eagerness draws for every other pod, in name order, so decisions do not shift with the budget.
    drawn = [p for p in alive if p.workload not in own.workloads and eager(rng, eagerness)]
    # The caps take a random few of the chosen, not the first by name: with eagerness 100 and a cap of
    # one, every pod in turn, not the same first pod every cycle. Shuffled after the draws, so the
    # chosen set does not depend on the budget (the seed still decides the order).
    rng.shuffle(planned)
    rng.shuffle(drawn)
    picked: list[PodRef] = []
    for pod in planned + drawn:
        if len(picked) >= budget:
            break
        if not allow_single_replica:
            if left.get(pod.workload, 0) <= 0:
                continue
            left[pod.workload] -= 1
        picked.append(pod)
    return picked


def doubled(replicas: int) -> int:
    """The cancer growth: double, capped at MAX_REPLICAS; 0 stays 0; never shrink."""
    if replicas <= 0:
        return 0
    return max(replicas, min(replicas * 2, MAX_REPLICAS))


def pick_deployments(deployments: Sequence[DeploymentRef], eagerness: int,
                     rng: random.Random, budget: int | None = None) -> list[tuple[DeploymentRef, int]]:
    """Deployments to grow; ``budget``: how many replicas may still be added (the cluster-wide cap),
    the last pick grows only by what is left."""
    picked: list[tuple[DeploymentRef, int]] = []
    for dep in sorted(deployments, key=_key):
        chosen = eager(rng, eagerness)
        target = doubled(dep.replicas)
        if budget is not None:
            target = min(target, dep.replicas + max(0, budget))
        if chosen and target != dep.replicas:
            picked.append((dep, target))
            if budget is not None:
                budget -= target - dep.replicas
    return picked


def added_replicas(ledgers: Iterable[Mapping[str, Any]]) -> int:
    """Replicas the agents' cancer added and not yet reverted (from their ledgers' undo entries)."""
    return sum(max(0, int(entry.get("written") or 0) - int(entry.get("before") or 0))
               for ledger in ledgers for entry in (ledger.get("undo") or {}).values()
               if entry.get("kind") == "Deployment")


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
