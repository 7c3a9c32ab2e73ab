"""Blackadder's chaos cycle: one agent's chaos, once its cycle has decided on chaos: observe (the
inventory) -> decide (``decisions.plan_cycle``) -> act (write-ahead ledger, then each action, each
checked against an emergency stop and the live spec first).

pykube-ng lists the cycle's inventory (Pods, Deployments, ConfigMaps). A cycle is periodic, so its
listing is a legitimate periodic read; it is scoped server-side (label and field selectors, only the
namespaces an agent may touch) and runs in a thread (pykube is blocking) through ``Access.call``.
Namespaces (labels, terminating) come from a Kopf index, not from a listing per cycle.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import pykube

from kopf_operators.blackadder import decisions, sparing, targets
from kopf_operators.blackadder.ledger import LedgerHandle, LedgerStore
from kopf_operators.blackadder.notify import Logger, Notifications
from kopf_operators.blackadder.settings import CANCER, IPSUM, MODES, TANTRUM, AgentSettings, Options
from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.conventions import Config, now_iso
from kopf_operators.core.state import Index

OPERATOR = "blackadder"
WORKLOAD_KINDS: dict[str, type[pykube.objects.NamespacedAPIObject]] = {
    "Deployment": pykube.Deployment, "StatefulSet": pykube.StatefulSet, "DaemonSet": pykube.DaemonSet}
Stopped = Callable[[], bool]


@dataclasses.dataclass
class CycleOutcome:
    done: dict[str, int]
    skipped: int = 0
    frequency_problems: list[str] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)  # the inventory's candidates per mode
    killed: list[tuple[targets.PodRef, float]] = dataclasses.field(default_factory=list)  # (pod, epoch) really killed
    spared: tuple[str, ...] = ()  # the workloads left alone in a rollout (sparing.spare)
    disrupted: list[sparing.WorkloadKey] = dataclasses.field(default_factory=list)  # what its actions disrupted


def ref(kind: str, api_version: str, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """A target as Events name it."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace, "uid": uid}}


def terminating(namespaces: Index[str, dict[str, Any]]) -> set[str]:
    return {name for name, entries in namespaces.items() for entry in entries if entry.get("terminating")}


def namespace_labels(namespaces: Index[str, dict[str, Any]]) -> dict[str, Mapping[str, str]]:
    return {name: entry.get("labels") or {} for name, entries in namespaces.items() for entry in entries}


def copyrator_sources(sources: Index[tuple[str, str], list[dict[str, Any]]]) -> list[Mapping[str, Any]]:
    return [src for entries in sources.values() for entry in entries for src in entry]


class ChaosCycle:
    """The chaos of one controller's agents (``agent_settings``: an agent's live settings)."""

    def __init__(self, access: Access, config: Config, options: Options,
                 namespaces: Index[str, dict[str, Any]], sources: Index[tuple[str, str], list[dict[str, Any]]],
                 ledgers: LedgerStore, notes: Notifications,
                 agent_settings: Callable[[Mapping[str, Any]], AgentSettings]) -> None:
        self.access, self.config, self.options = access, config, options
        self.namespaces = namespaces  # Kopf's live index: name -> {"labels": ..., "terminating": bool}
        self.sources = sources  # Kopf's live index: Copyrator rule -> its ConfigMap sources
        self.ledgers, self.notes, self.agent_settings = ledgers, notes, agent_settings
        self._pykube: pykube.HTTPClient | None = None
        self._pykube_guard = threading.Lock()  # one requests session, one listing at a time

    async def run(self, body: Mapping[str, Any], handle: LedgerHandle, settings: AgentSettings, now: float,
                  stopped: Stopped, log: Logger, paragraph: Callable[[], str],
                  limit: int | None = None) -> CycleOutcome:
        """``limit``: at most this many actions (what is left of a run's maxActions)."""
        inventory = await self.inventory(settings, now)
        spared_before = ((body.get("status") or {}).get("lastCycle") or {}).get("sparedRollouts") or 0
        if inventory.spared and len(inventory.spared) != spared_before:  # said when it changes, before the actions
            self.notes.announce(body, None, "Normal", "RolloutsSpared",
                                f"sparing {len(inventory.spared)} workload(s) in a rollout or with a held change: "
                                f"{', '.join(inventory.spared[:5])}" + (" ..." if len(inventory.spared) > 5 else ""),
                                log)
        outcome = await self.chaos(body, handle, settings, inventory, stopped, log, paragraph, limit)
        outcome.counts, outcome.spared = inventory.counts(), inventory.spared
        return outcome

    async def inventory(self, settings: AgentSettings, now: float) -> decisions.Inventory:
        """The cycle's candidates, listed with pykube-ng and scoped server-side: only the allowed
        namespaces (field selector, or one listing per namespace), the spec's label selectors, no
        ended pods; then what only the client can check (annotations, age, Copyrator sources)."""
        # Namespaces being deleted are no candidates: nothing to learn there, and Events are refused.
        going = terminating(self.namespaces)
        settings = dataclasses.replace(settings, excluded=tuple(sorted({*settings.excluded, *going})))
        namespaces, selector = targets.listing_plan_for(settings, self.config.operator_namespace,
                                                        namespace_labels(self.namespaces))
        allowed = None if namespaces is None else set(namespaces)
        ns_op, pod_op = self.config.operator_namespace, self.config.operator_pod_name

        def scoped(obj: Mapping[str, Any]) -> bool:
            namespace = obj["metadata"].get("namespace", "")
            return (allowed is None or namespace in allowed) and targets.namespace_allowed(namespace, settings, ns_op)

        pods: list[targets.PodRef] = []
        deps: list[targets.DeploymentRef] = []
        cms: list[targets.ConfigMapRef] = []
        workloads: list[tuple[str, Mapping[str, Any]]] = []  # (kind, body): what sparing judges
        if settings.tantrum:
            listed = await self._list(pykube.Pod, namespaces, targets.pod_field_selector(selector),
                                      targets.label_selector_for("Pod", settings))
            pods = [p for obj in listed if scoped(obj) and targets.pod_selected(obj, settings, now)
                    if targets.pod_allowed(p := targets.pod_ref(obj), settings, ns_op, pod_op)]
        if settings.cancer:
            listed = await self._list(pykube.Deployment, namespaces, selector,
                                      targets.label_selector_for("Deployment", settings))
            deps = [targets.deployment_ref(obj) for obj in listed
                    if scoped(obj) and targets.deployment_selected(obj, settings)]
            workloads = [("Deployment", obj) for obj in listed]
        if settings.ipsum:
            listed = await self._list(pykube.ConfigMap, namespaces, selector,
                                      targets.label_selector_for("ConfigMap", settings))
            sources = copyrator_sources(self.sources) if settings.shared_configmaps != "Include" else []
            cms = [cm for obj in listed if scoped(obj)
                   and not decisions.is_copyrator_source(obj["metadata"].get("namespace", ""),
                                                         obj["metadata"].get("labels"), sources)
                   if targets.configmap_allowed(cm := targets.configmap_ref(obj), settings, ns_op)]
        inventory = decisions.Inventory(tuple(pods), tuple(deps), tuple(cms))
        if not self.options.spare_rollouts:
            return inventory
        workloads += await self._workloads(pods, workloads, namespaces, selector)
        return sparing.spare(inventory, sparing.busy_workloads(workloads))

    async def _workloads(self, pods: Iterable[targets.PodRef], listed: Iterable[tuple[str, Mapping[str, Any]]],
                         namespaces: list[str] | None, selector: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The workloads of the candidate Pods that the cycle has not listed already: one listing per
        kind (Deployment, StatefulSet, DaemonSet), only of a kind some Pod needs, only in the namespaces
        of those Pods when the agent names its namespaces."""
        known = [(kind, str(obj["metadata"].get("namespace", "")), str(obj["metadata"].get("name", "")))
                 for kind, obj in listed]
        found: list[tuple[str, Mapping[str, Any]]] = []
        for kind, wanted in sorted(sparing.needed(pods, known).items()):
            scope = None if namespaces is None else sorted(wanted)
            found += [(kind, obj) for obj in await self._list(WORKLOAD_KINDS[kind], scope,
                                                              selector if scope is None else "")]
        return found

    async def chaos(self, body: Mapping[str, Any], handle: LedgerHandle, settings: AgentSettings,
                    inventory: decisions.Inventory, stopped: Stopped, log: Logger,
                    paragraph: Callable[[], str], limit: int | None = None) -> CycleOutcome:
        ledger = handle.data
        cycle = int(ledger.get("cycle", 0)) + 1
        # The cluster-wide cap on replicas cancer adds: what all agents added and did not revert.
        budget = self.options.max_added_replicas - self.ledgers.added_replicas()
        clock = time.time()
        elapsed = targets.frequency_elapsed(ledger.get("lastCycleEpoch"), clock, settings.pause)
        plan = decisions.plan_cycle(inventory, settings, cycle, replica_budget=budget, elapsed=elapsed)
        now = now_iso()
        outcome = CycleOutcome({m: 0 for m in MODES}, frequency_problems=list(plan.frequency_problems))
        # The cycle counts as started from here: a crash mid-cycle never makes a restart repeat its number.
        ledger["cycle"], ledger["lastCycleAt"], ledger["lastCycleEpoch"] = cycle, now, clock
        previous_undo: dict[str, Any] = {}
        if not settings.dry_run and (plan.scales or plan.writes):
            previous_undo = copy.deepcopy(ledger.get("undo", {}))
            writes, refused = decisions.write_ahead(ledger, plan, now, paragraph)
            for cm in refused:
                outcome.skipped += 1
                self.notes.announce(body, None, "Warning", "LedgerFull", f"not writing ConfigMap {cm.namespace}/"
                                    f"{cm.name}: its undo would not fit the ledger", log)
            await self.ledgers.save(handle)
        else:
            writes = [(cm, {}) for cm in plan.writes]

        def note(mode: str, kind: str, ref: Any, outcome_text: str, before: Any = None, after: Any = None) -> None:
            decisions.journal(ledger, {"cycle": cycle, "at": now, "mode": mode, "kind": kind,
                                       "namespace": ref.namespace, "name": ref.name, "outcome": outcome_text,
                                       "dryRun": settings.dry_run, "before": before, "after": after})

        # (mode, namespace, ledger key or "", the action)
        steps: list[tuple[str, str, str, Callable[[], Awaitable[bool]]]] = []
        for pod in plan.kills:
            steps.append((TANTRUM, pod.namespace, "",
                          functools.partial(self._kill, body, pod, settings, note, log, outcome.killed,
                                            outcome.disrupted)))
        for dep, replicas in plan.scales:
            steps.append((CANCER, dep.namespace, decisions.target_key("Deployment", dep.namespace, dep.name),
                          functools.partial(self._scale, body, ledger, previous_undo, dep, replicas, settings, note,
                                            log, outcome.disrupted)))
        for cm, new_data in writes:
            steps.append((IPSUM, cm.namespace, decisions.target_key("ConfigMap", cm.namespace, cm.name),
                          functools.partial(self._ipsum, body, ledger, previous_undo, cm, new_data, settings, note,
                                            log, outcome.disrupted)))
        for index, (mode, namespace, key, step) in enumerate(steps):
            # Deleting the agent, pausing it, the kill switch or a broken steady state stop it at once,
            # mid-cycle; so does the run's last allowed action (maxActions).
            if stopped() or (limit is not None and sum(outcome.done.values()) >= limit):
                for _mode, _ns, left, _step in steps[index:]:
                    if left and not settings.dry_run:  # never done: no write-ahead entry may stay behind
                        decisions.forget_undo(ledger, previous_undo, left)
                break
            # An edit in the middle of the cycle (mode off, namespace no longer a target, dry-run on):
            # the rest of the plan follows the live spec, not the one it was made with.
            if not decisions.still_wanted(self.agent_settings(body), settings, mode, namespace,
                                          self.config.operator_namespace):
                if key and not settings.dry_run:
                    decisions.forget_undo(ledger, previous_undo, key)
                outcome.skipped += 1
                continue
            if await step():
                outcome.done[mode] += 1
            else:
                outcome.skipped += 1
        counter = "wouldBe" if settings.dry_run else "counts"
        for mode, n in outcome.done.items():
            ledger[counter][mode] = int(ledger[counter].get(mode, 0)) + n
        await self.ledgers.save(handle)
        if settings.webhook_secret or (body.get("spec") or {}).get("webhook"):
            self.notes.webhook(body, settings.webhook_secret, [e for e in ledger["journal"] if e.get("cycle") == cycle
                                                         and e.get("at") == now], log)
        return outcome

    # --- the actions (each True when done, False when skipped) ------------------------------------

    async def _kill(self, body: Mapping[str, Any], pod: targets.PodRef, settings: AgentSettings,
                    note: Callable[..., None], log: Logger, killed: list[tuple[targets.PodRef, float]],
                    disrupted: list[sparing.WorkloadKey]) -> bool:
        target = ref("Pod", "v1", pod.namespace, pod.name, pod.uid)
        if settings.dry_run:
            note(TANTRUM, "Pod", pod, "would-delete")
            self.notes.announce(body, target, "Normal", "WouldKillPod",
                                f"dry-run: would delete Pod {pod.namespace}/{pod.name}", log)
            return True
        at = time.time()  # the kill's moment, for its workload's time to recover
        try:
            if settings.evict:  # the Eviction API: PodDisruptionBudgets apply
                done = await self.access.evict(pod.namespace, pod.name, grace_seconds=settings.grace_period,
                                               uid=pod.uid)
            else:  # the uid precondition: never a same-named successor
                done = await self.access.delete(k8s.POD, pod.namespace, pod.name, uid=pod.uid,
                                                grace_seconds=settings.grace_period)
        except ApiError as exc:
            note(TANTRUM, "Pod", pod, f"skipped: HTTP {exc.status}")
            return False
        if not done:
            if settings.evict:
                note(TANTRUM, "Pod", pod, "skipped: eviction refused")
                self.notes.announce(body, target, "Normal", "EvictionRefused",
                                    f"not evicting Pod {pod.namespace}/{pod.name}: a PodDisruptionBudget refused it "
                                    "(or it is gone)", log)
            else:
                note(TANTRUM, "Pod", pod, "skipped: gone")
            return False
        metrics.action(OPERATOR, "pod-killed")
        killed.append((pod, at))
        if (workload := sparing.pod_workload(pod)) is not None:
            disrupted.append(workload)
        how = "evicted" if settings.evict else "deleted"
        grace = "" if settings.grace_period is None else f", grace period {settings.grace_period}s"
        note(TANTRUM, "Pod", pod, how)
        self.notes.announce(body, target, "Normal", "PodKilled",
                            f"{how} Pod {pod.namespace}/{pod.name}{grace} (not revertible)", log)
        return True

    async def _scale(self, body: Mapping[str, Any], ledger: dict[str, Any], previous_undo: Mapping[str, Any],
                     dep: targets.DeploymentRef, replicas: int, settings: AgentSettings,
                     note: Callable[..., None], log: Logger, disrupted: list[sparing.WorkloadKey]) -> bool:
        key = decisions.target_key("Deployment", dep.namespace, dep.name)
        target = ref("Deployment", "apps/v1", dep.namespace, dep.name, dep.uid)
        msg = f"Deployment {dep.namespace}/{dep.name} from {dep.replicas} to {replicas} replicas"
        if settings.dry_run:
            note(CANCER, "Deployment", dep, "would-scale", dep.replicas, replicas)
            self.notes.announce(body, target, "Normal", "WouldScaleDeployment", f"dry-run: would scale {msg}", log)
            return True
        # Through the scale subresource, conditional on the replicas we decided on (not on the
        # resourceVersion: the Deployment's status moves it all the time).
        write = self.access.patch(k8s.DEPLOYMENT, dep.namespace, dep.name,
                                  decisions.scale_patch(dep.replicas, replicas), subresource="scale", json_patch=True)
        if not await self._undoable(write, ledger, previous_undo, key, lambda skipped: note(
                CANCER, "Deployment", dep, skipped)):
            return False
        metrics.action(OPERATOR, "deployment-scaled")
        disrupted.append(("Deployment", dep.namespace, dep.name))
        note(CANCER, "Deployment", dep, "scaled", dep.replicas, replicas)
        self.notes.announce(body, target, "Normal", "DeploymentScaled", f"scaled {msg}", log)
        return True

    async def _ipsum(self, body: Mapping[str, Any], ledger: dict[str, Any], previous_undo: Mapping[str, Any],
                     cm: targets.ConfigMapRef, new_data: Mapping[str, str], settings: AgentSettings,
                     note: Callable[..., None], log: Logger, disrupted: list[sparing.WorkloadKey]) -> bool:
        key = decisions.target_key("ConfigMap", cm.namespace, cm.name)
        target = ref("ConfigMap", "v1", cm.namespace, cm.name, cm.uid)
        keys = ", ".join(sorted(cm.data or {}))
        before_hash = decisions.data_fingerprint(cm.data)
        if settings.dry_run:
            note(IPSUM, "ConfigMap", cm, "would-ipsum", before_hash)
            self.notes.announce(body, target, "Normal", "WouldIpsumConfigMap", f"dry-run: would overwrite "
                                f"ConfigMap {cm.namespace}/{cm.name} keys [{keys}] with lorem ipsum", log)
            return True
        write = self.access.patch(k8s.CONFIGMAP, cm.namespace, cm.name,
                                  {"metadata": {"resourceVersion": cm.resource_version}, "data": new_data})
        if not await self._undoable(write, ledger, previous_undo, key, lambda skipped: note(
                IPSUM, "ConfigMap", cm, skipped)):
            return False
        metrics.action(OPERATOR, "configmap-ipsumed")
        disrupted.append(("ConfigMap", cm.namespace, cm.name))
        note(IPSUM, "ConfigMap", cm, "ipsumed", before_hash, decisions.data_fingerprint(new_data))
        self.notes.announce(body, target, "Normal", "ConfigMapIpsumed", f"overwrote ConfigMap {cm.namespace}/"
                            f"{cm.name} keys [{keys}] with lorem ipsum (revertible)", log)
        return True

    @staticmethod
    async def _undoable(write: Awaitable[dict[str, Any] | None], ledger: dict[str, Any],
                        previous_undo: Mapping[str, Any], key: str, skipped: Callable[[str], None]) -> bool:
        """A revertible change whose undo entry is already in the ledger: True when written; when it
        fails or the target is gone, the entry goes again and ``skipped`` says why."""
        try:
            answer = await write
        except ApiError as exc:
            why = f"skipped: HTTP {exc.status}"
        else:
            if answer is not None:
                ledger["undo"].get(key, {}).pop("pending", None)
                return True
            why = "skipped: gone"
        decisions.forget_undo(ledger, previous_undo, key)
        skipped(why)
        return False

    # --- inventory listing with pykube-ng ----------------------------------------------------------

    async def _list(self, kind: type[pykube.objects.NamespacedAPIObject], namespaces: Iterable[str] | None,
                    field_selector: str, label_selector: str = "") -> list[dict[str, Any]]:
        wanted = None if namespaces is None else list(namespaces)
        return await self.access.call(lambda: self._list_sync(kind, wanted, field_selector, label_selector))

    def _list_sync(self, kind: type[pykube.objects.NamespacedAPIObject], namespaces: list[str] | None,
                   field_selector: str, label_selector: str) -> list[dict[str, Any]]:
        """The article's server-side filtering: all namespaces minus a field selector, or just the
        allowed namespaces; plus the spec's label selector."""
        with self._pykube_guard:
            if self._pykube is None:
                # KubeConfig.from_env(): in-cluster service account, else $KUBECONFIG or ~/.kube/config.
                self._pykube = pykube.HTTPClient(pykube.KubeConfig.from_env())
            api = self._pykube
            query = kind.objects(api)
            filters: dict[str, Any] = {}
            if label_selector:
                filters["selector"] = label_selector
            if namespaces is None:
                if field_selector:
                    filters["field_selector"] = field_selector
                return [o.obj for o in query.filter(namespace=pykube.all, **filters)]
            result: list[dict[str, Any]] = []
            for ns in namespaces:
                if field_selector:
                    filters["field_selector"] = field_selector
                result.extend(o.obj for o in query.filter(namespace=ns, **filters))
            return result
