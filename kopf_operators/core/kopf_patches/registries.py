"""Reads of Kopf's private registries and its loader: patches nothing.

Gain: no diff base is copied for the groups without change handlers (``process.DiffBaseWhereUsed``,
from ``door.change_detecting_groups``): not measured on its own; the tests' views of what ``kopf run``
registers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kopf
from kopf._cogs.helpers import loaders
from kopf._core.actions import invocation

# Kopf's private handler registries of an OperatorRegistry, by kind.
HANDLER_KINDS = ("_activities", "_indexing", "_watching", "_spawning", "_changing", "_webhooks")


def groups_with_change_handlers(registry: kopf.OperatorRegistry) -> frozenset[str] | None:
    """The API groups of the handlers that use Kopf's change detection (on.create/update/resume/delete,
    daemons, timers: Kopf's private ``_changing`` and ``_spawning`` registries). None when a selector
    names no group."""
    groups: set[str] = set()
    for handler in [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers()]:
        group = handler.selector.group if handler.selector is not None else None
        if group is None:
            return None
        groups.add(group)
    return frozenset(groups)


def all_handlers(registry: kopf.OperatorRegistry) -> dict[str, list[Any]]:
    """Every registered handler by Kopf's registry kind (tests and tools: what ``kopf run`` would run)."""
    return {kind: list(getattr(registry, kind).get_all_handlers()) for kind in HANDLER_KINDS}


def is_async_handler(handler: Any) -> bool:
    """Whether Kopf runs this handler on the event loop (an ``async def``), not in a thread."""
    return bool(invocation.is_async_fn(handler.fn))


def preload(paths: Sequence[str]) -> None:
    """Import handler files the way ``kopf run`` does (Kopf's loader)."""
    loaders.preload(list(paths), [])
