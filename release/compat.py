"""Whether every supported Kubernetes minor passed `make compat` on the commit being released.

    python -m release.compat check    exit 1 (one line per minor) unless each passed on HEAD, from a clean tree

`make compat` (cluster/compat.sh) records one file per minor in .compat/<version>: ``key=value`` lines
(version, date, commit, uncommitted_changes, result, seconds, summary). The supported minors are
cluster/versions.env's COMPAT_VERSIONS. release/release.sh runs the check before it builds anything.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VERSIONS_ENV = REPO / "cluster" / "versions.env"
RECORDS = REPO / ".compat"


def supported_versions(versions_env: Path = VERSIONS_ENV) -> list[str]:
    match = re.search(r'^COMPAT_VERSIONS="([^"]+)"$', versions_env.read_text(), re.M)
    if not match:
        raise SystemExit(f"no COMPAT_VERSIONS in {versions_env}")
    return match.group(1).split()


def read_record(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def problems(versions: list[str], records: Path, commit: str) -> list[str]:
    """One line per minor that has not passed on ``commit`` from a clean tree; none when all have."""
    out = []
    for version in versions:
        path, minor = records / version, version[1:].rsplit(".", 1)[0]
        if not path.is_file():
            out.append(f"Kubernetes {version}: no compatibility run recorded (make compat MINOR={minor})")
            continue
        record = read_record(path)
        if record.get("commit") != commit:
            out.append(f"Kubernetes {version}: last run on {record.get('commit', '?')[:12]}, not on {commit[:12]}")
        elif record.get("uncommitted_changes") != "no":
            out.append(f"Kubernetes {version}: the run on {commit[:12]} had uncommitted changes")
        elif record.get("result") != "passed":
            result, summary = record.get("result", "?"), record.get("summary", "")
            out.append(f"Kubernetes {version}: {result} on {commit[:12]} ({summary})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.compat")
    parser.add_argument("command", choices=["check"])
    parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    found = problems(supported_versions(), RECORDS, commit)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
