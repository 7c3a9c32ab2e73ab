"""Re-roller: the in-memory runtime (debounce, rate limit) and the few API calls it makes.

Per workload there is at most one asyncio task. A trigger marks the workload dirty and starts the
task if none runs; the task waits out the debounce window (so a burst of changes merges), reads the
workload once (a GET, never a LIST), plans with the pure logic against the in-memory hash cache, and
patches. A rollout is also held back until ``min_interval`` has passed since the workload's previous
one, so a flapping source cannot cause a rollout storm. Triggers arriving meanwhile are absorbed by
the same task (it loops while dirty).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf
import kubernetes

from kopf_operators import common
from kopf_operators import reroller as logic

logger = logging.getLogger("kopf_operators.reroller")

NAME = "reroller"
SOURCE_INDEXES = {"ConfigMap": "reroller_configmaps", "Secret": "reroller_secrets"}
WORKLOAD_INDEXES = {"Deployment": "reroller_deployments", "StatefulSet": "reroller_statefulsets",
                    "DaemonSet": "reroller_daemonsets"}
RETRY_DELAY = 5.0
MAX_ATTEMPTS = 5


def _read(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    api = common.apps_v1()
    reader: Callable[..., Any] = {
        "Deployment": api.read_namespaced_deployment,
        "StatefulSet": api.read_namespaced_stateful_set,
        "DaemonSet": api.read_namespaced_daemon_set,
    }[kind]
    try:
        obj = reader(name, namespace)
    except kubernetes.client.ApiException as exc:
        if common.is_status(exc, 404):
            return None
        raise
    body: dict[str, Any] = common.api_client().sanitize_for_serialization(obj)
    body.setdefault("apiVersion", "apps/v1")
    body.setdefault("kind", kind)
    return body


def _patch(kind: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
    api = common.apps_v1()
    patcher: Callable[..., Any] = {
        "Deployment": api.patch_namespaced_deployment,
        "StatefulSet": api.patch_namespaced_stateful_set,
        "DaemonSet": api.patch_namespaced_daemon_set,
    }[kind]
    # A JSON merge patch: only the keys we name change (our two annotations and the template's one).
    patcher(name, namespace, patch, _content_type="application/merge-patch+json")


def _post_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the workload, through Kopf's poster (best-effort, in the background)."""
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message[:1000])


class Runtime:
    """Process-wide state: index references, per-workload tasks, last rollout times."""

    def __init__(self) -> None:
        self.indexes: dict[str, Mapping[Any, Any]] = {}
        self.tasks: dict[logic.WorkloadKey, asyncio.Task[None]] = {}
        self.dirty: set[logic.WorkloadKey] = set()
        self.last_roll: dict[logic.WorkloadKey, float] = {}
        self.warned: dict[logic.WorkloadKey, tuple[str, ...]] = {}

    # --- the in-memory caches (Kopf indexes) ---------------------------------------------------

    def bind(self, kwargs: Mapping[str, Any]) -> None:
        """Keep references to Kopf's live index objects (they are passed to every handler)."""
        if not self.indexes:
            for index_id in (*SOURCE_INDEXES.values(), *WORKLOAD_INDEXES.values()):
                self.indexes[index_id] = kwargs[index_id]

    def lookup(self, namespace: str, sources: frozenset[logic.Source] | set[logic.Source]
               ) -> dict[tuple[str, str], str]:
        """(kind, name) -> data hash of the existing sources among ``sources``."""
        result: dict[tuple[str, str], str] = {}
        for source in sources:
            store = self.indexes[SOURCE_INDEXES[source.kind]].get((source.kind, namespace, source.name))
            for h in store or ():
                result[(source.kind, source.name)] = h
        return result

    def workloads_of(self, kind: str, namespace: str, name: str) -> set[logic.WorkloadKey]:
        keys: set[logic.WorkloadKey] = set()
        for index_id in WORKLOAD_INDEXES.values():
            keys.update(self.indexes[index_id].get((kind, namespace, name)) or ())
        return keys

    def state_of(self, key: logic.WorkloadKey) -> logic.WorkloadState | None:
        for state in self.indexes[WORKLOAD_INDEXES[key[0]]].get(("state", *key)) or ():
            return state
        return None

    # --- triggers --------------------------------------------------------------------------------

    def check(self, key: logic.WorkloadKey, state: logic.WorkloadState | None) -> None:
        """Schedule a reconcile if the in-memory pre-check says there is something to do."""
        if state is None:
            self.warned.pop(key, None)
            return
        lookup = self.lookup(key[1], state.sources)
        if logic.needs_reconcile(state, lookup, self.warned.get(key)):
            self.trigger(key)
        elif key in self.warned and not logic.snapshot(state.sources, lookup).missing:
            del self.warned[key]  # resolved: warn again if it goes missing again

    def trigger(self, key: logic.WorkloadKey) -> None:
        self.dirty.add(key)
        if key not in self.tasks:
            self.tasks[key] = asyncio.create_task(self._run(key), name=f"reroller {'/'.join(key)}")

    async def shutdown(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- the per-workload task ------------------------------------------------------------------

    async def _run(self, key: logic.WorkloadKey) -> None:
        cfg = common.config()
        attempts = 0
        pause = cfg.reroller_debounce_seconds  # the merge window, started by the first change
        try:
            while True:
                await asyncio.sleep(pause)
                pause = cfg.reroller_debounce_seconds
                self.dirty.discard(key)
                try:
                    delay = await self._reconcile(key)
                    attempts = 0
                except Exception as exc:
                    attempts += 1
                    common.count_error(NAME, type(exc).__name__)
                    if attempts >= MAX_ATTEMPTS:
                        logger.exception("Giving up on %s after %d attempts (the next change retries)",
                                         "/".join(key), attempts)
                        return
                    logger.warning("Reconciling %s failed (%s); retrying in %.0fs",
                                   "/".join(key), exc, RETRY_DELAY)
                    delay = RETRY_DELAY
                if delay:
                    # Held back (rate limit, conflict, retry): look again after the delay, and changes
                    # arriving meanwhile are merged into that look.
                    self.dirty.add(key)
                    pause = delay
                if key not in self.dirty:
                    return
        finally:
            self.tasks.pop(key, None)

    async def _reconcile(self, key: logic.WorkloadKey) -> float:
        """One level-based pass. Returns a delay after which to look again (0: done)."""
        kind, namespace, name = key
        body = await asyncio.to_thread(_read, kind, namespace, name)
        if body is None:
            self.warned.pop(key, None)
            self.last_roll.pop(key, None)
            return 0
        state = logic.workload_state(body)
        if state is None:
            return 0
        snap = logic.snapshot(state.sources, self.lookup(namespace, state.sources))
        plan = logic.plan(state.annotations, snap)
        where = f"{kind} {namespace}/{name}"

        if plan.action == "wait-missing":
            if self.warned.get(key) != plan.missing:
                self.warned[key] = plan.missing
                message = (f"Missing source(s) {', '.join(plan.missing)}: not re-rolling until they exist "
                           f"(the baseline is kept, so a recreate with the same data rolls nothing)")
                logger.warning("%s: %s", where, message)
                _post_event(body, "Warning", "SourceMissing", message)
            return 0
        self.warned.pop(key, None)
        if plan.action == "none":
            return 0

        if plan.action == "roll":
            wait = self.last_roll.get(key, -1e9) + common.config().reroller_min_interval_seconds \
                - time.monotonic()
            if wait > 0:
                logger.info("%s: rollout held back %.1fs by the rate limit", where, wait)
                return wait
            patch = logic.roll_patch(plan, snap)
        else:
            patch = logic.metadata_patch(plan, snap)
        # Optimistic concurrency: a 409 means the workload changed since the read; look again.
        patch["metadata"]["resourceVersion"] = body["metadata"]["resourceVersion"]
        try:
            await asyncio.to_thread(_patch, kind, namespace, name, patch)
        except kubernetes.client.ApiException as exc:
            if common.is_status(exc, 409):
                return 0.1
            if common.is_status(exc, 404):
                return 0
            raise

        if plan.action == "roll":
            self.last_roll[key] = time.monotonic()
            message = logic.rollout_message(kind, name, plan.changed)
            logger.info("%s: %s (config-hash %s)", where, message, plan.new_hash)
            common.count_action(NAME, "rollout")
            _post_event(body, "Normal", "Rerolled", message)
        else:
            logger.info("%s: recorded the baseline config hash %s (no rollout)", where, plan.new_hash)
            common.count_action(NAME, "baseline")
        return 0


runtime = Runtime()
