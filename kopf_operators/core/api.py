"""The Kubernetes API as the access layer (``core.access``) speaks it: the kinds it addresses and its one
error model.

- ``Kind``: a resource as the API addresses it (its paths), and the built-in kinds the operators use;
- ``ApiError``: every failed request (``status``: the HTTP status, None when unreachable), with its
  mapping onto Kopf's TemporaryError/PermanentError; its subclasses name the outcomes a caller catches
  (``Conflict``, ``AlreadyExists``, ``Paused``). Its text carries the HTTP status and reason only, never
  the response body (it could echo a Secret's data).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any
from urllib.parse import quote

import kopf


@dataclasses.dataclass(frozen=True)
class Kind:
    """A resource as the API addresses it."""

    api_version: str  # "v1", "apps/v1", "flant.com/v1"
    plural: str
    kind: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name:
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


POD = Kind("v1", "pods", "Pod")
CONFIGMAP = Kind("v1", "configmaps", "ConfigMap")
SECRET = Kind("v1", "secrets", "Secret")
NAMESPACE = Kind("v1", "namespaces", "Namespace", namespaced=False)
DEPLOYMENT = Kind("apps/v1", "deployments", "Deployment")
STATEFULSET = Kind("apps/v1", "statefulsets", "StatefulSet")
DAEMONSET = Kind("apps/v1", "daemonsets", "DaemonSet")
JOB = Kind("batch/v1", "jobs", "Job")
CRONJOB = Kind("batch/v1", "cronjobs", "CronJob")
LEASE = Kind("coordination.k8s.io/v1", "leases", "Lease")
BUILTIN_KINDS = {k.kind: k for k in (POD, CONFIGMAP, SECRET, NAMESPACE, DEPLOYMENT, STATEFULSET, DAEMONSET,
                                     JOB, CRONJOB)}



class ApiError(Exception):
    """An API request that failed: ``status`` is the HTTP status, None when unreachable."""

    def __init__(self, status: int | None, reason: str, message: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}" if status else f"API unreachable ({reason})")
        self.status = status
        self.reason = reason
        self.message = message  # the server's Status message: may name fields, never logged by us

    @property
    def transient(self) -> bool:
        """Worth retrying later: unreachable, throttled, or a server-side failure."""
        return self.status is None or self.status == 429 or self.status >= 500

    @property
    def namespace_terminating(self) -> bool:
        return self.status == 403 and "being terminated" in self.message

    def for_kopf(self, what: str, delay: float = 10.0) -> kopf.TemporaryError | kopf.PermanentError:
        """Kopf's view: transient errors and conflicts retry after ``delay``; refusals (403, 422, ...)
        are permanent for this spec (a spec change or a restart retries them)."""
        if self.transient or self.status in (404, 409):
            return kopf.TemporaryError(f"{what}: {self}", delay=delay)
        return kopf.PermanentError(f"{what}: {self}")


class Conflict(ApiError):
    """A 409 on a write with a resourceVersion or uid precondition: the object changed meanwhile."""


class AlreadyExists(ApiError):
    """A 409 on create: an object with that name exists (ours or anybody's: read it to know)."""


class Paused(ApiError):
    """A write asked for while this replica is a standby (another holds the Lease): not sent."""

    def __init__(self) -> None:
        super().__init__(None, "paused")
        self.args = ("not written: this replica is paused (a standby)",)


def response_error(status: int | None, reason: str, raw: Any) -> ApiError:
    """The error of a response that failed: the server's Status message kept in ``message`` only."""
    message = ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = str(json.loads(raw).get("message", ""))[:500]
    cls = Conflict if status == 409 else ApiError
    return cls(status, reason, message)


def is_client_error(exc: BaseException) -> bool:
    """pykube-ng's errors and those of the requests library under it (imported lazily: only Blackadder
    uses them)."""
    import pykube
    import requests

    return isinstance(exc, pykube.exceptions.PyKubeError | requests.RequestException)


def from_pykube(exc: BaseException) -> ApiError:
    """The same error model for pykube-ng's exceptions (Blackadder's inventory reads)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is None:
        code = getattr(exc, "code", None)
        status = code if isinstance(code, int) else None
    return response_error(status, type(exc).__name__ if status is None else str(getattr(response, "reason", "")),
                          getattr(response, "text", None))

