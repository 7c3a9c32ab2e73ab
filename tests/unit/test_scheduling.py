"""`pytest -n`'s module scheduling (tests/scheduling.py), on fake workers: the real node's modules run on gw0
only, the RBAC audit runs on gw0 once every other worker is done, and every test runs once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.scheduling import LAST, REAL_NODE_MODULES, ClusterScheduling

REAL = sorted(REAL_NODE_MODULES)[0]
AUDIT = sorted(LAST)[0]
COLLECTION = [f"tests/unit/test_a.py::t{i}" for i in range(4)] + [f"{REAL}::t{i}" for i in range(2)] + [
    f"tests/e2e/test_b.py::t{i}" for i in range(3)] + [f"{AUDIT}::t0"]


@dataclass
class Gateway:
    id: str


@dataclass(eq=False)  # hashable by identity, as xdist's workers are
class Worker:
    """What the scheduler sees of an xdist worker: it is sent test indexes and, at the end, told to stop."""

    gateway: Gateway
    queue: list[int] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    shutting_down: bool = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.queue.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


class Config:
    def getvalue(self, name: str) -> Any:
        return ["2*popen"] if name == "tx" else None


def run(order: list[str]) -> tuple[ClusterScheduling, dict[str, Worker]]:
    """Schedule the collection on gw0 and gw1, then let the workers finish tests in ``order`` of worker
    ids, each running the first test of its queue (a worker runs its queue in order). Like xdist's, a
    worker runs its last queued test only once it is sent more or told to stop."""
    sched = ClusterScheduling(Config())
    workers = {name: Worker(Gateway(name)) for name in ("gw0", "gw1")}
    for worker in workers.values():
        sched.add_node(worker)
        sched.add_node_collection(worker, COLLECTION)
    sched.schedule()
    for name in order:
        worker = workers[name]
        if len(worker.queue) > 1 or (worker.queue and worker.shutting_down):
            index = worker.queue.pop(0)
            worker.ran.append(COLLECTION[index])
            sched.mark_test_complete(worker, index)
    return sched, workers


def test_the_real_node_modules_run_on_gw0_and_the_audit_last_once_the_others_are_done() -> None:
    sched, workers = run(["gw1", "gw0"] * 20)
    ran = workers["gw0"].ran + workers["gw1"].ran
    assert sorted(ran) == sorted(COLLECTION)  # every test once
    assert all(not test.startswith(REAL) for test in workers["gw1"].ran)
    assert workers["gw0"].ran[-1] == f"{AUDIT}::t0"
    assert sched.tests_finished and all(w.shutting_down for w in workers.values())


def test_the_audit_waits_for_a_slow_other_worker() -> None:
    """gw0 runs out of work while gw1 is still busy: gw0 gets the audit only after gw1's last test."""
    _, workers = run(["gw0"] * 10)
    assert f"{AUDIT}::t0" not in workers["gw0"].ran and not workers["gw0"].shutting_down
    _, workers = run(["gw0"] * 10 + ["gw1"] * 10 + ["gw0"] * 5)
    assert workers["gw0"].ran[-1] == f"{AUDIT}::t0"
    assert sorted(workers["gw0"].ran + workers["gw1"].ran) == sorted(COLLECTION)
