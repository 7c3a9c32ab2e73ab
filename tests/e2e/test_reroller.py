"""Re-roller against the real control plane: the controller-manager really creates ReplicaSets and
ControllerRevisions, so "rolled exactly once" is asserted on what Kubernetes did, not on our patch."""

from __future__ import annotations

import base64
import statistics
import time
from typing import Any

import pytest

from kopf_operators import reroller as logic
from tests.kube import OperatorProcess, stays, wait_for

AUTO = {logic.AUTO: "true"}
NGINX_CONF = "events {}\nhttp { server { listen 80; location / { return 200 'v1'; } } }\n"


# --- builders -----------------------------------------------------------------------------------


def configmap(core: Any, ns: str, name: str, data: dict[str, str]) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": data})


def set_cm(core: Any, ns: str, name: str, data: dict[str, str]) -> None:
    core.patch_namespaced_config_map(name, ns, {"data": data})


def secret(core: Any, ns: str, name: str, data: dict[str, str]) -> None:
    core.create_namespaced_secret(ns, {"metadata": {"name": name}, "stringData": data})


def pod_template(pod_spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec = pod_spec or {}
    spec.setdefault("containers", [{"name": "nginx", "image": "nginx:1.27"}])
    return {"metadata": {"labels": labels or {"app": "nginx"}, "annotations": annotations or {}}, "spec": spec}


def nginx_pod_spec(cm: str = "nginx-conf") -> dict[str, Any]:
    """The article's scenario: nginx.conf mounted from a ConfigMap."""
    return {
        "containers": [{"name": "nginx", "image": "nginx:1.27", "volumeMounts": [
            {"name": "nginx-conf", "mountPath": "/etc/nginx/nginx.conf", "subPath": "nginx.conf"}]}],
        "volumes": [{"name": "nginx-conf", "configMap": {"name": cm}}],
    }


def deployment(apps: Any, ns: str, name: str, pod_spec: dict[str, Any], annotations: dict[str, str],
               replicas: int = 1) -> None:
    labels = {"app": name}
    apps.create_namespaced_deployment(ns, {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": pod_template(pod_spec, labels)},
    })


# --- probes -------------------------------------------------------------------------------------


def read(apps: Any, kind: str, ns: str, name: str) -> Any:
    return {"Deployment": apps.read_namespaced_deployment, "StatefulSet": apps.read_namespaced_stateful_set,
            "DaemonSet": apps.read_namespaced_daemon_set}[kind](name, ns)


def template_hash(apps: Any, ns: str, name: str, kind: str = "Deployment") -> str | None:
    annotations = read(apps, kind, ns, name).spec.template.metadata.annotations or {}
    return annotations.get(logic.CONFIG_HASH)


def observed_hash(apps: Any, ns: str, name: str, kind: str = "Deployment") -> str | None:
    return (read(apps, kind, ns, name).metadata.annotations or {}).get(logic.OBSERVED_HASH)


def replicasets(apps: Any, ns: str, name: str) -> int:
    return sum(1 for rs in apps.list_namespaced_replica_set(ns).items
               if any(o.name == name for o in rs.metadata.owner_references or ()))


def revisions(apps: Any, ns: str, name: str) -> int:
    """ControllerRevisions of a StatefulSet/DaemonSet: one per distinct pod template."""
    return sum(1 for rev in apps.list_namespaced_controller_revision(ns).items
               if any(o.name == name for o in rev.metadata.owner_references or ()))


def events(core: Any, ns: str, name: str, reason: str) -> list[Any]:
    return list(core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},reason={reason}").items)


def no_kopf_state(obj: Any) -> bool:
    annotations = obj.metadata.annotations or {}
    return (not any("kopf.zalando.org" in key for key in annotations)
            and not any("kopf" in f for f in obj.metadata.finalizers or ()))


def baseline(apps: Any, ns: str, name: str, kind: str = "Deployment") -> str:
    return str(wait_for(lambda: observed_hash(apps, ns, name, kind), timeout=30, what=f"{name}'s baseline"))


def assert_not_rolled(apps: Any, ns: str, name: str, seconds: float = 4) -> None:
    stays(lambda: template_hash(apps, ns, name) is None and replicasets(apps, ns, name) == 1,
          seconds, what=f"{name} not rolled")


def assert_rolled_once(apps: Any, core: Any, ns: str, name: str, source: str, rs: int = 2) -> str:
    new = wait_for(lambda: template_hash(apps, ns, name), timeout=30, what=f"{name} re-rolled")
    wait_for(lambda: replicasets(apps, ns, name) == rs, timeout=30, what=f"{rs} ReplicaSets of {name}")
    wait_for(lambda: any(source in (e.message or "") for e in events(core, ns, name, "Rerolled")),
             timeout=15, what="a Rerolled event naming the source")
    stays(lambda: replicasets(apps, ns, name) == rs and template_hash(apps, ns, name) == new, 4,
          what=f"exactly one rollout of {name}")
    return str(new)


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
    assert events(core, namespace, "w", "Rerolled")


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


def test_burst_merges_and_flapping_is_rate_limited(operator: OperatorProcess, namespace: str, core: Any,
                                                   apps: Any) -> None:
    configmap(core, namespace, "a", {"k": "0"})
    secret(core, namespace, "s", {"k": "0"})
    spec = {"containers": [{"name": "c", "image": "app", "envFrom": [
        {"configMapRef": {"name": "a"}}, {"secretRef": {"name": "s"}}]}]}
    deployment(apps, namespace, "app", spec, AUTO)
    baseline(apps, namespace, "app")
    wait_for(lambda: replicasets(apps, namespace, "app") == 1, timeout=30, what="the first ReplicaSet")

    # A burst of changes to two sources within the debounce window: one rollout.
    for i in range(1, 4):
        set_cm(core, namespace, "a", {"k": str(i)})
        core.patch_namespaced_secret("s", namespace, {"stringData": {"k": str(i)}})
    first = wait_for(lambda: template_hash(apps, namespace, "app"), timeout=30, what="the first rollout")
    rolled_at = time.monotonic()
    wait_for(lambda: replicasets(apps, namespace, "app") == 2, timeout=30, what="a second ReplicaSet")

    # A flapping source right after: the next rollout waits for the rate limit (10 s by default).
    set_cm(core, namespace, "a", {"k": "flap"})
    set_cm(core, namespace, "a", {"k": "flop"})
    stays(lambda: replicasets(apps, namespace, "app") == 2, 4, what="the rate limit holding")
    wait_for(lambda: template_hash(apps, namespace, "app") != first, timeout=30, what="the second rollout")
    assert time.monotonic() - rolled_at >= 9
    wait_for(lambda: replicasets(apps, namespace, "app") == 3, timeout=30, what="a third ReplicaSet")
    stays(lambda: replicasets(apps, namespace, "app") == 3, 3, what="no rollout storm")
    messages = [e.message for e in events(core, namespace, "app", "Rerolled")]
    assert len(messages) == 2 and "configmap/a" in messages[0] and "secret/s" in " ".join(messages)

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

    # Not named: only the auto workload rolls.
    set_cm(core, namespace, "unlisted", {"k": "2"})
    assert_rolled_once(apps, core, namespace, "auto", "configmap/unlisted")
    assert template_hash(apps, namespace, "named") is None
    # Named secret: the named workload rolls.
    core.patch_namespaced_secret("tls", namespace, {"stringData": {"k": "2"}})
    assert_rolled_once(apps, core, namespace, "named", "secret/tls")


def test_missing_source_warns_and_operator_stays_healthy(operator: OperatorProcess, namespace: str,
                                                         core: Any, apps: Any) -> None:
    deployment(apps, namespace, "nginx", nginx_pod_spec("not-yet"), AUTO)
    wait_for(lambda: events(core, namespace, "nginx", "SourceMissing"), timeout=30, what="a SourceMissing event")
    warning = events(core, namespace, "nginx", "SourceMissing")[0]
    assert warning.type == "Warning" and "configmap/not-yet" in warning.message
    assert operator.running and operator._healthy()
    assert observed_hash(apps, namespace, "nginx") is None

    # Once it exists, the baseline is recorded and nothing is rolled.
    configmap(core, namespace, "not-yet", {"nginx.conf": NGINX_CONF})
    baseline(apps, namespace, "nginx")
    assert_not_rolled(apps, namespace, "nginx", 3)
    assert len(events(core, namespace, "nginx", "SourceMissing")) == 1  # warned once, not per event
    assert not operator.errors(about=namespace)


def test_reaction_latency(operator: OperatorProcess, namespace: str, core: Any, apps: Any) -> None:
    """ConfigMap edited -> pod template patched, over 20 edits (20 workloads, edited one after another).
    No assertion on time: the number is dominated by the debounce window (2 s by default)."""
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
        time.sleep(0.1)  # spread the edits a little, as real ones are

    def all_patched() -> bool:
        now = time.monotonic()
        for d in apps.list_namespaced_deployment(namespace).items:
            if d.metadata.name not in patched and (d.spec.template.metadata.annotations or {}).get(
                    logic.CONFIG_HASH):
                patched[d.metadata.name] = now
        return len(patched) == count

    wait_for(all_patched, timeout=60, interval=0.02, what="all workloads patched")
    latencies = sorted(patched[name] - edited[name] for name in edited)
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(f"\nreroller reaction (ConfigMap edit -> pod template patched), n={count}: "
          f"p50={p50 * 1000:.0f} ms, p99={p99 * 1000:.0f} ms, max={latencies[-1] * 1000:.0f} ms")

