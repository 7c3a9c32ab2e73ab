"""Copyrator's copy plan: which objects go where, what is pruned, what is refused or left alone."""

from __future__ import annotations

from typing import Any

import pytest

from kopf_operators import copyrator as logic

UID = "rule-uid-1"


def rule_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "flant.com/v1", "kind": "CopyratorRule",
        "metadata": {"name": "main-rule", "namespace": "default", "uid": UID, "generation": 3},
        "ruleType": "configmap", "selector": {"copyrator": "true"}, "namespace": "default",
    }
    body.update(fields)
    return body


def make_rule(**fields: Any) -> logic.Rule:
    return logic.parse_rule(rule_body(**fields))


def ns(name: str, active: bool = True, **labels: str) -> logic.NamespaceInfo:
    return logic.NamespaceInfo(name, labels, active)


NAMESPACES = [ns("default"), ns("a"), ns("b", team="x"), ns("kube-system"), ns("kube-public"),
              ns("kube-node-lease"), ns("gone", active=False)]


def cm(name: str, namespace: str = "default", labels: dict[str, str] | None = None,
       data: dict[str, str] | None = None, uid: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                         "labels": {"copyrator": "true"} if labels is None else labels,
                         "resourceVersion": "1"},
            "data": {"k": "v"} if data is None else data, **extra}


def copy_of(rule: logic.Rule, source: dict[str, Any], namespace: str) -> dict[str, Any]:
    body = logic.desired_copy(rule, source, namespace)
    body["metadata"]["uid"] = f"uid-copy-{namespace}"
    return body


# --- parsing ----------------------------------------------------------------------------------


def test_the_articles_top_level_rule_parses() -> None:
    rule = make_rule()
    assert (rule.rule_type, dict(rule.selector), rule.source_namespaces) == \
        ("configmap", {"copyrator": "true"}, ("default",))
    assert rule.target_namespaces is None and rule.key == "default/main-rule" and rule.generation == 3


def test_the_spec_form_and_a_namespace_list_parse() -> None:
    body = rule_body()
    for key in ("ruleType", "selector", "namespace"):
        del body[key]
    body["spec"] = {"ruleType": "secret", "selector": {"a": "b"}, "namespace": ["default", "other", "default"],
                    "targetNamespaces": ["x"], "excludedNamespaces": ["y"]}
    rule = logic.parse_rule(body)
    assert rule.kind == "Secret" and rule.source_namespaces == ("default", "other")
    assert rule.target_namespaces == ("x",) and rule.excluded_namespaces == ("y",)


@pytest.mark.parametrize(("fields", "message"), [
    ({"ruleType": "pod"}, "ruleType"),
    ({"selector": {}}, "selector"),
    ({"selector": {"copyrator": True}}, "quote"),
    ({"namespace": 5}, "namespace"),
    ({"namespace": []}, "namespace"),
    ({"namespace": ["ok", "Not_OK"]}, "Not_OK"),
    ({"spec": {"ruleType": "configmap"}}, "not both"),
])
def test_bad_rules_are_reported_readably(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(logic.RuleError, match=message):
        make_rule(**fields)


def test_missing_namespace_is_reported() -> None:
    body = rule_body()
    del body["namespace"]
    with pytest.raises(logic.RuleError, match="namespace"):
        logic.parse_rule(body)


def test_cross_namespace_sources_are_refused_unless_allowed() -> None:
    assert logic.refusal(make_rule(), allow_cross_namespace=False) is None
    rule = make_rule(namespace=["default", "secrets"])
    message = logic.refusal(rule, allow_cross_namespace=False)
    assert message and "'secrets'" in message and "COPYRATOR_ALLOW_CROSS_NAMESPACE" in message
    assert logic.refusal(rule, allow_cross_namespace=True) is None


# --- targets ----------------------------------------------------------------------------------


def test_default_targets_skip_sources_system_and_terminating_namespaces() -> None:
    assert logic.target_namespaces(make_rule(), NAMESPACES) == ["a", "b"]


def test_explicit_targets_may_name_system_namespaces() -> None:
    rule = make_rule(targetNamespaces=["kube-system", "a", "default", "missing"])
    assert logic.target_namespaces(rule, NAMESPACES) == ["a", "kube-system"]


def test_exclusions_and_namespace_selector() -> None:
    assert logic.target_namespaces(make_rule(excludedNamespaces=["a"]), NAMESPACES) == ["b"]
    assert logic.target_namespaces(make_rule(namespaceSelector={"matchLabels": {"team": "x"}}),
                                   NAMESPACES) == ["b"]
    expr = {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}
    assert logic.target_namespaces(make_rule(namespaceSelector=expr), NAMESPACES) == ["a"]


@pytest.mark.parametrize(("labels", "expected"), [
    ({"t": "x"}, True), ({"t": "y"}, False), ({}, False),
])
def test_label_selector_expressions(labels: dict[str, str], expected: bool) -> None:
    selector = {"matchExpressions": [{"key": "t", "operator": "In", "values": ["x"]},
                                     {"key": "t", "operator": "Exists"},
                                     {"key": "u", "operator": "NotIn", "values": ["z"]}]}
    assert logic.matches_label_selector(labels, selector) is expected


# --- the plan ---------------------------------------------------------------------------------


def test_matching_sources_are_copied_everywhere_with_ownership_marks() -> None:
    rule = make_rule()
    source = cm("settings", labels={"copyrator": "true", "app": "x"})
    result = logic.plan(rule, [source, cm("other", labels={"copyrator": "false"})], NAMESPACES, [])
    assert [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in result.creates] == \
        [("a", "settings"), ("b", "settings")]
    copy = result.creates[0]
    assert copy["data"] == {"k": "v"}
    assert copy["metadata"]["labels"] == {"copyrator": "true", "app": "x", logic.RULE_UID_LABEL: UID}
    annotations = copy["metadata"]["annotations"]
    assert annotations[logic.RULE_ANNOTATION] == "default/main-rule"
    assert annotations[logic.SOURCE_ANNOTATION] == "default/settings"
    assert annotations[logic.SOURCE_UID_ANNOTATION] == "uid-default-settings"
    assert annotations[logic.HASH_ANNOTATION] == logic.content_hash("uid-default-settings", source)
    assert "uid" not in copy["metadata"] and "resourceVersion" not in copy["metadata"]
    assert result.desired == 2 and result.writes == 2 and [str(r) for r in result.sources] == ["default/settings"]


def test_copies_in_sync_cause_no_writes() -> None:
    rule = make_rule()
    source = cm("settings")
    existing = [copy_of(rule, source, "a"), copy_of(rule, source, "b")]
    result = logic.plan(rule, [source], NAMESPACES, existing)
    assert result.writes == 0 and result.unchanged == 2


@pytest.mark.parametrize("change", ["data", "removed-key", "labels", "hand-edit", "annotation"])
def test_changes_are_propagated(change: str) -> None:
    rule = make_rule()
    source = cm("settings", data={"k": "v", "k2": "v2"})
    stale = copy_of(rule, source, "a")
    if change == "data":
        source["data"]["k"] = "new"
    elif change == "removed-key":
        del source["data"]["k2"]
    elif change == "labels":
        source["metadata"]["labels"]["extra"] = "1"
    elif change == "hand-edit":
        stale["data"]["k"] = "edited by hand"
        assert logic.drifted(stale)
    else:
        stale["metadata"]["annotations"][logic.SOURCE_UID_ANNOTATION] = "other"
    result = logic.plan(rule, [source], [ns("default"), ns("a")], [stale])
    assert [(old["metadata"]["namespace"], recreate) for old, _, recreate in result.updates] == [("a", False)]
    new = result.updates[0][1]
    assert new["data"] == source["data"]
    assert logic.in_sync(new, logic.desired_copy(rule, source, "a"))


def test_secret_type_change_and_immutable_copies_are_recreated() -> None:
    rule = make_rule(ruleType="secret")
    source = cm("creds", kind="Secret", type="Opaque")
    source["kind"] = "Secret"
    old = copy_of(rule, source, "a")
    source["data"] = {"k": "changed"}
    old["immutable"] = True
    result = logic.plan(rule, [source], [ns("default"), ns("a")], [old])
    assert [recreate for _, _, recreate in result.updates] == [True]
    old2 = copy_of(rule, source, "a")
    old2["type"] = "kubernetes.io/dockerconfigjson"
    assert logic.needs_recreate(old2, logic.desired_copy(rule, source, "a"))


def test_foreign_objects_are_conflicts_never_touched() -> None:
    rule = make_rule()
    source = cm("settings")
    foreign = cm("settings", namespace="a", labels={})
    other_rule = copy_of(rule, source, "b")
    other_rule["metadata"]["labels"][logic.RULE_UID_LABEL] = "another-rule"
    result = logic.plan(rule, [source], NAMESPACES, [foreign, other_rule])
    assert [str(r) for r in result.conflicts] == ["a/settings", "b/settings"]
    assert result.writes == 0 and result.desired == 2


def test_pruning_deletes_only_our_copies() -> None:
    rule = make_rule(targetNamespaces=["a"])
    source = cm("settings")
    ours_b = copy_of(rule, source, "b")  # b is no longer a target
    ours_gone = copy_of(rule, cm("deleted-source"), "a")  # the source is gone / stopped matching
    ours_terminating = copy_of(rule, source, "gone")  # the namespace deletes it anyway
    foreign = cm("deleted-source", namespace="b", labels={})
    result = logic.plan(rule, [source], NAMESPACES, [ours_b, ours_gone, ours_terminating, foreign])
    assert sorted(str(r) for r in result.deletes) == ["a/deleted-source", "b/settings"]
    assert all(r.uid.startswith("uid-copy-") for r in result.deletes)


def test_source_that_stops_matching_is_pruned() -> None:
    rule = make_rule()
    source = cm("settings", labels={"copyrator": "no"})
    result = logic.plan(rule, [source], NAMESPACES, [copy_of(rule, cm("settings"), "a")])
    assert [str(r) for r in result.deletes] == ["a/settings"] and not result.creates


@pytest.mark.parametrize("secret_type", sorted(logic.FORBIDDEN_SECRET_TYPES))
def test_token_and_helm_secrets_are_never_copied(secret_type: str) -> None:
    rule = make_rule(ruleType="secret")
    secret = cm("tok", kind="Secret", type=secret_type)
    result = logic.plan(rule, [secret], NAMESPACES, [])
    assert not result.creates and result.skipped == [f"default/tok: Secrets of type {secret_type} are never copied"]


def test_copies_are_never_sources_and_first_source_namespace_wins() -> None:
    rule = make_rule(namespace=["default", "second"])
    a_copy = copy_of(make_rule(metadata={"name": "x", "namespace": "y", "uid": "other"}), cm("c"), "default")
    first, second = cm("same"), cm("same", namespace="second", data={"k": "second"})
    result = logic.plan(rule, [second, first, a_copy], NAMESPACES, [])
    assert {c["metadata"]["namespace"] for c in result.creates} == {"a", "b"}
    assert all(c["data"] == {"k": "v"} for c in result.creates)
    assert not result.skipped


def test_secret_values_never_appear_in_status_or_annotations() -> None:
    rule = make_rule(ruleType="secret")
    secret = cm("creds", kind="Secret", type="Opaque", data={"password": "Y2FuYXJ5LXZhbHVl"})
    foreign = cm("creds", namespace="b", labels={}, kind="Secret")
    result = logic.plan(rule, [secret], NAMESPACES, [foreign])
    status = logic.build_status(rule, None, result)
    assert "Y2FuYXJ5LXZhbHVl" not in repr(status)
    assert "Y2FuYXJ5LXZhbHVl" not in repr(result.creates[0]["metadata"])


# --- status -----------------------------------------------------------------------------------


def test_status_counts_conditions_and_stability() -> None:
    rule = make_rule()
    source = cm("settings")
    result = logic.plan(rule, [source], NAMESPACES, [cm("settings", namespace="b", labels={})])
    status = logic.build_status(rule, None, result, now="T1")
    assert (status["desired"], status["copied"], status["conflicted"], status["observedGeneration"]) == (2, 1, 1, 3)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Conflict"]["status"] == "True"
    assert "b/settings" in conds["Conflict"]["message"] and conds["Refused"]["status"] == "False"
    # The same observation later is not a change: nothing to write.
    again = logic.build_status(rule, status, result, now="T2")
    assert not logic.status_changed(status, again)


def test_refused_and_invalid_status() -> None:
    rule = make_rule(namespace="elsewhere")
    problem = logic.RuleError(logic.refusal(rule, False) or "", "Refused")
    status = logic.build_status(rule, None, problem=problem)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Refused"]["status"] == "True" and conds["Ready"]["reason"] == "Refused"
    assert "copied" not in status


def test_routing_of_events_to_rules() -> None:
    entry = logic.index_entry(rule_body())
    assert entry is not None
    assert logic.routes_to(entry, "configmap", cm("x"))
    assert not logic.routes_to(entry, "secret", cm("x"))
    assert not logic.routes_to(entry, "configmap", cm("x", namespace="a"))
    assert not logic.routes_to(entry, "configmap", cm("x", labels={}))
    assert logic.routes_to(entry, "configmap", cm("x", labels={}), known_sources={"default/x"})
    assert logic.routes_to(entry, "configmap", cm("x", namespace="a", labels={logic.RULE_UID_LABEL: UID}))
    assert logic.index_entry(rule_body(ruleType="nope")) is None


def test_concurrent_reconcile_requests_coalesce() -> None:
    """Requests arriving during a reconcile merge into one re-run; none is lost, none runs in parallel."""
    import threading
    import time

    from kopf_operators.copyrator_api import Coalescer

    coalescer = Coalescer()
    runs: list[float] = []
    active = threading.Semaphore(1)

    def work() -> None:
        assert active.acquire(blocking=False), "two reconciles of one rule ran at once"
        runs.append(time.monotonic())
        time.sleep(0.2)
        active.release()

    first = threading.Thread(target=coalescer.run, args=("rule", work))
    first.start()
    time.sleep(0.05)
    others = [threading.Thread(target=coalescer.run, args=("rule", work)) for _ in range(5)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join()
    assert len(runs) == 2
    coalescer.run("rule", work)  # idle again: runs at once
    assert len(runs) == 3


def test_rule_deletion_waits_for_a_running_reconcile() -> None:
    import threading
    import time

    from kopf_operators.copyrator_api import Coalescer

    coalescer = Coalescer()
    order: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        order.append("reconcile done")

    worker = threading.Thread(target=coalescer.run, args=("rule", slow))
    worker.start()
    time.sleep(0.05)
    with coalescer.exclusive("rule"):
        order.append("prune")
    worker.join()
    assert order == ["reconcile done", "prune"]
