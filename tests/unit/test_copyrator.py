"""Copyrator's copy plan: which objects go where, what is pruned, what is refused or left alone."""

from __future__ import annotations

from typing import Any

import pytest

from kopf_operators.blackadder.settings import LEDGER_LABEL, OPT_LABEL
from kopf_operators.copyrator import rules
from kopf_operators.copyrator.copies import (
    Action,
    CopyView,
    Place,
    copy_view,
    decide,
    decide_sweep,
    desired_copy,
    patch_ops,
)
from kopf_operators.copyrator.tally import (
    Tally,
    build_status,
    decide_status,
    orphan_suspects,
    rule_gone,
    split_rule_key,
    status_changed,
)
from kopf_operators.core import conventions
from kopf_operators.core.conventions import COPY_SOURCE, COPYRATOR_RULE_UID_LABEL

UID = "rule-uid-1"


def rule_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "flant.com/v1", "kind": "CopyratorRule",
        "metadata": {"name": "main-rule", "namespace": "default", "uid": UID, "generation": 3},
        "ruleType": "configmap", "selector": {"copyrator": "true"}, "namespace": "default",
    }
    body.update(fields)
    return body


def make_rule(**fields: Any) -> rules.Rule:
    return rules.parse_rule(rule_body(**fields))


def ns(name: str, active: bool = True, **labels: str) -> rules.NamespaceInfo:
    return rules.NamespaceInfo(name, labels, active)


NAMESPACES = [ns("default"), ns("a"), ns("b", team="x"), ns("kube-system"), ns("kube-public"),
              ns("kube-node-lease"), ns("gone", active=False)]


def cm(name: str, namespace: str = "default", labels: dict[str, str] | None = None,
       data: dict[str, str] | None = None, uid: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                         "labels": {"copyrator": "true"} if labels is None else labels,
                         "resourceVersion": "1"},
            "data": {"k": "v"} if data is None else data, **extra}


def copy_of(rule: rules.Rule, source: dict[str, Any], namespace: str) -> dict[str, Any]:
    body = desired_copy(rule, source, namespace)
    body["metadata"].update(uid=f"uid-copy-{namespace}", resourceVersion="7")
    return body


def view_of(rule: rules.Rule, source: dict[str, Any], namespace: str) -> CopyView:
    return copy_view(copy_of(rule, source, namespace))


SETTINGS = rules.Options()


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
    rule = rules.parse_rule(body)
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
    with pytest.raises(rules.RuleError, match=message):
        make_rule(**fields)


def test_missing_namespace_is_reported() -> None:
    body = rule_body()
    del body["namespace"]
    with pytest.raises(rules.RuleError, match="namespace"):
        rules.parse_rule(body)


# --- targets ----------------------------------------------------------------------------------


def test_default_targets_skip_sources_system_and_terminating_namespaces() -> None:
    assert rules.target_namespaces(make_rule(), NAMESPACES) == ["a", "b"]


def test_explicit_targets_may_name_system_namespaces() -> None:
    rule = make_rule(targetNamespaces=["kube-system", "a", "default", "missing"])
    assert rules.target_namespaces(rule, NAMESPACES) == ["a", "kube-system"]


def test_exclusions_and_namespace_selector() -> None:
    assert rules.target_namespaces(make_rule(excludedNamespaces=["a"]), NAMESPACES) == ["b"]
    assert rules.target_namespaces(make_rule(namespaceSelector={"matchLabels": {"team": "x"}}),
                                   NAMESPACES) == ["b"]
    expr = {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}
    assert rules.target_namespaces(make_rule(namespaceSelector=expr), NAMESPACES) == ["a"]


@pytest.mark.parametrize(("labels", "expected"), [
    ({"t": "x"}, True), ({"t": "y"}, False), ({}, False),
])
def test_label_selector_expressions(labels: dict[str, str], expected: bool) -> None:
    selector = {"matchExpressions": [{"key": "t", "operator": "In", "values": ["x"]},
                                     {"key": "t", "operator": "Exists"},
                                     {"key": "u", "operator": "NotIn", "values": ["z"]}]}
    assert conventions.matches_label_selector(labels, selector) is expected



def test_a_rule_that_reads_only_another_namespace_pulls_into_its_own() -> None:
    rule = make_rule(namespace="shared")
    assert rule.pull
    namespaces = [*NAMESPACES, ns("shared")]
    assert rules.target_namespaces(rule, namespaces) == ["default"]
    # Explicit targets or a namespace selector make it a push rule again.
    assert not make_rule(namespace="shared", targetNamespaces=["a"]).pull
    assert rules.target_namespaces(make_rule(namespace="shared", targetNamespaces=["a", "shared"]),
                                   namespaces) == ["a"]


# --- consent ----------------------------------------------------------------------------------


def annotated(consent: str | None, namespace: str = "shared") -> dict[str, Any]:
    source = cm("settings", namespace=namespace)
    if consent is not None:
        source["metadata"]["annotations"] = {rules.ALLOWED_NAMESPACES_ANNOTATION: consent}
    return source


def test_same_namespace_rules_need_no_consent() -> None:
    rule = make_rule()
    source = cm("settings")
    assert rules.allowed_into(rule, source, "a", SETTINGS)
    assert rules.consent_problem(rule, source, ["a"], SETTINGS) is None


def test_a_cross_namespace_rule_without_consent_copies_nothing_and_says_why() -> None:
    rule = make_rule(namespace="shared", targetNamespaces=["a"])
    source = annotated(None)
    assert not rules.allowed_into(rule, source, "a", SETTINGS)
    problem = rules.consent_problem(rule, source, ["a"], SETTINGS)
    assert problem and "shared/settings" in problem and rules.ALLOWED_NAMESPACES_ANNOTATION in problem
    assert "COPYRATOR_ALLOW_CROSS_NAMESPACE" in problem
    # The operator-wide switch waives consent.
    waived = rules.Options(allow_cross_namespace=True)
    assert rules.allowed_into(rule, source, "a", waived) and rules.consent_problem(rule, source, ["a"], waived) is None


@pytest.mark.parametrize(("consent", "target", "allowed"), [
    ("a", "a", True), ("a,b", "b", True), (" a , team-* ", "team-x", True), ("team-*", "teamx", False),
    ("a", "b", False), ("", "a", False), ("*", "anything", True),
])
def test_consent_lists_names_and_globs(consent: str, target: str, allowed: bool) -> None:
    rule = make_rule(namespace="shared", targetNamespaces=[target])
    assert rules.allowed_into(rule, annotated(consent), target, SETTINGS) is allowed


def test_consent_that_allows_none_of_the_targets_is_a_refusal() -> None:
    rule = make_rule(namespace="shared", targetNamespaces=["a", "b"])
    assert rules.consent_problem(rule, annotated("a"), ["a", "b"], SETTINGS) is None  # b is only withheld
    problem = rules.consent_problem(rule, annotated("c"), ["a", "b"], SETTINGS)
    assert problem and "none of this rule's target namespaces" in problem


# --- the copy ---------------------------------------------------------------------------------


def test_copies_carry_ownership_marks_and_no_adopting_labels() -> None:
    rule = make_rule()
    source = cm("settings", labels={"copyrator": "true", "app": "x", "app.kubernetes.io/managed-by": "Helm",
                                    "helm.sh/chart": "c-1", "argocd.argoproj.io/instance": "i"})
    source["metadata"]["annotations"] = {"meta.helm.sh/release-name": "r", "note": "n"}
    source["metadata"]["ownerReferences"] = [{"kind": "Deployment", "name": "d", "uid": "u"}]
    copy = desired_copy(rule, source, "a")
    assert copy["data"] == {"k": "v"}
    assert copy["metadata"]["labels"] == {"copyrator": "true", "app": "x", COPYRATOR_RULE_UID_LABEL: UID}
    annotations = copy["metadata"]["annotations"]
    assert set(annotations) == {*rules.OUR_ANNOTATIONS}  # source annotations not copied by default
    assert annotations[rules.RULE_ANNOTATION] == "default/main-rule"
    assert annotations[COPY_SOURCE] == "default/settings"
    assert annotations[rules.SOURCE_UID_ANNOTATION] == "uid-default-settings"
    assert "ownerReferences" not in copy["metadata"] and "uid" not in copy["metadata"]


def test_options_strip_more_labels_and_copy_annotations() -> None:
    rule = make_rule(stripLabels=["app", "team.example.com/*"], copyAnnotations=True,
                     stripAnnotations=["internal/*"])
    source = cm("settings", labels={"copyrator": "true", "app": "x", "team.example.com/owner": "t", "keep": "1"})
    source["metadata"]["annotations"] = {"meta.helm.sh/release-name": "r", "note": "n", "internal/x": "y",
                                         rules.ALLOWED_NAMESPACES_ANNOTATION: "*"}
    copy = desired_copy(rule, source, "a")
    assert copy["metadata"]["labels"] == {"copyrator": "true", "keep": "1", COPYRATOR_RULE_UID_LABEL: UID}
    annotations = copy["metadata"]["annotations"]
    assert annotations["note"] == "n" and annotations[rules.ANNOTATIONS_COPIED] == "true"
    assert "meta.helm.sh/release-name" not in annotations and "internal/x" not in annotations
    assert rules.ALLOWED_NAMESPACES_ANNOTATION not in annotations  # the consent stays on the source
    # A copied annotation is content: its change is drift to repair.
    view = copy_view({**copy, "metadata": {**copy["metadata"], "uid": "u", "resourceVersion": "1",
                                           "annotations": {**annotations, "note": "changed"}}})
    assert view.drifted


def test_a_copy_never_carries_the_projects_own_labels_or_annotations() -> None:
    """A source's keys under the project's domains (Blackadder's ledger label, its opt-in label, the
    re-roller's annotations, any Copyrator marker) would steer an operator in the target namespace:
    they are never copied; the copier's own bookkeeping keys are the ones it sets itself."""
    rule = make_rule(copyAnnotations=True)
    project = {LEDGER_LABEL: "x", OPT_LABEL: "true", "reroller.kopf-operators.dev/auto": "true",
               "kopf-operators.dev/anything": "1", "x.blackadder.io/y": "1", COPYRATOR_RULE_UID_LABEL: "forged"}
    foreign = {"example.com/kopf-operators.dev": "kept", "notkopf-operators.dev/x": "kept", "team": "kept"}
    source = cm("settings", labels={"copyrator": "true", **project, **foreign})
    source["metadata"]["annotations"] = {**project, **foreign, rules.PUSH_TO_ANNOTATION: "*"}
    for each in (rule, rules.push_rule(source)):
        assert isinstance(each, rules.Rule)
        copy = desired_copy(each, source, "a")
        labels, annotations = copy["metadata"]["labels"], copy["metadata"]["annotations"]
        assert labels[COPYRATOR_RULE_UID_LABEL] == each.uid  # the copier's own, not the source's forgery
        assert not [key for key in project if key in labels and key != COPYRATOR_RULE_UID_LABEL]
        assert {k: v for k, v in labels.items() if k in foreign} == foreign
        assert not [key for key in project if key in annotations]
        if each.copy_annotations:
            assert {k: v for k, v in annotations.items() if k in foreign} == foreign
        assert rules.PUSH_TO_ANNOTATION not in annotations  # nor a push onwards from the copy


def test_copies_in_sync_cause_no_writes() -> None:
    rule = make_rule()
    source = cm("settings")
    view = view_of(rule, source, "a")
    assert not view.drifted and view.rule_uid == UID and view.source == "default/settings"
    assert decide(UID, desired_copy(rule, source, "a"), view) is Action.NONE


def test_a_copy_written_before_data_stamps_is_not_rewritten_for_the_stamp_alone() -> None:
    """An upgrade writes nothing: a copy an earlier version wrote (no data stamp) and otherwise in sync
    is left as it is; it gets its stamp with its next write (a hand edit of it is still repaired)."""
    rule, source = make_rule(), cm("settings")
    old = copy_of(rule, source, "a")
    del old["metadata"]["annotations"][conventions.DATA_STAMP]
    assert decide(UID, desired_copy(rule, source, "a"), copy_view(old)) is Action.NONE
    old["data"] = {"k": "edited by hand"}
    assert decide(UID, desired_copy(rule, source, "a"), copy_view(old)) is Action.PATCH


@pytest.mark.parametrize("change", ["data", "removed-key", "labels", "hand-edit", "source-uid"])
def test_changes_are_propagated_by_one_patch(change: str) -> None:
    rule = make_rule()
    source = cm("settings", data={"k": "v", "k2": "v2"})
    stale_body = copy_of(rule, source, "a")
    if change == "data":
        source["data"]["k"] = "new"
    elif change == "removed-key":
        del source["data"]["k2"]
    elif change == "labels":
        source["metadata"]["labels"]["extra"] = "1"
    elif change == "hand-edit":
        stale_body["data"]["k"] = "edited by hand"
    else:
        source["metadata"]["uid"] = "recreated"
    stale = copy_view(stale_body)
    assert stale.drifted is (change == "hand-edit")
    desired = desired_copy(rule, source, "a")
    assert decide(UID, desired, stale) is Action.PATCH
    ops = patch_ops(stale, desired)
    assert ops[0] == {"op": "replace", "path": "/metadata/resourceVersion", "value": "7"}  # optimistic
    by_path = {op["path"]: op["value"] for op in ops}
    assert by_path["/data"] == source["data"]  # the whole map: removed keys go
    assert by_path["/metadata/labels"] == desired["metadata"]["labels"]
    assert by_path["/metadata/annotations/" + rules.HASH_ANNOTATION.replace("/", "~1")] == \
        desired["metadata"]["annotations"][rules.HASH_ANNOTATION]
    # Applying the patch yields a copy in sync.
    patched = copy_of(rule, source, "a")
    assert decide(UID, desired, copy_view(patched)) is Action.NONE


def test_secret_type_change_and_immutable_copies_are_recreated() -> None:
    rule = make_rule(ruleType="secret")
    source = cm("creds", kind="Secret", type="Opaque")
    source["kind"] = "Secret"
    old = copy_of(rule, source, "a")
    source["type"] = "kubernetes.io/dockerconfigjson"
    assert decide(UID, desired_copy(rule, source, "a"), copy_view(old)) is Action.RECREATE
    source["type"] = "Opaque"
    source["data"] = {"k": "changed"}
    old["immutable"] = True
    assert decide(UID, desired_copy(rule, source, "a"), copy_view(old)) is Action.RECREATE


@pytest.mark.parametrize("secret_type", ["kubernetes.io/tls", "kubernetes.io/dockerconfigjson", "Opaque"])
def test_secret_types_are_copied(secret_type: str) -> None:
    rule = make_rule(ruleType="secret")
    source = cm("creds", kind="Secret", type=secret_type)
    assert rules.skip_reason(rule, source) is None
    assert desired_copy(rule, source, "a")["type"] == secret_type


def test_foreign_objects_are_conflicts_never_touched() -> None:
    rule = make_rule()
    source = cm("settings")
    desired = desired_copy(rule, source, "b")
    other_rules = copy_view({**copy_of(rule, source, "b"), "metadata": {
        **copy_of(rule, source, "b")["metadata"], "labels": {COPYRATOR_RULE_UID_LABEL: "another-rule"}}})
    assert decide(UID, desired, other_rules) is Action.CONFLICT
    assert decide(UID, None, other_rules) is Action.NONE  # never pruned by us
    assert decide(UID, desired, None, foreign=True) is Action.CONFLICT  # learned from a 409
    assert decide(UID, desired, None) is Action.CREATE


def test_a_rules_sweep_is_one_decision_with_every_write_and_what_settles() -> None:
    rule = make_rule()
    source, changed = cm("settings"), cm("settings", data={"k": "new"})
    ours, wanted = view_of(rule, source, "a"), desired_copy(rule, changed, "a")
    places = [
        Place(("ConfigMap", "a", "settings"), wanted, ours),  # stale: patched
        Place(("ConfigMap", "b", "settings"), desired_copy(rule, changed, "b")),  # missing: created
        Place(("ConfigMap", "c", "settings"), desired_copy(rule, source, "c"),
              view_of(rule, source, "c")),  # in sync: nothing
        Place(("ConfigMap", "d", "settings"), None, view_of(rule, source, "d")),  # unwanted: deleted
        Place(("ConfigMap", "e", "settings"), None, view_of(rule, source, "e"), keep=True),  # kept until
        Place(("ConfigMap", "f", "settings"), desired_copy(rule, source, "f"), foreign=True),
        Place(("ConfigMap", "g", "settings"), gone=True),
        Place(("ConfigMap", "h", "settings"), blocked=True),  # what is there stays, and its failure too
    ]
    sweep = decide_sweep(UID, places)
    assert [(place.key[1], action) for place, action in sweep.writes] == [
        ("a", Action.PATCH), ("b", Action.CREATE), ("d", Action.DELETE)]
    assert [key[1] for key in sweep.settled] == ["c", "e", "f", "g"]
    # Each write is the one ``decide`` makes for that place alone.
    assert all(action is decide(UID, p.desired, p.view, foreign=p.foreign, claimed=p.claimed, keep=p.keep)
               for p, action in sweep.writes)


def test_unwanted_copies_are_deleted_only_when_ours() -> None:
    rule = make_rule()
    assert decide(UID, None, view_of(rule, cm("settings"), "a")) is Action.DELETE
    assert decide(UID, None, None) is Action.NONE


@pytest.mark.parametrize("secret_type", sorted(rules.FORBIDDEN_SECRET_TYPES))
def test_token_and_helm_secrets_are_never_copied(secret_type: str) -> None:
    rule = make_rule(ruleType="secret")
    secret = cm("tok", kind="Secret", type=secret_type)
    assert rules.skip_reason(rule, secret) == f"Secrets of type {secret_type} are never copied"
    assert rules.winner(rule, {"default": secret}) is None


def test_copies_are_never_sources_and_first_source_namespace_wins() -> None:
    rule = make_rule(namespace=["default", "second"])
    other = make_rule(metadata={"name": "x", "namespace": "y", "uid": "other"})
    a_copy = copy_of(other, cm("c"), "default")
    assert not rules.selects(rule, "ConfigMap", a_copy)
    first, second = cm("same"), cm("same", namespace="second", data={"k": "second"})
    assert rules.winner(rule, {"second": second, "default": first}) is first
    assert rules.winner(rule, {"second": second}) is second
    assert not rules.selects(rule, "Secret", first) and not rules.selects(rule, "ConfigMap", cm("x", "a"))


def test_secret_values_never_appear_in_annotations_or_index_entries() -> None:
    rule = make_rule(ruleType="secret")
    secret = cm("creds", kind="Secret", type="Opaque", data={"password": "Y2FuYXJ5LXZhbHVl"})
    copy = desired_copy(rule, secret, "a")
    assert "Y2FuYXJ5LXZhbHVl" not in repr(copy["metadata"])
    assert "Y2FuYXJ5LXZhbHVl" not in repr(copy_view({**copy, "metadata": {**copy["metadata"], "uid": "u"}}))


# --- status -----------------------------------------------------------------------------------


def test_status_counts_conditions_and_stability() -> None:
    rule = make_rule()
    tally = Tally(sources=1, desired=2, copied=1, targets=2, conflicts=["b/settings"])
    status = build_status(rule, None, tally, now="T1")
    assert (status["desired"], status["copied"], status["conflicted"], status["observedGeneration"]) == (2, 1, 1, 3)
    conds = {c["type"]: c for c in status["conditions"]}
    # One of two wanted copies is blocked by someone else's object: not Ready, and only a person can
    # clear the way (kstatus: Failed), with the object named.
    assert conds["Ready"]["status"] == "False" and conds["Conflict"]["status"] == "True"
    assert conds["Stalled"]["status"] == "True" and conds["Stalled"]["reason"] == "ForeignObject"
    assert "b/settings" in conds["Stalled"]["message"] and conds["Reconciling"]["status"] == "False"
    assert "b/settings" in conds["Conflict"]["message"] and conds["Refused"]["status"] == "False"
    # The same observation later is not a change: nothing to write.
    again = build_status(rule, status, tally, now="T2")
    assert not status_changed(status, again)


def test_a_status_pass_is_one_decision_and_says_each_problem_once() -> None:
    rule = make_rule()
    tally = Tally(sources=1, desired=2, copied=1, targets=2, conflicts=["b/settings"],
                  unaccepted=[("c", "no accept-from")])
    first = decide_status(rule, {}, tally, done={"created": 1, "updated": 2}, trigger="rule created")
    assert first.status == build_status(rule, {}, tally)
    assert [event for _line, event in first.said] == [
        ("Normal", "Synced", "created 1, updated 2 (rule created)"),
        ("Warning", "Conflict", "1 object(s) in the way are not owned by this rule and were left untouched: "
                                "b/settings"),
        ("Warning", "TargetRefused", first.target_refusals)]
    assert [line is None for line, _event in first.said] == [True, False, False]  # a warning: one log line each
    # The same problems on the next pass, nothing written meanwhile: nothing said, nothing to write.
    again = decide_status(rule, first.status, tally, told_refusals=first.target_refusals)
    assert again.said == [] and not status_changed(first.status, again.status)


def test_missing_consent_and_invalid_status() -> None:
    rule = make_rule(namespace="elsewhere", targetNamespaces=["a"])
    problem = rules.consent_problem(rule, annotated(None, "elsewhere"), ["a"], SETTINGS)
    assert problem
    status = build_status(rule, None, Tally(sources=1, targets=1, refusals=[problem]))
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Refused"]["status"] == "True" and conds["Ready"]["status"] == "False"
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == ("True", "Refused")
    assert "elsewhere/settings" in conds["Refused"]["message"] and status["refused"] == [problem]
    invalid = build_status(rule, None, problem=rules.RuleError("bad"))
    conds = {c["type"]: c for c in invalid["conditions"]}
    assert conds["Ready"]["reason"] == "Invalid" and conds["Stalled"]["status"] == "True"
    assert conds["Stalled"]["message"] == "bad" and conds["Reconciling"]["status"] == "False"
    assert "copied" not in invalid


def test_a_copy_the_api_server_refuses_is_reported_not_called_a_retry() -> None:
    """Issue #20: a copy over the API's limits (say, copied annotations over 256 KiB) is not retried
    with backoff; status says which copy and why."""
    rule = make_rule()
    why = "ConfigMap a/full: HTTP 422 Unprocessable Entity (metadata.annotations: Too long)"
    status = build_status(rule, None, Tally(sources=2, desired=2, copied=1, targets=1,
                                            rejected=[why], failed=0))
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "CopyRefused")
    assert why in ready["message"] and "retrying" not in ready["message"]


def test_settings_from_env() -> None:
    assert rules.Options.from_env({}) == rules.Options()
    settings = rules.Options.from_env({"COPYRATOR_ALLOW_CROSS_NAMESPACE": "true", "COPYRATOR_RESYNC_SECONDS": "2"})
    assert settings.allow_cross_namespace and settings.resync_seconds == 2
    with pytest.raises(ValueError, match="COPYRATOR_ALLOW_CROSS_NAMESPACE"):
        rules.Options.from_env({"COPYRATOR_ALLOW_CROSS_NAMESPACE": "maybe"})


@pytest.mark.parametrize(("tally", "expected"), [
    (Tally(sources=1, desired=2, copied=2, targets=2), ("True", "False", "False", "Synced")),
    # Consent withholds a target: not a wanted copy, so still Ready.
    (Tally(sources=1, desired=1, copied=1, targets=2, withheld=1), ("True", "False", "False", "Synced")),
    (Tally(sources=0, desired=0, copied=0, targets=2), ("True", "False", "False", "Synced")),
    (Tally(sources=1, desired=2, copied=1, targets=2), ("False", "True", "False", "Syncing")),
    (Tally(sources=1, desired=2, copied=1, targets=2, failed=1), ("False", "True", "False", "SyncFailed")),
    (Tally(sources=1, desired=2, copied=1, targets=2, conflicts=["b/x"]),
     ("False", "False", "True", "ForeignObject")),
    (Tally(sources=1, targets=1, refusals=["no consent"]), ("False", "False", "True", "Refused")),
])
def test_ready_only_when_every_wanted_copy_is_in_sync(tally: Tally, expected: tuple[str, ...]) -> None:
    conds = {c["type"]: c for c in build_status(make_rule(), None, tally)["conditions"]}
    ready, reconciling, stalled = (conds[t] for t in ("Ready", "Reconciling", "Stalled"))
    assert (ready["status"], reconciling["status"], stalled["status"], ready["reason"]) == expected
    assert ready["reason"] == reconciling["reason"] == stalled["reason"]


# --- issue #23: target names, keys, push annotations, two rules for one name -------------------


def test_target_name_prefix_and_suffix_name_the_copy() -> None:
    source = cm("settings")
    assert desired_copy(make_rule(), source, "a")["metadata"]["name"] == "settings"
    renamed = make_rule(target={"name": "app-config"})
    assert desired_copy(renamed, source, "a")["metadata"]["name"] == "app-config"
    wrapped = make_rule(target={"namePrefix": "shared-", "nameSuffix": ".v2"})
    copy = desired_copy(wrapped, source, "a")
    assert copy["metadata"]["name"] == "shared-settings.v2"
    # The copy still says which source it holds (the old name is found from it on a rename).
    assert copy["metadata"]["annotations"][COPY_SOURCE] == "default/settings"
    assert rules.source_names_for(wrapped, "shared-settings.v2", ["settings", "other"]) == ["settings"]
    assert rules.source_names_for(renamed, "app-config", ["b", "a"]) == ["a", "b"]


@pytest.mark.parametrize(("target", "message"), [
    ({"name": "x", "namePrefix": "p-"}, "cannot be combined"),
    ({"name": "Bad_Name"}, "not a valid object name"),
    ({"namePrefix": "app-."}, "cannot make a valid object name"),
    ({"nameSuffix": "-"}, "cannot make a valid object name"),
    ("app", "must be a mapping"),
])
def test_bad_target_names_are_reported_readably(target: Any, message: str) -> None:
    with pytest.raises(rules.RuleError, match=message):
        make_rule(target=target)


def test_a_name_too_long_is_a_problem_of_that_source_only() -> None:
    rule = make_rule(target={"namePrefix": "p" * 100 + "-", "nameSuffix": "-" + "s" * 99})
    assert rules.copy_problem(rule, cm("short")) is None
    problem = rules.copy_problem(rule, cm("n" * 60))
    assert problem and "default/" + "n" * 60 in problem and "at most 253" in problem


def test_keys_are_selected_and_renamed() -> None:
    source = cm("tls", data={"tls.crt": "C", "tls.key": "K", "ca.crt": "A"})
    only = make_rule(keys=["tls.crt", "ca.crt", "absent"])
    assert desired_copy(only, source, "a")["data"] == {"tls.crt": "C", "ca.crt": "A"}
    renamed = make_rule(renameKeys={"ca.crt": "ca.pem"})
    assert desired_copy(renamed, source, "a")["data"] == {"tls.crt": "C", "tls.key": "K", "ca.pem": "A"}
    both = make_rule(keys=["ca.crt"], renameKeys={"ca.crt": "ca.pem"})
    assert desired_copy(both, source, "a")["data"] == {"ca.pem": "A"}
    swapped = make_rule(keys=["tls.crt", "tls.key"], renameKeys={"tls.crt": "tls.key", "tls.key": "tls.crt"})
    assert desired_copy(swapped, source, "a")["data"] == {"tls.key": "C", "tls.crt": "K"}
    binary = cm("bin", data={}, binaryData={"blob": "AA==", "other": "AA=="})
    assert desired_copy(make_rule(keys=["blob"]), binary, "a")["binaryData"] == {"blob": "AA=="}
    # A rename changes the content hash: the copy is patched when the rule's keys change.
    plain = desired_copy(make_rule(), source, "a")
    assert decide(UID, desired_copy(renamed, source, "a"), copy_view(
        {**plain, "metadata": {**plain["metadata"], "uid": "u", "resourceVersion": "2"}})) is Action.PATCH


def test_keys_that_would_land_on_one_key_are_refused() -> None:
    with pytest.raises(rules.RuleError, match="would both be copied as 'b'"):
        make_rule(keys=["a", "b"], renameKeys={"a": "b"})
    with pytest.raises(rules.RuleError, match="would both be copied"):
        make_rule(renameKeys={"a": "c", "b": "c"})
    with pytest.raises(rules.RuleError, match="not a valid data key"):
        make_rule(keys=["a/b"])
    # Only the source can tell: it holds both `a` and `b`, and the rule renames `a` to `b`.
    rule = make_rule(renameKeys={"a": "b"})
    assert rules.copy_problem(rule, cm("one", data={"a": "1"})) is None
    problem = rules.copy_problem(rule, cm("two", data={"a": "1", "b": "2"}))
    assert problem and "default/two" in problem and "'b'" in problem


def annotated_source(annotations: dict[str, str], name: str = "pushed", namespace: str = "src") -> dict[str, Any]:
    source = cm(name, namespace=namespace, labels={})
    source["metadata"].update(annotations=annotations, creationTimestamp="2026-11-24T00:00:00Z")
    return source


def test_a_push_annotation_is_a_rule_in_the_sources_namespace() -> None:
    assert rules.push_rule(cm("plain")) is None
    source = annotated_source({rules.PUSH_TO_ANNOTATION: "a, team-*, kube-system"})
    rule = rules.push_rule(source)
    assert isinstance(rule, rules.Rule) and rule.push and rule.uid == "uid-src-pushed"
    assert rule.key == "push src/pushed" and not rule.pull
    namespaces = [ns("src"), ns("a"), ns("b"), ns("team-x"), ns("kube-system"), ns("kube-public"), ns("team-y", False)]
    # Globs reach team-x; kube-system only because it is named; never the source's own namespace.
    assert rules.target_namespaces(rule, namespaces) == ["a", "kube-system", "team-x"]
    assert rules.selects(rule, "ConfigMap", source) and not rules.selects(rule, "ConfigMap", cm("pushed", "src"))
    assert not rules.needs_consent(rule, "src", SETTINGS)  # the source's owner asks for it: no consent needed
    copy = desired_copy(rule, source, "a")
    annotations = copy["metadata"]["annotations"]
    assert annotations[rules.PUSHED_ANNOTATION] == "true" and rules.RULE_ANNOTATION not in annotations
    assert copy["metadata"]["labels"] == {COPYRATOR_RULE_UID_LABEL: "uid-src-pushed"}
    assert copy_view({**copy, "metadata": {**copy["metadata"], "uid": "c"}}).pushed


def test_push_to_matching_selects_namespaces_by_label() -> None:
    rule = rules.push_rule(annotated_source({rules.PUSH_TO_MATCHING_ANNOTATION: "team=x, tier=web"}))
    assert isinstance(rule, rules.Rule)
    namespaces = [ns("a", team="x", tier="web"), ns("b", team="x"), ns("kube-system", team="x", tier="web")]
    assert rules.target_namespaces(rule, namespaces) == ["a"]
    both = rules.push_rule(annotated_source({rules.PUSH_TO_ANNOTATION: "a,b",
                                             rules.PUSH_TO_MATCHING_ANNOTATION: "team=x"}))
    assert isinstance(both, rules.Rule)
    assert rules.target_namespaces(both, [*namespaces, ns("c", team="x")]) == ["a", "b"]  # AND-ed


@pytest.mark.parametrize(("annotations", "message"), [
    ({rules.PUSH_TO_ANNOTATION: "Bad_NS"}, "namespace names or globs"),
    ({rules.PUSH_TO_ANNOTATION: " , "}, "empty"),
    ({rules.PUSH_TO_MATCHING_ANNOTATION: "team"}, "key=value"),
])
def test_malformed_push_annotations_are_reported(annotations: dict[str, str], message: str) -> None:
    problem = rules.push_rule(annotated_source(annotations))
    assert isinstance(problem, rules.RuleError) and message in str(problem)


def test_of_two_rules_for_one_free_name_the_older_gets_it() -> None:
    older = rules.parse_rule(rule_body(metadata={"name": "z", "namespace": "default", "uid": "u1",
                                                 "creationTimestamp": "2026-11-01T00:00:00Z"}))
    newer = rules.parse_rule(rule_body(metadata={"name": "a", "namespace": "default", "uid": "u2",
                                                 "creationTimestamp": "2026-11-02T00:00:00Z"}))
    assert rules.first_claim([newer, older]) is older and rules.first_claim([older, newer]) is older
    desired = desired_copy(newer, cm("settings"), "a")
    assert decide("u2", desired, None, claimed=True) is Action.CONFLICT
    # Whoever holds the copy keeps it: the older rule does not take it (no flapping).
    held = view_of(newer, cm("settings"), "a")
    assert decide("u1", desired_copy(older, cm("settings"), "a"), held) is Action.CONFLICT
    assert decide("u2", desired, held) is Action.NONE


def test_a_renamed_copy_stays_until_its_replacement_is_in_sync() -> None:
    rule = make_rule()
    old = view_of(rule, cm("settings"), "a")
    assert decide(UID, None, old, keep=True) is Action.NONE
    assert decide(UID, None, old, keep=False) is Action.DELETE


@pytest.mark.parametrize(("tally", "reason"), [
    (Tally(sources=1, desired=1, targets=1, contested=["a/x (held by default/other)"]), "TargetClaimed"),
    (Tally(sources=1, targets=1, invalid=["source default/s: keys 'a' and 'b' ..."]), "InvalidCopy"),
])
def test_claimed_names_and_uncopyable_sources_stall_the_rule(tally: Tally, reason: str) -> None:
    status = build_status(make_rule(), None, tally)
    conds = {c["type"]: c for c in status["conditions"]}
    stalled = conds["Stalled"]
    assert (conds["Ready"]["status"], stalled["status"], stalled["reason"]) == ("False", "True", reason)
    listed = status["contested"] or status["invalid"]
    assert listed and listed[0] in conds["Stalled"]["message"]
    assert not status_changed(status, build_status(make_rule(), status, tally))


def test_the_conflict_condition_names_every_object_in_the_way_whoever_owns_it() -> None:
    tally = Tally(sources=2, desired=2, targets=1, conflicts=["a/plain"], contested=["a/marked (held by x/y)"])
    conds = {c["type"]: c for c in build_status(make_rule(), None, tally)["conditions"]}
    assert conds["Conflict"]["reason"] == "ForeignObject"
    assert "a/plain" in conds["Conflict"]["message"] and "a/marked (held by x/y)" in conds["Conflict"]["message"]
    only = Tally(sources=1, desired=1, targets=1, contested=["a/marked (held by x/y)"])
    conds = {c["type"]: c for c in build_status(make_rule(), None, only)["conditions"]}
    assert (conds["Conflict"]["status"], conds["Conflict"]["reason"]) == ("True", "TargetClaimed")


# --- orphans: copies of a rule that is gone (no finalizer on rules) ------------------------------------


def test_a_copy_names_its_rule() -> None:
    rule = make_rule()
    view = view_of(rule, cm("settings"), "a")
    assert (view.rule_uid, view.rule) == (UID, "default/main-rule")
    assert split_rule_key(view.rule) == ("default", "main-rule")


@pytest.mark.parametrize("key", ["", "default", "default/", "/main-rule", "Default/x", "a/b/c"])
def test_a_malformed_rule_key_names_no_rule(key: str) -> None:
    assert split_rule_key(key) is None


def test_orphan_suspects_are_the_copies_of_rules_not_alive_here() -> None:
    live, gone = make_rule(), rules.parse_rule({**rule_body(), "metadata": {
        "name": "old", "namespace": "team", "uid": "gone-uid", "generation": 1}})
    hand_made = copy_view({**copy_of(gone, cm("x"), "b"), "metadata": {
        **copy_of(gone, cm("x"), "b")["metadata"], "annotations": {}}})
    copies = {UID: [view_of(live, cm("settings"), "a")],
              "gone-uid": [hand_made, view_of(gone, cm("x"), "a")],
              "no-key-uid": [hand_made]}
    suspects = orphan_suspects(copies, {UID})
    # A live rule's copies are never suspects; a gone rule is named by any of its copies that says.
    assert suspects == {"gone-uid": "team/old", "no-key-uid": ""}
    assert orphan_suspects(copies, {UID, "gone-uid", "no-key-uid"}) == {}


def test_a_rule_is_gone_only_when_no_object_with_its_uid_lives() -> None:
    def listed(uid: str, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "old", "namespace": "team", "uid": uid}
        if deleting:
            meta["deletionTimestamp"] = "2026-11-24T00:00:00Z"
        return {"metadata": meta}

    assert rule_gone("u1", [])  # deleted
    assert rule_gone("u1", [listed("u2")])  # deleted and re-created: a successor, not our rule
    assert rule_gone("u1", [listed("u1", deleting=True)])  # held by someone else's finalizer
    assert not rule_gone("u1", [listed("u1")])  # alive (another shard serves it)
