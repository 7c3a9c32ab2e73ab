"""The door to Kopf's internals (core/kopf_patches.py) and the process-wide Kopf settings: the version
check, each patch against the installed Kopf, the diff base only where a handler uses it.

The one test module besides the door itself that may import ``kopf._…``: it pins the lines of Kopf's
private code that the patches rely on (``test_no_module_but_the_door_imports_kopfs_internals``)."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import api, watching
from kopf._core.reactor import processing, running

from kopf_operators.blackadder import decisions as blackadder
from kopf_operators.copyrator import decisions as copyrator
from kopf_operators.core import kopf_patches
from kopf_operators.core.access import Access
from kopf_operators.core.api import CONFIGMAP
from kopf_operators.core.conventions import DATA_ELIDED, data_hash
from kopf_operators.core.echoes import ECHO_DEFER_SECONDS, KEPT_ANSWERS_MAX, Echo
from kopf_operators.core.kopf_patches import EventPolicy, governed, lean_listing, lean_stream
from kopf_operators.core.process import ACCESS, EVENT_POLICY, DiffBaseWhereUsed, skip_unchanged
from kopf_operators.core.runtime import glibc_malloc_trim, trim_allocator
from kopf_operators.immortal import decisions as immortal
from testsupport.paths import REPO

# The tests below drive the patched Kopf in this process, as the entry point runs it.
kopf_patches.install()

# Loads the files the way `kopf run` does, then prints the groups whose handlers use the diff base.
_PROBE = """
import glob, json, kopf
from kopf_operators.core import kopf_patches
kopf_patches.install()
kopf_patches.preload(sorted(glob.glob("operators/*.py")))
registry = kopf.get_default_registry()
groups = kopf_patches.change_detecting_groups(registry)
print(json.dumps(None if groups is None else sorted(groups)))
handlers = kopf_patches.all_handlers(registry)
pod_handlers = [handler.id for kind, of_kind in handlers.items() if kind != "_activities" for handler in of_kind
                if handler.selector is not None and "pods" in (handler.selector.any_name, handler.selector.plural)]
print(json.dumps(sorted(pod_handlers)))
sync = [handler.id for of_kind in handlers.values() for handler in of_kind
        if not kopf_patches.is_async_handler(handler) and handler.id not in ("login_via_client", "login_via_pykube")]
print(json.dumps(sync))
"""


def _probe() -> list[Any]:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env={**os.environ, "CHAOS_TENANTS": "true"},
                         capture_output=True, text=True, check=True, timeout=120)
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-3:]]


# What a fresh process looks like after importing every operator file (as `kopf run` does) and then,
# optionally, installing the patches with a given "installed" Kopf version.
_STATE_PROBE = """
import asyncio.sslproto, glob, json, sys
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import api
from kopf._core.reactor import processing, running
from kopf_operators.core import kopf_patches, runtime
kopf_patches.preload(sorted(glob.glob("operators/*.py")))
def state():
    return {"processor": getattr(processing.process_resource_event, "_governed", False),
            "toggles": getattr(aiotoggles.ToggleSet, "_wakes_only_on_change", False),
            "lean": getattr(api.stream, "_lean", False),
            "tls": asyncio.sslproto.SSLProtocol.max_size == runtime.TLS_READ_BUFFER_BYTES,
            "warm": kopf_patches.warm_standby()}
imported = state()
installed = kopf_patches.install(version=sys.argv[1]) if len(sys.argv) > 1 else None
print(json.dumps({"imported": imported, "installed": installed, "after": state()}))
"""


def _state(*version: str, skip: str = "") -> tuple[dict[str, Any], str]:
    out = subprocess.run([sys.executable, "-c", _STATE_PROBE, *version], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=120,
                         env={**os.environ, "CHAOS_TENANTS": "true", kopf_patches.SKIP_ENV: skip})
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_importing_every_operator_file_changes_nothing_in_kopf() -> None:
    state, _ = _state()
    assert not any(state["imported"].values()), state


def test_install_patches_kopf_when_it_is_the_tested_version() -> None:
    state, stderr = _state(kopf_patches.KOPF_TESTED_VERSION)
    assert state["installed"] is True
    assert all(state["after"].values()), state
    assert "Kopf" not in stderr


def test_install_refuses_another_kopf_version_in_one_line_and_patches_nothing() -> None:
    state, stderr = _state("1.99.0")
    assert state["installed"] is False
    assert not any(state["after"].values()), state  # stock Kopf: no patch, a cold standby
    lines = [line for line in stderr.splitlines() if "1.99.0" in line]
    assert len(lines) == 1 and kopf_patches.KOPF_TESTED_VERSION in lines[0] and "unpatched" in lines[0]


def test_a_measurement_leaves_out_only_the_patches_it_names() -> None:
    """KOPF_PATCHES_SKIP (paired bench runs against stock Kopf): the named patches are not installed,
    the others are; without the governed processor a standby is cold (nothing holds its handlers)."""
    state, stderr = _state(kopf_patches.KOPF_TESTED_VERSION, skip="govern_event_processing, small_tls_read_buffers")
    assert state["installed"] is True
    assert state["after"] == {"processor": False, "toggles": True, "lean": True, "tls": False, "warm": False}
    lines = [line for line in stderr.splitlines() if kopf_patches.SKIP_ENV in line]
    assert len(lines) == 1 and "govern_event_processing, small_tls_read_buffers" in lines[0]
    with pytest.raises(ValueError, match="no patch named lean"):  # a typo would measure nothing
        kopf_patches.skipped_patches({kopf_patches.SKIP_ENV: "lean"})


def test_unpatched_the_process_leaves_every_event_and_diff_base_to_kopf() -> None:
    """On stock Kopf nothing reads Kopf's private registries: every group keeps its diff base, and
    no event policy is made (the processor is Kopf's own)."""
    probe = ("import glob, json, kopf\n"
             "from kopf_operators.core import kopf_patches\n"
             "kopf_patches.preload(sorted(glob.glob('operators/*.py')))\n"
             "print(json.dumps(kopf_patches.change_detecting_groups(kopf.get_default_registry())))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) is None


def test_kopf_is_pinned_to_the_version_the_patches_were_tested_with() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"kopf==([^"]+)"', pyproject)
    assert pins == [kopf_patches.KOPF_TESTED_VERSION]
    assert kopf_patches.kopf_version() == kopf_patches.KOPF_TESTED_VERSION  # what this venv runs


# The door itself, and this module, its test: every other file of the project reaches Kopf's internals
# only through the door.
DOOR = {"kopf_operators/core/kopf_patches.py", "tests/unit/test_kopf_patches.py"}


def test_no_module_but_the_door_imports_kopfs_internals() -> None:
    private = re.compile(r"\bkopf\._[a-z]")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    assert "kopf_operators/core/kopf_patches.py" in files
    offenders = sorted(path for path in files if path not in DOOR and (REPO / path).exists()
                       and private.search((REPO / path).read_text()))
    assert offenders == []


def test_the_diff_base_is_kept_only_for_the_groups_with_change_handlers_or_daemons() -> None:
    groups, _, _ = _probe()
    assert groups == sorted({copyrator.GROUP, blackadder.GROUP})
    assert immortal.GROUP not in groups and "" not in groups  # ImmortalContainers, pods, ConfigMaps: none


class Recording(kopf.DiffBaseStorage):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        self.calls.append("build")
        return kopf.BodyEssence(spec=dict(body.get("spec") or {}))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        self.calls.append("fetch")
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self.calls.append("store")


def body(api_version: str) -> kopf.Body:
    return kopf.Body({"apiVersion": api_version, "kind": "X", "metadata": {"name": "x"}, "spec": {"a": 1}})


def test_bodies_of_other_groups_cost_no_copy_and_show_no_change() -> None:
    inner = Recording()
    storage = DiffBaseWhereUsed(inner, frozenset({copyrator.GROUP}))
    for skipped in ("v1", f"{immortal.GROUP}/{immortal.VERSION}", "apps/v1"):
        assert storage.build(body=body(skipped)) == {}
        assert storage.fetch(body=body(skipped)) is None
    assert inner.calls == []
    assert storage.build(body=body(f"{copyrator.GROUP}/v1")) == {"spec": {"a": 1}}
    assert storage.fetch(body=body(f"{copyrator.GROUP}/v1")) is None
    assert inner.calls == ["build", "fetch"]


def test_without_a_known_group_every_body_keeps_its_diff_base() -> None:
    inner = Recording()
    storage = DiffBaseWhereUsed(inner, None)
    storage.build(body=body("v1"))
    storage.fetch(body=body("v1"))
    assert inner.calls == ["build", "fetch"]


def test_glibcs_malloc_trim_is_found_and_callable_here() -> None:
    """The image (python:3.11-slim) and this machine use glibc: the trim must not silently be off."""
    trim = glibc_malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)  # 1: memory was given back; 0: there was none to give


def test_the_allocator_is_trimmed_every_period_until_cancelled() -> None:
    calls: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(trim_allocator(lambda: calls.append(loop.time()), 0.01))
        while len(calls) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert len(calls) >= 3
    assert all(later - earlier >= 0.009 for earlier, later in itertools.pairwise(calls))


def test_the_index_gate_wakes_its_waiters_once_when_it_opens_not_on_every_object() -> None:
    """Kopf's real ToggleSet as it gates handlers on a listing: a toggle per listed object, dropped
    once indexed. With the fix applied (``kopf_patches.install()``), the many adds and drops while the gate
    stays closed wake nobody; the last drop opens it and wakes every waiter once."""

    async def scenario() -> tuple[int, int, list[bool]]:
        gate = aiotoggles.ToggleSet(all)
        listing = await gate.make_toggle(name="the resource's listing")  # closes the gate: a change
        wakes = 0
        notify_all = gate._condition.notify_all

        def counted() -> None:
            nonlocal wakes
            wakes += 1
            notify_all()

        gate._condition.notify_all = counted  # type: ignore[method-assign]
        released: list[bool] = []

        async def worker() -> None:
            await gate.wait_for(True)
            released.append(True)

        objects = []
        waiters = []
        for index in range(200):  # each listed object: a toggle, then a worker waiting on the gate
            objects.append(await gate.make_toggle(name=f"object {index}"))
            waiters.append(asyncio.create_task(worker()))
        await asyncio.sleep(0)
        for toggle in objects:
            await gate.drop_toggle(toggle)
        await asyncio.sleep(0)
        closed = (wakes, len(released))
        await gate.drop_toggles([listing])
        await asyncio.wait_for(asyncio.gather(*waiters), timeout=5)
        return closed[0], closed[1], released

    wakes_while_closed, released_while_closed, released = asyncio.run(scenario())
    assert (wakes_while_closed, released_while_closed) == (0, 0)  # Kopf alone: 400 wake-ups of up to 200 waiters
    assert len(released) == 200


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


def test_pods_are_read_only_by_the_immortal_handlers_that_their_fingerprint_covers() -> None:
    """The immortal operator skips a pod's modification that leaves ``pod_fingerprint`` unchanged, for
    every handler of the process: a new handler or index of pods elsewhere must extend it first."""
    _, pod_handlers, _ = _probe()
    assert pod_handlers == ["immortal-pod-event", "immortal-pods"]


def test_every_handler_and_index_runs_on_the_event_loop() -> None:
    """Kopf runs a sync handler in a worker thread on every call (a hand-off each way, a task for its
    shield, a copy of the context): an index function of ours, cheap and pure, is ``async def``
    and runs inline."""
    _, _, sync = _probe()
    assert sync == []


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


def test_kopf_posts_events_from_at_most_the_configured_number_of_workers() -> None:
    """``settings.posting.worker_limit`` and ``idle_timeout`` (set by ``configure``) are what bound Kopf's
    concurrent Event posts, each on its own connection of an unbounded pool (pinned: Kopf's poster)."""
    posting = Path(processing.__file__).parent.parent / "engines" / "posting.py"
    source = posting.read_text()
    assert "aiotasks.Scheduler(limit=settings.posting.worker_limit)" in source
    assert "settings.posting.idle_timeout" in source


def test_kopf_lists_and_streams_every_object_without_its_managed_fields() -> None:
    """Kopf's watcher reaches the listing and the watch stream through these module attributes; each
    object comes out lean, everything else in it as the API server sent it."""
    assert getattr(api.stream, "_lean", False)
    watching_source = Path(watching.__file__).read_text()
    assert "fetching.fetch_objs(" in watching_source and "api.stream(" in watching_source

    def pod(name: str) -> dict[str, Any]:
        return {"kind": "Pod", "metadata": {"name": name, "labels": {"app": "x"},
                                            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]},
                "spec": {"containers": [{"name": "c"}]}}

    async def events(**_: Any) -> AsyncIterator[Any]:
        yield {"type": "ADDED", "object": pod("a")}
        yield {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "7"}}}
        yield {"type": "ERROR", "object": {"kind": "Status", "code": 410}}

    async def pages(**_: Any) -> AsyncIterator[Any]:
        yield [pod("b"), pod("c")], "5"

    async def scenario() -> tuple[list[Any], list[Any]]:
        return ([event async for event in lean_stream(events)(resource=None)],
                [page async for page in lean_listing(pages)(resource=None)])

    streamed, listed = asyncio.run(scenario())
    lean = {"kind": "Pod", "metadata": {"name": "a", "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}}
    assert streamed == [{"type": "ADDED", "object": lean},
                        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "7"}}},
                        {"type": "ERROR", "object": {"kind": "Status", "code": 410}}]
    assert listed == [([{**lean, "metadata": {"name": "b", "labels": {"app": "x"}}},
                        {**lean, "metadata": {"name": "c", "labels": {"app": "x"}}}], "5")]


def test_the_stop_is_seen_when_kopfs_stop_flag_checker_ends() -> None:
    async def scenario() -> None:
        told = asyncio.Event()
        flag = asyncio.Event()
        checker = asyncio.create_task(flag.wait(), name=kopf_patches.STOP_CHECKER_TASK)
        assert kopf_patches.when_stop_requested(told.set)
        await asyncio.sleep(0.01)
        assert not told.is_set()
        flag.set()  # SIGTERM: Kopf's checker returns
        await asyncio.wait_for(told.wait(), 1)
        await checker

    asyncio.run(scenario())
    # The name is Kopf's (its spawn_tasks names the task so), on the tested version.
    assert f'name="{kopf_patches.STOP_CHECKER_TASK}"' in inspect.getsource(running.spawn_tasks)


def test_the_stop_is_seen_at_the_signal_while_the_loop_is_busy() -> None:
    """The election runs on a thread of its own: it must hear of SIGTERM at the signal, not when a busy
    loop gets to Kopf's handler (a standby's thread could take the Lease the holder released meanwhile)."""
    async def scenario() -> None:
        told: list[float] = []
        flag = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, flag.set)  # as Kopf's spawn_tasks does
        checker = asyncio.create_task(flag.wait(), name=kopf_patches.STOP_CHECKER_TASK)
        try:
            assert kopf_patches.when_stop_requested(lambda: told.append(time.monotonic()))
            await asyncio.sleep(0.01)
            sent = time.monotonic()
            signal.raise_signal(signal.SIGTERM)
            time.sleep(0.3)  # the loop is busy: Kopf's handler has not run yet
            assert told and told[0] - sent < 0.1 and not flag.is_set()
            await asyncio.wait_for(flag.wait(), 1)  # and Kopf's own handler still runs
            await checker
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    asyncio.run(scenario())


def test_no_stop_hook_outside_a_running_operator() -> None:
    async def scenario() -> None:
        assert not kopf_patches.when_stop_requested(lambda: None)

    asyncio.run(scenario())


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
    big = "x" * (kopf_patches.ELIDE_LISTED_DATA_BYTES + 1)
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


def test_configmaps_are_listed_in_small_pages_read_ahead_only_up_to_a_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of ConfigMaps is at most ``BULKY_PAGE`` objects; pages are read ahead (the continue token's
    5 minutes) only while what they hold stays under ``READ_AHEAD_BYTES``."""
    monkeypatch.setattr(kopf_patches, "READ_AHEAD_BYTES", 2500)
    read: list[int] = []
    limits: list[Any] = []

    async def pages(*, settings: Any, resource: Any, **_: Any) -> AsyncIterator[Any]:
        limits.append(settings.watching.chunk_size)
        for n in range(4):
            read.append(n)
            data = {"data": {"k": "x" * 999}} if resource.plural == "configmaps" else {}
            yield [{"kind": resource.kind, "metadata": {"name": f"o-{n}"}, **data}], str(n)

    async def scenario(plural: str) -> list[str]:
        settings = kopf.OperatorSettings()
        settings.watching.chunk_size = 500
        seen = []
        async for _items, version in lean_listing(pages)(resource=kopf.Resource("", "v1", plural),
                                                         settings=settings):
            seen.append(f"{len(read)} read when page {version} is processed")
        assert settings.watching.chunk_size == 500  # the operator's own settings unchanged
        return seen

    assert asyncio.run(scenario("configmaps")) == ["3 read when page 0 is processed", "4 read when page 1 is processed",
                                                   "4 read when page 2 is processed", "4 read when page 3 is processed"]
    read.clear()
    assert asyncio.run(scenario("pods"))[0] == "4 read when page 0 is processed"  # no data: all at once
    assert limits == [kopf_patches.BULKY_PAGE, 500]


def test_a_later_event_of_a_listed_object_supersedes_its_listed_handlers() -> None:
    calls, _, _ = _listing([(None, "a"), (None, "b"), ("MODIFIED", "a")])
    assert sorted(calls[2:]) == ["handle MODIFIED a", "handle None b"]


def test_a_later_event_in_a_listed_objects_worker_is_handled_once_the_gate_is_open() -> None:
    """Kopf's worker of a listed object keeps passing the listing's toggle with later events: after
    the gate opened, such an event is handled at once, not deferred again (where nothing drained it)."""
    calls, _, _ = _listing([(None, "a")], after=[("MODIFIED", "a")])
    assert calls == ["index a", "handle None a", "handle MODIFIED a"]


def test_every_page_of_a_listing_is_read_before_kopf_processes_the_first() -> None:
    """The API server forgets a listing's continue token after 5 minutes; Kopf processes each page's
    objects before it asks for the next: the pages are read at once."""
    read: list[str] = []

    async def pages(**_: Any) -> AsyncIterator[Any]:
        for n in range(3):
            read.append(f"page {n}")
            yield [{"metadata": {"name": f"cm-{n}"}}], str(n)

    async def scenario() -> list[str]:
        seen = []
        async for _items, version in lean_listing(pages)(resource=None):
            seen.append(f"{len(read)} read when page {version} is processed")
        return seen

    assert asyncio.run(scenario()) == [f"3 read when page {n} is processed" for n in range(3)]
