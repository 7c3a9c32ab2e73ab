"""A minimal asyncio Kubernetes client (aiohttp): requests and watches, nothing else.

Used by the benchmark harness and by the floor clients (bench/floor.py): one keep-alive connection
pool, no object models, JSON in and out, so its own overhead stays far below the operators'.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml


class ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


def _ssl_context(cluster: dict[str, Any], user: dict[str, Any]) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    elif "certificate-authority" in cluster:
        ctx.load_verify_locations(cafile=cluster["certificate-authority"])
    if "client-certificate-data" in user:
        # ssl wants files for the client certificate: write them to a private temporary folder.
        folder = Path(tempfile.mkdtemp(prefix="bench-kube-"))
        cert, key = folder / "cert.pem", folder / "key.pem"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        os.chmod(key, 0o600)
        ctx.load_cert_chain(str(cert), str(key))
        cert.unlink()
        key.unlink()
        folder.rmdir()
    return ctx


class Kube:
    def __init__(self, kubeconfig: str | Path, limit: int = 64, impersonate: str = "") -> None:
        """``impersonate``: a user to act as (the kubeconfig's user must be allowed to impersonate)."""
        config = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self.server = cluster["server"].rstrip("/")
        self.headers = {"Accept": "application/json"}
        if "token" in user:
            self.headers["Authorization"] = f"Bearer {user['token']}"
        if impersonate:
            self.headers["Impersonate-User"] = impersonate
        self._ssl = _ssl_context(cluster, user)
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self._limit)
            self._session = aiohttp.ClientSession(connector=connector, headers=self.headers,
                                                  timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
                      content_type: str = "application/json", ok_missing: bool = False) -> Any:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(method, self.server + path, data=data, params=params,
                                        headers=headers, timeout=aiohttp.ClientTimeout(total=120)) as resp:
            text = await resp.text()
            if resp.status == 404 and ok_missing:
                return None
            if resp.status >= 400:
                raise ApiError(resp.status, text)
            return json.loads(text) if text else None

    async def get(self, path: str, **params: Any) -> Any:
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, body: Any) -> Any:
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def delete(self, path: str, body: Any = None, ok_missing: bool = True) -> Any:
        return await self.request("DELETE", path, body, ok_missing=ok_missing)

    async def stream(self, path: str, params: dict[str, Any] | None = None,
                     resource_version: str | None = None) -> AsyncIterator[tuple[str, dict[str, Any], float]]:
        """Watch events (type, object, monotonic arrival time), re-watching from the last
        resourceVersion when the server closes the stream; starts after a list when no RV is given."""
        rv = resource_version
        if rv is None:
            listing = await self.get(path, **(params or {}))
            rv = listing["metadata"]["resourceVersion"]
            for item in listing.get("items") or []:
                yield "ADDED", item, time.monotonic()
        while True:
            query = {**(params or {}), "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true",
                     "timeoutSeconds": "3600"}
            async with self.session.get(self.server + path, params=query,
                                        timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
                if resp.status >= 400:
                    raise ApiError(resp.status, await resp.text())
                async for line in resp.content:
                    now = time.monotonic()
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        if obj.get("code") == 410:  # expired: list again
                            listing = await self.get(path, **(params or {}))
                            rv = listing["metadata"]["resourceVersion"]
                            break
                        raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    yield event["type"], obj, now


# (type, object, arrival time) -> truthy when the awaited state is reached
Listener = Callable[..., Any]


class Watcher:
    """A background watch that hands each event to the waiters registered at that moment.

    ``expect(predicate)`` must be called *before* the write whose effect it waits for; the returned
    future resolves to the monotonic arrival time of the first event for which predicate is true.
    """

    def __init__(self, kube: Kube, path: str, params: dict[str, Any] | None = None) -> None:
        self.kube, self.path, self.params = kube, path, params
        self._waiters: list[tuple[Listener, asyncio.Future[float]]] = []
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self.listeners: list[Callable[..., Any]] = []

    async def start(self) -> Watcher:
        listing = await self.kube.get(self.path, **(self.params or {}))
        self._task = asyncio.create_task(self._run(listing["metadata"]["resourceVersion"]))
        return self

    async def _run(self, rv: str) -> None:
        async for type_, obj, now in self.kube.stream(self.path, self.params, resource_version=rv):
            for listener in self.listeners:
                listener(type_, obj, now)
            if not self._waiters:
                continue
            keep = []
            for predicate, fut in self._waiters:
                if fut.done():
                    continue
                try:
                    hit = predicate(type_, obj, now)
                except Exception as exc:  # a broken predicate fails its waiter, not the watch
                    fut.set_exception(exc)
                    continue
                if hit:
                    fut.set_result(now)
                else:
                    keep.append((predicate, fut))
            self._waiters = keep

    def expect(self, predicate: Listener) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, fut))
        return fut

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def name_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


async def bounded(concurrency: int, coros: list[Any]) -> list[Any]:
    """Run coroutines with at most ``concurrency`` in flight; results in order."""
    sem = asyncio.Semaphore(concurrency)

    async def one(coro: Any) -> Any:
        async with sem:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))
