"""Bad input across the four operators, as one table.

Every malformed input is either rejected by the API server with a message a user understands, or
accepted and then reported (status condition False with a reason, and a Warning Event), or, for
garbage that legitimately means "not for us", ignored. In every case the operator stays alive, logs no
traceback about it, does not retry in a hot loop, and leaves unrelated objects alone.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

from kopf_operators.blackadder import settings
from kopf_operators.copyrator import rules
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL
from kopf_operators.immortal import decisions as ic
from kopf_operators.reroller.settings import AUTO, CONFIG_HASH, CONFIGMAPS, OBSERVED_HASH, OBSERVED_SOURCES, SECRETS
from tests.e2e.faultkit import LogWindow
from tests.kube import OperatorProcess, namespace_exists, stays, wait_for

QUIET_SECONDS = 5.0
MAX_LINES_WHEN_QUIET = 3  # handler runs, warnings, errors about the object once it was handled
MAX_EVENTS_WHEN_QUIET = 0  # no new Events about the object once it has been reported

Body = dict[str, Any]
Build = Callable[[str, str], Body]  # (namespace, name) -> body


@dataclasses.dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    cluster: bool = False


IC = Kind(ic.GROUP, ic.VERSION, ic.PLURAL, ic.KIND)
RULE = Kind(rules.GROUP, rules.VERSION, rules.PLURAL, rules.KIND)
AGENT = Kind(settings.GROUP, settings.VERSION, settings.PLURAL, settings.KIND, cluster=True)


def ic_body(spec: Any, **meta: Any) -> Build:
    def build(ns: str, name: str) -> Body:
        body: Body = {"apiVersion": f"{ic.GROUP}/{ic.VERSION}", "kind": ic.KIND, "metadata": {"name": name, **meta}}
        if spec is not None:
            body["spec"] = spec
        return body
    return build


def rule_spec(**fields: Any) -> Build:
    def build(ns: str, name: str) -> Body:
        spec = {"ruleType": "configmap", "selector": {"bad": "input"}, "namespace": ns, **fields}
        return {"apiVersion": f"{rules.GROUP}/{rules.VERSION}", "kind": rules.KIND, "metadata": {"name": name},
                "spec": {k: v for k, v in spec.items() if v is not DROP}}
    return build


def rule_raw(top: Body) -> Build:
    def build(ns: str, name: str) -> Body:
        return {"apiVersion": f"{rules.GROUP}/{rules.VERSION}", "kind": rules.KIND, "metadata": {"name": name}, **top}
    return build


def agent_spec(**fields: Any) -> Build:
    """A ChaosAgent that would be harmless even if wrongly accepted: dry-run, paused, confined."""
    def build(ns: str, name: str) -> Body:
        spec = {"eagerness": 0, "dryRun": True, "paused": True, "targetNamespaces": [ns], **fields}
        return {"apiVersion": f"{settings.GROUP}/{settings.VERSION}", "kind": settings.KIND, "metadata": {"name": name},
                "spec": {k: v for k, v in spec.items() if v is not DROP}}
    return build


DROP = object()

# --- 1. rejected by the API server: (id, kind, body, substring of the message) --------------------

REJECTED: list[tuple[str, Kind, Build, str]] = [
    ("immortal-no-spec", IC, ic_body(None), "Required value"),
    ("immortal-no-image", IC, ic_body({}), "Required value"),
    ("immortal-image-empty", IC, ic_body({"image": ""}), "should be at least 1 chars long"),
    ("immortal-image-number", IC, ic_body({"image": 42}), "must be of type string"),
    ("immortal-image-blank", IC, ic_body({"image": "   "}), "without spaces"),
    ("immortal-image-with-space", IC, ic_body({"image": "nginx latest"}), "without spaces"),
    ("immortal-image-oversized", IC, ic_body({"image": "nginx:" + "a" * 5000}), "Too long"),
    ("immortal-spec-string", IC, ic_body("nginx"), "must be of type object"),
    ("immortal-name-too-long", IC, ic_body({"image": "nginx"}), "at most 63 characters"),
    ("copyrator-unknown-ruletype", RULE, rule_spec(ruleType="pod"), 'Unsupported value: "pod"'),
    ("copyrator-ruletype-kind-case", RULE, rule_spec(ruleType="ConfigMap"), "Unsupported value"),
    ("copyrator-selector-empty", RULE, rule_spec(selector={}), "should have at least 1 properties"),
    ("copyrator-selector-number", RULE, rule_spec(selector={"a": 1}), "must be of type string"),
    ("copyrator-selector-string-unparsed", RULE, rule_spec(selector="app in (a,"), "must be of type object"),
    ("copyrator-selector-value-oversized", RULE, rule_spec(selector={"a": "v" * 64}), "Too long"),
    ("copyrator-no-namespace", RULE, rule_spec(namespace=DROP), "Required value"),
    ("copyrator-no-ruletype", RULE, rule_spec(ruleType=DROP), "Required value"),
    ("copyrator-both-forms", RULE, rule_raw({"ruleType": "configmap", "selector": {"a": "b"}, "namespace": "x",
                                             "spec": {"ruleType": "configmap", "selector": {"a": "b"},
                                                      "namespace": "x"}}), "not both"),
    ("copyrator-neither-form", RULE, rule_raw({}), "not both and not neither"),
    ("copyrator-namespace-not-a-name", RULE, rule_spec(namespace="Bad_NS"), "should match"),
    ("copyrator-namespace-empty-list", RULE, rule_spec(namespace=[]), "should have at least 1 items"),
    ("copyrator-namespace-list-of-numbers", RULE, rule_spec(namespace=[1]), "must be of type string"),
    ("copyrator-namespace-mapping", RULE, rule_spec(namespace={"name": "x"}), "spec.namespace"),
    ("copyrator-target-not-a-name", RULE, rule_spec(targetNamespaces=["Not_A_Namespace"]), "should match"),
    ("copyrator-target-number", RULE, rule_spec(targetNamespaces=[5]), "must be of type string"),
    ("copyrator-nsselector-operator", RULE,
     rule_spec(namespaceSelector={"matchExpressions": [{"key": "a", "operator": "Like", "values": ["b"]}]}),
     'Unsupported value: "Like"'),
    ("copyrator-nsselector-in-without-values", RULE,
     rule_spec(namespaceSelector={"matchExpressions": [{"key": "a", "operator": "In"}]}),
     "non-empty values list"),
    ("blackadder-eagerness-over-100", AGENT, agent_spec(eagerness=101), "should be less than or equal to 100"),
    ("blackadder-eagerness-negative", AGENT, agent_spec(eagerness=-1), "should be greater than or equal to 0"),
    ("blackadder-no-eagerness", AGENT, agent_spec(eagerness=DROP), "Required value"),
    ("blackadder-eagerness-word", AGENT, agent_spec(eagerness="high"), "must be of type integer"),
    ("blackadder-pause-too-short", AGENT, agent_spec(pauseDuration=1), "should be greater than or equal to 5"),
    ("blackadder-tolerance-negative", AGENT, agent_spec(podTolerance=-3), "should be greater than or equal to 0"),
    ("blackadder-targets-empty", AGENT, agent_spec(targetNamespaces=[]), "should have at least 1 items"),
    ("blackadder-tantrum-word", AGENT, agent_spec(tantrumMode="yes"), "must be of type boolean"),
    ("blackadder-seed-negative", AGENT, agent_spec(seed=-1), "should be greater than or equal to 0"),
    ("blackadder-excluded-oversized", AGENT, agent_spec(excludedNamespaces=["n" * 64]), "Too long"),
]


def create(custom: Any, kind: Kind, ns: str, body: Body) -> Body:
    if kind.cluster:
        return dict(custom.create_cluster_custom_object(kind.group, kind.version, kind.plural, body))
    return dict(custom.create_namespaced_custom_object(kind.group, kind.version, ns, kind.plural, body))


def delete(custom: Any, kind: Kind, ns: str, name: str) -> None:
    try:
        if kind.cluster:
            custom.delete_cluster_custom_object(kind.group, kind.version, kind.plural, name)
        else:
            custom.delete_namespaced_custom_object(kind.group, kind.version, ns, kind.plural, name)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


def get(custom: Any, kind: Kind, ns: str, name: str) -> Body:
    if kind.cluster:
        return dict(custom.get_cluster_custom_object(kind.group, kind.version, kind.plural, name))
    return dict(custom.get_namespaced_custom_object(kind.group, kind.version, ns, kind.plural, name))


# --- the shared scene: a namespace with unrelated objects that must never change ------------------


@dataclasses.dataclass
class Scene:
    ns: str
    target: str
    fingerprint: Callable[[], dict[str, Any]]
    before: dict[str, Any]

    def untouched(self) -> None:
        assert self.fingerprint() == self.before, "an unrelated object was changed"


@pytest.fixture(scope="module")
def scene(core: Any, apps: Any, crds: None) -> Iterator[Scene]:
    suffix = uuid.uuid4().hex[:5]
    ns, target = f"bad-input-{suffix}", f"bad-input-target-{suffix}"
    for name in (ns, target):
        core.create_namespace({"metadata": {"name": name, "labels": {"kopf-operators.dev/test": "true"}}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns), timeout=30, what="the namespace")
    core.create_namespaced_config_map(ns, {"metadata": {"name": "unrelated"}, "data": {"keep": "me"}})
    core.create_namespaced_pod(ns, {"metadata": {"name": "unrelated"},
                                    "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}})
    apps.create_namespaced_deployment(ns, {
        "metadata": {"name": "unrelated"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "unrelated"}},
                 "template": {"metadata": {"labels": {"app": "unrelated"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                                       "envFrom": [{"configMapRef": {"name": "unrelated"}}]}]}}}})
    wait_for(lambda: core.read_namespaced_pod("unrelated", ns).status.phase == "Running", timeout=30,
             what="the unrelated pod")
    # The deployment controller annotates the Deployment (revision) when it first handles it: take
    # the fingerprint after that, so only a change by an operator can alter it.
    wait_for(lambda: (apps.read_namespaced_deployment("unrelated", ns).status.available_replicas or 0) >= 1
             and "deployment.kubernetes.io/revision" in (apps.read_namespaced_deployment("unrelated", ns)
                                                          .metadata.annotations or {}),
             timeout=60, what="the unrelated Deployment to be rolled out")

    def fingerprint() -> dict[str, Any]:
        dep = apps.read_namespaced_deployment("unrelated", ns)
        return {
            "configmap": core.read_namespaced_config_map("unrelated", ns).metadata.resource_version,
            "pod": core.read_namespaced_pod("unrelated", ns).metadata.resource_version,
            # A Deployment's status is the controller's: compare what an operator could write.
            "deployment": (dep.metadata.generation, dep.metadata.annotations, dep.metadata.labels,
                           dep.spec.template.metadata.annotations),
        }

    yield Scene(ns, target, fingerprint, fingerprint())
    for name in (ns, target):
        core.delete_namespace(name)


def quiet(operator: OperatorProcess, core: Any, ns: str | None, name: str, needle: str) -> None:
    """Once handled, nothing more happens about the object for QUIET_SECONDS: no hot retry loop.

    Counted: handler invocations, warnings and errors about the object (the tail of the handling
    that produced the report, such as Kopf's own bookkeeping lines, is let pass for a second first)."""
    time.sleep(1.0)
    log = LogWindow(operator)
    events_before = count_events(core, ns, name)
    time.sleep(QUIET_SECONDS)
    lines = [line for line in log.lines(needle)
             if "is invoked" in line or "[WARNING" in line or "[ERROR" in line]
    assert len(lines) <= MAX_LINES_WHEN_QUIET, "hot loop? " + "\n".join(lines[-10:])
    assert count_events(core, ns, name) - events_before <= MAX_EVENTS_WHEN_QUIET
    assert operator.running


def count_events(core: Any, ns: str | None, name: str) -> int:
    """Events the operators posted about the object (not the built-in controllers')."""
    selector = f"involvedObject.name={name}"
    items = (core.list_namespaced_event(ns, field_selector=selector) if ns
             else core.list_event_for_all_namespaces(field_selector=selector)).items
    ours = [e for e in items if "kopf" in f"{e.reporting_component} {e.source and e.source.component}"]
    return sum(e.count or 1 for e in ours)


def warnings(core: Any, ns: str, name: str) -> list[Any]:
    return [e for e in core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
            if e.type == "Warning"]


def condition(obj: Body, type_: str = "Ready") -> Body:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") == type_), {})


@pytest.mark.parametrize("kind, build, needle", [pytest.param(k, b, n, id=i) for i, k, b, n in REJECTED])
def test_rejected_readably(operator: OperatorProcess, custom: Any, scene: Scene, kind: Kind, build: Build,
                           needle: str, request: pytest.FixtureRequest) -> None:
    name = "x" * 64 if "name-too-long" in request.node.callspec.id else f"bad-{uuid.uuid4().hex[:8]}"
    body = build(scene.ns, name)
    try:
        create(custom, kind, scene.ns, body)
    except kubernetes.client.ApiException as exc:
        assert exc.status in (400, 422), exc
        message = json.loads(exc.body)["message"]
        assert needle in message, message
    else:
        delete(custom, kind, scene.ns, name)  # never leave a wrongly accepted object behind
        pytest.fail(f"the API server accepted it (expected a rejection containing {needle!r})")
    assert operator.running


# --- 2. accepted, then reported: condition False with a reason, and a Warning Event ---------------

REPORTED_RULES: list[tuple[str, Build, str]] = [
    ("copyrator-namespace-number", rule_spec(namespace=42), "Invalid"),
    ("copyrator-namespace-boolean", rule_spec(namespace=True), "Invalid"),
    ("copyrator-namespace-empty-mapping", rule_spec(namespace={}), "Invalid"),
    ("copyrator-source-namespace-missing", rule_spec(namespace="no-such-namespace-x1"), "Refused"),
]


@pytest.mark.parametrize("build, reason", [pytest.param(b, r, id=i) for i, b, r in REPORTED_RULES])
def test_rule_accepted_then_reported(operator: OperatorProcess, core: Any, custom: Any, scene: Scene,
                                     build: Build, reason: str) -> None:
    name = f"bad-{uuid.uuid4().hex[:8]}"
    log = LogWindow(operator)
    create(custom, RULE, scene.ns, build(scene.ns, name))
    try:
        cond = wait_for(lambda: condition(get(custom, RULE, scene.ns, name)), timeout=20,
                        what="the Ready condition")
        assert (cond["status"], cond["reason"]) == ("False", reason), cond
        assert cond["message"]
        wait_for(lambda: [e for e in warnings(core, scene.ns, name) if e.reason == reason], timeout=10,
                 what=f"a Warning Event {reason}")
        quiet(operator, core, scene.ns, name, f"{scene.ns}/{name}")
        assert log.tracebacks(name) == []
        scene.untouched()
    finally:
        delete(custom, RULE, scene.ns, name)


# --- 3. the re-roller: garbage annotations (no CRD, so Events are the report) ---------------------


def workload(ns: str, name: str, annotations: dict[str, str], conf: str = "unrelated") -> Body:
    return {"metadata": {"name": name, "annotations": annotations},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                                           "envFrom": [{"configMapRef": {"name": conf}}]}]}}}}


def rolled_out(apps: Any, ns: str, name: str) -> bool:
    """The Deployment controller has finished with it: its own status writes (each an event the
    re-roller's handler sees) are over before a quiet window starts counting."""
    dep = apps.read_namespaced_deployment(name, ns)
    st = dep.status
    return bool(st and (st.observed_generation or 0) >= dep.metadata.generation
                and (st.available_replicas or 0) == dep.spec.replicas == (st.updated_replicas or 0))


REROLLER_WARNED: list[tuple[str, dict[str, str]]] = [
    ("reroller-configmap-missing", {CONFIGMAPS: "does-not-exist"}),
    ("reroller-configmap-names-garbage", {CONFIGMAPS: ",, ;;%%,/x/, "}),
    ("reroller-secret-names-garbage", {SECRETS: "UPPER_case!,\u2603"}),
    ("reroller-annotation-oversized", {CONFIGMAPS: ",".join(f"missing-{i:05d}-" + "x" * 80
                                                            for i in range(1500))}),
]


@pytest.mark.parametrize("annotations", [pytest.param(a, id=i) for i, a in REROLLER_WARNED])
def test_reroller_garbage_names_warn_once(operator: OperatorProcess, core: Any, apps: Any, scene: Scene,
                                          annotations: dict[str, str]) -> None:
    name = f"bad-{uuid.uuid4().hex[:8]}"
    log = LogWindow(operator)
    apps.create_namespaced_deployment(scene.ns, workload(scene.ns, name, annotations))
    try:
        found = wait_for(lambda: [e for e in warnings(core, scene.ns, name) if e.reason == "SourceMissing"],
                         timeout=20, what="a Warning Event SourceMissing")
        assert len(found[0].message) <= 1024
        wait_for(lambda: rolled_out(apps, scene.ns, name), what=f"Deployment {name} rolled out")
        quiet(operator, core, scene.ns, name, f"{scene.ns}/{name}")
        dep = apps.read_namespaced_deployment(name, scene.ns)
        assert CONFIG_HASH not in (dep.spec.template.metadata.annotations or {}), "rolled on garbage"
        assert log.tracebacks(name) == []
        scene.untouched()
    finally:
        apps.delete_namespaced_deployment(name, scene.ns)


def test_reroller_non_boolean_auto_is_not_an_opt_in(operator: OperatorProcess, core: Any, apps: Any,
                                                   scene: Scene) -> None:
    name = f"bad-{uuid.uuid4().hex[:8]}"
    log = LogWindow(operator)
    apps.create_namespaced_deployment(scene.ns, workload(scene.ns, name, {AUTO: "maybe"}))
    try:
        quiet(operator, core, scene.ns, name, f"Deployment {scene.ns}/{name}")
        annotations = apps.read_namespaced_deployment(name, scene.ns).metadata.annotations or {}
        assert OBSERVED_HASH not in annotations  # "maybe" is not "true": nothing written
        assert log.tracebacks(name) == []
        scene.untouched()
    finally:
        apps.delete_namespaced_deployment(name, scene.ns)


def test_reroller_garbage_baseline_rolls_at_most_once(operator: OperatorProcess, core: Any, apps: Any,
                                                      scene: Scene) -> None:
    """A hand-edited, unparseable baseline: at most one (safe) rollout, then a clean baseline."""
    name = f"bad-{uuid.uuid4().hex[:8]}"
    log = LogWindow(operator)
    garbage = {AUTO: "true", OBSERVED_HASH: "zzz-not-a-hash", OBSERVED_SOURCES: "{not json"}
    apps.create_namespaced_deployment(scene.ns, workload(scene.ns, name, garbage))
    try:
        wait_for(lambda: (apps.read_namespaced_deployment(name, scene.ns).metadata.annotations or {})
                 .get(OBSERVED_HASH) != "zzz-not-a-hash", timeout=20, what="a clean baseline")
        quiet(operator, core, scene.ns, name, f"Deployment {scene.ns}/{name}")
        uid = apps.read_namespaced_deployment(name, scene.ns).metadata.uid
        sets = [rs for rs in apps.list_namespaced_replica_set(scene.ns).items
                if any(ref.uid == uid for ref in rs.metadata.owner_references or ())]
        assert len(sets) <= 2
        assert log.tracebacks(name) == []
        scene.untouched()
    finally:
        apps.delete_namespaced_deployment(name, scene.ns)


# --- 4. objects deleted while being handled ---------------------------------------------------------


def deletion_handled(log: LogWindow, namespace: str, name: str) -> bool:
    """Kopf has processed the object's DELETED event (its DEBUG line under --verbose), so every event
    of the object before it has been handled too (Kopf handles one object's events in order)."""
    return any("Deleted, really deleted, and we are notified" in line for line in log.lines(f"[{namespace}/{name}]"))


def test_immortal_deleted_at_once_leaves_no_pod(operator: OperatorProcess, core: Any, custom: Any,
                                                scene: Scene) -> None:
    log = LogWindow(operator)
    names = [f"gone-{uuid.uuid4().hex[:6]}" for _ in range(5)]
    for name in names:
        create(custom, IC, scene.ns, ic_body({"image": "busybox:1.36"})(scene.ns, name))
        delete(custom, IC, scene.ns, name)

    def leftovers() -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(scene.ns, label_selector=ic.OWNER_LABEL).items
                if p.metadata.labels[ic.OWNER_LABEL] in names]
    # The operator may handle an object's ADDED event after it is gone (a pod it then creates goes with
    # its owner): count from when each object's first event has been handled (a pod it creates is created
    # inside that handler), not from a first empty list.
    def handled(name: str) -> bool:
        return any("Handler 'immortal-event' succeeded" in line for line in log.lines(f"[{scene.ns}/{name}]"))
    wait_for(lambda: all(handled(name) for name in names), timeout=30, what="every object's events handled")
    wait_for(lambda: not leftovers(), timeout=30, what="no pods of deleted ImmortalContainers")
    stays(lambda: leftovers() == [], seconds=2, what="no pod re-created for a deleted ImmortalContainer")
    assert operator.running
    assert [t for name in names for t in log.tracebacks(name)] == []
    scene.untouched()


def test_copyrator_rule_deleted_at_once_leaves_no_copies(operator: OperatorProcess, core: Any, custom: Any,
                                                         scene: Scene) -> None:
    log = LogWindow(operator)
    source = f"src-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_config_map(scene.ns, {"metadata": {"name": source, "labels": {"gone": source}},
                                                 "data": {"a": "b"}})
    name = f"gone-{uuid.uuid4().hex[:6]}"
    uid = create(custom, RULE, scene.ns, rule_spec(selector={"gone": source},
                                                   targetNamespaces=[scene.target])(scene.ns, name))["metadata"]["uid"]
    delete(custom, RULE, scene.ns, name)
    try:
        # A copy made from the rule's ADDED event may land after it is gone: count from the deletion's handling.
        wait_for(lambda: deletion_handled(log, scene.ns, name), timeout=30, what="the deletion handled by the operator")
        wait_for(lambda: not core.list_config_map_for_all_namespaces(
            label_selector=f"{COPYRATOR_RULE_UID_LABEL}={uid}").items, timeout=30, what="no copies of a deleted rule")
        stays(lambda: not core.list_config_map_for_all_namespaces(
            label_selector=f"{COPYRATOR_RULE_UID_LABEL}={uid}").items,
              seconds=2, what="no copy re-created for a deleted rule")
        assert operator.running
        assert log.tracebacks(name) == []
        scene.untouched()
    finally:
        core.delete_namespaced_config_map(source, scene.ns)


def test_reroller_workload_deleted_while_debouncing(operator: OperatorProcess, core: Any, apps: Any,
                                                    scene: Scene) -> None:
    log = LogWindow(operator)
    name = f"gone-{uuid.uuid4().hex[:6]}"
    conf = f"{name}-conf"
    core.create_namespaced_config_map(scene.ns, {"metadata": {"name": conf}, "data": {"v": "0"}})
    apps.create_namespaced_deployment(scene.ns, workload(scene.ns, name, {AUTO: "true"}, conf=conf))
    try:
        wait_for(lambda: OBSERVED_HASH in (apps.read_namespaced_deployment(name, scene.ns)
                                           .metadata.annotations or {}), timeout=20, what="the baseline")
        core.patch_namespaced_config_map(conf, scene.ns, {"data": {"v": "1"}})
        apps.delete_namespaced_deployment(name, scene.ns)  # inside the debounce window
        stays(lambda: operator.running, seconds=4, what="the operator alive past the debounce window")
        assert log.tracebacks(name) == []
        scene.untouched()
    finally:
        core.delete_namespaced_config_map(conf, scene.ns)


def test_immortal_namespace_deleted_under_it(operator: OperatorProcess, core: Any, custom: Any) -> None:
    """Deleting a namespace with ImmortalContainers in it: the pods go first, and the API server
    forbids new content in a terminating namespace (403 NamespaceTerminating). That is the end of
    the story, not an error: no traceback, no retry every few seconds until the namespace is gone."""
    ns = f"bad-input-doomed-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": ns, "labels": {"kopf-operators.dev/test": "true"}}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns), timeout=30, what="the namespace")
    names = [f"doomed-{i}" for i in range(3)]
    for name in names:
        create(custom, IC, ns, ic_body({"image": "busybox:1.36"})(ns, name))
    wait_for(lambda: len(core.list_namespaced_pod(ns, label_selector=ic.OWNER_LABEL).items) == 3, timeout=30,
             what="the pods")
    log = LogWindow(operator)
    core.delete_namespace(ns)
    wait_for(lambda: not namespace_exists(core, ns), timeout=60, interval=0.5, what=f"namespace {ns} to be deleted")
    assert operator.running
    assert log.tracebacks(ns) == []
    errors = log.lines(f"[{ns}/") + log.lines(f" {ns}/")
    assert [line for line in errors if "[ERROR" in line] == [], "\n".join(errors[-10:])
