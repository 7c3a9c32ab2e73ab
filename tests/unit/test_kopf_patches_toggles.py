"""Kopf's ToggleSet woken only on a change (core/kopf_patches/toggles.py)."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits import aiotoggles

from kopf_operators.core.kopf_patches.door import install

# The tests below drive the patched Kopf in this process, as the entry point runs it.
install()


def test_the_index_gate_wakes_its_waiters_once_when_it_opens_not_on_every_object() -> None:
    """Kopf's real ToggleSet as it gates handlers on a listing: a toggle per listed object, dropped
    once indexed. With the fix applied (``door.install()``), the many adds and drops while the gate
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
