"""Outbound HTTP to hosts other than the API server: Blackadder's steady-state checks and webhooks, the
re-roller's alerts. One small client, on the event loop (aiohttp), so that a slow host holds no thread.

Every request:
- has a *total* deadline (``aiohttp.ClientTimeout(total=...)``): a host that trickles its answer a byte
  at a time is cut off at the deadline, where a per-socket-operation timeout (urllib's) never fires;
- follows no redirect (a 3xx is the answer: a redirect could lead past the allowed hosts), takes no
  proxy from the environment (``trust_env=False``), verifies TLS with the system's CAs;
- reads at most ``MAX_BODY_BYTES`` of the answer.

Each ``HttpClient`` has a connection pool of its own, so that users of the process do not share one:
administrators' checks and webhooks, tenants' checks and the re-roller's alerts each get their own.
``lanes`` bounds the requests in flight per lane (a TenantChaosAgent's namespace): a tenant whose host
is slow waits for its own requests only.

URLs with credentials (``user:password@``) are refused where a URL is accepted (``credentials_refusal``):
they leak into exceptions, logs and Events, and aiohttp would send them as Basic auth. Callers catch
every exception of a request and report its type's name only (``failure``): an exception's text may
carry the URL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.parse
from collections.abc import Mapping
from typing import Any

import aiohttp

MAX_BODY_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    body: bytes = b""


def credentials_refusal(url: str, what: str) -> str | None:
    """Why ``url`` may not be used because it carries a user or password (``user@``, ``user:pw@``);
    the message never shows either (nor the rest of the URL)."""
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        return f"the {what} URL cannot be read"
    if "@" in parsed.netloc:
        return (f"the {what} URL carries credentials (user@ or user:password@ before the host), which are "
                "refused: they would show in errors; put a token in the URL's path or query instead")
    return None


def failure(exc: BaseException) -> str:
    """What may be said about a failed request: its exception's type only (its text may hold the URL)."""
    return "TimeoutError" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__


async def _capped(stream: aiohttp.StreamReader) -> bytes:
    """The body, up to MAX_BODY_BYTES (the rest is not read: the connection is then closed)."""
    chunks: list[bytes] = []
    size = 0
    while size < MAX_BODY_BYTES:
        chunk = await stream.read(MAX_BODY_BYTES - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class HttpClient:
    """One connection pool (``connections`` at most) for one kind of traffic; ``per_lane`` requests at
    most in flight per lane (0: no per-lane bound). The session is made on first use (on the loop)."""

    def __init__(self, name: str, connections: int = 32, per_lane: int = 0) -> None:
        self.name, self.connections, self.per_lane = name, connections, per_lane
        self._session: aiohttp.ClientSession | None = None
        self._lanes: dict[str, asyncio.Semaphore] = {}
        self._sending: dict[str, int] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                                  headers={"User-Agent": f"kopf-operators/{self.name}"})
        return self._session

    def lane(self, key: str) -> asyncio.Semaphore | None:
        if not self.per_lane:
            return None
        if key not in self._lanes:
            self._lanes[key] = asyncio.Semaphore(self.per_lane)
        return self._lanes[key]

    def in_flight(self, key: str) -> int:
        """Requests of the lane ``key`` holding one of its places now."""
        return self._sending.get(key, 0)

    async def request(self, method: str, url: str, timeout: float, *, json: Mapping[str, Any] | None = None,
                      body: bytes | None = None, lane: str = "") -> Answer:
        """One request; the answer's status and (at most MAX_BODY_BYTES of) its body. The deadline
        covers the wait for the lane, the connection and the whole answer. Raises what aiohttp
        raises (``aiohttp.ClientError``, ``TimeoutError``, ``ValueError`` for an unusable URL)."""
        async with asyncio.timeout(timeout):
            semaphore = self.lane(lane) if lane else None
            if semaphore is None:
                return await self._send(method, url, timeout, json, body)
            async with semaphore:
                self._sending[lane] = self._sending.get(lane, 0) + 1
                try:
                    return await self._send(method, url, timeout, json, body)
                finally:
                    self._sending[lane] -= 1

    async def _send(self, method: str, url: str, timeout: float, json: Mapping[str, Any] | None,
                    body: bytes | None) -> Answer:
        headers = {"Content-Type": "application/json"} if body is not None else None
        async with self._open().request(method, url, json=json, data=body, headers=headers, allow_redirects=False,
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            return Answer(response.status, await _capped(response.content))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
