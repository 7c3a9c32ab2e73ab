"""Blackadder: the API side of a ChaosAgent's cycle and revert, with pykube-ng (blocking calls).

Everything here runs in Kopf's thread pool (sync handlers/daemons), never on the event loop.
Decisions come from ``kopf_operators.blackadder`` (pure); this module lists, acts, records, reports.
"""

from __future__ import annotations

import base64
import calendar
import copy
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf
import lorem
import munch
import pykube
import requests

from kopf_operators import blackadder as logic
from kopf_operators import common

OPERATOR = "blackadder"
Logger = logging.Logger | logging.LoggerAdapter[Any]


class ChaosAgent(pykube.objects.APIObject):
    """Our cluster-scoped CR (declared statically: object_factory would cost a discovery call)."""

    version = f"{logic.GROUP}/{logic.VERSION}"
    endpoint = logic.PLURAL
    kind = logic.KIND


class ApiError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP {code}: {message}")
        self.code = code


_local = threading.local()


def client() -> pykube.HTTPClient:
    """One pykube client per thread (requests sessions are not meant to be shared across threads).
    KubeConfig.from_env(): in-cluster service account, else $KUBECONFIG or ~/.kube/config."""
    api = getattr(_local, "api", None)
    if api is None:
        api = pykube.HTTPClient(pykube.KubeConfig.from_env())
        _local.api = api
    return api


def _check(resp: requests.Response) -> requests.Response:
    if resp.status_code >= 400:
        try:
            message = str(resp.json().get("message", resp.text))
        except ValueError:
            message = resp.text
        raise ApiError(resp.status_code, message[:300])
    return resp


def _call(method: str, obj: pykube.objects.APIObject, *, subresource: str | None = None,
          body: Any = None, content_type: str = "application/merge-patch+json",
          obj_list: bool = False) -> requests.Response:
    kwargs: dict[str, Any] = {"obj_list": True} if obj_list else {"subresource": subresource}
    if body is not None:
        kwargs["data"] = json.dumps(body)
        kwargs["headers"] = {"Content-Type": content_type}
    api = client()
    return _check(getattr(api, method)(**obj.api_kwargs(**kwargs)))


# --- Locks: one cycle or revert of an agent at a time (the daemon and on.delete share them) ------

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def agent_lock(uid: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


# --- Ledger: one Secret per agent in the operator's namespace --------------------------------------


@dataclasses.dataclass
class LedgerHandle:
    namespace: str
    name: str
    data: dict[str, Any]
    exists: bool
    resource_version: str = ""


def _ledger_ns() -> str:
    return logic.ledger_namespace(common.config().operator_namespace)


def _ensure_namespace(namespace: str) -> None:
    """Only for the local default (blackadder-system); in a cluster the operator's namespace exists."""
    ns = pykube.Namespace(client(), {"metadata": {"name": namespace}})
    if ns.exists():
        return
    try:
        _call("post", ns, body={"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": namespace, "labels": {f"{common.DOMAIN}/owner": OPERATOR}}},
              content_type="application/json", obj_list=True)
    except ApiError as exc:
        if exc.code != 409:
            raise


def load_ledger(agent: str, agent_uid: str) -> LedgerHandle:
    namespace, name = _ledger_ns(), logic.ledger_name(agent)
    secret = pykube.Secret(client(), {"metadata": {"name": name, "namespace": namespace}})
    try:
        obj = _call("get", secret).json()
    except ApiError as exc:
        if exc.code != 404:
            raise
        return LedgerHandle(namespace, name, logic.empty_ledger(agent, agent_uid), exists=False)
    raw: dict[str, Any] | None = None
    encoded = (obj.get("data") or {}).get(logic.LEDGER_KEY)
    if encoded:
        try:
            raw = json.loads(base64.b64decode(encoded))
        except ValueError:
            raw = None  # a hand-edited, broken ledger: start afresh rather than crash-looping
    return LedgerHandle(namespace, name, logic.normalise_ledger(raw, agent, agent_uid), exists=True,
                        resource_version=obj["metadata"].get("resourceVersion", ""))


def save_ledger(handle: LedgerHandle, agent_uid: str) -> None:
    """Create or replace (optimistically: only this agent's lock holder writes it)."""
    payload = base64.b64encode(json.dumps(handle.data, separators=(",", ":")).encode()).decode()
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {
            "name": handle.name, "namespace": handle.namespace,
            "labels": {logic.LEDGER_LABEL: handle.data["agent"]},
            # Namespaced dependents may have cluster-scoped owners: the GC removes a forgotten ledger.
            "ownerReferences": [{"apiVersion": f"{logic.GROUP}/{logic.VERSION}", "kind": logic.KIND,
                                 "name": handle.data["agent"], "uid": agent_uid}],
        },
        "data": {logic.LEDGER_KEY: payload},
    }
    secret = pykube.Secret(client(), body)
    if handle.exists:
        body["metadata"]["resourceVersion"] = handle.resource_version
        resp = _call("put", secret, body=body, content_type="application/json")
    else:
        if not common.config().operator_namespace:  # local run: the default ledger namespace may be missing
            _ensure_namespace(handle.namespace)
        resp = _call("post", secret, body=body, content_type="application/json", obj_list=True)
    handle.exists = True
    handle.resource_version = resp.json()["metadata"]["resourceVersion"]


def delete_ledger(agent: str) -> None:
    secret = pykube.Secret(client(), {"metadata": {"name": logic.ledger_name(agent), "namespace": _ledger_ns()}})
    try:
        _call("delete", secret)
    except ApiError as exc:
        if exc.code != 404:
            raise


# --- Inventory --------------------------------------------------------------------------------------


def list_objects(kind: type[pykube.objects.NamespacedAPIObject], namespaces: list[str] | None,
                 field_selector: str) -> list[dict[str, Any]]:
    """The article's server-side filtering: all namespaces minus a field selector, or (with
    targetNamespaces) just the target namespaces."""
    api = client()
    if namespaces is None:
        query = kind.objects(api).filter(namespace=pykube.all, field_selector=field_selector or None)
        return [o.obj for o in query]
    result: list[dict[str, Any]] = []
    for ns in namespaces:
        result.extend(o.obj for o in kind.objects(api).filter(namespace=ns))
    return result


def terminating_namespaces() -> list[str]:
    query = pykube.Namespace.objects(client()).filter(field_selector="status.phase=Terminating")
    return [ns.name for ns in query]


# --- Events ------------------------------------------------------------------------------------------


def _ref(kind: str, api_version: str, namespace: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "uid": uid}}


def announce(agent_body: Mapping[str, Any], target: Mapping[str, Any] | None, type_: str,
             reason: str, message: str, logger: Logger) -> None:
    """An Event on the agent and on the target, plus a log line (ConfigMap values never appear)."""
    (logger.warning if type_ == "Warning" else logger.info)(f"{reason}: {message}")
    try:
        kopf.event(agent_body, type=type_, reason=reason, message=message)  # type: ignore[arg-type]
        if target is not None:
            kopf.event(target, type=type_, reason=reason,  # type: ignore[arg-type]
                       message=f"{message} (ChaosAgent {agent_body['metadata']['name']})")
    except LookupError:
        pass  # outside a running operator (no event queue): the log line is the record


# --- Status -----------------------------------------------------------------------------------------


def patch_status(agent: str, status: Mapping[str, Any]) -> None:
    obj = ChaosAgent(client(), {"metadata": {"name": agent}})
    try:
        _call("patch", obj, subresource="status", body={"status": status})
    except ApiError as exc:
        if exc.code != 404:  # deleted meanwhile: nothing to report to
            raise


def conditions_for(previous: Any, settings: logic.AgentSettings, generation: int | None,
                   ready: bool, reason: str, message: str) -> list[dict[str, Any]]:
    conds = common.set_condition(previous, "Ready", ready, reason, message, generation)
    conds = common.set_condition(conds, "Paused", settings.paused, "Spec" if settings.paused else "Running",
                                 "paused: true in the spec" if settings.paused else "acting every pauseDuration",
                                 generation)
    dry_msg = {"OperatorForced": "CHAOS_DRY_RUN=true forces dry-run for every agent",
               "Spec": "dryRun: true in the spec"}.get(settings.dry_run_reason, "actions are real")
    return common.set_condition(conds, "DryRun", settings.dry_run, settings.dry_run_reason or "Off", dry_msg,
                                generation)


# --- The cycle ------------------------------------------------------------------------------------


def _now_epoch_iso() -> tuple[float, str]:
    return time.time(), common.now_iso()


def iso_to_epoch(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


@dataclasses.dataclass
class CycleResult:
    cycle: int
    done: dict[str, int]
    skipped: int
    candidates: dict[str, int]


def _spec(body: Mapping[str, Any]) -> munch.Munch:
    return munch.munchify(copy.deepcopy(dict(body.get("spec") or {})))


def _agent_settings(body: Mapping[str, Any]) -> logic.AgentSettings:
    return logic.settings_from_spec(_spec(body), common.config().chaos_dry_run)


def run_cycle(body: Mapping[str, Any], stopped: Callable[[], bool], logger: Logger,
              paragraph: Callable[[], str] = lorem.paragraph) -> None:
    """One cycle of one agent: revert, pause, or chaos; then the status. Never raises on API errors
    of single actions (they are reported); listing errors surface as Ready=False."""
    meta = body["metadata"]
    name, uid, generation = meta["name"], meta["uid"], meta.get("generation")
    settings = _agent_settings(body)
    previous_conditions = (body.get("status") or {}).get("conditions")
    with agent_lock(uid):
        if stopped():
            return
        try:
            handle = load_ledger(name, uid)
            if settings.revert:
                summary = revert_all(body, handle, settings, logger)
                status: dict[str, Any] = {
                    "observedGeneration": generation, "dryRun": settings.dry_run,
                    "conditions": conditions_for(previous_conditions, settings, generation, True, "Reverted",
                                                 "revert: true — no chaos; the ledger has been reverted"),
                }
                if summary["processed"]:
                    status["revert"] = summary
                patch_status(name, status)
                return
            if settings.paused:
                patch_status(name, {"observedGeneration": generation, "dryRun": settings.dry_run,
                                    "conditions": conditions_for(previous_conditions, settings, generation, True,
                                                                 "Paused", "paused: true — no chaos")})
                return
            result = _chaos(body, handle, settings, stopped, logger, paragraph)
        except (ApiError, requests.RequestException, pykube.exceptions.PyKubeError) as exc:
            common.count_error(OPERATOR, "cycle")
            announce(body, None, "Warning", "CycleFailed", f"cycle failed: {exc}", logger)
            patch_status(name, {"observedGeneration": generation,
                                "conditions": conditions_for(previous_conditions, settings, generation, False,
                                                             "CycleFailed", str(exc)[:300])})
            return
        data = handle.data
        done_msg = ", ".join(f"{m} {n}" for m, n in result.done.items())
        patch_status(name, {
            "observedGeneration": generation, "cycle": result.cycle, "lastCycleTime": data["lastCycleAt"],
            "dryRun": settings.dry_run, "actions": data["counts"], "wouldBe": data["wouldBe"],
            "lastCycle": {"cycle": result.cycle, "dryRun": settings.dry_run, "skipped": result.skipped,
                          "candidates": result.candidates, **result.done},
            "ledger": f"{handle.namespace}/{handle.name}",
            "conditions": conditions_for(previous_conditions, settings, generation, True, "CycleDone",
                                         f"cycle {result.cycle}: {'would ' if settings.dry_run else ''}{done_msg}"),
        })


def _chaos(body: Mapping[str, Any], handle: LedgerHandle, settings: logic.AgentSettings,
           stopped: Callable[[], bool], logger: Logger, paragraph: Callable[[], str]) -> CycleResult:
    cfg = common.config()
    ledger = handle.data
    cycle = int(ledger.get("cycle", 0)) + 1
    # Namespaces being deleted are no candidates: nothing to learn there, and Events are refused.
    settings = dataclasses.replace(settings, excluded=tuple(sorted({*settings.excluded, *terminating_namespaces()})))
    namespaces, selector = logic.listing_plan(settings, cfg.operator_namespace)
    pods: list[logic.PodRef] = []
    deps: list[logic.DeploymentRef] = []
    cms: list[logic.ConfigMapRef] = []
    cm_bodies: dict[tuple[str, str], dict[str, Any]] = {}
    if settings.tantrum:
        pods = [p for p in map(logic.pod_ref, list_objects(pykube.Pod, namespaces, selector))
                if logic.pod_allowed(p, settings, cfg.operator_namespace, cfg.operator_pod_name)]
    if settings.cancer:
        deps = [d for d in map(logic.deployment_ref, list_objects(pykube.Deployment, namespaces, selector))
                if logic.namespace_allowed(d.namespace, settings, cfg.operator_namespace)]
    if settings.ipsum:
        for obj in list_objects(pykube.ConfigMap, namespaces, selector):
            ref = logic.configmap_ref(obj)
            if logic.configmap_allowed(ref, settings, cfg.operator_namespace):
                cms.append(ref)
                cm_bodies[(ref.namespace, ref.name)] = obj
    kills = logic.pick_pods(pods, settings.tolerance, settings.eagerness,
                            logic.rng_for(settings.seed, cycle, logic.TANTRUM)) if settings.tantrum else []
    scales = logic.pick_deployments(deps, settings.eagerness,
                                    logic.rng_for(settings.seed, cycle, logic.CANCER)) if settings.cancer else []
    writes = logic.pick_configmaps(cms, settings.eagerness,
                                   logic.rng_for(settings.seed, cycle, logic.IPSUM)) if settings.ipsum else []
    epoch, now = _now_epoch_iso()
    done = {m: 0 for m in logic.MODES}
    skipped = 0
    dry = settings.dry_run
    counter = "wouldBe" if dry else "counts"
    agent_body = body

    def note(mode: str, kind: str, ns: str, nm: str, outcome: str, before: Any = None, after: Any = None) -> None:
        logic.journal(ledger, {"cycle": cycle, "at": now, "mode": mode, "kind": kind, "namespace": ns,
                               "name": nm, "outcome": outcome, "dryRun": dry, "before": before, "after": after})

    # Write-ahead: record the before-state of everything we are about to change, BEFORE changing it,
    # so a crash between the write and the ledger update never loses an original.
    # The cycle counts as started from here: a crash mid-cycle never makes a restart repeat its number.
    ledger["cycle"], ledger["lastCycleAt"], ledger["lastCycleEpoch"] = cycle, now, epoch
    if not dry and (scales or writes):
        previous_undo = copy.deepcopy(ledger.get("undo", {}))
        planned_writes: list[tuple[logic.ConfigMapRef, dict[str, str]]] = []
        for dep, wanted in scales:
            key = logic.target_key("Deployment", dep.namespace, dep.name)
            logic.record_undo(ledger, key, {"kind": "Deployment", "namespace": dep.namespace, "name": dep.name,
                                            "uid": dep.uid, "before": dep.replicas, "written": wanted,
                                            "generation": None, "firstAt": now, "lastAt": now, "actions": 1,
                                            "pending": True}, dep.replicas)
        for cm in writes:
            new_data = logic.ipsum_data(cm.data or {}, paragraph)
            key = logic.target_key("ConfigMap", cm.namespace, cm.name)
            trial = copy.deepcopy(ledger)
            logic.record_undo(trial, key, {"kind": "ConfigMap", "namespace": cm.namespace, "name": cm.name,
                                           "uid": cm.uid, "before": dict(cm.data or {}),
                                           "written": logic.data_fingerprint(new_data), "firstAt": now,
                                           "lastAt": now, "actions": 1, "pending": True},
                              logic.data_fingerprint(cm.data))
            if logic.ledger_size(trial) > logic.LEDGER_BUDGET_BYTES:
                skipped += 1
                announce(agent_body, None, "Warning", "LedgerFull",
                         f"not writing ConfigMap {cm.namespace}/{cm.name}: its undo would not fit the ledger",
                         logger)
                continue
            ledger["undo"] = trial["undo"]
            planned_writes.append((cm, new_data))
        save_ledger(handle, body["metadata"]["uid"])
    else:
        previous_undo = {}
        planned_writes = [(cm, {}) for cm in writes]

    def undo_failed(key: str) -> None:
        # The action did not happen: forget its write-ahead entry (keep an older one if any).
        if key in previous_undo:
            ledger["undo"][key] = previous_undo[key]
        else:
            ledger["undo"].pop(key, None)

    for pod in kills:
        if stopped():
            break
        target = _ref("Pod", "v1", pod.namespace, pod.name, pod.uid)
        if dry:
            note(logic.TANTRUM, "Pod", pod.namespace, pod.name, "would-delete")
            announce(agent_body, target, "Normal", "WouldKillPod",
                     f"dry-run: would delete Pod {pod.namespace}/{pod.name}", logger)
            done[logic.TANTRUM] += 1
            continue
        try:
            obj = pykube.Pod(client(), {"metadata": {"name": pod.name, "namespace": pod.namespace}})
            _call("delete", obj, body={"kind": "DeleteOptions", "apiVersion": "v1",
                                       "preconditions": {"uid": pod.uid}}, content_type="application/json")
        except ApiError as exc:
            skipped += 1
            note(logic.TANTRUM, "Pod", pod.namespace, pod.name, f"skipped: HTTP {exc.code}")
            continue
        done[logic.TANTRUM] += 1
        common.count_action(OPERATOR, "pod-killed")
        note(logic.TANTRUM, "Pod", pod.namespace, pod.name, "deleted")
        announce(agent_body, target, "Normal", "PodKilled",
                 f"deleted Pod {pod.namespace}/{pod.name} (not revertible)", logger)

    for dep, replicas in scales:
        if stopped():
            break
        key = logic.target_key("Deployment", dep.namespace, dep.name)
        target = _ref("Deployment", "apps/v1", dep.namespace, dep.name, dep.uid)
        msg = f"Deployment {dep.namespace}/{dep.name} from {dep.replicas} to {replicas} replicas"
        if dry:
            note(logic.CANCER, "Deployment", dep.namespace, dep.name, "would-scale", dep.replicas, replicas)
            announce(agent_body, target, "Normal", "WouldScaleDeployment", f"dry-run: would scale {msg}", logger)
            done[logic.CANCER] += 1
            continue
        try:
            obj = pykube.Deployment(client(), {"metadata": {"name": dep.name, "namespace": dep.namespace}})
            # Through the scale subresource, conditional on the replicas we decided on (not on the
            # resourceVersion: the Deployment's status moves it all the time).
            _call("patch", obj, subresource="scale", body=scale_patch(dep.replicas, replicas),
                  content_type="application/json-patch+json")
            fresh = _call("get", obj).json()
            if ledger["undo"].get(key, {}).get("uid") == dep.uid:
                ledger["undo"][key]["generation"] = fresh["metadata"].get("generation")
                ledger["undo"][key].pop("pending", None)
        except ApiError as exc:
            undo_failed(key)
            skipped += 1
            note(logic.CANCER, "Deployment", dep.namespace, dep.name, f"skipped: HTTP {exc.code}")
            continue
        done[logic.CANCER] += 1
        common.count_action(OPERATOR, "deployment-scaled")
        note(logic.CANCER, "Deployment", dep.namespace, dep.name, "scaled", dep.replicas, replicas)
        announce(agent_body, target, "Normal", "DeploymentScaled", f"scaled {msg}", logger)

    for cm, new_data in planned_writes:
        if stopped():
            break
        key = logic.target_key("ConfigMap", cm.namespace, cm.name)
        target = _ref("ConfigMap", "v1", cm.namespace, cm.name, cm.uid)
        keys = ", ".join(sorted(cm.data or {}))
        before_hash = logic.data_fingerprint(cm.data)
        if dry:
            note(logic.IPSUM, "ConfigMap", cm.namespace, cm.name, "would-ipsum", before_hash)
            announce(agent_body, target, "Normal", "WouldIpsumConfigMap",
                     f"dry-run: would overwrite ConfigMap {cm.namespace}/{cm.name} keys [{keys}] with lorem ipsum",
                     logger)
            done[logic.IPSUM] += 1
            continue
        try:
            obj = pykube.ConfigMap(client(), {"metadata": {"name": cm.name, "namespace": cm.namespace}})
            _call("patch", obj, body={"metadata": {"resourceVersion": cm.resource_version}, "data": new_data})
            ledger["undo"].get(key, {}).pop("pending", None)
        except ApiError as exc:
            undo_failed(key)
            skipped += 1
            note(logic.IPSUM, "ConfigMap", cm.namespace, cm.name, f"skipped: HTTP {exc.code}")
            continue
        done[logic.IPSUM] += 1
        common.count_action(OPERATOR, "configmap-ipsumed")
        note(logic.IPSUM, "ConfigMap", cm.namespace, cm.name, "ipsumed", before_hash, logic.data_fingerprint(new_data))
        announce(agent_body, target, "Normal", "ConfigMapIpsumed",
                 f"overwrote ConfigMap {cm.namespace}/{cm.name} keys [{keys}] with lorem ipsum (revertible)", logger)

    for mode, n in done.items():
        ledger[counter][mode] = int(ledger[counter].get(mode, 0)) + n
    save_ledger(handle, body["metadata"]["uid"])
    return CycleResult(cycle, done, skipped,
                       {"pods": len(pods), "deployments": len(deps), "configMaps": len(cms)})


def scale_patch(expected: int, replicas: int) -> list[dict[str, Any]]:
    """A JSON patch that fails (422) unless the replicas are still what we expect."""
    return [{"op": "test", "path": "/spec/replicas", "value": expected},
            {"op": "replace", "path": "/spec/replicas", "value": replicas}]


# --- Revert ---------------------------------------------------------------------------------------


def _read(kind: type[pykube.objects.NamespacedAPIObject], namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(_call("get", kind(client(), {"metadata": {"name": name, "namespace": namespace}})).json())
    except ApiError as exc:
        if exc.code == 404:
            return None
        raise


def revert_all(body: Mapping[str, Any], handle: LedgerHandle, settings: logic.AgentSettings,
               logger: Logger) -> dict[str, Any]:
    """Restore every ledger entry that still shows what we wrote; report the others. Called under
    the agent's lock. Dry-run: report what would be restored, keep the ledger as it is."""
    ledger = handle.data
    undo: dict[str, Any] = ledger.get("undo", {})
    restored: list[str] = []
    changed: list[str] = []
    gone: list[str] = []
    _, now = _now_epoch_iso()
    for key in sorted(undo):
        entry = undo[key]
        kind = pykube.Deployment if entry["kind"] == "Deployment" else pykube.ConfigMap
        ns, nm = entry["namespace"], entry["name"]
        current = _read(kind, ns, nm)
        verdict = logic.revert_verdict(entry, current)
        api_version = "apps/v1" if entry["kind"] == "Deployment" else "v1"
        target = _ref(entry["kind"], api_version, ns, nm, entry["uid"]) if current else None
        what = f"{entry['kind']} {ns}/{nm}"
        if verdict == logic.RESTORE and current is not None:
            if settings.dry_run:
                restored.append(key)
                announce(body, target, "Normal", "WouldRevert", f"dry-run: would restore {what}", logger)
                continue
            rv = current["metadata"]["resourceVersion"]
            try:
                if entry["kind"] == "Deployment":
                    _call("patch", kind(client(), {"metadata": {"name": nm, "namespace": ns}}), subresource="scale",
                          body=scale_patch(entry["written"], entry["before"]),
                          content_type="application/json-patch+json")
                    detail = f"replicas back to {entry['before']}"
                else:
                    # A merge patch: keys we wrote get their old values back; nothing else is touched.
                    _call("patch", kind(client(), {"metadata": {"name": nm, "namespace": ns}}),
                          body={"metadata": {"resourceVersion": rv}, "data": entry["before"]})
                    detail = "data restored"
            except ApiError as exc:
                if exc.code not in (409, 422):  # changed between our read and our write
                    raise
                verdict = logic.CHANGED
            else:
                restored.append(key)
                common.count_action(OPERATOR, "reverted")
                logic.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                       "name": nm, "outcome": "restored"})
                announce(body, target, "Normal", "Reverted", f"restored {what}: {detail}", logger)
        if verdict == logic.CHANGED:
            changed.append(key)
            announce(body, target, "Warning", "RevertSkipped",
                     f"not restoring {what}: it was changed since the agent wrote it", logger)
        elif verdict == logic.GONE:
            gone.append(key)
            announce(body, None, "Warning", "RevertSkipped", f"not restoring {what}: it no longer exists", logger)
        if not settings.dry_run and verdict in (logic.CHANGED, logic.GONE):
            logic.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                   "name": nm, "outcome": verdict})
    if not settings.dry_run and undo:
        ledger["undo"] = {}
        save_ledger(handle, body["metadata"]["uid"])
    return {"at": now, "dryRun": settings.dry_run, "processed": len(undo), "restored": restored[:50],
            "changed": changed[:50], "gone": gone[:50]}


def revert_on_delete(body: Mapping[str, Any], logger: Logger) -> None:
    meta = body["metadata"]
    settings = _agent_settings(body)
    with agent_lock(meta["uid"]):
        if settings.revert_on_delete:
            handle = load_ledger(meta["name"], meta["uid"])
            if handle.data.get("undo"):
                revert_all(body, handle, settings, logger)
        delete_ledger(meta["name"])


def initial_delay(body: Mapping[str, Any]) -> float:
    """After an operator restart, wait out the rest of the pause instead of acting at once."""
    settings = _agent_settings(body)
    handle = load_ledger(body["metadata"]["name"], body["metadata"]["uid"])
    last = handle.data.get("lastCycleEpoch")
    if last is None:
        last = iso_to_epoch((body.get("status") or {}).get("lastCycleTime"))
    return logic.seconds_until_next_cycle(last, time.time(), settings.pause)
