"""Blackadder's steady-state probes: what a check asks (the judgement is ``steady``'s, pure).

- workload: one read of the Deployment, StatefulSet, DaemonSet or ImmortalContainer (through the
  access layer); a TenantChaosAgent's checks are confined to its own namespace (``steady``);
- http: one GET, straight to the host (no proxy, no redirects), to an allowed host only; the URL
  may come from a Secret in the operator's namespace (then it is never logged, nor put in status or
  an Event: only scheme, host and path are);
- prometheus: one instant query against the chart's Prometheus.

A check that cannot be evaluated (a missing Secret, a refused host, Prometheus unreachable) fails:
fail closed. The recovery of killed workloads is observed here too: one Pod listing per namespace.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from kopf_operators.blackadder import steady
from kopf_operators.blackadder.notify import _NoRedirects
from kopf_operators.core import access as k8s
from kopf_operators.core.access import Access, ApiError

IMMORTALCONTAINER = k8s.Kind("immortalcontainer.flugel.it/v1alpha1", "immortalcontainers", "ImmortalContainer")
WORKLOADS = {"Deployment": k8s.DEPLOYMENT, "StatefulSet": k8s.STATEFULSET, "DaemonSet": k8s.DAEMONSET,
             "ImmortalContainer": IMMORTALCONTAINER}
PROMETHEUS_TIMEOUT_SECONDS = 5.0

_OPENER = urllib.request.build_opener(_NoRedirects(), urllib.request.ProxyHandler({}))


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    """Blocking GET (in a thread): the status and the body (at most 1 MiB)."""
    try:
        with _OPENER.open(urllib.request.Request(url, method="GET"), timeout=timeout) as response:
            return int(response.status), response.read(1 << 20)
    except urllib.error.HTTPError as exc:  # a 4xx/5xx (and a refused redirect) is an answer
        return int(exc.code), b""


class Probes:
    """The checks of one controller's agents. ``secrets_namespace``: where HTTP checks' Secrets are
    (the operator's namespace, as webhooks'); ``tenant``: no Secrets, no Prometheus."""

    def __init__(self, access: Access, check_hosts: Sequence[str], prometheus_url: str, secrets_namespace: str,
                 tenant: bool = False) -> None:
        self.access, self.check_hosts, self.prometheus_url = access, tuple(check_hosts), prometheus_url
        self.secrets_namespace, self.tenant = secrets_namespace, tenant

    async def evaluate(self, check: steady.Check, default_namespace: str = "") -> tuple[bool, str]:
        """(passed, answer). Never raises for a check's own failure: that is a failed check."""
        try:
            if check.kind == "workload":
                return await self._workload(check.spec, default_namespace)
            if check.kind == "http":
                return await self._http(check.spec)
            if check.kind == "prometheus":
                return await self._prometheus(check.spec)
        except ApiError as exc:
            return False, f"could not evaluate: HTTP {exc.status} {exc.reason}"
        return False, f"unknown check type {check.kind!r}"

    async def _workload(self, spec: Mapping[str, Any], default_namespace: str) -> tuple[bool, str]:
        kind = str(spec.get("kind") or "Deployment")
        if kind not in WORKLOADS:
            return False, f"unsupported kind {kind}"
        namespace = str(spec.get("namespace") or default_namespace)
        if not namespace:
            return False, "no namespace"
        obj = await self.access.read(WORKLOADS[kind], namespace, str(spec.get("name") or ""))
        return steady.workload_answer(kind, obj, spec.get("minAvailable"))

    async def _url(self, spec: Mapping[str, Any]) -> tuple[str, str]:
        """(url, refusal). The Secret's URL is never shown."""
        if spec.get("url"):
            return str(spec["url"]), ""
        secret = str((spec.get("secretRef") or {}).get("name") or "")
        if not secret or self.tenant:
            return "", "no url (a TenantChaosAgent's check names its url; no Secret is read)"
        where = f"{self.secrets_namespace}/{secret}"
        obj = await self.access.read(k8s.SECRET, self.secrets_namespace, secret)
        encoded = ((obj or {}).get("data") or {}).get(steady.URL_SECRET_KEY)
        try:
            url = base64.b64decode(encoded).decode().strip() if encoded else ""
        except ValueError:
            url = ""
        if not url:
            return "", f"Secret {where} " + (f"has no key {steady.URL_SECRET_KEY!r}" if obj else "does not exist")
        return url, ""

    async def _http(self, spec: Mapping[str, Any]) -> tuple[bool, str]:
        url, refusal = await self._url(spec)
        if refusal:
            return False, f"could not evaluate: {refusal}"
        refused = steady.url_refusal(url, self.check_hosts)
        if refused:
            return False, f"could not evaluate: {refused}"
        timeout = float(spec.get("timeoutSeconds") or steady.DEFAULT_HTTP_TIMEOUT_SECONDS)
        try:
            status, _body = await asyncio.to_thread(_get, url, timeout)
        except (OSError, ValueError) as exc:
            return steady.http_answer(None, f"{type(exc).__name__} from {steady.safe_url(url)}")
        return steady.http_answer(status)

    async def _prometheus(self, spec: Mapping[str, Any]) -> tuple[bool, str]:
        if self.tenant:
            return False, "could not evaluate: prometheus checks are not available to TenantChaosAgents"
        if not self.prometheus_url:
            return False, "could not evaluate: no Prometheus configured (CHAOS_PROMETHEUS_URL)"
        query = urllib.parse.urlencode({"query": str(spec.get("query") or "")})
        url = f"{self.prometheus_url.rstrip('/')}/api/v1/query?{query}"
        try:
            status, body = await asyncio.to_thread(_get, url, PROMETHEUS_TIMEOUT_SECONDS)
            payload = json.loads(body or b"{}")
        except (OSError, ValueError) as exc:
            return False, f"could not evaluate: Prometheus unreachable ({type(exc).__name__})"
        if status != 200 and not payload:
            return False, f"could not evaluate: Prometheus answered HTTP {status}"
        return steady.prometheus_answer(payload, str(spec.get("op") or "<"), float(spec.get("threshold") or 0))

    async def pods(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's Pods, to follow killed workloads until they recover."""
        return list(await self.access.list(k8s.POD, namespace))
