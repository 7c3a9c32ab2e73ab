"""Blackadder's revert: restore what an agent changed (scaled Deployments, overwritten ConfigMaps) from
its ledger, but only what still shows what the agent wrote; and, when a revert on delete keeps being
refused, let go of the agent and keep its ledger for an administrator.

Revert is rare and must see the objects as they are now: it reads each one (the only reads of targets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kopf_operators.blackadder import decisions
from kopf_operators.blackadder.cycle import ref
from kopf_operators.blackadder.ledger import LedgerHandle, LedgerStore
from kopf_operators.blackadder.notify import Logger, Notifications
from kopf_operators.blackadder.settings import LEDGER_KEY, AgentSettings
from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.conventions import now_iso

OPERATOR = "blackadder"


class RevertIncomplete(Exception):
    """Some ledger entries could not be restored this time (kept in the ledger for the next try)."""

    def __init__(self, failed: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{f['key']}: {f['error']}" for f in failed))
        self.failed = failed

    @property
    def refused(self) -> bool:
        """Every failure was a refusal (403, 422 on our write, ...), not the API being unreachable."""
        return all(f.get("status") and f["status"] < 500 and f["status"] != 429 for f in self.failed)



class Reverter:
    """The revert of one controller's agents."""

    def __init__(self, access: Access, ledgers: LedgerStore, notes: Notifications) -> None:
        self.access, self.ledgers, self.notes = access, ledgers, notes

    async def revert_all(self, body: Mapping[str, Any], handle: LedgerHandle, settings: AgentSettings,
                         log: Logger) -> dict[str, Any]:
        """Restore every ledger entry that still shows what we wrote; report the others. Under the
        agent's lock. Dry-run: report what would be restored, keep the ledger as it is. Revert is rare
        and must see the objects as they are now: it reads each one (the only reads of targets)."""
        ledger = handle.data
        undo: dict[str, Any] = ledger.get("undo", {})
        restored: list[str] = []
        changed: list[str] = []
        gone: list[str] = []
        outside: list[str] = []  # never the agent's to restore (a namespace it may not target): dropped
        failed: list[dict[str, Any]] = []  # refused or unreachable: kept in the ledger, tried again
        now = now_iso()
        for key in sorted(undo):
            entry = undo[key]
            is_dep = entry["kind"] == "Deployment"
            kind = k8s.DEPLOYMENT if is_dep else k8s.CONFIGMAP
            ns, nm = entry["namespace"], entry["name"]
            what = f"{entry['kind']} {ns}/{nm}"
            # Whatever the ledger says, a revert writes only where the agent may act now.
            refusal = decisions.revert_refusal(entry, settings, self.ledgers.config.operator_namespace)
            if refusal:
                outside.append(key)
                metrics.error(OPERATOR, "revert-refused")
                self.notes.announce(body, None, "Warning", "RevertRefused", f"not restoring {what}: {refusal}", log)
                if not settings.dry_run:
                    decisions.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                               "name": nm, "outcome": "refused"})
                continue
            try:
                verdict, target = await self._revert_one(body, entry, kind, settings, restored, key, ledger, now, log)
            except ApiError as exc:
                failed.append({"key": key, "status": exc.status, "error": str(exc)})
                metrics.error(OPERATOR, "revert")
                self.notes.announce(body, None, "Warning", "RevertFailed", f"could not restore {what}: {exc}", log)
                if not settings.dry_run:
                    decisions.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                               "name": nm, "outcome": f"failed: {exc}"})
                continue
            if verdict == decisions.CHANGED:
                changed.append(key)
                self.notes.announce(body, target, "Warning", "RevertSkipped",
                                    f"not restoring {what}: it was changed since the agent wrote it", log)
            elif verdict == decisions.GONE:
                gone.append(key)
                self.notes.announce(body, None, "Warning", "RevertSkipped",
                                    f"not restoring {what}: it no longer exists", log)
            if not settings.dry_run and verdict in (decisions.CHANGED, decisions.GONE):
                decisions.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                           "name": nm, "outcome": verdict})
        if not settings.dry_run and undo:
            ledger["undo"] = {f["key"]: undo[f["key"]] for f in failed}
            await self.ledgers.save(handle)
        summary = {"at": now, "dryRun": settings.dry_run, "processed": len(undo), "restored": restored[:50],
                   "changed": changed[:50], "gone": gone[:50], "failed": failed[:50]}
        return {**summary, "refused": outside[:50]} if outside else summary

    async def _revert_one(self, body: Mapping[str, Any], entry: Mapping[str, Any], kind: k8s.Kind,
                          settings: AgentSettings, restored: list[str], key: str, ledger: dict[str, Any],
                          now: str, log: Logger) -> tuple[str, dict[str, Any] | None]:
        """One ledger entry: (verdict, the target for Events). Raises ApiError when refused."""
        is_dep = entry["kind"] == "Deployment"
        ns, nm = entry["namespace"], entry["name"]
        what = f"{entry['kind']} {ns}/{nm}"
        current = await self.access.read(kind, ns, nm)
        verdict = decisions.revert_verdict(entry, current)
        target = ref(entry["kind"], kind.api_version, ns, nm, entry["uid"]) if current else None
        if verdict == decisions.RESTORE and current is not None:
            if settings.dry_run:
                restored.append(key)
                self.notes.announce(body, target, "Normal", "WouldRevert", f"dry-run: would restore {what}", log)
                return verdict, target
            try:
                if is_dep:
                    answer = await self.access.patch(kind, ns, nm, decisions.scale_patch(entry["written"],
                                                                                         entry["before"]),
                                                     subresource="scale", json_patch=True)
                    detail = f"replicas back to {entry['before']}"
                else:
                    # A merge patch: keys we wrote get their old values back; nothing else is touched.
                    answer = await self.access.patch(kind, ns, nm, {
                        "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                        "data": entry["before"]})
                    detail = "data restored"
            except ApiError as exc:
                if exc.status not in (409, 422):  # changed between our read and our write
                    raise
                verdict = decisions.CHANGED
            else:
                if answer is None:
                    verdict = decisions.GONE
                else:
                    restored.append(key)
                    metrics.action(OPERATOR, "reverted")
                    decisions.journal(ledger, {"at": now, "mode": "revert", "kind": entry["kind"], "namespace": ns,
                                               "name": nm, "outcome": "restored"})
                    self.notes.announce(body, target, "Normal", "Reverted", f"restored {what}: {detail}", log)
        return verdict, target

    async def abandon(self, body: Mapping[str, Any], handle: LedgerHandle, summary: Mapping[str, Any],
                       attempts: int, log: Logger) -> None:
        """Let go of an agent whose revert keeps being refused: keep its ledger for an administrator."""
        where = f"{handle.namespace}/{handle.name}"
        left = ", ".join(f"{f['key']} ({f['error']})" for f in summary["failed"])
        await self.ledgers.save(handle, abandoned=f"revert refused {attempts} times: {left}"[:1000])
        message = (f"gave up reverting after {attempts} attempts; NOT restored: {left}. Their original state "
                   f"stays in the ledger Secret {where} (key {LEDGER_KEY}, field undo), kept after the agent "
                   "is gone; restore by hand, then delete that Secret")
        metrics.error(OPERATOR, "revert-abandoned")
        self.notes.announce(body, None, "Warning", "RevertAbandoned", message, log)
        await self.notes.patch_status(body["metadata"], {
            "revert": {**summary, "abandoned": True, "ledger": where},
            "state": "RevertAbandoned"})
