"""Re-roller: the Warnings said about a workload's own settings, once per problem: missing sources
and refused name patterns (the next pass with the same problem says nothing)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kopf_operators.core import metrics
from kopf_operators.core.access import Access
from kopf_operators.core.state import KeyedState, PerKey
from kopf_operators.reroller import plans, settings, views
from kopf_operators.reroller.views import ref_of, refused_patterns

OPERATOR = "reroller"
logger = logging.getLogger("kopf_operators.reroller")
Key = settings.WorkloadKey


class Notices:
    def __init__(self, state: KeyedState[Key], access: Access, terminating: Callable[[str], bool]) -> None:
        self.access = access
        # Whether a namespace is being deleted: its sources go in any order, so a missing one is no news.
        self.terminating = terminating
        self._missing: PerKey[Key, tuple[str, ...]] = state.map()  # the missing sources said
        self._refused: PerKey[Key, tuple[str, ...]] = state.map()  # the refused name patterns said

    def missing(self, view: views.WorkloadView, plan: plans.Plan) -> None:
        key = view.key
        if not plan.missing:
            self._missing.pop(key, None)
            return
        if self._missing.get(key) == plan.missing or self.terminating(view.namespace):
            return
        self._missing[key] = plan.missing
        message = (f"Missing source(s) {', '.join(plan.missing)}: not re-rolling until they exist "
                   f"(the baseline is kept, so a recreate with the same data rolls nothing)")
        metrics.error(OPERATOR, "source-missing")
        logger.warning(f"{view.kind} {view.namespace}/{view.name}: {message}"[:1000])
        self.access.event(ref_of(view), "Warning", "SourceMissing", message)

    def refused(self, view: views.WorkloadView) -> None:
        """Name patterns RE2 refuses match nothing: said once per set of them, as a Warning Event."""
        key = view.key
        refused = refused_patterns(view)
        if not refused:
            self._refused.pop(key, None)
            return
        if self._refused.get(key) == refused:
            return
        self._refused[key] = refused
        message = f"Name pattern(s) refused, matching nothing: {'; '.join(refused)}"
        metrics.error(OPERATOR, "pattern-refused")
        logger.warning(f"{view.kind} {view.namespace}/{view.name}: {message}"[:1000])
        self.access.event(ref_of(view), "Warning", "PatternRefused", message)
