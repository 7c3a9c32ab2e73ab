"""The chart claims only the Kubernetes versions CI tests: its kubeVersion's lowest minor is the one
cluster/versions.env builds and every end-to-end test runs against, and the README names it."""

from __future__ import annotations

import re

import yaml

from testsupport.paths import REPO


def minor_under_test() -> str:
    text = (REPO / "cluster" / "versions.env").read_text()
    match = re.search(r"^KUBERNETES_VERSION=v(\d+\.\d+)\.\d+$", text, re.M)
    assert match, "KUBERNETES_VERSION missing from cluster/versions.env"
    return match.group(1)


def test_the_chart_claims_the_tested_minor_and_nothing_older() -> None:
    chart = yaml.safe_load((REPO / "charts" / "kopf-operators" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={minor_under_test()}.0-0"


def test_the_readme_names_the_tested_minor() -> None:
    assert f"Kubernetes **v{minor_under_test()}**" in (REPO / "README.md").read_text()
