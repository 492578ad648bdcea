"""How one item's timing rounds become its figures: which rounds and processes set each side's
time, and what a candidate is charged for work it moved outside its timing windows.

An item's two callables (baseline and candidate) are timed in turns, in rounds, each side in a
process of its own (``LocalExecutor._time``): ``undisturbed_pairs`` says which pairs of rounds the
host left alone, ``combine_rounds`` makes one side's figures from them, ``paired_speedup`` reads
the speedup from the rounds taken in turns, and ``charge_outside_work`` compares the time both
sides spent between their windows. An item the host's speed sets
(``host_set_side``) is timed again in fresh pairs of processes, since a launch-bound chain runs at
the speed of the process it runs in, and ``combine_processes`` takes the median pair's figures.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kcoral.messages import TimedOutput
from pytest_kcoral.results import TimingStats, speedup_between
from pytest_kcoral.timing import stats
from pytest_kcoral.timing.stats import RSE_TARGET
from pytest_kcoral.timing_flags import Flag, flag, has, kind_of

# A candidate's calls may spend this much more host time outside their windows than the baseline's
# (the same harness on both sides: input refresh, L2 flush, output drop and check) before the
# excess is charged to it: beyond the noise of two processes on one host, it is work moved where
# it is not timed (docs/performance.md, "Time outside the timing windows").
OUTSIDE_SLACK_US = 50.0
# of the baseline's own time outside its windows, by timing method: honest code stays well within
# it on a GPU; on a CPU a long call leaves the host's caches cold for the refresh that follows.
OUTSIDE_SLACK_FRACTION = {"cupti": 1.0, "events": 1.0, "wall": 3.0}
# and, by timing method, of the candidate's own time in its windows (its median before any
# charge): on a CPU the cold caches a long call leaves behind grow with the call (docs/performance.md,
# "an honest CPU item charged on the loaded CI machine"). A cheat that moves part of its work out of
# its windows keeps at most this share of its own time uncharged.
OUTSIDE_SLACK_OF_CALL = {"wall": 0.1}


def charge_outside_work(baseline_rounds: Sequence[TimingStats], candidate_rounds: Sequence[TimingStats],
                        candidate: TimingStats, keep: Sequence[int] | None = None) -> float:
    """Charge the candidate (its combined figures, ``candidate``) for host time spent outside its
    timing windows beyond the baseline's and the slack (``OUTSIDE_SLACK_US`` plus
    ``OUTSIDE_SLACK_FRACTION`` of the baseline's and ``OUTSIDE_SLACK_OF_CALL`` of the candidate's
    own median, by timing method): work done in a replaced input refresh, a finalizer that fires
    when an output is dropped, anything else between windows. Judged pair by pair of rounds taken
    in turns (those in ``keep``; None: all), by the median pair, so that one round the host
    disturbed decides nothing. The excess over the slack is added to the candidate's figures,
    recorded as its ``charged_us`` and flagged; returns it in microseconds (0.0: nothing charged)."""
    pairs = [(b.outside_us, c.outside_us) for r, (b, c) in enumerate(zip(baseline_rounds, candidate_rounds))
             if (keep is None or r in keep) and b.outside_us is not None and c.outside_us is not None]
    if not pairs:
        return 0.0
    base_us = stats.median(sorted(b for b, _ in pairs))
    cand_us = stats.median(sorted(c for _, c in pairs))
    slack = (OUTSIDE_SLACK_US + OUTSIDE_SLACK_FRACTION.get(candidate.method, 3.0) * max(0.0, base_us)
             + OUTSIDE_SLACK_OF_CALL.get(candidate.method, 0.0) * max(0.0, candidate.median_us))
    excess = stats.median(sorted(c - b for b, c in pairs)) - slack
    if excess <= 0:
        return 0.0
    candidate.median_us += excess
    candidate.min_us += excess
    candidate.charged_us = excess
    candidate.flags.append(flag(
        Flag.OUTSIDE_WINDOW_EXCESS_US, f"{excess:.1f}",
        f"the candidate's calls spent {cand_us:.1f} us each outside their timing windows, the baseline's {base_us:.1f} us"
        f" (slack {slack:.1f} us): work done where it is not timed (in the input refresh, when an output is dropped, ...) is charged to it"))
    return excess


# A pair of rounds (one of each side, taken in turns, adjacent in time) was disturbed when its ratio
# of medians lies more than this from the median of the pairs' ratios: a launch-bound chain can
# switch speed within one process only (docs/performance.md, "The level changes within a process,
# in time"), while undisturbed pairs agree within a CUPTI step or two.
DISTURBED_PAIR_SLACK = 0.05


def undisturbed_pairs(first: Sequence[TimingStats], second: Sequence[TimingStats]) -> list[int]:
    """Indices ``r`` of the round pairs ``first[r]``, ``second[r]`` (two callables timed in turns,
    ``LocalExecutor._time``) to keep: both timed, and their ratio of medians within
    ``DISTURBED_PAIR_SLACK`` of the median ratio (``median_ratio``: for an even count the
    geometric mean of the middle two, so the window is the same whichever side is ``first``; the
    lower middle one kept a high ratio's round less readily than a low one's). Where none lies that close (the middle two over 10% apart), the middle two.

    A slowdown of the whole host hits both rounds of a pair and leaves its ratio alone; one that
    hits one process only moves that pair's ratio, and the pair is left out. The median pair
    decides, so a single round, fast or slow, cannot set a speedup. Raises ``ValueError`` when no
    pair was timed on both sides."""
    timed = [r for r in range(min(len(first), len(second)))
             if first[r].samples_us and second[r].samples_us and first[r].median_us > 0 and second[r].median_us > 0]
    if not timed:
        raise ValueError("no pair of timing rounds has samples on both sides")
    ratios = {r: first[r].median_us / second[r].median_us for r in timed}
    typical = median_ratio(list(ratios.values()))
    distance = {r: abs(math.log(ratios[r] / typical)) for r in timed}
    kept = [r for r in timed if distance[r] <= math.log1p(DISTURBED_PAIR_SLACK)]
    if kept:
        return kept
    nearest = min(distance.values())
    return [r for r in timed if math.isclose(distance[r], nearest, rel_tol=1e-9)]  # the middle two, as far from it


def median_ratio(ratios: Sequence[float]) -> float:
    """The median of ratios, each side's figure over the other's: for an even count the geometric
    mean of the middle two, so that the median of the inverted ratios is its inverse (the lower
    middle one reads a few tenths of a percent low every time, with 32 rounds). A ratio may be 0
    or infinite (a side that read 0 us): then the middle one that is not."""
    ordered = sorted(ratios)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return math.sqrt(low * high) if low > 0 and math.isfinite(high) else (low if low == 0 else high)


def combine_rounds(rounds: Sequence[TimingStats], rse_target: float = RSE_TARGET, keep: Sequence[int] | None = None,
                   set_aside: Sequence[int] = ()) -> TimingStats:
    """One callable's figures from several timing rounds, interleaved in time with the rounds of the
    callable it is compared with (see ``LocalExecutor._time``): the statistics of the samples of
    the rounds in ``keep`` together (``undisturbed_pairs``; None: every round). Raises
    ``ValueError`` when the rounds were timed by different methods or none kept has samples.

    The figures come from the kept rounds; what the callable did (its flags, ``host_bound``,
    ``same_work_every_call``) from every round. ``rounds_dropped`` and a flag say what was left
    out; ``round_medians_us`` keeps every round's median, so the choice can be checked. Rounds in
    ``set_aside`` (those of the other pairs of processes, ``combine_processes``) are neither kept
    nor counted as dropped."""
    if not rounds:
        raise ValueError("no timing rounds to combine")
    methods = sorted({r.method for r in rounds})
    if len(methods) > 1:
        raise ValueError(f"timing rounds used different methods: {', '.join(methods)}")
    kept = [r for i, r in enumerate(rounds) if (keep is None or i in keep) and i not in set_aside and r.samples_us]
    samples = [t for r in kept for t in r.samples_us or []]
    if not samples:
        raise ValueError("timing rounds returned no samples")
    ordered = sorted(samples)
    rse = stats.rse_of_median(ordered)
    flags: list[str] = []
    seen_kinds: set[str] = set()
    for text in (f for r in rounds for f in r.flags):
        kind = kind_of(text)
        # one of each kind, from every round, left out or not (a per-round figure, such as the
        # events bias, is shown from the first round); the convergence verdict is recomputed below
        # from the kept samples
        if kind in seen_kinds or kind == Flag.RSE_TARGET_MISSED.value:
            continue
        seen_kinds.add(kind)
        flags.append(text)
    dropped = sum(1 for i, r in enumerate(rounds) if r.samples_us and keep is not None and i not in keep and i not in set_aside)
    if dropped:
        flags.append(flag(Flag.ROUNDS_DROPPED, f"{dropped}/{len(rounds)}", "against the other side's rounds taken in turn with them, their"
                          f" ratio lay over {DISTURBED_PAIR_SLACK:.0%} from the median ratio: the host slowed one side while they ran"))
    if not rse < rse_target:
        flags.append(flag(Flag.RSE_TARGET_MISSED, note=f"{rse:.4f} >= {rse_target} after {len(samples)} samples in {len(kept)} rounds"))

    def median_of(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else stats.median(sorted(values))  # type: ignore[arg-type]

    records = median_of([r.records for r in kept])
    same = [r.same_work_every_call for r in rounds]  # what the callable did: every round counts
    return TimingStats(
        method=methods[0],
        median_us=stats.grouped_median(ordered),
        iqr_us=stats.iqr(ordered),
        min_us=ordered[0],
        n=len(ordered),
        rse=rse if math.isfinite(rse) else 0.0,
        busy_us=median_of([r.busy_us for r in kept]),
        outside_us=median_of([r.outside_us for r in kept]),
        records=None if records is None else int(round(records)),
        host_median_us=median_of([r.host_median_us for r in kept]),
        host_bound=any(r.host_bound for r in rounds),
        same_work_every_call=None if any(v is None for v in same) else all(same),
        flags=flags,
        rounds=len(rounds),
        rounds_dropped=dropped,
        round_medians_us=[r.median_us for r in rounds],
        quantiles_us=sample_quantiles(ordered),
    )


# Quantiles a side's merged figures keep of its samples: enough to draw their distribution, and
# a bounded record (65 numbers a side) however many samples a GPU's budget takes.
QUANTILE_STEPS = 64


def sample_quantiles(ordered: Sequence[float], steps: int = QUANTILE_STEPS) -> list[float]:
    """The sorted samples at ``steps + 1`` evenly spaced ranks, first and last included (all of
    them, when there are no more), to four significant digits."""
    if len(ordered) <= steps + 1:
        picked = list(ordered)
    else:
        picked = [ordered[round(i * (len(ordered) - 1) / steps)] for i in range(steps + 1)]
    return [float(f"{v:.4g}") for v in picked]


# The GPU idle between launches for this share of a span or more: the host's speed sets part of
# it, and such items move between hosts where busier ones do not (docs/performance.md, "Which
# speedups the host sets: now marked").
HOST_GAP_FRACTION = 0.05
SIDES = ("baseline", "candidate")


def host_set_side(side: Mapping[str, Any]) -> bool:
    """Whether the host's speed sets part of one side's time (a ``TimingStats`` as a dict): the
    GPU sat idle between launches for ``HOST_GAP_FRACTION`` of the span or more (launch-bound
    calls, and multi-kernel calls with host work between their kernels), or the call was timed by
    the host clock."""
    if side.get("host_bound") or has(side.get("flags", []), Flag.LAUNCH_BOUND, Flag.HOST_BOUND):
        return True
    busy, span = side.get("busy_us"), side.get("median_us")
    return busy is not None and span is not None and bool(span) and busy < (1 - HOST_GAP_FRACTION) * span


@dataclass
class ProcessPair:
    """One pair of processes' timing rounds, taken in turns (``LocalExecutor._time_pair``): the
    baseline's and the candidate's, the timed outputs each candidate round kept, and the side
    whose round came first (then the other's twice, and so on)."""

    baseline: list[TimingStats] = field(default_factory=list)
    candidate: list[TimingStats] = field(default_factory=list)
    verify: list[list[TimedOutput]] = field(default_factory=list)
    first: str = "baseline"
    # one side's figures in this pair (``side_stats``) and its speedup (``speedup``), with the
    # number of rounds each was computed from: a pair asked early (``stage_timing.host_set``) goes on
    _stats: dict[str, tuple[tuple[int, int], TimingStats]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _speedup: tuple[tuple[int, int], float] | None = field(default=None, init=False, repr=False, compare=False)

    def rounds(self, side: str) -> list[TimingStats]:
        return self.baseline if side == "baseline" else self.candidate

    def kept(self) -> list[int] | None:
        """The rounds ``undisturbed_pairs`` keeps; None when it can pair none (a side without
        samples, which its ``combine_rounds`` then names, or a median of 0 us)."""
        try:
            return undisturbed_pairs(self.baseline, self.candidate)
        except ValueError:
            return None

    def side_stats(self, side: str) -> TimingStats:
        """``combine_rounds`` of ``side``'s rounds that ``kept`` keeps, computed once for the
        rounds taken so far (raises ``ValueError`` as it does)."""
        taken = len(self.candidate), len(self.baseline)
        cached = self._stats.get(side)
        if cached is None or cached[0] != taken:
            cached = self._stats[side] = (taken, combine_rounds(self.rounds(side), keep=self.kept()))
        return cached[1]

    def speedup(self) -> float:
        """``paired_speedup`` of the pair's rounds, computed once for the rounds taken so far, as
        ``side_stats`` is: both sides' figures are combined first, so that a side without samples
        raises ``ValueError`` naming it, as ``combine_rounds`` does."""
        taken = len(self.candidate), len(self.baseline)
        if self._speedup is None or self._speedup[0] != taken:
            for side in SIDES:
                self.side_stats(side)
            self._speedup = (taken, paired_speedup(self.baseline, self.candidate))
        return self._speedup[1]


def paired_speedup(baseline_rounds: Sequence[TimingStats], candidate_rounds: Sequence[TimingStats]) -> float:
    """The speedup read from rounds taken in turns: the median, over the pairs of rounds (one a
    side, adjacent in time, both with samples), of the baseline round's median over the candidate
    round's; for an even count the geometric mean of the middle two. A candidate round that read
    0 us (no GPU work in its windows) is infinitely fast, until ``charge_outside_work`` charges
    it. Raises ``ValueError`` when no pair of rounds has samples on both sides.

    Each ratio compares two rounds taken about 30 ms apart, so the host's speed, which moves a
    launch-bound chain from one round to the next, cancels in it; the ratio of the two sides'
    figures (the samples of every kept round pooled per side) leaves that drift in
    (docs/performance.md, "the speedup read pair by pair of rounds"). The middle of an even count
    is not the lower one, which reads low every time."""
    ratios = round_ratios(baseline_rounds, candidate_rounds)
    if not ratios:
        raise ValueError("no pair of timing rounds has samples on both sides")
    return median_ratio(ratios)


def round_ratios(baseline_rounds: Sequence[TimingStats], candidate_rounds: Sequence[TimingStats]) -> list[float]:
    """The ratios ``paired_speedup`` takes the median of, in time order: per pair of rounds taken in
    turns (both with samples), the baseline round's median over the candidate round's (infinite
    where the candidate's read 0 us). ``speedup_interval`` reads the speedup's interval from them."""
    ratios: list[float] = []
    for b, c in zip(baseline_rounds, candidate_rounds):
        if not (b.samples_us and c.samples_us) or (b.median_us <= 0 and c.median_us <= 0):
            continue
        ratios.append(math.inf if c.median_us <= 0 else b.median_us / c.median_us)
    return ratios


def pair_speedups(pairs: Sequence[ProcessPair]) -> list[float]:
    """Each pair's ``paired_speedup`` (``ProcessPair.speedup``)."""
    return [p.speedup() for p in pairs]


def item_speedup(pairs: Sequence[ProcessPair], baseline: TimingStats, candidate: TimingStats) -> float | None:
    """The item's speedup: the median pair's ``paired_speedup`` (``median_pair``), scaled down as
    ``charge_outside_work`` scaled the candidate's figures up (its ``charged_us`` added to
    ``candidate``'s median); None between unlike timing methods (``speedup_between``). Where the
    candidate's uncharged figure was 0 us, the ratio of the charged figures.

    It is not quite ``baseline.median_us / candidate.median_us``: those are each side's figures,
    the samples of its kept rounds pooled, and their ratio keeps the host's drift between rounds
    that the paired ratios cancel (``paired_speedup``)."""
    plain = speedup_between(baseline, candidate)
    if plain is None:
        return None
    paired = pairs[median_pair(pairs)].speedup()
    uncharged_us = candidate.median_us - candidate.charged_us
    if not math.isfinite(paired) or uncharged_us <= 0:
        return plain
    return paired * uncharged_us / candidate.median_us


def rounds_in_turns(pairs: Sequence[ProcessPair]) -> list[int]:
    """Indices, into the rounds of every pair one after another (the same on both sides), of the
    rounds taken in turns that ``undisturbed_pairs`` kept in each pair; every round of a pair
    whose rounds it could not pair (a side without samples, or a median of 0 us)."""
    indices: list[int] = []
    offset = 0
    for pair in pairs:
        kept = pair.kept()
        indices += [offset + r for r in (kept if kept is not None else range(len(pair.candidate)))]
        offset += len(pair.candidate)
    return indices


def median_pair(pairs: Sequence[ProcessPair]) -> int:
    """The pair of processes whose speedup is the median of the pairs' (the lower of the middle
    two for an even count: the candidate gets no benefit of the doubt). A launch-bound chain
    runs at the speed of its process, and a process can sit slower than another for seconds; the
    host's speed also moves both processes of a pair together, which the pair's rounds, taken in
    turns, cancel (docs/performance.md, "host-set items in three pairs of processes"). So one pair that ran
    slow on one side decides nothing, and the figures are one pair's, whose ratio is the
    speedup: pooling the pairs' rounds would mix levels on each side."""
    if len(pairs) == 1:
        return 0
    speedups = pair_speedups(pairs)
    order = sorted(range(len(pairs)), key=speedups.__getitem__)
    return order[(len(order) - 1) // 2]


def kept_rounds(pairs: Sequence[ProcessPair], side: str) -> list[int]:
    """Indices, into ``side``'s rounds of every pair one after another, of the rounds that set its
    time: the undisturbed rounds of the median pair (``median_pair``)."""
    chosen = median_pair(pairs)
    offset = sum(len(p.rounds(side)) for p in pairs[:chosen])
    pair = pairs[chosen]
    kept = pair.kept()
    return [offset + r for r in (kept if kept is not None else range(len(pair.rounds(side))))]


def combine_processes(pairs: Sequence[ProcessPair], side: str) -> TimingStats:
    """One side's figures from one or more pairs of processes: ``combine_rounds`` of the
    undisturbed rounds of the median pair (``median_pair``); what the callable did (its flags,
    ``host_bound``, ``same_work_every_call``) from every round of every pair. With several pairs,
    ``processes`` and ``process_medians_us`` say what the side read in each, and a flag which pair
    set the figures. Raises ``ValueError`` as ``combine_rounds`` does."""
    if len(pairs) == 1:
        single = copy.deepcopy(pairs[0].side_stats(side))  # the caller may charge it (``charge_outside_work``)
        single.flags.append(_turns_flag(pairs))
        return single
    chosen = median_pair(pairs)
    rounds = [r for p in pairs for r in p.rounds(side)]
    start = sum(len(p.rounds(side)) for p in pairs[:chosen])
    others = [i for i in range(len(rounds)) if not start <= i < start + len(pairs[chosen].rounds(side))]
    combined = combine_rounds(rounds, keep=kept_rounds(pairs, side), set_aside=others)
    combined.processes = len(pairs)
    combined.process_medians_us = [p.side_stats(side).median_us for p in pairs]
    speedups = ", ".join(f"{s:.4g}" for s in pair_speedups(pairs))
    combined.flags.append(flag(Flag.MEDIAN_PAIR, f"{chosen + 1}/{len(pairs)}",
                               f"timed in {len(pairs)} pairs of fresh processes, whose speedups were {speedups}: the figures are the median pair's"))
    combined.flags.append(_turns_flag(pairs))
    return combined


def _turns_flag(pairs: Sequence[ProcessPair]) -> str:
    """Which side's round came first in each pair's turns: going first need not be neutral, so the
    grader alternates it (``pipeline._alternating_sides``) and the record says how it went."""
    return flag(Flag.FIRST_IN_TURNS, ",".join(p.first for p in pairs), "the side whose round came first in each pair of processes")
