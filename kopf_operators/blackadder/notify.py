"""Blackadder's notifications: what an agent says about what it does: Events (on the agent and on the
target) with their log line, the agent's status, and the webhook (one POST per action, in the
background).

The webhook's URL comes from a Secret in the operator's namespace, read when there is something to
send; it is never logged, put in an Event or in status (it carries a token). The POSTs go through
``core.http`` (on the event loop, a total deadline each, no redirects, no proxy).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import logging
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from kopf_operators.blackadder import decisions, settings
from kopf_operators.core import api as k8s
from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.api import ApiError
from kopf_operators.core.background import Background
from kopf_operators.core.conventions import stall_event
from kopf_operators.core.http import HttpClient, failure

OPERATOR = "blackadder"
WEBHOOK_TIMEOUT_SECONDS = 3.0
Logger = logging.Logger | logging.LoggerAdapter[Any]

logger = logging.getLogger("kopf_operators.blackadder")


class Notifications:
    """Events, status and webhooks of one controller's agents (``agent_id``: an agent's name in them)."""

    def __init__(self, access: Access, kind: k8s.Kind, options: settings.Options, operator_namespace: str,
                 agent_id: Callable[[Mapping[str, Any]], str], background: Background,
                 http: HttpClient | None = None) -> None:
        self.access, self.kind, self.options = access, kind, options
        # A redirect could lead past the allowed hosts: a 3xx fails the notification (core.http follows none).
        self.http = http if http is not None else HttpClient("blackadder-webhooks")
        self.agent_id = agent_id
        self.namespace = settings.ledger_namespace(operator_namespace)  # where the webhook Secrets are
        self.background = background  # webhook notifications in flight

    def announce(self, agent_body: Mapping[str, Any], target: Mapping[str, Any] | None, type_: str,
                 reason: str, message: str, log: Logger) -> None:
        """An Event on the agent and on the target, plus a log line (ConfigMap values never appear)."""
        (log.warning if type_ == "Warning" else log.info)(f"{reason}: {message}")
        try:
            self.access.event(agent_body, type_, reason, message)
            if target is not None:
                agent = self.agent_id(agent_body["metadata"])
                self.access.event(target, type_, reason, f"{message} ({self.kind.kind} {agent})")
        except LookupError:
            pass  # outside a running operator (no event queue): the log line is the record

    async def patch_status(self, meta: Mapping[str, Any], status: Mapping[str, Any],
                            body: Mapping[str, Any] | None = None) -> None:
        """Patch the agent's status; with ``body``, only when it would change (an idle or paused
        agent does not write every cycle)."""
        if body is not None and not decisions.status_changed(body.get("status") or {}, status):
            return
        # Kopf updates a daemon's body in place as events arrive, and our own patch's event can arrive
        # during the await: the conditions before the write are the ones read now.
        before = copy.deepcopy(((body or {}).get("status") or {}).get("conditions"))
        agent = self.agent_id(meta)
        namespace = meta.get("namespace") if self.kind.namespaced else None
        try:
            await self.access.patch_status(self.kind, namespace, meta["name"], status)  # None: deleted meanwhile
        except ApiError as exc:
            metrics.error(OPERATOR, "status")
            logger.warning(f"[{agent}] status not written: {exc}")
            return
        stalled = stall_event(before, status.get("conditions"))
        if body is not None and stalled:  # one uniform Event per Stalled transition (docs/observability.md)
            with contextlib.suppress(LookupError):  # outside a running operator (no event queue)
                self.access.event(body, *stalled)

    def webhook(self, body: Mapping[str, Any], secret: str, entries: list[Mapping[str, Any]], log: Logger) -> None:
        """One POST per action of the cycle, in the background (a slow receiver never delays chaos).
        The URL comes from the Secret ``secret`` (key ``address``) in the operator's namespace, read
        when there is something to send (so a rotated token applies at once); it is never logged, put
        in an Event or in status (it carries a token): only the Secret's name and the URL's host are."""
        if not entries:
            return
        agent = body["metadata"]["name"]
        where = f"{self.namespace}/{secret}"
        if not secret:  # an agent stored before webhook.url was refused by the schema
            self.announce(body, None, "Warning", "WebhookRefused",
                          "webhook.url is no longer read (a URL in a custom resource leaks its token): put the URL "
                          f"in a Secret under key {settings.WEBHOOK_SECRET_KEY!r} in namespace {self.namespace}"
                          " and set webhook.secretRef.name", log)
            return
        payloads = [decisions.webhook_payload(agent, entry) for entry in entries]

        async def post_all() -> None:
            try:
                obj = await self.access.read(k8s.SECRET, self.namespace, secret)
            except ApiError as exc:
                self.announce(body, None, "Warning", "WebhookFailed", f"could not read the webhook Secret {where}: "
                              f"{exc}", log)
                return
            encoded = ((obj or {}).get("data") or {}).get(settings.WEBHOOK_SECRET_KEY)
            try:
                url = base64.b64decode(encoded).decode().strip() if encoded else ""
            except ValueError:
                url = ""
            if not url:
                self.announce(body, None, "Warning", "WebhookSecretMissing",
                              f"no webhook sent: Secret {where} " + ("has no key " + repr(settings.WEBHOOK_SECRET_KEY)
                                                                     if obj else "does not exist"), log)
                return
            refusal = decisions.webhook_refusal(url, self.options.webhook_hosts)
            if refusal:
                metrics.error(OPERATOR, "webhook")
                self.announce(body, None, "Warning", "WebhookRefused", f"{refusal} (Secret {where})", log)
                return
            host = urllib.parse.urlsplit(url).hostname
            for payload in payloads:
                try:
                    answer = await self.http.request("POST", url, WEBHOOK_TIMEOUT_SECONDS, json=payload)
                    why = "" if answer.status < 300 else f"HTTP {answer.status}"
                except Exception as exc:  # the boundary: its text may carry the URL, its type only is said
                    why = failure(exc)
                if why:
                    metrics.error(OPERATOR, "webhook")
                    self.announce(body, None, "Warning", "WebhookFailed",
                                  f"webhook to {host} (Secret {where}) failed: {why}; the rest of "
                                  "this cycle's notifications are dropped", log)
                    return
            metrics.action(OPERATOR, "webhook", len(payloads))

        self.background.spawn(post_all())
