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
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

_Z95 = 1.959964
# The relative standard error of the median a callable's samples aim for (``timing.measure``).
RSE_TARGET = 0.005
# Samples this close count as one step: CUPTI durations on one 32 ns step of an H200's timer come
# out up to 1 ns apart (1.151 and 1.152 us).
SAME_STEP_US = 0.0025


def median(sorted_values: Sequence[float]) -> float:
    n = len(sorted_values)
    if n == 0:
        return float("nan")
    mid = n // 2
    if n % 2:
        return float(sorted_values[mid])
    return (sorted_values[mid - 1] + sorted_values[mid]) / 2.0


def grouped_median(sorted_values: Sequence[float], same_step_us: float = SAME_STEP_US) -> float:
    """The median, placed within its step when the samples come in steps.

    A GPU timer's samples come in steps: CUPTI's timestamps advance in 32 ns on an H200, so a
    kernel of about 1.04 us reads 1.024 or 1.056 us. The plain median then jumps a whole step (3%)
    when the share of samples below the middle crosses one half, and two runs of one kernel can
    land on different steps. The median of grouped data (the textbook ``L + (n/2 - F) / f * w``:
    ``F`` samples below the median's step, ``f`` on it, ``w`` its width, ``L`` its lower edge) moves
    smoothly with that share. The step's width is the gap to the nearest other value; samples
    without ties (a continuous clock) give the plain median back.
    """
    n = len(sorted_values)
    m = median(sorted_values)
    if n < 3:
        return m
    lo = bisect_left(sorted_values, m - same_step_us)
    hi = bisect_right(sorted_values, m + same_step_us)
    on_step = hi - lo
    if on_step < 2:
        return m
    gaps = []
    if lo > 0:
        gaps.append(sorted_values[lo] - sorted_values[lo - 1])
    if hi < n:
        gaps.append(sorted_values[hi] - sorted_values[hi - 1])
    if not gaps:  # every sample on one step
        return m
    width = min(gaps)
    centre = (sorted_values[lo] + sorted_values[hi - 1]) / 2.0
    return centre - width / 2.0 + width * (n / 2.0 - lo) / on_step


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
