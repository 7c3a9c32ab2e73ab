"""Tenants' regular expressions (core.patterns): RE2, linear time, refusals said instead of raised; the
re-roller's reload-name patterns and Blackadder's podNames through it."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from kopf_operators.blackadder import decisions, targets
from kopf_operators.blackadder.settings import settings_from_spec
from kopf_operators.core.patterns import MAX_PATTERN_LENGTH, tenant_pattern
from kopf_operators.reroller import controller as reroller
from kopf_operators.reroller import views
from kopf_operators.reroller.settings import RELOADER_CONFIGMAPS, Options
from kopf_operators.reroller.views import refused_patterns
from tests.unit.fake_access import FakeAccess

# Patterns Python's re and RE2 both run: the anchored full match the re-roller used before
# (``re.match(f"^(?:{p})$")``) and RE2's fullmatch agree on every object-name-like text.
SHARED = ["app-config-.*", "a|b", "(ab)+", "[a-c]{2,3}", "x.y", "(?i:APP)", r"\d+-conf", "a*?b", "(?P<n>a)b",
          "cfg-(dev|prod)-[0-9]+", "", "^a$", "a$|b"]
NAMES = ["app-config-a", "a", "b", "ab", "abab", "abc", "xzy", "x.y", "app", "12-conf", "aaab", "cfg-dev-1",
         "cfg-prod-", "other-app-config-b", "", "1-conf-x"]


@pytest.mark.parametrize("pattern", SHARED)
def test_re2_full_match_means_what_the_anchored_python_match_meant(pattern: str) -> None:
    compiled = re.compile(f"^(?:{pattern})$")
    for name in NAMES:
        assert tenant_pattern(pattern).fullmatch(name) == bool(compiled.match(name)), (pattern, name)
        assert tenant_pattern(pattern).search(name) == bool(re.search(pattern, name)), (pattern, name)


def test_a_catastrophic_pattern_runs_in_linear_time() -> None:
    started = time.perf_counter()
    pattern = tenant_pattern("(a|a)*b")
    assert pattern.problem is None
    assert not pattern.fullmatch("a" * 40) and not pattern.search("a" * 100_000)
    assert time.perf_counter() - started < 0.5  # Python's re: days


@pytest.mark.parametrize(("text", "why"), [
    (r"(a)\1", "invalid escape sequence"),       # a backreference
    ("(?=a)b", "invalid perl operator"),         # lookahead
    ("(?<!a)b", "invalid perl operator"),        # lookbehind
    ("a{1001}", "invalid repetition size"),
    ("web-([", "missing"),
    ("a" * (MAX_PATTERN_LENGTH + 1), f"longer than {MAX_PATTERN_LENGTH} characters"),
    ("\ud800", "lone surrogate"),
])
def test_what_re2_cannot_run_is_refused_with_a_reason_and_matches_nothing(text: str, why: str) -> None:
    pattern = tenant_pattern(text)
    assert pattern.problem is not None and why in pattern.problem
    assert not pattern.fullmatch("a") and not pattern.search("aab")


def test_a_name_that_is_no_utf8_matches_nothing_instead_of_raising() -> None:
    assert not tenant_pattern("a").search("\ud800a")


def test_compiled_patterns_are_cached_and_the_cache_is_bounded() -> None:
    assert tenant_pattern("cached-.*") is tenant_pattern("cached-.*")
    assert tenant_pattern.cache_info().maxsize is not None


# --- the re-roller ---------------------------------------------------------------------------------

def workload(reload: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "uid": "web-uid", "resourceVersion": "5",
                         "annotations": {RELOADER_CONFIGMAPS: reload}},
            "spec": {"template": {"metadata": {}, "spec": {"containers": [{"name": "c"}]}}}}


def test_a_refused_reload_pattern_matches_nothing_and_says_why() -> None:
    view = views.workload_view("Deployment", workload(r"conf,(a)\1,(a|a)*b"))
    assert view is not None
    lookup = {("ConfigMap", n): views.SourceView("1" * 16, 1) for n in ("conf", "aa", "a" * 40)}
    started = time.perf_counter()
    assert views.effective_sources(view, lookup) == {views.Source("ConfigMap", "conf")}
    assert time.perf_counter() - started < 0.5
    [problem] = refused_patterns(view)
    assert problem.startswith(f"{RELOADER_CONFIGMAPS} '(a)\\\\1': RE2 refuses it")


def test_the_controller_warns_once_per_set_of_refused_patterns() -> None:
    async def scenario(access: FakeAccess) -> None:
        body = workload(r"(a)\1")
        view = views.workload_view("Deployment", body)
        indexes: dict[str, Any] = {index_id: {} for index_id in reroller.INDEXES}
        indexes[reroller.WORKLOAD_INDEXES["Deployment"]] = {
            key: [value] for key, value in views.workload_index_entries(view).items()}
        ctl = reroller.RerollerController(access, Options(), indexes)  # type: ignore[arg-type]
        key = ("Deployment", "ns", "web")
        await ctl.guarded(key, "workload event")
        await ctl.guarded(key, "workload event")
        await ctl.stop()

    access = FakeAccess()
    asyncio.run(scenario(access))
    assert access.events.count(("Warning", "PatternRefused")) == 1


# --- Blackadder ------------------------------------------------------------------------------------

def test_a_refused_pod_name_pattern_is_reported_as_an_invalid_regex() -> None:
    settings = settings_from_spec({"eagerness": 1, "podNames": {"include": r"(web)-\1"}})
    problem = decisions.spec_problem(settings)
    assert problem and problem.startswith(r"podNames.include '(web)-\\1' is not a valid regular expression")
    assert "RE2 refuses it" in problem


def test_a_catastrophic_pod_name_pattern_is_searched_in_linear_time() -> None:
    settings = settings_from_spec({"eagerness": 1, "podNames": {"exclude": "(a|a)*b"}})
    assert decisions.spec_problem(settings) is None
    started = time.perf_counter()
    assert targets.pod_name_allowed("a" * 60, settings)
    assert time.perf_counter() - started < 0.5
