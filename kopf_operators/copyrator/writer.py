"""Copyrator: the copy writer. The unit of work is one copy, (kind, namespace, name) for one rule:
``sync_copy`` observes the place, asks ``copies.decide`` and makes at most one write (create, JSON
patch, delete; a Secret type change or an immutable copy is delete + create). A rule's sweep observes
its places and decides them all in one call (``decide``, then ``copies.decide_sweep``); each write is
then made under its place's lock, as decided while the place still looks the same, else decided again.
A foreign object in the way is learned from the 409 on create (then that one object is read).

The writer changes nobody's state: each pass returns its ``Outcome`` (the answers to our writes, an
object in the way, a failure or a refusal), and the controller hands it to ``Places`` and the status
reporter as soon as the pass ends, before the next pass at that place takes its lock (so a burst never
writes twice)."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.copyrator import copies, rules
from kopf_operators.copyrator.claims import Claims
from kopf_operators.copyrator.places import CopyKey, Outcome, Places, Result, Seen
from kopf_operators.copyrator.sources import KINDS, Sources
from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.conventions import COPY_SOURCE
from kopf_operators.core.state import first

OPERATOR = "copyrator"

logger = logging.getLogger("kopf_operators.copyrator")


@dataclasses.dataclass
class _Trail:
    """What one pass at one place has learned and counted so far (the pass's own, made into its ``Outcome``)."""

    seen: list[Seen] = dataclasses.field(default_factory=list)
    counted: list[str] = dataclasses.field(default_factory=list)
    foreign: str | None = None

    def outcome(self, rule_uid: str, key: CopyKey, result: Result, writes: int = 0, refusal: str = "",
                error: ApiError | None = None) -> Outcome:
        return Outcome(rule_uid, key, result, writes, tuple(self.seen), tuple(self.counted), self.foreign,
                       refusal, error)


class CopyWriter:
    """Makes each place hold what a rule wants there, one write at a time."""

    def __init__(self, access: Access, options: rules.Options, sources: Sources, places: Places,
                 claims: Claims) -> None:
        self.access, self.options = access, options
        self.sources, self.places, self.claims = sources, places, claims
        self.inflight: collections.Counter[str] = collections.Counter()  # rule uid -> syncs running
        self._limit = asyncio.Semaphore(options.write_concurrency)

    def observe(self, rule: rules.Rule, key: CopyKey, desired: Mapping[str, Any] | None = None,
                known: bool = False, ours: Seen | None = None) -> copies.Place:
        """One place of ``rule`` as the indexes (and our own writes' answers) show it now; ``known``:
        what the rule wants there is ``desired`` (already worked out); ``ours``: what this pass has just
        learned there itself."""
        kind, namespace, name = key
        if not known:
            ns = self.sources.namespace(namespace)
            if ns is None or not ns.active:
                return copies.Place(key, gone=True)  # gone or terminating: its copies go with it
            desired, blocked = self.claims.desired(rule, name, ns) if kind == rule.kind else (None, False)
            if blocked:
                return copies.Place(key, blocked=True)  # reported in status; what is there stays
        view = self.places.copy(kind, namespace, name, ours)
        claimed = view is None and desired is not None and \
            self.claims.claimed(rule, kind, namespace, name) is not None
        keep = desired is None and view is not None and view.rule_uid == rule.uid and kind == rule.kind \
            and self.claims.superseded_pending(rule, view)
        return copies.Place(key, desired, view, foreign=key in self.places.foreign, claimed=claimed, keep=keep)

    def decide(self, rule: rules.Rule, keys: Iterable[CopyKey]) -> copies.Sweep:
        """A sweep's places observed and decided in one call."""
        return copies.decide_sweep(rule.uid, [self.observe(rule, key) for key in keys])

    async def sync_copy(self, rule: rules.Rule, namespace: str, name: str, kind: str | None = None,
                        planned: tuple[copies.Place, copies.Action] | None = None) -> Outcome:
        """Make one place hold what ``rule`` wants there. ``planned``: the write a sweep decided on, made
        as decided while the place still looks as it did then."""
        kind = kind or rule.kind
        key: CopyKey = (kind, namespace, name)
        if kind == rule.kind and (unread := self.claims.unread(rule, name, namespace)) is not None:
            await self.sources.hydrate(kind, unread)  # a target accepts it now: its data, read once
        async with self._limit, self.access.serialised(("copyrator", *key)):
            if rule.uid in self.sources.deleting:
                return Outcome(rule.uid, key)
            self.inflight[rule.uid] += 1
            try:
                return await self._sync_locked(rule, key, planned)
            finally:
                self.inflight[rule.uid] -= 1
                if not self.inflight[rule.uid]:
                    del self.inflight[rule.uid]

    async def _sync_locked(self, rule: rules.Rule, key: CopyKey,
                           planned: tuple[copies.Place, copies.Action] | None) -> Outcome:
        """(The place's lock is held: observe it again, since another pass may have written there.)"""
        place = self.observe(rule, key)
        if place.gone:
            return Outcome(rule.uid, key, Result.DONE)
        if place.blocked:
            return Outcome(rule.uid, key)
        action = planned[1] if planned is not None and planned[0] == place else place.action(rule.uid)
        trail = _Trail()
        try:
            writes = await self._act(rule, place, action, trail)
        except ApiError as exc:
            if exc.namespace_terminating:
                return trail.outcome(rule.uid, key, Result.UNCHANGED)
            if exc.status in (400, 422):
                return self._reject(rule, key, exc, trail)
            metrics.error(OPERATOR, "write")
            return trail.outcome(rule.uid, key, Result.FAILED, error=exc)
        return trail.outcome(rule.uid, key, Result.DONE, writes)

    def _reject(self, rule: rules.Rule, key: CopyKey, exc: ApiError, trail: _Trail) -> Outcome:
        """A copy the API server refuses: reported (status, one log line and Event when it starts),
        not retried with backoff. The message is the server's field-level reason (never values)."""
        kind, namespace, name = key
        # The server's reason names fields, not values; still, for a Secret only the status is kept.
        detail = f" ({exc.message})" if exc.message and kind == "ConfigMap" else ""
        why = f"{kind} {namespace}/{name}: {exc}{detail}"
        if self.places.refusal(rule.uid, key) == why:
            return trail.outcome(rule.uid, key, Result.UNCHANGED)
        metrics.error(OPERATOR, "copy-refused")
        logger.warning(f"Copyrator {rule.key}: the API server refuses the copy {why}")
        # a push: on its source
        snapshot = None if rule.push else first(self.sources.rules, (rule.namespace, rule.name))
        if snapshot is not None:
            self.access.event(snapshot, "Warning", "CopyRefused", f"the API server refuses the copy {why}")
        return trail.outcome(rule.uid, key, Result.REFUSED, refusal=why)

    async def _apply(self, rule: rules.Rule, key: CopyKey, desired: Mapping[str, Any] | None,
                     trail: _Trail) -> int:
        """Again after a write that found the place changed: observe it (wanting ``desired``, over what
        this pass has learned there), decide, act."""
        place = self.observe(rule, key, desired, known=True, ours=trail.seen[-1])
        return await self._act(rule, place, place.action(rule.uid), trail)

    async def _act(self, rule: rules.Rule, place: copies.Place, action: copies.Action, trail: _Trail) -> int:
        """The write ``action`` at ``place`` (as observed); the number of writes made."""
        key, desired, view = place.key, place.desired, place.view
        kind, namespace, name = key
        api_kind = KINDS[kind]
        where = f"Copyrator {rule.key}:"
        if action is copies.Action.NONE or action is copies.Action.CONFLICT:
            return 0
        if action is copies.Action.DELETE and view is not None:
            await self.access.delete(api_kind, namespace, name, uid=view.uid)
            trail.seen.append(Seen(None, view.uid))
            self._count("deleted", trail)
            logger.info(f"{where} pruned {kind} {namespace}/{name}")
            return 1
        assert desired is not None
        source = desired["metadata"]["annotations"][COPY_SOURCE]
        recreate = action is copies.Action.RECREATE and view is not None
        if recreate or action is copies.Action.CREATE:
            if recreate and view is not None:
                await self.access.delete(api_kind, namespace, name, uid=view.uid)
                trail.seen.append(Seen(None, view.uid))
            try:
                created = await self.access.create(api_kind, desired)
            except k8s.AlreadyExists:
                return 1 + await self._in_the_way(rule, key, desired, trail)
            self._answered(created, kind, trail)
            if recreate:
                self._count("updated", trail)
                logger.info(f"{where} updated {kind} {namespace}/{name} (re-created: type or immutability)")
                return 2
            self._count("created", trail)
            logger.info(f"{where} copied {kind} {source} into {namespace}")
            return 1
        assert view is not None  # PATCH
        try:
            answer = await self.access.patch(api_kind, namespace, name, copies.patch_ops(view, desired),
                                             json_patch=True)
        except k8s.Conflict:
            # Changed since the index saw it (edited meanwhile): read that one object, try once more.
            fresh = await self.access.read(api_kind, namespace, name)
            if fresh is None:
                trail.seen.append(Seen(None, view.uid))
                return 1 + await self._apply(rule, key, desired, trail)
            fresh_view = copies.copy_view(fresh, kind)
            trail.seen.append(Seen(fresh_view))
            if copies.decide(rule.uid, desired, fresh_view) is not copies.Action.PATCH:
                return 1 + await self._apply(rule, key, desired, trail)
            answer = await self.access.patch(api_kind, namespace, name, copies.patch_ops(fresh_view, desired),
                                             json_patch=True)
        if answer is None:  # deleted meanwhile: create it
            trail.seen.append(Seen(None, view.uid))
            return 1 + await self._apply(rule, key, desired, trail)
        self._answered(answer, kind, trail)
        self._count("updated", trail)
        logger.info(f"{where} updated {kind} {namespace}/{name}" + (" (edited by hand)" if view.drifted else ""))
        return 1

    async def _in_the_way(self, rule: rules.Rule, key: CopyKey, desired: Mapping[str, Any], trail: _Trail) -> int:
        """A 409 on create: read that one object. Ours (the watch is behind): carry on from it;
        anybody else's: a conflict, left untouched."""
        kind, namespace, name = key
        existing = await self.access.read(KINDS[kind], namespace, name)
        if existing is None:  # gone again meanwhile: the next event or sweep creates the copy
            return 1
        if rules.is_copy(existing):
            view = copies.copy_view(existing, kind)
            trail.seen.append(Seen(view))
            if view.rule_uid == rule.uid:
                return 1 + await self._apply(rule, key, desired, trail)
            return 1
        trail.foreign = str(existing["metadata"].get("uid", ""))
        return 1

    def _answered(self, answer: Mapping[str, Any], kind: str, trail: _Trail) -> None:
        """Our write's answer: newer than the index until the watch catches up. Its echo is indexed once
        the writes in flight are done (``Access.defer_echo``): in a burst, writes come first."""
        trail.seen.append(Seen(copies.copy_view(answer, kind)))
        self.access.defer_echo(answer)

    @staticmethod
    def _count(what: str, trail: _Trail) -> None:
        metrics.action(OPERATOR, what)
        trail.counted.append(what)

    async def delete_copy(self, kind: str, view: copies.CopyView) -> Outcome:
        """Delete one copy (its uid a precondition), under its place's lock."""
        key: CopyKey = (kind, view.namespace, view.name)
        async with self.access.serialised(("copyrator", *key)):
            await self.access.delete(KINDS[kind], view.namespace, view.name, uid=view.uid)
        return Outcome(view.rule_uid, key, seen=(Seen(None, view.uid),))
