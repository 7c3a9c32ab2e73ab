"""Copyrator's target consent (pure decisions, and the controller with a fake access layer): a push
writes into a namespace only with that namespace's consent or an administrator's trust; system
namespaces and the operator's own are closed unless opened; a refusal is one Warning on the source
per change; copies pushed before the consent existed are kept, unsynced, and reported; push can be
turned off; rules need the same consent only when the chart says so."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kopf_operators.copyrator import rules
from kopf_operators.copyrator.controller import CopyratorController
from kopf_operators.copyrator.copies import CopyView, copy_view, desired_copy
from kopf_operators.copyrator.places import copy_index_keys
from kopf_operators.copyrator.tally import (
    Ledger,
    Standing,
    Tally,
    build_status,
    decide_push,
    ledger_tally,
    readiness,
    standing,
    target_refusals,
)
from kopf_operators.core import metrics
from tests.unit.fake_access import FakeAccess


def ns(name: str, accept: str | None = None) -> rules.NamespaceInfo:
    body: dict[str, Any] = {"metadata": {"name": name}, "status": {"phase": "Active"}}
    if accept is not None:
        body["metadata"]["annotations"] = {rules.ACCEPT_FROM_ANNOTATION: accept}
    return rules.namespace_info(body)


def pushing(namespace: str = "tenant-a", to: str = "*", name: str = "cfg", uid: str = "src-uid",
            data: str = "v") -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {"namespace": namespace, "name": name, "uid": uid,
                                              "resourceVersion": "2",
                                              "annotations": {rules.PUSH_TO_ANNOTATION: to}},
            "data": {"k": data}}


def push(source: dict[str, Any] | None = None) -> rules.Rule:
    rule = rules.push_rule(source or pushing())
    assert isinstance(rule, rules.Rule)
    return rule


RULE = rules.parse_rule({"metadata": {"namespace": "default", "name": "main-rule", "uid": "r"},
                         "ruleType": "configmap", "selector": {"copyrator": "true"}, "namespace": "default"})


# --- decisions ----------------------------------------------------------------------------------

def test_the_namespace_annotation_is_read_as_names_and_globs() -> None:
    assert ns("b", " tenant-a , platform-* ").accept_from == ("tenant-a", "platform-*")
    assert ns("b").accept_from is None
    assert ns("b", "").accept_from == ()


def test_a_push_needs_the_targets_consent_by_name_or_glob() -> None:
    options = rules.Options()
    refusal = rules.target_refusal(push(), ns("tenant-b"), options)
    assert refusal == f"no {rules.ACCEPT_FROM_ANNOTATION} annotation listing tenant-a"
    assert rules.target_refusal(push(), ns("tenant-b", "tenant-x"), options) is not None
    assert rules.target_refusal(push(), ns("tenant-b", ""), options) is not None
    assert rules.target_refusal(push(), ns("tenant-b", "tenant-a"), options) is None
    assert rules.target_refusal(push(), ns("tenant-b", "tenant-*"), options) is None
    assert rules.target_refusal(push(), ns("tenant-b", "*"), options) is None


def test_a_trusted_source_namespace_needs_no_consent_from_ordinary_namespaces() -> None:
    options = rules.Options(trusted_namespaces=("platform-*",))
    assert rules.target_refusal(push(pushing("platform-certs")), ns("tenant-b"), options) is None
    assert rules.target_refusal(push(pushing("tenant-a")), ns("tenant-b"), options) is not None


@pytest.mark.parametrize("closed", ["kube-system", "kube-public", "kube-node-lease", "kopf-operators"])
def test_system_namespaces_and_the_operators_own_are_closed_unless_opened(closed: str) -> None:
    shut = rules.Options(trusted_namespaces=("*",), operator_namespace="kopf-operators")
    refusal = rules.target_refusal(push(), ns(closed, "*"), shut)  # their own annotation does not open them
    assert refusal == rules.CLOSED and "COPYRATOR_OPEN_NAMESPACES" in refusal
    opened = rules.Options(open_namespaces=(closed,), operator_namespace="kopf-operators")
    assert rules.target_refusal(push(), ns(closed), opened) is not None  # opened: consent still counts
    assert rules.target_refusal(push(), ns(closed, "tenant-a"), opened) is None


def test_rules_need_no_target_consent_unless_the_chart_says_so() -> None:
    assert rules.target_refusal(RULE, ns("tenant-b"), rules.Options(operator_namespace="kopf-operators")) is None
    strict = rules.Options(rules_need_target_consent=True, operator_namespace="kopf-operators")
    assert rules.target_refusal(RULE, ns("tenant-b"), strict) is not None
    assert rules.target_refusal(RULE, ns("tenant-b", "default"), strict) is None
    assert rules.target_refusal(RULE, ns("kopf-operators", "default"), strict) is not None
    pull = rules.parse_rule({"metadata": {"namespace": "tenant-b", "name": "pull", "uid": "p"},
                             "spec": {"ruleType": "configmap", "selector": {"a": "b"}, "namespace": "platform"}})
    assert rules.target_refusal(pull, ns("tenant-b"), strict) is None  # its own namespace asks


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("closed", ["kube-system", "kube-public", "kube-node-lease", "kopf-operators"])
def test_the_closed_namespaces_refuse_other_namespaces_rules_in_every_configuration(closed: str,
                                                                                    strict: bool) -> None:
    """With or without COPYRATOR_RULES_NEED_TARGET_CONSENT, and whatever the namespace's annotation: a
    rule in another namespace than the operator's writes nothing into the system namespaces or the
    operator's own; the administrator's rule in the operator's namespace still may; opening the
    namespace lets rules in (with consent, when rules need it)."""
    options = rules.Options(rules_need_target_consent=strict, trusted_namespaces=("*",),
                            operator_namespace="kopf-operators")
    assert rules.target_refusal(RULE, ns(closed, "*"), options) == rules.CLOSED
    admins = rules.parse_rule({"metadata": {"namespace": "kopf-operators", "name": "r", "uid": "a"},
                               "ruleType": "configmap", "selector": {"a": "b"}, "namespace": "kopf-operators",
                               "targetNamespaces": [closed]})
    assert rules.target_refusal(admins, ns(closed, "*"), options) is None
    assert rules.target_refusal(push(pushing("kopf-operators")), ns(closed, "*"), options) == (
        None if closed == "kopf-operators" else rules.CLOSED)  # a push is never the administrator's rule
    opened = rules.Options(rules_need_target_consent=strict, open_namespaces=(closed,),
                           operator_namespace="kopf-operators")
    assert rules.target_refusal(RULE, ns(closed, "default"), opened) is None


def test_every_namespace_and_a_push_glob_leave_out_the_closed_namespaces() -> None:
    options = rules.Options(operator_namespace="kopf-operators")
    assert options.by_name_only == {"kube-system", "kube-public", "kube-node-lease", "kopf-operators"}
    assert rules.Options().by_name_only == rules.SYSTEM_NAMESPACES  # no operator namespace: none added
    cluster = [ns(name) for name in ("default", "tenant-b", "kube-system", "kopf-operators")]
    assert rules.target_namespaces(RULE, cluster, options.by_name_only) == ["tenant-b"]
    listed = rules.parse_rule({"metadata": {"namespace": "default", "name": "r", "uid": "l"},
                               "ruleType": "configmap", "selector": {"a": "b"}, "namespace": "default",
                               "targetNamespaces": ["kube-system", "kopf-operators"]})
    # Listed by name: a target (and then refused by ``target_refusal`` unless opened).
    assert rules.target_namespaces(listed, cluster, options.by_name_only) == ["kopf-operators", "kube-system"]
    assert rules.target_namespaces(push(pushing(to="*")), cluster, options.by_name_only) == ["default", "tenant-b"]


def test_options_from_the_environment() -> None:
    options = rules.Options.from_env({"COPYRATOR_PUSH": "false", "COPYRATOR_TRUSTED_NAMESPACES": "platform, ops-*",
                                      "COPYRATOR_OPEN_NAMESPACES": "kube-system",
                                      "COPYRATOR_RULES_NEED_TARGET_CONSENT": "true"}, operator_namespace="ops")
    assert options == rules.Options(push=False, trusted_namespaces=("platform", "ops-*"),
                                    open_namespaces=("kube-system",), rules_need_target_consent=True,
                                    operator_namespace="ops")
    assert rules.Options.from_env({}).push is True
    with pytest.raises(ValueError, match="COPYRATOR_PUSH"):
        rules.Options.from_env({"COPYRATOR_PUSH": "maybe"})


def test_a_refused_place_is_counted_apart_and_a_copy_from_before_is_kept() -> None:
    rule, source = push(), pushing()
    view = copy_view({**desired_copy(rule, source, "tenant-b"),
                      "metadata": {**desired_copy(rule, source, "tenant-b")["metadata"],
                                   "uid": "c", "resourceVersion": "3"}})
    wanted = desired_copy(rule, source, "")
    assert standing(rule, "tenant-b", "cfg", allowed=True, view=None, wanted=wanted,
                    refusal="no") == (Standing.UNACCEPTED, "no")
    assert standing(rule, "tenant-b", "cfg", allowed=True, view=view, wanted=wanted,
                    refusal="no") == (Standing.KEPT, "tenant-b/cfg")
    ledger = Ledger(kind="ConfigMap", targets={"tenant-b", "tenant-c", "tenant-d"})
    ledger.judge("cfg", "tenant-b", (Standing.KEPT, "tenant-b/cfg"))
    ledger.judge("cfg", "tenant-c", (Standing.UNACCEPTED, "no consent"))
    ledger.judge("cfg", "tenant-d", (Standing.COPIED, ""))
    tally = ledger_tally(rule, ledger, {"cfg": (source, None)}, rules.Options())
    assert (tally.desired, tally.copied) == (1, 1)
    assert tally.unaccepted == [("tenant-c", "no consent")] and tally.kept == ["tenant-b/cfg"]
    message = target_refusals(tally)
    assert "1 (no consent)" in message and "tenant-c" not in message
    assert "tenant-b/cfg" in message and "no longer synced" in message  # its own copy, made before


def test_the_refusal_message_counts_namespaces_by_reason_and_names_none() -> None:
    """A push to ``a*,b*,...`` must not list the cluster's namespaces to its source's owner: the
    message says how many refuse and the consent each group lacks, never which namespaces."""
    refused = [("kube-system", rules.CLOSED), ("ops", rules.CLOSED), ("team-b", "no consent"),
               *((f"team-{i:02d}", "no consent") for i in range(20))]
    message = target_refusals(Tally(unaccepted=refused))
    assert message == (f"not copied into 23 namespace(s) without their consent: 2 ({rules.CLOSED}); "
                       f"21 (no consent)")
    assert not [namespace for namespace, _why in refused if namespace in message]
    assert len(message) < 1000  # an Event's message (core/access.py MAX_EVENT_MESSAGE)
    tally = Tally(unaccepted=refused)
    accepted = Tally(desired=1, copied=1, targets=24, unaccepted=tally.unaccepted)
    assert readiness(accepted, {})[0]  # it does its job where it is accepted


def test_a_rule_no_target_accepts_is_not_ready_and_says_why() -> None:
    refused = Tally(sources=1, targets=2, unaccepted=[("team-b", "no consent"), ("ops", rules.CLOSED)])
    status = build_status(RULE, {}, refused, now="T")
    conds = {c["type"]: c for c in status["conditions"]}
    # kstatus: it copies nothing anywhere, and only the targets' owners (or an edit) can change that.
    assert (conds["Ready"]["status"], conds["Stalled"]["status"]) == ("False", "True")
    assert conds["Ready"]["reason"] == conds["Stalled"]["reason"] == "NoTargetConsents"
    assert "1 (no consent)" in conds["Ready"]["message"] and f"1 ({rules.CLOSED})" in conds["Ready"]["message"]
    assert "team-b" not in conds["Ready"]["message"]
    # A copy from before, kept unsynced, is no job done either; one accepting target is.
    kept = Tally(sources=1, targets=1, kept=["team-b/cfg"])
    assert readiness(kept, {})[2] == "NoTargetConsents"
    some = Tally(sources=1, targets=2, desired=1, copied=1, unaccepted=[("team-b", "no consent")])
    assert readiness(some, {})[:3] == (True, False, "Synced")


def test_a_push_decides_its_problem_from_its_tally_and_source() -> None:
    """A push has no status: ``decide_push`` is what its source's Warning says (nothing when all is well)."""
    source = pushing()
    synced = Tally(sources=1, targets=1, desired=1, copied=1)
    assert decide_push(push(source), synced, source)[1] == ""
    # Refusing targets are named, whether some or every target refuses (NoTargetConsents is a rule's).
    for desired in (1, 0):
        tally = Tally(sources=1, targets=2, desired=desired, copied=desired,
                      unaccepted=[("team-b", "no consent")])
        reason, message = decide_push(push(source), tally, source)
        assert reason == "PushRefused" and message.startswith("not copied into 1 namespace(s)")
        assert "1 (no consent)" in message and "team-b" not in message
    # Stalled for another reason: that reason, and the refusals after it.
    stalled = Tally(sources=1, targets=2, conflicts=["team-c/cfg"], unaccepted=[("team-b", "no consent")])
    reason, message = decide_push(push(source), stalled, source)
    assert reason == "ForeignObject" and "team-c/cfg" in message and message.endswith(target_refusals(stalled))
    # A source never copied (a Helm release): its owner is told why.
    release = {**pushing(), "kind": "Secret", "type": "helm.sh/release.v1"}
    reason, message = decide_push(push(release), Tally(skipped=1), release)
    assert (reason, message) == ("Skipped", "Secrets of type helm.sh/release.v1 are never copied")


# --- the controller ---------------------------------------------------------------------------

class Recorder(FakeAccess):
    def event(self, obj: Any, type: str, reason: str, message: str) -> None:
        super().event(obj, type, reason, message)
        self.messages.append(message)

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []


def controller(access: FakeAccess, namespaces: list[rules.NamespaceInfo], source: dict[str, Any],
               copies: tuple[CopyView, ...] = (), options: rules.Options | None = None) -> CopyratorController:
    index: dict[Any, list[CopyView]] = {}
    for view in copies:
        for key, value in copy_index_keys(view).items():
            index.setdefault(key, []).append(value)
    ctl = CopyratorController(access, options or rules.Options(operator_namespace="kopf-operators"), {},  # type: ignore[arg-type]
                              {n.name: [n] for n in namespaces}, {"ConfigMap": index, "Secret": {}})
    ctl.sources.push_changed("ConfigMap", "ADDED", source)
    ctl.sources.put("ConfigMap", rules.source_entry(source))
    return ctl


def writes(access: FakeAccess) -> list[tuple[Any, ...]]:
    return [call[:4] for call in access.calls if call[0] in ("create", "patch", "delete")]


CLUSTER = [ns("tenant-a"), ns("tenant-b"), ns("kube-system", "*"), ns("kopf-operators", "*"),
           ns("tenant-c", "tenant-a")]


def test_a_push_writes_only_where_it_is_accepted_and_warns_once_counting_the_rest() -> None:
    access = Recorder()
    ctl = controller(access, CLUSTER, pushing(to="*,kube-system,kopf-operators"))
    asyncio.run(ctl._resync_pushes())
    assert writes(access) == [("create", "ConfigMap", "tenant-c", "cfg")]
    assert access.events == [("Warning", "PushRefused")]
    assert f"2 ({rules.CLOSED})" in access.messages[0]
    assert f"1 (no {rules.ACCEPT_FROM_ANNOTATION} annotation listing tenant-a)" in access.messages[0]
    assert "kube-system" not in access.messages[0] and "tenant-b" not in access.messages[0]
    asyncio.run(ctl._resync_pushes())  # nothing changed: no second event, no write
    assert access.events == [("Warning", "PushRefused")]
    assert len(writes(access)) == 1


def test_consent_given_later_lets_the_same_push_copy() -> None:
    access = Recorder()
    ctl = controller(access, [ns("tenant-a"), ns("tenant-b")], pushing())
    asyncio.run(ctl._resync_pushes())
    assert writes(access) == []
    ctl.sources.namespaces["tenant-b"] = [ns("tenant-b", "tenant-*")]  # type: ignore[index]
    asyncio.run(ctl.namespace_event("MODIFIED", {"metadata": {"name": "tenant-b", "annotations": {
        rules.ACCEPT_FROM_ANNOTATION: "tenant-*"}}, "status": {"phase": "Active"}}))
    assert writes(access) == [("create", "ConfigMap", "tenant-b", "cfg")]


def test_a_copy_pushed_before_consent_existed_is_kept_unsynced_and_reported() -> None:
    """The upgrade: copies already pushed into a namespace that never consented are neither deleted
    nor updated; the source's owner is told which (and the administrator finds them by the Event)."""
    old = pushing(data="old")
    rule = push(old)
    body = desired_copy(rule, old, "tenant-b")
    body["metadata"].update(uid="copy-uid", resourceVersion="3")
    access = Recorder()
    ctl = controller(access, [ns("tenant-a"), ns("tenant-b")], pushing(data="new"), (copy_view(body),))
    asyncio.run(ctl._resync_pushes())
    assert writes(access) == []  # not patched to "new", not deleted
    assert access.events == [("Warning", "PushRefused")]
    assert "tenant-b/cfg" in access.messages[0] and "no longer synced" in access.messages[0]
    assert metrics.UNCONSENTED_COPIES._value.get() == 1  # the administrator's count
    asyncio.run(ctl.object_event("ConfigMap", "DELETED", pushing(data="new")))  # the source withdraws them
    assert writes(access) == [("delete", "ConfigMap", "tenant-b", "cfg")]
    assert metrics.UNCONSENTED_COPIES._value.get() == 0


def test_the_source_deleted_still_prunes_its_kept_copies() -> None:
    old = pushing()
    body = desired_copy(push(old), old, "tenant-b")
    body["metadata"].update(uid="copy-uid", resourceVersion="3")
    access = Recorder()
    ctl = controller(access, [ns("tenant-a"), ns("tenant-b")], old, (copy_view(body),))
    asyncio.run(ctl.object_event("ConfigMap", "DELETED", old))
    assert writes(access) == [("delete", "ConfigMap", "tenant-b", "cfg")]


def test_push_turned_off_writes_and_deletes_nothing_and_tells_the_source() -> None:
    old = pushing()
    body = desired_copy(push(old), old, "tenant-b")
    body["metadata"].update(uid="copy-uid", resourceVersion="3")
    access = Recorder()
    ctl = controller(access, [ns("tenant-a"), ns("tenant-b", "*"), ns("tenant-c", "*")], old,
                     (copy_view(body),), options=rules.Options(push=False))
    asyncio.run(ctl._resync_pushes())
    asyncio.run(ctl.object_event("ConfigMap", "MODIFIED", pushing(data="new")))
    assert writes(access) == []
    assert access.events == [("Warning", "PushDisabled")]


def test_a_deleted_push_source_leaves_no_report_behind() -> None:
    """What was last reported on a malformed push source goes with it (a process that runs for months
    sees many sources come and go)."""
    broken = pushing(to="Bad_NS", uid="broken-uid")
    ctl = controller(FakeAccess(), [ns("tenant-b", accept="*")], pushing())
    ctl.sources.push_changed("ConfigMap", "ADDED", broken)
    assert "broken-uid" in ctl.sources.push_reports
    ctl.sources.push_changed("ConfigMap", "DELETED", broken)
    assert "broken-uid" not in ctl.sources.push_reports


def test_a_standby_makes_no_pass_for_a_namespace_event() -> None:
    """A warm standby follows events but writes nothing: no pass, so no refused write, no warning and
    no retry (the pass it makes when it takes over covers the namespace)."""
    access = Recorder()
    access.paused = True
    ctl = controller(access, [ns("tenant-a"), ns("tenant-b", "tenant-*")], pushing())
    asyncio.run(ctl.namespace_event("ADDED", {"metadata": {"name": "tenant-b", "annotations": {
        rules.ACCEPT_FROM_ANNOTATION: "tenant-*"}}, "status": {"phase": "Active"}}))
    assert writes(access) == [] and not ctl.passes.timers.pending(("tenant-a", "cfg"))
    access.paused = False
    asyncio.run(ctl.namespace_event("ADDED", {"metadata": {"name": "tenant-b", "annotations": {
        rules.ACCEPT_FROM_ANNOTATION: "tenant-*"}}, "status": {"phase": "Active"}}))
    assert writes(access) == [("create", "ConfigMap", "tenant-b", "cfg")]
