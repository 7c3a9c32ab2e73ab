"""The figures' arithmetic, one definition for every benchmark (``make bench`` and ``make reloader-bench``).

Percentiles are nearest-rank: the smallest sample with at least q of the samples at or below it
(``sorted(v)[ceil(q*n) - 1]``). Every reported percentile is a latency that was actually measured, and
p50 of an even count is the lower middle sample (not the mean of the two, as ``statistics.median`` gives).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``0 < q <= 1`` (q=0.5: p50)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary_ms(values: Sequence[float], quantiles: Sequence[float] = (0.5, 0.99)) -> dict[str, Any]:
    """Seconds in, milliseconds out: n, p<q> for each quantile, max and min (rounded to 0.1 ms)."""
    ms = [v * 1000 for v in values]
    return {"n": len(ms), **{f"p{round(q * 100)}_ms": round(percentile(ms, q), 1) for q in quantiles},
            "max_ms": round(max(ms), 1), "min_ms": round(min(ms), 1)}
