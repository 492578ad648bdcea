"""Compare the speedups of saved grading runs: where do they differ, and by how much in time?

``python bench/compare_runs.py FIRST.json OTHER.json [...]`` reads ``--kcoral-json`` artifacts of the
same items (e.g. ``bench/scaling.py``'s, copied back from the GPU host) and prints, for every run
after the first, the speedup changes against the first run by group: all items, the items the
summary leaves unmarked (not ``~``: ``scoring.host_set``, read from the first run) split at a
baseline of 5 us, and the marked ones. Then every unmarked item that moved more than 2%, with how far
its baseline and candidate times moved in nanoseconds: on the H200, CUPTI's timestamps advance in
steps of 32 ns (docs/performance.md), so 2% of a kernel under 1.6 us is less than one step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _grade import describe_changes, graded_items, host_set, speedup_change, speedup_pairs

SHORT_US = 5.0  # below this, a 2% change is a few CUPTI timestamp steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="--kcoral-json artifacts; the first is the reference")
    args = parser.parse_args()
    if len(args.runs) < 2:
        parser.error("give at least two artifacts")
    first = {i["nodeid"]: i for i in graded_items(json.loads(args.runs[0].read_text()))}
    marked = {nodeid for nodeid, item in first.items() if host_set(item)}
    groups = {
        "all": lambda ref: True,
        "unmarked (not ~)": lambda ref: ref["nodeid"] not in marked,
        f"unmarked, baseline >= {SHORT_US:g} us": lambda ref: ref["nodeid"] not in marked and ref["t_baseline_us"] >= SHORT_US,
        f"unmarked, baseline < {SHORT_US:g} us": lambda ref: ref["nodeid"] not in marked and ref["t_baseline_us"] < SHORT_US,
        "marked ~": lambda ref: ref["nodeid"] in marked,
    }
    for path in args.runs[1:]:
        pairs = speedup_pairs(first, graded_items(json.loads(path.read_text())))
        print(f"{path} against {args.runs[0]}\n")
        print("| items | median change | within 2% | max change |\n|---|---|---|---|")
        for name, belongs in groups.items():
            print(f"| {name} | {describe_changes([abs(speedup_change(r, i)) for r, i in pairs if belongs(r)])} |")
        movers = sorted(((r, i) for r, i in pairs if r["nodeid"] not in marked and abs(speedup_change(r, i)) > 0.02),
                        key=lambda pair: -abs(speedup_change(*pair)))
        if movers:
            print("\n| unmarked item moved > 2% | change | baseline us | baseline moved ns | candidate moved ns |\n|---|---|---|---|---|")
        for r, i in movers:
            print(f"| {r['nodeid']} | {speedup_change(r, i) * 100:+.1f}% | {r['t_baseline_us']:.2f} | "
                  f"{(i['t_baseline_us'] - r['t_baseline_us']) * 1e3:+.0f} | {(i['t_candidate_us'] - r['t_candidate_us']) * 1e3:+.0f} |")
        print()


if __name__ == "__main__":
    main()
