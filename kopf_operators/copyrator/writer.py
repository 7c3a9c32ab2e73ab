"""Copyrator: the copy writer. The unit of work is one copy, (kind, namespace, name) for one rule:
``sync_copy`` observes the place, asks ``copyrator.decide`` and makes at most one write (create, JSON
patch, delete; a Secret type change or an immutable copy is delete + create). A rule's ``sweep``
observes its places and decides them all in one call (``decide_sweep``); each write is then made
under its place's lock, as decided while the place still looks the same, else decided again. A
foreign object in the way is learned from the 409 on create (then that one object is read). The
answers to our own writes are kept (in ``Places.written``) until the watch catches up, so a burst
never writes twice."""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from kopf_operators.copyrator import decisions as logic
from kopf_operators.copyrator.claims import Claims
from kopf_operators.copyrator.places import CopyKey, Places
from kopf_operators.copyrator.sources import KINDS, Sources
from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.state import first

OPERATOR = "copyrator"

logger = logging.getLogger("kopf_operators.copyrator")


class CopyWriter:
    """Makes each place hold what a rule wants there, one write at a time."""

    def __init__(self, access: Access, options: logic.Options, sources: Sources, places: Places, claims: Claims,
                 touched: Callable[[str, str, str], None],
                 copied: Callable[[logic.Rule], set[tuple[str, str]]]) -> None:
        self.access, self.options = access, options
        self.sources, self.places, self.claims = sources, places, claims
        self.touched = touched  # a place changed: the ledgers judge it again
        self.copied = copied  # the places holding a rule's copy in sync, as its ledger sees them
        self.inflight: collections.Counter[str] = collections.Counter()  # rule uid -> syncs running
        self._limit = asyncio.Semaphore(options.write_concurrency)

    def observe(self, rule: logic.Rule, key: CopyKey, desired: Mapping[str, Any] | None = None,
                known: bool = False) -> logic.Place:
        """One place of ``rule`` as the indexes (and our own writes' answers) show it now; ``known``:
        what the rule wants there is ``desired`` (already worked out)."""
        kind, namespace, name = key
        if not known:
            ns = self.sources.namespace(namespace)
            if ns is None or not ns.active:
                return logic.Place(key, gone=True)  # gone or terminating: its copies go with it
            desired, blocked = self.claims.desired(rule, name, ns) if kind == rule.kind else (None, False)
            if blocked:
                return logic.Place(key, blocked=True)  # reported in status; what is there stays
        view = self.places.copy(kind, namespace, name)
        claimed = view is None and desired is not None and \
            self.claims.claimed(rule, kind, namespace, name) is not None
        keep = desired is None and view is not None and view.rule_uid == rule.uid and kind == rule.kind \
            and self.claims.superseded_pending(rule, view)
        return logic.Place(key, desired, view, foreign=key in self.places.foreign, claimed=claimed, keep=keep)

    async def sync_copy(self, rule: logic.Rule, namespace: str, name: str, kind: str | None = None,
                        planned: tuple[logic.Place, logic.Action] | None = None) -> int:
        """Make one place hold what ``rule`` wants there; returns the number of writes made. ``planned``:
        the write a sweep decided on, made as decided while the place still looks as it did then."""
        kind = kind or rule.kind
        key: CopyKey = (kind, namespace, name)
        if kind == rule.kind and (unread := self.claims.unread(rule, name, namespace)) is not None:
            await self.sources.hydrate(kind, unread)  # a target accepts it now: its data, read once
        async with self._limit, self.access.serialised(("copyrator", *key)):
            if rule.uid in self.sources.deleting:
                return 0
            self.inflight[rule.uid] += 1
            try:
                return await self._sync_locked(rule, key, planned)
            finally:
                self.inflight[rule.uid] -= 1
                if not self.inflight[rule.uid]:
                    del self.inflight[rule.uid]

    async def _sync_locked(self, rule: logic.Rule, key: CopyKey,
                           planned: tuple[logic.Place, logic.Action] | None) -> int:
        """(The place's lock is held: observe it again, since another pass may have written there.)"""
        place = self.observe(rule, key)
        if place.gone:
            self.places.settled(rule.uid, lambda failed: failed == key)
            return 0
        if place.blocked:
            return 0
        action = planned[1] if planned is not None and planned[0] == place else place.action(rule.uid)
        try:
            writes = await self._act(rule, place, action)
        except ApiError as exc:
            if exc.namespace_terminating:
                return 0
            if exc.status in (400, 422):
                self._reject(rule, key, exc)
                return 0
            self.places.failed.setdefault(rule.uid, set()).add(key)
            metrics.error(OPERATOR, "write")
            raise
        self.places.failed.get(rule.uid, set()).discard(key)
        self.places.rejected.get(rule.uid, {}).pop(key, None)
        return writes

    def _reject(self, rule: logic.Rule, key: CopyKey, exc: ApiError) -> None:
        """A copy the API server refuses: reported (status, one log line and Event when it starts),
        not retried with backoff. The message is the server's field-level reason (never values)."""
        kind, namespace, name = key
        # The server's reason names fields, not values; still, for a Secret only the status is kept.
        detail = f" ({exc.message})" if exc.message and kind == "ConfigMap" else ""
        why = f"{kind} {namespace}/{name}: {exc}{detail}"
        rejected = self.places.rejected.setdefault(rule.uid, {})
        if rejected.get(key) == why:
            return
        rejected[key] = why
        self.places.failed.get(rule.uid, set()).discard(key)
        metrics.error(OPERATOR, "copy-refused")
        logger.warning(f"Copyrator {rule.key}: the API server refuses the copy {why}")
        # a push: on its source
        snapshot = None if rule.push else first(self.sources.rules, (rule.namespace, rule.name))
        if snapshot is not None:
            self.access.event(snapshot, "Warning", "CopyRefused", f"the API server refuses the copy {why}")

    async def _apply(self, rule: logic.Rule, key: CopyKey, desired: Mapping[str, Any] | None) -> int:
        """Again after a write that found the place changed: observe it (wanting ``desired``), decide, act."""
        place = self.observe(rule, key, desired, known=True)
        return await self._act(rule, place, place.action(rule.uid))

    async def _act(self, rule: logic.Rule, place: logic.Place, action: logic.Action) -> int:
        """The write ``action`` at ``place`` (as observed)."""
        key, desired, view = place.key, place.desired, place.view
        kind, namespace, name = key
        api_kind = KINDS[kind]
        where = f"Copyrator {rule.key}:"
        if action is logic.Action.NONE or action is logic.Action.CONFLICT:
            return 0
        if action is logic.Action.DELETE and view is not None:
            await self.access.delete(api_kind, namespace, name, uid=view.uid)
            self._remember_gone(key, view.uid)
            self._count(rule, "deleted")
            logger.info(f"{where} pruned {kind} {namespace}/{name}")
            return 1
        assert desired is not None
        source = desired["metadata"]["annotations"][logic.SOURCE_ANNOTATION]
        recreate = action is logic.Action.RECREATE and view is not None
        if recreate or action is logic.Action.CREATE:
            if recreate and view is not None:
                await self.access.delete(api_kind, namespace, name, uid=view.uid)
                self._remember_gone(key, view.uid)
            try:
                created = await self.access.create(api_kind, desired)
            except k8s.AlreadyExists:
                return 1 + await self._in_the_way(rule, key, desired)
            self._remember(key, logic.copy_view(created, kind), created)
            if recreate:
                self._count(rule, "updated")
                logger.info(f"{where} updated {kind} {namespace}/{name} (re-created: type or immutability)")
                return 2
            self._count(rule, "created")
            logger.info(f"{where} copied {kind} {source} into {namespace}")
            return 1
        assert view is not None  # PATCH
        try:
            answer = await self.access.patch(api_kind, namespace, name, logic.patch_ops(view, desired),
                                             json_patch=True)
        except k8s.Conflict:
            # Changed since the index saw it (edited meanwhile): read that one object, try once more.
            fresh = await self.access.read(api_kind, namespace, name)
            if fresh is None:
                self._remember_gone(key, view.uid)
                return 1 + await self._apply(rule, key, desired)
            fresh_view = logic.copy_view(fresh, kind)
            self._remember(key, fresh_view)
            if logic.decide(rule.uid, desired, fresh_view) is not logic.Action.PATCH:
                return 1 + await self._apply(rule, key, desired)
            answer = await self.access.patch(api_kind, namespace, name, logic.patch_ops(fresh_view, desired),
                                              json_patch=True)
        if answer is None:  # deleted meanwhile: create it
            self._remember_gone(key, view.uid)
            return 1 + await self._apply(rule, key, desired)
        self._remember(key, logic.copy_view(answer, kind), answer)
        self._count(rule, "updated")
        logger.info(f"{where} updated {kind} {namespace}/{name}" + (" (edited by hand)" if view.drifted else ""))
        return 1

    async def _in_the_way(self, rule: logic.Rule, key: CopyKey, desired: Mapping[str, Any]) -> int:
        """A 409 on create: read that one object. Ours (the watch is behind): carry on from it;
        anybody else's: a conflict, left untouched."""
        kind, namespace, name = key
        existing = await self.access.read(KINDS[kind], namespace, name)
        if existing is None:  # gone again meanwhile: the next event or sweep creates the copy
            return 1
        if logic.is_copy(existing):
            view = logic.copy_view(existing, kind)
            self._remember(key, view)
            if view.rule_uid == rule.uid:
                return 1 + await self._apply(rule, key, desired)
            return 1
        self.places.foreign[key] = str(existing["metadata"].get("uid", ""))
        self.touched(*key)
        return 1

    def _remember(self, key: CopyKey, written: logic.CopyView, answer: Mapping[str, Any] | None = None) -> None:
        """Our write's answer, until the watch catches up (``Places.copy``). Its echo (``answer``) is
        indexed once the writes in flight are done (``Access.defer_echo``): in a burst, writes come first."""
        self.places.written.remember(key, written)
        self.touched(*key)
        if answer is not None:
            self.access.defer_echo(answer)

    def _remember_gone(self, key: CopyKey, uid: str) -> None:
        """We deleted the copy ``uid``: absent until the watch shows it gone (or replaced by another uid)."""
        self.places.written.remember_gone(key, uid)
        self.touched(*key)

    def _count(self, rule: logic.Rule, what: str) -> None:
        metrics.action(OPERATOR, what)
        self.places.done.setdefault(rule.uid, collections.Counter())[what] += 1

    async def bounded(self, jobs: Iterable[Awaitable[int]]) -> tuple[int, list[ApiError]]:
        """Independent copies at once (``sync_copy`` bounds how many write at a time)."""
        results = await asyncio.gather(*jobs, return_exceptions=True)
        errors = [r for r in results if isinstance(r, ApiError)]
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, ApiError):
                raise r
        return sum(r for r in results if isinstance(r, int)), errors

    async def sweep(self, rule: logic.Rule, trigger: str) -> list[ApiError]:
        """Every copy of one rule, from the indexes: writes only what differs. Its sources held without
        their data are read first when some target accepts the rule's copies now."""
        lean = [e for e in self.sources.selected(rule) if logic.is_lean(e) and not logic.too_large(e)]
        if lean and self.sources.accepted(rule):
            await asyncio.gather(*(self.sources.hydrate(rule.kind, entry) for entry in lean))
        targets = sorted(self.sources.targets(rule))
        wanted = self.sources.copy_names(rule)
        names = wanted | {v.name for v in self.places.copies_of(rule.uid, rule.kind)}
        visited: set[CopyKey] = set()
        # Places the ledger sees holding the rule's copy in sync: ``sync_copy`` would write nothing there
        # (an idle sweep of many copies then costs a count, not a pass per copy).
        copied = self.copied(rule)

        def jobs_for(selected: Iterable[str], others: Iterable[CopyKey] = ()) -> list[Awaitable[int]]:
            """Observe the places, decide them in one call, and the writes to make (each under its lock)."""
            keys: list[CopyKey] = []
            for name in sorted(selected):
                places = set(targets) | {v.namespace for v in self.places.copies_of(rule.uid, rule.kind, name=name)}
                visited.update((rule.kind, ns, name) for ns in places)
                keys.extend((rule.kind, ns, name) for ns in sorted(places) if (ns, name) not in copied)
            keys.extend(others)
            visited.update(others)
            decided = logic.decide_sweep(rule.uid, [self.observe(rule, key) for key in keys])
            done = set(decided.settled)  # nothing to write there, so nothing fails there either
            self.places.settled(rule.uid, lambda key: key in done)
            return [self.sync_copy(rule, place.key[1], place.key[2], kind=place.key[0], planned=(place, action))
                    for place, action in decided.writes]

        started = time.perf_counter()
        # First the names the rule wants, then the copies under names it no longer uses (a renamed
        # target): each of those goes only once its replacement is in sync.
        writes, errors = await self.bounded(jobs_for(wanted))
        # (Decided after the first round: whether an old copy stays depends on its replacement.)
        other_kinds = [(kind, view.namespace, view.name) for kind in KINDS if kind != rule.kind
                       for view in self.places.copies_of(rule.uid, kind)]  # the rule's type changed: they go
        more, more_errors = await self.bounded(jobs_for(names - wanted, other_kinds))
        # No longer places of the rule, or in sync: nothing fails there.
        self.places.settled(rule.uid, lambda key: key not in visited or (key[0] == rule.kind and key[1:] in copied))
        writes, errors = writes + more, errors + more_errors
        if writes:  # a reaction is an event that caused writes; no-op passes are not timed
            metrics.REACTION.labels(operator=OPERATOR, trigger=trigger.split()[0]).observe(
                time.perf_counter() - started)
        logger.debug(f"Copyrator {rule.key}: reconciled (trigger={trigger}): {len(names)} name(s), "
                     f"{len(targets)} target(s), {writes} write(s)")
        if errors:
            logger.warning(f"Copyrator {rule.key}: {len(errors)} copy operation(s) failed ({errors[0]}); "
                           f"retrying")
        return errors

    async def delete_copy(self, kind: str, view: logic.CopyView) -> None:
        """Delete one copy (its uid a precondition), under its place's lock."""
        async with self.access.serialised(("copyrator", kind, view.namespace, view.name)):
            await self.access.delete(KINDS[kind], view.namespace, view.name, uid=view.uid)
            self._remember_gone((kind, view.namespace, view.name), view.uid)

    async def prune(self, uid: str, rule_key: str, why: str) -> int:
        """Delete the copies carrying this rule uid (each with its uid as a precondition)."""
        count = 0
        for kind in KINDS:
            for view in self.places.copies_of(uid, kind):
                await self.delete_copy(kind, view)
                count += 1
                logger.info(f"Copyrator {rule_key}: pruned {kind} {view.namespace}/{view.name} ({why})")
        if count:
            metrics.action(OPERATOR, "deleted", count)
        return count
