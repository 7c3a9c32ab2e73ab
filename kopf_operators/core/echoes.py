"""The echoes of this process's own writes: which watch event only brings back an answer a controller kept.

A controller that keeps a write's answer as the object's newest state marks it here (``Access.keep_answer``,
``Access.defer_echo``); the watch event that echoes it back (the same uid and resourceVersion) is then
skipped, or processed only once the writes in flight are done (the patched processor, ``governed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Iterator, Mapping
from typing import Any

# The echo of a write marked with ``defer_echo`` waits at most this long for the writes in flight.
ECHO_DEFER_SECONDS = 2.0
# Marked answers kept at most (the oldest goes first): an echo that never comes (a copy written into
# another shard's namespace, which this process does not watch) must not hold its mark for ever.
KEPT_ANSWERS_MAX = 16384


class Echo(enum.Enum):
    """What a watch event is to the writes of this process (``Echoes.echo``)."""

    SKIP = "echo"  # the echo of a kept answer: nothing to do (``keep_answer``)
    DEFER = "deferred"  # the echo of a write whose indexes still need it, after the writes (``defer_echo``)


class Echoes:
    """The marked answers, and the writes in flight (one per process, in its ``Access``)."""

    def __init__(self) -> None:
        # uid -> (resourceVersion, what its echo is) of a write answer its caller kept (``keep_answer``,
        # ``defer_echo``), until the watch delivers that object's next event (the echo, or a newer one).
        self._kept_answers: dict[str, tuple[str, Echo]] = {}
        self._writes_in_flight = 0
        self._no_writes = asyncio.Event()  # set while no write is in flight
        self._no_writes.set()

    def keep(self, answer: Mapping[str, Any], echo: Echo) -> None:
        meta = answer.get("metadata") or {}
        if meta.get("uid") and meta.get("resourceVersion"):
            self._kept_answers.pop(meta["uid"], None)  # re-marked: now the newest
            self._kept_answers[meta["uid"]] = (meta["resourceVersion"], echo)
            if len(self._kept_answers) > KEPT_ANSWERS_MAX:  # its echo is then processed as any event
                del self._kept_answers[next(iter(self._kept_answers))]

    def echo(self, event_type: str | None, body: Mapping[str, Any]) -> Echo | None:
        """What this watch event is when it echoes a marked answer (that very version, ADDED after our
        create or MODIFIED after our patch), else None. Any event of the object ends the wait: the watch
        delivers versions in order, so a newer one (or a re-listing, or a deletion) means the echo will
        not come."""
        meta = body.get("metadata") or {}
        kept = self._kept_answers.pop(meta.get("uid") or "", None)
        if kept is None or event_type not in ("ADDED", "MODIFIED") or kept[0] != meta.get("resourceVersion"):
            return None
        return kept[1]

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One write in flight while inside."""
        self._writes_in_flight += 1
        self._no_writes.clear()
        try:
            yield
        finally:
            self._writes_in_flight -= 1
            if not self._writes_in_flight:
                self._no_writes.set()

    async def writes_done(self, timeout: float = ECHO_DEFER_SECONDS) -> None:
        """Return once no write of this process is in flight, or after ``timeout``."""
        if self._writes_in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._no_writes.wait(), timeout)
