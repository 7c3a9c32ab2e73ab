"""The shared access layer's pure parts: paths, the error model, Kopf's view of errors, quiet logs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kopf
import kubernetes
import prometheus_client
import pytest
from aiohttp import web

from kopf_operators.core import access, api, connection
from kopf_operators.core.process import QuietBookkeeping


def test_paths_of_core_group_and_namespaced_resources() -> None:
    assert api.POD.path("ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert api.NAMESPACE.path("ignored", "n") == "/api/v1/namespaces/n"
    assert api.DEPLOYMENT.path("ns", "d", "scale") == "/apis/apps/v1/namespaces/ns/deployments/d/scale"
    assert api.CONFIGMAP.path() == "/api/v1/configmaps"
    assert api.Kind("flant.com/v1", "copyrators", "CopyratorRule").path("a") == \
        "/apis/flant.com/v1/namespaces/a/copyrators"


@pytest.mark.parametrize(("status", "transient"), [(None, True), (429, True), (500, True), (503, True),
                                                   (403, False), (404, False), (409, False), (422, False)])
def test_transient_errors_are_the_ones_worth_retrying(status: int | None, transient: bool) -> None:
    assert api.ApiError(status, "x").transient is transient


def test_kopf_view_of_errors_retries_transient_ones_and_gives_up_on_refusals() -> None:
    retry = api.ApiError(503, "Service Unavailable").for_kopf("writing", delay=7)
    assert isinstance(retry, kopf.TemporaryError) and retry.delay == 7
    refused = api.ApiError(422, "Unprocessable Entity", "spec.x: Invalid value").for_kopf("writing")
    assert isinstance(refused, kopf.PermanentError)
    # The server's message may name field values: it never reaches the error text that Kopf logs.
    assert "Invalid value" not in str(refused)


def test_error_text_never_carries_the_response_body() -> None:
    error = api.response_error(422, "Unprocessable Entity", b'{"message": "data.password: s3cr3t"}')
    assert "s3cr3t" not in str(error) and error.status == 422
    assert isinstance(api.response_error(409, "Conflict", None), api.Conflict)


def test_namespace_being_terminated_is_recognised() -> None:
    error = api.response_error(403, "Forbidden", b'{"message": "unable to create: namespace x is being terminated"}')
    assert error.namespace_terminating


def test_serialised_runs_one_holder_per_key_and_forgets_unused_keys() -> None:
    layer = access.Access(client=None)  # no request is made here
    order: list[str] = []

    async def hold(key: str, tag: str) -> None:
        async with layer.serialised(key):
            order.append(f"{tag}+")
            await asyncio.sleep(0.01)
            order.append(f"{tag}-")

    async def main() -> None:
        await asyncio.gather(hold("k", "a"), hold("k", "b"), hold("other", "c"))

    asyncio.run(main())
    assert order.index("a-") < order.index("b+")  # same key: one after the other
    assert order.index("c+") < order.index("a-")  # another key: no waiting
    assert not layer._locks


def test_kopf_bookkeeping_lines_are_dropped_unless_verbose() -> None:
    quiet = QuietBookkeeping()
    root = logging.getLogger()
    saved = root.level

    def record(message: str, level: int = logging.INFO) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)

    try:
        root.setLevel(logging.INFO)
        assert not quiet.filter(record("Handler 'copyrator-namespace-event' succeeded."))
        assert not quiet.filter(record("Creation is processed: 1 succeeded; 0 failed."))
        assert quiet.filter(record("Created pod x-immortalpod running nginx"))
        assert quiet.filter(record("Handler 'x' failed temporarily: boom", logging.ERROR))
        root.setLevel(logging.DEBUG)  # --verbose keeps the detail
        assert quiet.filter(record("Handler 'copyrator-namespace-event' succeeded."))
    finally:
        root.setLevel(saved)


def test_transient_failures_are_retried_a_few_times_and_refusals_never(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access, "BACKOFF_SECONDS", 0.001)
    layer = access.Access(client=None)  # no request is made here

    def attempts(*errors: api.ApiError) -> tuple[int, str]:
        made: list[int] = []

        async def attempt() -> str:
            made.append(1)
            if len(made) <= len(errors):
                raise errors[len(made) - 1]
            return "answer"

        try:
            outcome = asyncio.run(layer._retrying(attempt))
        except api.ApiError as exc:
            outcome = str(exc)
        return len(made), outcome

    unavailable, throttled = api.ApiError(503, "Service Unavailable"), api.ApiError(429, "Too Many Requests")
    assert attempts(unavailable, throttled) == (3, "answer")
    assert attempts(*[unavailable] * 10) == (access.RETRIES + 1, "HTTP 503 Service Unavailable")
    assert attempts(api.ApiError(403, "Forbidden")) == (1, "HTTP 403 Forbidden")


def test_requests_go_where_the_kubeconfig_says() -> None:
    """The TLS server name and the proxy of the configuration (kubeconfig or in-cluster) apply to the
    layer's own connections, and ``no_proxy`` exempts the server."""

    configuration = kubernetes.client.Configuration()
    configuration.host = "https://10.0.0.1:6443"
    layer = access.Access(kubernetes.client.ApiClient(configuration))
    url = "https://10.0.0.1:6443/api/v1/pods"
    assert layer.connection.proxy(url) == {}
    configuration.tls_server_name = "kubernetes.default.svc"
    configuration.proxy = "http://127.0.0.1:3128"
    assert layer.connection.proxy(url) == {"server_hostname": "kubernetes.default.svc", "proxy": "http://127.0.0.1:3128"}
    configuration.no_proxy = "10.0.0.0/8"
    assert layer.connection.proxy(url) == {"server_hostname": "kubernetes.default.svc"}


def test_credentials_are_asked_of_the_client_again_only_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rotated token (in-cluster: the kubelet rewrites the file) is picked up within
    CREDENTIALS_SECONDS; the kubeconfig is not re-applied on every request."""

    class Client:
        default_headers = {"User-Agent": "test"}
        asked = 0

        def update_params_for_auth(self, headers: dict[str, str], *_: object) -> None:
            Client.asked += 1
            headers["authorization"] = f"Bearer token-{Client.asked}"

    clock = [100.0]
    monkeypatch.setattr(connection.time, "monotonic", lambda: clock[0])
    layer = access.Access(Client())
    assert layer.connection.credentials() == {"User-Agent": "test", "authorization": "Bearer token-1"}
    clock[0] += connection.CREDENTIALS_SECONDS - 1
    assert layer.connection.credentials()["authorization"] == "Bearer token-1"
    clock[0] += 1
    assert layer.connection.credentials()["authorization"] == "Bearer token-2"
    assert Client.asked == 2


@contextlib.asynccontextmanager
async def local_api(app: web.Application) -> AsyncIterator[access.Access]:
    """An access layer whose API server is ``app``, served on 127.0.0.1 for the test."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    layer = access.Access(kubernetes.client.ApiClient(configuration))
    try:
        yield layer
    finally:
        await layer.close()
        await runner.cleanup()


def test_a_narrow_watch_streams_events_of_any_size_and_raises_on_an_error_event() -> None:
    """``watch`` against a local HTTP server: lines split across chunks and a line over aiohttp's 64 KiB
    line limit arrive whole; the query asks for the field selector, the version and bookmarks; an ERROR
    event (410: the version is too old) raises."""
    import json

    big = {"metadata": {"name": "x-immortalpod", "resourceVersion": "5", "annotations": {"a": "b" * 200_000}}}
    lines = [json.dumps({"type": "MODIFIED", "object": big}).encode(),
             json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}).encode(),
             json.dumps({"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}).encode()]
    queries: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        queries.append(dict(request.query))
        response = web.StreamResponse()
        await response.prepare(request)
        data = b"\n".join(lines) + b"\n"
        for start in range(0, len(data), 7000):  # many chunks, none at a line's end
            await response.write(data[start:start + 7000])
        return response

    async def scenario() -> tuple[list[tuple[str, str]], str]:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/ns1/pods", handler)
        seen: list[tuple[str, str]] = []
        async with local_api(app) as layer:
            try:
                async for event_type, obj in layer.watch(api.POD, "ns1", fields="metadata.name=x-immortalpod",
                                                         resource_version="3"):
                    seen.append((event_type, obj["metadata"]["resourceVersion"]))
            except api.ApiError as exc:
                error = str(exc)
        return seen, error

    seen, error = asyncio.run(scenario())
    assert seen == [("MODIFIED", "5"), ("BOOKMARK", "9")]
    assert "410" in error
    assert queries[0]["fieldSelector"] == "metadata.name=x-immortalpod" and queries[0]["resourceVersion"] == "3"
    assert queries[0]["watch"] == "true" and queries[0]["allowWatchBookmarks"] == "true"


def test_an_event_outside_kopfs_handlers_is_posted_by_the_access_layer_and_never_fails_its_caller() -> None:
    """A controller's own task (a resync started at startup) has no Kopf event queue: the access layer
    posts the Event itself; a refusal is logged, never the caller's failure."""
    posted: list[tuple[str, dict[str, Any]]] = []

    async def handler(request: web.Request) -> web.Response:
        posted.append((request.path, await request.json()))
        return web.json_response({}, status=201 if len(posted) == 1 else 403)

    async def scenario() -> None:
        app = web.Application()
        app.router.add_post("/api/v1/namespaces/{namespace}/events", handler)
        async with local_api(app) as layer:
            await post_both(layer)

    async def post_both(layer: access.Access) -> None:
        rule = {"apiVersion": "flant.com/v1", "kind": "CopyratorRule",
                "metadata": {"namespace": "ns", "name": "r", "uid": "u1"}}
        agent = {"apiVersion": "blackadder.io/v1beta1", "kind": "ChaosAgent", "metadata": {"name": "a", "uid": "u2"}}
        layer.event(rule, "Normal", "Synced", "all 2 copies in sync")
        layer.event(agent, "Warning", "CycleFailed", "refused")  # answered 403: logged, not raised
        await asyncio.gather(*layer._events_posting)

    asyncio.run(scenario())
    assert [path for path, _ in posted] == ["/api/v1/namespaces/ns/events", "/api/v1/namespaces/default/events"]
    event = posted[0][1]
    assert (event["type"], event["reason"], event["message"]) == ("Normal", "Synced", "all 2 copies in sync")
    assert event["involvedObject"] == {"apiVersion": "flant.com/v1", "kind": "CopyratorRule", "name": "r",
                                       "uid": "u1", "namespace": "ns"}


def test_a_request_beside_busy_connections_finds_a_spare_one_open() -> None:
    """While requests hold every open connection, the pool opens one more beside them (``SparePool``):
    the next request is sent on it at once, without a TLS handshake of its own (under load, hundreds of
    ms: the re-roller's write for a quiet namespace beside a flood's writes). Each is counted."""
    held, release = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        if request.match_info["name"] == "held":
            held.set()
            await release.wait()
        return web.json_response({"metadata": {"name": request.match_info["name"]}})

    def opened() -> float:
        return prometheus_client.REGISTRY.get_sample_value("kopf_operators_api_connections_total") or 0.0

    async def scenario() -> tuple[list[str], float]:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/ns/configmaps/{name}", handler)
        seen: list[str] = []  # how each request got its connection

        async def created(*_: Any) -> None:
            seen.append("opened")

        async def reused(*_: Any) -> None:
            seen.append("reused")

        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(created)
        trace.on_connection_reuseconn.append(reused)
        trace.freeze()
        before = opened()
        async with local_api(app) as layer:
            layer.connection.session().trace_configs.append(trace)
            first = asyncio.create_task(layer.read(api.CONFIGMAP, "ns", "held"))
            await held.wait()
            async with asyncio.timeout(5):
                while opened() < before + 2:  # its own connection, and the spare beside it
                    await asyncio.sleep(0.01)
            assert (await layer.read(api.CONFIGMAP, "ns", "other") or {})["metadata"]["name"] == "other"
            release.set()
            await first
        return seen, opened() - before

    seen, counted = asyncio.run(scenario())
    assert seen == ["opened", "reused"]
    assert counted >= 2


def test_a_standby_waits_until_it_acts_or_the_object_is_gone() -> None:
    """``until_acting_or_gone``: a paused layer looks at the object (reads only) until it is gone, or a
    new one has its name (False); a layer that acts meanwhile returns True at once."""
    answers = [200, 200, 404]

    async def handler(request: web.Request) -> web.Response:
        status = answers.pop(0)
        if status == 404:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        return web.json_response({"metadata": {"name": "a", "uid": "u1"}})

    async def scenario() -> tuple[bool, bool, list[int]]:
        app = web.Application()
        app.router.add_get("/apis/blackadder.io/v1beta1/chaosagents/{name}", handler)
        kind = api.Kind("blackadder.io/v1beta1", "chaosagents", "ChaosAgent", namespaced=False)
        async with local_api(app) as layer:
            layer.paused = True
            gone = await layer.until_acting_or_gone(kind, None, "a", "u1", every=0.01)
            layer.paused = True
            waiting = asyncio.create_task(layer.until_acting_or_gone(kind, None, "a", "u1", every=5))
            await asyncio.sleep(0.05)
            layer.paused = False
            acting = await asyncio.wait_for(waiting, 1)
        return gone, acting, answers

    gone, acting, left = asyncio.run(scenario())
    assert (gone, acting, left) == (False, True, [])
