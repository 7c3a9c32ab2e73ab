"""Re-roller under adversarial conditions (issue #20), on the real local API server.

Edits in the middle of a pass, the operator stopped at each step, names and sizes at the API's limits
(253-character source names, ConfigMaps of about 1 MiB, a workload referencing many sources), objects
owned by someone else (template annotations set by a person or a GitOps tool, workloads not opted
in), the same change applied twice. "Rolled" is counted on what the controller-manager did
(ReplicaSets), not on the operator's patch.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from kopf_operators.reroller import patches, settings
from tests.e2e.reroller_helpers import (
    AUTO,
    NGINX_CONF,
    assert_not_rolled,
    assert_rolled_once,
    baseline,
    configmap,
    deployment,
    events,
    nginx_pod_spec,
    observed_hash,
    replicasets,
    reroller_with,  # noqa: F401  (a fixture)
    secret,
    set_cm,
    stakater,
    template_hash,
)
from tests.kube import OperatorProcess, stays, wait_for
from testsupport.kubectl import kubectl

LONG = 253  # the longest object name the API server accepts (a DNS subdomain)
NEAR_ONE_MIB = 1024 * 1024 - 64  # ConfigMap data may total 1 MiB (keys and values)


def long_name(prefix: str) -> str:
    head = f"{prefix}-{uuid.uuid4().hex[:6]}-"
    return head + "x" * (LONG - len(head))


def env_from(*sources: tuple[str, str]) -> dict[str, Any]:
    refs = [{"configMapRef" if kind == "ConfigMap" else "secretRef": {"name": name}} for kind, name in sources]
    return {"containers": [{"name": "app", "image": "app", "envFrom": refs}]}


def ready(apps: Any, ns: str, name: str) -> str:
    first = baseline(apps, ns, name)
    wait_for(lambda: replicasets(apps, ns, name) == 1, timeout=30, what=f"{name}'s first ReplicaSet")
    return first


def template_annotations(apps: Any, ns: str, name: str) -> dict[str, str]:
    return dict(apps.read_namespaced_deployment(name, ns).spec.template.metadata.annotations or {})


def settled(apps: Any, ns: str, name: str, seconds: float = 4) -> int:
    """Waits until the workload's ReplicaSets stop changing for a while; returns their number."""
    counts: list[int] = []

    def quiet() -> bool:
        counts.append(replicasets(apps, ns, name))
        return len(counts) >= 2 and counts[-1] == counts[-2]
    wait_for(quiet, timeout=60, interval=seconds, what=f"{name} settled")
    return counts[-1]


def own_errors(proc: OperatorProcess, ns: str) -> list[str]:
    return [line for line in proc.errors(about=ns) if "reroll" in line.lower()]


# --- edits in the middle of a pass -------------------------------------------------------------------


def test_edit_while_the_rollout_patch_is_in_flight_is_never_lost(operator: OperatorProcess, namespace: str,
                                                                 core: Any, apps: Any) -> None:
    """The second edit lands while the first rollout is being written: it either merges into that
    rollout or rolls once more after it, and the workload ends up with the last data: a restart
    afterwards finds nothing left to do."""
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "app", env_from(("ConfigMap", "conf")), AUTO)
    ready(apps, namespace, "app")
    set_cm(core, namespace, "conf", {"k": "2"})
    wait_for(lambda: template_hash(apps, namespace, "app"), timeout=30, interval=0.01, what="the first rollout")
    set_cm(core, namespace, "conf", {"k": "3"})  # right behind the first rollout's patch
    final = settled(apps, namespace, "app", seconds=12)  # past the 10 s minimum interval
    assert final in (2, 3), f"{final - 1} rollouts for two edits"
    recorded = observed_hash(apps, namespace, "app")
    operator.restart()
    stays(lambda: replicasets(apps, namespace, "app") == final and observed_hash(apps, namespace, "app") == recorded,
          5, what="nothing left over for a restart to roll: the last edit was taken")
    assert not own_errors(operator, namespace)


def test_opt_out_while_the_source_changes(operator: OperatorProcess, namespace: str, core: Any,
                                          apps: Any) -> None:
    """The annotation removed in the same instant the source changes: at most one rollout for that
    instant, and none ever after."""
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "app", env_from(("ConfigMap", "conf")), AUTO)
    ready(apps, namespace, "app")
    apps.patch_namespaced_deployment("app", namespace, {"metadata": {"annotations": {settings.AUTO: None}}})
    set_cm(core, namespace, "conf", {"k": "2"})
    after_race = settled(apps, namespace, "app")
    assert after_race in (1, 2)
    for i in range(3, 6):
        set_cm(core, namespace, "conf", {"k": str(i)})
    stays(lambda: replicasets(apps, namespace, "app") == after_race, 6, what="an opted-out workload left alone")
    assert not own_errors(operator, namespace)


def test_source_deleted_and_recreated_with_new_data_rolls_once(operator: OperatorProcess, namespace: str,
                                                               core: Any, apps: Any) -> None:
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "app", env_from(("ConfigMap", "conf")), AUTO)
    ready(apps, namespace, "app")
    core.delete_namespaced_config_map("conf", namespace)
    wait_for(lambda: events(core, namespace, "app", "SourceMissing"), timeout=30, what="a SourceMissing event")
    assert_not_rolled(apps, namespace, "app", 3)  # a deletion alone rolls nothing (pods keep running)
    configmap(core, namespace, "conf", {"k": "2"})
    assert_rolled_once(apps, core, namespace, "app", "configmap/conf")
    # Deleted and re-created at once (no event in between can be relied on) with new data again.
    core.delete_namespaced_config_map("conf", namespace)
    configmap(core, namespace, "conf", {"k": "3"})
    wait_for(lambda: replicasets(apps, namespace, "app") == 3, timeout=40, what="the re-created data rolled")
    stays(lambda: replicasets(apps, namespace, "app") == 3, 4, what="rolled once")


# --- the operator stopped at each step ---------------------------------------------------------------


def test_two_changes_while_down_roll_once_after_start(operator: OperatorProcess, namespace: str, core: Any,
                                                      apps: Any) -> None:
    configmap(core, namespace, "conf", {"k": "1"})
    secret(core, namespace, "creds", {"k": "1"})
    deployment(apps, namespace, "app", env_from(("ConfigMap", "conf"), ("Secret", "creds")), AUTO)
    ready(apps, namespace, "app")
    operator.stop()
    set_cm(core, namespace, "conf", {"k": "2"})
    core.patch_namespaced_secret("creds", namespace, {"stringData": {"k": "2"}})
    set_cm(core, namespace, "conf", {"k": "3"})
    operator.start()
    assert_rolled_once(apps, core, namespace, "app", "configmap/conf")


def test_killed_right_after_a_change_rolls_once_not_zero_not_two(operator: OperatorProcess, namespace: str,
                                                                 core: Any, apps: Any) -> None:
    """SIGKILL at whatever step the operator was in (before, during or after its patch)."""
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "app", env_from(("ConfigMap", "conf")), AUTO)
    ready(apps, namespace, "app")
    set_cm(core, namespace, "conf", {"k": "2"})
    operator.kill()
    operator.start()
    wait_for(lambda: replicasets(apps, namespace, "app") == 2, timeout=40, what="one rollout")
    stays(lambda: replicasets(apps, namespace, "app") == 2, 5, what="exactly one rollout")


def test_workload_created_while_down_gets_a_baseline_not_a_rollout(operator: OperatorProcess, namespace: str,
                                                                   core: Any, apps: Any) -> None:
    configmap(core, namespace, "conf", {"k": "1"})
    operator.stop()
    deployment(apps, namespace, "app", env_from(("ConfigMap", "conf")), AUTO)
    set_cm(core, namespace, "conf", {"k": "2"})  # the workload never ran with "1" under the operator's eyes
    wait_for(lambda: replicasets(apps, namespace, "app") == 1, timeout=30, what="the first ReplicaSet")
    operator.start()
    baseline(apps, namespace, "app")
    assert_not_rolled(apps, namespace, "app", 4)
    set_cm(core, namespace, "conf", {"k": "3"})
    assert_rolled_once(apps, core, namespace, "app", "configmap/conf")


# --- names and sizes at the API's limits -------------------------------------------------------------


def test_253_character_source_names(operator: OperatorProcess, namespace: str, core: Any, apps: Any) -> None:
    cm, sec = long_name("cm"), long_name("secret")
    configmap(core, namespace, cm, {"k": "1"})
    secret(core, namespace, sec, {"k": "1"})
    deployment(apps, namespace, "app", env_from(("ConfigMap", cm), ("Secret", sec)), AUTO)
    ready(apps, namespace, "app")
    set_cm(core, namespace, cm, {"k": "2"})
    first = assert_rolled_once(apps, core, namespace, "app", f"configmap/{cm}")
    core.patch_namespaced_secret(sec, namespace, {"stringData": {"k": "2"}})
    # Within the 10 s minimum interval: the Secret's change rolls once when it has passed.
    wait_for(lambda: template_hash(apps, namespace, "app") != first, timeout=30, what="the Secret's rollout")
    wait_for(lambda: any(sec in (e.message or "") for e in events(core, namespace, "app", "Rerolled")),
             timeout=15, what="a Rerolled event naming the 253-character Secret")
    wait_for(lambda: replicasets(apps, namespace, "app") == 3, timeout=30, what="a third ReplicaSet")
    stays(lambda: replicasets(apps, namespace, "app") == 3, 4, what="rolled once")
    assert not own_errors(operator, namespace)


def test_253_character_dotted_name_under_the_env_vars_strategy(
        reroller_with: Callable[..., OperatorProcess], namespace: str, core: Any, apps: Any) -> None:  # noqa: F811
    """Reloader's env-vars strategy turns the source's name into a variable name: a 253-character
    name with dots becomes a valid (long) variable, and the workload rolls once."""
    reroller_with(REROLLER_RELOAD_STRATEGY="env-vars")
    name = ".".join(["seg" + "x" * 60] * 4)[:LONG]  # labels of 63, dots between
    assert len(name) == LONG
    configmap(core, namespace, name, {"k": "1"})
    deployment(apps, namespace, "app", env_from(("ConfigMap", name)), AUTO)
    ready(apps, namespace, "app")
    set_cm(core, namespace, name, {"k": "2"})
    variable = patches.env_var_name("ConfigMap", name)
    wait_for(lambda: stakater(apps, namespace, "app", "app").get(variable), timeout=30, what=f"{variable} set")
    wait_for(lambda: replicasets(apps, namespace, "app") == 2, timeout=30, what="a second ReplicaSet")
    stays(lambda: replicasets(apps, namespace, "app") == 2, 4, what="rolled once")


def test_one_mib_configmap_rolls_once_and_its_reapply_rolls_nothing(operator: OperatorProcess, namespace: str,
                                                                    core: Any, apps: Any) -> None:
    def body(fill: str) -> dict[str, Any]:
        return {"metadata": {"name": "big"}, "data": {"blob": fill * NEAR_ONE_MIB}}
    core.create_namespaced_config_map(namespace, body("a"))
    deployment(apps, namespace, "app", env_from(("ConfigMap", "big")), AUTO)
    ready(apps, namespace, "app")
    core.replace_namespaced_config_map("big", namespace, body("b"))
    assert_rolled_once(apps, core, namespace, "app", "configmap/big")
    core.replace_namespaced_config_map("big", namespace, {**body("b"), "metadata": {
        "name": "big", "labels": {"reapplied": "yes"}}})  # a new resourceVersion, the same data
    stays(lambda: replicasets(apps, namespace, "app") == 2, 5, what="the identical 1 MiB re-apply rolls nothing")


def test_a_workload_referencing_many_sources(operator: OperatorProcess, namespace: str, core: Any,
                                             apps: Any) -> None:
    names = [f"part-{i:03d}" for i in range(120)]
    for name in names:
        configmap(core, namespace, name, {"k": "1"})
    deployment(apps, namespace, "app", env_from(*(("ConfigMap", n) for n in names)), AUTO)
    ready(apps, namespace, "app")
    set_cm(core, namespace, names[77], {"k": "2"})
    assert_rolled_once(apps, core, namespace, "app", f"configmap/{names[77]}")
    assert not events(core, namespace, "app", "SourceMissing")


# --- objects owned by someone else -------------------------------------------------------------------


def test_template_annotations_set_by_a_person_are_kept(operator: OperatorProcess, namespace: str, core: Any,
                                                       apps: Any) -> None:
    """A person writes the re-roller's own template annotation by hand (and a restartedAt of their
    own): the operator does not react to that, and its next rollout keeps the person's other
    annotations."""
    configmap(core, namespace, "conf", {"k": "1"})
    deployment(apps, namespace, "app", env_from(("ConfigMap", "conf")), AUTO)
    ready(apps, namespace, "app")
    kubectl("rollout", "restart", "deployment/app", "-n", namespace)
    wait_for(lambda: replicasets(apps, namespace, "app") == 2, timeout=30, what="the person's restart")
    apps.patch_namespaced_deployment("app", namespace, {"spec": {"template": {"metadata": {"annotations": {
        settings.CONFIG_HASH: "set-by-hand", "team.example.com/owner": "web"}}}}})
    wait_for(lambda: replicasets(apps, namespace, "app") == 3, timeout=30, what="the person's edit rolled")
    stays(lambda: replicasets(apps, namespace, "app") == 3
          and template_annotations(apps, namespace, "app").get(settings.CONFIG_HASH) == "set-by-hand",
          5, what="the operator leaves a hand edit alone")
    set_cm(core, namespace, "conf", {"k": "2"})
    wait_for(lambda: replicasets(apps, namespace, "app") == 4, timeout=30, what="the change rolled")
    stays(lambda: replicasets(apps, namespace, "app") == 4, 4, what="rolled once")
    kept = template_annotations(apps, namespace, "app")
    assert kept["team.example.com/owner"] == "web"
    assert "kubectl.kubernetes.io/restartedAt" in kept
    assert kept[settings.CONFIG_HASH] != "set-by-hand"


def test_gitops_manifest_with_the_annotation_reapplied(operator: OperatorProcess, namespace: str, core: Any,
                                                       apps: Any) -> None:
    """A GitOps tool's manifest that carries the re-roller's template annotation (copied from a live
    object into Git), applied server-side again and again: one rollout per real change, and the
    operator never fights the tool (no rollout from the re-applies themselves)."""
    configmap(core, namespace, "conf", {"k": "1"})
    labels = {"app": "app"}
    manifest = json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app", "annotations": AUTO},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels, "annotations": {settings.CONFIG_HASH: "from-git"}},
            "spec": env_from(("ConfigMap", "conf"))}}})

    def apply() -> None:
        kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=gitops", "-n", namespace,
                "-f", "-", input=manifest)
    apply()
    ready(apps, namespace, "app")
    apply()
    stays(lambda: replicasets(apps, namespace, "app") == 1, 4, what="a re-apply alone rolls nothing")
    set_cm(core, namespace, "conf", {"k": "2"})
    wait_for(lambda: replicasets(apps, namespace, "app") == 2, timeout=30, what="the change rolled")
    rolled = template_annotations(apps, namespace, "app")[settings.CONFIG_HASH]
    assert rolled != "from-git"
    stays(lambda: replicasets(apps, namespace, "app") == 2, 4, what="rolled once")
    assert not own_errors(operator, namespace)


def test_workload_not_opted_in_is_never_touched(operator: OperatorProcess, namespace: str, core: Any,
                                                apps: Any) -> None:
    configmap(core, namespace, "conf", {"k": "1"})
    secret(core, namespace, "creds", {"k": "1"})
    spec = env_from(("ConfigMap", "conf"), ("Secret", "creds"))
    deployment(apps, namespace, "plain", spec, {})
    deployment(apps, namespace, "off", spec, {settings.AUTO: "false", settings.RELOADER_AUTO: "false"})
    deployment(apps, namespace, "on", spec, AUTO)  # the control: proves the change was seen
    ready(apps, namespace, "on")
    before = {n: apps.read_namespaced_deployment(n, namespace) for n in ("plain", "off")}
    set_cm(core, namespace, "conf", {"k": "2"})
    core.delete_namespaced_secret("creds", namespace)
    secret(core, namespace, "creds", {"k": "2"})
    wait_for(lambda: replicasets(apps, namespace, "on") >= 2, timeout=30, what="the control rolled")

    def managers(obj: Any) -> set[str]:
        return {f.manager for f in obj.metadata.managed_fields or () if f.operation == "Update"
                and not f.subresource}

    def untouched() -> bool:
        for name, old in before.items():
            now = apps.read_namespaced_deployment(name, namespace)
            if (now.metadata.generation != old.metadata.generation
                    or (now.metadata.annotations or {}) != (old.metadata.annotations or {})
                    or managers(now) != managers(old)):  # no writer joined (the operator writes nothing)
                return False
        return True
    stays(untouched, 5, what="workloads not opted in left exactly as they were")
    assert not events(core, namespace, "plain", "SourceMissing") and not events(core, namespace, "off", "Rerolled")


# --- the same change applied twice -------------------------------------------------------------------


def test_same_data_written_twice_rolls_once(operator: OperatorProcess, namespace: str, core: Any,
                                            apps: Any) -> None:
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), AUTO)
    ready(apps, namespace, "nginx")
    new = {"nginx.conf": NGINX_CONF.replace("v1", "v2")}
    set_cm(core, namespace, "nginx-conf", new)
    assert_rolled_once(apps, core, namespace, "nginx", "configmap/nginx-conf")
    # The same data again: a replace (new resourceVersion), a kubectl apply, and a patch.
    core.replace_namespaced_config_map("nginx-conf", namespace, {
        "metadata": {"name": "nginx-conf", "annotations": {"written": "twice"}}, "data": new})
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=other", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nginx-conf"},
                              "data": new}))
    set_cm(core, namespace, "nginx-conf", new)
    stays(lambda: replicasets(apps, namespace, "nginx") == 2, 6, what="the same data twice rolls once")
    assert len(events(core, namespace, "nginx", "Rerolled")) == 1


def test_many_long_named_sources_and_a_template_edit_roll_once(operator: OperatorProcess, namespace: str,
                                                               core: Any, apps: Any) -> None:
    """130 sources with 253-character names: their per-source hashes take more room than an
    annotation may (32 KiB here). A person adding one more source to the pod template rolls the
    workload once (the template edit itself), not twice; a data change still rolls once, naming it."""
    names = [long_name(f"p{i:03d}") for i in range(130)]
    for name in names:
        configmap(core, namespace, name, {"k": "1"})
    configmap(core, namespace, "extra", {"k": "1"})
    deployment(apps, namespace, "app", env_from(*(("ConfigMap", n) for n in names)), AUTO)
    first = ready(apps, namespace, "app")
    spec = env_from(*(("ConfigMap", n) for n in [*names, "extra"]))
    apps.patch_namespaced_deployment("app", namespace, {"spec": {"template": {"spec": spec}}})
    wait_for(lambda: observed_hash(apps, namespace, "app") != first, timeout=30, what="the new baseline")
    wait_for(lambda: replicasets(apps, namespace, "app") >= 2, timeout=30, what="the template edit rolled")
    stays(lambda: replicasets(apps, namespace, "app") == 2 and template_hash(apps, namespace, "app") is None, 5,
          what="one rollout for one template edit")
    set_cm(core, namespace, names[99], {"k": "2"})
    assert_rolled_once(apps, core, namespace, "app", f"configmap/{names[99]}", rs=3)


def test_a_tenants_pattern_neither_stalls_the_process_nor_is_run_unbounded(
        operator: OperatorProcess, namespace: str, make_namespace: Callable[..., str], core: Any, apps: Any) -> None:
    """A reload pattern that backtracks for ever in Python's re, beside the name that triggers it: RE2
    runs it in linear time (it matches nothing there), and a pattern RE2 refuses says so on its workload
    (PatternRefused); meanwhile a ConfigMap change in another namespace still rolls its Deployment."""
    configmap(core, namespace, "a" * 40, {"k": "1"})
    spec = env_from(("ConfigMap", "a" * 40))
    deployment(apps, namespace, "greedy", spec, {settings.RELOADER_CONFIGMAPS: "(a|a)*b"})
    deployment(apps, namespace, "backref", spec, {settings.RELOADER_CONFIGMAPS: r"(a)\1"})
    warning = wait_for(lambda: events(core, namespace, "backref", "PatternRefused"), timeout=30,
                       what="a PatternRefused Warning on the workload")[0]
    assert warning.type == "Warning" and "RE2 refuses it" in warning.message and "invalid escape" in warning.message
    other = make_namespace("elsewhere")
    configmap(core, other, "conf", {"k": "1"})
    deployment(apps, other, "app", env_from(("ConfigMap", "conf")), AUTO)
    ready(apps, other, "app")
    set_cm(core, namespace, "a" * 40, {"k": "2"})  # the name the greedy pattern is matched against
    set_cm(core, other, "conf", {"k": "2"})
    assert_rolled_once(apps, core, other, "app", "configmap/conf")
    assert template_hash(apps, namespace, "greedy") is None  # matches nothing: never rolled
