"""Copyrator: the API side. Reads the cluster, asks ``copyrator`` for a plan, applies it, reports.

Every function here is synchronous (the kubernetes client); Kopf runs the handlers that call them in
its thread pool. Secret values pass through memory only transiently: nothing here logs, stores or
posts an object body, and API errors are reduced to their status code and reason.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any, cast

import kopf
import kubernetes

from kopf_operators import common
from kopf_operators import copyrator as logic

logger = logging.getLogger("kopf_operators.copyrator")
OPERATOR = "copyrator"


def describe(exc: BaseException) -> str:
    """An API error without its response body (which could echo object content)."""
    if isinstance(exc, kubernetes.client.ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return type(exc).__name__


def _json(response: Any) -> Any:
    return json.loads(response.data)


# --- Reading ----------------------------------------------------------------------------------


def read_rule(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(_json(common.custom_objects().get_namespaced_custom_object(
            logic.GROUP, logic.VERSION, namespace, logic.PLURAL, name, _preload_content=False)))
    except kubernetes.client.ApiException as exc:
        if common.is_status(exc, 404):
            return None
        raise


def list_namespaces() -> list[logic.NamespaceInfo]:
    items = _json(common.core_v1().list_namespace(_preload_content=False))["items"]
    return [logic.NamespaceInfo(
        name=ns["metadata"]["name"],
        labels=ns["metadata"].get("labels") or {},
        active=not ns["metadata"].get("deletionTimestamp") and ns.get("status", {}).get("phase") != "Terminating",
    ) for ns in items]


def _list(kind: str, namespace: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    core = common.core_v1()
    if kind == "ConfigMap":
        call = (core.list_namespaced_config_map if namespace else core.list_config_map_for_all_namespaces)
    else:
        call = core.list_namespaced_secret if namespace else core.list_secret_for_all_namespaces
    args = (namespace,) if namespace else ()
    body = _json(call(*args, _preload_content=False, **kwargs))
    items = body.get("items") or []
    for item in items:  # list items come without kind
        item.setdefault("kind", kind)
    return list(items)


def gather(rule: logic.Rule) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(selector-matching objects in the source namespaces, objects that are ours or in the way)."""
    selector = logic.label_selector_string(rule.selector)
    candidates = [obj for ns in rule.source_namespaces
                  for obj in _list(rule.kind, ns, label_selector=selector)]
    existing: dict[str, dict[str, Any]] = {}
    for obj in _list(rule.kind, label_selector=f"{logic.RULE_UID_LABEL}={rule.uid}"):
        existing[obj["metadata"]["uid"]] = obj
    # Same-named objects anywhere: what might stand in the way of a copy (conflict detection).
    for name in sorted({obj["metadata"]["name"] for obj in candidates if logic.is_source(rule, obj)}):
        for obj in _list(rule.kind, field_selector=f"metadata.name={name}"):
            existing[obj["metadata"]["uid"]] = obj
    return candidates, list(existing.values())


# --- Writing ----------------------------------------------------------------------------------


def _create(body: Mapping[str, Any]) -> None:
    ns = body["metadata"]["namespace"]
    if body["kind"] == "ConfigMap":
        common.core_v1().create_namespaced_config_map(ns, body)
    else:
        common.core_v1().create_namespaced_secret(ns, body)


def _replace(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
    meta = existing["metadata"]
    body = json.loads(json.dumps(desired))
    # Keep annotations others put on the copy; ours win. Optimistic concurrency via resourceVersion.
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if not k.startswith(logic.PREFIX)}
    body["metadata"]["annotations"] = {**annotations, **desired["metadata"]["annotations"]}
    body["metadata"]["resourceVersion"] = meta["resourceVersion"]
    if desired["kind"] == "ConfigMap":
        common.core_v1().replace_namespaced_config_map(meta["name"], meta["namespace"], body)
    else:
        common.core_v1().replace_namespaced_secret(meta["name"], meta["namespace"], body)


def _delete(kind: str, ref: logic.Ref) -> None:
    # The uid precondition: never delete a same-named object created after we decided.
    options = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid=ref.uid))
    try:
        if kind == "ConfigMap":
            common.core_v1().delete_namespaced_config_map(ref.name, ref.namespace, body=options)
        else:
            common.core_v1().delete_namespaced_secret(ref.name, ref.namespace, body=options)
    except kubernetes.client.ApiException as exc:
        if not common.is_status(exc, 404):
            raise


# Copies are independent objects: write up to this many at once (one rule into 500 namespaces is
# 500 creates; one at a time they take several times longer than the API server needs).
WRITE_CONCURRENCY = 16
_writers = concurrent.futures.ThreadPoolExecutor(max_workers=WRITE_CONCURRENCY,
                                                 thread_name_prefix="copyrator-write")


def apply(rule: logic.Rule, result: logic.Plan) -> tuple[dict[str, int], int]:
    """Apply a plan; returns (done counts, failures). Failures are retried by the next reconcile."""
    kind = rule.kind

    def create(body: dict[str, Any]) -> str:
        _create(body)
        logger.info("Copyrator %s: copied %s %s into %s", rule.key, kind,
                    body["metadata"]["annotations"][logic.SOURCE_ANNOTATION], body["metadata"]["namespace"])
        return "created"

    def update(existing: Mapping[str, Any], desired: dict[str, Any], recreate: bool) -> str:
        if recreate:
            _delete(kind, logic.ref(existing))
            _create(desired)
        else:
            _replace(existing, desired)
        logger.info("Copyrator %s: updated %s %s%s", rule.key, kind, logic.ref(existing),
                    " (re-created: type or immutability)" if recreate else "")
        return "updated"

    def delete(target: logic.Ref) -> str:
        _delete(kind, target)
        logger.info("Copyrator %s: pruned %s %s", rule.key, kind, target)
        return "deleted"

    jobs: list[tuple[str, Callable[[], str]]] = [
        *((f"create {kind} {logic.Ref(b['metadata']['namespace'], b['metadata']['name'])}", partial(create, b))
          for b in result.creates),
        *((f"update {kind} {logic.ref(e)}", partial(update, e, d, r)) for e, d, r in result.updates),
        *((f"prune {kind} {t}", partial(delete, t)) for t in result.deletes),
    ]

    def attempt(job: tuple[str, Callable[[], str]]) -> str | None:
        what, run = job
        try:
            return run()
        except kubernetes.client.ApiException as exc:
            logger.warning("Copyrator %s: cannot %s: %s", rule.key, what, describe(exc))
            return None

    outcomes = list(_writers.map(attempt, jobs)) if len(jobs) > 1 else [attempt(job) for job in jobs]
    done = {action: outcomes.count(action) for action in ("created", "updated", "deleted")}
    failed = outcomes.count(None)
    for action, count in done.items():
        if count:
            common.count_action(OPERATOR, action, count)
    if failed:
        common.count_error(OPERATOR, "write")
    return done, failed


def prune_all(rule_uid: str, namespace: str, name: str) -> int:
    """Delete every copy made by one rule (the rule is being deleted). Returns how many."""
    with coalescer.exclusive((namespace, name)):  # no reconcile of this rule runs meanwhile
        try:
            count = _prune_all(rule_uid, f"{namespace}/{name}")
        except common.API_ERRORS as exc:  # the finalizer stays; Kopf retries in 10 s
            common.count_error(OPERATOR, "api")
            raise kopf.TemporaryError(f"pruning the copies failed: {describe(exc)}", delay=10) from None
    known_sources.pop(rule_uid, None)
    coalescer.forget((namespace, name))
    return count


def _prune_all(rule_uid: str, rule_key: str) -> int:
    count = 0
    for kind in ("ConfigMap", "Secret"):
        for obj in _list(kind, label_selector=f"{logic.RULE_UID_LABEL}={rule_uid}"):
            _delete(kind, logic.ref(obj))
            count += 1
            logger.info("Copyrator %s: pruned %s %s (rule deleted)", rule_key, kind, logic.ref(obj))
    if count:
        common.count_action(OPERATOR, "deleted", count)
    return count


def patch_status(rule_body: Mapping[str, Any], status: Mapping[str, Any]) -> None:
    meta = rule_body["metadata"]
    common.custom_objects().patch_namespaced_custom_object_status(
        logic.GROUP, logic.VERSION, meta["namespace"], logic.PLURAL, meta["name"], {"status": status})


def post(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the rule."""
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message)


# --- Reconcile ------------------------------------------------------------------------------

# Remembered source names per rule uid, so that an event on an object that *stopped* matching the
# selector still reaches its rule (names only, never content).
known_sources: dict[str, set[str]] = {}


def reconcile(namespace: str, name: str, trigger: str) -> None:
    """Level-triggered: read everything, compare, write only the differences. Idempotent."""
    body = read_rule(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return  # gone or going: on.delete prunes
    previous = body.get("status") or {}
    try:
        rule = logic.parse_rule(body)
    except logic.RuleError as problem:
        _report_problem(body, previous, problem)
        return
    reason = logic.refusal(rule, common.config().copyrator_allow_cross_namespace)
    if reason:
        _report_problem(body, previous, logic.RuleError(reason, "Refused"), rule)
        return

    candidates, existing = gather(rule)
    result = logic.plan(rule, candidates, list_namespaces(), existing)
    known_sources[rule.uid] = {str(r) for r in result.sources}
    done, failed = apply(rule, result) if result.writes else ({}, 0)
    status = logic.build_status(rule, previous, result, failed)

    if any(done.values()):
        summary = ", ".join(f"{action} {count}" for action, count in done.items() if count)
        post(body, "Normal", "Synced", f"{summary} ({trigger})")
    old_conflicts = previous.get("conflicts") or []
    if result.conflicts and status["conflicts"] != old_conflicts:
        message = (f"{len(result.conflicts)} object(s) in the way are not owned by this rule and were left "
                   f"untouched: {', '.join(status['conflicts'])}")
        logger.warning("Copyrator %s: %s", rule.key, message)
        post(body, "Warning", "Conflict", message)
    changed = logic.status_changed(previous, status)
    if changed:
        patch_status(body, status)
    logger.debug("Copyrator %s: reconciled (trigger=%s): %d source(s), %d write(s), status %s",
                 rule.key, trigger, len(result.sources), result.writes, "updated" if changed else "unchanged")
    if failed:
        raise kopf.TemporaryError(f"{failed} copy operation(s) failed", delay=10)


def _report_problem(body: Mapping[str, Any], previous: Mapping[str, Any], problem: logic.RuleError,
                    rule: logic.Rule | None = None) -> None:
    if rule is None:
        meta = body["metadata"]
        rule = logic.Rule(namespace=meta["namespace"], name=meta["name"], uid=meta.get("uid", ""),
                          generation=int(meta.get("generation") or 0), rule_type="configmap",
                          selector={}, source_namespaces=())
        status = logic.build_status(rule, previous, problem=problem)
        status.pop("ruleType", None)
        status.pop("sourceNamespaces", None)
    else:
        status = logic.build_status(rule, previous, problem=problem)
    ready: Mapping[str, Any] = next((c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), {})
    if ready.get("message") != str(problem) or ready.get("observedGeneration") != status["observedGeneration"]:
        logger.warning("Copyrator %s/%s: %s: %s", body["metadata"]["namespace"], body["metadata"]["name"],
                       problem.reason, problem)
        post(body, "Warning", problem.reason, str(problem))
    if logic.status_changed(previous, status):
        patch_status(body, status)


class Coalescer:
    """At most one reconcile per rule at a time; requests arriving meanwhile merge into one re-run.

    Event storms (a prune of 50 copies yields 50 DELETED events) thus cost about two reconciles.
    ``exclusive(key)`` lets the rule's deletion wait for a running reconcile, so that a reconcile
    that read the rule just before its deletion cannot create copies after the final prune.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[Any, bool] = {}  # key -> rerun requested
        self._key_locks: dict[Any, threading.Lock] = {}

    def exclusive(self, key: Any) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def forget(self, key: Any) -> None:
        with self._lock:
            self._key_locks.pop(key, None)

    def run(self, key: Any, fn: Callable[[], None]) -> None:
        with self._lock:
            if key in self._state:
                self._state[key] = True
                return
            self._state[key] = False
        try:
            while True:
                with self.exclusive(key):
                    fn()
                with self._lock:
                    if not self._state[key]:
                        return
                    self._state[key] = False
        finally:
            with self._lock:
                self._state.pop(key, None)


coalescer = Coalescer()


def request(namespace: str, name: str, trigger: str) -> None:
    """Reconcile one rule (or merge into the running reconcile). API errors become a TemporaryError
    carrying only the HTTP status: Kopf retries rule handlers after 10 s, never hot."""
    try:
        coalescer.run((namespace, name), lambda: reconcile(namespace, name, trigger))
    except common.API_ERRORS as exc:
        common.count_error(OPERATOR, "api")
        raise kopf.TemporaryError(f"reconcile of {namespace}/{name} failed: {describe(exc)}", delay=10) from None


def iter_rule_keys(index: Mapping[Any, Any]) -> Iterator[tuple[tuple[str, str], Mapping[str, Any]]]:
    for key, store in index.items():
        for entry in store:
            yield key, entry
