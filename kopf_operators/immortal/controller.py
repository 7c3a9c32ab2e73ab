"""Immortal containers: the controller (state from watches, decisions in ``decisions``, API via ``core.access``).

State comes from two Kopf indexes, never from a read per event:
- ``immortal-objects``: each ImmortalContainer's spec, uid, generation, resourceVersion and status;
- ``immortal-pods``: each of our pods (the pod watch is label-selected server-side, so unrelated pods
  never reach the process), reduced to a ``PodView``.

A pass is observe (the object, the newest pod, the pod the spec asks for) -> decide (one call to
``decisions.decide_pass``, pure) -> act (a create or delete, then the status write or the settle timer).
A pod event costs one write (create or delete) and at most one status patch: a pod we create is
counted in the same status write that reports it Running, unless it takes longer than
``decisions.TRANSIENT_SECONDS`` to start (then it is reported as starting, and again when it runs). A pod we
created that is deleted before that write is remembered and counted in the next one. A pod that
we do not own but has the target name is not in the label-selected watch: the create answers 409,
only then is the pod read once, and from the version read a watch of that one name (a field selector:
the API server sends nothing of any other pod) follows it until it goes; its DELETED event starts
our pod at once. The capped doubling retry is only the fallback: for more foreign pods at once than
``access.WATCH_CONNECTIONS``, and when such a watch fails.
The status patch carries the newest resourceVersion known (the index, or the answer to our own last
patch, kept in a ``Newest``), so a start is never counted twice. A 409 means a newer version exists:
its watch event runs the next pass, so nothing is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import WATCH_CONNECTIONS, Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.background import Background
from kopf_operators.core.controller import DONE, RETRY, WAITING, GuardedPass, PassSettings, Result
from kopf_operators.core.conventions import stall_event
from kopf_operators.core.state import Index, KeyedState, MemoSlot, Newest, PerKey, first, version_of
from kopf_operators.immortal import decisions

OPERATOR = "immortal"
OBJECTS_INDEX = "immortal-objects"
PODS_INDEX = "immortal-pods"
IMMORTAL = k8s.Kind(decisions.API_VERSION, decisions.PLURAL, decisions.KIND)
# Level-triggered sweep over the indexes (no requests unless something must change), with jitter.
RESYNC_SECONDS = 300.0
# A failed pass, or a foreign pod in the way that no watch follows: look again after this long (doubling, capped).
RETRY_SECONDS = (1.0, 300.0)

logger = logging.getLogger("kopf_operators.immortal")
Key = tuple[str, str]  # (namespace, ImmortalContainer name), in both indexes
Snapshot = Mapping[str, Any]  # an ImmortalContainer or pod reduced to what the controller reads
PodEvent = tuple[str, Mapping[str, Any]]  # (type, pod summary) of a pod event


def _version(body: Mapping[str, Any]) -> int:
    return version_of((body.get("metadata") or {}).get("resourceVersion"))


def _where(key: Key) -> str:
    return f"[{key[0]}/{key[1]}]"


class ImmortalController:
    def __init__(self, access: Access, objects: Index[Key, Snapshot], pods: Index[Key, Snapshot]) -> None:
        self.access = access
        self.objects = objects  # Kopf's live index: (namespace, name) -> decisions.snapshot(body)
        self.pods = pods        # Kopf's live index: (namespace, ic name) -> decisions.pod_summary(pod)
        self.background = Background(OPERATOR)
        # Everything kept per ImmortalContainer, dropped by one ``state.forget(key)``.
        self.state: KeyedState[Key] = KeyedState()
        # The answers to our own status patches: newer than the index until the object's next event
        # (the echo of the patch itself is not processed, so the index keeps the version before it).
        self.answers: Newest[Key, Snapshot] = self.state.track(
            Newest(_version, lambda ic: ic["metadata"]["uid"]))
        # The newest pod with the target name (None: deleted at that version): see ``_pod``.
        self.pod_reports: Newest[Key, dict[str, Any]] = self.state.track(Newest(_version, lambda pod: None))
        self._refused: PerKey[Key, tuple[str, str]] = self.state.map()  # a spec the server refused: (digest, why)
        # Pods this process created that no status write has counted yet: one deleted before the write
        # that would count it (before it ran) is still a start, counted in the next write.
        self._uncounted: PerKey[Key, set[str]] = self.state.map()
        self._wanted: PerKey[Key, tuple[tuple[str, int | None], decisions.Wanted]] = self.state.map()  # see _want
        # A pass outside Kopf's handlers: skipped on a standby, a failure retried with backoff; also
        # the fallback retry for a foreign pod in the way that no watch follows.
        self.passes: GuardedPass[Key] = self.state.track(GuardedPass(self.background, self._pass, PassSettings(
            OPERATOR, say=self._say, paused=lambda: self.access.paused, retry=RETRY_SECONDS)))
        self._wakes = self.state.track(self.background.timers())  # crash backoff: the replacement's wake-up
        self._settling = self.state.track(self.background.timers())  # a pod going away: report it if it lasts
        # A foreign pod in the way: (uid, resourceVersion) as read after a 409, and the watch following it.
        self._foreign: PerKey[Key, tuple[str, str]] = self.state.map()
        self._followers: dict[Key, asyncio.Task[Any]] = {}
        self.state.on_forget(self._unfollow)

    # --- state -------------------------------------------------------------------------------------

    def current(self, key: Key) -> dict[str, Any] | None:
        """The newest known ImmortalContainer (None when gone or being deleted)."""
        ic = self.answers.current(key, first(self.objects, key))
        if ic is None or ic["metadata"].get("deletionTimestamp"):
            return None
        return dict(ic)

    def forget(self, key: Key) -> None:
        self.state.forget(key)

    def _pod(self, key: Key, ic: Mapping[str, Any], pod_event: PodEvent | None) -> decisions.PodView | None:
        """The newest pod with the target name. Kopf handles each pod (uid) on its own, so an event of
        a replaced pod can arrive after its successor's: the newest resourceVersion wins, and a
        deletion is remembered (as "gone at that version") so that no older event brings it back."""
        for indexed in self.pods.get(key) or ():
            self.pod_reports.saw(key, dict(indexed), _version(indexed))
        if pod_event is not None:
            event_type, event_pod = pod_event
            self.pod_reports.saw(key, None if event_type == "DELETED" else dict(event_pod), _version(event_pod))
        return decisions.observe_pod(self.pod_reports.seen(key), ic["metadata"]["uid"])

    def _saw_pod(self, key: Key, pod: Mapping[str, Any]) -> None:
        """Our own create's answer (or the read after a 409): newer than anything the watch has delivered."""
        self.pod_reports.saw(key, decisions.pod_summary(pod), _version(pod))

    def _want(self, key: Key, ic: Mapping[str, Any]) -> decisions.Wanted:
        """The pod the spec asks for, built once per spec (uid and generation): every pass compares its
        digest with the pod's, and building the template was a tenth of a pass."""
        meta = ic["metadata"]
        version = (meta["uid"], meta.get("generation"))
        known = self._wanted.get(key)
        if known is None or known[0] != version:
            known = self._wanted[key] = (version, decisions.wanted(ic))
        return known[1]

    # --- triggers ----------------------------------------------------------------------------------

    async def deleted(self, key: Key) -> None:
        """The ImmortalContainer is gone (its pod goes by garbage collection): drop what we kept."""
        async with self.access.serialised(key):
            self.forget(key)

    async def guarded(self, key: Key, trigger: str, pod_event: PodEvent | None = None,
                      body: Mapping[str, Any] | None = None) -> None:
        """A pass from an event, a retry or the resync (Kopf retries none of them): a failure is logged
        and retried later with backoff. Nothing while Kopf has paused this process (a standby)."""
        await self.passes(key, trigger, pod_event, body)

    def _say(self, key: Key, trigger: str, exc: Exception, delay: float | None) -> str:
        logger.warning(f"{_where(key)} {trigger}: {exc}; retrying with backoff")
        return ""  # said here, in this operator's logger

    async def _pass(self, key: Key, trigger: str, pod_event: PodEvent | None = None,
                    body: Mapping[str, Any] | None = None) -> Result:
        """One pass, then what comes after it: a watch of a foreign pod in the way (``WAITING``: its
        deletion runs the next pass), a retry (``RETRY``), or the crash backoff's wake-up (a timer of its
        own: the pod's backoff, not the pass's)."""
        decision = await self.converge(key, body, trigger=trigger, pod_event=pod_event)
        if decision is None:
            return DONE
        if decision.action is decisions.Action.BLOCKED:
            return WAITING if self._follow_foreign(key) else RETRY
        if decision.action is decisions.Action.CREATE:
            return RETRY  # a 409, and the pod in the way was gone when read: create again soon
        self._unfollow(key)
        if decision.action is decisions.Action.BACKOFF:
            self._wake_later(key, decision.retry_in)
        return DONE

    async def converge(self, key: Key, body: Mapping[str, Any] | None = None, *, trigger: str = "object",
                       pod_event: PodEvent | None = None) -> decisions.Decision | None:
        """One level-triggered pass for one ImmortalContainer: observe -> decide -> act. ``body``: the
        object as its event delivered it; ``pod_event``: (type, pod) of a pod event. Both are fresher
        than the indexes."""
        async with self.access.serialised(key):
            ic = self.current(key)
            # An event's body is newer than the index only at a higher version (a late event of a
            # replaced object, with another uid, is not).
            if body is not None and (ic is None or _version(body) > _version(ic)):
                ic = None if body["metadata"].get("deletionTimestamp") else dict(body)
            if ic is None:
                self.forget(key)
                return None
            now = time.time()
            with metrics.reaction(OPERATOR, trigger):
                want = self._want(key, ic)
                step = decisions.decide_pass(ic.get("status") or {}, self._pod(key, ic, pod_event), want, now, trigger)
                step = await self._act(key, ic, want, step, now, trigger)
                if step.settle:
                    self._settling.start(key, decisions.TRANSIENT_SECONDS, lambda: self.guarded(key, "settle"))
                else:
                    await self._write_status(key, ic, step)
            return step.decision

    # --- act ---------------------------------------------------------------------------------------

    async def _act(self, key: Key, ic: Mapping[str, Any], want: decisions.Wanted, step: decisions.Step, now: float,
                   trigger: str) -> decisions.Step:
        """Carry out the step's create or delete. A create's answer (or the pod read after a 409) is a
        new observation: the step for it is decided then."""
        decision, pod = step.decision, step.pod
        if decision.action is decisions.Action.CREATE:
            observed = await self._create(key, ic, want)
            if isinstance(observed, decisions.Decision):
                return step.instead(observed)
            return decisions.decide_pass(ic.get("status") or {}, observed, want, now, trigger)
        if decision.action is decisions.Action.DELETE and pod is not None and not pod.ended:
            # Never remove a working pod before its replacement is known to be acceptable.
            refusal = await self._refusal(key, want, pod, trigger)
            if refusal is not None:
                return step.instead(refusal)
        if decision.action is decisions.Action.DELETE and pod is not None:
            # The uid precondition: never delete a pod that replaced ours meanwhile. A pod that has
            # already ended has nothing to shut down gracefully.
            await self.access.delete(k8s.POD, key[0], pod.name, uid=pod.uid, grace_seconds=0 if pod.ended else None)
            metrics.action(OPERATOR, "delete-pod")
            logger.info(f"{_where(key)} Deleting pod {pod.name}: {decision.message}")
            self.access.event(ic, "Normal", decision.reason, decision.message)
        return step

    async def _create(self, key: Key, ic: Mapping[str, Any], want: decisions.Wanted
                      ) -> decisions.PodView | decisions.Decision | None:
        """Create the pod: the pod there is now (ours, or the one in the way after a 409), or the
        decision the API server's refusal calls for."""
        namespace, name = key
        uid = ic["metadata"]["uid"]
        try:
            created: dict[str, Any] | None = await self.access.create(k8s.POD, want.pod)
        except k8s.AlreadyExists:
            created = None
        except ApiError as exc:
            if exc.namespace_terminating:  # the namespace (and this object with it) is going away
                return decisions.Decision(decisions.Action.NONE, "NamespaceTerminating",
                                          f"namespace {namespace} is being deleted")
            if decisions.refuses_pod(exc.status, exc.message):  # the spec describes a pod the server refuses
                return decisions.Decision(decisions.Action.INVALID, "InvalidTemplate",
                                          f"the API server refuses the pod: {exc.message or exc}")
            metrics.error(OPERATOR, "create-pod")
            raise
        if created is None:
            # 409: a pod with that name exists. Ours not yet seen by the watch, or a foreign one:
            # the only read on this path, and only on a conflict.
            existing = await self.access.read(k8s.POD, namespace, decisions.pod_name(name))
            pod = decisions.observe_pod(existing, uid)
            if existing is not None and pod is not None and pod.owned:
                self._saw_pod(key, existing)
            elif existing is not None and pod is not None:
                # A foreign pod: followed from this version by a watch of its name (``_follow_foreign``).
                self._foreign[key] = (pod.uid, str(existing["metadata"].get("resourceVersion") or ""))
            return pod
        self._saw_pod(key, created)
        self.access.keep_answer(created)  # its ADDED event would run a pass that changes nothing
        if created.get("metadata", {}).get("uid"):
            self._uncounted.setdefault(key, set()).add(created["metadata"]["uid"])
        pod = decisions.observe_pod(created, uid)
        metrics.action(OPERATOR, "create-pod")
        logger.info(f"{_where(key)} Created pod {pod.name if pod else ''} running {want.image}")
        self.access.event(ic, "Normal", "PodCreated", f"created pod {decisions.pod_name(name)} running {want.image}")
        return pod

    async def _refusal(self, key: Key, want: decisions.Wanted, pod: decisions.PodView,
                       trigger: str) -> decisions.Decision | None:
        """A server-side dry run of the replacement (validation and admission, nothing stored): the
        refusal to report while our pod keeps running, or None when the replacement is acceptable (a
        409 too: validation and admission come before the name check). A spec already refused is not
        asked about again until the spec changes, except by the periodic sweep (admission can change:
        a ServiceAccount created, a namespace's Pod Security level relaxed)."""
        known = self._refused.get(key)
        if known is not None and known[0] == want.hash and trigger != "resync":
            return decisions.refused(pod, known[1])
        try:
            await self.access.create(k8s.POD, want.pod, dry_run=True)
        except k8s.AlreadyExists:
            pass  # acceptable: validation and admission come before the name check
        except ApiError as exc:
            if decisions.refuses_pod(exc.status, exc.message):
                message = exc.message or str(exc)
                self._refused[key] = (want.hash, message)
                return decisions.refused(pod, message)
            if not exc.namespace_terminating:
                raise
        self._refused.pop(key, None)
        return None

    async def _write_status(self, key: Key, ic: dict[str, Any], step: decisions.Step) -> None:
        """Patch status only when it changes, with optimistic concurrency. A 409: the newer version
        is on its way through the watch, and its event recomputes everything from it."""
        meta = ic["metadata"]
        old = ic.get("status") or {}
        decision, backoff = step.decision, step.backoff
        uncounted = self._uncounted.get(key, set())
        new = decisions.next_status(old, meta.get("generation"), step.pod, decision, backoff=backoff, created=uncounted)
        if not decisions.status_changed(old, new):
            self._uncounted.pop(key, None)  # nothing missed: each is the counted pod
            return
        try:
            answer = await self.access.patch_status(IMMORTAL, meta["namespace"], meta["name"], new,
                                                    resource_version=meta.get("resourceVersion"))
        except k8s.Conflict:
            logger.debug(f"{_where(key)} status conflict: the newer version's event recomputes it")
            return
        self._uncounted.pop(key, None)  # every pod we created so far is counted now
        if answer is None:
            return  # deleted meanwhile
        self.answers.remember(key, decisions.snapshot(answer))
        # This pass has acted on that version: the watch's echo of it would run a pass that does nothing.
        self.access.keep_answer(answer)
        if new["startTimes"] != old.get("startTimes"):
            logger.info(f"{_where(key)} Counted start #{new['startTimes']} (pod uid {new.get('currentPodUID')})")
        stalled = stall_event(old.get("conditions"), new["conditions"])
        if stalled:  # one uniform Event per Stalled transition, for every kind (docs/observability.md)
            self.access.event(ic, *stalled)
        blocked = decision.action in (decisions.Action.BLOCKED, decisions.Action.INVALID, decisions.Action.REFUSED)
        if blocked and decisions.ready_reason(old) != decision.reason:
            kind = {decisions.Action.BLOCKED: "foreign-pod", decisions.Action.INVALID: "invalid-template",
                    decisions.Action.REFUSED: "template-refused"}[decision.action]
            metrics.error(OPERATOR, kind)
            logger.warning(f"{_where(key)} {decision.message}")  # once per episode, not per retry
            self.access.event(ic, "Warning", decision.reason, decision.message)
        if backoff.get("delaySeconds") and backoff.get("podUID") != (old.get("backoff") or {}).get("podUID"):
            # One Event per end that waits (an end replaced at once gets PodEnded when deleted).
            metrics.action(OPERATOR, "backoff")
            message = (f"{backoff['lastEnd']}; replacing it in {backoff['delaySeconds']} s, at "
                       f"{backoff['nextAttempt']} (end #{backoff['failures']} in a row)")
            logger.info(f"{_where(key)} {message}")
            self.access.event(ic, "Warning", "BackOff", message)

    # --- what follows a pass -----------------------------------------------------------------------

    def _follow_foreign(self, key: Key) -> bool:
        """Follow the foreign pod in the way (read after a 409) with a watch of its name alone, so that
        its deletion starts our pod at once. False: without a version to start from (a foreign pod
        wearing our label, which the pods watch sees anyway) or past the cap, the capped retry looks
        again."""
        seen = self._foreign.pop(key, None)
        follower = self._followers.get(key)
        if follower is not None and not follower.done():
            return True
        if seen is None or len(self._followers) >= WATCH_CONNECTIONS:
            return False
        self._followers[key] = self.background.spawn(self._follow(key, *seen), name=f"immortal follow {key}")
        return True

    def _unfollow(self, key: Key) -> None:
        follower = self._followers.pop(key, None)
        if follower is not None:
            follower.cancel()

    async def _follow(self, key: Key, uid: str, version: str) -> None:
        """Watch the pod name from ``version`` (resuming when the server ends the watch) until the
        foreign pod (``uid``) is gone or replaced, then run a pass. A failed watch falls back to the
        capped retry (so a watch refused or broken again and again is never retried hot)."""
        gone = False
        try:
            while not gone:
                started = time.monotonic()
                events = self.access.watch(k8s.POD, key[0], fields=f"metadata.name={decisions.pod_name(key[1])}",
                                           resource_version=version)
                async with contextlib.aclosing(events):
                    async for event_type, pod in events:
                        meta = pod.get("metadata") or {}
                        version = str(meta.get("resourceVersion") or version)
                        if event_type == "DELETED" or (event_type != "BOOKMARK" and meta.get("uid") != uid):
                            gone = True
                            break
                if not gone and time.monotonic() - started < 1.0:  # ended at once: not a healthy watch
                    raise ApiError(None, "watch ended at once")
        except ApiError as exc:
            logger.debug(f"{_where(key)} the watch of the foreign pod ended: {exc}; looking again later")
        finally:
            if self._followers.get(key) is asyncio.current_task():
                del self._followers[key]
        if gone:
            await self.guarded(key, "foreign pod deleted")
        else:
            self.passes.retry_later(key)

    def _wake_later(self, key: Key, delay: float) -> None:
        """Converge again when a crash backoff is over (the replacement is due)."""
        self._wakes.start(key, max(0.05, delay), lambda: self.guarded(key, "backoff"), if_pending="replace")

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
