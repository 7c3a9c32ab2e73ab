"""The project's one version, written everywhere it must appear, and the check that every place agrees.

    python -m release.version show            print the version (pyproject.toml's, the one source)
    python -m release.version set X.Y.Z       write X.Y.Z into every place (CHANGELOG: Unreleased -> X.Y.Z)
    python -m release.version image REF       record the released image (REGISTRY/NAME:X.Y.Z@sha256:...)
    python -m release.version changes         write Chart.yaml's artifacthub.io/changes from CHANGELOG.md
    python -m release.version signkey URL PUB record the cosign public key (its URL, fingerprint) for Artifact Hub
    python -m release.version check           exit 1 (one line per place) unless every place agrees

The source is `[project] version` in pyproject.toml. Chart and image are versioned together: the chart's
`version` and `appVersion` are the project's version, and the image tag is the appVersion. The places that
name the released image (the kustomization's `images:` entry and Artifact Hub's `artifacthub.io/images`)
carry its tag and its digest, written by `image` once the release has pushed it. manifests/operator.yaml
is generated from the chart (`make manifests`, which `make version` runs after `set`).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"
CHART = REPO / "charts" / "kopf-operators" / "Chart.yaml"
KUSTOMIZATION = REPO / "manifests" / "kustomization.yaml"
OPERATOR_YAML = REPO / "manifests" / "operator.yaml"
CHANGELOG = REPO / "CHANGELOG.md"
README = REPO / "README.md"
IMAGE_NAME = "kopf-operators"  # the image's name in the chart's default values and in operator.yaml
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$")
# The digest is optional between `set` and `image` (a version set, its image not pushed yet).
IMAGE_REF = re.compile(r"^(?P<name>[^@\s]+/" + IMAGE_NAME + r"):(?P<tag>[^@\s]+)(@(?P<digest>sha256:[0-9a-f]{64}))?$")


def source_version() -> str:
    return str(tomllib.loads(PYPROJECT.read_text())["project"]["version"])


def released_image() -> str:
    """The image the kustomization names: REGISTRY/kopf-operators:TAG@DIGEST."""
    doc = yaml.safe_load(KUSTOMIZATION.read_text())
    (entry,) = [i for i in doc.get("images") or [] if i.get("name") == IMAGE_NAME]
    digest = f"@{entry['digest']}" if entry.get("digest") else ""
    return f"{entry['newName']}:{entry['newTag']}{digest}"


def places() -> dict[str, str]:
    """Every place a version is written -> the version written there."""
    chart = yaml.safe_load(CHART.read_text())
    found = {
        "pyproject.toml [project] version": source_version(),
        "Chart.yaml version": str(chart["version"]),
        "Chart.yaml appVersion (the image tag)": str(chart["appVersion"]),
    }
    match = IMAGE_REF.match(released_image())
    found["manifests/kustomization.yaml images[].newTag"] = match["tag"] if match else "(not REGISTRY/NAME:TAG@DIGEST)"
    images = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    for image in images:
        match = IMAGE_REF.match(image["image"])
        found[f"Chart.yaml artifacthub.io/images {image['name']}"] = match["tag"] if match else "(no TAG@DIGEST)"
    operator = OPERATOR_YAML.read_text()
    for label in sorted(set(re.findall(r'app\.kubernetes\.io/version: "?([^"\s]+)"?', operator))):
        found[f"manifests/operator.yaml app.kubernetes.io/version {label}"] = label
    for image in sorted(set(re.findall(r'image: "?' + IMAGE_NAME + r':([^"\s]+)"?', operator))):
        found[f"manifests/operator.yaml image {IMAGE_NAME}:{image}"] = image
    readme = README.read_text()
    for flag in sorted(set(re.findall(r"helm install [^\n]*oci://\S+ --version (\S+)", readme))):
        found[f"README.md helm install --version {flag}"] = flag
    for tag in sorted(set(re.findall(r"\$REGISTRY/kopf-operators:(\S+)", readme))):
        found[f"README.md $REGISTRY/kopf-operators:{tag}"] = tag
    return found


KINDS = {"Added": "added", "Changed": "changed", "Deprecated": "deprecated", "Removed": "removed",
         "Fixed": "fixed", "Security": "security"}


def changelog_changes(version: str) -> list[dict[str, str]]:
    """The CHANGELOG.md section of a release as Artifact Hub's `changes`: one entry per top-level item,
    its kind from the Keep a Changelog heading it is under, nested items folded into its description."""
    section = re.search(r"^## \[" + re.escape(version) + r"\][^\n]*\n(.*?)(?=^## |\Z)", CHANGELOG.read_text(),
                        re.M | re.S)
    if not section:
        raise SystemExit(f"CHANGELOG.md has no section for {version}")
    changes: list[dict[str, str]] = []
    kind = None
    for line in section[1].splitlines():
        if heading := re.match(r"^### (\w+)", line):
            kind = KINDS.get(heading[1])
            if kind is None:
                raise SystemExit(f"CHANGELOG.md {version}: {heading[1]!r} is not a Keep a Changelog kind")
        elif line.startswith("- ") and kind:
            changes.append({"kind": kind, "description": line[2:].strip()})
        elif line.strip() and changes and line.startswith(" "):
            changes[-1]["description"] += " " + line.strip().removeprefix("- ")
    return changes


def chart_changes_block(version: str) -> str:
    """The `artifacthub.io/changes` annotation's lines for Chart.yaml."""
    text = yaml.safe_dump(changelog_changes(version), sort_keys=False, width=1_000_000, allow_unicode=True)
    return "  artifacthub.io/changes: |\n" + "".join(f"    {line}\n" for line in text.splitlines())


def disagreements() -> list[str]:
    version = source_version()
    problems = [f"{where}: {value} (pyproject.toml says {version})" for where, value in places().items()
                if value != version]
    released = re.search(r"^## \[(?P<v>[^\]]+)\] - \d{4}-\d{2}-\d{2}$", CHANGELOG.read_text(), re.M)
    if not released or released["v"] != version:
        problems.append(f"CHANGELOG.md: the newest release is {released['v'] if released else None}, not {version}")
    else:
        changes = yaml.safe_load(yaml.safe_load(CHART.read_text())["annotations"].get("artifacthub.io/changes", "[]"))
        if changes != changelog_changes(version):
            problems.append(f"Chart.yaml artifacthub.io/changes: not CHANGELOG.md's {version} section")
    return problems


def _edit(path: Path, edit: Callable[[str], str]) -> None:
    text = path.read_text()
    path.write_text(edit(text))


def _sub1(pattern: str, repl: str, flags: int = re.M) -> Callable[[str], str]:
    def edit(text: str) -> str:
        new, count = re.subn(pattern, repl, text, flags=flags)
        if count == 0:
            raise SystemExit(f"pattern {pattern!r} not found")
        return new
    return edit


def set_version(version: str, today: datetime.date) -> None:
    if not SEMVER.match(version):
        raise SystemExit(f"{version!r} is not a semantic version X.Y.Z")
    old = source_version()
    if version == old:
        raise SystemExit(f"the version is already {version}")
    _edit(PYPROJECT, _sub1(r'^version = "[^"]*"$', f'version = "{version}"'))
    _edit(CHART, lambda t: _sub1(r'^appVersion: .*$', f'appVersion: "{version}"')(
        _sub1(r"^version: .*$", f"version: {version}")(t)))
    # The released image's tag; its digest is known once the release has pushed it (`image`): until
    # then the old version's digest would name the wrong image, so it goes.
    name = IMAGE_REF.match(released_image())
    if not name:
        raise SystemExit(f"{KUSTOMIZATION.relative_to(REPO)}: no REGISTRY/{IMAGE_NAME} image entry")
    _write_image(f"{name['name']}:{version}")
    if re.search(r"--version \S+", README.read_text()):
        _edit(README, _sub1(r"(helm install [^\n]*oci://\S+ --version )\S+", rf"\g<1>{version}"))
    if "$REGISTRY/kopf-operators:" in README.read_text():
        _edit(README, _sub1(r"(\$REGISTRY/kopf-operators:)\S+", rf"\g<1>{version}"))
    heading = f"## [{version}] - {today.isoformat()}"
    _edit(CHANGELOG, _sub1(r"^## \[Unreleased\]\n", f"## [Unreleased]\n\n{heading}\n"))
    write_changes(version)


def write_changes(version: str) -> None:
    """Chart.yaml's `artifacthub.io/changes`: the version's CHANGELOG.md section."""
    block = chart_changes_block(version)
    text = CHART.read_text()
    new, count = re.subn(r"^  artifacthub\.io/changes: \|\n(    .*\n)+", block, text, flags=re.M)
    if count == 0:
        new = re.sub(r"^annotations:\n", "annotations:\n" + block, text, count=1, flags=re.M)
    CHART.write_text(new)


def set_image(ref: str) -> None:
    match = IMAGE_REF.match(ref)
    if not match or not match["digest"]:
        raise SystemExit(f"{ref!r} is not REGISTRY/{IMAGE_NAME}:TAG@sha256:DIGEST")
    if match["tag"] != source_version():
        raise SystemExit(f"{ref}: its tag is not the version {source_version()}")
    _write_image(ref)


def _write_image(ref: str) -> None:
    match = IMAGE_REF.match(ref)
    assert match, ref
    entry = f"  - name: {IMAGE_NAME}\n    newName: {match['name']}\n    newTag: \"{match['tag']}\"\n"
    if match["digest"]:
        entry += f"    digest: {match['digest']}\n"
    _edit(KUSTOMIZATION, _sub1(r"^  - name: " + IMAGE_NAME + r"\n(    \S.*\n)+", entry))
    _edit(CHART, _sub1(r"(- name: kopf-operators\n\s+image: )\S+", rf"\g<1>{ref}", 0))


def sign_key_fingerprint(public_key_pem: str) -> str:
    """The SHA-256 of the key's DER bytes (what `openssl pkey -pubin -outform DER | sha256sum` prints)."""
    body = "".join(line for line in public_key_pem.strip().splitlines() if not line.startswith("-----"))
    return hashlib.sha256(base64.b64decode(body)).hexdigest().upper()


def set_sign_key(url: str, public_key: Path) -> None:
    """Chart.yaml's `artifacthub.io/signKey`: where users find the cosign public key, and its fingerprint."""
    block = (f"  artifacthub.io/signKey: |\n    fingerprint: {sign_key_fingerprint(public_key.read_text())}\n"
             f"    url: {url}\n")
    text = CHART.read_text()
    new, count = re.subn(r"^  artifacthub\.io/signKey: \|\n(    .*\n)+", block, text, flags=re.M)
    if count == 0:
        new = re.sub(r"^annotations:\n", "annotations:\n" + block, text, count=1, flags=re.M)
    CHART.write_text(new)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("show")
    sub.add_parser("check")
    sub.add_parser("changes")
    sub.add_parser("set").add_argument("version")
    sub.add_parser("image").add_argument("ref")
    signkey = sub.add_parser("signkey")
    signkey.add_argument("url")
    signkey.add_argument("public_key", type=Path)
    args = parser.parse_args()
    if args.command == "show":
        print(source_version())
    elif args.command == "set":
        set_version(args.version, datetime.datetime.now(datetime.UTC).date())
    elif args.command == "changes":
        write_changes(source_version())
    elif args.command == "image":
        set_image(args.ref)
    elif args.command == "signkey":
        set_sign_key(args.url, args.public_key)
    else:
        problems = disagreements()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            return 1
        print(f"every place says {source_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
