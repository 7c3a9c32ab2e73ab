"""The chart claims the Kubernetes minors the project tests: its kubeVersion's lowest minor is the lowest
of cluster/versions.env's COMPAT_VERSIONS (each tested by `make compat` before a release), CI's minor
(KUBERNETES_VERSION) is one of them, and the README names both."""

from __future__ import annotations

import re

import yaml

from release.compat import supported_versions
from testsupport.paths import REPO


def minor(version: str) -> str:
    return re.sub(r"^v(\d+\.\d+)\.\d+$", r"\1", version)


def minor_under_test() -> str:
    text = (REPO / "cluster" / "versions.env").read_text()
    match = re.search(r"^KUBERNETES_VERSION=v(\d+\.\d+)\.\d+$", text, re.M)
    assert match, "KUBERNETES_VERSION missing from cluster/versions.env"
    return match.group(1)


def test_the_chart_claims_the_lowest_minor_make_compat_tests_and_nothing_older() -> None:
    chart = yaml.safe_load((REPO / "charts" / "kopf-operators" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={minor(supported_versions()[0])}.0-0"


def test_ci_tests_one_of_the_supported_minors() -> None:
    assert minor_under_test() in [minor(v) for v in supported_versions()]


def test_the_readme_names_the_tested_minors() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"Kubernetes **v{minor_under_test()}**" in readme
    versions = supported_versions()
    assert f"Kubernetes **v{minor(versions[0])} to v{minor(versions[-1])}**" in readme
