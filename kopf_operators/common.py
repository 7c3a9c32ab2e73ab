"""What the four operators share: configuration, API clients, status conditions, events, metrics.

Importing this module registers exactly one Kopf startup handler (``shared-settings``), which is
the only place where the process-wide ``kopf.OperatorSettings`` are changed. Every handler file in
``operators/`` imports this module, and Python imports a module once, so the handler registers once
whatever subset of operator files ``kopf run`` is given.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import kopf
import kubernetes
import urllib3
from aiohttp import web

logger = logging.getLogger("kopf_operators")

# Threads for blocking API calls, in Kopf's pool (sync handlers) and asyncio's (to_thread) alike.
WORKER_THREADS = 16

OPERATOR_NAMES = ("immortal", "copyrator", "blackadder", "reroller")

# The one API group under which the project's own labels and annotations live.
DOMAIN = "kopf-operators.dev"


def _env_bool(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean (use true or false)")


def _env_float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be at least {minimum}")
    return value


@dataclasses.dataclass(frozen=True)
class Config:
    """Operator-wide options, read from environment variables (documented in the README)."""

    # Namespace and pod the operator itself runs in (downward API); "" when run locally.
    operator_namespace: str = ""
    operator_pod_name: str = ""
    # Blackadder: force dry-run for every ChaosAgent, whatever its spec says.
    chaos_dry_run: bool = False
    # Copyrator: allow a rule to read sources from namespaces other than its own.
    copyrator_allow_cross_namespace: bool = False
    # Periodic level-triggered resync of Copyrator rules (seconds).
    copyrator_resync_seconds: float = 60.0
    # Re-roller: changes within this window merge into one rollout; at most one rollout
    # per workload per min-interval.
    reroller_debounce_seconds: float = 2.0
    reroller_min_interval_seconds: float = 10.0
    # Port of the Prometheus text endpoint; 0 disables it.
    metrics_port: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        return cls(
            operator_namespace=env.get("OPERATOR_NAMESPACE", ""),
            operator_pod_name=env.get("OPERATOR_POD_NAME", ""),
            chaos_dry_run=_env_bool(env, "CHAOS_DRY_RUN"),
            copyrator_allow_cross_namespace=_env_bool(env, "COPYRATOR_ALLOW_CROSS_NAMESPACE"),
            copyrator_resync_seconds=_env_float(env, "COPYRATOR_RESYNC_SECONDS", 60.0, minimum=1.0),
            reroller_debounce_seconds=_env_float(env, "REROLLER_DEBOUNCE_SECONDS", 2.0),
            reroller_min_interval_seconds=_env_float(env, "REROLLER_MIN_INTERVAL_SECONDS", 10.0),
            metrics_port=int(_env_float(env, "METRICS_PORT", 0)),
        )


@functools.cache
def config() -> Config:
    return Config.from_env()


# --- Kubernetes clients -------------------------------------------------------------------------

_client_lock = threading.Lock()


@functools.cache
def api_client() -> kubernetes.client.ApiClient:
    """One shared synchronous client: in-cluster credentials in a pod, else KUBECONFIG."""
    with _client_lock:
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        return kubernetes.client.ApiClient()


def core_v1() -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client())


def apps_v1() -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(api_client())


def custom_objects() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api_client())


# What a call through the kubernetes client raises when the API server answers with an error, or
# cannot be reached at all (connection refused or reset, timeouts): both are worth a retry later.
API_ERRORS: tuple[type[BaseException], ...] = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError)


def is_status(exc: BaseException, *codes: int) -> bool:
    """True when ``exc`` is an API error with one of the given HTTP status codes."""
    return isinstance(exc, kubernetes.client.ApiException) and exc.status in codes


# --- Status helpers ---------------------------------------------------------------------------


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(
    conditions: Iterable[Mapping[str, Any]] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    observed_generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """Return ``conditions`` with one condition replaced, keeping ``lastTransitionTime`` when the
    status did not change (the Kubernetes API conventions)."""
    status_str = "True" if status else "False"
    result: list[dict[str, Any]] = []
    previous: Mapping[str, Any] | None = None
    for cond in conditions or ():
        if cond.get("type") == type_:
            previous = cond
        else:
            result.append(dict(cond))
    changed = previous is None or previous.get("status") != status_str
    new: dict[str, Any] = {
        "type": type_,
        "status": status_str,
        "reason": reason,
        "message": message,
        "lastTransitionTime": (now or now_iso())
        if changed
        else (previous or {}).get("lastTransitionTime", now or now_iso()),
    }
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    result.append(new)
    return sorted(result, key=lambda c: str(c.get("type")))


def stable_hash(data: Any) -> str:
    """A short, stable digest of JSON-able data (sorted keys); never reversible to the data."""
    encoded = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


# --- Metrics ----------------------------------------------------------------------------------


class Metrics:
    """A few process-wide counters in the Prometheus text format (no extra dependency)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: defaultdict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        self._help: dict[str, str] = {}

    def inc(self, name: str, help_: str, amount: float = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._help.setdefault(name, help_)
            self._counters[key] += amount

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name in sorted(self._help):
                lines.append(f"# HELP {name} {self._help[name]}")
                lines.append(f"# TYPE {name} counter")
                for (metric, labels), amount in sorted(self._counters.items()):
                    if metric != name:
                        continue
                    rendered = ",".join(f'{k}="{v}"' for k, v in labels)
                    lines.append(f"{name}{{{rendered}}} {amount:g}" if rendered else f"{name} {amount:g}")
        return "\n".join(lines) + "\n"


metrics = Metrics()


def count_action(operator: str, action: str, amount: float = 1) -> None:
    metrics.inc("kopf_operators_actions_total", "Actions taken by the operators.", amount,
                operator=operator, action=action)


def count_error(operator: str, kind: str) -> None:
    metrics.inc("kopf_operators_errors_total", "Errors met by the operators.", operator=operator, kind=kind)


async def _serve_metrics(port: int) -> None:
    async def handle(_: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    logger.info("Serving Prometheus metrics on :%d/metrics", port)


# --- The single place where Kopf's settings are changed ------------------------------------------


@kopf.on.startup(id="shared-settings")
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    cfg = config()  # fail fast on a malformed environment variable
    # Re-establish watches regularly: a silently dead stream then heals within minutes.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    # Sync clients (kubernetes, pykube-ng) run in thread pools; keep them bounded, and give the async
    # handlers' asyncio.to_thread calls as many threads as Kopf's sync handlers get (asyncio's own
    # default is min(32, CPUs + 4): 6 threads on a 2-core node).
    settings.execution.max_workers = WORKER_THREADS
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="kopf-operators"))
    # Two replicas: only one acts (peering CRDs in manifests/crds). `--peering NAME` and
    # `--standalone` on the command line win; this only replaces Kopf's generic default name.
    if settings.peering.name == "default":
        settings.peering.name = "kopf-operators"
    # When a resource with a timer (Copyrator's resync) is deleted, Kopf re-checks whether the timer
    # has exited this often before it releases the finalizer; the default (60 s) held deletions.
    settings.background.cancellation_polling = 1
    # Log lines stay log lines (no Event per "Handler succeeded"); Events are posted explicitly with
    # kopf.info/warn/event where a user needs to see them, Normal ones included.
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    if cfg.metrics_port:
        await _serve_metrics(cfg.metrics_port)
