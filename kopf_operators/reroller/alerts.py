"""Re-roller: alerts on reload (Slack, Microsoft Teams, Google Chat, a raw JSON webhook).

Reloader's alerting (``ALERT_SINK``, ``ALERT_WEBHOOK_URL``, ``ALERT_ADDITIONAL_INFO``), as
``REROLLER_ALERT_*`` options. The URL comes from a Secret (the chart maps it into
``REROLLER_ALERT_WEBHOOK_URL`` with ``valueFrom.secretKeyRef``); it is never logged: failures name the
sink and the HTTP status or the error's class only.

Off the hot path: ``notify`` only queues the alert (a bounded queue: when the sink is slow and the
queue is full, the alert is dropped and counted); one background task sends them, each with a
total deadline and a single attempt, through ``core.http`` (on the event loop, a connection pool of
the alerts' own: no thread, nothing shared with Blackadder's checks). A failing sink never blocks,
delays or repeats a rollout. A URL with credentials (``user:password@``) is refused at start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from kopf_operators.core import metrics
from kopf_operators.core.conventions import env_bool
from kopf_operators.core.http import HttpClient, credentials_refusal, failure

OPERATOR = "reroller"
SINKS = ("slack", "teams", "gchat", "webhook")
QUEUE_SIZE = 1000
logger = logging.getLogger("kopf_operators.reroller")


@dataclasses.dataclass(frozen=True)
class Alert:
    """One reload (or, in notify-only mode, one change that would have reloaded)."""

    kind: str
    namespace: str
    name: str
    sources: tuple[str, ...]   # "configmap/x", "secret/y": the sources whose data changed
    action: str                # "rolled" | "notified" (notify-only: nothing was rolled)
    message: str               # the Event's text

    def text(self, additional_info: str = "") -> str:
        text = f"{self.message} (namespace {self.namespace})"
        return f"{additional_info} : {text}" if additional_info else text


def payload(sink: str, alert: Alert, additional_info: str = "") -> dict[str, Any]:
    """The body each sink expects: Slack's attachments, Teams' and Google Chat's text, or our own
    JSON for a raw webhook."""
    text = alert.text(additional_info)
    if sink == "slack":
        return {"attachments": [{"text": text, "color": "good", "author_name": "re-roller"}]}
    if sink in ("teams", "gchat"):
        return {"text": text}
    body: dict[str, Any] = {"kind": alert.kind, "namespace": alert.namespace, "name": alert.name,
                            "sources": list(alert.sources), "action": alert.action, "message": text}
    if additional_info:
        body["additionalInfo"] = additional_info
    return body


@dataclasses.dataclass(frozen=True)
class AlertSettings:
    sink: str = ""                  # "" : no alerts
    url: str = dataclasses.field(default="", repr=False)  # a credential: never in a repr or a log line
    additional_info: str = ""       # prefixed to each message (a cluster name, say)
    notify_only: bool = False       # alert, and do not roll
    timeout_seconds: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AlertSettings:
        sink = env.get("REROLLER_ALERT_SINK", "").strip().lower()
        url = env.get("REROLLER_ALERT_WEBHOOK_URL", "").strip()
        if sink and sink not in SINKS:
            raise ValueError(f"REROLLER_ALERT_SINK: {sink!r} is not one of {', '.join(SINKS)}")
        if sink and not url.startswith(("http://", "https://")):
            raise ValueError("REROLLER_ALERT_SINK is set but REROLLER_ALERT_WEBHOOK_URL is not an http(s) URL "
                             "(set it from a Secret)")
        credentials = credentials_refusal(url, "REROLLER_ALERT_WEBHOOK_URL") if sink else None
        if credentials:
            raise ValueError(credentials)
        notify_only = env_bool(env, "REROLLER_NOTIFY_ONLY")
        if notify_only and not sink:
            raise ValueError("REROLLER_NOTIFY_ONLY=true needs REROLLER_ALERT_SINK: it would do nothing at all")
        try:
            timeout = float(env.get("REROLLER_ALERT_TIMEOUT_SECONDS", "") or 5.0)
        except ValueError:
            raise ValueError("REROLLER_ALERT_TIMEOUT_SECONDS: not a number") from None
        return cls(sink=sink, url=url, additional_info=env.get("REROLLER_ALERT_ADDITIONAL_INFO", "").strip(),
                   notify_only=notify_only, timeout_seconds=max(0.1, timeout))


class Alerts:
    """The sender: a bounded queue drained by one background task."""

    def __init__(self, settings: AlertSettings, http: HttpClient | None = None) -> None:
        self.settings = settings
        # A redirect is refused, as Reloader does (a token URL redirected elsewhere is a misconfiguration):
        # core.http follows none, and a 3xx is a refusal.
        self.http = http if http is not None else HttpClient("reroller-alerts", connections=4)
        self._queue: asyncio.Queue[Alert] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.settings.sink)

    def start(self) -> None:
        if self.enabled:
            self._queue = asyncio.Queue(QUEUE_SIZE)
            self._task = asyncio.create_task(self._run(), name="reroller alerts")

    def notify(self, alert: Alert) -> None:
        """Queue an alert; never waits."""
        if self._queue is None:
            return
        try:
            self._queue.put_nowait(alert)
        except asyncio.QueueFull:
            metrics.error(OPERATOR, "alert-dropped")

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            alert = await self._queue.get()
            await self._send(alert)

    async def _send(self, alert: Alert) -> None:
        sink = self.settings.sink
        body = json.dumps(payload(sink, alert, self.settings.additional_info)).encode()
        where = f"{alert.kind} {alert.namespace}/{alert.name}"
        timeout = self.settings.timeout_seconds
        try:
            status = (await self.http.request("POST", self.settings.url, timeout, body=body)).status
        except Exception as exc:  # the boundary: the exception's text may carry the URL, only its class is logged
            metrics.error(OPERATOR, "alert")
            logger.warning(f"{where}: the {sink} alert failed: {failure(exc)}")
            return
        if status >= 300:
            metrics.error(OPERATOR, "alert")
            logger.warning(f"{where}: the {sink} alert was refused: HTTP {status}")
            return
        metrics.action(OPERATOR, "alert")
        logger.debug(f"{where}: {sink} alert sent")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.http.close()
