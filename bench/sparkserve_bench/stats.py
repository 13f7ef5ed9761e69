"""Small statistics: percentiles by linear interpolation, summaries, the geometric mean."""

from __future__ import annotations

import math
from typing import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of values, interpolating between the closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return float(sum(values)) / len(values)


def summary(values: Iterable[float]) -> dict[str, float | int] | None:
    """n, mean, min, p50, p90, p99 and max of values; None when there are none."""
    data = [float(v) for v in values]
    if not data:
        return None
    return {"n": len(data), "mean": mean(data), "min": min(data), "p50": percentile(data, 50),
            "p90": percentile(data, 90), "p99": percentile(data, 99), "max": max(data)}


def geometric_mean(values: Sequence[float]) -> float:
    if not values or any(v <= 0 for v in values):
        raise ValueError("geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def reduce(values: Sequence[float], statistic: str) -> float:
    """One number from the runs of a block: median, mean or max."""
    if statistic == "median":
        return median(values)
    if statistic == "mean":
        return mean(values)
    if statistic == "max":
        return float(max(values))
    raise ValueError("unknown statistic %r" % statistic)
