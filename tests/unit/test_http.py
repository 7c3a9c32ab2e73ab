"""core.http: the outbound client of checks, webhooks and alerts, against a local aiohttp server: a total
deadline (a host trickling its answer is cut off), no redirects, a capped body, lanes that keep one
tenant's slow host from delaying another's requests, and URLs with credentials refused unseen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from kopf_operators.core.http import MAX_BODY_BYTES, HttpClient, credentials_refusal, failure


async def trickle(request: web.Request) -> web.StreamResponse:
    """One byte per second, for ever: every socket read succeeds, so only a total deadline ends it."""
    response = web.StreamResponse(status=200)
    await response.prepare(request)
    while True:
        await response.write(b".")
        await asyncio.sleep(1)


async def redirect(_: web.Request) -> web.Response:
    raise web.HTTPFound("/big")


async def big(_: web.Request) -> web.Response:
    return web.Response(body=b"x" * (MAX_BODY_BYTES + 4096))


async def ok(_: web.Request) -> web.Response:
    return web.Response(status=204)


async def serve(test: Callable[[str], Awaitable[None]]) -> None:
    app = web.Application()
    app.router.add_get("/slow", trickle)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/big", big)
    app.router.add_get("/ok", ok)
    app.router.add_post("/ok", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        await test(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


@pytest.fixture
def client() -> HttpClient:
    return HttpClient("test", connections=8, per_lane=2)


def test_a_trickling_host_is_cut_off_at_the_total_deadline(client: HttpClient) -> None:
    async def test(base: str) -> None:
        started = time.monotonic()
        with pytest.raises(TimeoutError) as caught:
            await client.request("GET", f"{base}/slow", 1.5)
        assert 1.4 < time.monotonic() - started < 3.0  # bytes kept coming: only the total deadline ends it
        assert failure(caught.value) == "TimeoutError"
        await client.close()

    asyncio.run(serve(test))


def test_no_redirect_is_followed_and_the_body_is_capped(client: HttpClient) -> None:
    async def test(base: str) -> None:
        assert (await client.request("GET", f"{base}/redirect", 5)).status == 302
        answer = await client.request("GET", f"{base}/big", 5)
        assert answer.status == 200 and len(answer.body) == MAX_BODY_BYTES
        assert (await client.request("POST", f"{base}/ok", 5, json={"a": 1})).status == 204
        await client.close()

    asyncio.run(serve(test))


def test_a_slow_lane_delays_only_its_own_requests() -> None:
    """Tenant A fills its lane with requests to a slow host; tenant B's request, and a request on another
    client (the administrators' pool), are answered at once."""
    tenants, admins = HttpClient("tenants", connections=8, per_lane=2), HttpClient("admins")

    async def test(base: str) -> None:
        slow = [asyncio.create_task(tenants.request("GET", f"{base}/slow", 5, lane="team-a")) for _ in range(4)]
        await asyncio.sleep(0.3)
        assert tenants.in_flight("team-a") == 2  # its lane is full: the other two wait their turn
        started = time.monotonic()
        assert (await tenants.request("GET", f"{base}/ok", 2, lane="team-b")).status == 204
        assert (await admins.request("GET", f"{base}/ok", 2)).status == 204
        assert time.monotonic() - started < 1.0
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        await tenants.close()
        await admins.close()

    asyncio.run(serve(test))


@pytest.mark.parametrize("url", ["http://user:TOKEN@hooks.example/x", "https://TOKEN@hooks.example:8443/x",
                                 "http://:TOKEN@hooks.example"])
def test_a_url_with_credentials_is_refused_without_showing_them(url: str) -> None:
    refusal = credentials_refusal(url, "webhook")
    assert refusal is not None and "credentials" in refusal
    assert "TOKEN" not in refusal and "hooks.example" not in refusal


@pytest.mark.parametrize("url", ["http://hooks.example/x?token=a@b", "https://hooks.example:8443/p@th", "http://h"])
def test_a_url_without_credentials_passes(url: str) -> None:
    assert credentials_refusal(url, "webhook") is None


def test_a_request_with_credentials_would_fail_without_echoing_them(client: HttpClient) -> None:
    """The second line: were such a URL ever sent, what is said of its failure is the exception's type."""
    async def test(_base: str) -> None:
        try:
            await client.request("GET", "http://user:TOKEN@[bad/x", 1)
        except Exception as exc:
            assert "TOKEN" not in failure(exc)
        await client.close()

    asyncio.run(serve(test))
