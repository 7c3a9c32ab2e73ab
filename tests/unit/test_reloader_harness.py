"""The Reloader e2e harness maps Reloader's Helm values onto our options (tests/reloader_e2e.py)."""

from __future__ import annotations

from tests.reloader_e2e import helm_values, operator_options, reloader_flags

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
