"""Re-roller: pacing (pure arithmetic): the leading edge, the per-workload interval and the cluster-wide
token bucket, fair between namespaces.
"""

from __future__ import annotations

from collections.abc import Hashable

from kopf_operators.reroller.settings import (
    Options,
)

# --- pacing: leading edge, per-workload interval, cluster-wide token bucket -------------------------

MIN_WAIT = 0.001  # a waiter asks again no sooner than this (a timer firing early asks once more)


def next_rollout_at(last_roll: float | None, now: float, settings: Options) -> float:
    """When the workload may roll: at once after a quiet period (leading edge); otherwise when the
    merge window / minimum interval since its last rollout has passed (one trailing rollout, which
    takes every change made meanwhile)."""
    if last_roll is None:
        return now
    return max(now, last_roll + settings.min_gap)


class TokenBucket:
    """Cluster-wide rollouts per second, fair between namespaces. A rollout asks for its slot each time
    it is due (``ask``); when tokens are short, the waiting rollouts are served round-robin by
    namespace: each namespace's own in arrival order, and in each round the namespace served longest
    ago (or never) first. So a namespace flapping hundreds of rollouts cannot delay another
    namespace's first rollout beyond the next token (at most one token interval, 1/rate). Each waiter
    learns when to ask again (its place times the interval), so waiters never stampede; a waiter's
    place moves back when another namespace arrives, and it then waits longer when it asks again."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.stamp = now
        # namespace -> its waiting keys in arrival order (the dict: namespaces in arrival order).
        self.waiting: dict[str, dict[Hashable, None]] = {}
        # namespace -> the grant that last served it (while anyone waits; -1: none since).
        self.served: dict[str, int] = {}
        self.grants = 0

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def place(self, namespace: str, key: Hashable) -> int:
        """How many waiting rollouts are served before this one (round-robin by namespace)."""
        turn = list(self.waiting[namespace]).index(key)  # the round in which it is served
        order = sorted(self.waiting, key=lambda ns: self.served.get(ns, -1))  # stable: then by arrival
        first = order[:order.index(namespace)]
        ahead = turn
        for other in order:
            if other != namespace:
                # Full rounds before its turn, and in its own round the namespaces that come first.
                length = len(self.waiting[other])
                ahead += min(length, turn) + (1 if length > turn and other in first else 0)
        return ahead

    def ask(self, namespace: str, key: Hashable, now: float) -> float:
        """The seconds ``key`` (a rollout in ``namespace``) must wait before asking again; 0: it takes a
        token and may roll now."""
        if self.rate <= 0:
            return 0.0
        self._refill(now)
        if not self.waiting and self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        queue = self.waiting.setdefault(namespace, {})
        queue.setdefault(key, None)
        ahead = self.place(namespace, key)
        if self.tokens >= ahead + 1:  # enough for every rollout served before it, and for it
            self.tokens -= 1
            self.cancel(namespace, key)
            self.grants += 1
            self.served[namespace] = self.grants  # served: the namespace comes last in the next round
            if not self.waiting:
                self.served.clear()  # nobody waits: the next burst starts even
            return 0.0
        return max(MIN_WAIT, (ahead + 1 - self.tokens) / self.rate)

    def cancel(self, namespace: str, key: Hashable) -> None:
        """Drop a waiting rollout that turned out unnecessary (or whose workload is gone)."""
        queue = self.waiting.get(namespace)
        if queue is not None and key in queue:
            del queue[key]
            if not queue:
                del self.waiting[namespace]
