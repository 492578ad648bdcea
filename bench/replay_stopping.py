"""Replay timing's stopping rules on rounds already taken: what other rules would have saved, and
what they would have read.

Input: grading JSONs (``--kcoral-json``) of self-speedup runs (``bench/self_speedup.py``,
``bench/throughput.py``), best taken with ``--kcoral-precision off`` so that every item has all
of its rounds. Each item's rounds come from its figures' ``round_medians_us`` (every round of
every pair of processes, in time order) and the ``precision_target`` flag (rounds per pair).

Per rule, over the items, it prints the rounds a side kept (sum), the share within [0.98, 1.02]
and the count outside [0.95, 1.05]. The speedup replayed is the median of the round ratios
(``combine.median_ratio``), the median pair's for several pairs: close to the grader's, which also
leaves out disturbed pairs of rounds and charges work outside the windows.

    python bench/replay_stopping.py /tmp/kcoral-throughput/*.json
    python bench/replay_stopping.py --precision 1%,1.5%,2% --min-pairs 4,6 run.json
    python bench/replay_stopping.py --interval median,mean --min-pairs 4,6 run.json

``--interval mean`` replays another rule for one pair of processes: the speedup is the geometric
mean of the round ratios, and timing stops once its t-interval (on the ratios' logarithms) lies
within the precision. It assumes the log ratios spread normally, where the median's interval
assumes nothing, and so may stop sooner.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from pytest_kcoral import combine, speedup_interval

TAKEN = re.compile(r"pairs of rounds taken per pair of processes ([\d, ]+) of at most")


def pairs_of(item: dict) -> list[list[float]] | None:
    """Per pair of processes, the ratio of each pair of rounds (baseline over candidate), in time
    order; None for an item without both sides' rounds."""
    base, cand = item.get("baseline_timing") or {}, item.get("candidate_timing") or {}
    b, c = base.get("round_medians_us"), cand.get("round_medians_us")
    if not b or not c or len(b) != len(c):
        return None
    taken = next((TAKEN.search(f) for f in cand.get("flags", []) if TAKEN.search(f)), None)
    lengths = [int(n) for n in taken.group(1).split(",")] if taken else [len(b)]
    if sum(lengths) != len(b):
        return None
    pairs, start = [], 0
    for n in lengths:
        pairs.append([bb / cc for bb, cc in zip(b[start:start + n], c[start:start + n]) if bb > 0 and cc > 0])
        start += n
    return pairs


def stop_at(ratios: Sequence[float], precision: float | None, min_pairs: int, cap: int) -> int:
    """Rounds a side under the grader's rule: after an even count from ``min_pairs`` on, stop once
    the 95% interval of the median ratio lies within ``precision`` of it; else ``cap``."""
    cap = min(cap, len(ratios))
    if precision is None:
        return cap
    for k in range(min_pairs, cap + 1, 2):
        interval = speedup_interval.speedup_interval(ratios[:k])
        centre = combine.median_ratio(ratios[:k])
        if interval and centre * (1 - precision) <= interval[0] and interval[1] <= centre * (1 + precision):
            return k
    return cap


# two-sided 95% quantiles of Student's t, by degrees of freedom (1-30); past 30, 1.96 + 2.5 / df
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.5 / df


def geometric_mean(ratios: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def stop_at_mean(ratios: Sequence[float], precision: float | None, min_pairs: int, cap: int) -> int:
    """``stop_at`` with the geometric mean's t-interval in place of the median's."""
    cap = min(cap, len(ratios))
    if precision is None:
        return cap
    for k in range(max(min_pairs, 2), cap + 1, 2):
        logs = [math.log(r) for r in ratios[:k]]
        half = t975(k - 1) * statistics.stdev(logs) / math.sqrt(k)
        if math.expm1(half) <= precision:
            return k
    return cap


def replay(items: list[list[list[float]]], precision: float | None, min_pairs: int, cap: int, several_cap: int,
           pairs_taken: int, interval: str = "median") -> tuple[int, list[float]]:
    """Rounds a side in all, and each item's speedup, under one rule (``interval``: median or mean)."""
    rounds, speedups = 0, []
    for pairs in items:
        if len(pairs) == 1:
            if interval == "mean":
                k = stop_at_mean(pairs[0], precision, min_pairs, cap)
                speedups.append(geometric_mean(pairs[0][:k]))
            else:
                k = stop_at(pairs[0], precision, min_pairs, cap)
                speedups.append(combine.median_ratio(pairs[0][:k]))
            rounds += k
            continue
        chosen = pairs[:pairs_taken]
        per_pair = [combine.median_ratio(p[:several_cap]) for p in chosen]
        rounds += sum(min(several_cap, len(p)) for p in chosen)
        speedups.append(sorted(per_pair)[(len(per_pair) - 1) // 2])
    return rounds, speedups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path)
    parser.add_argument("--precision", default="off,1%,1.5%,2%", help="comma-separated: off or percentages")
    parser.add_argument("--min-pairs", default="6", help="comma-separated round counts before a stop may come")
    parser.add_argument("--cap", type=int, default=32, help="rounds a side at most, one pair of processes")
    parser.add_argument("--several-caps", default="8,6,4", help="rounds a side in each of several pairs of processes")
    parser.add_argument("--pairs", default="3,2,1", help="pairs of processes a host-set item takes")
    parser.add_argument("--interval", default="median", help="comma-separated: median (the grader's rule) or mean (see above)")
    args = parser.parse_args()
    for path in args.json:
        doc = json.loads(path.read_text())
        items = [p for p in (pairs_of(i) for i in doc["items"] if i.get("speedup")) if p]
        single = sum(len(p) == 1 for p in items)
        print(f"\n{path}: {len(items)} items with rounds ({single} in one pair of processes, {len(items) - single} in several)")
        print("| interval | precision | min rounds | several: rounds a pair | pairs | rounds a side | within 2% | outside 5% |")
        print("|---|---|---|---|---|---|---|---|")
        for interval, text in ((i, t) for i in args.interval.split(",") for t in args.precision.split(",")):
            precision = None if text == "off" else float(text.rstrip("%")) / 100
            for min_pairs in (int(m) for m in args.min_pairs.split(",")):
                for several_cap in (int(s) for s in args.several_caps.split(",")):
                    for taken in (int(p) for p in args.pairs.split(",")):
                        rounds, speedups = replay(items, precision, min_pairs, args.cap, several_cap, taken, interval)
                        within = sum(0.98 <= s <= 1.02 for s in speedups)
                        outside = sum(not 0.95 <= s <= 1.05 for s in speedups)
                        print(f"| {interval} | {text} | {min_pairs} | {several_cap} | {taken} | {rounds} | {within}/{len(speedups)} | {outside} |")


if __name__ == "__main__":
    main()
