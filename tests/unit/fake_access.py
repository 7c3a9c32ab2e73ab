"""A fake of ``core.access.Access`` for controller unit tests: it records every call and answers from
a script (per method, a queue of results or exceptions; without one, a plausible default)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Mapping
from typing import Any, TypeVar

from kopf_operators.core import catalogue
from kopf_operators.core.api import AlreadyExists, ApiError, Kind
from kopf_operators.core.background import Background

T = TypeVar("T")


def conflict_on_create() -> AlreadyExists:
    return AlreadyExists(409, "Conflict", "already exists")


def server_error() -> ApiError:
    return ApiError(503, "Service Unavailable")


def in_flight(background: Background) -> asyncio.Event:
    """A task of ``background`` that runs until cancelled; the Event is set once it has finished."""
    finished = asyncio.Event()

    async def run() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            finished.set()

    background.spawn(run())
    return finished


class FakeAccess:
    def __init__(self) -> None:
        self.paused = False
        self.calls: list[tuple[Any, ...]] = []
        self.events: list[tuple[str, str]] = []  # (type, reason)
        self.script: dict[str, list[Any]] = {}
        # What ``watch`` streams: (type, object) events, an exception to raise, or None to end the stream;
        # a watch with nothing queued waits (a quiet, healthy watch).
        self.watch_events: asyncio.Queue[Any] | None = None

    async def until_acting(self) -> None:
        while self.paused:
            await asyncio.sleep(0.01)

    async def until_acting_or_gone(self, kind: Kind, namespace: str | None, name: str, uid: str) -> bool:
        while self.paused:
            found = await self.read(kind, namespace, name)
            if found is None or found["metadata"]["uid"] != uid:
                return False
            await asyncio.sleep(0.01)
        return True

    def answer(self, method: str, *results: Any) -> None:
        """Queue answers of ``method``: an exception instance is raised instead of returned; a
        callable is called with the default answer and its result returned."""
        self.script.setdefault(method, []).extend(results)

    def _next(self, method: str, default: Any) -> Any:
        queued = self.script.get(method)
        result = queued.pop(0) if queued else default
        if isinstance(result, BaseException):
            raise result
        if callable(result):
            return result(default)
        return result

    def made(self, method: str) -> list[tuple[Any, ...]]:
        return [call for call in self.calls if call[0] == method]

    # --- the methods the controllers call ----------------------------------------------------------

    async def read(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        self.calls.append(("read", kind.kind, namespace, name))
        return self._next("read", None)

    async def list(self, kind: Kind, namespace: str | None = None, **_: Any) -> list[dict[str, Any]]:
        self.calls.append(("list", kind.kind, namespace))
        return self._next("list", [])

    async def create(self, kind: Kind, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        meta = body["metadata"]
        self.calls.append(("create", kind.kind, meta.get("namespace"), meta["name"], dry_run))
        created = {**body, "metadata": {"uid": f"uid-{meta['name']}", "resourceVersion": "100", **meta}}
        return self._next("create", created)

    async def replace(self, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("replace", kind.kind, body["metadata"].get("namespace"), body["metadata"]["name"]))
        return self._next("replace", dict(body))

    async def patch(self, kind: Kind, namespace: str | None, name: str, patch: Any, **_: Any) -> dict[str, Any] | None:
        self.calls.append(("patch", kind.kind, namespace, name, patch))
        default = {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "101"}}
        return self._next("patch", default)

    async def patch_status(self, kind: Kind, namespace: str | None, name: str, status: Mapping[str, Any], *,
                           resource_version: str | None = None) -> dict[str, Any] | None:
        self.calls.append(("patch_status", kind.kind, namespace, name, dict(status)))
        default = {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                                "resourceVersion": str(int(resource_version or 0) + 1)}, "status": dict(status)}
        return self._next("patch_status", default)

    async def delete(self, kind: Kind, namespace: str | None, name: str, **options: Any) -> bool:
        self.calls.append(("delete", kind.kind, namespace, name))
        return self._next("delete", True)

    async def watch(self, kind: Kind, namespace: str | None, *, fields: str, resource_version: str = ""
                    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        self.calls.append(("watch", kind.kind, namespace, fields, resource_version))
        if self.watch_events is None:
            self.watch_events = asyncio.Queue()
        while True:
            event = await self.watch_events.get()
            if event is None:
                return
            if isinstance(event, BaseException):
                raise event
            yield event

    async def call(self, blocking: Callable[[], T]) -> T:
        self.calls.append(("call",))
        return blocking()

    def event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        problem = catalogue.event_problem(type_, reason)  # what the real one logs as an error fails a test
        assert problem is None, problem
        self.events.append((type_, reason))

    def keep_answer(self, answer: Mapping[str, Any]) -> None:
        pass  # only Kopf's event processing asks about it (tests/unit/test_process.py)

    def defer_echo(self, answer: Mapping[str, Any]) -> None:
        pass  # likewise

    @contextlib.asynccontextmanager
    async def serialised(self, key: Hashable) -> AsyncIterator[None]:
        yield
