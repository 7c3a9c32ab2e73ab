"""Copyrator's Event reasons (on the CopyratorRule, or on the source of a push) and the labels and
annotations it reads and writes: one line each. docs/reference/events.md and annotations.md are
generated from here (`make reference`); tests/unit/test_catalogue.py fails when the code emits a reason
this list lacks."""

from __future__ import annotations

from kopf_operators.copyrator import rules
from kopf_operators.core import conventions
from kopf_operators.core.catalogue import Catalogue, annotation, label, normal, warning
from kopf_operators.core.conventions import COPY_SOURCE

CATALOGUE = Catalogue("copyrator", "the CopyratorRule; for a push, its source ConfigMap or Secret", events=(
    normal("Synced", "the rule wrote copies: how many were created, updated and deleted, and what triggered it"),
    warning("Conflict", "a target holds an object the rule does not own, or another rule's copy (named)"),
    warning("Refused", "a source in another namespace does not consent to this rule (its allowed-namespaces "
                       "annotation); on a push: a source the rule may not copy"),
    warning("TargetRefused", "a target namespace does not accept copies from the rule's namespace "
                             "(its accept-from annotation)"),
    warning("Invalid", "the rule, or a push annotation, cannot be read; the message says why"),
    warning("CopyRefused", "the API server refuses a copy (admission, validation); not retried until something "
                           "changes"),
    warning("InvalidCopy", "push: a source cannot be copied as configured (name too long, keys that collide)"),
    warning("TargetClaimed", "push: a target name belongs to another rule's copy or claim"),
    warning("ForeignObject", "push: a target holds an object of that name the operator does not own"),
    warning("Skipped", "push: the source is never copied (a ServiceAccount token, a Helm release record)"),
    warning("NoTargetConsents", "a rule: no target namespace accepts its copies (rulesNeedTargetConsent); "
            "the message names each target and the consent it lacks; the rule is Stalled, not Ready"),
    warning("PushRefused", "push: a target namespace does not accept pushes from the source's namespace"),
    warning("SourceTooLarge", "a source's data and binaryData hold more bytes than the cap (chart value "
                              "operators.copyrator.maxSourceBytes): it is never copied; the message gives both sizes"),
    warning("PushDisabled", "push: push annotations are turned off in this cluster (chart value "
                            "operators.copyrator.push.enabled)"),
), keys=(
    annotation(conventions.DATA_STAMP, "copy", "operator",
               "the hash of the data Copyrator wrote: a copy whose data differs was edited by hand and is "
               "repaired (the re-roller rolls nothing for it)"),
    annotation(rules.ALLOWED_NAMESPACES_ANNOTATION, "source ConfigMap/Secret", "you",
               "consent: the namespaces (names, globs) whose rules may copy this source"),
    annotation(rules.PUSH_TO_ANNOTATION, "source ConfigMap/Secret", "you",
               "push, with no rule, into these namespaces (names and globs, comma-separated)"),
    annotation(rules.PUSH_TO_MATCHING_ANNOTATION, "source ConfigMap/Secret", "you",
               "push into the namespaces carrying all these labels (key=value pairs)"),
    annotation(rules.ACCEPT_FROM_ANNOTATION, "Namespace", "you",
               "target consent: the namespaces (names, globs; * for all) whose pushes may write copies here"),
    label(conventions.COPYRATOR_RULE_UID_LABEL, "copy", "operator",
          "the uid of the rule (or pushed source) that owns the copy: only its owner ever changes it"),
    annotation(rules.RULE_ANNOTATION, "copy", "operator", "namespace/name of the rule that made the copy"),
    annotation(COPY_SOURCE, "copy", "operator", "namespace/name of the source"),
    annotation(rules.SOURCE_UID_ANNOTATION, "copy", "operator", "uid of the source"),
    annotation(rules.HASH_ANNOTATION, "copy", "operator",
               "digest of the copy's content: a hand edit that changes it is repaired"),
    annotation(rules.ANNOTATIONS_COPIED, "copy", "operator",
               "the rule copies the source's annotations: they are part of the content"),
    annotation(rules.PUSHED_ANNOTATION, "copy", "operator", '"true" on a copy made by a push annotation'),
))
