"""The documentation's promises about itself: a short README, and a troubleshooting entry for every
failure mode the objects report."""

from __future__ import annotations

import re

from testsupport.paths import REPO

DOCS = REPO / "docs"


def test_the_readme_is_a_front_page() -> None:
    words = len((REPO / "README.md").read_text().split())
    assert words <= 1200, f"README.md has {words} words; the manual's place is docs/"


def stalled_reasons() -> set[str]:
    """Every reason in the Stalled column of observability.md's per-kind table."""
    text = (DOCS / "observability.md").read_text()
    table = text[text.index("### Per kind"):text.index("### Waiting on it")]
    reasons: set[str] = set()
    for row in table.splitlines():
        cells = row.split("|")
        if len(cells) > 4 and not set(cells[4].strip()) <= {"-"}:
            reasons.update(re.findall(r"`([A-Z][A-Za-z]+)`", cells[4]))
    return reasons


def test_every_stalled_reason_has_a_troubleshooting_entry() -> None:
    reasons = stalled_reasons()
    assert {"ForeignPod", "ForeignObject", "InvalidSpec"} <= reasons  # the table was read
    guide = (DOCS / "troubleshooting.md").read_text()
    missing = sorted(r for r in reasons if f"reason `{r}`" not in guide)
    assert not missing, f"docs/troubleshooting.md has no entry for: {', '.join(missing)}"
