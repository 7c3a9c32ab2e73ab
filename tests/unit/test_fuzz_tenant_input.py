"""Property tests (Hypothesis) of every parser of what a tenant writes: the annotations each operator
reads, a CopyratorRule's fields, a TenantChaosAgent's spec. Whatever the input (long strings, nested
groups, Unicode, control characters, huge numbers), each answers in bounded time with a valid value or
its clear refusal, never an exception. Reproducible: derandomized, no example database."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kopf_operators.blackadder import decisions, steady, targets
from kopf_operators.blackadder.settings import settings_from_spec
from kopf_operators.copyrator import rules as copyrator
from kopf_operators.core.conventions import REROLLER_PENDING
from kopf_operators.reroller import history, plans, views, waves, windows
from kopf_operators.reroller.decisions import Do, decide_pass
from kopf_operators.reroller.settings import (
    AUTO,
    CONFIGMAPS,
    CRONJOB_MODE,
    FIRST_WAVE,
    OBSERVED_HASH,
    OBSERVED_SOURCES,
    PAUSE_PERIOD,
    PAUSED_AT,
    RELEASE,
    RELOADER_AUTO,
    RELOADER_CONFIGMAP_AUTO,
    RELOADER_CONFIGMAPS,
    RELOADER_CONFIGMAPS_EXCLUDE,
    RELOADER_RESTART_WINDOW,
    RELOADER_SEARCH,
    RELOADER_SECRET_AUTO,
    RELOADER_SECRETS,
    RELOADER_SECRETS_EXCLUDE,
    RESTART_WINDOW,
    ROLLED,
    ROLLOUT,
    ROLLOUT_STRATEGY,
    SECRETS,
    USED_KEYS_ONLY,
    WAVE,
    WAVE_DEADLINE,
    Options,
    WaveSize,
    parse_selector,
    parse_wave_size,
)
from kopf_operators.reroller.views import refused_patterns

# Per example: a parser that backtracks or loops fails the deadline, not the whole run.
FUZZ = settings(max_examples=60, deadline=500, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NOW = 1_790_000_000.0

PATHOLOGICAL = ["(a|a)*b", "(a+)+$", "(a*)*b", "((a+)+)+", "(.*a){25}", r"(a)\1", "(?=a)a", "(?<!a)b",
                "a{1000}{1000}", "(" * 200 + "a" + ")*" * 200, "[" * 300, "\\", "(?P<x>a)(?P=x)", "\x00",
                "a" * 5000, "9" * 400 + "h", "[[[[" * 500, "{" * 3000, '{"timezone": "UTC", "windows": ' + "[" * 5000]
SYMBOLS = "a(|)*+?\\1{}[]^$.,=:-_/% \t\n\r\x00\x7f\u00e9\u2603\u202e\U0001f600\ud800"
nasty_text = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=SYMBOLS, max_size=300),
    st.sampled_from(PATHOLOGICAL),
    st.builds(lambda s, n: s * n, st.sampled_from(["a", "(", "(a|", "[a-", "1", ",", "é"]), st.integers(0, 3000)),
)
huge_int = st.one_of(st.integers(), st.integers(min_value=10**18, max_value=10**40), st.integers(-(10**40), -1))
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), huge_int, st.floats(allow_nan=True, allow_infinity=True), nasty_text),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(nasty_text, children, max_size=4),
    max_leaves=12)


def bounded(started: float, seconds: float = 1.0) -> None:
    elapsed = time.perf_counter() - started
    assert elapsed < seconds, f"{elapsed:.2f}s"


def test_the_pathological_pattern_is_refused_or_linear_in_every_parser() -> None:
    """The explicit wall clock on the case that stalled the process: (a|a)*b against forty a's."""
    started = time.perf_counter()
    body = {"metadata": {"name": "w", "namespace": "ns", "annotations": {RELOADER_CONFIGMAPS: "(a|a)*b"}},
            "spec": {"template": {"spec": {}}}}
    view = views.workload_view("Deployment", body)
    assert view is not None
    assert views.effective_sources(view, {("ConfigMap", "a" * 40): views.SourceView("0" * 16, 1)}) == set()
    agent = settings_from_spec({"eagerness": 1, "podNames": {"include": "(a|a)*b"}})
    assert decisions.spec_problem(agent) is None and not targets.pod_name_allowed("a" * 40, agent)
    bounded(started, 0.5)


# --- re-roller ---------------------------------------------------------------------------------------

REROLLER_KEYS = [AUTO, CONFIGMAPS, SECRETS, USED_KEYS_ONLY, RELOADER_AUTO,
                 RELOADER_CONFIGMAP_AUTO, RELOADER_SECRET_AUTO, RELOADER_CONFIGMAPS,
                 RELOADER_SECRETS, RELOADER_SEARCH, RELOADER_CONFIGMAPS_EXCLUDE,
                 RELOADER_SECRETS_EXCLUDE, ROLLOUT_STRATEGY, PAUSE_PERIOD, PAUSED_AT,
                 OBSERVED_HASH, OBSERVED_SOURCES, REROLLER_PENDING, RESTART_WINDOW,
                 RELOADER_RESTART_WINDOW, CRONJOB_MODE, WAVE, ROLLED]
SOURCE_NAMES = ["conf", "a" * 40, "app-config-1", "x.y", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaab"]


@FUZZ
@given(kind=st.sampled_from(["Deployment", "CronJob", "Job", "StatefulSet"]),
       annotations=st.dictionaries(st.sampled_from(REROLLER_KEYS), nasty_text, max_size=8),
       template_annotations=st.dictionaries(st.sampled_from(REROLLER_KEYS), nasty_text, max_size=4),
       wall=st.floats(min_value=0, max_value=4e9))
def test_reroller_workload_annotations(kind: str, annotations: dict[str, str], template_annotations: dict[str, str],
                                       wall: float) -> None:
    started = time.perf_counter()
    pod_spec = {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "conf"}}]}]}
    template = {"metadata": {"annotations": template_annotations}, "spec": pod_spec}
    spec = {"jobTemplate": {"spec": {"template": template}}} if kind == "CronJob" else {"template": template}
    body = {"metadata": {"name": "w", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                         "annotations": annotations}, "spec": spec}
    view = views.workload_view(kind, body, Options())
    if view is not None:
        lookup = {(source_kind, name): views.SourceView("0123456789abcdef", 3)
                  for source_kind in ("ConfigMap", "Secret") for name in SOURCE_NAMES}
        assert all(isinstance(problem, str) for problem in refused_patterns(view))
        step = decide_pass(view, lookup, Options(), None, None, 100.0, wall, first_look=True)
        assert isinstance(step.do, Do)
        assert view.pause_period is None or (math.isfinite(view.pause_period) and view.pause_period >= 0)
    bounded(started)


@FUZZ
@given(rollout=st.one_of(st.none(), nasty_text, st.sampled_from(["progressive", "immediate", "PROGRESSIVE"])),
       first_wave=st.one_of(st.none(), nasty_text, st.sampled_from(["1", "0", "10%", "100%", "1e9%", "nan%",
                                                                    "-5%", "999999", "1000000", " 3 "])),
       deadline=st.one_of(st.none(), nasty_text, st.sampled_from(["10m", "0s", "9" * 400 + "h", "1.5h"])),
       release=st.one_of(st.none(), nasty_text), rolled=nasty_text, users=st.integers(0, 5000))
def test_reroller_progression_settings(rollout: str | None, first_wave: str | None, deadline: str | None,
                                       release: str | None, rolled: str, users: int) -> None:
    """A source's rollout annotations and a workload's wave and rolled: a valid setting or a clear
    problem (the safe value used), wave sizes that add up to the users, in bounded time."""
    started = time.perf_counter()
    annotations = {k: v for k, v in ((ROLLOUT, rollout), (FIRST_WAVE, first_wave),
                                     (WAVE_DEADLINE, deadline), (RELEASE, release)) if v is not None}
    source = views.source_view("ConfigMap", {"metadata": {"annotations": annotations}, "data": {"k": "v"}})
    progression = waves.progression(source, Options())
    assert all(isinstance(problem, str) and problem for problem in progression.problems)
    assert math.isfinite(progression.deadline) and progression.deadline >= 1
    assert sum(waves.wave_sizes(users, progression.size.first(users))) == users
    assert isinstance(waves.progressive(source, Options()), bool)
    assert isinstance(waves.released("ConfigMap", source, None), bool)
    try:
        assert isinstance(parse_wave_size(first_wave), WaveSize)
    except ValueError as refused:
        assert str(refused)
    parsed = waves.parse_rolled(rolled)
    assert parsed is None or math.isfinite(parsed[1])
    assert 0 <= views.parse_priority(rolled) <= 1_000_000
    bounded(started)


@FUZZ
@given(limit=nasty_text, restore=nasty_text)
def test_reroller_history_annotations(limit: str, restore: str) -> None:
    """A source's history limit and restore request: a bounded count or a refusal said in words."""
    started = time.perf_counter()
    count, refusal = history.parse_limit(limit)
    assert (count is not None and 1 <= count <= 20) or (count is None and refusal)
    snapshots = [history.Snapshot(name=f"conf-{h}", uid=f"u{v}", hash=h, version=v)
                 for v, h in enumerate(["0123456789abcdef", "fedcba9876543210", "00112233aabbccdd"])]
    target, why = history.resolve_restore(restore, "0123456789abcdef", snapshots)
    assert target in (*snapshots, None) and (target is not None or why)
    bounded(started)


@FUZZ
@given(text=nasty_text)
def test_reroller_durations(text: str) -> None:
    seconds = views.parse_duration(text)
    assert seconds is None or (math.isfinite(seconds) and seconds >= 0)


@FUZZ
@given(text=st.one_of(nasty_text, st.builds(
    lambda zone, cron, duration: json.dumps({"timezone": zone, "windows": [{"cron": cron, "duration": duration}]}),
    st.sampled_from(["UTC", "Europe/Berlin", "Nope/Zone", "", "../../etc/passwd"]),
    st.sampled_from(["0 0 31 2 *", "0 0 30 2 *", "* * * * *", "0 3 * * 1-5", "*/0 * * * *", "60 * * * *",
                     "0 0 29 2 1", "@yearly", "0 0 L * *"]),
    st.sampled_from(["30m", "1h", "24h", "0s", "9" * 50 + "h", "1m"]))))
def test_reroller_restart_windows(text: str) -> None:
    started = time.perf_counter()
    try:
        window = windows.parse_window(text)
    except ValueError as refused:
        assert str(refused)
    else:
        try:
            windows.is_open(window, NOW)
            windows.next_opening(window, NOW)
        except (ValueError, KeyError, OverflowError):
            pass  # what ``hold`` refuses as "invalid restart window" (a cron that never fires in reach)
    bounded(started)


@FUZZ
@given(text=nasty_text)
def test_reroller_observed_sources(text: str) -> None:
    _, per_source = plans.parse_observed({OBSERVED_HASH: text, OBSERVED_SOURCES: text})
    assert isinstance(per_source, dict)


@FUZZ
@given(text=nasty_text)
def test_reroller_label_selectors(text: str) -> None:
    try:
        parse_selector(text)
    except ValueError as refused:
        assert str(refused)


# --- Copyrator ---------------------------------------------------------------------------------------

@FUZZ
@given(push_to=st.one_of(st.none(), nasty_text), matching=st.one_of(st.none(), nasty_text),
       allowed=st.one_of(st.none(), nasty_text), accept=st.one_of(st.none(), nasty_text))
def test_copyrator_annotations(push_to: str | None, matching: str | None, allowed: str | None,
                               accept: str | None) -> None:
    annotations = {key: value for key, value in ((copyrator.PUSH_TO_ANNOTATION, push_to),
                                                 (copyrator.PUSH_TO_MATCHING_ANNOTATION, matching),
                                                 (copyrator.ALLOWED_NAMESPACES_ANNOTATION, allowed))
                   if value is not None}
    source = {"kind": "ConfigMap", "metadata": {"name": "s", "namespace": "ns", "annotations": annotations}}
    rule = copyrator.push_rule(source)
    assert rule is None or isinstance(rule, copyrator.Rule | copyrator.RuleError)
    patterns = copyrator.consent(source)
    if patterns is not None:
        copyrator.consent_allows(patterns, "team-a")
    namespace = {"metadata": {"name": "ns", "annotations": {} if accept is None else
                              {copyrator.ACCEPT_FROM_ANNOTATION: accept}}}
    info = copyrator.namespace_info(namespace)
    assert info.accept_from is None or all(isinstance(item, str) for item in info.accept_from)


RULE_FIELDS = ["ruleType", "selector", "namespace", "targetNamespaces", "namespaceSelector", "excludedNamespaces",
               "stripLabels", "stripAnnotations", "copyAnnotations", "target", "keys", "renameKeys"]


@FUZZ
@given(fields=st.fixed_dictionaries({"ruleType": st.sampled_from(["configmap", "secret"]),
                                     "selector": st.just({"app": "x"}), "namespace": st.just("ns")},
                                    optional={field: json_value for field in RULE_FIELDS[3:]}))
def test_copyrator_rule_fields(fields: dict[str, Any]) -> None:
    started = time.perf_counter()
    try:
        rule = copyrator.parse_rule({"metadata": {"name": "r", "namespace": "ns"}, "spec": fields})
    except copyrator.RuleError as refused:
        assert str(refused)
    else:
        copyrator.copy_name(rule, "source")
    bounded(started)


# --- Blackadder (a TenantChaosAgent's spec, within what its schema admits) ----------------------------

hhmm = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.integers(0, 59))
weekday = st.sampled_from(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"])
label_text = st.text(alphabet="abcXYZ019._-", max_size=63)


@FUZZ
@given(eagerness=st.integers(0, 100), include=nasty_text, exclude=nasty_text,
       time_zone=st.one_of(nasty_text.map(lambda text: text[:64]),  # the schema's maxLength
                           st.sampled_from(["UTC", "Europe/Berlin", "Etc/GMT+14"])),
       active=st.lists(st.fixed_dictionaries({"from": hhmm, "to": hhmm},
                                             optional={"weekdays": st.lists(weekday, max_size=7)}), max_size=4),
       pause=huge_int, age=huge_int, duration=nasty_text, max_actions=st.integers(0, 10**12))
def test_blackadder_tenant_spec(eagerness: int, include: str, exclude: str, time_zone: str,
                                active: list[dict[str, Any]], pause: int, age: int, duration: str,
                                max_actions: int) -> None:
    started = time.perf_counter()
    spec = {"eagerness": eagerness, "podNames": {"include": include, "exclude": exclude}, "timeZone": time_zone,
            "activeWindows": active, "pauseDuration": pause, "minPodAgeSeconds": age, "duration": duration,
            "maxActions": max_actions}
    agent = settings_from_spec(spec)
    problem = decisions.spec_problem(agent)
    if problem is None:
        targets.pod_name_allowed("a" * 40, agent)
        if active:
            decisions.in_windows(agent.windows, agent.time_zone, NOW)
            decisions.next_window_start(agent.windows, agent.time_zone, NOW)
    game = steady.game_day_from_spec(spec)
    assert game.duration is None or game.duration >= 0
    bounded(started)


@FUZZ
@given(mtbf=label_text, mode=label_text, value=label_text)
def test_blackadder_frequency_labels(mtbf: str, mode: str, value: str) -> None:
    frequency, problem = targets.parse_frequency(mtbf, mode, value)
    assert (frequency is None) != (problem is None)
