# ruff: noqa: F811  (the fixture imported from reroller_helpers is a parameter here)
"""Re-roller against the real control plane: the controller-manager really creates ReplicaSets and
ControllerRevisions, so "rolled exactly once" is asserted on what Kubernetes did, not on our patch."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kopf_operators.reroller import settings
from tests.e2e.reroller_helpers import (
    AUTO,
    NGINX_CONF,
    assert_not_rolled,
    assert_rolled_once,
    baseline,
    configmap,
    container_env,
    deployment,
    events,
    nginx_pod_spec,
    no_kopf_state,
    observed_hash,
    pod_template,
    read,
    reloaded_from,
    replicasets,
    reroller_with,  # noqa: F401  (a fixture)
    revisions,
    secret,
    set_cm,
    stakater,
    template_hash,
)
from tests.kube import OperatorProcess, stays, wait_for
from testsupport.audit import AuditLog, audit_now
from testsupport.kubectl import kubectl
from testsupport.stats import percentile


@pytest.fixture(scope="session")
def batch(api: Any) -> Any:
    import kubernetes
    return kubernetes.client.BatchV1Api(api)


# --- tests --------------------------------------------------------------------------------------


def test_nginx_configmap_change_rolls_once(operator: OperatorProcess, namespace: str, core: Any,
                                          apps: Any) -> None:
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), AUTO)
    first = baseline(apps, namespace, "nginx")
    # A newly created, annotated workload is not rolled: only the baseline is recorded.
    wait_for(lambda: replicasets(apps, namespace, "nginx") == 1, timeout=30, what="the first ReplicaSet")
    assert_not_rolled(apps, namespace, "nginx", 3)

    set_cm(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF.replace("v1", "v2")})
    new = assert_rolled_once(apps, core, namespace, "nginx", "configmap/nginx-conf")
    assert new != first and observed_hash(apps, namespace, "nginx") == new

    # Kopf stores nothing on built-in objects.
    assert no_kopf_state(core.read_namespaced_config_map("nginx-conf", namespace))
    assert no_kopf_state(apps.read_namespaced_deployment("nginx", namespace))
    assert not operator.errors(about=namespace)



def test_newly_annotated_workload_is_not_rolled(operator: OperatorProcess, namespace: str, core: Any,
                                                apps: Any) -> None:
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), {})
    wait_for(lambda: replicasets(apps, namespace, "nginx") == 1, timeout=30, what="the first ReplicaSet")
    stays(lambda: observed_hash(apps, namespace, "nginx") is None, 3, what="not opted in: untouched")
    apps.patch_namespaced_deployment("nginx", namespace, {"metadata": {"annotations": AUTO}})
    baseline(apps, namespace, "nginx")
    assert_not_rolled(apps, namespace, "nginx", 3)

def test_secret_change_rolls_once_and_never_leaks(operator: OperatorProcess, namespace: str, core: Any,
                                                  apps: Any) -> None:
    secret(core, namespace, "creds", {"password": "hunter2-first"})
    spec = {"containers": [{"name": "app", "image": "app", "env": [
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}]}]}
    deployment(apps, namespace, "app", spec, AUTO)
    baseline(apps, namespace, "app")
    core.patch_namespaced_secret("creds", namespace, {"stringData": {"password": "hunter2-second"}})
    assert_rolled_once(apps, core, namespace, "app", "secret/creds")

    assert no_kopf_state(core.read_namespaced_secret("creds", namespace))
    body = str(apps.read_namespaced_deployment("app", namespace).to_dict())
    messages = " ".join(e.message or "" for e in core.list_namespaced_event(namespace).items)
    for value in ("hunter2-first", "hunter2-second"):
        encoded = base64.b64encode(value.encode()).decode()
        for where in (operator.output(), body, messages):
            assert value not in where and encoded not in where


@pytest.mark.parametrize("kind", ["StatefulSet", "DaemonSet"])
def test_statefulset_and_daemonset_roll_once(operator: OperatorProcess, namespace: str, core: Any,
                                             apps: Any, kind: str) -> None:
    configmap(core, namespace, "conf", {"a": "1"})
    labels = {"app": "w"}
    spec: dict[str, Any] = {"selector": {"matchLabels": labels},
                            "template": pod_template(nginx_pod_spec("conf"), labels, AUTO)}
    if kind == "StatefulSet":
        apps.create_namespaced_stateful_set(namespace, {
            "metadata": {"name": "w"}, "spec": {**spec, "serviceName": "w", "replicas": 1}})
    else:
        apps.create_namespaced_daemon_set(namespace, {"metadata": {"name": "w"}, "spec": spec})
    baseline(apps, namespace, "w", kind)  # opted in via the pod template's annotation
    wait_for(lambda: revisions(apps, namespace, "w") == 1, timeout=30, what="the first revision")

    set_cm(core, namespace, "conf", {"a": "2"})
    new = wait_for(lambda: template_hash(apps, namespace, "w", kind), timeout=30, what=f"{kind} re-rolled")
    wait_for(lambda: revisions(apps, namespace, "w") == 2, timeout=30, what="a second revision")
    stays(lambda: revisions(apps, namespace, "w") == 2 and template_hash(apps, namespace, "w", kind) == new,
          3, what="exactly one rollout")
    wait_for(lambda: events(core, namespace, "w", "Rerolled"), timeout=10,
             what="the Rerolled Event(s)")  # posted after the write


def test_noop_edits_recreate_and_restarts_roll_nothing(operator: OperatorProcess, namespace: str,
                                                       core: Any, apps: Any) -> None:
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), AUTO)
    first = baseline(apps, namespace, "nginx")
    wait_for(lambda: replicasets(apps, namespace, "nginx") == 1, timeout=30, what="the first ReplicaSet")

    # A metadata-only edit and an identical re-apply.
    core.patch_namespaced_config_map("nginx-conf", namespace, {"metadata": {"labels": {"team": "web"}}})
    core.replace_namespaced_config_map("nginx-conf", namespace, {
        "metadata": {"name": "nginx-conf", "labels": {"team": "web"}}, "data": {"nginx.conf": NGINX_CONF}})
    # The workload's own metadata edited (not its template).
    apps.patch_namespaced_deployment("nginx", namespace, {"metadata": {"labels": {"tier": "edge"}}})
    assert_not_rolled(apps, namespace, "nginx", 4)

    # Deleted and recreated with identical data (new uid, new resourceVersion).
    core.delete_namespaced_config_map("nginx-conf", namespace)
    wait_for(lambda: events(core, namespace, "nginx", "SourceMissing"), timeout=30, what="a SourceMissing event")
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    assert_not_rolled(apps, namespace, "nginx", 4)

    # Operator restarts: graceful and SIGKILL.
    operator.restart()
    assert_not_rolled(apps, namespace, "nginx", 4)
    operator.kill()
    operator.start()
    assert_not_rolled(apps, namespace, "nginx", 4)
    assert observed_hash(apps, namespace, "nginx") == first


def test_change_during_downtime_rolls_exactly_once(operator: OperatorProcess, namespace: str, core: Any,
                                                   apps: Any) -> None:
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), AUTO)
    baseline(apps, namespace, "nginx")
    wait_for(lambda: replicasets(apps, namespace, "nginx") == 1, timeout=30, what="the first ReplicaSet")
    operator.stop()
    set_cm(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF.replace("v1", "down")})
    operator.start()
    assert_rolled_once(apps, core, namespace, "nginx", "configmap/nginx-conf")
    operator.restart()  # and a restart after that changes nothing
    stays(lambda: replicasets(apps, namespace, "nginx") == 2, 3, what="still one rollout")


def test_burst_rolls_at_once_then_merges_and_flapping_is_rate_limited(operator: OperatorProcess, namespace: str,
                                                                     core: Any, apps: Any) -> None:
    configmap(core, namespace, "a", {"k": "0"})
    secret(core, namespace, "s", {"k": "0"})
    spec = {"containers": [{"name": "c", "image": "app", "envFrom": [
        {"configMapRef": {"name": "a"}}, {"secretRef": {"name": "s"}}]}]}
    deployment(apps, namespace, "app", spec, AUTO)
    baseline(apps, namespace, "app")
    wait_for(lambda: replicasets(apps, namespace, "app") == 1, timeout=30, what="the first ReplicaSet")

    # A burst of changes to two sources: the first rolls at once (leading edge), the rest of the
    # burst merges into exactly one more rollout when the minimum interval (10 s) has passed.
    edited = time.monotonic()
    for i in range(1, 4):
        set_cm(core, namespace, "a", {"k": str(i)})
        core.patch_namespaced_secret("s", namespace, {"stringData": {"k": str(i)}})
    first = wait_for(lambda: template_hash(apps, namespace, "app"), timeout=30, interval=0.02,
                     what="the first rollout")
    rolled_at = time.monotonic()
    assert rolled_at - edited < 2, "the first change must roll at once, not after a debounce"
    wait_for(lambda: replicasets(apps, namespace, "app") == 2, timeout=30, what="a second ReplicaSet")
    stays(lambda: replicasets(apps, namespace, "app") == 2, 6, what="the rate limit holding")
    wait_for(lambda: template_hash(apps, namespace, "app") != first, timeout=30, what="the merged rollout")
    assert time.monotonic() - rolled_at >= 9
    wait_for(lambda: replicasets(apps, namespace, "app") == 3, timeout=30, what="a third ReplicaSet")
    stays(lambda: replicasets(apps, namespace, "app") == 3, 3, what="the burst merged into one more rollout")
    messages = [e.message for e in events(core, namespace, "app", "Rerolled")]
    assert len(messages) == 2 and "configmap/a" in messages[0] and "secret/s" in " ".join(messages)

    # A source flapping 10 times a second for 12 s: at most one rollout per 10 s.
    before = replicasets(apps, namespace, "app")
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < 12:
        set_cm(core, namespace, "a", {"k": f"flap-{i}"})
        i += 1
        time.sleep(0.1)
    wait_for(lambda: replicasets(apps, namespace, "app") > before, timeout=30, what="flapping rolled")
    stays(lambda: replicasets(apps, namespace, "app") - before <= 3, 11, what="at most 1 rollout per 10 s")


def test_a_flooding_namespace_does_not_hold_back_another_namespaces_rollout(
        reroller_with: Callable[..., OperatorProcess], namespace: str, make_namespace: Callable[..., str],
        core: Any, apps: Any) -> None:
    """The rollout budget is fair per namespace: one ConfigMap used by 20 Deployments floods a namespace
    with rollouts the budget (2 a second, burst 1) spreads over ten seconds; a change in a quiet namespace
    meanwhile rolls its Deployment at the next token, long before the flood's backlog drains (one shared
    queue would serve it last). Asserted on the order, not on a time."""
    proc = reroller_with(REROLLER_DEBOUNCE_SECONDS="0", REROLLER_MIN_INTERVAL_SECONDS="0",
                         REROLLER_CLUSTER_ROLLOUTS_PER_SECOND="2", REROLLER_CLUSTER_BURST="1")
    quiet, flood = make_namespace("quiet"), [f"f-{i}" for i in range(20)]
    spec = {"containers": [{"name": "c", "image": "app", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}
    for ns in (namespace, quiet):
        configmap(core, ns, "cfg", {"k": "0"})
    for name in flood:
        deployment(apps, namespace, name, spec, AUTO, replicas=0)
    deployment(apps, quiet, "q", spec, AUTO, replicas=0)
    for ns, name in [*((namespace, name) for name in flood), (quiet, "q")]:
        baseline(apps, ns, name)

    def flood_not_rolled() -> int:
        return sum(1 for d in apps.list_namespaced_deployment(namespace).items
                   if settings.CONFIG_HASH not in (d.spec.template.metadata.annotations or {}))

    set_cm(core, namespace, "cfg", {"k": "1"})
    wait_for(lambda: flood_not_rolled() < len(flood), timeout=30, what="the flood's first rollout")
    set_cm(core, quiet, "cfg", {"k": "1"})
    wait_for(lambda: template_hash(apps, quiet, "q"), timeout=30, interval=0.05, what="the quiet namespace's rollout")
    backlog = flood_not_rolled()
    assert backlog >= 5, f"the quiet namespace rolled only when {len(flood) - backlog} of the flood had rolled"
    wait_for(lambda: flood_not_rolled() == 0, timeout=60, what="the flood's backlog drained")
    assert not proc.errors()


def test_reloader_annotations(operator: OperatorProcess, namespace: str, core: Any, apps: Any) -> None:
    configmap(core, namespace, "named", {"k": "1"})
    configmap(core, namespace, "unlisted", {"k": "1"})
    secret(core, namespace, "tls", {"k": "1"})
    spec = {"containers": [{"name": "c", "image": "app", "envFrom": [
        {"configMapRef": {"name": "named"}}, {"configMapRef": {"name": "unlisted"}},
        {"secretRef": {"name": "tls"}}]}]}
    deployment(apps, namespace, "named", spec, {"configmap.reloader.stakater.com/reload": "named",
                                               "secret.reloader.stakater.com/reload": "tls"})
    deployment(apps, namespace, "auto", spec, {"reloader.stakater.com/auto": "true"})
    baseline(apps, namespace, "named")
    baseline(apps, namespace, "auto")

    # Not named: only the auto workload rolls, with Reloader's annotation (not ours).
    set_cm(core, namespace, "unlisted", {"k": "2"})
    assert_rolled_once(apps, core, namespace, "auto", "configmap/unlisted", key=settings.LAST_RELOADED_FROM)
    assert reloaded_from(apps, namespace, "named") is None
    assert template_hash(apps, namespace, "auto") is None
    source = json.loads(str(reloaded_from(apps, namespace, "auto")))
    assert {k: source[k] for k in ("type", "name", "namespace", "containerRefs")} == {
        "type": "CONFIGMAP", "name": "unlisted", "namespace": namespace, "containerRefs": ["c"]}
    # Named secret: the named workload rolls.
    core.patch_namespaced_secret("tls", namespace, {"stringData": {"k": "2"}})
    assert_rolled_once(apps, core, namespace, "named", "secret/tls", key=settings.LAST_RELOADED_FROM)


def test_missing_source_warns_and_operator_stays_healthy(operator: OperatorProcess, namespace: str,
                                                         core: Any, apps: Any) -> None:
    deployment(apps, namespace, "nginx", nginx_pod_spec("not-yet"), AUTO)
    wait_for(lambda: events(core, namespace, "nginx", "SourceMissing"), timeout=30, what="a SourceMissing event")
    warning = events(core, namespace, "nginx", "SourceMissing")[0]
    assert warning.type == "Warning" and "configmap/not-yet" in warning.message
    assert operator.running and operator._healthy()
    # The baseline is recorded at the first sighting (the missing source as absent) ...
    first = baseline(apps, namespace, "nginx")

    # ... and once the source exists, it is re-recorded and nothing is rolled.
    configmap(core, namespace, "not-yet", {"nginx.conf": NGINX_CONF})
    wait_for(lambda: observed_hash(apps, namespace, "nginx") != first, timeout=30, what="the new baseline")
    assert_not_rolled(apps, namespace, "nginx", 3)
    assert len(events(core, namespace, "nginx", "SourceMissing")) == 1  # warned once, not per event
    assert not operator.errors(about=namespace)


def test_reaction_latency(operator: OperatorProcess, namespace: str, core: Any, apps: Any) -> None:
    """ConfigMap edited -> pod template patched, over 20 edits (20 workloads, edited one after another),
    at the shipped defaults: an isolated change rolls at once (leading edge), well under a second."""
    count = 20
    for i in range(count):
        configmap(core, namespace, f"cm-{i}", {"k": "0"})
        deployment(apps, namespace, f"d-{i}", nginx_pod_spec(f"cm-{i}"), AUTO, replicas=0)
    for i in range(count):
        baseline(apps, namespace, f"d-{i}")

    edited: dict[str, float] = {}
    patched: dict[str, float] = {}
    for i in range(count):
        set_cm(core, namespace, f"cm-{i}", {"k": "1"})
        edited[f"d-{i}"] = time.monotonic()
        wait_for(lambda i=i: template_hash(apps, namespace, f"d-{i}"), timeout=30, interval=0.005,  # type: ignore[misc]
                 what=f"d-{i} patched")
        patched[f"d-{i}"] = time.monotonic()
        time.sleep(0.1)  # spread the edits a little, as real ones are

    latencies = sorted(patched[name] - edited[name] for name in edited)
    p50 = percentile(latencies, 0.5)
    p99 = percentile(latencies, 0.99)
    print(f"\nreroller reaction (ConfigMap edit -> pod template patched), n={count}: "
          f"p50={p50 * 1000:.0f} ms, p99={p99 * 1000:.0f} ms, max={latencies[-1] * 1000:.0f} ms")
    assert p50 < 1.0, "an isolated change must roll at once, not after a debounce window"



# --- issue #13: no missed rollouts, Reloader's strategy, Jobs and CronJobs, pacing, requests --------


def test_change_right_after_creation_is_never_absorbed(operator: OperatorProcess, namespace: str, core: Any,
                                                       apps: Any) -> None:
    """A ConfigMap changed milliseconds after its workload was created rolls the workload: the
    baseline is the data as of the first sighting, recorded at once."""
    names = [f"early-{i}" for i in range(5)]
    for name in names:
        configmap(core, namespace, name, {"k": "v1"})
        deployment(apps, namespace, name, nginx_pod_spec(name), AUTO)
        set_cm(core, namespace, name, {"k": "v2"})  # no wait: right after the workload's creation
    for name in names:
        wait_for(lambda n=name: template_hash(apps, namespace, n), timeout=30, what=f"{name} rolled")  # type: ignore[misc]
    assert not operator.errors(about=namespace)


def cronjob(batch: Any, ns: str, name: str, pod_spec: dict[str, Any], annotations: dict[str, str],
            suspend: bool = False) -> None:
    """A CronJob whose schedule (once a year, on 1 January) never fires during a test."""
    pod_spec = {**pod_spec, "restartPolicy": "Never"}
    batch.create_namespaced_cron_job(ns, {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"schedule": "0 0 1 1 *", "suspend": suspend,
                 "jobTemplate": {"spec": {"template": {"spec": pod_spec}}}}})


def jobs_of(batch: Any, ns: str, cronjob_name: str) -> list[Any]:
    """The Jobs a CronJob owns (created by the operator from its template)."""
    return [j for j in batch.list_namespaced_job(ns).items
            if any(o.kind == "CronJob" and o.name == cronjob_name for o in j.metadata.owner_references or ())]


def test_cronjob_gets_a_job_and_job_is_recreated(operator: OperatorProcess, namespace: str, core: Any,
                                                 batch: Any) -> None:
    configmap(core, namespace, "conf", {"k": "1"})
    spec = {"containers": [{"name": "c", "image": "busybox:1.36", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}
    cronjob(batch, namespace, "nightly", spec, {settings.RELOADER_CONFIGMAPS: "conf"})
    batch.create_namespaced_job(namespace, {
        "metadata": {"name": "once", "annotations": {settings.RELOADER_AUTO: "true"}, "labels": {"team": "a"}},
        "spec": {"template": {"spec": {**spec, "restartPolicy": "Never"}}}})
    uid = batch.read_namespaced_job("once", namespace).metadata.uid
    wait_for(lambda: settings.OBSERVED_HASH in (
        batch.read_namespaced_cron_job("nightly", namespace).metadata.annotations or {}),
             timeout=30, what="the CronJob's baseline")

    set_cm(core, namespace, "conf", {"k": "2"})

    def triggered() -> list[Any]:
        return [j for j in jobs_of(batch, namespace, "nightly")
                if (j.metadata.annotations or {}).get(settings.CRONJOB_INSTANTIATE) == "manual"]
    wait_for(triggered, timeout=30, what="a Job created from the CronJob")
    again = wait_for(lambda: (j := batch.read_namespaced_job("once", namespace)).metadata.uid != uid and j,
                     timeout=30, what="the Job recreated")
    assert again.metadata.labels.get("team") == "a"
    assert again.metadata.annotations.get(settings.RELOADER_AUTO) == "true"
    stays(lambda: len(triggered()) == 1, 4, what="one Job per change")
    assert batch.read_namespaced_job("once", namespace).metadata.uid == again.metadata.uid, "recreated once"
    wait_for(lambda: events(core, namespace, "nightly", "Rerolled") and events(core, namespace, "once", "Rerolled"),
             timeout=10, what="the Rerolled Events")  # posted after the write
    assert not operator.errors(about=namespace)


def test_suspended_cronjob_gets_no_job(operator: OperatorProcess, namespace: str, core: Any,
                                      batch: Any) -> None:
    """Issue #20: a suspended CronJob (``spec.suspend: true``) gets no Job when its ConfigMap changes
    (its owner said: run nothing); the change becomes its baseline, so resuming it creates no Job
    either (its next scheduled Job reads the data of then). A second CronJob using the same ConfigMap,
    not suspended, gets its Job: the change was seen."""
    configmap(core, namespace, "conf", {"k": "1"})
    spec = {"containers": [{"name": "c", "image": "busybox:1.36", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}
    cronjob(batch, namespace, "held", spec, AUTO, suspend=True)
    cronjob(batch, namespace, "active", spec, AUTO)
    for name in ("held", "active"):
        wait_for(lambda n=name: settings.OBSERVED_HASH in (  # type: ignore[misc]
            batch.read_namespaced_cron_job(n, namespace).metadata.annotations or {}),
            timeout=30, what=f"{name}'s baseline")
    first = batch.read_namespaced_cron_job("held", namespace).metadata.annotations[settings.OBSERVED_HASH]

    set_cm(core, namespace, "conf", {"k": "2"})
    wait_for(lambda: jobs_of(batch, namespace, "active"), timeout=30, what="the active CronJob's Job")
    wait_for(lambda: batch.read_namespaced_cron_job("held", namespace).metadata.annotations[settings.OBSERVED_HASH]
             != first, timeout=30, what="the suspended CronJob's new baseline")
    wait_for(lambda: events(core, namespace, "held", "RerollSkipped"), timeout=15,
             what="an Event saying why no Job was created")
    assert not jobs_of(batch, namespace, "held") and not events(core, namespace, "held", "Rerolled")

    # Resumed: still no Job for the change made while suspended; the next change gets one.
    batch.patch_namespaced_cron_job("held", namespace, {"spec": {"suspend": False}})
    stays(lambda: not jobs_of(batch, namespace, "held"), 4, what="no Job on resume")
    set_cm(core, namespace, "conf", {"k": "3"})
    wait_for(lambda: jobs_of(batch, namespace, "held"), timeout=30, what="a Job after the resume")
    stays(lambda: len(jobs_of(batch, namespace, "held")) == 1, 3, what="one Job per change")
    assert not operator.errors(about=namespace)


def test_reloader_search_match_ignore_regex_and_exclude(operator: OperatorProcess, namespace: str, core: Any,
                                                        apps: Any) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "matched", "annotations": {
        settings.RELOADER_MATCH: "true"}}, "data": {"k": "1"}})
    configmap(core, namespace, "plain", {"k": "1"})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "ignored", "annotations": {
        settings.RELOADER_IGNORE: "true"}}, "data": {"k": "1"}})
    configmap(core, namespace, "app-config-1", {"k": "1"})
    configmap(core, namespace, "excluded", {"k": "1"})

    def uses(*names: str) -> dict[str, Any]:
        refs = [{"configMapRef": {"name": n}} for n in names]
        return {"containers": [{"name": "c", "image": "app", "envFrom": refs}]}
    deployment(apps, namespace, "search", uses("matched", "plain"), {settings.RELOADER_SEARCH: "true"})
    deployment(apps, namespace, "auto", uses("ignored", "excluded", "plain"),
               {settings.RELOADER_AUTO: "true", settings.RELOADER_CONFIGMAPS_EXCLUDE: "excluded"})
    deployment(apps, namespace, "regex", uses("app-config-1"), {settings.RELOADER_CONFIGMAPS: "app-config-.*"})
    for name in ("search", "auto", "regex"):
        baseline(apps, namespace, name)
        wait_for(lambda n=name: replicasets(apps, namespace, n) == 1, timeout=30, what="first ReplicaSet")  # type: ignore[misc]

    set_cm(core, namespace, "ignored", {"k": "2"})    # ignore=true on the source: nothing rolls
    set_cm(core, namespace, "excluded", {"k": "2"})   # excluded by the workload: nothing rolls
    stays(lambda: reloaded_from(apps, namespace, "auto") is None, 4, what="ignored and excluded sources roll nothing")
    set_cm(core, namespace, "matched", {"k": "2"})    # search + match: rolls
    assert_rolled_once(apps, core, namespace, "search", "configmap/matched", key=settings.LAST_RELOADED_FROM)
    set_cm(core, namespace, "app-config-1", {"k": "2"})  # regex name: rolls
    assert_rolled_once(apps, core, namespace, "regex", "configmap/app-config-1", key=settings.LAST_RELOADED_FROM)
    # "plain" has no match annotation: it rolls the auto workload, not the search one.
    search_before = reloaded_from(apps, namespace, "search")
    set_cm(core, namespace, "plain", {"k": "2"})
    assert_rolled_once(apps, core, namespace, "auto", "configmap/plain", key=settings.LAST_RELOADED_FROM)
    assert reloaded_from(apps, namespace, "search") == search_before


def test_pause_period(operator: OperatorProcess, namespace: str, core: Any, apps: Any) -> None:
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "paused", nginx_pod_spec("conf"),
               {settings.RELOADER_CONFIGMAPS: "conf", settings.PAUSE_PERIOD: "5s"})
    baseline(apps, namespace, "paused")
    set_cm(core, namespace, "conf", {"k": "2"})
    wait_for(lambda: reloaded_from(apps, namespace, "paused"), timeout=30, what="the rollout")
    dep = apps.read_namespaced_deployment("paused", namespace)
    assert dep.spec.paused and settings.PAUSED_AT in dep.metadata.annotations
    wait_for(lambda: not apps.read_namespaced_deployment("paused", namespace).spec.paused, timeout=30,
             what="the pause period over")
    assert settings.PAUSED_AT not in (apps.read_namespaced_deployment("paused", namespace).metadata.annotations or {})
    wait_for(lambda: replicasets(apps, namespace, "paused") == 2, timeout=30, what="the rollout after the pause")


def conflicts(operator: OperatorProcess) -> float:
    """How many 409s the re-roller met on its writes (its own metric)."""
    for line in operator.metrics().splitlines():
        if line.startswith("kopf_operators_errors_total{") and 'operator="reroller"' in line and "conflict" in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet", "CronJob"])
def test_concurrent_writers_still_roll_exactly_once(operator: OperatorProcess, namespace: str, core: Any,
                                                    apps: Any, batch: Any, kind: str) -> None:
    """Someone else edits the workload all the time: our patch carries the resourceVersion we know,
    a 409 re-reads that one workload and decides again; still exactly one rollout per change. Rounds
    repeat until the operator has met a 409 (its metric), so the conflict path really ran."""
    configmap(core, namespace, "conf", {"k": "0"})
    labels = {"app": "busy"}
    template = pod_template(nginx_pod_spec("conf"), labels)
    spec: dict[str, Any] = {"selector": {"matchLabels": labels}, "template": template}
    meta = {"name": "busy", "annotations": AUTO}
    edit: Any
    if kind == "Deployment":
        apps.create_namespaced_deployment(namespace, {"metadata": meta, "spec": {**spec, "replicas": 0}})
        edit = apps.patch_namespaced_deployment
    elif kind == "StatefulSet":
        apps.create_namespaced_stateful_set(namespace, {"metadata": meta, "spec": {**spec, "serviceName": "busy",
                                                                                   "replicas": 0}})
        edit = apps.patch_namespaced_stateful_set
    elif kind == "DaemonSet":
        apps.create_namespaced_daemon_set(namespace, {"metadata": meta, "spec": spec})
        edit = apps.patch_namespaced_daemon_set
    else:
        cronjob(batch, namespace, "busy", nginx_pod_spec("conf"), AUTO)
        edit = batch.patch_namespaced_cron_job

    def observed() -> str | None:
        obj = (batch.read_namespaced_cron_job("busy", namespace) if kind == "CronJob"
               else read(apps, kind, namespace, "busy"))
        return (obj.metadata.annotations or {}).get(settings.OBSERVED_HASH)

    def rollouts() -> int:
        return len(events(core, namespace, "busy", "Rerolled"))

    wait_for(observed, timeout=30, what="the baseline")
    before = conflicts(operator)
    rounds = 0
    while conflicts(operator) == before and rounds < 15:
        rounds += 1
        # Past the minimum interval, so that this change rolls at once, amid the other writer's edits.
        time.sleep(10.5 if rounds > 1 else 0)
        for i in range(20):
            edit("busy", namespace, {"metadata": {"labels": {"edit": f"{rounds}-{i}"}}})
            if i == 3:
                set_cm(core, namespace, "conf", {"k": str(rounds)})
        wait_for(lambda r=rounds: rollouts() == r, timeout=30, what=f"rollout #{rounds}")  # type: ignore[misc]
    assert conflicts(operator) > before, "no 409 met in 15 rounds: the conflict path was not exercised"
    stays(lambda: rollouts() == rounds, 3, what="exactly one rollout per change")
    assert not operator.errors(about=namespace)


def audit_entries(namespace: str, since: str) -> list[dict[str, Any]]:
    """The operator's requests about ``namespace`` after ``since`` (RFC 3339), from the audit log."""
    return AuditLog().about(namespace, since)


def test_requests_per_change_and_quiet_logs(operator: OperatorProcess, namespace: str, core: Any,
                                            apps: Any) -> None:
    """Source edited -> one write per affected workload, no reads; no INFO line for the events that
    change nothing."""
    if os.environ.get("OPERATOR_IDENTITY", "serviceaccount") == "admin":
        pytest.skip("requests are counted by the operator's ServiceAccount in the audit log")
    configmap(core, namespace, "shared", {"k": "1"})
    names = [f"user-{i}" for i in range(3)]
    for name in names:
        deployment(apps, namespace, name, nginx_pod_spec("shared"), AUTO, replicas=0)
    for name in names:
        baseline(apps, namespace, name)
    time.sleep(1)  # the audit log's timestamps are per request; leave a clear gap before counting
    since = audit_now()
    log_start = len(operator.output())

    # Events that change nothing: metadata-only edits of the source and the workloads, re-applies.
    for i in range(10):
        core.patch_namespaced_config_map("shared", namespace, {"metadata": {"labels": {"n": str(i)}}})
        apps.patch_namespaced_deployment(names[0], namespace, {"metadata": {"labels": {"n": str(i)}}})
    set_cm(core, namespace, "shared", {"k": "2"})
    for name in names:
        wait_for(lambda n=name: template_hash(apps, namespace, n), timeout=30, what=f"{name} rolled")  # type: ignore[misc]

    def counted() -> list[tuple[str, str, str]]:
        return [(e["verb"], e["objectRef"]["resource"], e["objectRef"].get("name", ""))
                for e in audit_entries(namespace, since)]
    wait_for(lambda: len([c for c in counted() if c[0] == "patch"]) >= len(names), timeout=15,
             what="the patches in the audit log")
    stays(lambda: len(counted()) == len(names), 2, what="nothing else")
    assert sorted(counted()) == sorted(("patch", "deployments", n) for n in names), counted()

    ours = [line for line in operator.output()[log_start:].splitlines()
            if "kopf_operators.rer" in line and "[INFO" in line and namespace in line]
    assert len(ours) == len(names), ours  # one line per rollout, nothing for the no-op events


# --- issue #22: the env-vars strategy, rollbacks and GitOps re-applies per strategy ------------------



@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet"])
def test_env_vars_strategy(reroller_with: Callable[..., OperatorProcess], namespace: str, core: Any, apps: Any,
                           kind: str) -> None:
    """REROLLER_RELOAD_STRATEGY=env-vars (Reloader's --reload-strategy=env-vars): a change sets
    STAKATER_<NAME>_<KIND> in the container using the source (no pod-template annotation); the next
    change replaces its value; each is one rollout by the controller-manager."""
    proc = reroller_with(REROLLER_RELOAD_STRATEGY="env-vars")
    configmap(core, namespace, "app.conf", {"k": "1"})
    secret(core, namespace, "creds", {"p": "1"})
    pod = {"containers": [
        {"name": "sidecar", "image": "busybox", "env": [{"name": "KEEP", "value": "me"}]},
        {"name": "app", "image": "app", "envFrom": [{"configMapRef": {"name": "app.conf"}}],
         "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}],
        "volumes": [{"name": "creds", "secret": {"secretName": "creds"}}]}
    labels = {"app": "w"}
    spec: dict[str, Any] = {"selector": {"matchLabels": labels}, "template": pod_template(pod, labels)}
    meta = {"name": "w", "annotations": {settings.RELOADER_AUTO: "true"}}
    if kind == "Deployment":
        apps.create_namespaced_deployment(namespace, {"metadata": meta, "spec": {**spec, "replicas": 1}})
        count = replicasets
    elif kind == "StatefulSet":
        apps.create_namespaced_stateful_set(namespace, {"metadata": meta, "spec": {**spec, "serviceName": "w",
                                                                                   "replicas": 1}})
        count = revisions
    else:
        apps.create_namespaced_daemon_set(namespace, {"metadata": meta, "spec": spec})
        count = revisions
    baseline(apps, namespace, "w", kind)
    wait_for(lambda: count(apps, namespace, "w") == 1, timeout=30, what="the first revision")

    set_cm(core, namespace, "app.conf", {"k": "2"})
    first = wait_for(lambda: stakater(apps, namespace, "w", "app", kind).get("STAKATER_APP_CONF_CONFIGMAP"),
                     timeout=30, what="STAKATER_APP_CONF_CONFIGMAP set")
    wait_for(lambda: count(apps, namespace, "w") == 2, timeout=30, what="a second revision")
    assert container_env(apps, namespace, "w", "sidecar", kind) == {"KEEP": "me"}, "other containers untouched"
    annotations = read(apps, kind, namespace, "w").spec.template.metadata.annotations or {}
    assert settings.LAST_RELOADED_FROM not in annotations and settings.CONFIG_HASH not in annotations

    # The Secret mounted by the same container: a second variable; the first one keeps its value.
    time.sleep(10.5)  # past the minimum interval, so that this change rolls at once
    core.patch_namespaced_secret("creds", namespace, {"stringData": {"p": "2"}})
    wait_for(lambda: "STAKATER_CREDS_SECRET" in stakater(apps, namespace, "w", "app", kind), timeout=30,
             what="STAKATER_CREDS_SECRET set")
    assert stakater(apps, namespace, "w", "app", kind)["STAKATER_APP_CONF_CONFIGMAP"] == first
    time.sleep(10.5)
    set_cm(core, namespace, "app.conf", {"k": "3"})
    wait_for(lambda: stakater(apps, namespace, "w", "app", kind)["STAKATER_APP_CONF_CONFIGMAP"] != first,
             timeout=30, what="the value replaced")
    wait_for(lambda: count(apps, namespace, "w") == 4, timeout=30, what="one revision per change")
    stays(lambda: count(apps, namespace, "w") == 4 and len(stakater(apps, namespace, "w", "app", kind)) == 2, 3,
          what="one variable per source, one rollout per change")
    assert len(events(core, namespace, "w", "Rerolled")) == 3
    assert not proc.errors()


def deployment_manifest(name: str, cm: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "annotations": {settings.RELOADER_AUTO: "true"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "app", "image": "app:1", "envFrom": [{"configMapRef": {"name": cm}}]}]}}}}


@pytest.mark.parametrize("strategy", ["annotations", "env-vars"])
def test_rollback_and_gitops_reapply_per_strategy(reroller_with: Callable[..., OperatorProcess], namespace: str,
                                                  core: Any, apps: Any, strategy: str) -> None:
    """What docs/reroller.md promises for each strategy: the manifest as kept in Git, applied again
    (server-side, by another field manager, as Argo CD and Flux do), shows no diff and rolls nothing:
    the field the operator wrote is its own; ``kubectl rollout undo`` goes back to the earlier pod
    template, and the operator does not roll the workload forward again (only a new change does)."""
    reroller_with(REROLLER_RELOAD_STRATEGY=strategy)
    configmap(core, namespace, "conf", {"k": "1"})
    manifest = json.dumps(deployment_manifest("app", "conf"))
    kubectl("apply", "--server-side", "--field-manager=gitops", "-n", namespace, "-f", "-", input=manifest)
    baseline(apps, namespace, "app")
    wait_for(lambda: replicasets(apps, namespace, "app") == 1, timeout=30, what="the first ReplicaSet")

    def marker() -> str | None:
        if strategy == "env-vars":
            return stakater(apps, namespace, "app", "app").get("STAKATER_CONF_CONFIGMAP")
        return reloaded_from(apps, namespace, "app")

    set_cm(core, namespace, "conf", {"k": "2"})
    rolled = wait_for(marker, timeout=30, what="the rollout")
    wait_for(lambda: replicasets(apps, namespace, "app") == 2, timeout=30, what="a second ReplicaSet")

    # GitOps: the same manifest applied again; a diff against it shows nothing.
    diff = kubectl("diff", "--server-side", "--field-manager=gitops", "-n", namespace, "-f", "-", input=manifest,
                   check=False)
    assert diff.returncode == 0, diff.stdout
    kubectl("apply", "--server-side", "--field-manager=gitops", "-n", namespace, "-f", "-", input=manifest)
    stays(lambda: marker() == rolled and replicasets(apps, namespace, "app") == 2, 4,
          what="the re-apply keeps the rollout and rolls nothing")

    # Rollback: the first template again, and it stays so.
    kubectl("rollout", "undo", "deployment/app", "-n", namespace)
    wait_for(lambda: marker() is None, timeout=30, what="the first template back")
    stays(lambda: marker() is None and replicasets(apps, namespace, "app") == 2, 4,
          what="the operator leaves the rollback alone")
    # A new change rolls again.
    time.sleep(10.5)  # past the minimum interval since the first rollout
    set_cm(core, namespace, "conf", {"k": "3"})
    wait_for(lambda: marker() not in (None, rolled), timeout=30, what="a rollout after the rollback")


# --- issue #22: key-scoped reloads (beyond Reloader) -------------------------------------------------


def test_used_keys_only(operator: OperatorProcess, namespace: str, core: Any, apps: Any) -> None:
    """``reroller.kopf-operators.dev/used-keys-only: "true"``: a workload rolls only when a key it uses
    changes. The three reference forms: a key reference (configMapKeyRef / secretKeyRef), a volume's
    ``items`` (also projected), and the whole source (envFrom)."""
    configmap(core, namespace, "shared", {"a": "1", "b": "1", "c": "1"})
    secret(core, namespace, "creds", {"user": "u1", "password": "p1"})
    scoped = {settings.AUTO: "true", settings.USED_KEYS_ONLY: "true"}
    keyref = {"containers": [{"name": "c", "image": "app", "env": [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "shared", "key": "a"}}},
        {"name": "P", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}]}]}
    items = {"containers": [{"name": "c", "image": "app", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
             "volumes": [{"name": "v", "projected": {"sources": [
                 {"configMap": {"name": "shared", "items": [{"key": "b", "path": "b"}]}}]}}]}
    whole = {"containers": [{"name": "c", "image": "app", "envFrom": [{"configMapRef": {"name": "shared"}}]}]}
    for name, spec in (("keyref", keyref), ("items", items), ("whole", whole)):
        deployment(apps, namespace, name, spec, scoped, replicas=0)
    for name in ("keyref", "items", "whole"):
        baseline(apps, namespace, name)
        wait_for(lambda n=name: replicasets(apps, namespace, n) == 1, timeout=30, what=f"{name}'s ReplicaSet")  # type: ignore[misc]

    def rolled(name: str) -> bool:
        return template_hash(apps, namespace, name) is not None

    set_cm(core, namespace, "shared", {"c": "2"})  # used by envFrom only
    wait_for(lambda: rolled("whole"), timeout=30, what="the whole-source user rolled")
    core.patch_namespaced_secret("creds", namespace, {"stringData": {"user": "u2"}})  # an unused Secret key
    stays(lambda: not rolled("keyref") and not rolled("items"), 4, what="unused keys roll nothing")

    set_cm(core, namespace, "shared", {"a": "2"})  # the key reference
    wait_for(lambda: rolled("keyref"), timeout=30, what="the key reference's user rolled")
    wait_for(lambda: replicasets(apps, namespace, "keyref") == 2, timeout=30, what="its second ReplicaSet")
    stays(lambda: not rolled("items"), 3, what="the items user not rolled by key a")

    set_cm(core, namespace, "shared", {"b": "2"})  # the volume's items
    wait_for(lambda: rolled("items"), timeout=30, what="the items user rolled")
    # The Event is posted after the write, in the background.
    wait_for(lambda: [e for e in events(core, namespace, "items", "Rerolled") if "configmap/shared" in e.message],
             timeout=15, what="a Rerolled event naming configmap/shared")

    # The prior value is read before the edit (after it, a fast rollout would already be the "prior").
    # Within keyref's minimum interval (10 s) since its last rollout, this one comes at the interval's end.
    before = template_hash(apps, namespace, "keyref")
    core.patch_namespaced_secret("creds", namespace, {"stringData": {"password": "p2"}})  # a used Secret key
    wait_for(lambda: template_hash(apps, namespace, "keyref") != before, timeout=30,
             what="the secretKeyRef's user rolled")
    assert not operator.errors(about=namespace)


# --- issue #22: alerts on reload ---------------------------------------------------------------------


class Receiver:
    """An HTTP receiver for alerts, on 127.0.0.1 only; ``status`` and ``delay`` make it a failing sink."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        import http.server
        import threading
        received = self.received = []  # type: list[tuple[str, dict[str, Any]]]
        self.status, self.delay = status, delay
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((self.path, json.loads(body or b"{}")))
                time.sleep(outer.delay)
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.token = os.urandom(8).hex()  # the credential part of the URL
        self.secret_path = f"/services/T0/B0/{self.token}"
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{self.secret_path}"

    def about(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        """The alerts about ``namespace``: the operator watches the whole cluster, and a workload left by
        an earlier test (its namespace still terminating) may roll, and alert, while this test runs."""
        return [(path, body) for path, body in self.received if f"(namespace {namespace})" in json.dumps(body)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    recv = Receiver()
    yield recv
    recv.close()


@pytest.mark.parametrize("sink", ["slack", "teams", "gchat", "webhook"])
def test_alert_on_reload(reroller_with: Callable[..., OperatorProcess], receiver: Receiver, namespace: str,
                         core: Any, apps: Any, sink: str) -> None:
    """Each sink gets one alert per rollout, in its own format, at the URL (a credential: from a
    Secret in the chart, here the environment it maps to), which never shows in the log, even with
    --verbose."""
    proc = reroller_with(REROLLER_ALERT_SINK=sink, REROLLER_ALERT_WEBHOOK_URL=receiver.url,
                         REROLLER_ALERT_ADDITIONAL_INFO="e2e-cluster")
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), AUTO)
    baseline(apps, namespace, "nginx")
    set_cm(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF.replace("v1", "v2")})
    assert_rolled_once(apps, core, namespace, "nginx", "configmap/nginx-conf")
    wait_for(lambda: receiver.about(namespace), timeout=15, what="the alert")
    stays(lambda: len(receiver.about(namespace)) == 1, 2, what="one alert per rollout")
    path, body = receiver.about(namespace)[0]
    assert path == receiver.secret_path
    text = f"e2e-cluster : Re-rolled Deployment nginx: data changed in configmap/nginx-conf (namespace {namespace})"
    expected = {"slack": {"attachments": [{"text": text, "color": "good", "author_name": "re-roller"}]},
                "teams": {"text": text}, "gchat": {"text": text},
                "webhook": {"kind": "Deployment", "namespace": namespace, "name": "nginx",
                            "sources": ["configmap/nginx-conf"], "action": "rolled", "message": text,
                            "additionalInfo": "e2e-cluster"}}[sink]
    assert body == expected
    assert receiver.token not in proc.output()


def test_failing_sink_never_blocks_or_repeats_a_rollout(reroller_with: Callable[..., OperatorProcess],
                                                        namespace: str, core: Any, apps: Any) -> None:
    """A sink that answers 500 after hanging past the alert timeout: every rollout still happens at
    once, exactly once; the failure is one WARNING line without the URL."""
    slow = Receiver(status=500, delay=3.0)
    try:
        proc = reroller_with(REROLLER_ALERT_SINK="webhook", REROLLER_ALERT_WEBHOOK_URL=slow.url,
                             REROLLER_ALERT_TIMEOUT_SECONDS="1")
        names = [f"app-{i}" for i in range(3)]
        configmap(core, namespace, "shared", {"k": "1"})
        for name in names:
            deployment(apps, namespace, name, nginx_pod_spec("shared"), AUTO, replicas=0)
        for name in names:
            baseline(apps, namespace, name)
        edited = time.monotonic()
        set_cm(core, namespace, "shared", {"k": "2"})
        for name in names:
            wait_for(lambda n=name: template_hash(apps, namespace, n), timeout=30, interval=0.02,  # type: ignore[misc]
                     what=f"{name} rolled")
        assert time.monotonic() - edited < 1.0, "rollouts waited for the sink"
        wait_for(lambda: len(slow.about(namespace)) == 3, timeout=30, what="the alerts attempted")
        wait_for(lambda: len([line for line in proc.output().splitlines()
                              if f" {namespace}/" in line and "alert failed" in line]) == 3,
                 timeout=15, what="each failure said once")
        stays(lambda: all(len(events(core, namespace, n, "Rerolled")) == 1 for n in names)
              and len(slow.about(namespace)) == 3, 4, what="no rollout or alert repeated")
        assert slow.token not in proc.output() and not proc.errors()
    finally:
        slow.close()


def test_notify_only(reroller_with: Callable[..., OperatorProcess], receiver: Receiver, namespace: str, core: Any,
                     apps: Any) -> None:
    """REROLLER_NOTIFY_ONLY=true: a change is alerted and recorded, nothing rolls."""
    reroller_with(REROLLER_ALERT_SINK="webhook", REROLLER_ALERT_WEBHOOK_URL=receiver.url, REROLLER_NOTIFY_ONLY="true")
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), AUTO)
    first = baseline(apps, namespace, "nginx")
    wait_for(lambda: replicasets(apps, namespace, "nginx") == 1, timeout=30, what="the first ReplicaSet")
    set_cm(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF.replace("v1", "v2")})
    wait_for(lambda: receiver.about(namespace), timeout=30, what="the alert")
    body = receiver.about(namespace)[0][1]
    assert body["action"] == "notified" and body["sources"] == ["configmap/nginx-conf"]
    wait_for(lambda: observed_hash(apps, namespace, "nginx") != first, timeout=15, what="the change recorded")
    wait_for(lambda: events(core, namespace, "nginx", "ChangeNotified"), timeout=10,
             what="the ChangeNotified Event(s)")  # posted after the write
    assert_not_rolled(apps, namespace, "nginx", 4)
    assert len(receiver.about(namespace)) == 1


def reload_samples(proc: OperatorProcess) -> dict[str, float]:
    """kopf_operators_reroller_reloads_total samples: labels -> value."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in proc.metrics().splitlines()
            if line.startswith("kopf_operators_reroller_reloads_total{")}


def test_metrics_by_namespace(reroller_with: Callable[..., OperatorProcess], namespace: str, core: Any,
                              apps: Any) -> None:
    """REROLLER_METRICS_BY_NAMESPACE=true (Reloader's enableMetricsByNamespace): a reload counter per
    namespace, workload kind and outcome; off by default (one series per namespace)."""
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "first", nginx_pod_spec("conf"), AUTO, replicas=0)
    plain = reroller_with()
    baseline(apps, namespace, "first")
    set_cm(core, namespace, "conf", {"k": "2"})
    wait_for(lambda: template_hash(apps, namespace, "first"), timeout=30, what="first rolled")
    assert reload_samples(plain) == {}

    counted = reroller_with(REROLLER_METRICS_BY_NAMESPACE="true")
    configmap(core, namespace, "other", {"k": "1"})
    deployment(apps, namespace, "second", nginx_pod_spec("other"), AUTO, replicas=0)
    baseline(apps, namespace, "second")
    set_cm(core, namespace, "other", {"k": "2"})
    wait_for(lambda: template_hash(apps, namespace, "second"), timeout=30, what="second rolled")
    series = f'kopf_operators_reroller_reloads_total{{kind="Deployment",namespace="{namespace}",outcome="rolled"}}'
    wait_for(lambda: reload_samples(counted).get(series) == 1.0, timeout=10, what=f"{series} = 1")


def test_chart_alert_url_from_a_secret_and_rollouts_rbac_only_when_enabled() -> None:
    """The chart: the alert URL reaches the operator only through secretKeyRef (never a plain value);
    a sink without a Secret is refused at render time; RBAC on Argo Rollouts only when enabled."""
    import subprocess

    from tests.kube import chart_objects

    def container_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
        deployment_ = next(o for o in objects if o["kind"] == "Deployment")
        return {e["name"]: e for e in deployment_["spec"]["template"]["spec"]["containers"][0]["env"]}

    def rollout_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        role = next(o for o in objects if o["kind"] == "ClusterRole")
        return [r for r in role["rules"] if "argoproj.io" in r.get("apiGroups", [])]

    default = chart_objects("r", "ns")
    assert "REROLLER_ALERT_WEBHOOK_URL" not in container_env(default) and not rollout_rules(default)
    enabled = chart_objects("r", "ns", "operators.reroller.alerts.sink=teams",
                            "operators.reroller.alerts.webhookUrlSecret.name=alert-hook",
                            "operators.reroller.argoRollouts=true")
    env = container_env(enabled)
    assert env["REROLLER_ALERT_WEBHOOK_URL"] == {"name": "REROLLER_ALERT_WEBHOOK_URL", "valueFrom": {
        "secretKeyRef": {"name": "alert-hook", "key": "url"}}}
    assert env["REROLLER_ARGO_ROLLOUTS"]["value"] == "true"
    assert rollout_rules(enabled) == [{"apiGroups": ["argoproj.io"], "resources": ["rollouts"],
                                       "verbs": ["list", "watch", "get", "patch"]}]
    with pytest.raises(subprocess.CalledProcessError) as refused:
        chart_objects("r", "ns", "operators.reroller.alerts.sink=slack")
    assert "webhookUrlSecret" in str(refused.value.stderr)


# --- issue #22: Argo Rollouts ------------------------------------------------------------------------

# A stand-in for Argo Rollouts' CRD (its group, version, kind and status subresource; any fields): the
# real CRDs are data of argoproj/argo-rollouts, not committed here. `make reloader-e2e` installs those.
ROLLOUT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "rollouts.argoproj.io"},
    "spec": {"group": "argoproj.io", "scope": "Namespaced",
             "names": {"plural": "rollouts", "singular": "rollout", "kind": "Rollout", "listKind": "RolloutList"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.fixture
def rollouts_installed(api: Any) -> Iterator[None]:
    """The Rollout CRD (the stand-in when none is installed) and, for the chart's ServiceAccount, the
    chart's own rule for rollouts (rendered with operators.reroller.argoRollouts=true)."""
    import kubernetes
    import yaml

    from tests.kube import E2E_RELEASE, as_service_account, chart_objects
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    created_crd = False
    try:
        extensions.read_custom_resource_definition("rollouts.argoproj.io")
    except kubernetes.client.ApiException as exc:
        assert exc.status == 404
        kubectl("apply", "-f", "-", input=yaml.safe_dump(ROLLOUT_CRD))
        created_crd = True
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/rollouts.argoproj.io")
    name = f"{E2E_RELEASE}-rollouts"
    if as_service_account():
        role = next(o for o in chart_objects(E2E_RELEASE, E2E_RELEASE, "operators.reroller.argoRollouts=true")
                    if o["kind"] == "ClusterRole")
        rules = [r for r in role["rules"] if "argoproj.io" in r["apiGroups"]]
        kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
             "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": E2E_RELEASE, "namespace": E2E_RELEASE}]}]))
    yield
    if as_service_account():
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
    if created_crd:
        extensions.delete_custom_resource_definition("rollouts.argoproj.io")

        def gone() -> bool:
            try:
                extensions.read_custom_resource_definition("rollouts.argoproj.io")
            except kubernetes.client.ApiException as exc:
                return bool(exc.status == 404)
            return False
        wait_for(gone, timeout=60, what="the stand-in Rollout CRD removed")


def rollout(custom: Any, ns: str, name: str, annotations: dict[str, str], cm: str) -> None:
    labels = {"app": name}
    custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "rollouts", {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "strategy": {"canary": {"steps": [{"setWeight": 50}]}},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "app", "image": "app:1", "envFrom": [{"configMapRef": {"name": cm}}]}]}}}})


def test_argo_rollouts(rollouts_installed: None, reroller_with: Callable[..., OperatorProcess], namespace: str,
                       core: Any, custom: Any) -> None:
    """REROLLER_ARGO_ROLLOUTS=true: Rollouts are re-rolled as Reloader does it: by default through the
    pod template (a new revision, Argo's canary or blue-green steps apply); with
    ``reloader.stakater.com/rollout-strategy: restart``, by setting ``spec.restartAt`` (the Rollout
    controller restarts the pods; the template is untouched)."""
    proc = reroller_with(REROLLER_ARGO_ROLLOUTS="true")
    configmap(core, namespace, "conf", {"k": "1"})
    rollout(custom, namespace, "canary", {settings.RELOADER_AUTO: "true"}, "conf")
    rollout(custom, namespace, "restarted", {settings.RELOADER_AUTO: "true", settings.ROLLOUT_STRATEGY: "restart"},
            "conf")

    def get(name: str) -> dict[str, Any]:
        return dict(custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "rollouts", name))

    for name in ("canary", "restarted"):
        wait_for(lambda n=name: settings.OBSERVED_HASH in (get(n)["metadata"].get("annotations") or {}),  # type: ignore[misc]
                 timeout=30, what=f"{name}'s baseline")
    set_cm(core, namespace, "conf", {"k": "2"})
    wait_for(lambda: settings.LAST_RELOADED_FROM in (get("canary")["spec"]["template"]["metadata"].get("annotations")
                                                     or {}), timeout=30, what="the canary Rollout's template annotated")
    restart_at = wait_for(lambda: get("restarted")["spec"].get("restartAt"), timeout=30, what="restartAt set")
    assert not (get("restarted")["spec"]["template"]["metadata"].get("annotations") or {})
    assert "restartAt" not in get("canary")["spec"]
    wait_for(lambda: events(core, namespace, "restarted", "Rerolled") and events(core, namespace, "canary", "Rerolled"),
             timeout=10, what="the Rerolled Events")  # posted after the write

    time.sleep(10.5)  # past the minimum interval: the next change restarts again, with a later time
    set_cm(core, namespace, "conf", {"k": "3"})
    wait_for(lambda: get("restarted")["spec"]["restartAt"] != restart_at, timeout=30, what="a second restart")
    assert not proc.errors()


def test_argo_rollouts_enabled_without_argo_installed(reroller_with: Callable[..., OperatorProcess], namespace: str,
                                                      core: Any, apps: Any, api: Any) -> None:
    """REROLLER_ARGO_ROLLOUTS=true on a cluster without the Rollout CRD: Deployments still roll."""
    import kubernetes
    try:
        kubernetes.client.ApiextensionsV1Api(api).read_custom_resource_definition("rollouts.argoproj.io")
        pytest.fail("the Rollout CRD is installed on this cluster (by make reloader-e2e?); this case needs it "
                    "absent: kubectl delete crd rollouts.argoproj.io, or run it on a fresh cluster")
    except kubernetes.client.ApiException as exc:
        assert exc.status == 404
    proc = reroller_with(REROLLER_ARGO_ROLLOUTS="true")
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), AUTO)
    baseline(apps, namespace, "nginx")
    set_cm(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF.replace("v1", "v2")})
    assert_rolled_once(apps, core, namespace, "nginx", "configmap/nginx-conf")
    assert not proc.errors()
