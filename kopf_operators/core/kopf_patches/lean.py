"""Kopf's listing and watch stream, lean (``lean_watched_bodies``): no ``metadata.managedFields`` in what
Kopf lists and streams; ConfigMaps and Secrets listed ``BULKY_PAGE`` per page, pages read ahead up to
``READ_AHEAD_BYTES`` of data.

Gain: RSS at rest per 1,000 ImmortalContainers +68/+74 → +60/+61 MB; a restart with 1,000 in place
137 → 127-129 MB (docs/performance.md, "Day-2 levers"); re-measured against stock Kopf, a start over
2,000 ConfigMaps peaks 2.6-2.9 MB lower with it (docs/kopf-patches.md). The read ahead is a fix: a
start over 50,000 ConfigMaps outlived the listing's continue token (410), and Kopf stopped.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from kopf._cogs.clients import api, fetching

from kopf_operators.core.conventions import data_bytes


def drop_managed_fields(body: Any) -> None:
    """Remove ``metadata.managedFields`` from a decoded object, in place."""
    metadata = body.get("metadata") if isinstance(body, dict) else None
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)


def lean_stream(stream: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """``stream`` (Kopf's ``api.stream``: watch events) with each event's object lean."""

    @functools.wraps(stream)
    async def lean(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for event in stream(*args, **kwargs):
            if isinstance(event, dict):
                drop_managed_fields(event.get("object"))
            yield event

    lean._lean = True  # type: ignore[attr-defined]
    return lean


# ConfigMaps and Secrets (core/v1) hold up to 1 MiB each, and a tenant writes them: listed this many
# per page (a page of 1 MiB objects is then ~100 MiB, decoded), and pages read ahead only up to
# READ_AHEAD_BYTES of their data.
BULKY_PLURALS = frozenset({"configmaps", "secrets"})
BULKY_PAGE = 100
READ_AHEAD_BYTES = 64 * 1024 * 1024


def lean_listing(fetch_objs: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """``fetch_objs`` (Kopf's ``fetching.fetch_objs``: pages of a listing) with each item lean, and
    every page read before the first is handed on, unless the pages read hold more than
    ``READ_AHEAD_BYTES`` of data (ConfigMaps and Secrets, listed ``BULKY_PAGE`` per page): then the
    oldest are handed on meanwhile.

    Kopf asks for the next page only once it has processed the objects of the previous one. The API
    server keeps a listing's ``continue`` token for 5 minutes (its compaction interval): a start over
    50,000 ConfigMaps on a busy node took longer, the next page failed with 410 ("The provided continue
    parameter is too old"), and Kopf stopped the operator. Read at once, the pages take seconds; the
    objects cost no more memory than Kopf's processing of them keeps until every index is filled.
    Large objects are few for their bytes, so processed fast: reading them all ahead is what would cost
    (a tenant's 700 ConfigMaps of 1 MiB: 700 MiB at once, over the chart's memory limit)."""

    @functools.wraps(fetch_objs)
    async def lean(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        resource, settings = kwargs.get("resource"), kwargs.get("settings")
        if getattr(resource, "group", None) == "" and getattr(resource, "plural", None) in BULKY_PLURALS \
                and settings is not None and (settings.watching.chunk_size or BULKY_PAGE + 1) > BULKY_PAGE:
            kwargs["settings"] = dataclasses.replace(settings, watching=dataclasses.replace(
                settings.watching, chunk_size=BULKY_PAGE))
        pages: collections.deque[tuple[Any, Any]] = collections.deque()
        held = 0
        async for items, resource_version in fetch_objs(*args, **kwargs):
            for item in items:
                drop_managed_fields(item)
            pages.append((items, resource_version))
            held += sum(data_bytes(item) for item in items)
            while held > READ_AHEAD_BYTES and pages:  # few objects for their bytes: processed fast
                items, resource_version = pages.popleft()
                held -= sum(data_bytes(item) for item in items)
                yield items, resource_version
        while pages:
            yield pages.popleft()

    return lean


def lean_watched_bodies() -> None:
    """Drop ``metadata.managedFields`` from every object Kopf lists or streams, as it is decoded.

    Fixes: no handler reads them, and they are the largest part of most bodies (a running pod's has an
    entry per manager). Kopf queues each object's events until its worker gets to them, so in a burst
    the decoded bodies waiting in the queues are the process's peak, and the allocator keeps it.

    Gain (docs/performance.md, "Day-2 levers"): 1,000 ImmortalContainers created at once left RSS
    +68/+74 MB at rest with them, +60/+61 MB without; a restart with 1,000 in place peaked at 137 MB
    with them, 127-129 MB without. CPU per object: no change beyond the noise.
    Re-measured against stock Kopf (paired, docs/kopf-patches.md): a start over 2,000 ConfigMaps
    peaks 2.6-2.9 MB higher without it, and rests 2.4-2.5 MB higher.

    Upstream: not filed yet (docs/kopf-patches.md, "An option to drop managedFields").

    Kopf's watcher calls ``fetching.fetch_objs`` and ``api.stream`` by module attribute. Idempotent."""
    if not getattr(api.stream, "_lean", False):
        api.stream = lean_stream(api.stream)
        fetching.fetch_objs = lean_listing(fetching.fetch_objs)
