"""Blackadder's steady-state probes: what a check asks (the judgement is ``steady``'s, pure).

- workload: one read of the Deployment, StatefulSet, DaemonSet or ImmortalContainer (through the
  access layer); a TenantChaosAgent's checks are confined to its own namespace (``steady``);
- http: one GET, straight to the host (no proxy, no redirects, a total deadline: ``core.http``), to an
  allowed host only (a TenantChaosAgent's: the tenants' own list), never with credentials in the URL;
  the URL may come from a Secret in the operator's namespace (then it is never logged, nor put in
  status or an Event: only scheme, host and port are). A tenant's requests go through the tenants'
  own connection pool, a few at a time per namespace: a slow host delays that tenant only;
- prometheus: one instant query against the chart's Prometheus.

A check that cannot be evaluated (a missing Secret, a refused host, Prometheus unreachable) fails:
fail closed. The recovery of killed workloads is observed here too: one Pod listing per namespace.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from kopf_operators.blackadder import steady
from kopf_operators.core import api as k8s
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.http import HttpClient, failure

IMMORTALCONTAINER = k8s.Kind("immortalcontainer.flugel.it/v1alpha1", "immortalcontainers", "ImmortalContainer")
WORKLOADS = {"Deployment": k8s.DEPLOYMENT, "StatefulSet": k8s.STATEFULSET, "DaemonSet": k8s.DAEMONSET,
             "ImmortalContainer": IMMORTALCONTAINER}
PROMETHEUS_TIMEOUT_SECONDS = 5.0


class Probes:
    """The checks of one controller's agents. ``secrets_namespace``: where HTTP checks' Secrets are
    (the operator's namespace, as webhooks'); ``tenant``: no Secrets, no Prometheus, the tenants' hosts
    (``check_hosts`` is then CHAOS_TENANT_HTTP_HOSTS), each request in its namespace's lane of ``http``
    and at most ``max_timeout`` seconds."""

    def __init__(self, access: Access, check_hosts: Sequence[str], prometheus_url: str, secrets_namespace: str,
                 tenant: bool = False, http: HttpClient | None = None, max_timeout: float | None = None) -> None:
        self.access, self.check_hosts, self.prometheus_url = access, tuple(check_hosts), prometheus_url
        self.secrets_namespace, self.tenant = secrets_namespace, tenant
        self.http = http if http is not None else HttpClient("blackadder-checks")
        self.max_timeout = max_timeout
        self.hosts_setting = "CHAOS_TENANT_HTTP_HOSTS" if tenant else "CHAOS_CHECK_HOSTS"

    async def evaluate(self, check: steady.Check, default_namespace: str = "") -> tuple[bool, str]:
        """(passed, answer). Never raises for a check's own failure: that is a failed check.
        ``default_namespace``: the agent's (a TenantChaosAgent's lane of requests too)."""
        try:
            if check.kind == "workload":
                return await self._workload(check.spec, default_namespace)
            if check.kind == "http":
                return await self._http(check.spec, default_namespace)
            if check.kind == "prometheus":
                return await self._prometheus(check.spec)
        except ApiError as exc:
            return False, f"could not evaluate: HTTP {exc.status} {exc.reason}"
        except Exception as exc:  # the boundary: whatever a check raises fails it, and says its type only
            return False, f"could not evaluate: {failure(exc)}"
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

    async def _http(self, spec: Mapping[str, Any], namespace: str) -> tuple[bool, str]:
        url, refusal = await self._url(spec)
        if refusal:
            return False, f"could not evaluate: {refusal}"
        refused = steady.url_refusal(url, self.check_hosts, hosts_setting=self.hosts_setting)
        if refused:
            return False, f"could not evaluate: {refused}"
        timeout = float(spec.get("timeoutSeconds") or steady.DEFAULT_HTTP_TIMEOUT_SECONDS)
        if self.max_timeout is not None:
            timeout = min(timeout, self.max_timeout)
        try:
            answer = await self.http.request("GET", url, timeout, lane=namespace if self.tenant else "")
        except Exception as exc:  # its text may carry the URL: the type and the safe URL only
            return steady.http_answer(None, f"{failure(exc)} from {steady.safe_url(url)}")
        return steady.http_answer(answer.status)

    async def _prometheus(self, spec: Mapping[str, Any]) -> tuple[bool, str]:
        if self.tenant:
            return False, "could not evaluate: prometheus checks are not available to TenantChaosAgents"
        if not self.prometheus_url:
            return False, "could not evaluate: no Prometheus configured (CHAOS_PROMETHEUS_URL)"
        query = urllib.parse.urlencode({"query": str(spec.get("query") or "")})
        url = f"{self.prometheus_url.rstrip('/')}/api/v1/query?{query}"
        try:
            answer = await self.http.request("GET", url, PROMETHEUS_TIMEOUT_SECONDS)
        except Exception as exc:
            return False, f"could not evaluate: Prometheus unreachable ({failure(exc)})"
        try:
            payload = json.loads(answer.body or b"{}")
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        if answer.status != 200 and not payload:
            return False, f"could not evaluate: Prometheus answered HTTP {answer.status}"
        return steady.prometheus_answer(payload, str(spec.get("op") or "<"), float(spec.get("threshold") or 0))

    async def pods(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's Pods, to follow killed workloads until they recover."""
        return list(await self.access.list(k8s.POD, namespace))
