"""Kopf's listing and watch stream, lean (core/kopf_patches/lean.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import api, watching

from kopf_operators.core.kopf_patches import lean
from kopf_operators.core.kopf_patches.door import install
from kopf_operators.core.kopf_patches.lean import BULKY_PAGE, lean_listing, lean_stream

# The tests below drive the patched Kopf in this process, as the entry point runs it.
install()


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


def test_configmaps_are_listed_in_small_pages_read_ahead_only_up_to_a_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of ConfigMaps is at most ``BULKY_PAGE`` objects; pages are read ahead (the continue token's
    5 minutes) only while what they hold stays under ``READ_AHEAD_BYTES``."""
    monkeypatch.setattr(lean, "READ_AHEAD_BYTES", 2500)
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
    assert limits == [BULKY_PAGE, 500]


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
