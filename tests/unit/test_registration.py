"""`kopf run operators/*.py` must load every operator file exactly once, with the expected handlers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

from testsupport.paths import REPO

# Loads the files the way `kopf run` does (kopf's own preload), then lists every handler id.
_PROBE = """
import glob, json, kopf
from kopf_operators.core.kopf_patches.registries import all_handlers, preload
preload(sorted(glob.glob({pattern!r})))
handlers = all_handlers(kopf.get_default_registry())
print(json.dumps({{kind: [str(h.id) for h in of_kind] for kind, of_kind in handlers.items()}}))
"""


def registered(pattern: str, **env: str) -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(pattern=pattern)], cwd=REPO,
                         env={**os.environ, "CHAOS_TENANTS": "false", **env},
                         capture_output=True, text=True, check=True, timeout=120)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_each_handler_registers_exactly_once() -> None:
    handlers = registered("operators/*.py")
    all_ids = [hid for ids in handlers.values() for hid in ids if hid not in KOPF_BUILTIN_IDS]
    duplicates = [hid for hid, n in Counter(all_ids).items() if n > 1]
    assert not duplicates, f"registered more than once: {duplicates}"
    assert handlers["_activities"].count("shared-settings") == 1
    assert handlers["_activities"].count("shared-cleanup") == 1
    assert len(all_ids) == len(EXPECTED_HANDLER_IDS) == 46
    assert sorted(all_ids) == sorted(EXPECTED_HANDLER_IDS)


def test_tenant_handlers_register_only_when_the_feature_is_on() -> None:
    """Without the chart's tenants.enabled the operator has no RBAC for TenantChaosAgents: Kopf must
    not even watch them."""
    off = [hid for ids in registered("operators/blackadder.py").values() for hid in ids]
    on = [hid for ids in registered("operators/blackadder.py", CHAOS_TENANTS="true").values() for hid in ids]
    assert not any("tenant" in hid for hid in off)
    assert sorted(set(on) - set(off)) == ["blackadder-tenant-agent", "blackadder-tenant-delete"]


def test_argo_rollouts_handlers_register_for_every_true_spelling() -> None:
    """REROLLER_ARGO_ROLLOUTS is parsed as every boolean option is (``env_bool``): ``1`` means on, as
    it does for the re-roller's options, which would otherwise say Rollouts are on with nothing handling them."""
    rollout_ids = {"reroller-rollouts", "reroller-rollout-event"}
    for spelling in ("1", "true", "yes", "on"):
        ids = {hid for group in registered("operators/reroller.py", REROLLER_ARGO_ROLLOUTS=spelling).values()
               for hid in group}
        assert rollout_ids <= ids, spelling
    ids = {hid for group in registered("operators/reroller.py", REROLLER_ARGO_ROLLOUTS="0").values() for hid in group}
    assert not rollout_ids & ids


def test_each_operator_file_loads_alone() -> None:
    for path in sorted((REPO / "operators").glob("*.py")):
        handlers = registered(f"operators/{path.name}")
        ids = [hid for group in handlers.values() for hid in group]
        assert {"shared-settings", "shared-cleanup"} <= set(ids), path.name
        own = [hid for hid in ids if not hid.startswith("shared-") and hid not in KOPF_BUILTIN_IDS]
        assert own and all(hid.startswith(path.stem + "-") for hid in own), (path.name, own)


# Kopf registers its own login activities; they are not ours to count.
KOPF_BUILTIN_IDS = {"login_via_client", "login_via_pykube"}

EXPECTED_HANDLER_IDS: list[str] = [
    "shared-settings", "shared-cleanup",
    # operators/immortal.py
    "immortal-startup", "immortal-cleanup", "immortal-objects", "immortal-pods",
    "immortal-event", "immortal-pod-event",
    # operators/copyrator.py
    "copyrator-startup", "copyrator-cleanup", "copyrator-rules", "copyrator-namespaces",
    "copyrator-configmap-copies", "copyrator-secret-copies", "copyrator-resume", "copyrator-create",
    "copyrator-update", "copyrator-rule-event", "copyrator-configmap-event", "copyrator-secret-event",
    "copyrator-namespace-event",
    # operators/blackadder.py
    "blackadder-startup", "blackadder-cleanup", "blackadder-namespaces", "blackadder-copyrator-sources",
    "blackadder-agent", "blackadder-revert-on-delete",
    # operators/reroller.py
    "reroller-startup", "reroller-cleanup", "reroller-configmaps", "reroller-secrets", "reroller-deployments",
    "reroller-statefulsets", "reroller-daemonsets", "reroller-cronjobs", "reroller-jobs", "reroller-namespaces",
    "reroller-terminating-namespaces", "reroller-namespace-deleted",
    "reroller-configmap-event", "reroller-secret-event", "reroller-deployment-event", "reroller-statefulset-event",
    "reroller-daemonset-event", "reroller-cronjob-event", "reroller-job-event",
]


# Kopf adds its finalizer to an object when a handler for it "requires a finalizer": a non-optional
# on.delete handler, a daemon or a timer. Only those kinds can block a deletion (and with it, a
# namespace's or a CRD's) while the operator is down; docs/deploy.md lists them with the way out.
_FINALIZERS_PROBE = """
import glob, json, kopf
from kopf_operators.core.kopf_patches.registries import all_handlers, preload
preload(sorted(glob.glob({pattern!r})))
handlers = all_handlers(kopf.get_default_registry())
kinds = set()
for kind in ("_spawning", "_changing"):
    for handler in handlers[kind]:
        if handler.requires_finalizer:
            kinds.add(handler.selector.plural or handler.selector.any_name)
print(json.dumps(sorted(kinds)))
"""


def test_only_chaos_agents_may_hold_a_finalizer() -> None:
    out = subprocess.run([sys.executable, "-c", _FINALIZERS_PROBE.format(pattern="operators/*.py")], cwd=REPO,
                         env={**os.environ, "CHAOS_TENANTS": "true"},
                         capture_output=True, text=True, check=True, timeout=120)
    kinds = set(json.loads(out.stdout.strip().splitlines()[-1]))
    # Copyrator rules, ImmortalContainers and every built-in object are deleted without the operator.
    # A TenantChaosAgent's ledger lives in another namespace (no ownerReference): its delete handler.
    assert kinds <= {"chaosagents", "tenantchaosagents"}, kinds
