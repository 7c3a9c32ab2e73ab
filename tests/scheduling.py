"""How `pytest -n N` (pytest-xdist) shares the suite out: whole modules, one local cluster per worker.

Each worker runs against a control plane of its own (``testsupport.paths.CLUSTER_DIR``: worker ``gw0`` the
default one, which holds the machine's one real node; ``gwN`` a KWOK-only cluster of its own), with its own
session operator: tests own their namespaces, but an operator acts on everything it watches, so two
workers on one cluster would both act. A module is the unit (its module-scoped operators and set-ups
stay on one worker). Three rules on top of xdist's module scheduling:

- the modules that need the real node (``REAL_NODE_MODULES``) run on ``gw0`` only;
- the modules in ``LAST`` (the RBAC audit: every right the chart grants was used by the whole suite) run
  on ``gw0`` after every other module has finished on every worker;
- the rest go, longest first (by test count), to whichever worker runs short of work; the modules in
  ``LATE`` (they need the monitoring tools, which `make test` builds meanwhile) at the end.
"""

from __future__ import annotations

import os
import subprocess
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from testsupport.paths import CLUSTER_DIR, REPO

# Modules that use the real node (fixtures ``real_node``/``operator_image``); tests/unit/test_structure.py
# checks this list against the modules' source.
REAL_NODE_MODULES = frozenset({
    "tests/e2e/test_blackadder_real_node.py",
    "tests/e2e/test_ha.py",
    "tests/e2e/test_immortal_real_node.py",
    "tests/e2e/test_real_node.py",
    "tests/e2e/test_reroller_progressive.py",
    "tests/e2e/test_release.py",
    "tests/e2e/test_status.py",
    "tests/e2e/test_uninstall.py",
    "tests/e2e/test_upgrade.py",
    "tests/e2e/test_upgrade_minor.py",
})
LAST = frozenset({"tests/e2e/test_zz_rbac.py"})
# Modules that need cluster/monitoring.sh's tools, which `make test` builds beside the first modules: late.
LATE = frozenset({"tests/e2e/test_chart.py", "tests/e2e/test_blackadder_gamedays.py"})
FIRST_WORKER = "gw0"


# Every cluster of this run, for the modules that read all of them (the RBAC audit); set by the controller.
RUN_CLUSTERS_ENV = "E2E_CLUSTER_DIRS"


def worker_id() -> str:
    """This process's xdist worker ("gw0", "gw1", ...), "" when not under xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def run_cluster_dirs() -> list[Path]:
    """The cluster directories of this run: the worker's own alone without xdist."""
    listed = os.environ.get(RUN_CLUSTERS_ENV, "")
    return [Path(p) for p in listed.split(os.pathsep)] if listed else [CLUSTER_DIR]


def _cluster(directory: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "cluster" / "cluster.sh"), *args], capture_output=True, text=True,
                          check=check, env={**os.environ, "CLUSTER_DIR": str(directory), "REAL_NODE": "0"})


def start_run_clusters(config: pytest.Config) -> list[str]:
    """In the controller: name every worker's cluster for the workers (``RUN_CLUSTERS_ENV``); return those
    of workers other than gw0 that are not up yet: each worker starts its own (the ``cluster`` fixture),
    and the controller stops them once every worker is done (``stop_run_clusters``)."""
    workers = int(getattr(config.option, "numprocesses", 0) or 0)
    extra = [CLUSTER_DIR.with_name(f"{CLUSTER_DIR.name}-gw{n}") for n in range(1, workers)]
    os.environ[RUN_CLUSTERS_ENV] = os.pathsep.join(str(d) for d in [CLUSTER_DIR, *extra])
    return [str(d) for d in extra if _cluster(d, "status", check=False).returncode != 0]


def stop_run_clusters(started: list[str]) -> None:
    for directory in started:
        _cluster(Path(directory), "down")


def audit_log_paths() -> list[Path]:
    """The API server audit log of each cluster of this run."""
    return [Path(_cluster(d, "audit-log").stdout.strip()) for d in run_cluster_dirs()]


class ClusterScheduling(LoadScopeScheduling):
    """xdist's module scheduling (``--dist loadfile``) with the real-node and last-module rules above."""

    collection: list[str] | None

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.pinned: OrderedDict[str, dict[str, bool]] = OrderedDict()
        self.last: OrderedDict[str, dict[str, bool]] = OrderedDict()

    def _split_scope(self, nodeid: str) -> str:
        return nodeid.split("::", 1)[0]

    @staticmethod
    def _first(node: Any) -> bool:
        return node.gateway.id == FIRST_WORKER

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed and self._check_nodes_have_same_collection():
            collection: list[str] = list(next(iter(self.registered_collections.values())))
            self.collection = collection
            units: dict[str, dict[str, bool]] = {}
            for nodeid in collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            # Longest first (by test count): the long modules start early, the short ones fill the gaps.
            for scope, unit in sorted(units.items(), key=lambda item: (item[0] in LATE, -len(item[1]))):
                queue = self.last if scope in LAST else self.pinned if scope in REAL_NODE_MODULES else self.workqueue
                queue[scope] = unit
        for node in self.nodes:
            self._reschedule(node)

    def _others_busy(self) -> bool:
        return bool(self.workqueue or self.pinned) or any(
            self._pending_of(work) for node, work in self.assigned_work.items() if not self._first(node))

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down or self.collection is None:
            return
        if self._pending_of(self.assigned_work[node]) > 2:
            return
        first = self._first(node)
        if first and self.pinned:
            self._assign(node, self.pinned)
        elif self.workqueue:
            self._assign(node, self.workqueue)
        elif first and self.last:
            # Its own pending tests run before the last module anyway (a worker runs in order, and holds its
            # last test until it is sent more or told to stop: waiting for it to finish would never end).
            if not self._others_busy():
                self._assign(node, self.last)
        elif not first or not (self.pinned or self.last):
            node.shutdown()

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        if self.last:  # the first worker may be waiting for the others to finish
            for other in self.nodes:
                if self._first(other) and other is not node:
                    self._reschedule(other)

    def _assign(self, node: Any, queue: OrderedDict[str, dict[str, bool]]) -> None:
        scope, unit = queue.popitem(last=False)
        self.assigned_work.setdefault(node, {})[scope] = unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in unit.items() if not done])

    @property
    def tests_finished(self) -> bool:
        return not (self.pinned or self.last) and super().tests_finished

    @property
    def has_pending(self) -> bool:
        return bool(self.pinned or self.last) or super().has_pending
