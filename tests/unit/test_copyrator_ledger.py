"""Copyrator's status counts, kept per place as events arrive (the ledger): after any order of events
(namespaces added, relabelled, terminating, deleted; copies deleted or edited by hand; objects in the
way; sources edited, added, deleted, their consent changed; rules changed and deleted) they equal a count
from scratch over the same indexes, and a restarted controller (new process, same indexes) counts the
same. A simulated cluster: writes through the access layer land in Kopf-like indexes and come back as
watch events, one at a time, as Kopf delivers them (index first, then the handler)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import dataclasses
import random
from collections.abc import AsyncIterator, Hashable, Mapping
from typing import Any

import pytest

from kopf_operators.copyrator import rules
from kopf_operators.copyrator.controller import CopyratorController
from kopf_operators.copyrator.copies import CopyView, copy_view
from kopf_operators.copyrator.places import copy_index_keys
from kopf_operators.copyrator.tally import Judgement, Tally, rule_snapshot, standing
from kopf_operators.core.api import AlreadyExists, ApiError, Conflict, Kind
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL

ObjKey = tuple[str, str, str]  # (kind, namespace, name)
NAMESPACES = [f"n{i}" for i in range(6)]
SOURCES = ["conf", "extra", "third"]


def unpointer(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


class Cluster:
    """The API server and Kopf's indexes and watch, for one controller: objects, their events (queued
    until ``deliver``), the namespaces, rules and copies indexes."""

    def __init__(self) -> None:
        self.paused = False
        self.objects: dict[ObjKey, dict[str, Any]] = {}
        self.pending: list[tuple[str, str, dict[str, Any]]] = []  # (kind, type, body)
        self.namespaces: dict[str, list[rules.NamespaceInfo]] = {}  # the index (as delivered)
        self.truth: dict[str, rules.NamespaceInfo] = {}  # the namespaces as the API server has them
        self.rules: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.copies: dict[str, dict[Any, list[CopyView]]] = {"ConfigMap": {}, "Secret": {}}
        self.rv = 100
        self.status_writes = 0
        self.writes = 0  # creates, patches, deletes asked for

    def _stamp(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        return body

    def put(self, kind: str, body: dict[str, Any], event: str) -> dict[str, Any]:
        meta = body["metadata"]
        body = self._stamp(copy.deepcopy(body))
        self.objects[(kind, meta["namespace"], meta["name"])] = body
        self.pending.append((kind, event, copy.deepcopy(body)))
        return copy.deepcopy(body)

    def remove(self, key: ObjKey) -> None:
        body = self.objects.pop(key)
        self.pending.append((key[0], "DELETED", copy.deepcopy(body)))

    # --- Kopf's indexes, on delivery ---------------------------------------------------------------

    def index(self, kind: str, event: str, body: Mapping[str, Any]) -> None:
        index = self.copies[kind]
        meta = body["metadata"]
        for old in list(index.get(("at", meta["namespace"], meta["name"]), ())):
            for key, view in copy_index_keys(old).items():
                index[key].remove(view)
                if not index[key]:
                    del index[key]
        if event != "DELETED" and rules.is_copy(body):
            for key, view in copy_index_keys(copy_view(body, kind)).items():
                index.setdefault(key, []).append(view)

    # --- the access layer ----------------------------------------------------------------------------

    async def read(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get((kind.kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def list(self, kind: Kind, namespace: str | None = None, *, labels: str = "",
                   **_: Any) -> builtins.list[dict[str, Any]]:
        wanted = dict(item.split("=", 1) for item in labels.split(",") if item)
        return [copy.deepcopy(body) for (k, ns, _n), body in self.objects.items()
                if k == kind.kind and ns == namespace
                and all((body["metadata"].get("labels") or {}).get(k2) == v for k2, v in wanted.items())]

    async def create(self, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
        self.writes += 1
        meta = body["metadata"]
        namespace = self.truth.get(meta["namespace"])
        if namespace is None:
            raise ApiError(404, "Not Found")
        if not namespace.active:
            raise ApiError(403, "Forbidden", "unable to create new content because it is being terminated")
        if (kind.kind, meta["namespace"], meta["name"]) in self.objects:
            raise AlreadyExists(409, "Conflict", "already exists")
        self.rv += 1
        created = copy.deepcopy(dict(body))
        created["metadata"]["uid"] = f"uid-{self.rv}"
        return self.put(kind.kind, created, "ADDED")

    async def patch(self, kind: Kind, namespace: str, name: str, ops: builtins.list[dict[str, Any]],
                    **_: Any) -> dict[str, Any] | None:
        self.writes += 1
        current = self.objects.get((kind.kind, namespace, name))
        if current is None:
            return None
        body = copy.deepcopy(current)
        for op in ops:
            path = [unpointer(p) for p in op["path"].split("/")[1:]]
            if path == ["metadata", "resourceVersion"]:
                if op["value"] != current["metadata"]["resourceVersion"]:
                    raise Conflict(409, "Conflict")
                continue
            target = body
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = copy.deepcopy(op["value"])
        return self.put(kind.kind, body, "MODIFIED")

    async def delete(self, kind: Kind, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.writes += 1
        current = self.objects.get((kind.kind, namespace, name))
        if current is None or (uid and current["metadata"]["uid"] != uid):
            return False
        self.remove((kind.kind, namespace, name))
        return True

    async def patch_status(self, kind: Kind, namespace: str, name: str, status: Mapping[str, Any],
                           **_: Any) -> dict[str, Any]:
        self.status_writes += 1
        return {"metadata": {"namespace": namespace, "name": name}, "status": dict(status)}

    def event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        pass

    def defer_echo(self, answer: Any) -> None:
        pass  # only Kopf's event processing asks about it (tests/unit/test_process.py)

    @contextlib.asynccontextmanager
    async def serialised(self, key: Hashable) -> AsyncIterator[None]:
        yield


def rule_body(name: str, namespace: str, uid: str, created: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "flant.com/v1", "kind": "CopyratorRule",
            "metadata": {"namespace": namespace, "name": name, "uid": uid, "generation": 1, "resourceVersion": "1",
                         "creationTimestamp": created},
            "spec": {"ruleType": "configmap", "selector": {"app": "web"}, "namespace": "src", **spec}}


RULES = [
    rule_body("a", "src", "uid-a", "2026-01-01T00:00:00Z"),  # every namespace
    rule_body("b", "src", "uid-b", "2026-01-02T00:00:00Z", target={"namePrefix": "b-"},
              namespaceSelector={"matchLabels": {"team": "a"}}),
    # In another namespace: needs the source's consent, and wants the same names as rule a (older).
    rule_body("c", "other", "uid-c", "2026-01-03T00:00:00Z", namespaceSelector={"matchExpressions": [
        {"key": "team", "operator": "Exists"}]}),
]


def namespace_info(name: str, labels: Mapping[str, str], active: bool = True) -> rules.NamespaceInfo:
    return rules.NamespaceInfo(name, labels, active)


def namespace_body(info: rules.NamespaceInfo) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": info.name, "labels": dict(info.labels)}
    if not info.active:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def source_body(name: str, data: str, consent: str | None) -> dict[str, Any]:
    annotations = {rules.ALLOWED_NAMESPACES_ANNOTATION: consent} if consent is not None else {}
    return {"kind": "ConfigMap", "metadata": {"namespace": "src", "name": name, "uid": f"uid-src-{name}",
                                              "labels": {"app": "web"}, "annotations": annotations},
            "data": {"k": data}}


def normal(tally: Tally) -> dict[str, Any]:
    return {key: sorted(value) if isinstance(value, list) else value
            for key, value in dataclasses.asdict(tally).items()}


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cluster = Cluster()
        self.ctl = self.controller()
        self.live = {r["metadata"]["uid"]: copy.deepcopy(r) for r in RULES}

    def controller(self) -> CopyratorController:
        c = self.cluster
        return CopyratorController(c, rules.Options(status_delay_seconds=3600), c.rules,  # type: ignore[arg-type]
                                   c.namespaces, c.copies)

    async def deliver(self, ctl: CopyratorController | None = None, limit: int | None = None) -> None:
        """Watch events, in order, as Kopf delivers them: the index first, then the handler."""
        ctl = ctl or self.ctl
        count = 0
        while self.cluster.pending and (limit is None or count < limit):
            kind, event, body = self.cluster.pending.pop(0)
            if kind == "Namespace":
                if event == "DELETED":
                    self.cluster.namespaces.pop(body["metadata"]["name"], None)
                else:
                    self.cluster.namespaces[body["metadata"]["name"]] = [rules.namespace_info(body)]
                await ctl.namespace_event(event, body)
            else:
                self.cluster.index(kind, event, body)
                await ctl.object_event(kind, event, body)
            count += 1

    def set_namespace(self, info: rules.NamespaceInfo | None, name: str, event: str) -> None:
        if info is None:
            self.cluster.truth.pop(name, None)
        else:
            self.cluster.truth[name] = info
        body = namespace_body(info) if info is not None else \
            {"metadata": {"name": name, "deletionTimestamp": "2026-01-01T00:00:00Z"}}
        self.cluster.pending.append(("Namespace", event, body))

    async def setup(self) -> None:
        c = self.cluster
        for name in ("src", "other"):
            c.truth[name] = namespace_info(name, {})
        for name in NAMESPACES[:4]:
            c.truth[name] = namespace_info(name, {"team": self.rng.choice("ab")})
        c.namespaces.update({name: [info] for name, info in c.truth.items()})
        for name in SOURCES[:2]:
            c.put("ConfigMap", source_body(name, "v1", "n1,n2"), "ADDED")
        await self.deliver()
        for body in RULES:
            c.rules[(body["metadata"]["namespace"], body["metadata"]["name"])] = [rule_snapshot(body)]
        for body in RULES:
            await self.ctl.rule_changed(body, "rule resumed")
        await self.deliver()

    async def step(self) -> str:
        c, rng = self.cluster, self.rng
        copies = [key for key, body in c.objects.items() if rules.is_copy(body)]
        action = rng.choice(["ns-add", "ns-relabel", "ns-terminate", "ns-delete", "copy-deleted", "copy-edited",
                             "copy-unlabelled", "in-the-way", "source-edited", "source-added", "source-deleted",
                             "rule-changed", "rule-deleted", "retry", "deliver-some"])
        if action == "ns-add":
            free = [n for n in NAMESPACES if n not in c.truth]
            if free:
                name = rng.choice(free)
                self.set_namespace(namespace_info(name, {"team": rng.choice("ab")}), name, "ADDED")
        elif action in ("ns-relabel", "ns-terminate", "ns-delete"):
            present = [n for n in NAMESPACES if n in c.truth]
            if present:
                name = rng.choice(present)
                if action == "ns-relabel":  # (a terminating namespace stays terminating)
                    labels = rng.choice([{}, {"team": "a"}, {"team": "b"}])
                    self.set_namespace(namespace_info(name, labels, c.truth[name].active), name, "MODIFIED")
                elif action == "ns-terminate":
                    info = c.truth[name]
                    self.set_namespace(namespace_info(name, info.labels, active=False), name, "MODIFIED")
                else:
                    for key in [k for k in c.objects if k[1] == name]:
                        c.remove(key)
                    self.set_namespace(None, name, "DELETED")
        elif action == "copy-deleted" and copies:
            c.remove(rng.choice(copies))
        elif action == "copy-edited" and copies:
            key = rng.choice(copies)
            body = copy.deepcopy(c.objects[key])
            body["data"] = {"k": "by hand"}
            c.put(key[0], body, "MODIFIED")
        elif action == "copy-unlabelled" and copies:  # taken over by hand: no copy any more, nothing to write
            key = rng.choice(copies)
            body = copy.deepcopy(c.objects[key])
            del body["metadata"]["labels"][COPYRATOR_RULE_UID_LABEL]
            c.put(key[0], body, "MODIFIED")
        elif action == "in-the-way":
            present = [n for n in NAMESPACES if n in c.truth]
            if present:
                key = ("ConfigMap", rng.choice(present), rng.choice([*SOURCES, "b-conf"]))
                if key not in c.objects:
                    c.rv += 1
                    c.put("ConfigMap", {"metadata": {"namespace": key[1], "name": key[2], "uid": f"theirs-{c.rv}"},
                                        "data": {"x": "y"}}, "ADDED")
        elif action in ("source-edited", "source-added"):
            name = rng.choice(SOURCES)
            c.put("ConfigMap", source_body(name, rng.choice(["v1", "v2"]), rng.choice([None, "n1,n2", "n*", "zz"])),
                  "MODIFIED" if ("ConfigMap", "src", name) in c.objects else "ADDED")
        elif action == "source-deleted":
            present = [n for n in SOURCES if ("ConfigMap", "src", n) in c.objects]
            if present:
                c.remove(("ConfigMap", "src", rng.choice(present)))
        elif action == "rule-changed":
            uid = rng.choice(sorted(self.live))
            body = self.live[uid]
            body["metadata"]["generation"] += 1
            body["spec"]["excludedNamespaces"] = rng.sample(NAMESPACES, rng.randint(0, 2))
            c.rules[(body["metadata"]["namespace"], body["metadata"]["name"])] = [rule_snapshot(body)]
            with contextlib.suppress(ApiError):  # a failed copy: Kopf retries the handler
                await self.ctl.rule_changed(copy.deepcopy(body), "rule updated")
        elif action == "retry":  # a rule's sweep with its kept counts (places in sync are skipped)
            body = self.live[rng.choice(sorted(self.live))]
            await self.ctl.passes((body["metadata"]["namespace"], body["metadata"]["name"]), "retry")
        elif action == "rule-deleted" and len(self.live) > 1:
            uid = rng.choice(sorted(self.live))
            body = self.live.pop(uid)
            del c.rules[(body["metadata"]["namespace"], body["metadata"]["name"])]
            await self.ctl.rule_event("DELETED", body)
        if action == "deliver-some":
            await self.deliver(limit=rng.randint(1, 4))
        elif rng.random() < 0.7:
            await self.deliver()
        return action

    def tallies(self, ctl: CopyratorController) -> dict[str, dict[str, Any]]:
        out = {}
        for _s, rule in ctl.sources.active_rules():
            if not rule.push:
                out[rule.uid] = normal(ctl.status.tally(rule))
        return out

    def from_scratch(self) -> dict[str, dict[str, Any]]:
        """The same controller's counts with its ledgers rebuilt from the indexes (kept afterwards)."""
        kept = dict(self.ctl.status.ledgers)
        self.ctl.status.ledgers.clear()
        try:
            return self.tallies(self.ctl)
        finally:
            self.ctl.status.ledgers.clear()
            self.ctl.status.ledgers.update(kept)


@pytest.mark.parametrize("seed", range(40))
def test_counts_kept_per_event_equal_a_count_from_scratch_after_any_order_of_events(seed: int) -> None:
    async def scenario() -> None:
        world = World(seed)
        await world.setup()
        history = []
        for _ in range(60):
            history.append(await world.step())
            if world.rng.random() < 0.4:  # counts consumed now and then: marks pile up in between
                assert world.tallies(world.ctl) == world.from_scratch(), history
        assert world.tallies(world.ctl) == world.from_scratch(), history
        await world.ctl.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("seed", range(10))
def test_a_restarted_controller_counts_the_same(seed: int) -> None:
    async def scenario() -> None:
        world = World(seed)
        await world.setup()
        for _ in range(40):
            await world.step()
        # What only trying tells (an object taken over by hand is in the way: the 409 on create), both
        # processes learn from a sweep: the running one's retry (its counts are kept, not rebuilt).
        for body in world.live.values():
            await world.ctl.passes((body["metadata"]["namespace"], body["metadata"]["name"]), "retry")
        await world.deliver()
        before = world.tallies(world.ctl)
        await world.ctl.stop()
        # A new process on the same cluster: Kopf fills its indexes again (initial listing, no event
        # type), then the rules resume; objects in the way are learned again from the 409 on create.
        restarted = world.controller()
        for infos in world.cluster.namespaces.values():
            await restarted.namespace_event(None, namespace_body(infos[0]))
        for (kind, _ns, _name), body in list(world.cluster.objects.items()):
            await restarted.object_event(kind, None, copy.deepcopy(body))
        for body in world.live.values():
            with contextlib.suppress(ApiError):
                await restarted.rule_changed(copy.deepcopy(body), "rule resumed")
        await world.deliver(restarted)
        assert world.cluster.pending == []
        assert world.tallies(restarted) == before
        await restarted.stop()

    asyncio.run(scenario())


def test_a_namespace_event_judges_only_that_namespace_s_places(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost the status pays per namespace event does not grow with the copies a rule has."""
    async def scenario() -> int:
        world = World(0)
        await world.setup()
        for _s, rule in world.ctl.sources.active_rules():
            world.ctl.status.tally(rule)  # ledgers built
        judged: list[str] = []

        def counted(rule: rules.Rule, namespace: str, *args: Any, **kwargs: Any) -> Judgement:
            judged.append(namespace)
            return standing(rule, namespace, *args, **kwargs)

        monkeypatch.setattr("kopf_operators.copyrator.status.standing", counted)
        world.set_namespace(namespace_info("n5", {"team": "a"}), "n5", "ADDED")
        await world.deliver()
        for _s, rule in world.ctl.sources.active_rules():
            world.ctl.status.tally(rule)
        await world.ctl.stop()
        return len(set(judged) - {"n5"})

    assert asyncio.run(scenario()) == 0


def test_a_copy_that_failed_in_a_namespace_since_deleted_stops_counting() -> None:
    async def scenario() -> tuple[int, int]:
        world = World(0)
        await world.setup()
        # The index still has n5 when the API server has already deleted it: the create fails (404).
        world.cluster.pending.append(("Namespace", "ADDED", namespace_body(namespace_info("n5", {"team": "a"}))))
        await world.deliver()
        rule = rules.parse_rule(RULES[0])
        failed_before = world.ctl.status.tally(rule).failed
        world.set_namespace(None, "n5", "DELETED")
        await world.deliver()
        failed_after = world.ctl.status.tally(rule).failed
        await world.ctl.stop()
        return failed_before, failed_after

    assert asyncio.run(scenario()) == (2, 0)  # conf and extra


@pytest.mark.parametrize("seed", range(10))
def test_a_sweep_that_skips_places_counted_in_sync_leaves_nothing_for_a_sweep_from_scratch(seed: int) -> None:
    async def scenario() -> int:
        world = World(seed)
        await world.setup()
        for _ in range(40):
            await world.step()
        await world.deliver()
        for _ in range(2):  # retries (kept counts) until the cluster is as the rules want it
            for body in world.live.values():
                await world.ctl.passes((body["metadata"]["namespace"], body["metadata"]["name"]), "retry")
            await world.deliver()
        before = world.cluster.writes
        await world.ctl._resync()  # counts from scratch: finds nothing the retries skipped
        await world.deliver()
        await world.ctl.stop()
        return world.cluster.writes - before

    assert asyncio.run(scenario()) == 0
