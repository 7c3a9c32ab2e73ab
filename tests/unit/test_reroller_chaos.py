"""The re-roller's view of chaos: its index of ChaosAgents' status.disrupting, and disrupted_by (pure)."""

from __future__ import annotations

from kopf_operators.core.conventions import epoch_to_iso
from kopf_operators.reroller.chaos import chaos_index_entries, disrupted_by

NOW = 1_800_000_000.0
WEB = ("Deployment", "shop", "web")


def test_an_agents_status_becomes_its_index_entries() -> None:
    status = {"disrupting": [{"kind": "Deployment", "namespace": "shop", "name": "web", "until": epoch_to_iso(NOW)},
                             {"kind": "ConfigMap", "namespace": "shop", "name": "cfg", "until": "not a time"},
                             {"kind": "Deployment", "name": ""}, "garbage"]}
    assert chaos_index_entries("monkey", status) == {WEB: ("monkey", NOW)}
    assert chaos_index_entries("monkey", {}) == {}
    assert chaos_index_entries("monkey", None) == {}
    assert chaos_index_entries("monkey", {"disrupting": "nonsense"}) == {}


def test_disrupted_by_names_the_agent_whose_disruption_lasts_longest() -> None:
    index = {WEB: [("monkey", NOW + 60), ("gremlin", NOW + 600), ("old", NOW - 1)]}
    assert disrupted_by(index, WEB, NOW) == f"ChaosAgent gremlin (until {epoch_to_iso(NOW + 600)})"


def test_no_agent_an_ended_disruption_or_no_index_is_none() -> None:
    index = {WEB: [("old", NOW - 1)]}
    assert disrupted_by(index, WEB, NOW) is None
    assert disrupted_by(index, ("Deployment", "shop", "other"), NOW) is None
    assert disrupted_by({}, WEB, NOW) is None
    assert disrupted_by(None, WEB, NOW) is None
