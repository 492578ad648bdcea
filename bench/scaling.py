"""Multi-GPU scaling: grade the bundled cases with 1, 2, ... workers and compare.

Run on a GPU host: ``python bench/scaling.py --workers 1,2,4 --budget 0.2``. For each worker count
it grades ``cases/`` with ``-n N`` and the same seed, and reports graded items per second, the
scaling against one worker, how far each item's speedup moved from the one-worker run, and the
number of overlapping GPU-stage leases on any device (the lease history of the JSON artifact;
must be 0). Targets (issue 4): >= 1.8x items per second with two GPUs; speedups within 2% of the
serial run's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _grade import grade, graded_items, lease_overlaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated xdist worker counts; the first is the reference run")
    parser.add_argument("--budget", type=float, default=0.2, help="--kcoral-timing-budget per callable (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON artifacts and logs")
    parser.add_argument("cases", nargs="*", default=["cases"])
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kcoral-scaling-"))
    out.mkdir(parents=True, exist_ok=True)

    runs = []
    for n in (int(w) for w in args.workers.split(",")):
        json_path = out / f"scaling_n{n}.json"
        wall_s, doc = grade([*args.cases, "-n", str(n), "--kcoral-seed", str(args.seed), "--kcoral-timing-budget", str(args.budget)],
                            json_path, log=out / f"scaling_n{n}.log")
        items = graded_items(doc)
        runs.append((n, wall_s, doc, items))
        print(f"-n {n}: {len(items)} items in {wall_s:.1f} s", flush=True)

    base_n, base_wall, base_doc, base_items = runs[0]
    base_speedups = {i["nodeid"]: i["speedup"] for i in base_items if i.get("speedup")}
    devices = sorted({i["device"] for _, _, d, items in runs for i in items if i.get("device")})
    print(f"\ndevices used: {', '.join(devices)}; timing budget {args.budget} s; seed {args.seed}")
    print("| workers | items | wall s | items/s | vs -n %d | median abs speedup change | within 2%% | max change | lease overlaps |" % base_n)
    print("|---|---|---|---|---|---|---|---|---|")
    for n, wall_s, doc, items in runs:
        rate = len(items) / wall_s
        changes = [abs(i["speedup"] / base_speedups[i["nodeid"]] - 1) for i in items if i.get("speedup") and i["nodeid"] in base_speedups]
        within = sum(c <= 0.02 for c in changes) / len(changes) if changes else float("nan")
        med = statistics.median(changes) if changes else float("nan")
        worst = max(changes) if changes else float("nan")
        print(f"| {n} | {len(items)} | {wall_s:.1f} | {rate:.2f} | {rate / (len(base_items) / base_wall):.2f}x | {med * 100:.2f}% | "
              f"{within * 100:.0f}% | {worst * 100:.1f}% | {lease_overlaps(doc)} |")
    # where the time went: summed per phase over all items (seconds), lease hold and wait beside it;
    # a phase that grows with the worker count is contended (CPU, memory bandwidth, the GPU)
    phases = sorted({k for _, _, _, items in runs for i in items for k in i.get("phases_ms", {})})
    print("\n| workers | " + " | ".join(f"{k} s" for k in phases) + " | lease held s | lease wait s |")
    print("|---|" + "---|" * (len(phases) + 2))
    for n, _, _, items in runs:
        sums = [sum(i.get("phases_ms", {}).get(k, 0.0) for i in items) / 1e3 for k in phases]
        held = sum(i.get("lease_held_ms") or 0.0 for i in items) / 1e3
        wait = sum(i.get("lease_wait_ms") or 0.0 for i in items) / 1e3
        print(f"| {n} | " + " | ".join(f"{v:.1f}" for v in sums) + f" | {held:.1f} | {wait:.1f} |")
    print(f"\nartifacts in {out}")


if __name__ == "__main__":
    main()
