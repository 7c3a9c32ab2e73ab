"""The soak's report (bench/soak.py): slopes, spans of one role past the warm-up, the verdicts."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from bench import soak


def sample(t: float, rss_kb: float, entries: int, acting: bool = True, uptime: float | None = None) -> dict[str, Any]:
    return {"time": t, "uptime_s": t if uptime is None else uptime, "acting": acting, "rss_kb": rss_kb,
            "heap": {"traced_bytes": 1000, "growers_since_start": []}, "tasks": {"total": 50}, "fds": 20,
            "sockets": 10, "indexes": {"pods": {"keys": 30, "values": 30}},
            "controllers": {"immortal": {"answers": entries}}, "metric_series": {"kopf_operators_actions": 5}}


def test_least_squares_is_the_slope() -> None:
    assert soak.least_squares([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2)
    assert soak.least_squares([(0, 1)]) == 0


def test_a_count_that_grows_with_time_is_told_from_one_that_moves_with_live_objects() -> None:
    samples = [sample(60.0 * i, 80_000, 30 + (i % 2) * 2) for i in range(3, 13)]
    steady = soak.spans(samples, 0, 10_000)[0]["series"]
    assert not steady["state.immortal.answers"]["grows"]
    leaking = [sample(60.0 * i, 80_000 + 100 * i, 30 + 5 * i) for i in range(3, 13)]
    span = soak.spans(leaking, 0, 10_000)[0]
    assert span["series"]["state.immortal.answers"]["grows"]
    assert span["series"]["rss_kb"]["slope_per_hour"] == pytest.approx(6000)  # 100 kB a minute


def test_spans_skip_the_warm_up_and_cut_where_the_role_changes() -> None:
    samples = [sample(60.0 * i, 80_000, 30, acting=i >= 6) for i in range(12)]
    got = [(s["role"], s["samples"]) for s in soak.spans(samples, 0, 10_000)]
    assert got == [("standby", 4), ("acting", 6)]  # minutes 0 and 1: warm-up


def test_the_verdicts_judge_the_longest_acting_span() -> None:
    flat = soak.spans([sample(60.0 * i, 80_000, 30) for i in range(3, 13)], 0, 10_000)
    report = {"processes": {"a-1": {"spans": flat}},
              "reactions": {"immortal": {"p99_ratio": 1.1}, "copyrator": {"p99_ratio": None}},
              "log_problems": ["a.log: [2026-11-28 21:00:00,000] x [WARNING ] y"]}
    v = soak.verdicts(report)
    assert v["rss_slope_mb_per_hour"]["pass"] and v["counts_growing_with_time"]["pass"]
    assert v["p99_last_vs_first"]["pass"] and v["errors"]["pass"]  # a warning is listed, not an error
    assert v["judged"].startswith("a-1 (acting)")


def test_log_problems_are_those_of_the_churn(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("[2026-11-28 21:00:00,000] k [ERROR   ] before\n"
                   "[2026-11-28 21:05:00,000] k [WARNING ] during\n"
                   "[2026-11-28 21:05:01,000] k [INFO    ] fine\n"
                   "[2026-11-28 21:06:00,000] k [ERROR   ] crash\nTraceback (most recent call last):\n  boom\n")
    at = datetime.datetime(2026, 11, 28, 21, 1).timestamp()
    found = soak.log_problems([log], at, at + 600)
    assert [f.splitlines()[0].rsplit(" ", 1)[-1] for f in found] == ["during", "crash"]
    assert "boom" in found[1]


def test_a_reaction_held_up_by_a_diagnostics_sample_is_told_apart() -> None:
    probes = [(100.0, 800.0)]  # a sample ending at t=100 s that held the loop for 0.8 s
    assert soak.probed(probes, 99.5, 99.9) == 800.0
    assert soak.probed(probes, 99.0, 99.1) is None  # ended before the walk began
    assert soak.probed(probes, 100.2, 100.4) is None  # began after it
    timed = [(30.0, 0.02, None), (50.0, 0.9, 800.0), (570.0, 0.02, None), (580.0, 0.03, None)]
    assert soak.edges(timed, 600, 60)["first"]["p99_ms"] == pytest.approx(900, rel=0.05)
    outside = soak.edges([x for x in timed if x[2] is None], 600, 60)
    assert outside["first"]["p99_ms"] == pytest.approx(20) and outside["p99_ratio"] > 1


def test_the_p99_target_is_judged_outside_the_samples() -> None:
    flat = soak.spans([sample(60.0 * i, 80_000, 30) for i in range(3, 13)], 0, 10_000)
    outside: dict[str, Any] = {"p99_ratio": 0.9}
    report = {"processes": {"a-1": {"spans": flat}}, "log_problems": [],
              "reactions": {"copyrator": {"p99_ratio": 1.75, "outside_samples": outside}}}
    v = soak.verdicts(report)["p99_last_vs_first"]
    assert v["pass"] and v["value"]["all"] == {"copyrator": 1.75}
    outside["p99_ratio"] = 1.3
    assert not soak.verdicts(report)["p99_last_vs_first"]["pass"]


def test_a_span_too_short_for_a_slope_is_not_judged() -> None:
    """A --quick run's spans (a few samples after a takeover) cannot tell 1 MB/h from noise: not judged."""
    short = soak.spans([sample(60.0 * i, 80_000 + 1000 * i, 30) for i in range(3, 7)], 0, 10_000)
    report = {"processes": {"b-1": {"spans": short, "samples": 4, "minutes": 3.0}}, "log_problems": [],
              "reactions": {"immortal": {"first": {}, "last": {}, "events": 0, "p99_ratio": 1.0}}}
    v = soak.verdicts(report)
    assert v["rss_slope_mb_per_hour"]["pass"] is None and v["counts_growing_with_time"]["pass"] is None
    assert v["rss_slope_mb_per_hour"]["value"] > 1  # still said, for the reader
    assert "NOT JUDGED" in soak.render({"meta": {"run": "r", "minutes": 10, "quick": True, "rates": {},
                                                  "date": "d", "window_minutes": 8, "edge_minutes": 2,
                                                  "warm_up_s": 120}, "churn": {}, "takeovers": [],
                                         "churn_failures": [], **report})
