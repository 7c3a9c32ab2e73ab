"""Blackadder: a chaos agent operator (after oz123/blackadder), made safe to run.

Thin handlers: one Kopf daemon per ChaosAgent (our own cluster-scoped CR) runs a cycle every
``pauseDuration`` through the controller (kopf_operators.blackadder.controller), which decides with
kopf_operators.blackadder.decisions (pure). Built-in objects are only listed (periodically, per cycle) and acted
on, never annotated or watched with state; namespaces reach the controller through a small index.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from kopf_operators.blackadder import decisions, settings
from kopf_operators.blackadder.controller import (
    AGENTS,
    NAMESPACES_INDEX,
    SOURCES_INDEX,
    TENANT_AGENTS,
    BlackadderController,
    TenantChaosController,
)
from kopf_operators.blackadder.notify import Logger
from kopf_operators.blackadder.revert import RevertIncomplete
from kopf_operators.core import process
from kopf_operators.core.api import ApiError

RESOURCE = (settings.GROUP, settings.VERSION, settings.PLURAL)
TENANT_RESOURCE = (settings.GROUP, settings.VERSION, settings.TENANT_PLURAL)
# Chaos for tenants is opt-in (chart: operators.blackadder.tenants.enabled, which also grants the RBAC):
# without it Kopf must not even watch TenantChaosAgents, so the handlers below are registered only then.
TENANTS = settings.Options.from_env(os.environ).tenants
REVERT_RETRY_SECONDS = 5


@kopf.on.startup(id="blackadder-startup")
async def start(memo: kopf.Memo, **kwargs: Any) -> None:
    config, access = process.shared(memo)
    options = settings.Options.from_env(os.environ)
    namespaces, sources = kwargs[NAMESPACES_INDEX], kwargs[SOURCES_INDEX]
    AGENTS.set(memo, BlackadderController(access, config, options, namespaces, sources))
    tenants = TENANT_AGENTS.set(memo, TenantChaosController(access, config, options, namespaces, sources))
    if options.tenants:
        try:
            await tenants.sweep_ledgers()
        except ApiError as exc:  # not fatal: a leftover ledger is a small Secret, swept at the next start
            logging.getLogger("kopf_operators.blackadder").warning(f"tenant ledgers not swept: {exc}")


@kopf.on.cleanup(id="blackadder-cleanup")
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await AGENTS(memo).stop()
    await TENANT_AGENTS(memo).stop()  # its webhooks too


@kopf.index("namespaces", id=NAMESPACES_INDEX)
async def blackadder_namespaces(name: str, labels: kopf.Labels, status: kopf.Status,
                                **_: Any) -> dict[str, dict[str, Any]]:
    return {name: {"labels": dict(labels), "terminating": status.get("phase") == "Terminating"}}


@kopf.index("flant.com", "v1", "copyrators", id=SOURCES_INDEX)
async def blackadder_copyrator_sources(namespace: str | None, name: str, body: kopf.Body,
                                 **_: Any) -> dict[tuple[str, str], list[dict[str, Any]]] | None:
    """Which ConfigMaps Copyrator rules copy (sharedConfigMaps: Skip keeps ipsum off them)."""
    sources = decisions.copyrator_sources(body)
    return {(namespace or "", name): sources} if sources else None


# cancellation_polling: Kopf re-checks an exiting daemon this often (default 60 s would hold
# the finalizer, and so the deletion, for a minute after the daemon has already stopped).
@kopf.daemon(*RESOURCE, id="blackadder-agent", initial_delay=0, cancellation_polling=1)
async def agent_daemon(body: kopf.Body, stopped: kopf.DaemonStopped, logger: Logger, memo: kopf.Memo,
                       **_: Any) -> None:
    """Async: a sleeping agent holds no worker thread. ``stopped`` is set at once when the agent is
    deleted or the operator exits; the cycle checks it before every single action."""
    await AGENTS(memo).agent_loop(body, lambda: bool(stopped), stopped.wait, logger)


@kopf.on.delete(*RESOURCE, id="blackadder-revert-on-delete", backoff=REVERT_RETRY_SECONDS)
async def revert_on_delete(body: kopf.Body, logger: Logger, memo: kopf.Memo, retry: int, **_: Any) -> None:
    """Deleting an agent stops it (the daemon) and, unless revertOnDelete: false, undoes what it
    did (scaled Deployments, overwritten ConfigMaps); then its ledger goes. A revert that keeps being
    refused lets go after settings.REVERT_ATTEMPTS tries (the ledger then stays, see the controller)."""
    try:
        await AGENTS(memo).revert_on_delete(body, logger, attempt=retry)
    except RevertIncomplete as exc:
        raise kopf.TemporaryError(f"revert incomplete (attempt {retry + 1} of {settings.REVERT_ATTEMPTS}), "
                                  f"retrying: {exc}", delay=REVERT_RETRY_SECONDS) from None
    except ApiError as exc:
        # The ledger could not be read or written: the finalizer must not go while changes may remain.
        raise kopf.TemporaryError(f"revert failed, retrying: {exc}", delay=REVERT_RETRY_SECONDS) from None


if TENANTS:
    @kopf.daemon(*TENANT_RESOURCE, id="blackadder-tenant-agent", initial_delay=0, cancellation_polling=1)
    async def tenant_agent_daemon(body: kopf.Body, stopped: kopf.DaemonStopped, logger: Logger, memo: kopf.Memo,
                                  **_: Any) -> None:
        """A TenantChaosAgent: the same loop, confined to its namespace and the administrator's limits."""
        await TENANT_AGENTS(memo).agent_loop(body, lambda: bool(stopped), stopped.wait, logger)

    @kopf.on.delete(*TENANT_RESOURCE, id="blackadder-tenant-delete", backoff=REVERT_RETRY_SECONDS)
    async def tenant_delete(body: kopf.Body, logger: Logger, memo: kopf.Memo, retry: int, **_: Any) -> None:
        """Its ledger lives in the operator's namespace (no ownerReference can cross namespaces): it is
        deleted here. Tantrum only, so there is nothing to revert."""
        try:
            await TENANT_AGENTS(memo).revert_on_delete(body, logger, attempt=retry)
        except ApiError as exc:
            raise kopf.TemporaryError(f"ledger not deleted, retrying: {exc}", delay=REVERT_RETRY_SECONDS) from None
