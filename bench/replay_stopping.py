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
"""

from __future__ import annotations

import argparse
import json
import re
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


def replay(items: list[list[list[float]]], precision: float | None, min_pairs: int, cap: int, several_cap: int,
           pairs_taken: int) -> tuple[int, list[float]]:
    """Rounds a side in all, and each item's speedup, under one rule."""
    rounds, speedups = 0, []
    for pairs in items:
        if len(pairs) == 1:
            k = stop_at(pairs[0], precision, min_pairs, cap)
            rounds += k
            speedups.append(combine.median_ratio(pairs[0][:k]))
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
    args = parser.parse_args()
    for path in args.json:
        doc = json.loads(path.read_text())
        items = [p for p in (pairs_of(i) for i in doc["items"] if i.get("speedup")) if p]
        single = sum(len(p) == 1 for p in items)
        print(f"\n{path}: {len(items)} items with rounds ({single} in one pair of processes, {len(items) - single} in several)")
        print("| precision | min rounds | several: rounds a pair | pairs | rounds a side | within 2% | outside 5% |")
        print("|---|---|---|---|---|---|---|")
        for text in args.precision.split(","):
            precision = None if text == "off" else float(text.rstrip("%")) / 100
            for min_pairs in (int(m) for m in args.min_pairs.split(",")):
                for several_cap in (int(s) for s in args.several_caps.split(",")):
                    for taken in (int(p) for p in args.pairs.split(",")):
                        rounds, speedups = replay(items, precision, min_pairs, args.cap, several_cap, taken)
                        within = sum(0.98 <= s <= 1.02 for s in speedups)
                        outside = sum(not 0.95 <= s <= 1.05 for s in speedups)
                        print(f"| {text} | {min_pairs} | {several_cap} | {taken} | {rounds} | {within}/{len(speedups)} | {outside} |")


if __name__ == "__main__":
    main()
