"""Blackadder: the controller of ChaosAgents (a cycle as steps; decisions in ``decisions``; API via ``core.access``).

Packages, each with one role, as in the article:
- pykube-ng lists the cycle's inventory (Pods, Deployments, ConfigMaps). A cycle is periodic, so its
  listing is a legitimate periodic read; it is scoped server-side (label and field selectors, only the
  namespaces an agent may touch) and runs in a thread (pykube is blocking) through ``Access.call``.
- munch gives the agent's spec its attribute view (``spec.tantrumMode``) before it is normalised.
- lorem writes the text of ipsum mode.
Every write (delete, scale, patch, the ledger Secret), every Event and every status patch goes through
the access layer; the listings share its retries, metrics and ``ApiError`` (``Access.call``).

Namespaces (labels, terminating) come from a Kopf index, not from a listing per cycle. Each agent's
ledger is read once (the first cycle after a start) and then kept in memory with the resourceVersion
of our own last write; a 409 on saving re-reads it once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import functools
import json
import logging
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import lorem
import munch
import pykube

from kopf_operators.blackadder import decisions as logic
from kopf_operators.core import access as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access, ApiError
from kopf_operators.core.controller import Background, Index, MemoSlot
from kopf_operators.core.conventions import DOMAIN, Config, now_iso, stall_event

OPERATOR = "blackadder"
NAMESPACES_INDEX = "blackadder-namespaces"
SOURCES_INDEX = "blackadder-copyrator-sources"
WEBHOOK_TIMEOUT_SECONDS = 3.0
# A sleeping agent looks at its live spec and the kill switch this often (in memory, no request):
# an emergency stop acts within about a second instead of at the next cycle.
WAKE_POLL_SECONDS = 1.0
CHAOSAGENT = k8s.Kind(f"{logic.GROUP}/{logic.VERSION}", logic.PLURAL, logic.KIND, namespaced=False)
TENANTCHAOSAGENT = k8s.Kind(f"{logic.GROUP}/{logic.VERSION}", logic.TENANT_PLURAL, logic.TENANT_KIND, namespaced=True)
Logger = logging.Logger | logging.LoggerAdapter[Any]
Stopped = Callable[[], bool]

logger = logging.getLogger("kopf_operators.blackadder")


@dataclasses.dataclass
class LedgerHandle:
    namespace: str
    name: str
    data: dict[str, Any]
    exists: bool
    resource_version: str = ""
    uid: str = ""  # of the Secret: deleted with this precondition only


class LedgerTaken(ApiError):
    """The ledger's Secret exists but is not this agent's to write: someone else's Secret with that
    name, or the ledger a previous agent of the same name left behind for an administrator."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(409, "LedgerTaken", why)
        self.where, self.why = where, why

    def __str__(self) -> str:
        return f"the ledger Secret {self.where} {self.why}; the agent does nothing until it is moved away"


class RevertIncomplete(Exception):
    """Some ledger entries could not be restored this time (kept in the ledger for the next try)."""

    def __init__(self, failed: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{f['key']}: {f['error']}" for f in failed))
        self.failed = failed

    @property
    def refused(self) -> bool:
        """Every failure was a refusal (403, 422 on our write, ...), not the API being unreachable."""
        return all(f.get("status") and f["status"] < 500 and f["status"] != 429 for f in self.failed)


@dataclasses.dataclass
class CycleOutcome:
    done: dict[str, int]
    skipped: int = 0
    frequency_problems: list[str] = dataclasses.field(default_factory=list)


def _ref(kind: str, api_version: str, namespace: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace, "uid": uid}}


def _ready_reason(conditions: Any) -> str | None:
    return next((str(c.get("reason")) for c in conditions or () if c.get("type") == "Ready"), None)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect could lead past the allowed hosts: it fails the notification instead."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects(), urllib.request.ProxyHandler({}))


def _post_json(url: str, payload: Mapping[str, Any]) -> None:
    """Blocking POST (in a thread), straight to the host (no proxy, no redirects)."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=WEBHOOK_TIMEOUT_SECONDS) as response:
        response.read()


def spec_view(body: Mapping[str, Any]) -> munch.Munch:
    """The article's view of an agent's spec: attribute access on a detached copy."""
    return munch.munchify(copy.deepcopy(dict(body.get("spec") or {})))


class BlackadderController:
    kind = CHAOSAGENT

    def __init__(self, access: Access, config: Config, options: logic.Options,
                 namespaces: Index[str, dict[str, Any]],
                 sources: Index[tuple[str, str], list[dict[str, Any]]] | None = None) -> None:
        self.access = access
        self.config = config
        self.options = options
        self.namespaces = namespaces  # Kopf's live index: name -> {"labels": ..., "terminating": bool}
        # Kopf's live index: Copyrator rule -> its ConfigMap sources (an empty index is falsy: no `or`).
        self.sources = {} if sources is None else sources
        self.background = Background(OPERATOR)  # webhook notifications in flight
        self._ledgers: dict[str, LedgerHandle] = {}  # agent uid -> its ledger as we last wrote it
        self._pykube: pykube.HTTPClient | None = None
        self._pykube_guard = threading.Lock()  # one requests session, one listing at a time

    # --- settings and scope -----------------------------------------------------------------------

    def agent_settings(self, body: Mapping[str, Any]) -> logic.AgentSettings:
        return logic.settings_from_spec(spec_view(body), self.options.dry_run)

    def agent_id(self, meta: Mapping[str, Any]) -> str:
        """The agent's name in its ledger, Events and logs."""
        return str(meta["name"])

    def ledger_name(self, agent: str) -> str:
        return logic.ledger_name(agent)

    def _terminating(self) -> set[str]:
        return {name for name, entries in self.namespaces.items() for entry in entries if entry.get("terminating")}

    def _namespace_labels(self) -> dict[str, Mapping[str, str]]:
        return {name: entry.get("labels") or {} for name, entries in self.namespaces.items() for entry in entries}

    def _copyrator_sources(self) -> list[Mapping[str, Any]]:
        return [src for entries in self.sources.values() for entry in entries for src in entry]

    def kill_switch(self) -> bool:
        """The global kill switch: CHAOS_STOP_ALL, or the label blackadder.io/stop=true on the
        operator's namespace (from the namespaces index: no request)."""
        entries = self.namespaces.get(self._ledger_namespace()) or ()
        labels = next((entry.get("labels") for entry in entries), None)
        return logic.kill_switch_on(labels, self.options.stop_all)

    def _halt_state(self, body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
        return logic.halt_state(self.agent_settings(body), self.kill_switch())

    async def _sleep(self, body: Mapping[str, Any], seconds: float, ran_with: tuple[bool, bool, bool],
                     wait: Callable[[float], Any]) -> bool:
        """Sleep until the next cycle; True when stopped. Wakes early when an emergency stop
        (paused, revert, the kill switch) is switched on after the last cycle decided without it."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if await wait(min(WAKE_POLL_SECONDS, left)):
                return True
            now = self._halt_state(body)
            if now != ran_with and any(now):
                return False
        return False

    # --- the daemon --------------------------------------------------------------------------------

    async def agent_loop(self, body: Mapping[str, Any], stopped: Stopped,
                         wait: Callable[[float], Any], log: Logger) -> None:
        """The agent's loop: wait out the pause left from before a restart, then cycle until stopped.
        ``body`` is Kopf's live view: spec edits apply on the next cycle."""
        try:
            delay = await self.initial_delay(body)
        except ApiError as exc:  # the API is down: start now, the cycle will report it
            log.warning(f"could not read the ledger before the first cycle: {exc}")
            delay = 0.0
        if delay and await self._sleep(body, delay, (False, False, False), wait):
            return
        while not stopped():
            ran_with = self._halt_state(body)
            try:
                await self.cycle(body, stopped, log)
            except Exception as exc:  # never let one bad cycle kill the agent's loop
                metrics.error(OPERATOR, "cycle-crash")
                log.exception(f"cycle crashed: {exc}")
            if await self._sleep(body, self.agent_settings(body).pause, ran_with, wait):
                break

    async def initial_delay(self, body: Mapping[str, Any]) -> float:
        """After an operator restart, wait out the rest of the pause instead of acting at once."""
        settings = self.agent_settings(body)
        meta = body["metadata"]
        async with self.access.serialised((OPERATOR, meta["uid"])):
            handle = await self.ledger(self.agent_id(meta), meta["uid"])
        last = handle.data.get("lastCycleEpoch")
        if last is None:
            last = logic.iso_to_epoch((body.get("status") or {}).get("lastCycleTime"))
        return logic.seconds_until_next_cycle(last, time.time(), settings.pause)

    # --- one cycle ---------------------------------------------------------------------------------

    async def cycle(self, body: Mapping[str, Any], stopped: Stopped, log: Logger,
                    paragraph: Callable[[], str] = lorem.paragraph) -> None:
        """One cycle of one agent: revert, pause, or chaos; then the status. API errors of single
        actions are reported and skipped; a failed listing or ledger write makes Ready=False."""
        meta = body["metadata"]
        uid, generation = meta["uid"], meta.get("generation")
        settings = self.agent_settings(body)
        previous = (body.get("status") or {}).get("conditions")
        async with self.access.serialised((OPERATOR, uid)):
            if stopped():
                return
            try:
                handle = await self.ledger(self.agent_id(meta), uid)
                now = time.time()
                step = logic.cycle_step(settings, now, self.kill_switch())
                if step == logic.REVERT_STEP:
                    summary = await self.revert_all(body, handle, settings, log)
                    failed = summary["failed"]
                    status = logic.simple_status(
                        previous, settings, generation, not failed, "Reverted" if not failed else "RevertFailed",
                        "revert: true — no chaos; the ledger has been reverted" if not failed else
                        f"revert: true — no chaos; {len(failed)} change(s) could not be restored yet (retried "
                        "every pauseDuration): see status.revert.failed")
                    if summary["processed"]:
                        status["revert"] = summary
                    await self._patch_status(meta, status, body)
                    return
                if step == logic.STOPPED_STEP:
                    await self._patch_status(meta, logic.simple_status(
                        previous, settings, generation, True, "KillSwitch",
                        f"stopped by the kill switch ({logic.KILL_SWITCH_LABEL}=true on namespace "
                        f"{self._ledger_namespace()}, or CHAOS_STOP_ALL) — no chaos"), body)
                    return
                if step == logic.PAUSED_STEP:
                    await self._patch_status(meta, logic.simple_status(previous, settings, generation, True,
                                                                       "Paused", "paused: true — no chaos"), body)
                    return
                waiting = self._waiting(step, settings, now)
                if waiting is not None:  # no chaos this cycle, for a reason said once per episode
                    ready, reason, message = waiting
                    if _ready_reason(previous) != reason:
                        if ready:
                            log.info(message)
                        else:
                            self.announce(body, None, "Warning", reason, message, log)
                    await self._patch_status(meta, logic.simple_status(previous, settings, generation, ready,
                                                                       reason, message), body)
                    return
                inventory = await self.inventory(settings, now)

                def halted() -> bool:  # checked before every action: an emergency stop acts mid-cycle
                    return stopped() or logic.must_halt(self.agent_settings(body), self.kill_switch())

                outcome = await self.chaos(body, handle, settings, inventory, halted, log, paragraph)
            except ApiError as exc:
                metrics.error(OPERATOR, "cycle")
                self.announce(body, None, "Warning", "CycleFailed", f"cycle failed: {exc}", log)
                # Retried by the next cycle (Reconciling), unless the API refuses it (403, 422...): then
                # only a person can help (Stalled).
                retried = exc.transient or exc.status in (404, 409)
                await self._patch_status(meta, logic.simple_status(previous, settings, generation, False,
                                                                   "CycleFailed", str(exc)[:300],
                                                                   stalled=not retried), body)
                return
            await self._patch_status(meta, logic.cycle_status(
                previous, settings, generation, handle.data, outcome.done, outcome.skipped, inventory.counts(),
                f"{handle.namespace}/{handle.name}", outcome.frequency_problems), body)

    @staticmethod
    def _waiting(step: str, settings: logic.AgentSettings, now: float) -> tuple[bool, str, str] | None:
        """Why a cycle makes no chaos, as (ready, reason, message), or None when it does."""
        if step == logic.INVALID_STEP:
            return False, "InvalidSpec", logic.spec_problem(settings) or "invalid spec"
        if step == logic.EXCLUDED_DATE_STEP:
            date = logic.excluded_date(settings.excluded_dates, settings.time_zone, now)
            return True, "ExcludedDate", f"today is an excluded date ({date} in {settings.time_zone}): no chaos"
        if step == logic.IDLE_STEP:
            opens = logic.next_window_start(settings.windows, settings.time_zone, now)
            return True, "OutsideWindow", f"outside activeWindows ({settings.time_zone}); idle until {opens or 'never'}"
        return None

    async def inventory(self, settings: logic.AgentSettings, now: float) -> logic.Inventory:
        """The cycle's candidates, listed with pykube-ng and scoped server-side: only the allowed
        namespaces (field selector, or one listing per namespace), the spec's label selectors, no
        ended pods; then what only the client can check (annotations, age, Copyrator sources)."""
        # Namespaces being deleted are no candidates: nothing to learn there, and Events are refused.
        settings = dataclasses.replace(settings, excluded=tuple(sorted({*settings.excluded, *self._terminating()})))
        namespaces, selector = logic.listing_plan_for(settings, self.config.operator_namespace,
                                                      self._namespace_labels())
        allowed = None if namespaces is None else set(namespaces)
        ns_op, pod_op = self.config.operator_namespace, self.config.operator_pod_name

        def scoped(obj: Mapping[str, Any]) -> bool:
            namespace = obj["metadata"].get("namespace", "")
            return (allowed is None or namespace in allowed) and logic.namespace_allowed(namespace, settings, ns_op)

        pods: list[logic.PodRef] = []
        deps: list[logic.DeploymentRef] = []
        cms: list[logic.ConfigMapRef] = []
        if settings.tantrum:
            listed = await self._list(pykube.Pod, namespaces, logic.pod_field_selector(selector),
                                      logic.label_selector_for("Pod", settings))
            pods = [p for obj in listed if scoped(obj) and logic.pod_selected(obj, settings, now)
                    if logic.pod_allowed(p := logic.pod_ref(obj), settings, ns_op, pod_op)]
        if settings.cancer:
            listed = await self._list(pykube.Deployment, namespaces, selector,
                                      logic.label_selector_for("Deployment", settings))
            deps = [logic.deployment_ref(obj) for obj in listed
                    if scoped(obj) and logic.deployment_selected(obj, settings)]
        if settings.ipsum:
            listed = await self._list(pykube.ConfigMap, namespaces, selector,
                                      logic.label_selector_for("ConfigMap", settings))
            sources = self._copyrator_sources() if settings.shared_configmaps != "Include" else []
            cms = [cm for obj in listed if scoped(obj)
                   and not logic.is_copyrator_source(obj["metadata"].get("namespace", ""),
                                                     obj["metadata"].get("labels"), sources)
                   if logic.configmap_allowed(cm := logic.configmap_ref(obj), settings, ns_op)]
        return logic.Inventory(tuple(pods), tuple(deps), tuple(cms))

    async def chaos(self, body: Mapping[str, Any], handle: LedgerHandle, settings: logic.AgentSettings,
                    inventory: logic.Inventory, stopped: Stopped, log: Logger,
                    paragraph: Callable[[], str]) -> CycleOutcome:
        ledger = handle.data
        cycle = int(ledger.get("cycle", 0)) + 1
        # The cluster-wide cap on replicas cancer adds: what all agents added and did not revert.
        budget = self.options.max_added_replicas - logic.added_replicas(h.data for h in self._ledgers.values())
        clock = time.time()
        elapsed = logic.frequency_elapsed(ledger.get("lastCycleEpoch"), clock, settings.pause)
        plan = logic.plan_cycle(inventory, settings, cycle, replica_budget=budget, elapsed=elapsed)
        now = now_iso()
        outcome = CycleOutcome({m: 0 for m in logic.MODES}, frequency_problems=list(plan.frequency_problems))
        # The cycle counts as started from here: a crash mid-cycle never makes a restart repeat its number.
        ledger["cycle"], ledger["lastCycleAt"], ledger["lastCycleEpoch"] = cycle, now, clock
        previous_undo: dict[str, Any] = {}
        if not settings.dry_run and (plan.scales or plan.writes):
            previous_undo = copy.deepcopy(ledger.get("undo", {}))
            writes, refused = logic.write_ahead(ledger, plan, now, paragraph)
            for cm in refused:
                outcome.skipped += 1
                self.announce(body, None, "Warning", "LedgerFull",
                              f"not writing ConfigMap {cm.namespace}/{cm.name}: its undo would not fit the ledger",
                              log)
            await self.save_ledger(handle)
        else:
            writes = [(cm, {}) for cm in plan.writes]

        def note(mode: str, kind: str, ref: Any, outcome_text: str, before: Any = None, after: Any = None) -> None:
            logic.journal(ledger, {"cycle": cycle, "at": now, "mode": mode, "kind": kind, "namespace": ref.namespace,
                                   "name": ref.name, "outcome": outcome_text, "dryRun": settings.dry_run,
                                   "before": before, "after": after})

        # (mode, namespace, ledger key or "", the action)
        steps: list[tuple[str, str, str, Callable[[], Awaitable[bool]]]] = []
        for pod in plan.kills:
            steps.append((logic.TANTRUM, pod.namespace, "",
                          functools.partial(self._kill, body, pod, settings, note, log)))
        for dep, replicas in plan.scales:
            steps.append((logic.CANCER, dep.namespace, logic.target_key("Deployment", dep.namespace, dep.name),
                          functools.partial(self._scale, body, ledger, previous_undo, dep, replicas, settings, note,
                                            log)))
        for cm, new_data in writes:
            steps.append((logic.IPSUM, cm.namespace, logic.target_key("ConfigMap", cm.namespace, cm.name),
                          functools.partial(self._ipsum, body, ledger, previous_undo, cm, new_data, settings, note,
                                            log)))
        for index, (mode, namespace, key, step) in enumerate(steps):
            if stopped():  # deleting the agent, pausing it or the kill switch stop it at once, mid-cycle
                for _mode, _ns, left, _step in steps[index:]:
                    if left and not settings.dry_run:  # never done: no write-ahead entry may stay behind
                        logic.forget_undo(ledger, previous_undo, left)
                break
            # An edit in the middle of the cycle (mode off, namespace no longer a target, dry-run on):
            # the rest of the plan follows the live spec, not the one it was made with.
            if not logic.still_wanted(self.agent_settings(body), settings, mode, namespace,
                                      self.config.operator_namespace):
                if key and not settings.dry_run:
                    logic.forget_undo(ledger, previous_undo, key)
                outcome.skipped += 1
                continue
            if await step():
                outcome.done[mode] += 1
            else:
                outcome.skipped += 1
        counter = "wouldBe" if settings.dry_run else "counts"
        for mode, n in outcome.done.items():
            ledger[counter][mode] = int(ledger[counter].get(mode, 0)) + n
        await self.save_ledger(handle)
        if settings.webhook_secret or (body.get("spec") or {}).get("webhook"):
            self._notify(body, settings.webhook_secret, [e for e in ledger["journal"] if e.get("cycle") == cycle
                                                         and e.get("at") == now], log)
        return outcome

    # --- the webhook -------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Notifications still in flight are dropped when the operator exits."""
        await self.background.stop()

    def _notify(self, body: Mapping[str, Any], secret: str, entries: list[Mapping[str, Any]], log: Logger) -> None:
        """One POST per action of the cycle, in the background (a slow receiver never delays chaos).
        The URL comes from the Secret ``secret`` (key ``address``) in the operator's namespace, read
        when there is something to send (so a rotated token applies at once); it is never logged, put
        in an Event or in status (it carries a token): only the Secret's name and the URL's host are."""
        if not entries:
            return
        agent = body["metadata"]["name"]
        where = f"{self._ledger_namespace()}/{secret}"
        if not secret:  # an agent stored before webhook.url was refused by the schema
            self.announce(body, None, "Warning", "WebhookRefused",
                          "webhook.url is no longer read (a URL in a custom resource leaks its token): put the URL "
                          f"in a Secret under key {logic.WEBHOOK_SECRET_KEY!r} in namespace {self._ledger_namespace()}"
                          " and set webhook.secretRef.name", log)
            return
        payloads = [logic.webhook_payload(agent, entry) for entry in entries]

        async def post_all() -> None:
            try:
                obj = await self.access.read(k8s.SECRET, self._ledger_namespace(), secret)
            except ApiError as exc:
                self.announce(body, None, "Warning", "WebhookFailed", f"could not read the webhook Secret {where}: "
                              f"{exc}", log)
                return
            encoded = ((obj or {}).get("data") or {}).get(logic.WEBHOOK_SECRET_KEY)
            try:
                url = base64.b64decode(encoded).decode().strip() if encoded else ""
            except ValueError:
                url = ""
            if not url:
                self.announce(body, None, "Warning", "WebhookSecretMissing",
                              f"no webhook sent: Secret {where} " + ("has no key " + repr(logic.WEBHOOK_SECRET_KEY)
                                                                     if obj else "does not exist"), log)
                return
            refusal = logic.webhook_refusal(url, self.options.webhook_hosts)
            if refusal:
                self.announce(body, None, "Warning", "WebhookRefused", f"{refusal} (Secret {where})", log)
                return
            for payload in payloads:
                try:
                    await asyncio.to_thread(_post_json, url, payload)
                except (OSError, ValueError) as exc:
                    metrics.error(OPERATOR, "webhook")
                    host = urllib.parse.urlsplit(url).hostname
                    self.announce(body, None, "Warning", "WebhookFailed",
                                  f"webhook to {host} (Secret {where}) failed: {type(exc).__name__}; the rest of "
                                  "this cycle's notifications are dropped", log)
                    return
            metrics.action(OPERATOR, "webhook", len(payloads))

        self.background.spawn(post_all())

    # --- the actions (each True when done, False when skipped) ------------------------------------

    async def _kill(self, body: Mapping[str, Any], pod: logic.PodRef, settings: logic.AgentSettings,
                    note: Callable[..., None], log: Logger) -> bool:
        target = _ref("Pod", "v1", pod.namespace, pod.name, pod.uid)
        if settings.dry_run:
            note(logic.TANTRUM, "Pod", pod, "would-delete")
            self.announce(body, target, "Normal", "WouldKillPod",
                          f"dry-run: would delete Pod {pod.namespace}/{pod.name}", log)
            return True
        try:
            if settings.evict:  # the Eviction API: PodDisruptionBudgets apply
                done = await self.access.evict(pod.namespace, pod.name, grace_seconds=settings.grace_period,
                                               uid=pod.uid)
            else:  # the uid precondition: never a same-named successor
                done = await self.access.delete(k8s.POD, pod.namespace, pod.name, uid=pod.uid,
                                                grace_seconds=settings.grace_period)
        except ApiError as exc:
            note(logic.TANTRUM, "Pod", pod, f"skipped: HTTP {exc.status}")
            return False
        if not done:
            if settings.evict:
                note(logic.TANTRUM, "Pod", pod, "skipped: eviction refused")
                self.announce(body, target, "Normal", "EvictionRefused",
                              f"not evicting Pod {pod.namespace}/{pod.name}: a PodDisruptionBudget refused it "
                              "(or it is gone)", log)
            else:
                note(logic.TANTRUM, "Pod", pod, "skipped: gone")
            return False
        metrics.action(OPERATOR, "pod-killed")
        how = "evicted" if settings.evict else "deleted"
        grace = "" if settings.grace_period is None else f", grace period {settings.grace_period}s"
        note(logic.TANTRUM, "Pod", pod, how)
        self.announce(body, target, "Normal", "PodKilled",
                      f"{how} Pod {pod.namespace}/{pod.name}{grace} (not revertible)", log)
        return True

    async def _scale(self, body: Mapping[str, Any], ledger: dict[str, Any], previous_undo: Mapping[str, Any],
                     dep: logic.DeploymentRef, replicas: int, settings: logic.AgentSettings,
                     note: Callable[..., None], log: Logger) -> bool:
        key = logic.target_key("Deployment", dep.namespace, dep.name)
        target = _ref("Deployment", "apps/v1", dep.namespace, dep.name, dep.uid)
        msg = f"Deployment {dep.namespace}/{dep.name} from {dep.replicas} to {replicas} replicas"
        if settings.dry_run:
            note(logic.CANCER, "Deployment", dep, "would-scale", dep.replicas, replicas)
            self.announce(body, target, "Normal", "WouldScaleDeployment", f"dry-run: would scale {msg}", log)
            return True
        # Through the scale subresource, conditional on the replicas we decided on (not on the
        # resourceVersion: the Deployment's status moves it all the time).
        write = self.access.patch(k8s.DEPLOYMENT, dep.namespace, dep.name, logic.scale_patch(dep.replicas, replicas),
                                  subresource="scale", json_patch=True)
        if not await self._undoable(write, ledger, previous_undo, key, lambda skipped: note(
                logic.CANCER, "Deployment", dep, skipped)):
            return False
        metrics.action(OPERATOR, "deployment-scaled")
        note(logic.CANCER, "Deployment", dep, "scaled", dep.replicas, replicas)
        self.announce(body, target, "Normal", "DeploymentScaled", f"scaled {msg}", log)
        return True

    async def _ipsum(self, body: Mapping[str, Any], ledger: dict[str, Any], previous_undo: Mapping[str, Any],
                     cm: logic.ConfigMapRef, new_data: Mapping[str, str], settings: logic.AgentSettings,
                     note: Callable[..., None], log: Logger) -> bool:
        key = logic.target_key("ConfigMap", cm.namespace, cm.name)
        target = _ref("ConfigMap", "v1", cm.namespace, cm.name, cm.uid)
        keys = ", ".join(sorted(cm.data or {}))
        before_hash = logic.data_fingerprint(cm.data)
        if settings.dry_run:
            note(logic.IPSUM, "ConfigMap", cm, "would-ipsum", before_hash)
            self.announce(body, target, "Normal", "WouldIpsumConfigMap",
                          f"dry-run: would overwrite ConfigMap {cm.namespace}/{cm.name} keys [{keys}] with lorem ipsum",
                          log)
            return True
        write = self.access.patch(k8s.CONFIGMAP, cm.namespace, cm.name,
                                  {"metadata": {"resourceVersion": cm.resource_version}, "data": new_data})
        if not await self._undoable(write, ledger, previous_undo, key, lambda skipped: note(
                logic.IPSUM, "ConfigMap", cm, skipped)):
            return False
        metrics.action(OPERATOR, "configmap-ipsumed")
        note(logic.IPSUM, "ConfigMap", cm, "ipsumed", before_hash, logic.data_fingerprint(new_data))
        self.announce(body, target, "Normal", "ConfigMapIpsumed",
                      f"overwrote ConfigMap {cm.namespace}/{cm.name} keys [{keys}] with lorem ipsum (revertible)", log)
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
        logic.forget_undo(ledger, previous_undo, key)
        skipped(why)
        return False

    # --- revert ------------------------------------------------------------------------------------

    async def revert_all(self, body: Mapping[str, Any], handle: LedgerHandle, settings: logic.AgentSettings,
                         log: Logger) -> dict[str, Any]:
        """Restore every ledger entry that still shows what we wrote; report the others. Under the
        agent's lock. Dry-run: report what would be restored, keep the ledger as it is. Revert is rare
        and must see the objects as they are now: it reads each one (the only reads of targets)."""
        ledger = handle.data
        undo: dict[str, Any] = ledger.get("undo", {})
        restored: list[str] = []
        changed: list[str] = []
        gone: list[str] = []
        failed: list[dict[str, Any]] = []  # refused or unreachable: kept in the ledger, tried again
        now = now_iso()
        for key in sorted(undo):
            entry = undo[key]
            is_dep = entry["kind"] == "Deployment"
            kind = k8s.DEPLOYMENT if is_dep else k8s.CONFIGMAP
            ns, nm = entry["namespace"], entry["name"]
            what = f"{entry['kind']} {ns}/{nm}"
            try:
                verdict, target = await self._revert_one(body, entry, kind, settings, restored, key, ledger, now, log)
            except ApiError as exc:
                failed.append({"key": key, "status": exc.status, "error": str(exc)})
                metrics.error(OPERATOR, "revert")
                self.announce(body, None, "Warning", "RevertFailed", f"could not restore {what}: {exc}", log)
                if not settings.dry_run:
                    logic.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                           "name": nm, "outcome": f"failed: {exc}"})
                continue
            if verdict == logic.CHANGED:
                changed.append(key)
                self.announce(body, target, "Warning", "RevertSkipped",
                              f"not restoring {what}: it was changed since the agent wrote it", log)
            elif verdict == logic.GONE:
                gone.append(key)
                self.announce(body, None, "Warning", "RevertSkipped", f"not restoring {what}: it no longer exists",
                              log)
            if not settings.dry_run and verdict in (logic.CHANGED, logic.GONE):
                logic.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                       "name": nm, "outcome": verdict})
        if not settings.dry_run and undo:
            ledger["undo"] = {f["key"]: undo[f["key"]] for f in failed}
            await self.save_ledger(handle)
        return {"at": now, "dryRun": settings.dry_run, "processed": len(undo), "restored": restored[:50],
                "changed": changed[:50], "gone": gone[:50], "failed": failed[:50]}

    async def _revert_one(self, body: Mapping[str, Any], entry: Mapping[str, Any], kind: k8s.Kind,
                          settings: logic.AgentSettings, restored: list[str], key: str, ledger: dict[str, Any],
                          now: str, log: Logger) -> tuple[str, dict[str, Any] | None]:
        """One ledger entry: (verdict, the target for Events). Raises ApiError when refused."""
        is_dep = entry["kind"] == "Deployment"
        ns, nm = entry["namespace"], entry["name"]
        what = f"{entry['kind']} {ns}/{nm}"
        current = await self.access.read(kind, ns, nm)
        verdict = logic.revert_verdict(entry, current)
        target = _ref(entry["kind"], kind.api_version, ns, nm, entry["uid"]) if current else None
        if verdict == logic.RESTORE and current is not None:
            if settings.dry_run:
                restored.append(key)
                self.announce(body, target, "Normal", "WouldRevert", f"dry-run: would restore {what}", log)
                return verdict, target
            try:
                if is_dep:
                    answer = await self.access.patch(kind, ns, nm, logic.scale_patch(entry["written"],
                                                                                     entry["before"]),
                                                     subresource="scale", json_patch=True)
                    detail = f"replicas back to {entry['before']}"
                else:
                    # A merge patch: keys we wrote get their old values back; nothing else is touched.
                    answer = await self.access.patch(kind, ns, nm, {
                        "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                        "data": entry["before"]})
                    detail = "data restored"
            except ApiError as exc:
                if exc.status not in (409, 422):  # changed between our read and our write
                    raise
                verdict = logic.CHANGED
            else:
                if answer is None:
                    verdict = logic.GONE
                else:
                    restored.append(key)
                    metrics.action(OPERATOR, "reverted")
                    logic.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                           "name": nm, "outcome": "restored"})
                    self.announce(body, target, "Normal", "Reverted", f"restored {what}: {detail}", log)
        return verdict, target

    async def revert_on_delete(self, body: Mapping[str, Any], log: Logger, attempt: int = 0) -> None:
        """Undo what the agent did, then delete its ledger. Raises RevertIncomplete while some change
        could not be restored; after ``REVERT_ATTEMPTS`` refusals it lets go instead (the agent can
        always be deleted): what is left is named in an Event and in status, and the ledger Secret
        stays (ownerReference removed, so the garbage collector keeps it) for an administrator."""
        meta = body["metadata"]
        settings = self.agent_settings(body)
        async with self.access.serialised((OPERATOR, meta["uid"])):
            try:
                handle = await self.ledger(self.agent_id(meta), meta["uid"])
            except LedgerTaken as exc:  # not ours to revert from, nor to delete
                self.announce(body, None, "Warning", "LedgerTaken", f"deleted without revert: {exc.where} {exc.why}",
                              log)
                return
            if settings.revert_on_delete and handle.data.get("undo"):
                summary = await self.revert_all(body, handle, settings, log)
                failed = summary["failed"]
                if failed:
                    incomplete = RevertIncomplete(failed)
                    if attempt + 1 < logic.REVERT_ATTEMPTS or not incomplete.refused:
                        # While it is retried, the Terminating agent says what is still left.
                        await self._patch_status(meta, {"revert": summary, "state": "RevertFailed"})
                        raise incomplete
                    await self._abandon(body, handle, summary, attempt + 1, log)
                    self._ledgers.pop(meta["uid"], None)
                    return
            if handle.exists:
                await self.access.delete(k8s.SECRET, handle.namespace, handle.name, uid=handle.uid or None)
            self._ledgers.pop(meta["uid"], None)

    async def _abandon(self, body: Mapping[str, Any], handle: LedgerHandle, summary: Mapping[str, Any],
                       attempts: int, log: Logger) -> None:
        """Let go of an agent whose revert keeps being refused: keep its ledger for an administrator."""
        where = f"{handle.namespace}/{handle.name}"
        left = ", ".join(f"{f['key']} ({f['error']})" for f in summary["failed"])
        await self.save_ledger(handle, abandoned=f"revert refused {attempts} times: {left}"[:1000])
        message = (f"gave up reverting after {attempts} attempts; NOT restored: {left}. Their original state "
                   f"stays in the ledger Secret {where} (key {logic.LEDGER_KEY}, field undo), kept after the agent "
                   "is gone; restore by hand, then delete that Secret")
        metrics.error(OPERATOR, "revert-abandoned")
        self.announce(body, None, "Warning", "RevertAbandoned", message, log)
        await self._patch_status(body["metadata"], {
            "revert": {**summary, "abandoned": True, "ledger": where},
            "state": "RevertAbandoned"})

    # --- the ledger: one Secret per agent in the operator's namespace ------------------------------

    def _ledger_namespace(self) -> str:
        return logic.ledger_namespace(self.config.operator_namespace)

    async def ledger(self, agent: str, agent_uid: str) -> LedgerHandle:
        """The agent's ledger: from memory after the first read (we are its only writer)."""
        handle = self._ledgers.get(agent_uid)
        if handle is None:
            handle = await self._read_ledger(agent, agent_uid)
            self._ledgers[agent_uid] = handle
        return handle

    async def _read_ledger(self, agent: str, agent_uid: str) -> LedgerHandle:
        namespace, name = self._ledger_namespace(), self.ledger_name(agent)
        obj = await self.access.read(k8s.SECRET, namespace, name)
        if obj is None:
            return LedgerHandle(namespace, name, logic.empty_ledger(agent, agent_uid), exists=False)
        meta = obj.get("metadata") or {}
        if logic.LEDGER_LABEL not in (meta.get("labels") or {}):
            raise LedgerTaken(f"{namespace}/{name}", "exists and is not a Blackadder ledger (someone else's Secret)")
        annotations = meta.get("annotations") or {}
        if logic.LEDGER_ABANDONED_ANNOTATION in annotations and not self._ours(obj, agent_uid):
            raise LedgerTaken(f"{namespace}/{name}", "holds what a previous agent of this name could not revert "
                                                      "(kept for an administrator: read it, then delete it)")
        raw: dict[str, Any] | None = None
        encoded = (obj.get("data") or {}).get(logic.LEDGER_KEY)
        if encoded:
            try:
                raw = json.loads(base64.b64decode(encoded))
            except ValueError:
                raw = None  # a hand-edited, broken ledger: start afresh rather than crash-looping
        return LedgerHandle(namespace, name, logic.normalise_ledger(raw, agent, agent_uid), exists=True,
                            resource_version=meta.get("resourceVersion", ""), uid=meta.get("uid", ""))

    @staticmethod
    def _ours(obj: Mapping[str, Any], agent_uid: str) -> bool:
        encoded = (obj.get("data") or {}).get(logic.LEDGER_KEY)
        if not encoded:
            return False
        try:
            return bool(json.loads(base64.b64decode(encoded)).get("agentUid") == agent_uid)
        except (ValueError, AttributeError):
            return False

    async def save_ledger(self, handle: LedgerHandle, abandoned: str = "") -> None:
        """Create or replace with the resourceVersion of our last write (a conflict: someone else
        wrote it; their version is read once and our in-memory ledger, the newer, replaces it).
        ``abandoned``: the agent lets go; the Secret loses its ownerReference and says why."""
        agent, agent_uid = handle.data["agent"], handle.data["agentUid"]
        payload = base64.b64encode(json.dumps(handle.data, separators=(",", ":")).encode()).decode()
        annotations = {logic.LEDGER_AGENT_ANNOTATION: agent}
        if abandoned:
            annotations[logic.LEDGER_ABANDONED_ANNOTATION] = abandoned
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {
                "name": handle.name, "namespace": handle.namespace,
                # A label value stops at 63 characters: long agent names are hashed (full name annotated).
                "labels": {logic.LEDGER_LABEL: logic.ledger_label(agent),
                           **({logic.TENANT_LEDGER_UID_LABEL: agent_uid} if self.kind.namespaced else {})},
                "annotations": annotations,
                # Namespaced dependents may have cluster-scoped owners: the GC removes a forgotten ledger
                # (not an abandoned one: that one stays for an administrator).
                # (A namespaced TenantChaosAgent cannot own a Secret in another namespace: its on.delete
                # handler removes the ledger.)
                "ownerReferences": [] if abandoned or self.kind.namespaced else [{
                    "apiVersion": self.kind.api_version, "kind": self.kind.kind, "name": agent, "uid": agent_uid}],
            },
            "data": {logic.LEDGER_KEY: payload},
        }
        for _attempt in range(3):
            answer: dict[str, Any] | None
            if handle.exists:
                body["metadata"]["resourceVersion"] = handle.resource_version
                try:
                    answer = await self.access.replace(k8s.SECRET, body)
                except k8s.Conflict:
                    answer = None
            else:
                if not self.config.operator_namespace:  # local run: the default namespace may be missing
                    await self._ensure_namespace(handle.namespace)
                body["metadata"].pop("resourceVersion", None)
                try:
                    answer = await self.access.create(k8s.SECRET, body)
                except k8s.AlreadyExists:
                    answer = None
            if answer is not None:
                handle.exists = True
                handle.resource_version = answer["metadata"]["resourceVersion"]
                handle.uid = answer["metadata"].get("uid", "")
                return
            fresh = await self.access.read(k8s.SECRET, handle.namespace, handle.name)
            if fresh is not None and logic.LEDGER_LABEL not in ((fresh.get("metadata") or {}).get("labels") or {}):
                raise LedgerTaken(f"{handle.namespace}/{handle.name}",
                                  "exists and is not a Blackadder ledger (someone else's Secret)")
            handle.exists = fresh is not None
            handle.resource_version = fresh["metadata"].get("resourceVersion", "") if fresh else ""
            handle.uid = fresh["metadata"].get("uid", "") if fresh else ""
        raise ApiError(409, "Conflict", "the ledger kept conflicting")

    async def _ensure_namespace(self, namespace: str) -> None:
        """Only for the local default (blackadder-system); in a cluster the operator's namespace exists."""
        if namespace in self.namespaces:
            return
        with contextlib.suppress(k8s.AlreadyExists):
            await self.access.create(k8s.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": namespace, "labels": {f"{DOMAIN}/owner": OPERATOR}}})

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

    # --- Events and status -------------------------------------------------------------------------

    def announce(self, agent_body: Mapping[str, Any], target: Mapping[str, Any] | None, type_: str,
                 reason: str, message: str, log: Logger) -> None:
        """An Event on the agent and on the target, plus a log line (ConfigMap values never appear)."""
        (log.warning if type_ == "Warning" else log.info)(f"{reason}: {message}")
        try:
            self.access.event(agent_body, type_, reason, message)
            if target is not None:
                agent = self.agent_id(agent_body["metadata"])
                self.access.event(target, type_, reason, f"{message} ({self.kind.kind} {agent})")
        except LookupError:
            pass  # outside a running operator (no event queue): the log line is the record

    async def _patch_status(self, meta: Mapping[str, Any], status: Mapping[str, Any],
                            body: Mapping[str, Any] | None = None) -> None:
        """Patch the agent's status; with ``body``, only when it would change (an idle or paused
        agent does not write every cycle)."""
        if body is not None and not logic.status_changed(body.get("status") or {}, status):
            return
        # Kopf updates a daemon's body in place as events arrive, and our own patch's event can arrive
        # during the await: the conditions before the write are the ones read now.
        before = copy.deepcopy(((body or {}).get("status") or {}).get("conditions"))
        agent = self.agent_id(meta)
        namespace = meta.get("namespace") if self.kind.namespaced else None
        try:
            await self.access.patch_status(self.kind, namespace, meta["name"], status)  # None: deleted meanwhile
        except ApiError as exc:
            metrics.error(OPERATOR, "status")
            logger.warning(f"[{agent}] status not written: {exc}")
            return
        stalled = stall_event(before, status.get("conditions"))
        if body is not None and stalled:  # one uniform Event per Stalled transition (docs/observability.md)
            with contextlib.suppress(LookupError):  # outside a running operator (no event queue)
                self.access.event(body, *stalled)


class TenantChaosController(BlackadderController):
    """TenantChaosAgents: the same cycle, ledger and actions, with the settings confined to the
    agent's own namespace and bounded by the administrator's limits (logic.tenant_settings). The
    ledger stays in the operator's namespace (a tenant could otherwise write it)."""

    kind = TENANTCHAOSAGENT

    def agent_settings(self, body: Mapping[str, Any]) -> logic.AgentSettings:
        namespace = str(body["metadata"]["namespace"])
        return logic.tenant_settings(spec_view(body), namespace, self.options, self.config.operator_namespace,
                                     self._namespace_labels().get(namespace))

    def agent_id(self, meta: Mapping[str, Any]) -> str:
        return logic.tenant_agent_id(str(meta["namespace"]), str(meta["name"]))

    def ledger_name(self, agent: str) -> str:
        return logic.tenant_ledger_name(agent)

    async def sweep_ledgers(self) -> int:
        """At start-up: delete the ledgers of TenantChaosAgents that are gone (normally the delete
        handler does; not when the finalizer was removed by hand). Ledgers are listed before agents.
        Nothing while Kopf has paused this process (a standby: ``Access.paused``, as Copyrator's sweep)."""
        if getattr(self.access, "paused", False):
            return 0
        namespace = self._ledger_namespace()
        ledgers = await self.access.list(k8s.SECRET, namespace, labels=logic.TENANT_LEDGER_UID_LABEL)
        if not ledgers:
            return 0
        agents = await self.access.list(TENANTCHAOSAGENT)
        orphans = logic.orphaned_tenant_ledgers(ledgers, (a["metadata"]["uid"] for a in agents))
        for secret in orphans:
            meta = secret["metadata"]
            if await self.access.delete(k8s.SECRET, namespace, meta["name"], uid=meta.get("uid")):
                logger.info(f"deleted the ledger {namespace}/{meta['name']}: its TenantChaosAgent is gone")
        return len(orphans)


# The controllers in Kopf's memo, typed: operators/blackadder.py reaches them as ``AGENTS(memo)`` and
# ``TENANT_AGENTS(memo)``.
AGENTS = MemoSlot("blackadder", BlackadderController)
TENANT_AGENTS = MemoSlot("blackadder_tenants", TenantChaosController)
