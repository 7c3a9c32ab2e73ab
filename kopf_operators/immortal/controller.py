"""Immortal containers: the controller (state from watches, decisions in ``decisions``, API via ``core.access``).

State comes from two Kopf indexes, never from a read per event:
- ``immortal-objects``: each ImmortalContainer's spec, uid, generation, resourceVersion and status;
- ``immortal-pods``: each of our pods (the pod watch is label-selected server-side, so unrelated pods
  never reach the process), reduced to a ``PodView``.

A pod event costs one write (create or delete) and at most one status patch: a pod we create is
counted in the same status write that reports it Running, unless it takes longer than
``TRANSIENT_SECONDS`` to start (then it is reported as starting, and again when it runs). A pod we
created that is deleted before that write is remembered and counted in the next one. A pod that
we do not own but has the target name is not watched: the create answers 409, and only then is the
pod read once.
The status patch carries the newest resourceVersion known (the index, or the answer to our own last
patch), so a start is never counted twice. A 409 means a newer version exists: its watch event runs
the next pass, so nothing is read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from kopf_operators.core import access as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access, ApiError
from kopf_operators.core.controller import Background, Backoff, Index, KeyedTimers, MemoSlot, first
from kopf_operators.core.conventions import stall_event
from kopf_operators.immortal import decisions as logic

OPERATOR = "immortal"
OBJECTS_INDEX = "immortal-objects"
PODS_INDEX = "immortal-pods"
IMMORTAL = k8s.Kind(logic.API_VERSION, logic.PLURAL, logic.KIND)
# Level-triggered sweep over the indexes (no requests unless something must change), with jitter.
RESYNC_SECONDS = 300.0
# A pod of ours going away, or a new one starting, is reported in status only if it still is this much later.
TRANSIENT_SECONDS = 2.0
# A foreign pod in the way, or a failed pass: look again after this long (doubling, capped).
RETRY_SECONDS = (1.0, 300.0)

logger = logging.getLogger("kopf_operators.immortal")
Key = tuple[str, str]  # (namespace, ImmortalContainer name), in both indexes
Snapshot = Mapping[str, Any]  # an ImmortalContainer or pod reduced to what the controller reads


def _rv(body: Mapping[str, Any] | None) -> int:
    try:
        return int((body or {}).get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class ImmortalController:
    def __init__(self, access: Access, objects: Index[Key, Snapshot], pods: Index[Key, Snapshot]) -> None:
        self.access = access
        self.objects = objects  # Kopf's live index: (namespace, name) -> logic.snapshot(body)
        self.pods = pods        # Kopf's live index: (namespace, ic name) -> logic.pod_summary(pod)
        # The answers to our own status patches: newer than the index until the object's next event
        # (the echo of the patch itself is not processed, so the index keeps the version before it).
        self._written: dict[Key, dict[str, Any]] = {}
        # The newest pod version seen per object (None: deleted at that version): see ``_pod``.
        self._pods_seen: dict[Key, tuple[int, dict[str, Any] | None]] = {}
        self._refused: dict[Key, tuple[str, str]] = {}  # a spec the API server refused: (digest, why)
        # Pods this process created that no status write has counted yet: one deleted before the write
        # that would count it (before it ran) is still a start, counted in the next write.
        self._uncounted: dict[Key, set[str]] = {}
        self._hashes: dict[Key, tuple[tuple[str, int | None], str]] = {}  # see _template_hash
        self.background = Background(OPERATOR)
        self._retries: KeyedTimers[Key] = self.background.timers()  # a foreign pod in the way, a failed pass
        self._backoff: Backoff[Key] = Backoff(*RETRY_SECONDS)
        self._wakes: KeyedTimers[Key] = self.background.timers()  # crash backoff: the replacement's wake-up
        self._settling: KeyedTimers[Key] = self.background.timers()  # a pod going away: report it if it lasts

    # --- state -------------------------------------------------------------------------------------

    def current(self, key: Key) -> dict[str, Any] | None:
        """The newest known ImmortalContainer (None when gone or being deleted)."""
        indexed = first(self.objects, key)
        written = self._written.get(key)
        if written is not None and (indexed is None or written["metadata"]["uid"] != indexed["metadata"]["uid"]
                                    or _rv(indexed) >= _rv(written)):
            self._written.pop(key, None)  # the watch caught up (or the object is gone or replaced)
            written = None
        ic = written or indexed
        if ic is None or ic["metadata"].get("deletionTimestamp"):
            return None
        return dict(ic)

    def forget(self, key: Key) -> None:
        self._written.pop(key, None)
        self._pods_seen.pop(key, None)
        self._backoff.reset(key)
        self._refused.pop(key, None)
        self._uncounted.pop(key, None)
        self._hashes.pop(key, None)
        for timers in (self._retries, self._wakes, self._settling):
            timers.cancel(key)

    # --- triggers ----------------------------------------------------------------------------------

    async def deleted(self, key: Key) -> None:
        """The ImmortalContainer is gone (its pod goes by garbage collection): drop what we kept."""
        async with self.access.serialised(key):
            self.forget(key)

    async def converge(self, key: Key, body: Mapping[str, Any] | None = None, *, trigger: str = "object",
                       pod_event: tuple[str, Mapping[str, Any]] | None = None) -> logic.Decision | None:
        """One level-triggered pass for one ImmortalContainer. ``body``: the object as its event
        delivered it; ``pod_event``: (type, pod) of a pod event. Both are fresher than the indexes."""
        async with self.access.serialised(key):
            ic = self.current(key)
            if body is not None and (ic is None or _rv(body) > _rv(ic)):
                ic = None if body["metadata"].get("deletionTimestamp") else dict(body)
            if ic is None:
                self.forget(key)
                return None
            now = time.time()
            with metrics.reaction(OPERATOR, trigger):
                pod = self._pod(key, ic, pod_event)
                decision, pod = await self._act(ic, pod, now, trigger)
                if self._transient(ic, pod, decision, trigger) or self._starting(ic, pod, decision, trigger):
                    # Our counted pod is going away: its DELETED event usually follows at once and the
                    # replacement's status write says it all. Or a new pod of ours is starting: its
                    # Running event usually follows at once, and one write then counts it and says
                    # Ready. Report the wait only if it lasts.
                    self._settle_later(key)
                else:
                    await self._write_status(key, ic, pod, decision, now)
            if decision.action is logic.Action.BLOCKED:
                self._retry_later(key)
            else:
                self._backoff.reset(key)
            if decision.action is logic.Action.BACKOFF:
                self._wake_later(key, decision.retry_in)
            return decision

    def _pod(self, key: Key, ic: Mapping[str, Any], pod_event: tuple[str, Mapping[str, Any]] | None
             ) -> logic.PodView | None:
        """The newest pod with the target name. Kopf handles each pod (uid) on its own, so an event of
        a replaced pod can arrive after its successor's: the newest resourceVersion wins, and a
        deletion is remembered (as "gone at that version") so that no older event brings it back."""
        seen = self._pods_seen.get(key)
        candidates: list[tuple[int, dict[str, Any] | None]] = [(_rv(v), dict(v)) for v in self.pods.get(key) or ()]
        if seen is not None:
            candidates.append(seen)
        if pod_event is not None:
            event_type, event_pod = pod_event
            candidates.append((_rv(event_pod), None if event_type == "DELETED" else dict(event_pod)))
        if not candidates:
            return None
        newest = max(candidates, key=lambda candidate: candidate[0])
        self._pods_seen[key] = newest
        return logic.observe_pod(newest[1], ic["metadata"]["uid"])

    def _template_hash(self, ic: Mapping[str, Any]) -> str:
        """The hash of the pod the spec asks for, computed once per spec (uid and generation): every
        pass compares it with the pod's, and hashing the template was a tenth of a pass."""
        meta = ic["metadata"]
        key, version = (meta["namespace"], meta["name"]), (meta["uid"], meta.get("generation"))
        known = self._hashes.get(key)
        if known is None or known[0] != version:
            known = self._hashes[key] = (version, logic.template_hash(ic["spec"]))
        return known[1]

    def _saw_pod(self, key: Key, pod: Mapping[str, Any]) -> None:
        """Our own create's answer: newer than anything the watch has delivered so far."""
        if _rv(pod) >= (self._pods_seen.get(key) or (0, None))[0]:
            self._pods_seen[key] = (_rv(pod), logic.pod_summary(pod))

    async def _act(self, ic: Mapping[str, Any], pod: logic.PodView | None, now: float, trigger: str
                   ) -> tuple[logic.Decision, logic.PodView | None]:
        meta = ic["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        image, wanted = logic.main_image(ic["spec"]), self._template_hash(ic)

        def decide(pod: logic.PodView | None) -> logic.Decision:
            backoff = logic.observe_end((ic.get("status") or {}).get("backoff"), pod, now)
            return logic.decide(image, pod, wanted, backoff, now)

        decision = decide(pod)
        where = f"[{namespace}/{name}]"

        if decision.action is logic.Action.CREATE:
            try:
                created: dict[str, Any] | None = await self.access.create(k8s.POD, logic.build_pod(ic))
            except k8s.AlreadyExists:
                created = None
            except ApiError as exc:
                if exc.namespace_terminating:  # the namespace (and this object with it) is going away
                    return logic.Decision(logic.Action.NONE, "NamespaceTerminating",
                                          f"namespace {namespace} is being deleted"), pod
                if logic.refuses_pod(exc.status, exc.message):  # the spec describes a pod the server refuses
                    return logic.Decision(logic.Action.INVALID, "InvalidTemplate",
                                          f"the API server refuses the pod: {exc.message or exc}"), pod
                metrics.error(OPERATOR, "create-pod")
                raise
            if created is None:
                # 409: a pod with that name exists. Ours not yet seen by the watch, or a foreign one:
                # the only read on this path, and only on a conflict.
                existing = await self.access.read(k8s.POD, namespace, logic.pod_name(name))
                pod = logic.observe_pod(existing, uid)
                if existing is not None and pod is not None and pod.owned:
                    # A foreign pod is not remembered: it is not watched, so the next pass tries again.
                    self._saw_pod((namespace, name), existing)
                return decide(pod), pod
            self._saw_pod((namespace, name), created)
            self.access.keep_answer(created)  # its ADDED event would run a pass that changes nothing
            if created.get("metadata", {}).get("uid"):
                self._uncounted.setdefault((namespace, name), set()).add(created["metadata"]["uid"])
            pod = logic.observe_pod(created, uid)
            metrics.action(OPERATOR, "create-pod")
            logger.info(f"{where} Created pod {pod.name if pod else ''} running {image}")
            self.access.event(ic, "Normal", "PodCreated", f"created pod {logic.pod_name(name)} running {image}")
            return decide(pod), pod

        if decision.action is logic.Action.DELETE and pod is not None and not pod.ended:
            # Never remove a working pod before its replacement is known to be acceptable.
            refusal = await self._refusal(ic, pod, wanted, trigger)
            if refusal is not None:
                return refusal, pod

        if decision.action is logic.Action.DELETE and pod is not None:
            # The uid precondition: never delete a pod that replaced ours meanwhile. A pod that has
            # already ended has nothing to shut down gracefully.
            await self.access.delete(k8s.POD, namespace, pod.name, uid=pod.uid, grace_seconds=0 if pod.ended else None)
            metrics.action(OPERATOR, "delete-pod")
            logger.info(f"{where} Deleting pod {pod.name}: {decision.message}")
            self.access.event(ic, "Normal", decision.reason, decision.message)
        return decision, pod

    async def _refusal(self, ic: Mapping[str, Any], pod: logic.PodView, wanted: str, trigger: str
                       ) -> logic.Decision | None:
        """A server-side dry run of the replacement (validation and admission, nothing stored): the
        refusal to report while our pod keeps running, or None when the replacement is acceptable (a
        409 too: validation and admission come before the name check). A spec already refused is not
        asked about again until the spec changes, except by the periodic sweep (admission can change:
        a ServiceAccount created, a namespace's Pod Security level relaxed)."""
        key = (ic["metadata"]["namespace"], ic["metadata"]["name"])
        known = self._refused.get(key)
        if known is not None and known[0] == wanted and trigger != "resync":
            return logic.refused(pod, known[1])
        try:
            await self.access.create(k8s.POD, logic.build_pod(ic), dry_run=True)
        except k8s.AlreadyExists:
            pass  # acceptable: validation and admission come before the name check
        except ApiError as exc:
            if logic.refuses_pod(exc.status, exc.message):
                message = exc.message or str(exc)
                self._refused[key] = (wanted, message)
                return logic.refused(pod, message)
            if not exc.namespace_terminating:
                raise
        self._refused.pop(key, None)
        return None

    async def _write_status(self, key: Key, ic: dict[str, Any], pod: logic.PodView | None,
                            decision: logic.Decision, now: float) -> None:
        """Patch status only when it changes, with optimistic concurrency. A 409: the newer version
        is on its way through the watch, and its event recomputes everything from it."""
        meta = ic["metadata"]
        old = ic.get("status") or {}
        backoff = logic.observe_end(old.get("backoff"), pod, now)
        uncounted = self._uncounted.get(key, set())
        new = logic.next_status(old, meta.get("generation"), pod, decision, backoff=backoff, created=uncounted)
        if not logic.status_changed(old, new):
            self._uncounted.pop(key, None)  # nothing missed: each is the counted pod
            return
        try:
            answer = await self.access.patch_status(IMMORTAL, meta["namespace"], meta["name"], new,
                                                    resource_version=meta.get("resourceVersion"))
        except k8s.Conflict:
            logger.debug(f"[{key[0]}/{key[1]}] status conflict: the newer version's event recomputes it")
            return
        self._uncounted.pop(key, None)  # every pod we created so far is counted now
        if answer is None:
            return  # deleted meanwhile
        self._written[key] = logic.snapshot(answer)
        # This pass has acted on that version: the watch's echo of it would run a pass that does nothing.
        self.access.keep_answer(answer)
        if new["startTimes"] != old.get("startTimes"):
            logger.info(f"[{key[0]}/{key[1]}] Counted start #{new['startTimes']} "
                        f"(pod uid {new.get('currentPodUID')})")
        stalled = stall_event(old.get("conditions"), new["conditions"])
        if stalled:  # one uniform Event per Stalled transition, for every kind (docs/observability.md)
            self.access.event(ic, *stalled)
        blocked = decision.action in (logic.Action.BLOCKED, logic.Action.INVALID, logic.Action.REFUSED)
        if blocked and logic.ready_reason(old) != decision.reason:
            kind = {logic.Action.BLOCKED: "foreign-pod", logic.Action.INVALID: "invalid-template",
                    logic.Action.REFUSED: "template-refused"}[decision.action]
            metrics.error(OPERATOR, kind)
            logger.warning(f"[{key[0]}/{key[1]}] {decision.message}")  # once per episode, not per retry
            self.access.event(ic, "Warning", decision.reason, decision.message)
        if backoff.get("delaySeconds") and backoff.get("podUID") != (old.get("backoff") or {}).get("podUID"):
            # One Event per end that waits (an end replaced at once gets PodEnded when deleted).
            metrics.action(OPERATOR, "backoff")
            message = (f"{backoff['lastEnd']}; replacing it in {backoff['delaySeconds']} s, at "
                       f"{backoff['nextAttempt']} (end #{backoff['failures']} in a row)")
            logger.info(f"[{key[0]}/{key[1]}] {message}")
            self.access.event(ic, "Warning", "BackOff", message)

    @staticmethod
    def _transient(ic: Mapping[str, Any], pod: logic.PodView | None, decision: logic.Decision, trigger: str) -> bool:
        status = ic.get("status") or {}
        return (decision.action is logic.Action.WAIT and trigger != "settle" and pod is not None
                and pod.uid == status.get("currentPodUID") and logic.ready_reason(status) != decision.reason)

    @staticmethod
    def _starting(ic: Mapping[str, Any], pod: logic.PodView | None, decision: logic.Decision, trigger: str) -> bool:
        """An uncounted pod of ours that has not started yet (usually the one this pass created)."""
        status = ic.get("status") or {}
        return (decision.reason == "PodStarting" and trigger != "settle" and pod is not None and pod.owned
                and pod.uid != status.get("currentPodUID"))

    def _settle_later(self, key: Key) -> None:
        self._settling.start(key, TRANSIENT_SECONDS, lambda: self.guarded(key, "settle"))

    def _retry_later(self, key: Key) -> None:
        """Look again later, with backoff: a foreign pod in the way is not watched, and a failed pass
        outside Kopf's handlers is not retried by Kopf."""
        if not self._retries.pending(key):
            self._retries.start(key, self._backoff.next_delay(key), lambda: self.guarded(key, "retry"))

    def _wake_later(self, key: Key, delay: float) -> None:
        """Converge again when a crash backoff is over (the replacement is due)."""
        self._wakes.start(key, max(0.05, delay), lambda: self.guarded(key, "backoff"), if_pending="replace")

    async def guarded(self, key: Key, trigger: str, pod_event: tuple[str, Mapping[str, Any]] | None = None,
                      body: Mapping[str, Any] | None = None) -> None:
        """A pass from an event, a retry or the resync (Kopf retries none of them): a failure is logged
        and retried later with backoff. Nothing while Kopf has paused this process (a standby)."""
        if self.access.paused:
            return
        try:
            await self.converge(key, body, trigger=trigger, pod_event=pod_event)
        except ApiError as exc:
            metrics.error(OPERATOR, "api")
            logger.warning(f"[{key[0]}/{key[1]}] {trigger}: {exc}; retrying with backoff")
            self._retry_later(key)

    # --- the periodic sweep --------------------------------------------------------------------------

    def start_resync(self) -> None:
        self.background.resync(RESYNC_SECONDS, self._resync, paused=lambda: self.access.paused,
                               until_acting=self.access.until_acting)

    async def _resync(self) -> None:
        for key in list(self.objects):
            await self.guarded(key, "resync")

    async def stop(self) -> None:
        await self.background.stop()


# The controller in Kopf's memo, typed: operators/immortal.py reaches it as ``CONTROLLER(memo)``.
CONTROLLER = MemoSlot("immortal", ImmortalController)
