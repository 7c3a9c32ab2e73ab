"""The connections of the access layer (``core.access``) to the API server, made from the kubernetes
client's configuration (kubeconfig or in-cluster): its CA, client certificate, TLS server name, proxy
and the credentials it refreshes.

Requests run on the event loop: no thread per request, and the TLS of the pool's kept-alive connections,
one spare (``pools.SparePool``). The narrow watches have a pool of their own, so that none ever holds a
connection a write needs.
"""

from __future__ import annotations

import ssl
import time
from typing import Any

import aiohttp
import kubernetes

from kopf_operators.core.pools import KEEPALIVE_SECONDS, SparePool, counted

# A request whose answer stalls this long is retried (time waiting for a pooled connection is not counted).
REQUEST_TIMEOUT_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 10.0
# The client's credentials are asked for again this often (and after a 401).
CREDENTIALS_SECONDS = 10.0


class Connection:
    """One process's pools to the API server (created in the event loop, on first use)."""

    def __init__(self, client: kubernetes.client.ApiClient, connections: int, watch_connections: int) -> None:
        self.client = client  # its configuration: the server, TLS files, and credentials it refreshes
        self.connections, self.watch_connections = connections, watch_connections
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None  # the narrow watches' own pool
        self._credentials_cache: tuple[float, dict[str, str]] | None = None  # (until, headers)

    @property
    def host(self) -> str:
        return str(self.client.configuration.host)

    def session(self, *, watches: bool = False) -> aiohttp.ClientSession:
        """The pool of requests (``connections`` kept-alive connections, one spare), or with ``watches``
        the narrow watches' own pool (``watch_connections``)."""
        if watches:
            if self._watch_session is None:
                self._watch_session = self._new_session(aiohttp.TCPConnector, self.watch_connections)
            return self._watch_session
        if self._session is None:
            self._session = self._new_session(SparePool, self.connections)
        return self._session

    def _new_session(self, pool: type[aiohttp.TCPConnector], connections: int) -> aiohttp.ClientSession:
        cfg = self.client.configuration
        context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if not cfg.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif cfg.assert_hostname is False:
            context.check_hostname = False
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
        connector = pool(ssl=context, limit=connections, keepalive_timeout=KEEPALIVE_SECONDS)
        return aiohttp.ClientSession(
            connector=connector, trace_configs=[counted()],
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS,
                                          sock_read=REQUEST_TIMEOUT_SECONDS))

    def proxy(self, url: str) -> dict[str, Any]:
        """The request options for ``url``: the TLS server name, and the proxy unless ``no_proxy`` exempts it."""
        cfg = self.client.configuration
        options: dict[str, Any] = {}
        if cfg.tls_server_name:
            options["server_hostname"] = cfg.tls_server_name
        if cfg.proxy and not (cfg.no_proxy and kubernetes.client.rest.should_bypass_proxies(url, cfg.no_proxy)):
            options["proxy"] = cfg.proxy
            if cfg.proxy_headers:
                options["proxy_headers"] = cfg.proxy_headers
        return options

    def credentials(self) -> dict[str, str]:
        """The headers the kubernetes client would send (its bearer token, its User-Agent), asked of it
        at most every CREDENTIALS_SECONDS: its refresh hook re-reads a rotated token file or renews
        an expired exec/OIDC token, and re-applied the whole kubeconfig on every request."""
        now = time.monotonic()
        if self._credentials_cache is None or now >= self._credentials_cache[0]:
            headers = dict(self.client.default_headers)
            self.client.update_params_for_auth(headers, [], ["BearerToken"], "", "", None)
            self._credentials_cache = (now + CREDENTIALS_SECONDS, headers)
        return self._credentials_cache[1]

    def refused_credentials(self) -> None:
        """A 401: revoked or expired early, so the client is asked again next time."""
        self._credentials_cache = None

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()
        self._session = self._watch_session = None
