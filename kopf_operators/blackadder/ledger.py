"""Blackadder's ledger store: one Secret per agent in the operator's namespace, holding what the agent
did and what a revert restores.

The operator is the ledger's only writer: each ledger is read once (the first cycle after a start) and
then kept in memory with the resourceVersion of our own last write (``core.state.Newest``: our
writes are the newest version there is); a 409 on saving re-reads it once.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from kopf_operators.blackadder import decisions, settings, targets
from kopf_operators.core import api as k8s
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.conventions import DOMAIN, Config
from kopf_operators.core.state import Index, Newest, version_of

OPERATOR = "blackadder"


@dataclasses.dataclass
class LedgerHandle:
    namespace: str
    name: str
    data: dict[str, Any]
    exists: bool
    resource_version: str = ""
    uid: str = ""  # of the Secret: deleted with this precondition only


class LedgerTaken(ApiError):
    """The ledger's Secret exists but is not this agent's to write: someone else's Secret with that
    name, or the ledger a previous agent of the same name left behind for an administrator."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(409, "LedgerTaken", why)
        self.where, self.why = where, why

    def __str__(self) -> str:
        return f"the ledger Secret {self.where} {self.why}; the agent does nothing until it is moved away"


class LedgerStore:
    """The ledgers of one controller's agents (keyed by agent uid)."""

    def __init__(self, access: Access, config: Config, kind: k8s.Kind, namespaces: Index[str, dict[str, Any]],
                 ledger_name: Callable[[str], str]) -> None:
        self.access, self.config, self.kind = access, config, kind
        self.namespaces = namespaces
        self.ledger_name = ledger_name
        self.namespace = settings.ledger_namespace(config.operator_namespace)
        # agent uid -> its ledger as we last wrote it (created by us, so held until forgotten)
        self.handles: Newest[str, LedgerHandle] = Newest(lambda h: version_of(h.resource_version), lambda h: h.uid,
                                                         ours_until_seen=True)

    def forget(self, agent_uid: str) -> None:
        self.handles.forget(agent_uid)

    def added_replicas(self) -> int:
        """What cancer added over all agents and did not revert (the cluster-wide cap's count)."""
        return targets.added_replicas(handle.data for _uid, handle in self.handles.held())

    async def get(self, agent: str, agent_uid: str) -> LedgerHandle:
        """The agent's ledger: from memory after the first read (we are its only writer)."""
        handle = self.handles.current(agent_uid)
        if handle is None:
            handle = await self._read(agent, agent_uid)
            self.handles.remember(agent_uid, handle)
        return handle

    async def _read(self, agent: str, agent_uid: str) -> LedgerHandle:
        namespace, name = self.namespace, self.ledger_name(agent)
        obj = await self.access.read(k8s.SECRET, namespace, name)
        if obj is None:
            return LedgerHandle(namespace, name, decisions.empty_ledger(agent, agent_uid), exists=False)
        meta = obj.get("metadata") or {}
        if settings.LEDGER_LABEL not in (meta.get("labels") or {}):
            raise LedgerTaken(f"{namespace}/{name}", "exists and is not a Blackadder ledger (someone else's Secret)")
        # What a revert undoes comes from here: only a ledger the operator wrote for this agent is read.
        untrusted = decisions.ledger_trust_problem(obj, agent_uid, self.kind.namespaced, namespace)
        if untrusted:
            raise LedgerTaken(f"{namespace}/{name}", untrusted)
        annotations = meta.get("annotations") or {}
        if settings.LEDGER_ABANDONED_ANNOTATION in annotations and not self._ours(obj, agent_uid):
            raise LedgerTaken(f"{namespace}/{name}", "holds what a previous agent of this name could not revert "
                                                      "(kept for an administrator: read it, then delete it)")
        raw: dict[str, Any] | None = None
        encoded = (obj.get("data") or {}).get(settings.LEDGER_KEY)
        if encoded:
            try:
                raw = json.loads(base64.b64decode(encoded))
            except ValueError:
                raw = None  # a hand-edited, broken ledger: start afresh rather than crash-looping
        return LedgerHandle(namespace, name, decisions.normalise_ledger(raw, agent, agent_uid), exists=True,
                            resource_version=meta.get("resourceVersion", ""), uid=meta.get("uid", ""))

    @staticmethod
    def _ours(obj: Mapping[str, Any], agent_uid: str) -> bool:
        encoded = (obj.get("data") or {}).get(settings.LEDGER_KEY)
        if not encoded:
            return False
        try:
            return bool(json.loads(base64.b64decode(encoded)).get("agentUid") == agent_uid)
        except (ValueError, AttributeError):
            return False

    async def save(self, handle: LedgerHandle, abandoned: str = "") -> None:
        """Create or replace with the resourceVersion of our last write (a conflict: someone else
        wrote it; their version is read once and our in-memory ledger, the newer, replaces it).
        ``abandoned``: the agent lets go; the Secret loses its ownerReference and says why."""
        agent, agent_uid = handle.data["agent"], handle.data["agentUid"]
        payload = base64.b64encode(json.dumps(handle.data, separators=(",", ":")).encode()).decode()
        annotations = {settings.LEDGER_AGENT_ANNOTATION: agent}
        if abandoned:
            annotations[settings.LEDGER_ABANDONED_ANNOTATION] = abandoned
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {
                "name": handle.name, "namespace": handle.namespace,
                # A label value stops at 63 characters: long agent names are hashed (full name annotated).
                "labels": {settings.LEDGER_LABEL: settings.ledger_label(agent),
                           **({settings.TENANT_LEDGER_UID_LABEL: agent_uid} if self.kind.namespaced else {})},
                "annotations": annotations,
                # Namespaced dependents may have cluster-scoped owners: the GC removes a forgotten ledger
                # (not an abandoned one: that one stays for an administrator).
                # (A namespaced TenantChaosAgent cannot own a Secret in another namespace: its on.delete
                # handler removes the ledger.)
                "ownerReferences": [] if abandoned or self.kind.namespaced else [{
                    "apiVersion": self.kind.api_version, "kind": self.kind.kind, "name": agent, "uid": agent_uid}],
            },
            "data": {settings.LEDGER_KEY: payload},
        }
        for _attempt in range(3):
            answer: dict[str, Any] | None
            if handle.exists:
                body["metadata"]["resourceVersion"] = handle.resource_version
                try:
                    answer = await self.access.replace(k8s.SECRET, body)
                except k8s.Conflict:
                    answer = None
            else:
                if not self.config.operator_namespace:  # local run: the default namespace may be missing
                    await self._ensure_namespace(handle.namespace)
                body["metadata"].pop("resourceVersion", None)
                try:
                    answer = await self.access.create(k8s.SECRET, body)
                except k8s.AlreadyExists:
                    answer = None
            if answer is not None:
                handle.exists = True
                handle.resource_version = answer["metadata"]["resourceVersion"]
                handle.uid = answer["metadata"].get("uid", "")
                self.handles.remember(agent_uid, handle)
                return
            fresh = await self.access.read(k8s.SECRET, handle.namespace, handle.name)
            if fresh is not None and settings.LEDGER_LABEL not in ((fresh.get("metadata") or {}).get("labels") or {}):
                raise LedgerTaken(f"{handle.namespace}/{handle.name}",
                                  "exists and is not a Blackadder ledger (someone else's Secret)")
            handle.exists = fresh is not None
            handle.resource_version = fresh["metadata"].get("resourceVersion", "") if fresh else ""
            handle.uid = fresh["metadata"].get("uid", "") if fresh else ""
        raise ApiError(409, "Conflict", "the ledger kept conflicting")

    async def _ensure_namespace(self, namespace: str) -> None:
        """Only for the local default (blackadder-system); in a cluster the operator's namespace exists."""
        if namespace in self.namespaces:
            return
        with contextlib.suppress(k8s.AlreadyExists):
            await self.access.create(k8s.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": namespace, "labels": {f"{DOMAIN}/owner": OPERATOR}}})
