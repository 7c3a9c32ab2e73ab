"""The Argo CD snippet ships the one health script for each of the three kinds, unchanged."""

from __future__ import annotations

import yaml

from kopf_operators.blackadder import settings
from kopf_operators.copyrator import rules
from kopf_operators.immortal import decisions as immortal
from testsupport.paths import REPO

ARGOCD = REPO / "docs" / "argocd"


def test_argocd_cm_holds_the_health_script_for_each_kind() -> None:
    config_map = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())
    script = (ARGOCD / "health.lua").read_text()
    # Argo CD's key format: resource.customizations.health.<group>_<kind>
    kinds = {(immortal.GROUP, immortal.KIND), (rules.GROUP, rules.KIND), (settings.GROUP, settings.KIND)}
    assert config_map["metadata"]["name"] == "argocd-cm"
    assert config_map["data"] == {f"resource.customizations.health.{group}_{kind}": script for group, kind in kinds}
