"""The shared test and benchmark helpers whose arithmetic the figures depend on (testsupport/)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testsupport.audit import AuditLog, resource_of
from testsupport.launcher import LISTEN_PORTS, free_port, port_free, stop_group
from testsupport.stats import percentile, summary_ms


def test_percentiles_are_nearest_rank_so_every_figure_was_measured() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0  # the lower middle sample, not 2.5
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0
    assert percentile(list(range(1, 101)), 0.99) == 99
    assert percentile(list(range(1, 101)), 0.9) == 90
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_summary_is_in_milliseconds_with_the_asked_quantiles() -> None:
    assert summary_ms([0.001, 0.002, 0.003, 0.010], (0.5, 0.9)) == {
        "n": 4, "p50_ms": 2.0, "p90_ms": 10.0, "max_ms": 10.0, "min_ms": 1.0}
    assert list(summary_ms([0.1])) == ["n", "p50_ms", "p99_ms", "max_ms", "min_ms"]


def entry(user: str, verb: str, stage: str, resource: str = "pods", namespace: str = "ns", sub: str = "",
          at: str = "2026-01-01T00:00:01.000000Z") -> dict[str, object]:
    ref = {"resource": resource, "namespace": namespace, "name": "x", **({"subresource": sub} if sub else {})}
    return {"user": {"username": user}, "verb": verb, "stage": stage, "objectRef": ref,
            "requestReceivedTimestamp": at}


def test_audit_counts_a_watch_when_it_starts_and_other_requests_when_they_complete(tmp_path: Path) -> None:
    sa = "system:serviceaccount:kopf-bench:kopf-bench-operator"
    log = tmp_path / "audit.log"
    log.write_text("\n".join(json.dumps(e) for e in [
        entry(sa, "watch", "ResponseStarted"), entry(sa, "watch", "ResponseComplete"),
        entry(sa, "patch", "ResponseComplete", sub="status"), entry(sa, "create", "ResponseStarted"),
        entry("admin", "create", "ResponseComplete")]) + "\n{torn")
    audit = AuditLog(log)
    assert audit.requests(0, user=sa) == {"watch pods": 1, "patch pods/status": 1}
    assert audit.requests(audit.mark(), user=sa) == {}


def test_audit_entries_about_a_namespace_after_a_moment_leave_out_events(tmp_path: Path) -> None:
    chart = "system:serviceaccount:kopf-operators-e2e:kopf-operators-e2e"
    log = tmp_path / "audit.log"
    log.write_text("\n".join(json.dumps(e) for e in [
        entry(chart, "create", "ResponseComplete", at="2026-01-01T00:00:00.000000Z"),  # before
        entry(chart, "create", "ResponseComplete", resource="events"),
        entry(chart, "patch", "ResponseComplete", namespace="other"),
        entry("admin", "patch", "ResponseComplete"),
        entry(chart, "patch", "ResponseComplete", resource="deployments")]) + "\n")
    found = AuditLog(log).about("ns", since="2026-01-01T00:00:00.500000Z")
    assert [(e["verb"], resource_of(e)) for e in found] == [("patch", "deployments")]


def test_stop_group_ends_the_whole_group_and_kills_what_ignores_sigterm() -> None:
    """The operator and the Go peers run in their own process group: stopping one must leave nothing
    behind, even a child that ignores SIGTERM (it is killed once the timeout passes)."""
    script = "import signal, subprocess, sys, time\n" \
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" \
             "child = subprocess.Popen([sys.executable, '-c', " \
             "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n" \
             "print(child.pid, flush=True)\n" \
             "time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    started = time.monotonic()
    stop_group(proc, timeout=0.5)
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and pid_alive(child):
        time.sleep(0.05)
    assert not pid_alive(child), "the child in the group survived"
    stop_group(proc)  # already ended: nothing to do, no error


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def test_a_free_port_is_outside_the_ephemeral_range_and_bindable() -> None:
    """An outgoing connection never takes the port between the pick and the operator's bind."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    port = free_port()
    assert port in LISTEN_PORTS and port < low and port_free(port)
