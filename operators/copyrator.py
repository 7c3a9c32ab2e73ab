"""Copyrator: copies labelled ConfigMaps/Secrets into other namespaces, per CopyratorRule.

Thin handlers: indexes and events feed the controller (kopf_operators.copyrator.controller), which
decides with kopf_operators.copyrator.rules, .copies and .tally (pure). Kopf keeps state only on the
rules (our CRD), in annotations: no finalizer (nothing about deleting a rule needs the operator running).
ConfigMaps, Secrets and Namespaces are watched with ``on.event`` and ``@kopf.index`` only (nothing
is stored on them). The ConfigMap/Secret streams are shared with the re-roller, so they are not
label-selected server-side; the copies indexes keep only objects carrying the rule-uid label.
"""

from __future__ import annotations

import os
from typing import Any

import kopf

from kopf_operators.copyrator import rules, tally
from kopf_operators.copyrator.controller import (
    CONTROLLER,
    COPIES_INDEXES,
    NAMESPACES_INDEX,
    RULES_INDEX,
    CopyratorController,
)
from kopf_operators.copyrator.copies import CopyView, copy_view
from kopf_operators.copyrator.places import CopyIndexKey, copy_index_keys
from kopf_operators.copyrator.sources import RuleKey
from kopf_operators.core import process
from kopf_operators.core.api import ApiError
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL

RULES = (rules.GROUP, rules.VERSION, rules.PLURAL)


@kopf.on.startup(id="copyrator-startup")
async def start(memo: kopf.Memo, **kwargs: Any) -> None:
    config, access = process.shared(memo)
    # fails fast on a malformed variable
    options = rules.Options.from_env(os.environ, operator_namespace=config.operator_namespace)
    copies = {kind: kwargs[index] for kind, index in COPIES_INDEXES.items()}
    controller = CONTROLLER.set(memo, CopyratorController(access, options, kwargs[RULES_INDEX],
                                                          kwargs[NAMESPACES_INDEX], copies))
    controller.start_resync()


@kopf.on.cleanup(id="copyrator-cleanup")
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await CONTROLLER(memo).stop()


# --- indexes (small entries: never whole bodies of unrelated objects) -----------------------------

@kopf.index(*RULES, id=RULES_INDEX)
async def copyrator_rules(namespace: str | None, name: str, body: kopf.Body,
                    **_: Any) -> dict[RuleKey, dict[str, Any]] | None:
    return {(namespace, name): tally.rule_snapshot(body)} if namespace else None


@kopf.index("", "v1", "namespaces", id=NAMESPACES_INDEX)
async def copyrator_namespaces(name: str, body: kopf.Body, **_: Any) -> dict[str, rules.NamespaceInfo]:
    return {name: rules.namespace_info(body)}


@kopf.index("", "v1", "configmaps", labels={COPYRATOR_RULE_UID_LABEL: kopf.PRESENT},
            id=COPIES_INDEXES["ConfigMap"])
async def copyrator_configmap_copies(body: kopf.Body, **_: Any) -> dict[CopyIndexKey, CopyView]:
    return copy_index_keys(copy_view(body, "ConfigMap"))


@kopf.index("", "v1", "secrets", labels={COPYRATOR_RULE_UID_LABEL: kopf.PRESENT}, id=COPIES_INDEXES["Secret"])
async def copyrator_secret_copies(body: kopf.Body, **_: Any) -> dict[CopyIndexKey, CopyView]:
    return copy_index_keys(copy_view(body, "Secret"))


# --- rules --------------------------------------------------------------------------------------

# retries=None with a backoff: a failed listing or status write is retried every 10 s (TemporaryError),
# never hot; failed copies are retried by the controller with its own backoff.
@kopf.on.resume(*RULES, id="copyrator-resume", backoff=10)
@kopf.on.create(*RULES, id="copyrator-create", backoff=10)
@kopf.on.update(*RULES, id="copyrator-update", backoff=10)
async def reconcile_rule(body: kopf.Body, reason: Any, memo: kopf.Memo, **_: Any) -> None:
    try:
        await CONTROLLER(memo).rule_changed(body, f"rule {getattr(reason, 'value', reason)}")
    except ApiError as exc:
        raise exc.for_kopf("converging the rule's copies failed", delay=10) from None


# No on.delete handler, so no finalizer: deleting a rule (or its namespace) never waits for this
# operator. Its copies are pruned from this event, or, when the operator was down, by the orphan
# sweep at start and in every resync (the copies carry their rule's uid). A rule left with the
# finalizer of an older version loses it on the first event Kopf processes for it (Kopf removes its
# own finalizer when no handler requires it).
@kopf.on.event(*RULES, id="copyrator-rule-event")
async def rule_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await CONTROLLER(memo).rule_event(type, body)


# --- watched built-in objects (events only; the controller logs and retries its own failures) ---

@kopf.on.event("", "v1", "configmaps", id="copyrator-configmap-event")
async def configmap_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await CONTROLLER(memo).object_event("ConfigMap", type, body)


@kopf.on.event("", "v1", "secrets", id="copyrator-secret-event")
async def secret_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await CONTROLLER(memo).object_event("Secret", type, body)


@kopf.on.event("", "v1", "namespaces", id="copyrator-namespace-event")
async def namespace_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await CONTROLLER(memo).namespace_event(type, body)
