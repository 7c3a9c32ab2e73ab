"""Regular expressions a tenant writes (Reloader's reload names on a workload, a TenantChaosAgent's
podNames), compiled for RE2 (google-re2): matching takes time linear in the name, whatever the pattern.

Python's ``re`` backtracks: ``(a|a)*b`` against forty ``a`` runs for days, on the event loop every
operator of the process shares (and the Lease renewal with it). RE2 is also what Reloader and
chaoskube use (Go's regexp), so a pattern means here what it means there. What RE2 cannot run in
linear time it refuses: backreferences, lookaround, atomic groups, possessive repetition.

A pattern is refused, never raised: ``TenantPattern.problem`` says why, and a refused pattern matches
nothing (each caller says so where the tenant sees it).
"""

from __future__ import annotations

import dataclasses
import functools

import re2

# Longer than any object name a pattern is meant for (253 characters); a pattern beyond it is refused
# before compiling, which bounds the compile time and the size of the cache below.
MAX_PATTERN_LENGTH = 256
# Memory RE2 may use per compiled pattern (program and lazily built DFA). Past it RE2 refuses an
# oversized program at compile time and falls back from the DFA to its (still linear) NFA at match
# time. With CACHE_SIZE patterns cached, the worst case stays within a few hundred MiB, a real one far less.
MAX_MEMORY = 1 << 20
# Distinct patterns kept compiled (least recently used dropped): every workload's patterns and every
# agent's, without compiling one per name matched.
CACHE_SIZE = 256


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refusal is our answer to say, not RE2's stderr line
    options.max_mem = MAX_MEMORY
    return options


@dataclasses.dataclass(frozen=True)
class TenantPattern:
    """A compiled tenant pattern, or why it was refused (then it matches nothing)."""

    text: str
    compiled: re2._Regexp | None = None
    problem: str | None = None

    def fullmatch(self, name: str) -> bool:
        """The whole name matches (Reloader's anchored names: ``^(?:pattern)$``)."""
        return self._matches(name, anchored=True)

    def search(self, name: str) -> bool:
        """The pattern occurs somewhere in the name (chaoskube's pod-name patterns)."""
        return self._matches(name, anchored=False)

    def _matches(self, name: str, *, anchored: bool) -> bool:
        if self.compiled is None:
            return False
        try:
            found = self.compiled.fullmatch(name) if anchored else self.compiled.search(name)
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for RE2, and no object name either
            return False
        return found is not None


@functools.lru_cache(maxsize=CACHE_SIZE)
def tenant_pattern(text: str) -> TenantPattern:
    """``text`` compiled by RE2, or refused with the reason (too long, or a syntax RE2 does not run)."""
    if len(text) > MAX_PATTERN_LENGTH:
        return TenantPattern(text, problem=f"longer than {MAX_PATTERN_LENGTH} characters")
    try:
        return TenantPattern(text, compiled=re2.compile(text, _options()))
    except UnicodeEncodeError:
        return TenantPattern(text, problem="not valid Unicode text (a lone surrogate)")
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        return TenantPattern(text, problem=f"RE2 refuses it (it runs in linear time only): {reason}")
