"""Where the re-roller's defaults differ from stakater Reloader's, the flag that makes it behave as
Reloader does, end to end: REROLLER_SYNC_AFTER_RESTART=false (Reloader's default) records a change
made while the operator was down as the baseline instead of rolling it. (The other difference, the
default strategy, has its flag tested in test_reroller.py: ``test_env_vars_strategy``.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.e2e.reroller_helpers import (
    AUTO,
    NGINX_CONF,
    assert_rolled_once,
    baseline,
    configmap,
    deployment,
    nginx_pod_spec,
    observed_hash,
    replicasets,
    reroller_with,  # noqa: F401  (a fixture)
    set_cm,
    template_hash,
)
from tests.kube import OperatorProcess, stays, wait_for


def test_without_sync_after_restart_a_change_made_while_down_rolls_nothing(
        reroller_with: Callable[..., OperatorProcess], namespace: str, core: Any, apps: Any) -> None:  # noqa: F811
    proc = reroller_with(REROLLER_SYNC_AFTER_RESTART="false")
    configmap(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF})
    deployment(apps, namespace, "nginx", nginx_pod_spec(), AUTO)
    before = baseline(apps, namespace, "nginx")
    wait_for(lambda: replicasets(apps, namespace, "nginx") == 1, timeout=30, what="the first ReplicaSet")

    proc.stop()
    set_cm(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF.replace("v1", "down")})
    proc.start()
    # The change becomes the baseline at the first look, and nothing rolls.
    wait_for(lambda: observed_hash(apps, namespace, "nginx") != before, timeout=30, what="the new baseline")
    stays(lambda: template_hash(apps, namespace, "nginx") is None and replicasets(apps, namespace, "nginx") == 1,
          4, what="no rollout for the change made while down")

    # A change while it runs rolls as usual.
    set_cm(core, namespace, "nginx-conf", {"nginx.conf": NGINX_CONF.replace("v1", "up")})
    assert_rolled_once(apps, core, namespace, "nginx", "configmap/nginx-conf")
