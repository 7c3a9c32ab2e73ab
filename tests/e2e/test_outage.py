"""Outages never deadlock a deletion (issue #18, item 3), with the operator run as a process.

A CopyratorRule carries no finalizer: a namespace holding one is deleted while the operator is
stopped, and the copies that rule left elsewhere are pruned when the operator comes back (the orphan
sweep at start). A rule left by the previous version with Kopf's finalizer, caught in a namespace
deletion while the operator was down, is released by the new version at start. A ChaosAgent keeps its
finalizer (its revert needs the operator): its deletion waits (`make undeploy` then stops and says
so), and docs/deploy.md's way out releases it.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import kubernetes

from kopf_operators.copyrator import rules
from kopf_operators.core.conventions import COPYRATOR_RULE_UID_LABEL
from tests.kube import OperatorProcess, namespace_exists, stays, wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import CLUSTER_DIR, KUBECONFIG, REPO

G, V, P = rules.GROUP, rules.VERSION, rules.PLURAL
OLD_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"  # what the previous version put on every rule


def source_and_rule(core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi,
                    namespace: str, name: str, target: str) -> str:
    """A labelled ConfigMap and a rule copying it into ``target``; returns the rule's uid."""
    core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": {"outage": name}},
                                                  "data": {"from": namespace}})
    rule = custom.create_namespaced_custom_object(G, V, namespace, P, {
        "apiVersion": f"{G}/{V}", "kind": rules.KIND, "metadata": {"name": name},
        "spec": {"ruleType": "configmap", "selector": {"outage": name}, "namespace": [namespace],
                 "targetNamespaces": [target]}})
    return str(rule["metadata"]["uid"])


def copy_in(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> Any:
    items = core.list_namespaced_config_map(namespace, field_selector=f"metadata.name={name}").items
    return items[0] if items else None


def test_namespaces_holding_rules_are_deleted_while_the_operator_is_down_and_copies_are_pruned_at_start(
        operator: OperatorProcess, core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi,
        make_namespace: Callable[..., str]) -> None:
    target, current, upgraded, kept = (make_namespace(p) for p in ("out-target", "out-new", "out-old", "out-kept"))
    uids = {ns: source_and_rule(core, custom, ns, ns, target) for ns in (current, upgraded, kept)}
    foreign = core.create_namespaced_config_map(target, {"metadata": {"name": "foreign"}, "data": {"k": "v"}})
    for ns in (current, upgraded, kept):
        wait_for(lambda ns=ns: copy_in(core, target, ns), timeout=60, what=f"the copy of {ns}'s rule")  # type: ignore[misc]
        rule = custom.get_namespaced_custom_object(G, V, ns, P, ns)
        assert not rule["metadata"].get("finalizers"), "a rule carries no finalizer"
    kept_copy = copy_in(core, target, kept)

    operator.stop()
    # The rule as the previous version left it: with Kopf's finalizer.
    custom.patch_namespaced_custom_object(G, V, upgraded, P, upgraded,
                                          {"metadata": {"finalizers": [OLD_FINALIZER]}})
    core.delete_namespace(current)
    core.delete_namespace(upgraded)
    # The namespace controller empties both; only the old finalizer holds anything.
    wait_for(lambda: not namespace_exists(core, current), timeout=90, what=f"namespace {current} gone, operator down")
    # The namespace controller reaches the rule in its own time: wait for the deletion to be asked.
    def deleting() -> dict[str, Any]:
        rule = dict(custom.get_namespaced_custom_object(G, V, upgraded, P, upgraded))
        return rule if rule["metadata"].get("deletionTimestamp") else {}

    held = wait_for(deleting, timeout=60, what="the held rule deleting")
    assert held["metadata"]["finalizers"] == [OLD_FINALIZER]
    assert core.read_namespace(upgraded).status.phase == "Terminating"
    assert copy_in(core, target, current) and copy_in(core, target, upgraded), "nothing prunes while it is down"

    operator.start()
    wait_for(lambda: not namespace_exists(core, upgraded), timeout=60,
             what=f"namespace {upgraded} released by the new version (the old finalizer removed)")
    wait_for(lambda: not copy_in(core, target, current) and not copy_in(core, target, upgraded), timeout=60,
             what="the copies of both gone rules pruned")
    # Nothing else is touched: a live rule's copy, a foreign object.
    # (Compared by content, not resourceVersion: the operator log shows no write to them, and a
    # resourceVersion was once seen to move without one.)
    now = copy_in(core, target, kept)
    assert (now.metadata.uid, now.data, now.metadata.labels, now.metadata.annotations) == (
        kept_copy.metadata.uid, kept_copy.data, kept_copy.metadata.labels, kept_copy.metadata.annotations)
    still = core.read_namespaced_config_map("foreign", target)
    assert (still.metadata.uid, still.data, still.metadata.labels, still.metadata.annotations) == (
        foreign.metadata.uid, foreign.data, foreign.metadata.labels, foreign.metadata.annotations)
    # The operator pruned them (this process started after they went; nothing else deletes in ``target``).
    assert operator.metric("kopf_operators_actions_total", operator="copyrator", action="deleted") >= 2
    for ns in (current, upgraded):
        assert uids[ns] not in [c.metadata.labels.get(COPYRATOR_RULE_UID_LABEL)
                                for c in core.list_namespaced_config_map(target).items if c.metadata.labels]
    # The shared operator's log holds the whole suite's run: only this test's namespaces count (Kopf
    # logs a retried request at ERROR, such as a watch answered 429 while a new CRD's cache starts).
    assert not [e for ns in (target, current, upgraded, kept) for e in operator.errors(about=ns)]


def test_a_chaos_agent_deleted_while_the_operator_is_down_waits_until_released_by_hand(
        operator: OperatorProcess, custom: kubernetes.client.CustomObjectsApi, namespace: str) -> None:
    group, version, plural = "blackadder.io", "v1beta1", "chaosagents"
    name = f"outage-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(group, version, plural, {
        "apiVersion": f"{group}/{version}", "kind": "ChaosAgent", "metadata": {"name": name},
        "spec": {"tantrumMode": True, "eagerness": 0, "podTolerance": 0, "pauseDuration": 60, "dryRun": True,
                 "targetNamespaces": [namespace]}})

    def agent() -> dict[str, Any] | None:
        try:
            return dict(custom.get_cluster_custom_object(group, version, plural, name))
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    wait_for(lambda: (agent() or {}).get("metadata", {}).get("finalizers"), timeout=30,
             what="the agent's finalizer (Kopf adds it for the revert on delete)")
    operator.stop()
    # `make undeploy` deletes the agents first; with no operator to revert them it gives up, says so
    # and leaves the release alone (this one does not even exist: helm is never reached).
    undeploy = subprocess.run(["make", "-s", "undeploy"], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "KUBECONFIG": str(KUBECONFIG), "CLUSTER_DIR": str(CLUSTER_DIR),
                                   "RELEASE": "no-such-release", "UNDEPLOY_TIMEOUT": "5s"})
    assert undeploy.returncode != 0
    assert "ChaosAgents still wait for the operator" in undeploy.stderr, undeploy.stderr
    assert "release is left installed" in undeploy.stderr
    stays(lambda: (agent() or {}).get("metadata", {}).get("deletionTimestamp"), seconds=3,
          what="the agent waiting for the operator")
    # The way out when the operator will not come back (docs/deploy.md): release it by hand (what it
    # changed then stays changed).
    kubectl("patch", f"chaosagent/{name}", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    wait_for(lambda: agent() is None, timeout=30, what="the agent gone once released")
