# ruff: noqa: F811  (the fixtures imported from blackadder_helpers are parameters here)
"""Blackadder end-to-end, on the real local cluster with KWOK-backed pods.

ChaosAgents are cluster-scoped and destructive: every agent here sets targetNamespaces to this
test's namespaces, except the article's princeedmund, which runs under a forced dry-run operator.
"""

from __future__ import annotations

import calendar
import collections
import contextlib
import http.server
import itertools
import json
import os
import pathlib
import subprocess
import threading
import time
from typing import Any

import kubernetes
import pytest

from kopf_operators.blackadder import settings
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL
from tests.e2e.blackadder_helpers import (  # noqa: F401 (fixtures)
    GREEDY,
    PAUSE,
    Agents,
    G,
    P,
    V,
    agents,
    assert_field_rejected,
    cm_rv,
    condition,
    events,
    gone,
    ledger,
    ledger_location,
    live_pods,
    make_cm,
    make_deployment,
    make_pod,
    make_pods,
    next_cycles,
    other_namespace,
    replicas,
)
from tests.kube import OperatorProcess, operator_namespace, stays, wait_for
from testsupport.kubectl import apply_yaml, kubectl
from testsupport.launcher import free_port
from testsupport.paths import KUBECONFIG, REPO

# --- tests ------------------------------------------------------------------------------------------


def test_eagerness_over_100_is_rejected_and_columns_show_the_spec(agents: Agents, namespace: str) -> None:
    bad = kubectl("apply", "-f", "-", check=False, input=f"""
apiVersion: blackadder.io/v1beta1
kind: ChaosAgent
metadata: {{name: edmund-too-eager-{namespace[-5:]}}}
spec: {{tantrumMode: true, podTolerance: 10, eagerness: 200, pauseDuration: 30, targetNamespaces: [{namespace}]}}
""")
    assert bad.returncode != 0
    assert ("spec.eagerness: Invalid value: 200: spec.eagerness in body should be less than or equal to 100"
            in bad.stderr), bad.stderr

    name = agents.create({"tantrumMode": True, "podTolerance": 3, "eagerness": 40, "pauseDuration": 7,
                          "cancerMode": False, "ipsumMode": True, "excludedNamespaces": ["team-a"],
                          "targetNamespaces": [namespace], "paused": True})
    for resource in ("ca", "chaosagents.v1alpha1.blackadder.io"):  # both served versions
        lines = kubectl("get", resource, name).stdout.splitlines()
        header, row = lines[0].split(), lines[1].split()
        assert header[:9] == ["NAME", "TANTRUM", "TOLERANCE", "CANCER", "IPSUM", "EAGERNESS", "PAUSE", "DRYRUN",
                              "EXCLUDED"], header
        assert row[:9] == [name, "true", "3", "false", "true", "40", "7", "false", '["team-a"]'], row
    wide = kubectl("get", "ca", name, "-o", "wide").stdout
    assert f'["{namespace}"]' in wide and "TARGETS" in wide


def test_tantrum_kills_only_in_targets_and_respects_tolerance(
        agents: Agents, namespace: str, other_namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    make_pods(core, namespace, "victim", 4)
    make_pods(core, other_namespace, "bystander", 2)
    bystanders = live_pods(core, other_namespace)
    # Bare pods are single-replica workloads: only fair game when allowed (issue #14).
    name = agents.create({"tantrumMode": True, "podTolerance": 2, "eagerness": 100, "pauseDuration": PAUSE,
                          "seed": 1, "targetNamespaces": [namespace, other_namespace, "kube-system"],
                          "excludedNamespaces": [other_namespace], "allowSingleReplica": True})
    wait_for(lambda: len(live_pods(core, namespace)) == 2, timeout=30, what="2 pods killed down to the tolerance")
    wait_for(lambda: agents.status(name).get("actions", {}).get("tantrum") == 2, timeout=20, what="status counts")
    stays(lambda: len(live_pods(core, namespace)) == 2, seconds=PAUSE + 1, what="tolerance respected next cycle")
    assert live_pods(core, other_namespace) == bystanders
    assert len(events(core, "PodKilled", namespace=namespace)) == 2
    wait_for(lambda: len(events(core, "PodKilled", agent=name)) == 2, timeout=10, what="events on the agent")
    status = agents.status(name)
    assert condition(status, "Ready")["status"] == "True" and condition(status, "DryRun")["status"] == "False"
    assert status["lastCycle"]["candidates"]["pods"] <= 4  # nothing from kube-system or the excluded namespace


def test_cancer_and_ipsum_confined_live_edit_and_revert(
        agents: Agents, namespace: str, other_namespace: str,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    ns, out = namespace, other_namespace
    make_deployment(apps, ns, "grow", 1)
    make_deployment(apps, ns, "zero", 0)
    make_deployment(apps, out, "outside", 1)
    original = {"a": "1", "b": "two"}
    make_cm(core, ns, "settings", original)
    make_cm(core, ns, "other", {"x": "y"})
    untouched = {(ns, "frozen"): make_cm(core, ns, "frozen", {"k": "v"}, immutable=True),
                 (ns, "empty"): make_cm(core, ns, "empty", None),
                 (out, "outside"): make_cm(core, out, "outside", {"k": "v"})}
    wait_for(lambda: core.read_namespaced_config_map("kube-root-ca.crt", ns), what="kube-root-ca.crt")
    for n in (ns, out, "kube-public"):  # kube-root-ca.crt, kube-public and the excluded namespace
        for cm in core.list_namespaced_config_map(n).items:
            if (n, cm.metadata.name) not in {(ns, "settings"), (ns, "other")}:
                untouched.setdefault((n, cm.metadata.name), cm.metadata.resource_version)

    name = agents.create({"cancerMode": True, "ipsumMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                          "seed": 2, "targetNamespaces": [ns, out, "kube-public"], "excludedNamespaces": [out]})
    wait_for(lambda: replicas(apps, ns, "grow") >= 2, timeout=30, what="grow doubled")
    wait_for(lambda: core.read_namespaced_config_map("settings", ns).data != original, timeout=20, what="ipsum")
    scribbled = core.read_namespaced_config_map("settings", ns).data
    assert set(scribbled) == set(original) and all(len(v) > 20 for v in scribbled.values())
    assert replicas(apps, ns, "zero") == 0
    assert replicas(apps, out, "outside") == 1
    for (n, cm), rv in untouched.items():
        assert cm_rv(core, n, cm) == rv, f"{n}/{cm} was touched"
    # Events are posted in the background, after the write they report.
    wait_for(lambda: events(core, "DeploymentScaled", namespace=ns) and events(core, "ConfigMapIpsumed", namespace=ns),
             timeout=15, what="the DeploymentScaled and ConfigMapIpsumed Events")

    # A live edit takes effect on the next cycle: no more growth once a cycle ran with the new spec.
    generation = agents.patch_spec(name, {"cancerMode": False, "ipsumMode": False})
    wait_for(lambda: agents.status(name).get("observedGeneration") == generation, timeout=20, what="edit seen")
    seen = agents.status(name)["cycle"]
    grown, settings_rv = replicas(apps, ns, "grow"), cm_rv(core, ns, "settings")
    wait_for(lambda: agents.status(name)["cycle"] > seen, timeout=20, what="one more cycle")
    assert replicas(apps, ns, "grow") == grown and cm_rv(core, ns, "settings") == settings_rv
    assert agents.status(name)["lastCycle"]["cancer"] == 0

    # Someone edits "other" after the agent: revert restores the rest and reports that one.
    core.patch_namespaced_config_map("other", ns, {"data": {"x": "human"}})
    agents.patch_spec(name, {"revert": True})
    wait_for(lambda: agents.status(name).get("revert", {}).get("processed"), timeout=20, what="revert")
    revert = agents.status(name)["revert"]
    assert replicas(apps, ns, "grow") == 1
    assert core.read_namespaced_config_map("settings", ns).data == original
    assert core.read_namespaced_config_map("other", ns).data == {"x": "human"}
    assert f"ConfigMap/{ns}/other" in revert["changed"]
    assert f"Deployment/{ns}/grow" in revert["restored"] and f"ConfigMap/{ns}/settings" in revert["restored"]
    wait_for(lambda: events(core, "RevertSkipped", agent=name), timeout=10, what="a RevertSkipped event")
    assert ledger(core, name)["undo"] == {}


def test_dry_run_changes_nothing_but_reports(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    make_pods(core, namespace, "pod", 3)
    make_deployment(apps, namespace, "web", 1)
    cm_version = make_cm(core, namespace, "settings", {"a": "1"})
    pods = live_pods(core, namespace)
    generation = apps.read_namespaced_deployment("web", namespace).metadata.generation
    name = agents.create({"tantrumMode": True, "cancerMode": True, "ipsumMode": True, "eagerness": 100,
                          "podTolerance": 0, "pauseDuration": PAUSE, "dryRun": True, "targetNamespaces": [namespace],
                          "allowSingleReplica": True, "maxKillsPerCycle": "100%"})

    def reported() -> bool:
        would = agents.status(name).get("wouldBe", {})
        return would.get("tantrum", 0) >= 3 and would.get("cancer", 0) >= 1 and would.get("ipsum", 0) >= 1

    wait_for(reported, timeout=30, what="would-be actions in status")
    status = agents.status(name)
    assert condition(status, "DryRun")["status"] == "True" and condition(status, "DryRun")["reason"] == "Spec"
    assert status.get("actions", {}) == {"tantrum": 0, "cancer": 0, "ipsum": 0}
    wait_for(lambda: events(core, "WouldIpsumConfigMap", namespace=namespace), timeout=10, what="target events")
    assert events(core, "WouldKillPod", agent=name) and events(core, "WouldScaleDeployment", namespace=namespace)

    def unchanged() -> bool:
        dep = apps.read_namespaced_deployment("web", namespace)
        return (pods.items() <= live_pods(core, namespace).items() and cm_rv(core, namespace, "settings") == cm_version
                and dep.spec.replicas == 1 and dep.metadata.generation == generation)

    stays(unchanged, seconds=3, what="nothing changed in dry-run")
    assert any(e.get("outcome") == "would-ipsum" for e in ledger(core, name)["journal"])


def _epoch(iso: str) -> float:
    return float(calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")))


def test_restart_keeps_the_ledger_and_delete_reverts(
        agents: Agents, operator: OperatorProcess, namespace: str,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    make_deployment(apps, namespace, "grow", 1)
    name = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE, "seed": 3,
                          "targetNamespaces": [namespace]})
    wait_for(lambda: replicas(apps, namespace, "grow") >= 2, timeout=30, what="first doubling")
    operator.kill()  # SIGKILL: no graceful shutdown
    before_kill = ledger(core, name)
    assert before_kill["undo"][f"Deployment/{namespace}/grow"]["before"] == 1
    grown = replicas(apps, namespace, "grow")
    operator.start()
    wait_for(lambda: replicas(apps, namespace, "grow") == grown * 2, timeout=30, what="growth after restart")

    def recorded() -> dict[str, Any]:
        lg = ledger(core, name)
        return lg if any(e.get("after") == grown * 2 for e in lg["journal"]) else {}

    after = wait_for(recorded, timeout=10, what="the cycle in the ledger")
    assert after["undo"][f"Deployment/{namespace}/grow"]["before"] == 1  # the original, not lost
    cycles = [e["cycle"] for e in after["journal"] if e.get("outcome") == "scaled"]
    # No cycle number repeated or restarted (a SIGKILL mid-cycle may lose that cycle's journal line,
    # never its write-ahead undo entry).
    assert cycles == sorted(set(cycles)) and cycles[-1] > before_kill["cycle"] >= 1
    times = sorted({_epoch(e["at"]) for e in after["journal"]})
    assert all(b - a >= PAUSE - 1 for a, b in itertools.pairwise(times))  # no extra cycle on restart

    ledger_ns, ledger_name = ledger_location(name)
    agents.delete(name)  # revertOnDelete (the default): scaled back, ledger gone
    agents.names.remove(name)
    assert replicas(apps, namespace, "grow") == 1
    assert gone(lambda: core.read_namespaced_secret(ledger_name, ledger_ns))
    stays(lambda: replicas(apps, namespace, "grow") == 1, seconds=3, what="no action after deletion")


def test_princeedmund_from_the_article_acts_under_forced_dry_run(
        operator: OperatorProcess, namespace: str, custom: kubernetes.client.CustomObjectsApi,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    # The article's YAML is cluster-wide: only ever run it here with CHAOS_DRY_RUN=true.
    versions = {f"cm-{i:02d}": make_cm(core, namespace, f"cm-{i:02d}", {"k": "v"}) for i in range(30)}
    operator.stop()
    dry = OperatorProcess(files=["operators/blackadder.py"], env={"CHAOS_DRY_RUN": "true"}, log_name="blackadder-dry")
    dry.start()
    agents = Agents(custom)
    try:
        apply_yaml((REPO / "manifests" / "examples" / "blackadder-princeedmund.yaml").read_text())
        agents.names.append("princeedmund")

        def acted() -> dict[str, Any]:
            status = agents.status("princeedmund")
            return status if status.get("wouldBe", {}).get("ipsum", 0) >= 1 else {}

        status = wait_for(acted, timeout=30, what="princeedmund's first (dry-run) cycle")
        dry_run = condition(status, "DryRun")
        assert dry_run["status"] == "True" and dry_run["reason"] == "OperatorForced", dry_run
        assert status["actions"] == {"tantrum": 0, "cancer": 0, "ipsum": 0}
        assert status["lastCycle"]["candidates"]["configMaps"] >= 30
        for cm, rv in versions.items():
            assert cm_rv(core, namespace, cm) == rv
        wait_for(lambda: events(core, "WouldIpsumConfigMap", agent="princeedmund"), timeout=10, what="events")
        assert not dry.errors(), dry.errors()
    finally:
        for agent in agents.names:
            agents.delete(agent)
        dry.stop()


# --- issue #14: the guards ------------------------------------------------------------------------------


def make_labelled_pod(core: kubernetes.client.CoreV1Api, ns: str, name: str, labels: dict[str, str],
                      annotations: dict[str, str] | None = None) -> str:
    pod = core.create_namespaced_pod(ns, {
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "image": "test"}]}})
    return str(pod.metadata.uid)


def uid_of(core: kubernetes.client.CoreV1Api, ns: str, name: str) -> str | None:
    return live_pods(core, ns).get(name)




def test_pod_and_namespace_selectors_scope_every_mode(
        agents: Agents, namespace: str, other_namespace: str,
        core: kubernetes.client.CoreV1Api, apps: kubernetes.client.AppsV1Api) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": {"chaos": "yes"}}})
    before: dict[str, Any] = {}
    for ns in (namespace, other_namespace):
        make_labelled_pod(core, ns, "victim", {"app": "victim"})
        make_labelled_pod(core, ns, "bystander", {"app": "other"})
        make_deployment(apps, ns, "victim", 1)  # pod template labels app=victim: matches the podSelector
        make_deployment(apps, ns, "other", 1)
        before[ns] = make_cm(core, ns, "settings", {"a": "1"})
    opted_out = make_labelled_pod(core, namespace, "victim-opted-out",
                                  {"app": "victim", "blackadder.io/chaos": "false"})
    bystander = uid_of(core, namespace, "bystander")
    outside = live_pods(core, other_namespace)
    name = agents.create({**GREEDY, "tantrumMode": True, "cancerMode": True, "ipsumMode": True,
                          "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["victim"]}]},
                          "namespaceSelector": {"matchLabels": {"chaos": "yes"}},
                          "targetNamespaces": [namespace, other_namespace]})
    wait_for(lambda: uid_of(core, namespace, "victim") is None, timeout=30, what="the victim pod killed")
    wait_for(lambda: replicas(apps, namespace, "victim") >= 2, timeout=30, what="the matching Deployment grown")
    wait_for(lambda: cm_rv(core, namespace, "settings") != before[namespace], timeout=30, what="ipsum in scope")
    next_cycles(agents, name)
    assert uid_of(core, namespace, "bystander") == bystander  # podSelector
    assert uid_of(core, namespace, "victim-opted-out") == opted_out  # the opt-out label
    assert replicas(apps, namespace, "other") == 1  # pod template does not match
    # Nothing at all in the namespace that the namespaceSelector does not match.
    assert {k: v for k, v in live_pods(core, other_namespace).items() if not k.startswith(("victim-", "other-"))} \
        == {k: v for k, v in outside.items() if not k.startswith(("victim-", "other-"))}
    assert replicas(apps, other_namespace, "victim") == 1 and replicas(apps, other_namespace, "other") == 1
    assert cm_rv(core, other_namespace, "settings") == before[other_namespace]
    assert not events(core, "PodKilled", namespace=other_namespace)


def test_max_kills_per_cycle_and_minimum_pod_age(
        agents: Agents, namespace: str, other_namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    make_pods(core, namespace, "pod", 6)
    make_pods(core, other_namespace, "young", 3)
    young = live_pods(core, other_namespace)
    capped = agents.create({**GREEDY, "tantrumMode": True, "maxKillsPerCycle": 2, "targetNamespaces": [namespace]})
    aged = agents.create({**GREEDY, "tantrumMode": True, "minPodAgeSeconds": 3600,
                          "targetNamespaces": [other_namespace]})
    wait_for(lambda: len(live_pods(core, namespace)) <= 2, timeout=40, what="6 pods killed, 2 per cycle")
    journal = ledger(core, capped)["journal"]
    per_cycle = collections.Counter(e["cycle"] for e in journal if e["outcome"] == "deleted")
    assert per_cycle and max(per_cycle.values()) <= 2 and sum(per_cycle.values()) >= 4, per_cycle
    next_cycles(agents, aged)
    status = agents.status(aged)
    assert status["lastCycle"]["candidates"]["pods"] == 0 and live_pods(core, other_namespace) == young


def test_annotation_selector_and_required_opt_in(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    enabled = {"chaos.alpha.kubernetes.io/enabled": "true"}
    make_labelled_pod(core, namespace, "both", {"blackadder.io/chaos": "true"}, enabled)
    annotated = make_labelled_pod(core, namespace, "annotated-only", {}, enabled)
    opted_in = make_labelled_pod(core, namespace, "opted-in-only", {"blackadder.io/chaos": "true"})
    name = agents.create({**GREEDY, "tantrumMode": True, "requireOptIn": True, "targetNamespaces": [namespace],
                          "annotationSelector": {"matchLabels": enabled}})
    wait_for(lambda: uid_of(core, namespace, "both") is None, timeout=30, what="the opted-in, annotated pod killed")
    next_cycles(agents, name)
    assert uid_of(core, namespace, "annotated-only") == annotated
    assert uid_of(core, namespace, "opted-in-only") == opted_in


def test_active_windows_idle_outside_and_act_inside(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    make_pods(core, namespace, "pod", 2)
    pods = live_pods(core, namespace)
    today = time.gmtime().tm_wday
    closed_day = settings.WEEKDAYS[(today + 3) % 7]  # a whole day, but not today (in UTC)
    name = agents.create({**GREEDY, "tantrumMode": True, "targetNamespaces": [namespace], "timeZone": "UTC",
                          "activeWindows": [{"weekdays": [closed_day], "from": "00:00", "to": "00:00"}]})
    def idle() -> dict[str, Any]:
        status = agents.status(name)
        return status if status.get("state") == "Idle" else {}

    status = wait_for(idle, timeout=20, what="Idle")
    active = condition(status, "Active")
    assert active["status"] == "False" and active["reason"] == "OutsideWindow" and "idle until" in active["message"]
    assert "Idle" in kubectl("get", "ca", name).stdout.splitlines()[1].split()
    stays(lambda: live_pods(core, namespace) == pods, seconds=PAUSE + 1, what="no chaos outside the windows")

    agents.patch_spec(name, {"timeZone": "Mars/Olympus"})
    wait_for(lambda: agents.status(name).get("state") == "Failed", timeout=20, what="an unknown time zone reported")
    wait_for(lambda: events(core, "InvalidSpec", agent=name), timeout=10, what="an InvalidSpec event")
    assert live_pods(core, namespace) == pods

    agents.patch_spec(name, {"timeZone": "UTC", "activeWindows": [{"from": "00:00", "to": "00:00"}]})
    wait_for(lambda: not live_pods(core, namespace), timeout=30, what="chaos inside the window")
    # The status follows the cycle's actions.
    wait_for(lambda: agents.status(name).get("state") == "Active", timeout=10, what="state Active")
    assert condition(agents.status(name), "Active")["status"] == "True"


def make_pdb(namespace: str, app: str, min_available: int) -> None:
    apply_yaml(f"""
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: {app}}}
spec:
  minAvailable: {min_available}
  selector: {{matchLabels: {{app: {app}}}}}
""", namespace)


def ready_pods(core: kubernetes.client.CoreV1Api, ns: str, prefix: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(ns).items
            if p.metadata.name.startswith(prefix) and p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())}


def test_last_ready_replica_kept_and_evictions_honour_budgets(
        agents: Agents, namespace: str, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api) -> None:
    make_deployment(apps, namespace, "single", 1)
    make_deployment(apps, namespace, "guarded", 3)
    make_deployment(apps, namespace, "pair", 2)
    make_pod(core, namespace, "bare")
    make_pdb(namespace, "guarded", 3)
    wait_for(lambda: len(ready_pods(core, namespace, "single")) == 1 and len(ready_pods(core, namespace, "guarded"))
             == 3 and len(ready_pods(core, namespace, "pair")) == 2, timeout=60, what="all replicas ready")
    kept = {**ready_pods(core, namespace, "single"), **live_pods(core, namespace)}
    kept = {k: v for k, v in kept.items() if k.startswith(("single", "bare"))}
    name = agents.create({"tantrumMode": True, "eagerness": 100, "pauseDuration": PAUSE, "maxKillsPerCycle": "100%",
                          "evictPods": True, "targetNamespaces": [namespace]})
    wait_for(lambda: [e for e in events(core, "PodKilled", namespace=namespace) if "evicted Pod" in e.message
                      and f"{namespace}/pair-" in e.message], timeout=30, what="a pair pod evicted")
    wait_for(lambda: [e for e in events(core, "EvictionRefused", namespace=namespace)
                      if f"{namespace}/guarded-" in e.message], timeout=30, what="the budget refusing an eviction")
    next_cycles(agents, name)
    current = {k: v for k, v in live_pods(core, namespace).items() if k.startswith(("single", "bare"))}
    assert current == kept  # the last ready replica of "single" and the bare pod were never candidates
    assert not [e for e in events(core, "PodKilled", namespace=namespace) if f"{namespace}/guarded-" in e.message]
    assert len(ready_pods(core, namespace, "guarded")) == 3


class Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


def test_cluster_wide_replica_cap_and_webhook_notifications(
        operator: OperatorProcess, namespace: str, other_namespace: str,
        custom: kubernetes.client.CustomObjectsApi, core: kubernetes.client.CoreV1Api,
        apps: kubernetes.client.AppsV1Api) -> None:
    make_deployment(apps, namespace, "a", 2)
    make_deployment(apps, other_namespace, "b", 2)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)  # local only: nothing leaves the machine
    Hook.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    operator.stop()
    capped = OperatorProcess(files=["operators/blackadder.py"], log_name="blackadder-capped",
                             env={"CHAOS_MAX_ADDED_REPLICAS": "3", "CHAOS_WEBHOOK_HOSTS": "127.0.0.1"})
    capped.start()
    agents = Agents(custom)
    # The URLs live in Secrets in the operator's namespace (key "address"), never in the agent.
    hooks = settings.ledger_namespace(operator_namespace())
    kubectl("create", "namespace", hooks, check=False)
    suffix = namespace[-5:]
    for secret, host in ((f"allowed-{suffix}", "127.0.0.1"), (f"refused-{suffix}", "localhost")):
        core.create_namespaced_secret(hooks, {"metadata": {"name": secret},
                                              "stringData": {"address": f"http://{host}:{port}/hook"}})
    try:
        first = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                               "targetNamespaces": [namespace],
                               "webhook": {"secretRef": {"name": f"allowed-{suffix}"}}})
        second = agents.create({"cancerMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                                "targetNamespaces": [other_namespace],
                                "webhook": {"secretRef": {"name": f"refused-{suffix}"}}})  # not an allowed host

        def added() -> int:
            return replicas(apps, namespace, "a") + replicas(apps, other_namespace, "b") - 4

        wait_for(lambda: added() == 3, timeout=40, what="3 replicas added by both agents together")
        next_cycles(agents, first)
        next_cycles(agents, second)
        assert added() == 3  # the cap holds across agents and cycles
        def one_per_action() -> bool:
            scaled = [e for e in ledger(core, first)["journal"] if e.get("outcome") == "scaled"]
            return bool(scaled) and len(Hook.received) == len(scaled)

        wait_for(one_per_action, timeout=10, what="one webhook notification per action")
        for payload in Hook.received:
            assert payload["agent"] == first and payload["mode"] == "cancer" and payload["kind"] == "Deployment"
            assert payload["namespace"] == namespace and payload["outcome"] == "scaled" and "before" not in payload
        wait_for(lambda: events(core, "WebhookRefused", agent=second), timeout=10, what="the refused host reported")
        assert not capped.errors(), capped.errors()
    finally:
        for agent in agents.names:
            agents.delete(agent)
        capped.stop()
        server.shutdown()
        for secret in (f"allowed-{suffix}", f"refused-{suffix}"):
            core.delete_namespaced_secret(secret, hooks)
    assert replicas(apps, namespace, "a") == 2 and replicas(apps, other_namespace, "b") == 2  # reverted


def test_ipsum_leaves_copyrator_sources_and_copies_alone_unless_included(
        agents: Agents, namespace: str, other_namespace: str, custom: kubernetes.client.CustomObjectsApi,
        core: kubernetes.client.CoreV1Api) -> None:
    custom.create_namespaced_custom_object("flant.com", "v1", namespace, "copyrators", {
        "apiVersion": "flant.com/v1", "kind": "CopyratorRule", "metadata": {"name": "rule"},
        "ruleType": "configmap", "selector": {"copy": "yes"}, "namespace": namespace,
        "targetNamespaces": [other_namespace]})
    source = core.create_namespaced_config_map(namespace, {"metadata": {"name": "source", "labels": {"copy": "yes"}},
                                                           "data": {"k": "v"}}).metadata.resource_version
    copy = core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "a-copy", "labels": {COPYRATOR_RULE_UID_LABEL: "some-rule-uid"}},
        "data": {"k": "v"}}).metadata.resource_version
    plain = make_cm(core, namespace, "plain", {"k": "v"})
    name = agents.create({"ipsumMode": True, "eagerness": 100, "pauseDuration": PAUSE,
                          "targetNamespaces": [namespace]})
    wait_for(lambda: cm_rv(core, namespace, "plain") != plain, timeout=30, what="the plain ConfigMap ipsumed")
    next_cycles(agents, name)
    assert cm_rv(core, namespace, "source") == source and cm_rv(core, namespace, "a-copy") == copy
    agents.patch_spec(name, {"sharedConfigMaps": "Include"})
    wait_for(lambda: cm_rv(core, namespace, "source") != source and cm_rv(core, namespace, "a-copy") != copy,
             timeout=30, what="sources and copies ipsumed once included")


@pytest.mark.parametrize(("field", "needle"), [
    ('maxKillsPerCycle: "lots"', 'maxKillsPerCycle must be a count (0 or more) or a percentage like "25%"'),
    ("maxKillsPerCycle: -1", "maxKillsPerCycle must be a count"),
    ("minPodAgeSeconds: -5", "should be greater than or equal to 0"),
    ('activeWindows: [{from: "25:00", to: "17:00"}]', "spec.activeWindows[0].from: Invalid value"),
    ('activeWindows: [{weekdays: [Someday], from: "09:00", to: "17:00"}]', 'supported values: "Mon"'),
    ('activeWindows: [{from: "09:00"}]', "spec.activeWindows[0].to: Required value"),
    ("podSelector: {matchExpressions: [{key: app, operator: In}]}", "In and NotIn need values"),
    ("namespaceSelector: {matchExpressions: [{key: app, operator: Near, values: [x]}]}", 'supported values: "In"'),
    ('webhook: {url: "https://example.invalid/x?token=t"}', "webhook.url is not accepted"),
    ("webhook: {secretRef: {name: Bad_Name}}", "spec.webhook.secretRef.name: Invalid value"),
    ("sharedConfigMaps: Maybe", 'supported values: "Skip", "Include"'),
])
def test_bad_guard_fields_are_rejected_with_a_readable_message(crds: None, field: str, needle: str) -> None:
    assert_field_rejected("bad-guard", field, needle)


def test_guarded_example_is_accepted(crds: None) -> None:
    path = REPO / "manifests" / "examples" / "blackadder-guarded.yaml"
    result = kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr


# --- side by side with chaoskube (a peer built from source: linki/chaoskube v0.39.1) -------------------


def chaoskube_binary() -> pathlib.Path | None:
    """$CHAOSKUBE, or the build under ~/.cache/kopf-operators/peers (see docs/blackadder.md)."""
    if os.environ.get("CHAOSKUBE"):
        return pathlib.Path(os.environ["CHAOSKUBE"])
    builds = sorted(pathlib.Path.home().glob(".cache/kopf-operators/peers/chaoskube-*/bin/chaoskube"))
    return builds[-1] if builds else None


def chaoskube_victims(binary: pathlib.Path, *flags: str) -> set[tuple[str, str]]:
    """One dry-run round of chaoskube (it acts once at start): the pods it would terminate."""
    out = subprocess.run([str(binary), f"--kubeconfig={KUBECONFIG}", "--interval=1h", "--max-runtime=4s",
                          "--max-kill=100", "--log-format=json", f"--metrics-address=127.0.0.1:{free_port()}",
                          *flags], capture_output=True, text=True, timeout=60)
    victims = set()
    for line in (out.stdout + out.stderr).splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("msg") == "terminating pod":
                victims.add((entry["namespace"], entry["name"]))
    return victims


@pytest.mark.peers  # not in `make test`: chaoskube's source is not on the Go module proxy (make peers-test)
def test_same_victims_as_chaoskube_with_the_same_filters(
        agents: Agents, namespace: str, other_namespace: str, core: kubernetes.client.CoreV1Api) -> None:
    binary = chaoskube_binary()
    assert binary is not None, "chaoskube is not built (docs/blackadder.md: side by side with chaoskube)"
    core.patch_namespace(namespace, {"metadata": {"labels": {"env": "chaos"}}})
    on = {"chaos": "on"}
    for ns in (namespace, other_namespace):
        make_labelled_pod(core, ns, "web-1", {"app": "web"}, on)
        make_labelled_pod(core, ns, "web-2", {"app": "web"})
        make_labelled_pod(core, ns, "api-1", {"app": "api"}, on)
        make_labelled_pod(core, ns, "db-1", {"app": "db"}, on)
    wait_for(lambda: all(p.status.phase == "Running" for ns in (namespace, other_namespace)
                         for p in core.list_namespaced_pod(ns).items), timeout=30, what="pods running")
    filters = ("--labels=app in (api,web)", "--annotations=chaos=on", "--namespace-labels=env=chaos",
               f"--namespaces={namespace},{other_namespace}")
    theirs = chaoskube_victims(binary, *filters)
    name = agents.create({
        **GREEDY, "tantrumMode": True, "dryRun": True, "targetNamespaces": [namespace, other_namespace],
        "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["api", "web"]}]},
        "annotationSelector": {"matchLabels": on}, "namespaceSelector": {"matchLabels": {"env": "chaos"}}})
    wait_for(lambda: agents.status(name).get("cycle"), timeout=20, what="a cycle")
    ours = {(e["namespace"], e["name"]) for e in ledger(core, name)["journal"]
            if e["cycle"] == 1 and e["outcome"] == "would-delete"}
    assert ours == theirs == {(namespace, "web-1"), (namespace, "api-1")}, (ours, theirs)

    # A day excluded in chaoskube's words is a day outside our windows: both stay still.
    today = time.strftime("%a", time.gmtime())
    others = [d for d in settings.WEEKDAYS if d != today]
    assert chaoskube_victims(binary, *filters, f"--excluded-weekdays={today}", "--timezone=UTC") == set()
    agents.patch_spec(name, {"activeWindows": [{"weekdays": others, "from": "00:00", "to": "00:00"}],
                             "timeZone": "UTC"})
    wait_for(lambda: agents.status(name).get("state") == "Idle", timeout=20, what="idle on the excluded day")
