"""The access layer's connection pools to the API server (``core.access.Access.session``): aiohttp's,
with connections kept long enough and one spare, and each connection counted.

A new connection costs a TLS handshake, and with an API server under load (a flood of writes) that
takes hundreds of ms, where a request on a kept connection is sent at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from kopf_operators.core import metrics

# An idle connection is kept this long (aiohttp's default is 15 s), below the API server's own idle
# timeout (90 s), so that we close it first and never send on one the server is closing: the
# connections a burst of writes opened are still there for the next burst.
KEEPALIVE_SECONDS = 60.0


class SparePool(aiohttp.TCPConnector):
    """aiohttp's pool of kept-alive connections, plus one spare: when a request takes the last idle
    connection (and the pool is below its limit), another is opened beside it, idle, for the next one.

    Why: a request that finds no idle connection opens one itself. The pool only grows to the most
    requests ever in flight at once, so without a spare the first request beyond a flood's concurrency
    (the re-roller's write slot that ``FairLimit`` keeps for a quiet namespace: the flood holds all but
    that one) opened a connection while the flood's writes kept the API server busy, and was sent
    0.1-0.5 s later than on a kept one. The idle connections are handed out oldest first, so traffic
    keeps all of them warm, the spare too. Reads aiohttp's pool state (``_conns``, ``_acquired``):
    aiohttp's version is pinned by the lock file, and the unit test of the spare fails if they change."""

    _opening: asyncio.Task[None] | None = None

    async def connect(self, req: aiohttp.ClientRequest, traces: list[Any],
                      timeout: aiohttp.ClientTimeout) -> aiohttp.connector.Connection:
        connection = await super().connect(req, traces, timeout)
        if self._opening is None and self._wants_spare(req):
            self._opening = asyncio.get_running_loop().create_task(self._open_spare(req, timeout))
        return connection

    def _wants_spare(self, req: aiohttp.ClientRequest) -> bool:
        """No idle connection left for ``req``'s server, and room for one more (never a wait for one).
        An aiohttp without these attributes gets no spare (requests go on as aiohttp's own pool serves them)."""
        idle, acquired = getattr(self, "_conns", None), getattr(self, "_acquired", None)
        if idle is None or acquired is None:
            return False
        return not idle.get(req.connection_key) and 0 < len(acquired) < self.limit

    async def _open_spare(self, req: aiohttp.ClientRequest, timeout: aiohttp.ClientTimeout) -> None:
        try:
            if self._wants_spare(req):  # still so: nothing ran since, so this opens a new connection
                spare = await super().connect(req, [], timeout)
                metrics.API_CONNECTIONS.inc()
                spare.release()  # into the pool, idle
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass  # the next request opens one itself, and says what fails
        finally:
            self._opening = None

    async def close(self, *, abort_ssl: bool = False) -> None:
        if self._opening is not None:
            self._opening.cancel()  # no spare opened after the pool is closed
        await super().close(abort_ssl=abort_ssl)


def counted() -> aiohttp.TraceConfig:
    """A session's trace that counts each connection a request opens in ``kopf_operators_api_connections``
    (the spares are counted where they are opened)."""
    async def opened(*_: Any) -> None:
        metrics.API_CONNECTIONS.inc()

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(opened)
    return trace
