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


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        found.add(slug)
    return found


def test_no_doc_names_an_issue_number() -> None:
    """The docs are a manual: what the software does, not the history of how it was built."""
    pages = [REPO / "README.md", *DOCS.rglob("*.md")]
    # A peer's issue or PR is named with its repository (owner/repo#N, then maybe ", #M"; "Reloader PR#N";
    # "R#N"; "kopf#N"): those are references a user can follow, not this project's history.
    peer = re.compile(r"[\w-]+#\d+(?:,? (?:and )?#\d+)*")
    pattern = re.compile(r"#\d{1,3}\b|\bissues? #?\d+\b", re.I)
    found = [f"{page.relative_to(REPO)}: {line.strip()[:80]}" for page in pages
             for line in page.read_text().splitlines() if pattern.search(peer.sub("", line))]
    assert not found, "\n".join(found)


def test_every_link_to_a_heading_of_another_page_resolves() -> None:
    broken = []
    for page in [REPO / "README.md", *DOCS.rglob("*.md")]:
        for target, anchor in re.findall(r"\]\(([\w./-]+\.md)#([\w-]+)\)", page.read_text()):
            linked = (page.parent / target).resolve()
            if not linked.exists() or anchor not in anchors(linked.read_text()):
                broken.append(f"{page.relative_to(REPO)} -> {target}#{anchor}")
    assert not broken, "\n".join(broken)
