"""The allocator's trim (core/kopf_patches/allocator.py, its code in core/runtime.py)."""

from __future__ import annotations

import asyncio
import itertools

from kopf_operators.core.runtime import glibc_malloc_trim, trim_allocator


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
