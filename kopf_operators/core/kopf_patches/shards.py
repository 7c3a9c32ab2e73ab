"""Hash shards filtered by the process itself, on a server without ShardedListAndWatch
(``filter_shards_in_process``): the events of other shards' objects dropped as Kopf's watch yields them.

Gain: not measured against the server's own filter beyond docs/performance.md, "Sharding" (a shard's
memory and CPU as with the server's filter, less the network and decoding of every namespaced event).
Not a measurement knob: without it a shard refuses to start on such a server (docs/sharding.md).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
from kopf._cogs.clients import watching

# Kopf's ``settings.watching`` holds the shard membership (a callable of a namespace) under this name
# when the process filters: it travels with the settings Kopf passes to every watch.
SHARD_MEMBERSHIP_ATTR = "kopf_operators_serves_namespace"


def serve_shard_in_process(settings: kopf.OperatorSettings, serves: Callable[[str | None], bool]) -> None:
    setattr(settings.watching, SHARD_MEMBERSHIP_ATTR, serves)


def shard_filtered(watch: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """``watch`` (Kopf's ``continuous_watch``: a resource's listing, then its stream) without the events
    of other shards' objects when the process filters (the earliest place: such an object gets no
    worker, queue, index entry or handler, as if the server had filtered it)."""

    @functools.wraps(watch)
    async def filtering(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        serves = getattr(kwargs["settings"].watching, SHARD_MEMBERSHIP_ATTR, None)
        async for event in watch(*args, **kwargs):
            metadata = (event.get("object") or {}).get("metadata") or {} if isinstance(event, dict) else {}
            if serves is None or serves(metadata.get("namespace")):
                yield event

    filtering._shard_filtered = True  # type: ignore[attr-defined]
    return filtering


def filter_shards_in_process() -> None:
    """Idempotent; filters nothing until ``serve_shard_in_process`` names a shard."""
    if not shard_filter_installed():  # Kopf's watcher calls it by module attribute
        watching.continuous_watch = shard_filtered(watching.continuous_watch)


def shard_filter_installed() -> bool:
    return bool(getattr(watching.continuous_watch, "_shard_filtered", False))
