"""Blackadder: a chaos agent operator (after oz123/blackadder), made safe to run.

One Kopf daemon per ChaosAgent (our own cluster-scoped CR) runs a cycle every ``pauseDuration``:
tantrum (kill pods), cancer (double Deployments), ipsum (lorem-ipsum ConfigMaps). Built-in
objects are only listed and acted on, never annotated or watched with state. Logic lives in
``kopf_operators.blackadder`` (pure) and ``kopf_operators.blackadder_api`` (pykube-ng calls).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from kopf_operators import blackadder as logic
from kopf_operators import blackadder_api as api
from kopf_operators import common

RESOURCE = (logic.GROUP, logic.VERSION, logic.PLURAL)


# cancellation_polling: Kopf re-checks an exiting daemon this often (default 60 s would hold
# the finalizer, and so the deletion, for a minute after the daemon has already stopped).
@kopf.daemon(*RESOURCE, id="blackadder-agent", initial_delay=0, cancellation_polling=1)
async def agent_daemon(body: kopf.Body, stopped: kopf.DaemonStopped, logger: api.Logger, **_: Any) -> None:
    """The agent's loop. Async, so a sleeping agent holds no worker thread; each cycle's blocking
    pykube calls run in a thread (asyncio.to_thread). ``stopped`` is set at once when the agent is
    deleted or the operator exits, and the cycle checks it before every single action."""
    try:
        delay = await asyncio.to_thread(api.initial_delay, body)
    except Exception as exc:  # the API is down: start now, the cycle will report it
        logger.warning(f"could not read the ledger before the first cycle: {exc}")
        delay = 0.0
    if delay and await stopped.wait(delay):
        return
    while not stopped:
        try:
            # `body` is Kopf's live view: edits arrive through the watch and apply on this cycle.
            await asyncio.to_thread(api.run_cycle, body, lambda: bool(stopped), logger)
        except Exception as exc:  # never let one bad cycle kill the agent's loop
            common.count_error(api.OPERATOR, "cycle-crash")
            logger.exception(f"cycle crashed: {exc}")
        pause = logic.settings_from_spec(body.get("spec") or {}).pause
        if await stopped.wait(pause):
            break


@kopf.on.delete(*RESOURCE, id="blackadder-revert-on-delete", backoff=10)
def revert_on_delete(body: kopf.Body, logger: api.Logger, **_: Any) -> None:
    """Deleting an agent stops it (the daemon) and, unless revertOnDelete: false, undoes what it
    did (scaled Deployments, overwritten ConfigMaps); then its ledger goes."""
    try:
        api.revert_on_delete(body, logger)
    except api.ApiError as exc:
        raise kopf.TemporaryError(f"revert failed, retrying: {exc}", delay=10) from exc
