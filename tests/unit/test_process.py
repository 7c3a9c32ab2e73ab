"""The process-wide Kopf settings: the diff base only where a handler uses it; the allocator trimmed."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from typing import Any

import kopf
from kopf._cogs.aiokits import aiotoggles

from kopf_operators.blackadder import decisions as blackadder
from kopf_operators.copyrator import decisions as copyrator
from kopf_operators.core.process import DiffBaseWhereUsed, glibc_malloc_trim, trim_allocator
from kopf_operators.immortal import decisions as immortal
from testsupport.paths import REPO

# Loads the files the way `kopf run` does, then prints the groups whose handlers use the diff base.
_PROBE = """
import glob, json, kopf
from kopf._cogs.helpers.loaders import preload
from kopf._cogs.aiokits import aiotoggles

from kopf_operators.core.process import DiffBaseWhereUsed, glibc_malloc_trim, trim_allocator
preload(sorted(glob.glob("operators/*.py")), [])
groups = DiffBaseWhereUsed.groups_of(kopf.get_default_registry())
print(json.dumps(None if groups is None else sorted(groups)))
"""


def test_the_diff_base_is_kept_only_for_the_groups_with_change_handlers_or_daemons() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env={**os.environ, "CHAOS_TENANTS": "true"},
                         capture_output=True, text=True, check=True, timeout=120)
    groups = json.loads(out.stdout.strip().splitlines()[-1])
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
    once indexed. With the fix applied (importing core.process), the many adds and drops while the gate
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
