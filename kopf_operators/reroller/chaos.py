"""Chaos during a progression (pure): which workloads a ChaosAgent disrupts now, from the agents'
``status.disrupting`` (Blackadder writes it once per cycle), so that a progression's health gate can
tell a workload the chaos disrupts from one that fails by itself. The re-roller knows Blackadder only
through that status field: no code of Blackadder's is imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.core import api as k8s
from kopf_operators.core.conventions import epoch_to_iso, iso_to_epoch

# Blackadder's CRD, by name only. Listed (REROLLER_CHAOS_AWARE: the chart sets it when Blackadder, and so
# its CRD, is installed), never watched through Kopf: a Kopf watch of a resource for which a process has
# no handler that needs a finalizer removes Kopf's finalizer from its objects, and that finalizer is
# Blackadder's revert on delete when the operators run as separate processes.
CHAOS_AGENTS = k8s.Kind("blackadder.io/v1beta1", "chaosagents", "ChaosAgent")
Disruptions = Mapping[tuple[str, str, str], Iterable[tuple[str, float]]]  # object -> (agent, until epoch)

WorkloadKey = tuple[str, str, str]  # (kind, namespace, name)


def disruptions(agents: Iterable[Mapping[str, Any]]) -> dict[WorkloadKey, list[tuple[str, float]]]:
    """What the listed ChaosAgents disrupt: object -> (agent, until) of each agent that names it."""
    found: dict[WorkloadKey, list[tuple[str, float]]] = {}
    for agent in agents:
        name = str((agent.get("metadata") or {}).get("name") or "")
        for key, entry in chaos_index_entries(name, agent.get("status")).items():
            found.setdefault(key, []).append(entry)
    return found


def chaos_index_entries(name: str, status: Mapping[str, Any] | None) -> dict[WorkloadKey, tuple[str, float]]:
    """One ChaosAgent's index entries: each object its recent cycles disrupted -> (the agent's name,
    until when, epoch seconds). Malformed entries are left out (the status is the agent's, not ours)."""
    entries: dict[WorkloadKey, tuple[str, float]] = {}
    disrupting = (status or {}).get("disrupting")
    if not isinstance(disrupting, list):
        return entries
    for entry in disrupting:
        if not isinstance(entry, Mapping):
            continue
        until = iso_to_epoch(entry.get("until"))
        key = (str(entry.get("kind") or ""), str(entry.get("namespace") or ""), str(entry.get("name") or ""))
        if until is not None and key[0] and key[2]:
            entries[key] = (name, max(until, entries.get(key, ("", 0.0))[1]))
    return entries


def disrupted_by(index: Disruptions | None, key: WorkloadKey, now: float) -> str | None:
    """Who disrupts this workload now: "ChaosAgent <name> (until <iso>)" for the agent whose
    disruption of it lasts longest, or None (no agent, or every disruption has ended; no index: the
    re-roller is not chaos-aware)."""
    if not index:
        return None
    values: Iterable[Any] = index.get(key) or ()
    live = [(until, agent) for agent, until in values if until > now]
    if not live:
        return None
    until, agent = max(live)
    return f"ChaosAgent {agent} (until {epoch_to_iso(until)})"
