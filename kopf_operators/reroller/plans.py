"""Re-roller: the snapshot of a workload's sources and the plan (baseline, roll, wait) from its
baseline annotations (pure).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from kopf_operators.reroller.settings import (
    ABSENT,
    OBSERVED_HASH,
    OBSERVED_SOURCES,
)
from kopf_operators.reroller.views import (
    Source,
    SourceView,
    WorkloadView,
    scoped_hash,
)

# --- snapshots and plans ---------------------------------------------------------------------------


def short(h: str) -> str:
    """The per-source hash as stored on the workload: 8 hex characters are enough to tell a change
    and reveal even less about a Secret's data than the full digest."""
    return h[:8]


def combined_hash(per_source: Mapping[str, str]) -> str:
    """One hash over the per-source hashes (keyed by ``Source.ref``), independent of order."""
    encoded = json.dumps(dict(per_source), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The current data hashes of a workload's sources, as far as the indexes know them."""

    per_source: dict[str, str]        # ref -> short hash, or ABSENT for a missing source
    missing: list[str]                # refs of missing required sources
    optional: frozenset[str] = frozenset()

    @property
    def hash(self) -> str:
        return combined_hash(self.per_source)


# A Secret's digest keyed with the installation's digest key: "k-" + 8 hex digits of an HMAC-SHA256
# (a key-scoped one "k-<scope>.<8 hex>"). Without the key, whoever reads the workload cannot test
# guesses of the Secret's value against it, as a plain digest would let them.
KEYED = "k-"


def keyed_digest(key: bytes, digest: str) -> str:
    """``digest`` (a source's full data hash, or a key-scoped hash) keyed; ABSENT stays itself."""
    if digest == ABSENT:
        return digest
    scope, dot, value = digest.rpartition(".")
    return f"{KEYED}{scope}{dot}{hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:8]}"


def snapshot(sources: Iterable[Source], lookup: Mapping[tuple[str, str], Any],
             key_scopes: Iterable[tuple[tuple[str, str], tuple[str, ...]]] = (),
             digest_key: bytes | None = None) -> Snapshot:
    """``lookup``: (kind, name) -> SourceView (or a data hash) of the existing sources; ``key_scopes``:
    sources of which only these keys count (a key-scoped workload); ``digest_key``: Secrets' digests
    are keyed with it (``keyed_digest``)."""
    scopes = dict(key_scopes)
    per_source: dict[str, str] = {}
    missing: list[str] = []
    optional: set[str] = set()
    for source in sorted(sources):
        found = lookup.get((source.kind, source.name))
        if source.optional:
            optional.add(source.ref)
        scope = scopes.get((source.kind, source.name))
        keyed = digest_key is not None and source.kind == "Secret"
        if found is not None and scope is not None and isinstance(found, SourceView):
            digest = scoped_hash(found.keys, scope)
            per_source[source.ref] = keyed_digest(digest_key, digest) if digest_key and keyed else digest
        elif found is not None:
            full = found.hash if isinstance(found, SourceView) else str(found)
            per_source[source.ref] = keyed_digest(digest_key, full) if digest_key and keyed else short(full)
        else:
            per_source[source.ref] = ABSENT
            if not source.optional:
                missing.append(source.ref)
    return Snapshot(per_source=per_source, missing=missing, optional=frozenset(optional))


class Action(enum.Enum):
    NONE = "none"
    BASELINE = "baseline"          # record what the workload runs now, roll nothing
    ROLL = "roll"
    WAIT_MISSING = "wait-missing"  # a required source is missing: wait for it


@dataclasses.dataclass(frozen=True)
class Plan:
    action: Action
    new_hash: str = ""
    changed: tuple[str, ...] = ()     # refs whose data changed (for the Event)
    missing: tuple[str, ...] = ()     # required sources missing now (warned about once)

def ref_digest(ref: str) -> str:
    """A source's short stand-in key in the per-source hashes when the refs themselves take too much
    room (many sources with long names): "#" + 12 hex digits of its sha256."""
    # (A lone surrogate, which only a fuzzer writes, must not fail the pass: other strings encode as UTF-8.)
    return "#" + hashlib.sha256(ref.encode(errors="surrogatepass")).hexdigest()[:12]



def parse_observed(annotations: Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    observed = annotations.get(OBSERVED_HASH) or None
    try:
        per_source = json.loads(annotations.get(OBSERVED_SOURCES) or "{}")
    except (ValueError, RecursionError):  # edited by hand: no per-source hashes (``plan`` then plays safe)
        per_source = {}
    if not isinstance(per_source, dict):
        per_source = {}
    return observed, {str(k): str(v) for k, v in per_source.items()}


def plan(annotations: Mapping[str, str], snap: Snapshot, *, newer: Iterable[str] = (),
         reload_on_create: bool = False, reload_on_delete: bool = False) -> Plan:
    """Decide what to do with a workload, given its baseline annotations and the current snapshot.

    - no baseline yet (first sighting): record it at once, without rolling; except for sources
      changed after the workload's version first seen (``newer``, by resourceVersion): a change
      made right after creation is never absorbed into the baseline;
    - a required source is missing: hold (pods could not start anyway), keep the baseline, so a
      recreate with the same data rolls nothing (``reload_on_delete``: roll instead);
    - a required source that was absent appears: re-baseline (``reload_on_create``: roll);
    - the data of a source that was already watched changed: roll;
    - only the SET of sources changed (a template edit, which rolls by itself, or the opt-in keys):
      re-baseline without a second rollout.
    """
    missing = tuple(snap.missing)
    new_hash = snap.hash
    observed, observed_sources = parse_observed(annotations)
    if observed is None:
        newer = tuple(sorted(r for r in newer if snap.per_source.get(r, ABSENT) != ABSENT))
        if newer:
            return Plan(Action.ROLL, new_hash=new_hash, changed=newer, missing=missing)
        return Plan(Action.BASELINE, new_hash=new_hash, missing=missing)
    if snap.missing and not reload_on_delete:
        return Plan(Action.WAIT_MISSING if observed != new_hash else Action.NONE, new_hash=new_hash, missing=missing)
    if observed == new_hash:
        return Plan(Action.NONE, new_hash=new_hash, missing=missing)
    if not observed_sources:
        # A baseline without per-source hashes (edited by hand): the data may have changed; be safe.
        return Plan(Action.ROLL, new_hash=new_hash, changed=tuple(sorted(snap.per_source)), missing=missing)
    changed = []
    for ref, h in sorted(snap.per_source.items()):
        old = observed_sources.get(ref) or observed_sources.get(ref_digest(ref))
        if old is None or old == h or _scope_changed(old, h) or _scheme_changed(old, h):
            continue
        required = ref not in snap.optional
        if required and old == ABSENT and not reload_on_create:
            continue  # appeared: pods could not have run without it; nothing to roll
        changed.append(ref)
    if not changed:
        return Plan(Action.BASELINE, new_hash=new_hash, missing=missing)
    return Plan(Action.ROLL, new_hash=new_hash, changed=tuple(changed), missing=missing)


def held_by_suspend(view: WorkloadView, plan_: Plan) -> bool:
    """A rollout a suspended CronJob must not get (issue #20): creating a Job would run what its owner
    suspended. The change becomes its baseline instead, so resuming it creates no Job either: its
    next scheduled Job reads the data of then."""
    return plan_.action is Action.ROLL and view.kind == "CronJob" and view.suspended


def _scheme_changed(old: str, new: str) -> bool:
    """One digest is keyed and the other is not (the first pass after an upgrade that keys Secrets'
    digests, or keying switched off): they cannot be compared; the new one is adopted, nothing rolls."""
    if ABSENT in (old, new):
        return False
    return old.startswith(KEYED) != new.startswith(KEYED)


def _scope_changed(old: str, new: str) -> bool:
    """The keys a workload uses of a source changed (or key scoping was switched on or off): that is
    a template edit, which rolls by itself, not a data change."""
    if ABSENT in (old, new):
        return False
    old_scope = old.split(".")[0] if "." in old else None
    new_scope = new.split(".")[0] if "." in new else None
    return old_scope != new_scope
