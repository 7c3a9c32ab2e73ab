"""The re-roller's history of a source and its restore (docs/reroller.md, "History and restore"), end to
end on the API server: versions kept as immutable snapshots beside the source and bounded; a restore of
"previous" is one write of the source that rolls its users once; a Secret's versions are Secrets in its
namespace; with the installation's REROLLER_HISTORY off, one Warning and nothing made."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import kubernetes

from kopf_operators.core.conventions import data_hash
from kopf_operators.reroller import settings
from tests.e2e.reroller_helpers import (
    AUTO,
    baseline,
    configmap,
    deployment,
    events,
    reroller_with,  # noqa: F401  (a fixture)
    secret,
    set_cm,
    template_hash,
)
from tests.kube import OperatorProcess, stays, wait_for

HISTORY_ON = {"REROLLER_HISTORY": "true"}


def snapshots(core: Any, ns: str, source: str, kind: str = "ConfigMap") -> dict[str, Any]:
    """The source's snapshots in its namespace: data hash -> object."""
    lister = core.list_namespaced_config_map if kind == "ConfigMap" else core.list_namespaced_secret
    found = lister(ns, label_selector=f"{settings.SNAPSHOT_OF}={source}").items
    return {s.metadata.annotations[settings.SNAPSHOT_HASH]: s for s in found if s.metadata.owner_references}


def cm_hash(core: Any, ns: str, name: str) -> str:
    cm = core.read_namespaced_config_map(name, ns)
    return data_hash("ConfigMap", {"data": cm.data or {}, "binaryData": cm.binary_data or {}})


def annotate(core: Any, ns: str, name: str, annotations: dict[str, str | None], kind: str = "ConfigMap") -> Any:
    patch = {"metadata": {"annotations": annotations}}
    if kind == "ConfigMap":
        return core.patch_namespaced_config_map(name, ns, patch)
    return core.patch_namespaced_secret(name, ns, patch)


def rerolls(core: Any, ns: str, name: str) -> int:
    return len(events(core, ns, name, "Rerolled"))


def modifications(core: Any, ns: str, name: str, since: str, seconds: int) -> list[Any]:
    """The ConfigMap's MODIFIED events after resourceVersion ``since``, for ``seconds`` (the server ends
    the watch)."""
    watch = kubernetes.watch.Watch()
    stream = watch.stream(core.list_namespaced_config_map, ns, field_selector=f"metadata.name={name}",
                          resource_version=since, timeout_seconds=seconds)
    return [e["object"] for e in stream if e["type"] == "MODIFIED"]


def test_versions_are_kept_bounded_and_previous_is_restored_in_one_write_rolling_the_users_once(
        reroller_with: Callable[..., OperatorProcess], namespace: str, core: Any, apps: Any) -> None:  # noqa: F811
    proc = reroller_with(**HISTORY_ON)
    configmap(core, namespace, "conf", {"level": "1"})
    # Someone else's object with our label and a hash, but no ownerReference to the source: never pruned
    # nor restored from.
    core.create_namespaced_config_map(namespace, {"metadata": {
        "name": "forged", "labels": {settings.SNAPSHOT_OF: "conf"},
        "annotations": {settings.SNAPSHOT_HASH: "0123456789abcdef", settings.SNAPSHOT_VERSION: "999999999"}},
        "data": {"level": "forged"}})
    annotate(core, namespace, "conf", {settings.HISTORY: "2"})
    source = core.read_namespaced_config_map("conf", namespace)
    deployment(apps, namespace, "app", {"containers": [
        {"name": "app", "image": "app:1", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}, AUTO)
    baseline(apps, namespace, "app")
    v1 = cm_hash(core, namespace, "conf")
    [kept] = wait_for(lambda: list(snapshots(core, namespace, "conf").values()), timeout=30, what="the first version")
    assert kept.metadata.name == f"conf-{v1}" and kept.immutable and kept.data == {"level": "1"}
    assert [(o.kind, o.uid) for o in kept.metadata.owner_references] == [("ConfigMap", source.metadata.uid)]
    assert not (kept.metadata.annotations or {}).get(settings.HISTORY)  # a snapshot has no history of its own

    # Two changes: each rolls the app once and is kept; only the 2 newest versions stay.
    set_cm(core, namespace, "conf", {"level": "2"})
    v2 = cm_hash(core, namespace, "conf")
    wait_for(lambda: rerolls(core, namespace, "app") == 1, timeout=30, what="the rollout of version 2")
    wait_for(lambda: set(snapshots(core, namespace, "conf")) == {v1, v2}, timeout=30, what="version 2 kept")
    set_cm(core, namespace, "conf", {"level": "3"})
    v3 = cm_hash(core, namespace, "conf")
    wait_for(lambda: rerolls(core, namespace, "app") == 2, timeout=30, what="the rollout of version 3")
    wait_for(lambda: set(snapshots(core, namespace, "conf")) == {v2, v3}, timeout=30, what="version 1 pruned")
    rolled_to_v3 = wait_for(lambda: template_hash(apps, namespace, "app"), timeout=30, what="the template hash")

    # Restore the previous version: one write of the source (data back, annotation gone), one rollout.
    asked = annotate(core, namespace, "conf", {settings.RESTORE: "previous"})
    written = modifications(core, namespace, "conf", asked.metadata.resource_version, seconds=8)
    assert len(written) == 1, [w.metadata.resource_version for w in written]
    [restored] = written
    assert restored.data == {"level": "2"}
    assert settings.RESTORE not in (restored.metadata.annotations or {})
    wait_for(lambda: rerolls(core, namespace, "app") == 3, timeout=30, what="the rollout of the restored version")
    rolled_back = template_hash(apps, namespace, "app")
    assert rolled_back != rolled_to_v3
    stays(lambda: rerolls(core, namespace, "app") == 3 and template_hash(apps, namespace, "app") == rolled_back,
          seconds=4, what="exactly one rollout of the restored version")
    [said] = events(core, namespace, "conf", "Restored")
    assert v2 in said.message and said.type == "Normal"
    # Version 2 is the newest again: "previous" now means version 3, and nothing was pruned or made.
    wait_for(lambda: snapshots(core, namespace, "conf")[v2].metadata.annotations[settings.SNAPSHOT_VERSION]
             == restored.metadata.resource_version, timeout=30, what="version 2 current again")
    assert set(snapshots(core, namespace, "conf")) == {v2, v3}
    assert core.read_namespaced_config_map("forged", namespace).data == {"level": "forged"}

    # A count beyond the bound: one Warning, readable; history kept as it was.
    annotate(core, namespace, "conf", {settings.HISTORY: "50"})
    [refused] = wait_for(lambda: events(core, namespace, "conf", "HistoryRefused"), timeout=30, what="the refusal")
    assert "not between 1 and 20" in refused.message and refused.type == "Warning"
    assert not proc.errors(about=namespace)


def test_a_secret_version_is_a_secret_of_its_type_in_its_namespace_and_an_unknown_hash_is_refused(
        reroller_with: Callable[..., OperatorProcess], namespace: str, core: Any) -> None:  # noqa: F811
    reroller_with(**HISTORY_ON)
    secret(core, namespace, "creds", {"password": "one"})
    created = annotate(core, namespace, "creds", {settings.HISTORY: "3"}, kind="Secret")
    v1 = data_hash("Secret", {"data": created.data, "type": created.type})
    kept: Any = wait_for(lambda: snapshots(core, namespace, "creds", "Secret").get(v1), timeout=30,
                         what="the Secret's version (listed as a Secret)")
    assert kept.type == "Opaque" and kept.immutable and kept.metadata.namespace == namespace
    assert base64.b64decode(kept.data["password"]) == b"one"
    assert [o.uid for o in kept.metadata.owner_references] == [created.metadata.uid]
    # Nothing of it in ConfigMaps.
    assert not snapshots(core, namespace, "creds")

    core.patch_namespaced_secret("creds", namespace, {"stringData": {"password": "two"}})
    wait_for(lambda: len(snapshots(core, namespace, "creds", "Secret")) == 2, timeout=30, what="version 2 kept")
    # An unknown hash: a Warning, the annotation left, nothing written.
    annotate(core, namespace, "creds", {settings.RESTORE: "0000000000000000"}, kind="Secret")
    [refused] = wait_for(lambda: events(core, namespace, "creds", "HistoryRefused"), timeout=30, what="the refusal")
    assert "no kept version has hash" in refused.message and refused.type == "Warning"
    assert "one" not in refused.message and "two" not in refused.message
    stays(lambda: core.read_namespaced_secret("creds", namespace).metadata.annotations.get(settings.RESTORE)
          == "0000000000000000" and len(events(core, namespace, "creds", "HistoryRefused")) == 1,
          seconds=3, what="the annotation left, said once")
    # By its hash: the first version back.
    annotate(core, namespace, "creds", {settings.RESTORE: v1}, kind="Secret")
    wait_for(lambda: base64.b64decode(core.read_namespaced_secret("creds", namespace).data["password"]) == b"one",
             timeout=30, what="the first version restored")
    assert settings.RESTORE not in core.read_namespaced_secret("creds", namespace).metadata.annotations
    # The versions go with their source (their ownerReference).
    core.delete_namespaced_secret("creds", namespace)
    wait_for(lambda: not snapshots(core, namespace, "creds", "Secret"), timeout=60, what="the versions deleted")


def test_with_history_off_in_the_installation_one_warning_and_nothing_made(
        operator: OperatorProcess, namespace: str, core: Any) -> None:
    configmap(core, namespace, "conf", {"level": "1"})
    annotate(core, namespace, "conf", {settings.HISTORY: "3", settings.RESTORE: "previous"})
    [said] = wait_for(lambda: events(core, namespace, "conf", "HistoryRefused"), timeout=30, what="the Warning")
    assert "not enabled in this installation" in said.message and said.type == "Warning"
    set_cm(core, namespace, "conf", {"level": "2"})
    stays(lambda: not snapshots(core, namespace, "conf")
          and len(events(core, namespace, "conf", "HistoryRefused")) == 1, seconds=3, what="nothing made, said once")
    assert core.read_namespaced_config_map("conf", namespace).metadata.annotations[settings.RESTORE] == "previous"
