"""What the four operators share that is pure: environment parsing, the shared configuration,
status conditions, label selectors and hashing. No API calls and no Kopf registrations here
(those live in ``access`` and ``process``).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

OPERATOR_NAMES = ("immortal", "copyrator", "blackadder", "reroller")

# The one API group under which the project's own labels and annotations live.
DOMAIN = "kopf-operators.dev"

# Copyrator's mark, which Blackadder reads too (it leaves Copyrator's copies and sources alone): the
# prefix of Copyrator's labels and annotations, and the label every copy carries (the uid of the rule
# that owns it: only objects carrying *this rule's* uid are ever updated or deleted by that rule).
COPYRATOR_PREFIX = f"copyrator.{DOMAIN}/"
COPYRATOR_RULE_UID_LABEL = COPYRATOR_PREFIX + "rule-uid"

# The re-roller's mark on a workload whose configuration changed and whose rollout it holds back (a
# restart window, a progression's wave): Blackadder reads it too (it spares such a workload).
REROLLER_PENDING = f"reroller.{DOMAIN}/pending"


def env_bool(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean (use true or false)")


def env_float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
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


def env_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list (blanks dropped)."""
    return tuple(item.strip() for item in (env.get(name) or "").split(",") if item.strip())


@dataclasses.dataclass(frozen=True)
class Config:
    """Process-wide options shared by all operators (each operator reads its own options into the
    settings of its decision module). Read from environment variables documented in the README."""

    # Namespace and pod the operator itself runs in (downward API); "" when run locally.
    operator_namespace: str = ""
    operator_pod_name: str = ""
    # Port of the Prometheus endpoint; 0 disables it.
    metrics_port: int = 0
    # Hash shards by namespace (docs/sharding.md): this process serves shard ``shard_index`` of
    # ``shard_count``; 1 shard (the default) serves everything.
    shard_index: int = 0
    shard_count: int = 1
    # Who filters a shard's watches: "server" (the API server's shard selector, ShardedListAndWatch),
    # "client" (this process drops other shards' events), or "auto" (the server when it honours the
    # selector, checked at start; else the process).
    shard_filtering: str = "auto"
    # Objects whose events are processed at once (process.governed); 0: no cap. 32, not 64: in a burst
    # of 1,000 ImmortalContainers it left ~5 MB less at rest (docs/performance.md, "Fewer bytes per
    # kept object"), and the API server, not the passes in flight, bounds the burst.
    concurrent_events: int = 32
    # The soak's diagnostics (core.diagnostics): a JSON line per period to this file; "" (default): off.
    diagnostics_file: str = ""
    diagnostics_seconds: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        return cls(
            operator_namespace=env.get("OPERATOR_NAMESPACE", ""),
            operator_pod_name=env.get("OPERATOR_POD_NAME", ""),
            metrics_port=int(env_float(env, "METRICS_PORT", 0)),
            shard_index=int(env_float(env, "SHARD_INDEX", 0)),
            shard_count=int(env_float(env, "SHARD_COUNT", 1, minimum=1)),
            shard_filtering=env.get("SHARD_FILTERING", "auto").strip().lower() or "auto",
            concurrent_events=int(env_float(env, "CONCURRENT_EVENTS", 32, minimum=0)),
            diagnostics_file=env.get("DIAGNOSTICS_FILE", ""),
            diagnostics_seconds=env_float(env, "DIAGNOSTICS_SECONDS", 60.0, minimum=1.0),
        )

    def __post_init__(self) -> None:
        if not 0 <= self.shard_index < self.shard_count:
            raise ValueError(f"SHARD_INDEX={self.shard_index} must be below SHARD_COUNT={self.shard_count}")
        if self.shard_filtering not in SHARD_FILTERINGS:
            raise ValueError(f"SHARD_FILTERING={self.shard_filtering} must be one of {', '.join(SHARD_FILTERINGS)}")


SHARD_FILTERINGS = ("auto", "server", "client")


# --- Hash shards: the API server's ShardedListAndWatch hashes a field with 64-bit FNV-1a --------

HASH_SPACE = 1 << 64


def fnv1a64(value: str) -> int:
    h = 0xCBF29CE484222325
    for byte in value.encode():
        h = ((h ^ byte) * 0x100000001B3) % HASH_SPACE
    return h


def shard_bounds(index: int, count: int) -> tuple[int, int]:
    """The hash range [start, end) of shard ``index`` of ``count``: equal slices covering all hashes."""
    return index * HASH_SPACE // count, (index + 1) * HASH_SPACE // count


def namespace_shard(namespace: str, count: int) -> int:
    """Which shard serves a namespace (what the server's shard selector decides)."""
    h = fnv1a64(namespace)
    return next(i for i in range(count) if shard_bounds(i, count)[0] <= h < shard_bounds(i, count)[1])


@functools.lru_cache(maxsize=8192)
def _namespace_shard_cached(namespace: str, count: int) -> int:
    return namespace_shard(namespace, count)


def serves_namespace(namespace: str | None, index: int, count: int) -> bool:
    """Whether shard ``index`` of ``count`` serves an object in ``namespace``: the one decision of
    shard membership, whether the API server applies it (the selector) or this process does (a server
    without the feature gate). Cluster-scoped objects (no namespace) are served by every shard.
    Asked once per watched event: the hash of a namespace is kept."""
    return count <= 1 or not namespace or _namespace_shard_cached(namespace, count) == index


def shard_selector(index: int, count: int, field: str = "object.metadata.namespace") -> str:
    """The server-side shard selector of one shard (hex bounds: 16 digits, the end may be 2**64)."""
    start, end = shard_bounds(index, count)
    return f"shardRange({field}, '0x{start:016x}', '0x{end:016x}')"


def iso_to_epoch(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None


def epoch_to_iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(int(epoch), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(conditions: Iterable[Mapping[str, Any]] | None, type_: str, status: bool, reason: str, message: str,
                  observed_generation: int | None = None, now: str | None = None) -> list[dict[str, Any]]:
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


# --- kstatus conventions (sigs.k8s.io/cli-utils pkg/kstatus; docs/observability.md) -------------
# Exactly one of Ready, Reconciling and Stalled is True once the operator has written a status:
# Ready: the object does its job now; Reconciling: work under way (kstatus InProgress);
# Stalled: it cannot succeed without a change by a person (kstatus Failed).


def kstatus_conditions(
    conditions: Iterable[Mapping[str, Any]] | None,
    *,
    ready: bool,
    stalled: bool,
    reason: str,
    message: str,
    observed_generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """``conditions`` with Ready, Reconciling and Stalled set for one observed state (``reason`` and
    ``message`` say which and why, on all three). Not ready and not stalled is reconciling."""
    if ready and stalled:
        raise ValueError("an object cannot be Ready and Stalled at once")
    result = set_condition(conditions, "Ready", ready, reason, message, observed_generation, now)
    result = set_condition(result, "Reconciling", not ready and not stalled, reason, message,
                           observed_generation, now)
    return set_condition(result, "Stalled", stalled, reason, message, observed_generation, now)


def _condition(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any]:
    return next((c for c in conditions or () if c.get("type") == type_), {})


def stall_event(old: Iterable[Mapping[str, Any]] | None,
                new: Iterable[Mapping[str, Any]] | None) -> tuple[str, str, str] | None:
    """The Event (type, reason, message) a change of Stalled deserves: Warning ``Stalled`` when it
    turns True or its reason changes, Normal ``Recovered`` when it turns False; None otherwise."""
    before, after = _condition(old, "Stalled"), _condition(new, "Stalled")
    if after.get("status") == "True":
        if before.get("status") == "True" and before.get("reason") == after.get("reason"):
            return None
        return "Warning", "Stalled", f"{after.get('reason')}: {after.get('message')}"
    if before.get("status") == "True" and after:
        return "Normal", "Recovered", f"no longer stalled ({before.get('reason')}): {after.get('message')}"
    return None


# The data stamp, the contract between an operator that keeps a ConfigMap/Secret holding what it wrote
# (Copyrator, on its copies) and one that reacts to their data (the re-roller): the writer stamps the
# object with ``data_hash`` of the data it wrote; data differing from its stamp is an edit the writer is
# about to undo. Neither operator knows the other: both know only this key and this digest.
DATA_STAMP = f"copyrator.{DOMAIN}/data-hash"
# On a copy, beside its stamp: "<namespace>/<name>" of the source it copies. The re-roller rolls a copy's
# users in waves when that source asks for them (a copy never takes the project's keys from its source).
COPY_SOURCE = f"copyrator.{DOMAIN}/source"


def data_hash(kind: str, body: Mapping[str, Any]) -> str:
    """A digest of a ConfigMap's/Secret's data only: not of uid, resourceVersion or metadata, so a
    delete-and-recreate with the same data and metadata-only edits hash the same."""
    if kind == "Secret":
        payload: dict[str, Any] = {"data": body.get("data") or {}, "type": body.get("type") or "Opaque"}
    else:
        payload = {"data": body.get("data") or {}, "binaryData": body.get("binaryData") or {}}
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def data_bytes(body: Mapping[str, Any]) -> int:
    """The bytes a ConfigMap's or Secret's data and binaryData hold (keys and values; base64 values as
    decoded); for a body whose data were elided (``DATA_ELIDED``), the size they had."""
    elided = body.get(DATA_ELIDED)
    if isinstance(elided, Mapping):
        return int(elided.get("bytes") or 0)
    total = 0
    for field in ("data", "binaryData"):
        encoded = field == "binaryData" or body.get("kind") == "Secret"
        for key, value in (body.get(field) or {}).items():
            text = str(value)
            size = len(text.encode()) if not encoded else (len(text) * 3) // 4 - text.count("=", -2)
            total += len(key) + size
    return total


# Top-level key of a body handed to handlers without its data and binaryData (a listed object whose
# handlers wait for the indexes: core.kopf_patches.governed.defer_listed): {"bytes": their size, "hash": their
# ``data_hash``}. A handler that needs the data reads the object.
DATA_ELIDED = "kopf_operators_data_elided"  # never sent to the API server: no label or annotation


def elide_data(body: Mapping[str, Any], above: int) -> Mapping[str, Any]:
    """``body`` itself, or, when its data and binaryData hold more than ``above`` bytes, a copy
    without them that says so (``DATA_ELIDED``)."""
    size = data_bytes(body)
    if size <= above:
        return body
    lean = {key: value for key, value in body.items() if key not in ("data", "binaryData")}
    lean[DATA_ELIDED] = {"bytes": size, "hash": data_hash(str(body.get("kind") or ""), body)}
    return lean


def stable_hash(data: Any) -> str:
    """A short, stable digest of JSON-able data (sorted keys); never reversible to the data."""
    encoded = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def compact(value: Any) -> Any:
    """A copy of decoded JSON to keep for long, its strings interned. Every watch event is decoded
    anew, with strings of its own (json shares keys only within one document), so each kept entry
    held its own copies of the keys and of values that repeat across objects and across the entries
    of one object (kinds, reasons, timestamps, names, uids). Interned strings are freed with their
    last user."""
    if type(value) is str:
        return sys.intern(value)
    if isinstance(value, Mapping):
        return {sys.intern(key) if type(key) is str else key: compact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [compact(item) for item in value]
    return value


def matches_labels(labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    labels = labels or {}
    return all(labels.get(key) == value for key, value in selector.items())


def matches_label_selector(labels: Mapping[str, str] | None, selector: Mapping[str, Any] | None) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels AND every matchExpression); empty matches all."""
    if not selector:
        return True
    labels = labels or {}
    if not matches_labels(labels, selector.get("matchLabels") or {}):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
