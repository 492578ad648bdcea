"""Role bias: is the baseline, timed in the case's long-lived trusted child, slower than the same
code timed in a candidate's fresh child?

Self-speedup runs of sessions 8 to 10 put 34 of 42 short unmarked items (baseline under 20 us)
above 1.0, with geometric means of +0.9% to +2.4%: a bias, not noise. This bench grades the
self-candidate of the short-kernel cases in alternating runs, as the grader is (``kept``) and with
a fresh trusted child for every item (``fresh``, ``bench/fresh_trusted_plugin.py``), and prints per
variant and kind of item how many speedups are above 1 and their geometric mean.

Run on a GPU host: ``python bench/role_bias.py --runs 2 --budget 0.5``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
from pathlib import Path

from _grade import ROOT, grade, graded_items, host_set
from self_speedup import write_submissions

VARIANTS = {"kept": [], "fresh": ["-p", "fresh_trusted_plugin"]}


def kind(item: dict) -> str:
    if host_set(item):
        return "~"
    return "unmarked, baseline < 20 us" if item["t_baseline_us"] < 20 else "unmarked, baseline >= 20 us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per variant, alternating")
    parser.add_argument("--budget", type=float, default=0.5, help="--kcoral-timing-budget per callable (s)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("-k", dest="select", default="vector_add or kcoral_relu or layer_norm or matmul")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kcoral-role-"))
    subs = out / "subs"
    write_submissions(ROOT / "cases", subs)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))
    speedups: dict[tuple[str, str], list[float]] = {}
    for r in range(args.runs):
        for name, extra in VARIANTS.items():
            wall_s, doc = grade(["cases", "--kcoral-submissions", str(subs), "-k", f"self and ({args.select})",
                                 "--kcoral-timing-budget", str(args.budget), *extra],
                                out / f"{name}_{r}.json", log=out / f"{name}_{r}.log")
            items = [i for i in graded_items(doc) if i["candidate"] == "self" and i.get("speedup")]
            print(f"run {r + 1}, {name}: {len(items)} speedups in {wall_s:.0f} s", flush=True)
            for item in items:
                speedups.setdefault((name, kind(item)), []).append(item["speedup"])
    print("\n| variant | items | n | above 1 | geometric mean | median | within [0.98, 1.02] |\n|---|---|---|---|---|---|---|")
    for (name, group), values in sorted(speedups.items()):
        geomean = math.exp(statistics.fmean(math.log(v) for v in values))
        inside = sum(0.98 <= v <= 1.02 for v in values)
        print(f"| {name} | {group} | {len(values)} | {sum(v > 1 for v in values)} | {geomean:.4f} | "
              f"{statistics.median(values):.4f} | {inside} ({inside / len(values) * 100:.0f}%) |")
    print(f"\nartifacts in {out}")


if __name__ == "__main__":
    main()
