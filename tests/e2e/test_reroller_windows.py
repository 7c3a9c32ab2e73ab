# ruff: noqa: F811  (the fixture imported from reroller_helpers is a parameter here)
"""Re-roller: restart windows and CronJob modes, on the real local API server.

A window that opens during the test (chosen from the clock: a one-minute cron window starting at a
minute boundary ahead), changes piling up outside it and an operator restart in between; a change
reverted before its window; a malformed window; each CronJob mode. "Rolled" is counted on what the
controller-manager did (ReplicaSets, Jobs, pods).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from kopf_operators.core.conventions import REROLLER_PENDING
from kopf_operators.reroller import settings
from tests.e2e.reroller_helpers import (
    AUTO,
    assert_not_rolled,
    baseline,
    configmap,
    deployment,
    events,
    replicasets,
    reroller_with,  # noqa: F401  (a fixture)
    set_cm,
    template_hash,
)
from tests.kube import OperatorProcess, stays, wait_for

ENV_FROM = {"containers": [{"name": "app", "image": "app", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}
NEVER = json.dumps({"timezone": "UTC", "windows": [{"cron": "0 0 1 1 *", "duration": "1m"}]})  # 1 January


@pytest.fixture(scope="module")
def batch(api: Any) -> Any:
    import kubernetes

    return kubernetes.client.BatchV1Api(api)


def minute_window(lead: float) -> tuple[str, float]:
    """A one-minute UTC window opening at the first minute boundary at least ``lead`` seconds ahead:
    (the annotation's value, the opening in epoch seconds)."""
    opens = (int(time.time() + lead) // 60 + 1) * 60
    at = time.gmtime(opens)
    window = {"timezone": "UTC", "windows": [{"cron": f"{at.tm_min} {at.tm_hour} * * *", "duration": "1m"}]}
    return json.dumps(window), float(opens)


def pending(apps: Any, ns: str, name: str) -> str | None:
    return (apps.read_namespaced_deployment(name, ns).metadata.annotations or {}).get(REROLLER_PENDING)


def skipped(proc: OperatorProcess, reason: str) -> float:
    line = f'kopf_operators_reroller_skipped_total{{reason="{reason}"}} '
    return sum(float(x.rsplit(" ", 1)[1]) for x in proc.metrics().splitlines() if x.startswith(line))


def test_changes_outside_the_window_roll_once_when_it_opens_even_across_a_restart(
        operator: OperatorProcess, namespace: str, core: Any, apps: Any) -> None:
    window, opens = minute_window(lead=35)
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "web", ENV_FROM, {**AUTO, settings.RELOADER_RESTART_WINDOW: window})
    baseline(apps, namespace, "web")
    wait_for(lambda: replicasets(apps, namespace, "web") == 1, timeout=30, what="the first ReplicaSet")
    before = skipped(operator, "restart_window")

    set_cm(core, namespace, "conf", {"k": "2"})
    said = wait_for(lambda: pending(apps, namespace, "web"), timeout=30, what="the pending annotation")
    assert "waiting for the restart window" in str(said) and "configmap/conf" in str(said)
    wait_for(lambda: events(core, namespace, "web", "RerollDeferred"), timeout=15, what="a RerollDeferred Event")
    assert skipped(operator, "restart_window") == before + 1
    set_cm(core, namespace, "conf", {"k": "3"})  # piles up: still one rollout
    operator.restart()  # the pending rollout is on the workload, not in the process
    assert time.time() < opens - 3, "the test took too long to set up before the window"
    assert_not_rolled(apps, namespace, "web", seconds=opens - time.time() - 1)

    wait_for(lambda: template_hash(apps, namespace, "web"), timeout=opens - time.time() + 30,
             what="the rollout when the window opened")
    assert time.time() >= opens
    wait_for(lambda: replicasets(apps, namespace, "web") == 2, timeout=30, what="2 ReplicaSets")
    assert pending(apps, namespace, "web") is None
    stays(lambda: replicasets(apps, namespace, "web") == 2, 4, what="exactly one rollout")
    assert len(events(core, namespace, "web", "Rerolled")) == 1
    assert not operator.errors(about=namespace)


def test_a_reverted_change_rolls_nothing_and_a_malformed_window_blocks_with_a_warning(
        operator: OperatorProcess, namespace: str, core: Any, apps: Any) -> None:
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "later", ENV_FROM, {**AUTO, settings.RESTART_WINDOW: NEVER})
    broken = '{"timezone": "UTC", "windows": [{"cron": "0 2 * *", "duration": "1h"}]}'
    deployment(apps, namespace, "broken", ENV_FROM, {**AUTO, settings.RELOADER_RESTART_WINDOW: broken})
    for name in ("later", "broken"):
        baseline(apps, namespace, name)

    set_cm(core, namespace, "conf", {"k": "2"})
    wait_for(lambda: pending(apps, namespace, "later"), timeout=30, what="the pending annotation")
    blocked = wait_for(lambda: pending(apps, namespace, "broken"), timeout=30, what="the blocked annotation")
    assert str(blocked).startswith("blocked: invalid restart window") and "five-field cron" in str(blocked)
    [warning] = wait_for(lambda: events(core, namespace, "broken", "RerollBlocked"), timeout=15,
                         what="a Warning naming the problem")
    assert warning.type == "Warning" and "'0 2 * *' is not a five-field cron expression" in warning.message
    assert_not_rolled(apps, namespace, "broken", seconds=2)

    set_cm(core, namespace, "conf", {"k": "1"})  # reverted before the window opens
    for name in ("later", "broken"):
        wait_for(lambda n=name: pending(apps, namespace, n) is None, timeout=30,  # type: ignore[misc]
                 what=f"{name}'s pending rollout dropped")
        assert_not_rolled(apps, namespace, name, seconds=2)
    wait_for(lambda: events(core, namespace, "later", "RerollDropped"), timeout=10,
             what="the RerollDropped Event(s)")  # posted after the write
    assert not events(core, namespace, "later", "Rerolled")


# --- CronJob modes ---------------------------------------------------------------------------------


def cronjob(batch: Any, ns: str, name: str, annotations: dict[str, str]) -> str:
    """A CronJob whose schedule (1 January) never fires during a test; its uid."""
    created = batch.create_namespaced_cron_job(ns, {
        "metadata": {"name": name, "annotations": {**AUTO, **annotations}},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": {
            "spec": {**ENV_FROM, "restartPolicy": "Never"}}}}}})
    return str(created.metadata.uid)


def jobs_of(batch: Any, ns: str, uid: str) -> list[Any]:
    return [j for j in batch.list_namespaced_job(ns).items
            if any(o.uid == uid for o in j.metadata.owner_references or ())]


def pods_of(core: Any, ns: str, job_uid: str) -> list[Any]:
    selector = f"batch.kubernetes.io/controller-uid={job_uid}"
    return [p for p in core.list_namespaced_pod(ns, label_selector=selector).items if not p.metadata.deletion_timestamp]


def test_each_cronjob_mode(operator: OperatorProcess, reroller_with: Callable[..., OperatorProcess],
                           namespace: str, core: Any, batch: Any) -> None:
    configmap(core, namespace, "conf", {"k": "1"})
    uids = {"now": cronjob(batch, namespace, "now", {}),
            "next": cronjob(batch, namespace, "next", {settings.CRONJOB_MODE: "next-run"}),
            "active": cronjob(batch, namespace, "active", {settings.CRONJOB_MODE: "restart-active"})}
    # restart-active: an unfinished Job of the CronJob (as its schedule would have started it); its pod
    # waits for a node that does not exist (KWOK completes a Job's running pod at once).
    job = batch.create_namespaced_job(namespace, {
        "metadata": {"name": "active-running", "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "CronJob", "name": "active", "uid": uids["active"],
             "controller": True}]},
        "spec": {"template": {"spec": {**ENV_FROM, "restartPolicy": "Never",
                                       "nodeSelector": {"kopf-operators.dev/no-such-node": "true"}}}}})
    [first] = wait_for(lambda: pods_of(core, namespace, job.metadata.uid), timeout=60, what="the unfinished Job's pod")
    for name in uids:
        wait_for(lambda n=name: settings.OBSERVED_HASH in (  # type: ignore[misc]
            batch.read_namespaced_cron_job(n, namespace).metadata.annotations or {}),
            timeout=30, what=f"{name}'s baseline")

    set_cm(core, namespace, "conf", {"k": "2"})
    # run-now: a Job at once.
    wait_for(lambda: jobs_of(batch, namespace, uids["now"]), timeout=30, what="run-now's Job")
    # next-run: only the jobTemplate says the new configuration; no Job.
    wait_for(lambda: settings.CONFIG_HASH in (batch.read_namespaced_cron_job("next", namespace).spec.job_template
                                              .spec.template.metadata.annotations or {}),
             timeout=30, what="next-run's jobTemplate annotated")
    # restart-active deletes pods: off by default, the CronJob's rollout is held with a Warning.
    wait_for(lambda: events(core, namespace, "active", "RerollBlocked"), timeout=30, what="restart-active refused")
    assert [p.metadata.uid for p in pods_of(core, namespace, job.metadata.uid)] == [first.metadata.uid]
    # Allowed (REROLLER_ALLOW_RESTART_ACTIVE, the chart's allowRestartActive): the held rollout goes at
    # the start: the running Job's pod replaced by its Job; no new Job.
    operator = reroller_with(REROLLER_ALLOW_RESTART_ACTIVE="true")
    wait_for(lambda: [p for p in pods_of(core, namespace, job.metadata.uid) if p.metadata.uid != first.metadata.uid],
             timeout=60, what="the active Job's new pod")
    stays(lambda: not jobs_of(batch, namespace, uids["next"])
          and [j.metadata.name for j in jobs_of(batch, namespace, uids["active"])] == ["active-running"]
          and len(jobs_of(batch, namespace, uids["now"])) == 1, 3, what="no other Job")
    for name in uids:
        assert len(events(core, namespace, name, "Rerolled")) == 1
    assert not operator.errors(about=namespace)
