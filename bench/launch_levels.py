"""Is a launch-bound chain's level drawn per process, or per draw of its input sets?

Session 12's self-speedups showed a five-kernel softmax reading one of two levels about 1.5x
apart (45 or 70 us on an H200), and the kept baseline child changing level between items, while
its code and process stayed the same (docs/performance.md). Between items the child draws new
input sets (placements behind random pads) and empties the caching allocator. If the level comes
with that draw, several draws per side would let a side be timed at more than one level without
a process per draw; if it belongs to the process, they would not.

Each of ``--processes`` fresh interpreters, one after another, pinned to the core the grader pins,
times the row-softmax baseline at 7x100 (as ``bench/launch_drift.py`` does) ``--draws`` times,
alternating two kinds of draw:

- ``same``: the input sets made when the process started, timed again;
- ``redraw``: new sets behind new random pads (``timing/placement.py``), after the previous
  draw's sets were freed and the caching allocator emptied, as the kept baseline child does
  between items.

Each draw refreshes its inputs before every call, as the grader does. Printed per process: each
draw's median, and the probes of ``launch_drift.py`` (pure Python, a cached allocation, one launch).
If ``redraw`` medians jump between levels within a process while ``same`` ones hold, the level
comes with the draw. Run on a GPU host:

    python bench/launch_levels.py --processes 6 --draws 12 --budget 0.2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _worker(draws: int, budget: float, device: str) -> None:
    import random

    import torch
    from launch_drift import _probes, softmax_chain, softmax_input

    import pytest_kcoral
    from pytest_kcoral.timing import pinning, placement

    core = pinning.choose(int(device.partition(":")[2] or 0))

    def make(_seed: int) -> tuple:
        return softmax_input(device)

    def draw() -> tuple[list[tuple], placement.Placements]:
        spread = placement.Placements(device, random.Random())
        seeds = [0, 1, 2]
        return spread.make_sets(make, seeds, lambda: len(seeds)), spread

    first_sets, first_spread = draw()
    for d in range(draws):
        kind = "same" if d % 2 == 0 else "redraw"
        sets, spread = (first_sets, first_spread) if kind == "same" else draw()

        def refresh(k: int, sets: list[tuple] = sets) -> None:
            sets[k][0].copy_(make(k)[0])

        with pinning.pinned(core):
            r = pytest_kcoral.benchmark(softmax_chain, input_sets=sets, refresh=refresh, on_output=spread.keep_output,
                                        budget_s=budget, warmup_s=0.05, max_samples=100000)
            probes = _probes(device, sets[0][0])
        spread.release_outputs()
        if kind == "redraw":
            del sets, spread
            torch.cuda.empty_cache()
        print(json.dumps({"kind": kind, "median": r["median_us"], "n": r["n"], "probes": probes}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--draws", type=int, default=12)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per draw")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.draws, args.budget, args.device)
        return
    spreads: dict[str, list[float]] = {"same": [], "redraw": []}
    for p in range(args.processes):
        out = subprocess.run([sys.executable, __file__, "--worker", "--draws", str(args.draws), "--budget", str(args.budget),
                              "--device", args.device], capture_output=True, text=True, check=False)
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not rows:
            print(f"process {p}: failed (rc {out.returncode})\n{out.stderr[-2000:]}")
            continue
        for kind in ("same", "redraw"):
            medians = [r["median"] for r in rows if r["kind"] == kind]
            alloc = [r["probes"]["alloc"] for r in rows if r["kind"] == kind]
            launch = [r["probes"]["launch"] for r in rows if r["kind"] == kind]
            spreads[kind].append(max(medians) / min(medians))
            print(f"process {p} {kind:6s} medians us: {' '.join(f'{m:6.1f}' for m in medians)}   "
                  f"alloc {statistics.median(alloc):.2f}  launch {statistics.median(launch):.2f}", flush=True)
    for kind, values in spreads.items():
        if values:
            print(f"{kind}: max/min of a process's draws, per process: {' '.join(f'{v:.3f}' for v in values)}")


if __name__ == "__main__":
    main()
