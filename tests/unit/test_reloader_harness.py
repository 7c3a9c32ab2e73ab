"""The Reloader e2e harness maps Reloader's Helm values onto our options (tests/reloader_e2e.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.reloader_e2e import (
    HARNESS_NAMESPACE,
    RACE_FREE_PATCH,
    PatchDoesNotApply,
    helm_values,
    operator_options,
    race_free_tree,
    reloader_flags,
    spec_timeline,
)
from testsupport import peer_build

INSTALL = ["upgrade", "--install", "reloader-x", "/chart", "--namespace", "suite-ns", "--create-namespace",
           "--set", "image.tag=test", "--set", "reloader.reloadStrategy=annotations"]


def test_helm_values() -> None:
    assert helm_values([*INSTALL, "--set", "reloader.autoReloadAll=true"]) == (
        "upgrade", "suite-ns", {"image.tag": "test", "reloader.reloadStrategy": "annotations",
                                "reloader.autoReloadAll": "true"})


def test_values_map_onto_our_options() -> None:
    values = {"reloader.autoReloadAll": "true", "reloader.ignoreJobs": "true", "reloader.ignoreCronJobs": "true",
              "reloader.ignoreSecrets": "true", "reloader.namespaceSelector": "env=test",
              "reloader.watchGlobally": "false", "image.tag": "test"}
    env, scope, unmapped = operator_options("suite-ns", values)
    assert env == {"REROLLER_AUTO_RELOAD_ALL": "true", "REROLLER_IGNORED_WORKLOAD_TYPES": "jobs,cronjobs",
                   "REROLLER_RESOURCES_TO_IGNORE": "secrets", "REROLLER_NAMESPACE_SELECTOR": "env=test"}
    assert scope == ["--namespace=suite-ns"] and unmapped == []
    _, scope, _ = operator_options("suite-ns", {"reloader.watchGlobally": "false", "reloader.namespaces": "{a,b}"})
    assert scope == ["--namespace=a", "--namespace=b", "--namespace=suite-ns"]
    env, scope, unmapped = operator_options("suite-ns", {"reloader.reloadStrategy": "env-vars", "reloader.x": "1",
                                                         "reloader.isArgoRollouts": "true"})
    assert env == {"REROLLER_RELOAD_STRATEGY": "env-vars", "REROLLER_ARGO_ROLLOUTS": "true"}
    assert scope == ["--all-namespaces"] and unmapped == ["reloader.x=1"]


def test_values_map_onto_reloaders_own_flags() -> None:
    flags = reloader_flags("suite-ns", {"reloader.reloadOnCreate": "true", "reloader.ignoreConfigMaps": "true",
                                        "reloader.watchGlobally": "false", "reloader.isArgoRollouts": "true"})
    assert flags == ["--reload-strategy=annotations", "--reload-on-create=true", "--resources-to-ignore=configMaps",
                     "--namespaces=suite-ns", "--is-Argo-Rollouts=true"]
    scoped = reloader_flags("suite-ns", {"reloader.watchGlobally": "false", "reloader.namespaces": "{a,b}"})
    assert scoped[-1] == "--namespaces=a,b,suite-ns"  # as Reloader's chart: its own namespace added


def audit_entry(who: str, verb: str, resource: str, name: str, received: str, answered: str) -> dict[str, Any]:
    return {"stage": "ResponseStarted" if verb == "watch" else "ResponseComplete", "verb": verb,
            "user": {"username": f"system:serviceaccount:{HARNESS_NAMESPACE}:{who}"},
            "objectRef": {"resource": resource, "name": name, "namespace": "ns"},
            "requestReceivedTimestamp": f"2026-11-24T02:37:{received}Z",
            "stageTimestamp": f"2026-11-24T02:37:{answered}Z", "responseStatus": {"code": 200}}


def spec_requests(rollout_answered: str, rollout_received: str = "10.120000") -> list[dict[str, Any]]:
    """A spec's requests: the edit, the operator's rollout, then WaitReloaded's GET and watch."""
    return [audit_entry("suite", "update", "configmaps", "cm", "10.100000", "10.110000"),
            audit_entry("operator", "patch", "deployments", "deploy", rollout_received, rollout_answered),
            audit_entry("suite", "get", "deployments", "deploy", "10.300000", "10.301000"),
            audit_entry("suite", "watch", "deployments", "deploy", "10.310000", "10.311000")]


def test_timeline_tells_the_suites_race_from_a_late_rollout() -> None:
    # Ginkgo's times have up to 9 fraction digits, trailing zeros dropped.
    raced = spec_timeline(spec_requests("10.130000"), "2026-11-24T02:37:10.0Z", "2026-11-24T02:37:25.47433833Z")
    assert raced["verdict"].startswith("the suite's race:")
    assert "answered +130.0 ms) came before the read was received" in raced["verdict"]
    assert raced["timeline"][0] == "+100.0 ms suite update configmaps/cm -> 200 (answered +110.0 ms)"
    # Received (+120 ms) and answered (+300.5 ms) while the GET (+300 / +301 ms) was in flight.
    overlapping = spec_timeline(spec_requests("10.300500"), "2026-11-24T02:37:10.0Z", "2026-11-24T02:37:25.5Z")
    assert "while the read was in flight" in overlapping["verdict"]
    late = spec_timeline(spec_requests("10.400000", rollout_received="10.302000"),
                         "2026-11-24T02:37:10.0Z", "2026-11-24T02:37:25.5Z")
    assert late["verdict"].startswith("not the race:")
    race_free = spec_timeline([e for e in spec_requests("10.400000") if e["verb"] != "get"],
                              "2026-11-24T02:37:10.0Z", "2026-11-24T02:37:25.5Z")
    assert race_free["verdict"].startswith("not the race: no GET of the prior value")  # RACE_FREE=1 reads none
    missed = spec_timeline([e for e in spec_requests("10.130000") if e["verb"] != "patch"],
                           "2026-11-24T02:37:10.0Z", "2026-11-24T02:37:25.5Z")
    assert missed["verdict"].startswith("no write to deployments/deploy")


def test_race_free_patch_changes_their_test_helpers_only() -> None:
    """RACE_FREE=1 may change where WaitReloaded and WaitEnvVar read their prior values, in test/e2e/utils,
    and nothing else."""
    text = RACE_FREE_PATCH.read_text()
    files = re.findall(r"^\+\+\+ b/(\S+)$", text, flags=re.M)
    assert files and all(f.startswith("test/e2e/utils/") and f.endswith(".go") for f in files)
    assert not any(f.endswith("_test.go") for f in files)  # no spec is touched
    removed = [line for line in text.splitlines() if line.startswith("-") and not line.startswith("---")]
    # The one GET after the write, per workload kind: of the annotation (5 kinds), of the env var (the
    # 4 kinds the env-vars strategy rolls through their template).
    annotation = [line for line in removed if "GetPodTemplateAnnotation(ctx, namespace, name, annotationKey)" in line]
    env_var = [line for line in removed if ".Get(ctx, name, metav1.GetOptions{}); err == nil {" in line]
    assert len(annotation) == 5 and len(env_var) == 4 and len(removed) == 9


def test_race_free_refuses_a_tree_the_patch_no_longer_fits(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    utils = tree / "test" / "e2e" / "utils"
    utils.mkdir(parents=True)
    (utils / "resources.go").write_text("package utils\n\n// rewritten upstream\n")
    with pytest.raises(PatchDoesNotApply, match="no longer applies to Reloader's source") as refused:
        race_free_tree(tree)
    assert "resources.go" in str(refused.value.code)
    assert (utils / "resources.go").read_text() == "package utils\n\n// rewritten upstream\n"  # as fetched
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["src"]  # no half-patched copy left


@pytest.mark.peers  # needs Reloader's fetched source (not on the Go module proxy): make peers-test
def test_race_free_patch_applies_to_the_fetched_tree_and_compiles(tmp_path: Path) -> None:
    _, fetched, _ = peer_build.build_test("reloader", "./test/e2e/core/", "e2e-core")
    tree = tmp_path / "src"
    shutil.copytree(fetched, tree, symlinks=True, ignore=shutil.ignore_patterns("*-race-free-*"))
    before = (tree / "test/e2e/utils/workload_deployment.go").read_text()
    patched = race_free_tree(tree)
    assert (tree / "test/e2e/utils/workload_deployment.go").read_text() == before  # the tree itself untouched
    assert "BeforeLastSourceWrite(name)" in (patched / "test/e2e/utils/workload_deployment.go").read_text()
    assert race_free_tree(tree) == patched  # applied once, then reused
    env = {"GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    vet = subprocess.run(["go", "vet", "./test/e2e/utils/"], cwd=patched, capture_output=True, text=True,
                         env={**os.environ, **env})
    assert vet.returncode == 0, vet.stderr
