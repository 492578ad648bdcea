"""Order statistics for timing samples: median, IQR and the relative standard error of the median.

The stopping rule needs the uncertainty of the median, not of the mean: kernel timings have a
long right tail (clock ramps, preemption, another process on the GPU), so the mean's standard
error over-reacts to a few outliers. The distribution-free estimate used here comes from the
binomial confidence interval of the median: with ``n`` samples the order statistics at ranks
``n/2 -+ z*sqrt(n)/2`` bracket the true median with probability ~95% (``z = 1.96``), so half that
interval divided by ``z`` is a standard error. It needs no resampling and is cheap enough to check
after every few samples.
"""

from __future__ import annotations

import math
from typing import Sequence

_Z95 = 1.959964


def median(sorted_values: Sequence[float]) -> float:
    n = len(sorted_values)
    if n == 0:
        return float("nan")
    mid = n // 2
    if n % 2:
        return float(sorted_values[mid])
    return (sorted_values[mid - 1] + sorted_values[mid]) / 2.0


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default) of already sorted values."""
    n = len(sorted_values)
    if n == 0:
        return float("nan")
    pos = q * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] * (1.0 - frac) + sorted_values[hi] * frac


def iqr(sorted_values: Sequence[float]) -> float:
    return quantile(sorted_values, 0.75) - quantile(sorted_values, 0.25)


def rse_of_median(sorted_values: Sequence[float]) -> float:
    """Relative standard error of the median (order-statistics estimate); inf with < 2 samples."""
    n = len(sorted_values)
    if n < 2:
        return math.inf
    m = median(sorted_values)
    if m <= 0:
        return 0.0 if sorted_values[-1] == sorted_values[0] else math.inf
    half_width = _Z95 * math.sqrt(n) / 2.0
    lo = max(0, int(math.floor(n / 2.0 - half_width)))
    hi = min(n - 1, int(math.ceil(n / 2.0 + half_width)) - 1)
    se = (sorted_values[hi] - sorted_values[lo]) / (2.0 * _Z95)
    return se / m
