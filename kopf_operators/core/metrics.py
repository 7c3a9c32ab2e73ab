"""Prometheus metrics of all four operators (prometheus_client), served on METRICS_PORT.

Controllers count what they do through ``action`` and ``error`` and time their reactions with
``reaction``; nothing else in the project touches prometheus_client.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import prometheus_client

ACTIONS = prometheus_client.Counter(
    "kopf_operators_actions", "Actions taken by the operators.", ["operator", "action"])
ERRORS = prometheus_client.Counter(
    "kopf_operators_errors", "Errors met by the operators.", ["operator", "kind"])
API_ERRORS = prometheus_client.Counter(
    "kopf_operators_api_errors", "Failed API requests (each attempt), by HTTP status.", ["status"])
API_CONNECTIONS = prometheus_client.Counter(
    "kopf_operators_api_connections",
    "Connections opened to the API server (each a TLS handshake); a steady rise means they are not kept.")
REACTION = prometheus_client.Histogram(
    "kopf_operators_reaction_seconds",
    "From a watch event reaching the operator to the writes it caused being done.",
    ["operator", "trigger"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))

EVENTS = prometheus_client.Counter(
    "kopf_operators_events",
    "Watch events of resources without change handlers, by resource and outcome: processed, or "
    "superseded (skipped: a newer event of the same object was already queued).",
    ["resource", "outcome"])

LEADER = prometheus_client.Gauge(
    "kopf_operators_leader", "1 while this replica acts (it holds the Lease, or elects none), 0 while it stands by.",
    ["lease"])

# Hash shards (docs/sharding.md): which slice this process serves and who filters its watches, the API
# server ("server": the ShardedListAndWatch selector) or the process itself ("client": a server without it).
SHARD = prometheus_client.Gauge(
    "kopf_operators_shard",
    "1 for the shard this process serves (SHARD_INDEX of SHARD_COUNT) and who filters its watches: server or client.",
    ["index", "count", "filtering"])

# Re-roller, opt-in (REROLLER_METRICS_BY_NAMESPACE, Reloader's enableMetricsByNamespace): one series per
# namespace, so off by default (cardinality).
RELOADS_BY_NAMESPACE = prometheus_client.Counter(
    "kopf_operators_reroller_reloads", "Re-roller reloads by namespace, workload kind and outcome.",
    ["namespace", "kind", "outcome"])

# Re-roller: rollouts a change asked for and not made (yet), counted once per held change: by reason,
# restart_window (waiting for the workload's restart window) or invalid (a malformed restart window
# or CronJob mode holds it until fixed).
REROLLER_SKIPPED = prometheus_client.Counter(
    "kopf_operators_reroller_skipped", "Re-roller rollouts held back, by reason (restart_window, invalid).",
    ["reason"])

# Re-roller: workloads whose rollout a halted progression holds (a wave before theirs failed its rollout).
HELD_ROLLOUTS = prometheus_client.Gauge(
    "kopf_operators_reroller_held_rollouts",
    "Workloads held by a halted progressive rollout: an earlier wave failed its rollout (docs/reroller.md).")

# Copyrator: copies kept, unsynced, in namespaces that do not consent to them (made before the target
# consent existed, or consent withdrawn since): an administrator keeps or removes them (docs/copyrator.md).
UNCONSENTED_COPIES = prometheus_client.Gauge(
    "kopf_operators_copyrator_unconsented_copies",
    "Copies kept as they are (no longer synced) in namespaces that do not consent to them.")
SOURCES_TOO_LARGE = prometheus_client.Gauge(
    "kopf_operators_copyrator_sources_too_large",
    "Sources (selected by a rule or pushing) never copied: their data exceed COPYRATOR_MAX_SOURCE_BYTES.")

# Blackadder's game days: each steady-state check's evaluations, and each killed workload's time to
# recover (all its Pods Ready again), by workload kind (ImmortalContainer included).
CHECKS = prometheus_client.Counter(
    "kopf_operators_blackadder_checks", "Steady-state check evaluations, by agent, check and result.",
    ["agent", "check", "result"])
RECOVERY = prometheus_client.Histogram(
    "kopf_operators_blackadder_recovery_seconds",
    "From a Pod killed by an agent to all Pods of its workload being Ready again.", ["kind"],
    buckets=(0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0))


# The process's event loop: every operator, the watches and the handlers share it; anything that holds it
# (a long computation, a blocking call) delays them all. Set by ``LoopLag`` while it runs.
EVENT_LOOP_LAG = prometheus_client.Gauge(
    "kopf_operators_event_loop_lag_seconds",
    "How late the event loop woke from a short sleep: the most over the last 10 s, or how long a wake is "
    "overdue right now (a loop held for long shows it while it is held).")


class LoopLag:
    """Sleeps ``interval`` again and again on the event loop and records how late it wakes. Read from
    the metrics thread: the largest lag over the last ``window`` seconds, or the time the current wake
    is overdue, whichever is more; so a loop held for minutes reads minutes, not its last good tick."""

    def __init__(self, interval: float = 0.25, window: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval, self.window, self.clock = interval, window, clock
        self.due: float | None = None  # when the current sleep should end; None: not running
        self.recent: collections.deque[tuple[float, float]] = collections.deque()  # (woke at, lag)

    def value(self) -> float:
        now, due = self.clock(), self.due
        recent = max((lag for woke, lag in list(self.recent) if woke >= now - self.window), default=0.0)
        return max(recent, 0.0 if due is None else now - due, 0.0)

    def record(self, woke: float, lag: float) -> None:
        self.recent.append((woke, lag))
        while self.recent and self.recent[0][0] < woke - self.window:
            self.recent.popleft()

    async def run(self) -> None:
        EVENT_LOOP_LAG.set_function(self.value)
        try:
            while True:
                self.due = self.clock() + self.interval
                await asyncio.sleep(self.interval)
                woke = self.clock()
                self.record(woke, max(0.0, woke - self.due))
        finally:
            self.due = None
            self.recent.clear()


def watch_event_loop() -> asyncio.Task[None]:
    """Start measuring the running loop's lag into EVENT_LOOP_LAG (cancel the task to stop)."""
    return asyncio.get_running_loop().create_task(LoopLag().run(), name="event-loop-lag")


def check(agent: str, name: str, passed: bool) -> None:
    CHECKS.labels(agent=agent, check=name, result="pass" if passed else "fail").inc()


def forget_agent(agent: str) -> None:
    """An agent deleted: its checks' series go (a process that runs for months sees thousands of agents)."""
    CHECKS.remove_by_labels({"agent": agent})


def recovery(kind: str, seconds: float) -> None:
    RECOVERY.labels(kind=kind).observe(seconds)


def skipped(reason: str) -> None:
    REROLLER_SKIPPED.labels(reason=reason).inc()


def held_rollouts(count: Callable[[], int]) -> None:
    """The gauge reads the re-roller's held workloads when scraped."""
    HELD_ROLLOUTS.set_function(count)


def unconsented_copies(count: int) -> None:
    UNCONSENTED_COPIES.set(count)


def sources_too_large(count: int) -> None:
    SOURCES_TOO_LARGE.set(count)


def shard(index: int, count: int, filtering: str) -> None:
    SHARD.labels(str(index), str(count), filtering).set(1)


def action(operator: str, name: str, amount: float = 1) -> None:
    ACTIONS.labels(operator=operator, action=name).inc(amount)


def error(operator: str, kind: str) -> None:
    ERRORS.labels(operator=operator, kind=kind).inc()


def event(resource: str, outcome: str) -> None:
    EVENTS.labels(resource=resource, outcome=outcome).inc()


def reload_by_namespace(namespace: str, kind: str, outcome: str) -> None:
    RELOADS_BY_NAMESPACE.labels(namespace=namespace, kind=kind, outcome=outcome).inc()


def forget_namespace(namespace: str) -> None:
    """A namespace deleted: its reload series go."""
    RELOADS_BY_NAMESPACE.remove_by_labels({"namespace": namespace})


@contextmanager
def reaction(operator: str, trigger: str) -> Iterator[None]:
    """Time one reaction (observed only when it completes without an exception)."""
    started = time.perf_counter()
    yield
    REACTION.labels(operator=operator, trigger=trigger).observe(time.perf_counter() - started)


def serve(port: int) -> None:
    """The /metrics endpoint, in a daemon thread of the library's own."""
    prometheus_client.start_http_server(port)
