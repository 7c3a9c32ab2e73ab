"""`make release` refuses to publish unless every supported minor passed `make compat` on the commit
being released, from a clean tree (release/compat.py reads what cluster/compat.sh records)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from release.compat import problems, supported_versions

COMMIT = "a" * 40


def record(records: Path, version: str, **fields: str) -> None:
    values = {"version": version, "date": "2026-11-28T22:00:00Z", "commit": COMMIT, "uncommitted_changes": "no",
              "result": "passed", "seconds": "600", "summary": "19 passed in 580s", **fields}
    (records / version).write_text("".join(f"{k}={v}\n" for k, v in values.items()))


def test_the_supported_minors_are_1_34_to_1_37_each_once() -> None:
    versions = supported_versions()
    assert [v.rsplit(".", 1)[0] for v in versions] == ["v1.34", "v1.35", "v1.36", "v1.37"]


def test_every_minor_passed_on_this_commit_is_a_release(tmp_path: Path) -> None:
    for version in ("v1.34.4", "v1.35.4"):
        record(tmp_path, version)
    assert problems(["v1.34.4", "v1.35.4"], tmp_path, COMMIT) == []


def test_a_missing_stale_dirty_or_failed_run_refuses_the_release(tmp_path: Path) -> None:
    record(tmp_path, "v1.35.4", commit="b" * 40)
    record(tmp_path, "v1.36.3", uncommitted_changes="yes")
    record(tmp_path, "v1.37.2", result="failed", summary="1 failed, 18 passed")
    found = problems(["v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2"], tmp_path, COMMIT)
    assert found == [
        "Kubernetes v1.34.4: no compatibility run recorded (make compat MINOR=1.34)",
        f"Kubernetes v1.35.4: last run on {'b' * 12}, not on {'a' * 12}",
        f"Kubernetes v1.36.3: the run on {'a' * 12} had uncommitted changes",
        f"Kubernetes v1.37.2: failed on {'a' * 12} (1 failed, 18 passed)",
    ]


def test_the_upgrade_across_minors_is_not_collected_by_make_test() -> None:
    """tests/e2e/test_upgrade_minor.py needs the next minor's build and the real node, and leaves the
    cluster upgraded: only `make compat-upgrade` (pytest -m upgrade) runs it, never the default run."""
    repo = Path(__file__).resolve().parents[2]
    addopts = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "not upgrade" in addopts
    assert "pytestmark = [pytest.mark.upgrade" in (repo / "tests" / "e2e" / "test_upgrade_minor.py").read_text()
    assert "-m upgrade tests/e2e/test_upgrade_minor.py" in (repo / "cluster" / "compat.sh").read_text()


def test_every_test_of_the_subset_exists_and_the_real_node_ones_are_in_it() -> None:
    """cluster/compat.sh names its tests by node id: each names a test module and a test in it (a
    renamed test would leave the subset short), and the subset takes each real-node module it claims
    (the chart on the real node, its upgrade, HA)."""
    repo = Path(__file__).resolve().parents[2]
    script = (repo / "cluster" / "compat.sh").read_text()
    block = re.search(r"^COMPAT_TESTS=\(\n(.*?)^\)", script, re.S | re.M)
    assert block
    ids = [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.strip().startswith("#")]
    for node_id in ids:
        path, _, name = node_id.partition("::")
        assert (repo / path).is_file(), node_id
        if name:
            tree = ast.parse((repo / path).read_text())
            tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
            assert name in tests, node_id
    modules = {node_id.partition("::")[0] for node_id in ids}
    assert {"tests/e2e/test_real_node.py", "tests/e2e/test_upgrade.py", "tests/e2e/test_ha.py",
            "tests/e2e/test_immortal_real_node.py", "tests/e2e/test_blackadder_real_node.py"} <= modules
    assert "REAL_NODE=1" in script
