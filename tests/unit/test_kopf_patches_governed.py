"""Kopf's event processor, governed (core/kopf_patches/governed.py): the policy's cap, the skipped
events (superseded, echoed, unchanged), the Lease's gate, and a listing's handlers deferred."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kopf
from kopf._cogs.aiokits import aiotoggles
from kopf._core.reactor import processing

from kopf_operators.core.access import Access
from kopf_operators.core.api import CONFIGMAP
from kopf_operators.core.conventions import DATA_ELIDED, data_hash
from kopf_operators.core.echoes import ECHO_DEFER_SECONDS, KEPT_ANSWERS_MAX, Echo
from kopf_operators.core.kopf_patches.door import install
from kopf_operators.core.kopf_patches.governed import ELIDE_LISTED_DATA_BYTES, EventPolicy, governed
from kopf_operators.core.process import ACCESS, EVENT_POLICY, skip_unchanged
from kopf_operators.immortal import decisions as immortal

# The tests below drive the patched Kopf in this process, as the entry point runs it.
install()


def test_kopf_processes_every_event_through_the_policy() -> None:
    """`kopf run` binds ``processing.process_resource_event`` when it starts (``spawn_tasks``), after
    the entry point's ``install()``; the worker sets the object's pressure when newer events wait, and
    waits on ``operator_indexed`` (the Lease's gate wraps it) between indexing and the handlers."""
    assert getattr(processing.process_resource_event, "_governed", False)
    assert "await operator_indexed.wait_for(True)" in Path(processing.__file__).read_text()
    running = Path(processing.__file__).with_name("running.py").read_text()
    assert "processor=functools.partial(processing.process_resource_event," in running
    queueing_source = Path(processing.__file__).with_name("queueing.py").read_text()
    assert "streams[key].pressure.set()" in queueing_source and "pressure.clear()" in queueing_source
    assert "await operator_indexed.drop_toggle(resource_indexed)" in Path(processing.__file__).read_text()


def _processed(policy: EventPolicy | None, events: list[str | None], group: str = "", listed: bool = False,
               newer_waiting: bool = False) -> tuple[int, list[str | None]]:
    """``events`` (types) of different objects processed at once through ``governed``: (most processed
    at the same time, the types processed)."""

    async def scenario() -> tuple[int, list[str | None]]:
        running = peak = 0
        processed: list[str | None] = []

        async def process(raw_event: dict[str, Any], **_: Any) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            processed.append(raw_event["type"])

        memo = kopf.Memo()
        if policy is not None:
            EVENT_POLICY.set(memo, policy)
        pressure = asyncio.Event()
        if newer_waiting:
            pressure.set()
        governing = governed(process)
        resource = kopf.Resource(group, "v1", "things")
        toggle = aiotoggles.Toggle() if listed else None
        await asyncio.wait_for(asyncio.gather(*(
            governing(memobase=memo, resource=resource, resource_indexed=toggle, stream_pressure=pressure,
                      raw_event={"type": kind, "object": {}}) for kind in events)), 5)
        return peak, processed

    return asyncio.run(scenario())


def test_at_most_the_configured_number_of_objects_are_processed_at_once() -> None:
    events: list[str | None] = ["MODIFIED"] * 20
    assert _processed(EventPolicy(frozenset({"flant.com"}), asyncio.Semaphore(3)), events) == (3, events)
    assert _processed(EventPolicy(frozenset({"flant.com"}), None), events) == (20, events)  # CONCURRENT_EVENTS=0


def test_a_modification_is_skipped_only_when_a_newer_event_of_the_object_waits() -> None:
    policy = EventPolicy(frozenset({"flant.com"}), asyncio.Semaphore(3))
    kinds: list[str | None] = ["ADDED", "MODIFIED", "DELETED", None]
    assert sorted(map(str, _processed(policy, kinds, newer_waiting=True)[1])) == ["ADDED", "DELETED", "None"]
    assert len(_processed(policy, kinds, newer_waiting=False)[1]) == 4
    assert _processed(None, ["MODIFIED"], newer_waiting=True)[1] == ["MODIFIED"]  # no policy: Kopf's own


def test_objects_of_a_listing_and_groups_with_change_handlers_are_left_to_kopf() -> None:
    """Kopf runs no handler until every listed object is indexed, so a listed object waiting for a slot
    held by a gated one would deadlock (what Kopf's worker_limit does); and Kopf sleeps inside the
    processing of resources with change handlers (retries), where a sleeper would hold a slot."""
    policy = EventPolicy(frozenset({"flant.com"}), asyncio.Semaphore(3))
    events: list[str | None] = ["MODIFIED"] * 20
    assert _processed(policy, events, listed=True, newer_waiting=True) == (20, events)
    assert _processed(policy, events, group="flant.com", newer_waiting=True) == (20, events)


def test_the_echo_of_a_kept_write_answer_is_skipped_and_nothing_else() -> None:
    """A controller that keeps its status patch's answer (an ImmortalContainer) needs no pass for the
    watch event that delivers that very version; any other event of the object is processed, and ends
    the wait for the echo (the watch delivers versions in order)."""

    def thing(rv: str, uid: str = "u1") -> dict[str, Any]:
        return {"metadata": {"uid": uid, "resourceVersion": rv}}

    async def scenario() -> list[tuple[str | None, str]]:
        processed: list[tuple[str | None, str]] = []

        async def process(raw_event: dict[str, Any], **_: Any) -> None:
            processed.append((raw_event["type"], raw_event["object"]["metadata"]["resourceVersion"]))

        memo = kopf.Memo()
        EVENT_POLICY.set(memo, EventPolicy(frozenset({"flant.com"}), asyncio.Semaphore(3)))
        access = ACCESS.set(memo, Access(None))  # no request is made
        governing = governed(process)
        resource = kopf.Resource(immortal.GROUP, "v1", immortal.PLURAL)

        async def event(kind: str | None, body: dict[str, Any]) -> None:
            await governing(memobase=memo, resource=resource, resource_indexed=None,
                            stream_pressure=asyncio.Event(), raw_event={"type": kind, "object": body})

        access.keep_answer(thing("5"))
        access.keep_answer(thing("9", uid="u2"))
        await event("MODIFIED", thing("5"))   # the echo: skipped
        await event("MODIFIED", thing("5"))   # delivered again (a re-watch): processed
        access.keep_answer(thing("7"))
        await event("MODIFIED", thing("6"))   # somebody else's write came first: processed...
        await event("MODIFIED", thing("7"))   # ...and the echo is no longer waited for
        access.keep_answer(thing("8"))
        await event(None, thing("8"))         # a re-listing always runs
        await event("MODIFIED", thing("9"))   # another object's version number
        await event("MODIFIED", thing("9", uid="u2"))  # that object's echo
        access.keep_answer(thing("1", uid="u3"))
        await event("ADDED", thing("1", uid="u3"))  # the echo of our create
        await event("DELETED", thing("1", uid="u3"))  # never skipped
        return processed

    assert asyncio.run(scenario()) == [("MODIFIED", "5"), ("MODIFIED", "6"), ("MODIFIED", "7"),
                                       (None, "8"), ("MODIFIED", "9"), ("DELETED", "1")]


def test_an_echo_the_writer_defers_is_processed_once_its_writes_are_done() -> None:
    """A Copyrator copy's creation: its echo must reach the indexes (other readers use them), but not
    before the writes in flight (the rest of the burst) are done, and at most ECHO_DEFER_SECONDS
    later; other events are not held back."""

    def thing(rv: str, uid: str = "u1") -> dict[str, Any]:
        return {"metadata": {"uid": uid, "resourceVersion": rv, "namespace": "ns"}}

    async def scenario() -> None:
        processed: list[tuple[str | None, str]] = []

        async def process(raw_event: dict[str, Any], **_: Any) -> None:
            processed.append((raw_event["type"], raw_event["object"]["metadata"]["resourceVersion"]))

        memo = kopf.Memo()
        EVENT_POLICY.set(memo, EventPolicy(frozenset({"flant.com"}), asyncio.Semaphore(3)))
        access = ACCESS.set(memo, Access(None))
        answered = asyncio.Event()

        async def held_answer(*_: Any) -> dict[str, Any]:  # the API server answers when told to
            await answered.wait()
            return thing("7", uid="u9")

        access._once = held_answer  # type: ignore[method-assign,assignment]
        governing = governed(process)
        resource = kopf.Resource("", "v1", "configmaps")

        def event(kind: str | None, body: dict[str, Any]) -> asyncio.Future[Any]:
            return asyncio.ensure_future(governing(
                memobase=memo, resource=resource, resource_indexed=None, stream_pressure=asyncio.Event(),
                raw_event={"type": kind, "object": body}))

        write = asyncio.create_task(access.create(CONFIGMAP, thing("")))
        await asyncio.sleep(0)  # the write is sent (and held)
        access.defer_echo(thing("5"))
        echo = event("ADDED", thing("5"))
        await event("MODIFIED", thing("3", uid="u2"))  # another object's event: at once
        assert processed == [("MODIFIED", "3")] and not echo.done()
        answered.set()
        await write
        await echo
        assert processed == [("MODIFIED", "3"), ("ADDED", "5")]

        answered.clear()
        write = asyncio.create_task(access.create(CONFIGMAP, thing("")))
        await asyncio.sleep(0)
        access.defer_echo(thing("6"))
        started = asyncio.get_running_loop().time()
        await event("MODIFIED", thing("6"))  # writes that never end hold it for ECHO_DEFER_SECONDS only
        assert processed[-1] == ("MODIFIED", "6")
        assert asyncio.get_running_loop().time() - started >= ECHO_DEFER_SECONDS * 0.9
        answered.set()
        await write

    asyncio.run(scenario())


def test_marks_of_echoes_that_never_come_are_bounded() -> None:
    """A copy written into another shard's namespace is never echoed to this process: its mark must not
    stay for ever. The oldest marks go first; a re-marked object counts as new."""
    access = Access(None)
    for n in range(KEPT_ANSWERS_MAX + 10):
        access.defer_echo({"metadata": {"uid": f"u{n}", "resourceVersion": "1"}})
        if n == 20:
            access.defer_echo({"metadata": {"uid": "u0", "resourceVersion": "2"}})
    assert access.echo("ADDED", {"metadata": {"uid": "u1", "resourceVersion": "1"}}) is None  # gone
    assert access.echo("ADDED", {"metadata": {"uid": "u0", "resourceVersion": "2"}}) is Echo.DEFER
    last = f"u{KEPT_ANSWERS_MAX + 9}"
    assert access.echo("ADDED", {"metadata": {"uid": last, "resourceVersion": "1"}}) is Echo.DEFER


def test_a_modification_that_leaves_the_fingerprint_unchanged_is_skipped() -> None:
    def pod(rv: str, phase: str = "Pending", uid: str = "p1", node: str = "") -> dict[str, Any]:
        return {"metadata": {"uid": uid, "resourceVersion": rv}, "spec": {"nodeName": node},
                "status": {"phase": phase}}

    async def scenario() -> list[tuple[str | None, str]]:
        processed: list[tuple[str | None, str]] = []

        async def process(raw_event: dict[str, Any], **_: Any) -> None:
            processed.append((raw_event["type"], raw_event["object"]["metadata"]["resourceVersion"]))

        memo = kopf.Memo()
        policy = EventPolicy(frozenset({"flant.com"}), None)
        EVENT_POLICY.set(memo, policy)
        skip_unchanged(memo, "", "pods", lambda body: body["status"]["phase"])
        governing = governed(process)

        async def event(kind: str | None, body: dict[str, Any], plural: str = "pods") -> None:
            await governing(memobase=memo, resource=kopf.Resource("", "v1", plural), resource_indexed=None,
                            stream_pressure=asyncio.Event(), raw_event={"type": kind, "object": body})

        await event("ADDED", pod("1"))
        await event("MODIFIED", pod("2", node="n1"))      # bound to a node: skipped
        await event("MODIFIED", pod("3", "Running", node="n1"))
        await event("MODIFIED", pod("4", "Running", uid="p2"))  # another pod, never seen: processed
        await event("DELETED", pod("5", "Running", node="n1"))  # always processed, and forgotten
        await event("MODIFIED", pod("1", uid="c"), plural="configmaps")
        await event("MODIFIED", pod("2", uid="c"), plural="configmaps")  # not fingerprinted
        assert set(policy.latest) == {"p2"}
        return processed

    assert asyncio.run(scenario()) == [("ADDED", "1"), ("MODIFIED", "3"), ("MODIFIED", "4"), ("DELETED", "5"),
                                       ("MODIFIED", "1"), ("MODIFIED", "2")]


def _listing(events: list[tuple[str | None, str]],
             after: list[tuple[str, str]] | None = None, data: str = "",
             bodies: list[tuple[str, dict[str, Any]]] | None = None) -> tuple[list[str], list[str], bool]:
    """Listed objects (``None``, uid) and later events (type, uid) through ``governed`` with Kopf's
    gate closed until every listed object is indexed: (what Kopf's processor was asked, in order, as
    "index uid" or "handle type uid"; the same at the time the gate opened; whether every listed
    object's worker returned before the gate opened). ``after``: events once the listed handlers ran,
    in the listed objects' workers (Kopf passes the listing's toggle with them too). ``data``: each
    object's ConfigMap data; ``bodies`` collects (call, the body the processor got)."""

    async def scenario() -> tuple[list[str], list[str], bool]:
        calls: list[str] = []
        registry = kopf.OperatorRegistry()

        async def process(raw_event: dict[str, Any], registry: kopf.OperatorRegistry, **kwargs: Any) -> None:
            uid = raw_event["object"]["metadata"]["uid"]
            if kwargs.get("resource_indexed") is not None and registry is not kopf_registry:
                assert registry._indexing is not None and registry._watching is not kopf_registry._watching
                calls.append(f"index {uid}")
                if bodies is not None:
                    bodies.append((f"index {uid}", raw_event["object"]))
                await kwargs["operator_indexed"].drop_toggle(kwargs["resource_indexed"])
                await kwargs["operator_indexed"].wait_for(True)  # Kopf's wait: a no-op for a listed object
            else:  # a listed object is indexed once, when listed; a later event as Kopf does it (both)
                assert (registry._indexing is kopf_registry._indexing) == (raw_event["type"] is not None)
                calls.append(f"handle {raw_event['type']} {uid}")
                if bodies is not None:
                    bodies.append((f"handle {raw_event['type']} {uid}", raw_event["object"]))

        kopf_registry = registry
        memo = kopf.Memo()
        policy = EventPolicy(frozenset({"flant.com"}), asyncio.Semaphore(3))
        EVENT_POLICY.set(memo, policy)
        gate = aiotoggles.ToggleSet(all)
        kind_listed = await gate.make_toggle(name="the kind's listing")
        governing = governed(process)
        resource = kopf.Resource("", "v1", "configmaps")

        toggles: dict[str, Any] = {}
        in_worker = False

        async def event(kind: str | None, uid: str) -> None:
            if kind is None:
                toggles[uid] = await gate.make_toggle(name=uid)
            toggle = toggles[uid] if kind is None or in_worker else None
            await governing(memobase=memo, resource=resource, registry=registry, operator_indexed=gate,
                            resource_indexed=toggle, stream_pressure=asyncio.Event(),
                            raw_event={"type": kind, "object": {"kind": "ConfigMap", "metadata": {"uid": uid},
                                                                **({"data": {"k": data}} if data else {})}})

        workers = [asyncio.create_task(event(kind, uid)) for kind, uid in events if kind is None]
        await asyncio.wait_for(asyncio.gather(*workers), 5)  # done before the gate opens
        later = [asyncio.create_task(event(kind, uid)) for kind, uid in events if kind is not None]
        await asyncio.sleep(0.01)
        at_open = list(calls)
        await gate.drop_toggle(kind_listed)
        await asyncio.wait_for(asyncio.gather(*later), 5)
        await asyncio.wait_for(asyncio.gather(*policy.drainer), 5)
        in_worker = True
        for kind, uid in after or ():
            await asyncio.wait_for(event(kind, uid), 5)
        await asyncio.wait_for(asyncio.gather(*policy.drainer), 5)
        return calls, at_open, all(w.done() for w in workers)

    return asyncio.run(scenario())


def test_a_listed_object_is_indexed_at_once_and_handled_once_every_index_is_filled() -> None:
    calls, at_open, workers_done = _listing([(None, "a"), (None, "b")])
    assert at_open == ["index a", "index b"] and workers_done  # no worker waits for the gate
    assert sorted(calls[2:]) == ["handle None a", "handle None b"]


def test_a_listed_objects_large_data_are_indexed_but_not_kept_for_its_handlers() -> None:
    """Until every index is filled, a listed object's body waits for its handlers: without its data
    when they are large (a tenant's ConfigMaps of 1 MiB would otherwise be held all at once)."""
    big = "x" * (ELIDE_LISTED_DATA_BYTES + 1)
    bodies: list[tuple[str, dict[str, Any]]] = []
    _listing([(None, "a")], after=[("MODIFIED", "a")], data=big, bodies=bodies)
    seen = dict(bodies)
    assert seen["index a"]["data"] == {"k": big}  # the indexes see all of it
    assert "data" not in seen["handle None a"]
    digest = data_hash("ConfigMap", seen["index a"])
    assert seen["handle None a"][DATA_ELIDED] == {"bytes": len(big) + 1, "hash": digest}
    assert seen["handle MODIFIED a"]["data"] == {"k": big}  # a later event: as it came
    small: list[tuple[str, dict[str, Any]]] = []
    _listing([(None, "a")], data="small", bodies=small)
    assert dict(small)["handle None a"]["data"] == {"k": "small"}


def test_a_later_event_of_a_listed_object_supersedes_its_listed_handlers() -> None:
    calls, _, _ = _listing([(None, "a"), (None, "b"), ("MODIFIED", "a")])
    assert sorted(calls[2:]) == ["handle MODIFIED a", "handle None b"]


def test_a_later_event_in_a_listed_objects_worker_is_handled_once_the_gate_is_open() -> None:
    """Kopf's worker of a listed object keeps passing the listing's toggle with later events: after
    the gate opened, such an event is handled at once, not deferred again (where nothing drained it)."""
    calls, _, _ = _listing([(None, "a")], after=[("MODIFIED", "a")])
    assert calls == ["index a", "handle None a", "handle MODIFIED a"]
