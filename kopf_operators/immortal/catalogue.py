"""Immortal's Event reasons (on the ImmortalContainer) and the labels and annotations it writes: one
line each. docs/reference/events.md and annotations.md are generated from here (`make reference`);
tests/unit/test_catalogue.py fails when the code emits a reason this list lacks."""

from __future__ import annotations

from kopf_operators.core.catalogue import Catalogue, annotation, label, normal, warning
from kopf_operators.immortal import decisions

CATALOGUE = Catalogue("immortal", "the ImmortalContainer", events=(
    normal("PodCreated", "a Pod was created to run the spec's container"),
    normal("PodEnded", "the Pod ended by itself (Succeeded or Failed) and is being replaced"),
    normal("PodDisrupted", "the Pod was taken away (evicted, preempted, node shutdown) and is replaced at once, "
                           "with no crash backoff"),
    normal("ImageChanged", "the Pod runs another image than the spec asks for and is being replaced"),
    normal("TemplateChanged", "the Pod was made from another template and is being replaced"),
    warning("BackOff", "the Pod ended again soon after its last end: the message says when it is replaced"),
    warning("InvalidTemplate", "the API server refuses the Pod the spec describes (once per episode)"),
    warning("TemplateRefused", "an edit describes a Pod the API server refuses; the working Pod is kept "
                               "(once per episode)"),
    warning("ForeignPod", "a Pod the operator does not own has the name it needs; it is left alone "
                          "(once per episode)"),
), keys=(
    label(decisions.OWNER_LABEL, "Pod", "operator", "the name of the ImmortalContainer that owns the Pod"),
    label(decisions.ARTICLE_LABEL, "Pod", "operator", "the same name, under the original article's label key"),
    annotation(decisions.TEMPLATE_HASH_ANNOTATION, "Pod", "operator",
               "digest of the Pod the spec asks for: a spec change that changes it replaces the Pod"),
))
