"""Copyrator: a rule's places, its ledger and its status (pure); orphans whose rule is gone.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from kopf_operators.copyrator.copies import (
    CopyView,
    in_sync,
)
from kopf_operators.copyrator.rules import (
    API_VERSION,
    DNS_LABEL,
    KIND,
    RULE_FIELDS,
    Options,
    Rule,
    RuleError,
    consent_refusal,
    skip_reason,
    too_large,
)
from kopf_operators.core.conventions import (
    kstatus_conditions,
    set_condition,
)

# --- Status ------------------------------------------------------------------------------------

MAX_LISTED = 10  # conflicts/refusals named in status; the counts are always exact


@dataclasses.dataclass
class Tally:
    """One rule's copies as the indexes see them (for its status)."""

    sources: int = 0
    desired: int = 0
    copied: int = 0
    skipped: int = 0
    withheld: int = 0  # (source, target) pairs the source's consent does not allow
    targets: int = 0
    conflicts: list[str] = dataclasses.field(default_factory=list)
    refusals: list[str] = dataclasses.field(default_factory=list)  # consent problems, per source
    failed: int = 0
    contested: list[str] = dataclasses.field(default_factory=list)  # "ns/name (rule ...)": another rule's
    invalid: list[str] = dataclasses.field(default_factory=list)  # sources not copyable as configured (why)
    rejected: list[str] = dataclasses.field(default_factory=list)  # copies the API server refuses (why)
    # Target namespaces that do not accept the copies (target consent), as (namespace, why); "kept":
    # those of them holding a copy made before ("ns/name", left as it is, no longer synced).
    unaccepted: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)


class Standing(enum.Enum):
    """What one place of a rule (a target namespace and a copy name) holds, for the rule's status."""

    WITHHELD = "withheld"  # the source's consent does not cover the namespace
    MISSING = "missing"  # wanted, nothing there yet
    STALE = "stale"  # the rule's copy, not in sync (yet)
    COPIED = "copied"  # the rule's copy, in sync
    CONFLICT = "conflict"  # an object that is nobody's copy is in the way
    CONTESTED = "contested"  # another rule holds the name, or gets it (the older rule)
    UNACCEPTED = "unaccepted"  # the target namespace does not consent (a copy made before stays, unsynced)
    KEPT = "kept"  # as UNACCEPTED, and the rule's copy from before is there


# Named (in the status, or a push's Warning); the others are only counted.
PROBLEMS = (Standing.CONFLICT, Standing.CONTESTED, Standing.UNACCEPTED, Standing.KEPT)
_PLAIN = {standing: (standing, "") for standing in Standing}  # one shared tuple each: a ledger holds many


def standing(rule: Rule, namespace: str, name: str, *, allowed: bool, view: CopyView | None,
             wanted: Mapping[str, Any] | None, foreign: bool = False,
             claimant: Rule | None = None, refusal: str | None = None) -> tuple[Standing, str]:
    """What the place ``namespace``/``name`` of ``rule`` holds, and the text the status names it by
    (conflicts and contested places only). ``view``: the copy there (any rule's); ``wanted``: the
    copy the rule wants there (None: its source cannot be copied as configured, so only consent
    counts); ``foreign``: an object that is nobody's copy is in the way; ``claimant``: an older rule
    that gets this free name; ``refusal``: why the target namespace does not accept the copy."""
    if not allowed:
        return _PLAIN[Standing.WITHHELD]
    if refusal is not None:
        if view is not None and view.rule_uid == rule.uid:
            return Standing.KEPT, f"{namespace}/{name}"
        return Standing.UNACCEPTED, refusal
    if wanted is None:
        return _PLAIN[Standing.MISSING]
    if view is None:
        if foreign:
            return Standing.CONFLICT, f"{namespace}/{name}"
        if claimant is not None:
            return Standing.CONTESTED, f"{namespace}/{name} (wanted by the older rule {claimant.key})"
        return _PLAIN[Standing.MISSING]
    if view.rule_uid != rule.uid:
        holder = view.rule or ("a push annotation on " + view.source if view.pushed else "")
        return Standing.CONTESTED, f"{namespace}/{name} (held by {holder or 'another rule'})"
    return _PLAIN[Standing.COPIED if in_sync(view, wanted) else Standing.STALE]


Judgement = tuple[Standing, str]


@dataclasses.dataclass
class Ledger:
    """One rule's places (target namespace x copy name) and what each holds, counted per source as the
    places change: the status costs O(sources + places changed), not O(copies). The controller fills it
    from the indexes (at start, and whenever ``basis``, what every judgement depends on besides the
    place itself, changed) and then re-judges only the places events touched, so the counts always
    equal a count from scratch."""

    kind: str
    basis: Any = None
    targets: set[str] = dataclasses.field(default_factory=set)  # the rule's target namespaces
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # copy name -> source name
    places: dict[str, dict[str, Judgement]] = dataclasses.field(default_factory=dict)  # source name -> ns ->
    counts: dict[str, collections.Counter[Standing]] = dataclasses.field(default_factory=dict)  # per source name
    problems: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # source name -> ns -> text
    dirty_namespaces: set[str] = dataclasses.field(default_factory=set)  # to re-judge: every place in them
    dirty_places: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # (namespace, copy name)

    def judge(self, source_name: str, namespace: str, judgement: Judgement | None) -> None:
        """Record what a place holds now (None: it is no place of the rule any more)."""
        places = self.places.get(source_name)
        if places is None:
            places = self.places[source_name] = {}
            self.counts[source_name] = collections.Counter()
            self.problems[source_name] = {}
        old = places.get(namespace)
        if old == judgement:
            return
        counts, problems = self.counts[source_name], self.problems[source_name]
        if old is not None:
            counts[old[0]] -= 1
            if old[0] in PROBLEMS:
                del problems[namespace]
            del places[namespace]
        if judgement is not None:
            places[namespace] = judgement
            counts[judgement[0]] += 1
            if judgement[0] in PROBLEMS:
                problems[namespace] = judgement[1]


def ledger_tally(rule: Rule, ledger: Ledger, sources: Mapping[str, tuple[Mapping[str, Any], str | None]],
                 settings: Options) -> Tally:
    """The rule's tally from its ledger. ``sources``: source name -> (the source the rule copies under
    that name, why it cannot copy it as configured or None)."""
    tally = Tally(targets=len(ledger.targets))
    invalid: set[str] = set()
    unaccepted: set[tuple[str, str]] = set()  # once per namespace, whichever sources it refuses
    kept: list[str] = []
    for source_name, (source, blocked) in sorted(sources.items()):
        tally.sources += 1
        counts = ledger.counts.get(source_name) or collections.Counter()
        withheld = counts[Standing.WITHHELD]
        allowed = counts.total() - withheld
        refusal = consent_refusal(rule, source, settings, targets=len(ledger.targets), allowed=allowed)
        if refusal:
            tally.refusals.append(refusal)
            continue
        if blocked:
            invalid.add(blocked)
            continue
        tally.withheld += withheld
        tally.desired += allowed - counts[Standing.UNACCEPTED] - counts[Standing.KEPT]
        tally.copied += counts[Standing.COPIED]
        places = ledger.places.get(source_name) or {}
        for namespace, text in (ledger.problems.get(source_name) or {}).items():
            held = places[namespace][0]
            if held is Standing.UNACCEPTED:
                unaccepted.add((namespace, text))
            else:
                {Standing.CONFLICT: tally.conflicts, Standing.CONTESTED: tally.contested,
                 Standing.KEPT: kept}[held].append(text)
    tally.invalid = sorted(invalid)
    tally.unaccepted, tally.kept = sorted(unaccepted), sorted(kept)
    return tally


def build_status(rule: Rule, previous: Mapping[str, Any] | None, tally: Tally | None = None,
                 problem: RuleError | None = None, now: str | None = None) -> dict[str, Any]:
    """The rule's status. Pure: the same inputs give the same dict, so the caller writes only when
    something changed."""
    previous = previous or {}
    conds = previous.get("conditions") or []
    gen = rule.generation
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "ruleType": rule.rule_type,
        "sourceNamespaces": ",".join(rule.source_namespaces),
    }
    if problem is not None:
        if problem.reason == "Refused":
            conds = set_condition(conds, "Refused", True, "Refused", str(problem), gen, now)
        # The rule cannot work as written: only an edit helps (kstatus: Failed).
        conds = kstatus_conditions(conds, ready=False, stalled=True, reason=problem.reason, message=str(problem),
                                   observed_generation=gen, now=now)
        status["conditions"] = conds
        for key in ("sources", "desired", "copied", "conflicted", "skipped", "conflicts", "withheld", "refused",
                    "contested", "invalid"):
            if key in previous:
                status[key] = previous[key]
        return status
    assert tally is not None
    conflicts = sorted(tally.conflicts)
    status.update({
        "sources": tally.sources,
        "desired": tally.desired,
        "copied": tally.copied,
        "conflicted": len(conflicts),
        "skipped": tally.skipped,
        "withheld": tally.withheld,
        "conflicts": conflicts[:MAX_LISTED],
        "refused": sorted(tally.refusals)[:MAX_LISTED],
        "contested": sorted(tally.contested)[:MAX_LISTED],
        "invalid": sorted(tally.invalid)[:MAX_LISTED],
    })
    if tally.refusals:
        conds = set_condition(conds, "Refused", True, "ConsentMissing",
                              f"{len(tally.refusals)} source(s) not copied: " + "; ".join(status["refused"]),
                              gen, now)
    else:
        conds = set_condition(conds, "Refused", False, "Allowed", "", gen, now)
    if conflicts or tally.contested:
        # Every object in the way, whoever's: someone else's (ForeignObject) or another rule's (TargetClaimed).
        parts = []
        if conflicts:
            parts.append(f"{len(conflicts)} target(s) hold an object this rule does not own "
                         f"(left untouched): {', '.join(status['conflicts'])}")
        if tally.contested:
            parts.append(f"{len(tally.contested)} target name(s) belong to another rule: "
                         f"{', '.join(status['contested'])}")
        conds = set_condition(conds, "Conflict", True, "ForeignObject" if conflicts else "TargetClaimed",
                              "; ".join(parts), gen, now)
    else:
        conds = set_condition(conds, "Conflict", False, "NoConflict", "", gen, now)
    ready, stalled, reason, message = readiness(tally, status)
    status["conditions"] = kstatus_conditions(conds, ready=ready, stalled=stalled, reason=reason, message=message,
                                              observed_generation=gen, now=now)
    return status


def readiness(tally: Tally, status: Mapping[str, Any]) -> tuple[bool, bool, str, str]:
    """(ready, stalled, reason, message) of a rule: Ready only when every wanted copy is in sync;
    Stalled when a person must act (a source's owner must consent, an object in the way must go, the
    API server refuses a copy of a source, no target namespace accepts the copies);
    else work is under way (copies being made, failed writes retried)."""
    if tally.refusals:
        return False, True, "Refused", (f"{len(tally.refusals)} source(s) not copied without their owner's "
                                               f"consent: " + "; ".join(status["refused"]))
    if tally.invalid:
        return False, True, "InvalidCopy", (f"{len(tally.invalid)} source(s) cannot be copied as this rule "
                                            f"says: " + "; ".join(status["invalid"]))
    if tally.contested:
        return False, True, "TargetClaimed", (f"{len(tally.contested)} target name(s) are another rule's "
                                              f"(the rule holding a copy keeps it; else the older rule gets "
                                              f"it); change target/namePrefix/nameSuffix or the other rule: "
                                              f"{', '.join(status['contested'])}")
    if tally.conflicts:
        return False, True, "ForeignObject", (f"{len(tally.conflicts)} target(s) hold an object this rule does not "
                                              f"own (left untouched; delete or rename it): "
                                              f"{', '.join(status['conflicts'])}")
    if tally.rejected:
        return False, True, "CopyRefused", (f"the API server refuses {len(tally.rejected)} copy(ies), not retried "
                                            f"until the source changes: {'; '.join(sorted(tally.rejected)[:10])}")
    if tally.failed:
        return False, False, "SyncFailed", f"{tally.failed} copy operation(s) failed; retrying"
    if tally.copied < tally.desired:
        return False, False, "Syncing", f"{tally.copied} of {tally.desired} copies in sync; copying the rest"
    if not tally.desired and (tally.unaccepted or tally.kept):
        # Every target refuses: the rule copies nothing anywhere, so it is not doing its job; the
        # targets' owners must consent (or the rule must name others).
        return False, True, "NoTargetConsents", (f"no target namespace accepts this rule's copies: "
                                                 f"{target_refusals(tally)}")
    withheld = f"; {tally.withheld} withheld by their sources' consent" if tally.withheld else ""
    if tally.unaccepted or tally.kept:
        withheld += f"; {target_refusals(tally)}"
    return True, False, "Synced", f"all {tally.copied} copies in sync across {tally.targets} namespace(s){withheld}"


def target_refusals(tally: Tally) -> str:
    """What the targets' consent refuses (the Warning a push's source gets, a rule's Synced message):
    how many namespaces refuse, per consent they lack, and the copies made before that are kept unsynced.
    The refusing namespaces are counted, never named: a push to ``a*,b*,...`` (or a tenant's rule over
    every namespace) would otherwise list every namespace of the cluster to whoever reads the Event."""
    parts = []
    if tally.unaccepted:
        by_reason = collections.Counter(why for _namespace, why in tally.unaccepted)
        parts.append(f"not copied into {len(tally.unaccepted)} namespace(s) without their consent: "
                     + "; ".join(f"{count} ({why})" for why, count in sorted(by_reason.items())))
    if tally.kept:
        parts.append(f"{len(tally.kept)} copy(ies) made before in namespaces that do not consent are kept as "
                     f"they are and no longer synced (consent resumes them; deleting them is final): "
                     + ", ".join(tally.kept[:MAX_LISTED]))
    return "; ".join(parts)


Said = tuple[str | None, tuple[str, str, str]]  # (a warning line or None, the Event: type, reason, message)


@dataclasses.dataclass(frozen=True)
class StatusDecision:
    """A rule's status pass, decided: the status to write (when it changed), and what is said, in order."""

    status: dict[str, Any]
    said: list[Said]
    target_refusals: str  # what the targets' consent refuses now (said once per change)


def decide_status(rule: Rule, previous: Mapping[str, Any], tally: Tally, *, done: Mapping[str, int] | None = None,
                  trigger: str = "", told_refusals: str = "") -> StatusDecision:
    """One call for a rule's status: the status from its tally, the ``Synced`` Event of the writes
    ``done`` since the last one (by ``trigger``), and a Warning (log line and Event) for each problem
    that changed since ``previous`` (the targets' refusals: since ``told_refusals``)."""
    status = build_status(rule, previous, tally)
    said: list[Said] = []
    if done:
        summary = ", ".join(f"{what} {count}" for what, count in sorted(done.items()))
        said.append((None, ("Normal", "Synced", f"{summary} ({trigger})" if trigger else summary)))
    if status["conflicts"] and status["conflicts"] != (previous.get("conflicts") or []):
        message = (f"{status['conflicted']} object(s) in the way are not owned by this rule and were left "
                   f"untouched: {', '.join(status['conflicts'])}")
        said.append((f"Copyrator {rule.key}: {message}", ("Warning", "Conflict", message)))
    refused = target_refusals(tally)
    if refused and refused != told_refusals:  # the targets' consent (rules need it too)
        said.append((f"Copyrator {rule.key}: {refused}", ("Warning", "TargetRefused", refused)))
    if status["refused"] and status["refused"] != (previous.get("refused") or []):
        message = "; ".join(status["refused"])
        said.append((f"Copyrator {rule.key}: {message}", ("Warning", "Refused", message)))
    return StatusDecision(status, said, refused)


def decide_push(rule: Rule, tally: Tally, source: Mapping[str, Any]) -> tuple[str, str]:
    """A push's problems (a push has no status; its source gets a Warning when they change): (reason,
    message), the message empty when nothing is wrong. A stalled readiness, a source never copied (a
    token, a Helm release: its owner is told), and the target namespaces that refuse, named."""
    if refused := too_large(source):
        return "SourceTooLarge", refused
    _ready, stalled, reason, message = readiness(tally, build_status(rule, {}, tally))
    stalled = stalled and reason != "NoTargetConsents"  # said below, as for any refusing target
    if tally.skipped and not stalled:
        reason, message, stalled = "Skipped", str(skip_reason(rule, source)), True
    if tally.unaccepted or tally.kept:  # the targets' consent: named, once per change
        refused = target_refusals(tally)
        reason, message = (reason, f"{message}; {refused}") if stalled else ("PushRefused", refused)
        stalled = True
    return reason, message if stalled else ""


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    previous = previous or {}
    return any(previous.get(key) != value for key, value in new.items())


def rule_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the rules index keeps of a rule: its fields, identity and status (small)."""
    meta = body.get("metadata") or {}
    snap: dict[str, Any] = {
        "apiVersion": body.get("apiVersion", API_VERSION), "kind": body.get("kind", KIND),
        "metadata": {key: meta[key] for key in ("name", "namespace", "uid", "generation", "resourceVersion",
                                                "deletionTimestamp", "creationTimestamp")
                     if meta.get(key) is not None},
        "status": {k: v for k, v in (body.get("status") or {}).items() if k != "kopf"},
    }
    if "spec" in body:
        snap["spec"] = dict(body["spec"]) if isinstance(body["spec"], Mapping) else body["spec"]
    for key in RULE_FIELDS:
        if key in body:
            snap[key] = body[key]
    return snap


# --- Orphans: copies whose rule is gone ----------------------------------------------------------


def orphan_suspects(copies: Mapping[str, Iterable[CopyView]], live_rule_uids: Collection[str]) -> dict[str, str]:
    """Rule uid -> the rule's "ns/name" (from its copies' annotation; "" when none says), for every
    rule uid that copies carry but no live rule has. Suspects only: a rule outside this process's view
    (another shard's namespace, an unwatched one) is alive, so a read must confirm it gone."""
    suspects: dict[str, str] = {}
    for rule_uid, views in copies.items():
        if rule_uid and rule_uid not in live_rule_uids:
            suspects[rule_uid] = next((v.rule for v in views if split_rule_key(v.rule)), "")
    return suspects


def split_rule_key(key: str) -> tuple[str, str] | None:
    """ "ns/name" -> (ns, name); None when it is not one."""
    namespace, sep, name = key.partition("/")
    if not sep or not DNS_LABEL.match(namespace) or not name or "/" in name:
        return None
    return namespace, name


def rule_gone(rule_uid: str, listed: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the rule with this uid is gone, from a listing of its namespace by its name: absent
    (a successor of the same name has another uid), or being deleted."""
    for obj in listed:
        meta = obj.get("metadata") or {}
        if meta.get("uid") == rule_uid:
            return bool(meta.get("deletionTimestamp"))
    return True
