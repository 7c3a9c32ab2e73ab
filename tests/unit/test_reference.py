"""docs/reference/ is generated from the sources it describes (testsupport/reference.py): a CRD field,
chart value, environment variable or metric added, renamed or removed without `make reference` fails here."""

from __future__ import annotations

import pytest

from testsupport import paths, reference


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_the_reference_page_matches_its_source(page: str) -> None:
    path = reference.OUT / page
    assert path.exists(), f"docs/reference/{page} is missing: run `make reference`"
    assert path.read_text() == reference.PAGES[page](), f"docs/reference/{page} is out of date: run `make reference`"


def test_every_environment_variable_the_code_reads_is_listed() -> None:
    listed = reference.environment_page()
    for name in ("METRICS_PORT", "CHAOS_DRY_RUN", "REROLLER_RELOAD_STRATEGY", "COPYRATOR_RESYNC_SECONDS"):
        assert f"`{name}`" in listed


def test_the_configuration_guide_names_every_environment_variable() -> None:
    guide = (paths.REPO / "docs" / "configuration.md").read_text()
    missing = [name for name in reference.environment_variables() if name not in guide]
    assert not missing, f"docs/configuration.md does not explain: {', '.join(missing)}"
