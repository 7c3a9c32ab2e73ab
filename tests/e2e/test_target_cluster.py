"""Which cluster `make install/run/deploy` act on (cluster/target-kubeconfig.sh): the local control plane
without a question; any other cluster only once it is named and confirmed, because `make run` runs chaos
and the current context may be a production one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from testsupport.paths import KUBECONFIG, REPO

SCRIPT = REPO / "cluster" / "target-kubeconfig.sh"


def target(kubeconfig: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # A new session has no controlling terminal: there is nobody to ask, as in CI.
    full = {k: v for k, v in os.environ.items() if k != "CONFIRM_CLUSTER"}
    return subprocess.run([str(SCRIPT)], env={**full, "KUBECONFIG": str(kubeconfig), **env}, text=True,
                          capture_output=True, timeout=120, start_new_session=True, stdin=subprocess.DEVNULL)


def test_the_local_cluster_needs_no_question(cluster: str) -> None:
    done = target(KUBECONFIG)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(KUBECONFIG)


def test_another_cluster_is_named_and_refused_without_confirmation(cluster: str, tmp_path: Path) -> None:
    other = tmp_path / "other-kubeconfig"  # the same API server under another file: "somebody else's"
    shutil.copy(KUBECONFIG, other)
    refused = target(other)
    assert refused.returncode != 0
    assert refused.stdout == ""  # no path printed: make's recipe stops before acting
    assert "not the local control plane" in refused.stderr and "CONFIRM_CLUSTER=no" in refused.stderr
    confirmed = target(other, CONFIRM_CLUSTER="no")
    assert confirmed.returncode == 0, confirmed.stderr
    assert confirmed.stdout.strip() == str(other)


def test_make_install_stops_when_the_cluster_is_not_confirmed(cluster: str, tmp_path: Path) -> None:
    other = tmp_path / "other-kubeconfig"
    shutil.copy(KUBECONFIG, other)
    env = {k: v for k, v in os.environ.items() if k != "CONFIRM_CLUSTER"}
    done = subprocess.run(["make", "--no-print-directory", "install"], cwd=REPO, env={**env, "KUBECONFIG": str(other)},
                          text=True, capture_output=True, timeout=300, start_new_session=True,
                          stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    assert "serverside-applied" not in done.stdout and "unchanged" not in done.stdout
