"""Copyrator: pure decisions (no API calls).

A ``CopyratorRule`` names a resource type (ConfigMap or Secret), a label selector and one or more
source namespaces. Every matching object is copied into each target namespace. This module decides,
for one copy at a time, what the cluster should hold there and which single write gets it there;
``copyrator.controller`` feeds it from indexes and applies the answer.

Consent: a rule that reads a namespace other than its own copies a source only when the source
carries ``copyrator.kopf-operators.dev/allowed-namespaces`` (names and globs), and only into the
namespaces listed there, unless the operator runs with COPYRATOR_ALLOW_CROSS_NAMESPACE=true.

Target consent: a push (annotations on a source, no rule) writes into a namespace only when that
namespace accepts copies from the source's namespace (``copyrator.kopf-operators.dev/accept-from`` on
the Namespace, names and globs) or the operator trusts the source's namespace cluster-wide
(COPYRATOR_TRUSTED_NAMESPACES); the system namespaces and the operator's own never receive one unless
COPYRATOR_OPEN_NAMESPACES names them. COPYRATOR_RULES_NEED_TARGET_CONSENT applies the same to rules.

Objects are plain dicts as the API returns them (camelCase keys).
"""

from __future__ import annotations

from kopf_operators.copyrator.copies import *  # noqa: F403
from kopf_operators.copyrator.rules import *  # noqa: F403
from kopf_operators.copyrator.tally import *  # noqa: F403
