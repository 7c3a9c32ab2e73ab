"""Copyrator: copies labelled ConfigMaps/Secrets into other namespaces, per CopyratorRule.

Kopf keeps state only on the rules (our CRD). ConfigMaps, Secrets and Namespaces are watched with
``on.event`` only (no annotations, no finalizers on them); every event just asks for a reconcile of
the rules it concerns, and the reconcile is level-triggered (resume + periodic timer repair what
events miss).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from kopf_operators import common
from kopf_operators import copyrator as logic
from kopf_operators import copyrator_api as api

RULES = (logic.GROUP, logic.VERSION, logic.PLURAL)
INDEX = "copyrator-rules"


@kopf.index(*RULES, id=INDEX)
def copyrator_rules(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    """(namespace, name) -> what routing needs (uid, type, selector, source namespaces)."""
    entry = logic.index_entry(body)
    return {(namespace, name): entry} if entry else None


# retries=None with a backoff: API failures are retried every 10 s (TemporaryError), never hot.
@kopf.on.resume(*RULES, id="copyrator-resume", backoff=10)
@kopf.on.create(*RULES, id="copyrator-create", backoff=10)
@kopf.on.update(*RULES, id="copyrator-update", backoff=10)
def reconcile_rule(namespace: str | None, name: str, reason: str, **_: Any) -> None:
    api.request(str(namespace), name, trigger=f"rule {getattr(reason, 'value', reason)}")


@kopf.timer(*RULES, id="copyrator-resync", interval=common.config().copyrator_resync_seconds,
            initial_delay=common.config().copyrator_resync_seconds)
def resync_rule(namespace: str | None, name: str, **_: Any) -> None:
    api.request(str(namespace), name, trigger="resync")


@kopf.on.delete(*RULES, id="copyrator-delete", backoff=10)
def delete_rule(namespace: str | None, name: str, uid: str, **_: Any) -> None:
    count = api.prune_all(uid, str(namespace), name)
    api.logger.info("Copyrator %s/%s deleted: pruned %d copies", namespace, name, count)


def _snapshot(index: Any) -> list[tuple[tuple[str, str], dict[str, Any]]]:
    """Copy the index in the event loop's thread: Kopf updates it there, so no concurrent change."""
    return [(key, dict(entry)) for key, entry in api.iter_rule_keys(index)]


async def _request_all(keys: list[tuple[str, str]], trigger: str) -> None:
    for namespace, name in keys:
        try:
            await asyncio.to_thread(api.request, namespace, name, trigger)
        except Exception as exc:  # events are not retried: the periodic resync repairs what fails
            api.logger.warning("Copyrator %s/%s: reconcile failed (%s); the resync will retry",
                               namespace, name, api.describe(exc))


async def _route(rule_type: str, event_type: str | None, body: kopf.Body, index: Any) -> None:
    if event_type is None:
        return  # the initial listing: on.resume already reconciles every rule on start
    labels = body.get("metadata", {}).get("labels") or {}
    keys = []
    for key, entry in _snapshot(index):
        if not logic.routes_to(entry, rule_type, body, api.known_sources.get(entry["uid"], ())):
            continue
        if labels.get(logic.RULE_UID_LABEL) == entry["uid"] and event_type != "DELETED" \
                and not logic.drifted(body):
            continue  # our own write echoing back
        keys.append(key)
    await _request_all(keys, f"{rule_type} {event_type.lower()}")


@kopf.on.event("", "v1", "configmaps", id="copyrator-configmap-event")
async def configmap_event(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
    await _route("configmap", type, body, kwargs[INDEX])


@kopf.on.event("", "v1", "secrets", id="copyrator-secret-event")
async def secret_event(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
    await _route("secret", type, body, kwargs[INDEX])


@kopf.on.event("", "v1", "namespaces", id="copyrator-namespace-event")
async def namespace_event(type: str | None, **kwargs: Any) -> None:
    """A namespace appeared or changed labels/phase: every rule may gain or lose a target."""
    if type not in ("ADDED", "MODIFIED"):
        return
    await _request_all([key for key, _ in _snapshot(kwargs[INDEX])], f"namespace {type.lower()}")
