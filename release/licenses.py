"""Check that every installed dependency's licence allows shipping this project under Apache-2.0.

    python -m release.licenses

Reads each distribution's metadata in the running environment (License-Expression, else License, else
the licence classifiers) and maps it to SPDX identifiers. The runtime dependencies (the project's
requirements without extras, followed through the installed distributions: what the image ships) must
be permissive or weak (file-level) copyleft; the development tools are never shipped or linked into the
package, so a tool run as its own program (hadolint, GPL-3.0) is allowed there. A licence this script
cannot name fails the check: a new dependency is read by a person once and added to OVERRIDES with the
reason. Exit 0 when every dependency is allowed, 1 otherwise (one line each).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import sys

from packaging.requirements import Requirement

PROJECT = "kopf-operators"
# Permissive licences, and MPL-2.0 (file-level copyleft: shipping its files unmodified is allowed).
RUNTIME_ALLOWED = frozenset(
    {"Apache-2.0", "MIT", "BSD-2-Clause", "BSD-3-Clause", "ISC", "PSF-2.0", "MPL-2.0", "Unlicense", "0BSD"}
)
# Development tools are run, not shipped or imported by the package.
DEV_ALLOWED = RUNTIME_ALLOWED | {"GPL-3.0-only", "GPL-3.0-or-later", "LGPL-3.0-or-later"}

# Free-text License fields and classifiers, as distributions write them, to SPDX.
TEXT_TO_SPDX = {
    "apache 2.0": "Apache-2.0", "apache-2.0": "Apache-2.0", "apache": "Apache-2.0",
    "apache software license": "Apache-2.0", "apache license 2.0": "Apache-2.0",
    "mit": "MIT", "mit license": "MIT", "bsd-3-clause": "BSD-3-Clause", "bsd-2-clause": "BSD-2-Clause",
    "isc": "ISC", "isc license (iscl)": "ISC", "psf-2.0": "PSF-2.0", "python software foundation license": "PSF-2.0",
    "mpl-2.0": "MPL-2.0", "mozilla public license 2.0 (mpl 2.0)": "MPL-2.0", "gpl-3.0": "GPL-3.0-only",
}
# Read by hand from the distribution's licence file, where its metadata is missing or ambiguous.
OVERRIDES = {
    "promql-parser": ("MIT", "no licence metadata; its LICENSE file is the MIT licence"),
    "lupa": ("MIT", 'License: "MIT style"; its LICENSE.txt is the MIT licence'),
    "pykube-ng": ("Apache-2.0", "also classified 'Other/Proprietary'; its LICENSE file is Apache-2.0"),
    "requests-oauthlib": ("ISC", "classified 'BSD License'; its License field says ISC"),
    "setuptools": ("MIT", "old wheels: only the MIT classifier"),
    "pathspec": ("MPL-2.0", "only the MPL 2.0 classifier"),
    "google-re2": ("BSD-3-Clause", "only the 'BSD License' classifier; its LICENSE file is BSD-3-Clause"),
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def spdx_ids(dist: md.Distribution) -> tuple[set[str], str]:
    """The SPDX identifiers a distribution is offered under (any one may be chosen for OR), and where from."""
    meta = dist.metadata.json  # one key per field; lists for repeated ones
    name = canonical(str(meta["name"]))
    if name in OVERRIDES:
        return {OVERRIDES[name][0]}, "override: " + OVERRIDES[name][1]
    expression = str(meta.get("license_expression") or "")
    if expression:
        # "A AND B": both apply (both must be allowed); "A OR B": either (one must be).
        if " OR " in expression:
            return {part.strip("() ") for part in expression.split(" OR ")}, "License-Expression (OR)"
        return {part.strip("() ") for part in expression.split(" AND ")}, "License-Expression"
    text = str(meta.get("license") or "").strip().lower()
    if text in TEXT_TO_SPDX:
        return {TEXT_TO_SPDX[text]}, "License"
    classifiers = [c.rsplit("::", 1)[1].strip().lower() for c in meta.get("classifier") or []
                   if c.startswith("License :: OSI Approved ::")]
    ids = {TEXT_TO_SPDX[c] for c in classifiers if c in TEXT_TO_SPDX}
    if ids:
        return ids, "classifiers"
    return set(), "unknown"


def runtime_names(project: str = PROJECT) -> set[str]:
    """The installed distributions the project needs at run time: its requirements (no extras), recursively."""
    seen: set[str] = set()
    todo = [project]
    while todo:
        for line in md.requires(todo.pop()) or []:
            requirement = Requirement(line)
            # Not here: an optional extra (the project's dev tools, a dependency's optional parts) or another
            # platform's or Python's requirement.
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            name = canonical(requirement.name)
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def check(runtime: set[str]) -> list[tuple[str, str, str, str, bool]]:
    """(name, version, licence, source, allowed) for every distribution installed here but the project."""
    rows = []
    for dist in md.distributions():
        name = canonical(dist.metadata["Name"])
        if name == PROJECT:
            continue
        ids, source = spdx_ids(dist)
        allowed_set = RUNTIME_ALLOWED if name in runtime else DEV_ALLOWED
        # OR: one of them must be allowed; otherwise every one that applies.
        ok = bool(ids & allowed_set) if source.endswith("(OR)") else bool(ids) and ids <= allowed_set
        rows.append((name, dist.version, " / ".join(sorted(ids)) or "?", source, ok))
    return sorted(rows)


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    runtime = runtime_names()
    bad = 0
    for name, version, licence, source, ok in check(runtime):
        kind = "runtime" if name in runtime else "dev"
        print(f"{'ok ' if ok else 'BAD'} {kind:7} {name}=={version}: {licence} ({source})")
        bad += not ok
    if bad:
        print(f"{bad} dependenc{'y' if bad == 1 else 'ies'} with a licence not allowed (or not known) here",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
