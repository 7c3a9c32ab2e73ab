"""The one access layer: every API request the four operators make goes through ``Access``.

One result convention for every request: a method returns the object the server answered with, and
``None`` only ever means "that object is not there" (404); every other outcome is an ``ApiError``
subclass the caller can catch by name:

- ``read``: the object, or None when absent; ``list``: every object (start-up and periodic resync
  only, never per event); ``watch``: one narrow watch (a field selector on one name) on a connection
  of its own, for what Kopf's watches do not see; ``call``: a blocking call of another client
  (pykube-ng's listings) under the same retries, error model and metrics;
- ``create``: the created object; ``AlreadyExists`` when the name is taken (someone else's object, or
  ours not yet seen by the watch); ``dry_run`` validates and admits only;
- ``replace`` / ``patch`` / ``patch_status``: the new object, or None when gone; ``Conflict`` when the
  resourceVersion (optimistic concurrency) no longer matches;
- ``delete`` / ``evict``: True when done, False when absent (or the uid precondition no longer
  matches: a same-named successor is never removed, or a PodDisruptionBudget refused an eviction),
- ``event`` (a Kubernetes Event through Kopf's poster; its reason is looked up in the catalogues,
  ``core.catalogue``, and one missing there is logged as an error),
- one error model (``ApiError``) with its mapping onto Kopf's TemporaryError/PermanentError,
- ``serialised(key)``: per-object serialisation inside the process, in one place,
- ``paused``: while this replica does not hold the Lease (a standby: ``core.election``), every write but
  the Lease's and every Event is refused here (``Paused``), whichever loop or timer asks for it: a
  standby writes nothing but its attempts at the Lease; ``until_acting()`` waits for the Lease;
- ``keep_answer`` / ``defer_echo`` / ``echo``: a write whose answer the caller keeps as its newest state;
  the watch event that echoes it back (the same uid and resourceVersion) is then skipped, or processed
  only once the writes in flight are done (``process.governed``).

Beside it, one concept each: the kinds it addresses and its error model (``core.api``), its
connections and credentials (``core.connection``), the fence of a deposed holder's writes
(``core.fence``), the echoes of its own writes (``core.echoes``).

Requests are plain JSON dicts in and out (no generated models). Transient failures (connection
errors, 429, 5xx) are retried here with a capped exponential backoff plus jitter; what still fails
reaches the caller as ``ApiError``, whose text carries the HTTP status and reason only, never the
response body (it could echo a Secret's data).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Hashable, Mapping
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlencode

import aiohttp
import kopf
import kubernetes

from kopf_operators.core import catalogue, metrics
from kopf_operators.core.api import (
    CONFIGMAP,
    POD,
    AlreadyExists,
    ApiError,
    Conflict,
    Kind,
    Paused,
    from_pykube,
    is_client_error,
    response_error,
)
from kopf_operators.core.connection import CONNECT_TIMEOUT_SECONDS, Connection
from kopf_operators.core.echoes import ECHO_DEFER_SECONDS, Echo, Echoes
from kopf_operators.core.fence import Fence

logger = logging.getLogger("kopf_operators.access")
T = TypeVar("T")

# Transient failures are retried this many times in the layer (0.2 s, 0.4 s, 0.8 s, ±50 %).
RETRIES = 3
BACKOFF_SECONDS = 0.2
MAX_EVENT_MESSAGE = 1000
# A standby's handler of an object being deleted looks this often whether the holder has removed it.
STANDBY_LOOK_SECONDS = 2.0
# Requests in flight at once, on as many kept-alive connections; more wait for a free one.
POOL_CONNECTIONS = 16
# Narrow watches (``watch``) open at once, each holding a connection of its own pool (never one a write
# needs); the server ends each after WATCH_SECONDS, and a silent stream is given up 30 s after that.
WATCH_CONNECTIONS = 8
WATCH_SECONDS = 290


# The only writes of a standby: its attempts at the Lease.
_STANDBY_MAY_WRITE = "/apis/coordination.k8s.io/"
# A list's Accept for its objects' metadata only (``list(metadata_only=True)``).
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"



def own_connections(access: Access) -> Access:
    """Another access layer on ``access``'s client configuration and credentials, with connections of
    its own (the election's thread: ``core.election``)."""
    return Access(access.connection.client)


class Access:
    """The API client of all four operators (one per process, kept in Kopf's ``memo``)."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.connection = Connection(client, POOL_CONNECTIONS, WATCH_CONNECTIONS)
        # Set while this replica acts: always without leader election, else while it holds the Lease.
        self._acting = asyncio.Event()
        self._acting.set()
        self.fence = Fence()  # no write once its time has passed (the election's thread moves it on)
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._lock_users: collections.Counter[Hashable] = collections.Counter()
        self.echoes = Echoes()  # the answers kept, and the writes in flight
        self._events_posting: set[asyncio.Task[None]] = set()  # Events posted outside Kopf's handlers

    @classmethod
    def from_environment(cls) -> Access:
        """In-cluster credentials in a pod, else KUBECONFIG / the current context."""
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        return cls(kubernetes.client.ApiClient(kubernetes.client.Configuration.get_default_copy()))

    @property
    def paused(self) -> bool:
        """True while another replica acts (``core.election.Elector`` keeps it, and the ``fence``)."""
        return not self._acting.is_set() or self.fence.closed()

    @paused.setter
    def paused(self, value: bool) -> None:
        self._acting.clear() if value else self._acting.set()

    async def until_acting(self) -> None:
        """Return once this replica acts (at once when it does)."""
        await self._acting.wait()

    async def until_acting_or_gone(self, kind: Kind, namespace: str | None, name: str, uid: str,
                                   every: float = STANDBY_LOOK_SECONDS) -> bool:
        """For a standby's handler of an object being deleted (its finalizer is the holder's to remove):
        wait until this replica acts (True) or the object ``uid`` is gone (False), whichever is first.
        The holder removes it meanwhile; raising instead, Kopf would log an error and retry it."""
        while self.paused:
            try:
                await asyncio.wait_for(self._acting.wait(), every)
                continue  # acting now (unless the fence is closed: looked at again)
            except TimeoutError:
                pass
            found = await self.read(kind, namespace, name)  # a read: allowed on a standby
            if found is None or (found.get("metadata") or {}).get("uid") != uid:
                return False
        return True

    async def close(self) -> None:
        await self.connection.close()

    # --- the one request path -------------------------------------------------------------------

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``await attempt()`` with the layer's retries of transient failures; every failed attempt
        is counted in ``kopf_operators_api_errors``."""
        attempts = 0
        while True:
            try:
                return await attempt()
            except Paused:
                raise  # not a failure of the request: it was never sent
            except ApiError as exc:
                metrics.API_ERRORS.labels(status=str(exc.status or "unreachable")).inc()
                if not exc.transient or attempts >= RETRIES:
                    raise
            attempts += 1
            await asyncio.sleep(BACKOFF_SECONDS * (2 ** (attempts - 1)) * random.uniform(0.5, 1.5))

    async def call(self, blocking: Callable[[], T]) -> T:
        """A read through another client (Blackadder's listings with pykube-ng), in a worker thread
        under the same retries, error model (its exceptions become ``ApiError``) and metrics as
        every other request. Reads only: a write must go through this layer's own methods."""

        def attempt() -> T:
            try:
                return blocking()
            except ApiError:
                raise
            except Exception as exc:
                if is_client_error(exc):
                    raise from_pykube(exc) from None
                raise

        return await self._retrying(lambda: asyncio.to_thread(attempt))

    async def _once(self, method: str, url: str, body: Any, content_type: str,
                    accept: str = "application/json") -> dict[str, Any] | None:
        headers = {**self.connection.credentials(), "Accept": accept, "Content-Type": content_type}
        full_url = self.connection.host + url
        data = json.dumps(body).encode() if body is not None else None
        try:
            async with self.connection.session().request(method, full_url, headers=headers, data=data,
                                                         **self.connection.proxy(full_url)) as response:
                status, reason, raw = response.status, response.reason or "", await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(None, type(exc).__name__) from None
        if status == 401:
            self.connection.refused_credentials()
        if status == 404 and method == "GET":
            return None
        if not 200 <= status <= 299:
            raise response_error(status, reason, raw)
        return cast(dict[str, Any], json.loads(raw)) if raw else {}

    async def _request(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                       body: Any = None, content_type: str = "application/json",
                       accept: str = "application/json") -> dict[str, Any] | None:
        """One request with the layer's retries; the decoded body (None on a 404 of a GET)."""
        if (fenced := method != "GET" and not path.startswith(_STANDBY_MAY_WRITE)) and self.paused:
            raise Paused()
        url = path + ("?" + urlencode(query) if query else "")
        if method == "GET":
            return await self._retrying(lambda: self._once(method, url, body, content_type, accept))
        with self.echoes.writing():
            return await self._retrying(
                lambda: self.fence.send(fenced, lambda: self._once(method, url, body, content_type)))

    # --- reads ----------------------------------------------------------------------------------

    async def read(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        return await self._request("GET", kind.path(namespace, name))

    async def list(self, kind: Kind, namespace: str | None = None, *, labels: str = "",
                   fields: str = "", metadata_only: bool = False) -> list[dict[str, Any]]:
        """Every object (paged). For start-up and periodic resyncs only: never on an event's path.
        ``metadata_only``: the objects' metadata alone (the server's PartialObjectMetadataList), never
        their data: a list of ConfigMaps or Secrets that needs only names and annotations holds none
        of their bytes."""
        query: dict[str, str] = {"limit": "500"}
        if labels:
            query["labelSelector"] = labels
        if fields:
            query["fieldSelector"] = fields
        items: list[dict[str, Any]] = []
        while True:
            page = await self._request("GET", kind.path(namespace), query=query,
                                       accept=METADATA_ONLY if metadata_only else "application/json") or {}
            for item in page.get("items") or ():
                item.setdefault("apiVersion", kind.api_version)
                item.setdefault("kind", kind.kind)  # list items come without them
                items.append(item)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token

    async def watch(self, kind: Kind, namespace: str | None, *, fields: str, resource_version: str = ""
                    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """The events (type, object) of one watch from ``resource_version`` until the server ends it
        (after WATCH_SECONDS), bookmarks included (their object carries only the resourceVersion to
        resume from). For narrow watches only (``fields``, e.g. ``metadata.name=x``): what Kopf's
        watches do not see. No retries: an ERROR event (410, the version is too old) or a failed
        connection raises ``ApiError``, and the caller looks at the object afresh."""
        query = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS),
                 "fieldSelector": fields}
        if resource_version:
            query["resourceVersion"] = resource_version
        url = self.connection.host + kind.path(namespace) + "?" + urlencode(query)
        headers = {**self.connection.credentials(), "Accept": "application/json"}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=WATCH_SECONDS + 30)
        try:
            async with self.connection.session(watches=True).get(url, headers=headers, timeout=timeout,
                                                                 **self.connection.proxy(url)) as response:
                if response.status != 200:
                    raise response_error(response.status, response.reason or "", await response.read())
                pending = b""
                async for chunk in response.content.iter_any():  # lines of any length (a pod may be 1 MiB)
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            raise ApiError(obj.get("code"), str(obj.get("reason") or "Error"),
                                           str(obj.get("message") or "")[:500])
                        yield str(event.get("type")), obj
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(None, type(exc).__name__) from None

    async def honours_shard_selectors(self) -> bool:
        """Whether the API server filters by ``shardSelector`` (the ShardedListAndWatch feature gate).
        Without it the parameter is dropped silently and every shard would see, and act on, everything:
        a selector that matches (almost) nothing must then still return objects."""
        query = {"limit": "20", "shardSelector": "shardRange(object.metadata.uid, '0x0000000000000000', "
                                                 "'0x0000000000000001')"}
        try:
            page = await self._request("GET", CONFIGMAP.path(), query=query) or {}
        except ApiError as exc:
            if exc.status in (400, 422):  # an older server that rejects the parameter outright
                return False
            raise
        return not page.get("items")

    # --- writes ---------------------------------------------------------------------------------

    async def create(self, kind: Kind, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """The created object; ``AlreadyExists`` when an object with that name exists (409). ``dry_run``:
        the server validates and admits it as it would a real create (``dryRun=All``) and stores nothing."""
        namespace = (body.get("metadata") or {}).get("namespace")
        query = {"dryRun": "All"} if dry_run else None
        try:
            return await self._request("POST", kind.path(namespace), body=body, query=query) or {}
        except ApiError as exc:
            if exc.status == 409:
                raise AlreadyExists(exc.status, exc.reason, exc.message) from None
            raise

    async def replace(self, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """PUT with the body's resourceVersion: ``Conflict`` when it changed, None when gone."""
        meta = body["metadata"]
        return await self._write("PUT", kind.path(meta.get("namespace"), meta["name"]), body)

    async def patch(self, kind: Kind, namespace: str | None, name: str, patch: Any, *,
                    subresource: str | None = None, json_patch: bool = False) -> dict[str, Any] | None:
        """A merge patch (or a JSON patch): ``Conflict`` on a resourceVersion mismatch, None when gone.
        Put ``metadata.resourceVersion`` in a merge patch for optimistic concurrency."""
        content_type = "application/json-patch+json" if json_patch else "application/merge-patch+json"
        return await self._write("PATCH", kind.path(namespace, name, subresource), patch, content_type)

    async def patch_status(self, kind: Kind, namespace: str | None, name: str, status: Mapping[str, Any], *,
                           resource_version: str | None = None) -> dict[str, Any] | None:
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self.patch(kind, namespace, name, body, subresource="status")

    async def delete(self, kind: Kind, namespace: str | None, name: str, *, uid: str | None = None,
                     grace_seconds: int | None = None, propagation: str | None = None) -> bool:
        """True when deleted (or already being deleted); False when absent or when ``uid`` no longer
        matches (a successor with the same name is never touched)."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            options["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if propagation:
            options["propagationPolicy"] = propagation
        try:
            await self._request("DELETE", kind.path(namespace, name), body=options)
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def evict(self, namespace: str, name: str, *, grace_seconds: int | None = None,
                    uid: str | None = None) -> bool:
        """Delete a pod through the Eviction API (PodDisruptionBudgets apply): False when a budget
        refuses it (429) or the pod is gone (or ``uid`` no longer matches)."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        options: dict[str, Any] = {}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if options:
            body["deleteOptions"] = options
        try:
            await self._request("POST", POD.path(namespace, name, "eviction"), body=body)
        except ApiError as exc:
            if exc.status in (404, 409, 429):
                return False
            raise
        return True

    async def _write(self, method: str, path: str, body: Any,
                     content_type: str = "application/json") -> dict[str, Any] | None:
        try:
            return await self._request(method, path, body=body, content_type=content_type)
        except Conflict:
            raise
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    # --- events ---------------------------------------------------------------------------------

    def event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event on ``body``, posted in the background; dropped while paused. Never carries data values."""
        if self.paused:
            return
        catalogue.check_event(type_, reason)  # one not catalogued is logged, and posted all the same
        try:
            kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message[:MAX_EVENT_MESSAGE])
        except LookupError:  # Kopf's event queue is only in its handlers' tasks, not a controller's own
            task = asyncio.get_running_loop().create_task(
                post_event(self._write, body, type_, reason, message[:MAX_EVENT_MESSAGE]))
            self._events_posting.add(task)
            task.add_done_callback(self._events_posting.discard)

    # --- echoes of our own writes -----------------------------------------------------------------

    def keep_answer(self, answer: Mapping[str, Any]) -> None:
        """The caller keeps ``answer`` (a write's answer) as the object's newest state, and its
        handlers would do nothing with that same version: the watch's echo of it need not be
        processed, not even by the indexes. Only for resources without Kopf change handlers (those
        need every event), and whose indexes may lag behind the caller's own copy."""
        self.echoes.keep(answer, Echo.SKIP)

    def defer_echo(self, answer: Mapping[str, Any]) -> None:
        """The caller keeps ``answer`` until the indexes catch up, but they must see it (other readers
        use them): the watch's echo of it is processed once the writes in flight are done, at most
        ECHO_DEFER_SECONDS later. On one event loop, a burst of echoes (500 copies created) processed
        at once slowed the writes still to make by as much as it cost."""
        self.echoes.keep(answer, Echo.DEFER)

    def echo(self, event_type: str | None, body: Mapping[str, Any]) -> Echo | None:
        """What this watch event is to our writes (``Echoes.echo``)."""
        return self.echoes.echo(event_type, body)

    async def writes_done(self, timeout: float = ECHO_DEFER_SECONDS) -> None:
        """Return once no write of this process is in flight, or after ``timeout``."""
        await self.echoes.writes_done(timeout)

    # --- per-object serialisation ---------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serialised(self, key: Hashable) -> AsyncIterator[None]:
        """One holder per key at a time inside this process; the lock is dropped when unused."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._lock_users[key] += 1
        try:
            async with lock:
                yield
        finally:
            self._lock_users[key] -= 1
            if not self._lock_users[key]:
                del self._lock_users[key]
                self._locks.pop(key, None)


async def post_event(write: Callable[[str, str, Any], Awaitable[Any]], body: Mapping[str, Any], type_: str,
                     reason: str, message: str) -> None:
    """An Event on ``body`` posted with ``write`` (the access layer's), as Kopf's poster would: best effort,
    a refusal is logged, never raised."""
    meta = body.get("metadata") or {}
    # A cluster-scoped object's Events go to "default", where Kopf puts them too.
    namespace = meta.get("namespace") or "default"
    now = datetime.datetime.now(datetime.UTC).isoformat()
    event = {
        "metadata": {"namespace": namespace, "generateName": "kopf-event-"},
        "action": "Action?", "type": type_, "reason": reason, "message": message,
        "reportingComponent": "kopf", "reportingInstance": "dev", "source": {"component": "kopf"},
        "involvedObject": {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                           "name": meta.get("name"), "uid": meta.get("uid"), "namespace": namespace},
        "firstTimestamp": now, "lastTimestamp": now, "eventTime": now,
    }
    try:
        await write("POST", f"/api/v1/namespaces/{quote(namespace)}/events", event)
    except Exception as exc:  # an Event is best effort, as Kopf's: never the caller's failure
        logger.warning(f"Event {reason} on {namespace}/{meta.get('name')} not posted: {exc}")
