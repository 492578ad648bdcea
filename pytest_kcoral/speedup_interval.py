"""How sure a speedup is: its confidence interval, and whether it is too wide to trust (noisy).

An item's speedup is the median, over the pairs of timing rounds taken in turns, of the baseline
round's median over the candidate round's (``combine.paired_speedup``). Each such ratio is
one draw of the same measurement, so the interval is the median's distribution-free one: two
order statistics of the ratios, their ranks from the binomial distribution (``speedup_interval``).
An item timed in several pairs of processes takes the median pair's speedup
(``combine.median_pair``); its interval comes from a bootstrap that resamples processes,
then rounds (``processes_interval``), since a process's speed is shared by all its rounds.

Parent side only: it reads the rounds the children sent and decides nothing about them.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from pathlib import Path

from pytest_kcoral import combine
from pytest_kcoral.results import ItemResult, TimingStats
from pytest_kcoral.timing_flags import Flag, has

CI_LEVEL = 0.95
# A speedup whose interval reaches more than this far from it (either way, as a share of it) is
# noisy: a 5% move is what a --kcoral-compare-fail gate is typically set to catch, and what
# ``combine.DISTURBED_PAIR_SLACK`` treats as a disturbed pair of rounds.
NOISY_HALF_WIDTH = 0.05
# Bootstrap draws for an item timed in several pairs of processes: the 2.5% tail then rests on 50
# draws. The seed is fixed, so a result file is reproduced exactly from the same rounds.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20260131


def order_statistic_ranks(n: int, level: float = CI_LEVEL) -> tuple[int, int] | None:
    """1-based ranks ``(k, n + 1 - k)`` of the order statistics that bracket the median of ``n``
    independent draws with probability at least ``level``, as narrow as that allows; None when
    even the smallest and the largest do not (for 0.95, fewer than 6 draws).

    The true median lies below the k-th smallest draw only when fewer than k draws fall below
    it, which happens with probability ``P(Binomial(n, 1/2) <= k - 1)``; the same holds above.
    This needs no assumption on the draws' distribution."""
    if n < 1 or not 0 < level < 1:
        return None
    tail = (1 - level) / 2
    cumulative = 0.0
    k = 0
    for below in range(n + 1):  # the largest k whose lower tail P(X <= k-1) stays within ``tail``
        cumulative += math.comb(n, below) / 2 ** n
        if cumulative > tail + 1e-12:
            break
        k = below + 1
    if k < 1:
        return None
    return k, n + 1 - k


def speedup_interval(ratios: Sequence[float], level: float = CI_LEVEL) -> tuple[float, float] | None:
    """The ``level`` confidence interval of the median of ``ratios`` (one per pair of timing
    rounds taken in turns: the baseline round's median over the candidate round's), from their
    order statistics (``order_statistic_ranks``); None when there are too few ratios (fewer than 6
    at 0.95) or a bound is not a finite positive number. It always contains the median as
    ``combine.median_ratio`` reads it. Pure, so a stopping rule can call it after every round."""
    ranks = order_statistic_ranks(len(ratios), level)
    if ranks is None:
        return None
    ordered = sorted(ratios)
    low, high = ordered[ranks[0] - 1], ordered[ranks[1] - 1]
    if not (0 < low <= high and math.isfinite(high)):
        return None
    return low, high


def processes_interval(ratios_by_pair: Sequence[Sequence[float]], level: float = CI_LEVEL,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """The ``level`` interval of an item timed in several pairs of processes, whose speedup is the
    median pair's (the lower middle one for an even count) of each pair's median ratio. A
    percentile bootstrap over both levels: draw the pairs with replacement, then each drawn
    pair's ratios with replacement, and take the same median of medians; the fixed ``seed`` makes
    it reproducible. Resampling processes first keeps what rounds cannot show: a process can run
    slower than another for seconds, and all of its rounds with it (docs/performance.md, "The
    level changes within a process, in time"). None when a pair has no ratio or a bound is not finite and positive; widened to hold
    the point speedup should the percentiles miss it."""
    pairs = [sorted(r) for r in ratios_by_pair]
    if not pairs or any(not r for r in pairs):
        return None
    if len(pairs) == 1:
        return speedup_interval(pairs[0], level)
    rng = random.Random(seed)

    def median_of_pairs(medians: list[float]) -> float:
        return sorted(medians)[(len(medians) - 1) // 2]

    point = median_of_pairs([combine.median_ratio(r) for r in pairs])
    draws = []
    for _ in range(resamples):
        chosen = rng.choices(pairs, k=len(pairs))
        draws.append(median_of_pairs([combine.median_ratio(rng.choices(r, k=len(r))) for r in chosen]))
    draws.sort()
    tail = (1 - level) / 2
    low = draws[max(0, math.floor(tail * resamples))]
    high = draws[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    low, high = min(low, point), max(high, point)
    if not (0 < low <= high and math.isfinite(high)):
        return None
    return low, high


def item_interval(pairs: Sequence[combine.ProcessPair], candidate: TimingStats, speedup: float | None,
                  level: float = CI_LEVEL) -> tuple[float, float] | None:
    """The interval of an item's ``speedup`` (``combine.item_speedup`` of the same ``pairs`` and
    ``candidate`` figures), scaled as that speedup is when work outside the windows was charged
    to the candidate. None without a speedup, where the speedup is not the paired one (the
    candidate's rounds read 0 us), or with too few rounds (``speedup_interval``)."""
    if speedup is None or not pairs:
        return None
    ratios = [combine.round_ratios(p.baseline, p.candidate) for p in pairs]
    try:
        paired = pairs[combine.median_pair(pairs)].speedup()
    except ValueError:
        return None
    uncharged_us = candidate.median_us - candidate.charged_us
    if not math.isfinite(paired) or uncharged_us <= 0 or candidate.median_us <= 0:
        return None
    interval = processes_interval(ratios, level)
    if interval is None:
        return None
    scale = uncharged_us / candidate.median_us
    return interval[0] * scale, interval[1] * scale


def mean_of_intervals(intervals: Sequence[Sequence[float] | None]) -> list[float] | None:
    """``[mean of the lows, mean of the highs]`` of several items' intervals: where their mean
    speedup lies if every item's speedup lies in its interval. None when there are none, or one
    is missing. Not an interval at a level: all k items' intervals hold together with probability
    at least 1 - k x 5% only (more when their errors are independent and partly cancel)."""
    present = [i for i in intervals if i]
    if not intervals or len(present) < len(intervals):
        return None
    return [sum(i[0] for i in present) / len(present), sum(i[1] for i in present) / len(present)]


def relative_half_width(interval: Sequence[float], speedup: float) -> float:
    """How far the interval reaches from the speedup, as a share of it, on its wider side."""
    return max(interval[1] / speedup - 1, 1 - interval[0] / speedup)


def fmt_interval(interval: Sequence[float] | None, speedup: float | None) -> str:
    """``±0.8%`` (the wider side, ``relative_half_width``) for a narrow interval, ``(0.42-0.85x)``
    for one reaching 10% or more, ``±?`` without one, ``""`` without a speedup."""
    if speedup is None or speedup <= 0:
        return ""
    if not interval:
        return "±?"
    width = relative_half_width(interval, speedup) * 100
    if width < 10:
        return f"±{width:.1f}%"
    return f"({_fmt_ratio(interval[0])}-{_fmt_ratio(interval[1])}x)"


def _fmt_ratio(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 else f"{value:.2g}"  # as ``report.fmt_speedup``, without its x


_TRITON_IMPORT = re.compile(r"^\s*(import\s+triton|from\s+triton[\s.])", re.MULTILINE)


def uses_triton(candidate_path: str | Path | None) -> bool:
    """Whether a candidate's source imports Triton (read as text, never imported)."""
    if candidate_path is None:
        return False
    try:
        return bool(_TRITON_IMPORT.search(Path(candidate_path).read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return False


def noise_causes(result: ItemResult, *, interpreted_triton: bool = False) -> list[str]:
    """What the item's record says made its timing noisy, one short clause each."""
    causes = []
    sides = {side: TimingStats.from_dict(getattr(result, f"{side}_timing")) for side in combine.SIDES}
    if result.timer == "wall":
        causes.append("wall-clock timing")
    if interpreted_triton:
        causes.append("Triton's CPU interpreter")
    candidate = sides["candidate"]
    if candidate is not None and candidate.rounds_dropped:
        causes.append(f"{candidate.rounds_dropped}/{candidate.rounds} round pairs dropped (the host slowed one side)")
    missed = [side for side, s in sides.items() if s is not None and has(s.flags, Flag.RSE_TARGET_MISSED)]
    if missed:
        causes.append(f"rse target missed ({', '.join(missed)})")
    if any(combine.host_set_side(getattr(result, f"{side}_timing") or {}) for side in combine.SIDES):
        causes.append("host-set (the GPU idled between launches)")
    if candidate is not None and candidate.processes > 1:
        causes.append(f"{candidate.processes} pairs of processes")
    return causes


def record_interval(result: ItemResult, pairs: Sequence[combine.ProcessPair], candidate: TimingStats,
                    candidate_path: str | Path | None = None, device_kind: str | None = None) -> None:
    """Set the item's ``speedup_ci`` (and its level), ``noisy`` and ``noisy_reason`` from its
    timing rounds; the speedup must be set already (``combine.item_speedup``)."""
    if result.speedup is None:
        return
    interval = item_interval(pairs, candidate, result.speedup)
    result.speedup_ci = list(interval) if interval is not None else None
    result.speedup_ci_level = CI_LEVEL if interval is not None else None
    rounds = min((len(combine.round_ratios(p.baseline, p.candidate)) for p in pairs), default=0)
    result.noisy, result.noisy_reason = judge_noise(
        result, interpreted_triton=device_kind == "cpu" and uses_triton(candidate_path), rounds=rounds)


def judge_noise(result: ItemResult, *, interpreted_triton: bool = False, rounds: int | None = None) -> tuple[bool, str | None]:
    """``(noisy, reason)`` for an item with a speedup: noisy when its interval reaches more than
    ``NOISY_HALF_WIDTH`` from it, or when it has none. The reason is one line: what in the item's
    record made its timing noisy (``noise_causes``), after why there is no interval if so."""
    if result.speedup is None:
        return False, None
    ci = result.speedup_ci
    head = ""
    if ci:
        if relative_half_width(ci, result.speedup) <= NOISY_HALF_WIDTH:
            return False, None
    elif rounds is not None and rounds < order_statistic_minimum():
        head = f"no interval from {rounds} round pair{'s' if rounds != 1 else ''} ({order_statistic_minimum()} needed): "
    else:
        head = "no interval (the candidate's rounds read 0 us): "
    causes = noise_causes(result, interpreted_triton=interpreted_triton)
    return True, head + ("; ".join(causes) if causes else "the round pairs' ratios spread (the host's speed varied)")


def order_statistic_minimum(level: float = CI_LEVEL) -> int:
    """The fewest ratios ``speedup_interval`` needs at ``level`` (6 at 0.95)."""
    n = 1
    while order_statistic_ranks(n, level) is None:
        n += 1
    return n
