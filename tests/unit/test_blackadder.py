"""Blackadder's decision functions, with fixed seeds (no cluster)."""

from __future__ import annotations

from kopf_operators import blackadder as logic
from kopf_operators.blackadder import AgentSettings, ConfigMapRef, DeploymentRef, PodRef


def pods(n: int, ns: str = "ns", terminating: int = 0) -> list[PodRef]:
    return [PodRef(ns, f"p{i:02d}", f"uid-{i}", terminating=i < terminating) for i in range(n)]


def deps(*replicas: int) -> list[DeploymentRef]:
    return [DeploymentRef("ns", f"d{i}", f"uid-{i}", r) for i, r in enumerate(replicas)]


def test_eagerness_zero_never_and_hundred_always() -> None:
    for seed in range(20):
        assert logic.pick_pods(pods(30), 0, 0, logic.rng_for(seed, 1, "tantrum")) == []
        assert len(logic.pick_pods(pods(30), 0, 100, logic.rng_for(seed, 1, "tantrum"))) == 30
        assert logic.pick_deployments(deps(1, 2, 3), 0, logic.rng_for(seed, 1, "cancer")) == []
        assert len(logic.pick_deployments(deps(1, 2, 3), 100, logic.rng_for(seed, 1, "cancer"))) == 3


def test_eagerness_is_a_probability() -> None:
    picked = sum(len(logic.pick_pods(pods(100), 0, 20, logic.rng_for(s, 1, "tantrum"))) for s in range(50))
    assert 800 < picked < 1200  # 20% of 5000


def test_tolerance_respected() -> None:
    rng = logic.rng_for(1, 1, "tantrum")
    assert logic.pick_pods(pods(9), 10, 100, rng) == []  # fewer than tolerance: nothing
    assert logic.pick_pods(pods(10), 10, 100, rng) == []  # never below tolerance
    assert len(logic.pick_pods(pods(13), 10, 100, rng)) == 3
    for seed in range(30):
        assert len(logic.pick_pods(pods(15), 10, 70, logic.rng_for(seed, 2, "tantrum"))) <= 5


def test_terminating_pods_skipped_and_not_counted() -> None:
    picked = logic.pick_pods(pods(5, terminating=2), 1, 100, logic.rng_for(1, 1, "tantrum"))
    assert [p.name for p in picked] == ["p02", "p03"]  # 3 alive, keep 1


def test_same_seed_same_decisions_regardless_of_order() -> None:
    inventory = pods(40)
    a = logic.pick_pods(inventory, 0, 50, logic.rng_for(7, 3, "tantrum"))
    b = logic.pick_pods(list(reversed(inventory)), 0, 50, logic.rng_for(7, 3, "tantrum"))
    c = logic.pick_pods(inventory, 0, 50, logic.rng_for(7, 4, "tantrum"))
    assert a == b
    assert a != c  # another cycle, other decisions


def test_cancer_doubles_capped_and_zero_stays_zero() -> None:
    assert logic.doubled(0) == 0
    assert logic.doubled(1) == 2
    assert logic.doubled(3) == 6
    assert logic.doubled(64) == 128
    assert logic.doubled(100) == 128
    assert logic.doubled(128) == 128
    assert logic.doubled(300) == 300  # never shrinks
    picked = logic.pick_deployments(deps(0, 1, 128, 70), 100, logic.rng_for(1, 1, "cancer"))
    assert [(d.name, r) for d, r in picked] == [("d1", 2), ("d3", 128)]


def test_ipsum_skips_immutable_and_empty() -> None:
    cms = [ConfigMapRef("ns", "a", "u1", {"k": "v"}), ConfigMapRef("ns", "b", "u2", {"k": "v"}, immutable=True),
           ConfigMapRef("ns", "c", "u3", None), ConfigMapRef("ns", "d", "u4", {})]
    picked = logic.pick_configmaps(cms, 100, logic.rng_for(1, 1, "ipsum"))
    assert [c.name for c in picked] == ["a"]
    assert logic.ipsum_data({"x": "1", "y": "2"}, lambda: "lorem") == {"x": "lorem", "y": "lorem"}


def test_field_selector_string() -> None:
    assert logic.namespace_field_selector(["b", "a", "a"]) == "metadata.namespace!=a,metadata.namespace!=b"
    assert logic.namespace_field_selector([]) == ""


def test_listing_plan_includes_deny_list() -> None:
    namespaces, selector = logic.listing_plan(AgentSettings(excluded=("team-x",)), "chaos-operator")
    assert namespaces is None
    assert selector == ",".join(f"metadata.namespace!={ns}" for ns in sorted(
        ["chaos-operator", "kube-node-lease", "kube-public", "kube-system", "team-x"]))
    local = logic.listing_plan(AgentSettings(), "")[1]
    assert "metadata.namespace!=blackadder-system" in local  # the local ledger namespace
    namespaces, selector = logic.listing_plan(
        AgentSettings(targets=("a", "kube-system", "x", "chaos-operator"), excluded=("x",)), "chaos-operator")
    assert namespaces == ["a"] and selector == ""


def test_deny_list_no_spec_can_override() -> None:
    s = AgentSettings(targets=("kube-system", "kube-public", "kube-node-lease", "op", "apps"))
    assert not logic.namespace_allowed("kube-system", s, "op")
    assert not logic.namespace_allowed("op", s, "op")
    assert logic.namespace_allowed("apps", s, "op")
    assert not logic.namespace_allowed("other", s, "op")  # not a target
    assert not logic.pod_allowed(PodRef("op", "operator-0", "u"), AgentSettings(), "op", "operator-0")
    assert not logic.pod_allowed(PodRef("apps", "operator-0", "u"), AgentSettings(), "", "operator-0")
    assert not logic.configmap_allowed(ConfigMapRef("apps", "kube-root-ca.crt", "u", {"a": "b"}), s, "op")
    assert not logic.configmap_allowed(ConfigMapRef("apps", "blackadder-ledger-x", "u", {"a": "b"}), s, "op")
    assert logic.configmap_allowed(ConfigMapRef("apps", "settings", "u", {"a": "b"}), s, "op")


def test_settings_from_spec_and_forced_dry_run() -> None:
    spec = {"tantrumMode": True, "podTolerance": 10, "eagerness": 20, "pauseDuration": 30,
            "excludedNamespaces": ["kube-system"], "cancerMode": True, "ipsumMode": True}
    s = logic.settings_from_spec(spec)
    assert (s.tantrum, s.cancer, s.ipsum, s.tolerance, s.eagerness, s.pause) == (True, True, True, 10, 20, 30)
    assert not s.dry_run and s.targets is None and s.revert_on_delete
    forced = logic.settings_from_spec(spec, forced_dry_run=True)
    assert forced.dry_run and forced.dry_run_reason == "OperatorForced"
    assert logic.settings_from_spec({"pauseDuration": 1}).pause == logic.MIN_PAUSE_SECONDS


def test_undo_keeps_the_original_before_state() -> None:
    ledger = logic.empty_ledger("a", "uid")
    key = logic.target_key("Deployment", "ns", "d")
    logic.record_undo(ledger, key, {"uid": "d1", "before": 1, "written": 2}, current_fingerprint=1)
    logic.record_undo(ledger, key, {"uid": "d1", "before": 2, "written": 4}, current_fingerprint=2)
    assert ledger["undo"][key]["before"] == 1 and ledger["undo"][key]["written"] == 4
    # Someone scaled it to 3 in between: their value is the new "before".
    logic.record_undo(ledger, key, {"uid": "d1", "before": 3, "written": 6}, current_fingerprint=3)
    assert ledger["undo"][key]["before"] == 3


def test_revert_verdicts() -> None:
    dep = {"kind": "Deployment", "uid": "u", "before": 1, "written": 2, "generation": 5}
    cur = {"metadata": {"uid": "u", "generation": 5}, "spec": {"replicas": 2}}
    assert logic.revert_verdict(dep, cur) == logic.RESTORE
    for gen, replicas in ((6, 2), (6, 3), (5, 3)):
        changed = {"metadata": {"uid": "u", "generation": gen}, "spec": {"replicas": replicas}}
        assert logic.revert_verdict(dep, changed) == logic.CHANGED
    assert logic.revert_verdict(dep, {"metadata": {"uid": "other"}, "spec": {"replicas": 2}}) == logic.GONE
    assert logic.revert_verdict(dep, None) == logic.GONE
    cm = {"kind": "ConfigMap", "uid": "u", "before": {"k": "v"}, "written": logic.data_fingerprint({"k": "lorem"})}
    assert logic.revert_verdict(cm, {"metadata": {"uid": "u"}, "data": {"k": "lorem"}}) == logic.RESTORE
    assert logic.revert_verdict(cm, {"metadata": {"uid": "u"}, "data": {"k": "edited"}}) == logic.CHANGED
    pending = {**cm, "pending": True}
    assert logic.revert_verdict(pending, {"metadata": {"uid": "u"}, "data": {"k": "v"}}) == logic.UNCHANGED


def test_ledger_of_a_recreated_agent_starts_afresh() -> None:
    old = logic.empty_ledger("a", "old-uid") | {"cycle": 9}
    assert logic.normalise_ledger(old, "a", "new-uid")["cycle"] == 0
    assert logic.normalise_ledger(old, "a", "old-uid")["cycle"] == 9


def test_journal_is_bounded() -> None:
    ledger = logic.empty_ledger("a", "u")
    for i in range(logic.JOURNAL_LIMIT + 20):
        logic.journal(ledger, {"i": i})
    assert len(ledger["journal"]) == logic.JOURNAL_LIMIT and ledger["journal"][-1] == {"i": logic.JOURNAL_LIMIT + 19}


def test_restart_waits_out_the_pause() -> None:
    assert logic.seconds_until_next_cycle(None, 100.0, 30) == 0
    assert logic.seconds_until_next_cycle(90.0, 100.0, 30) == 20
    assert logic.seconds_until_next_cycle(10.0, 100.0, 30) == 0
    assert logic.seconds_until_next_cycle(200.0, 100.0, 30) == 30  # clock skew: at most one pause
