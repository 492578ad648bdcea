"""Multi-GPU scaling: grade the bundled cases with 1, 2, ... workers and compare.

Run on a GPU host: ``python bench/scaling.py --workers 1,1,2,4 --budget 0.1 -- cases -m seen``. For
each worker count it grades the cases with ``-n N`` and the same seed, and reports graded items per
second, the scaling against the first run, how far each item's speedup moved from the first run's,
and the number of overlapping GPU-stage leases on any device (the lease history of the JSON
artifact; must be 0). Targets (issue 4): >= 1.8x items per second with two GPUs; speedups within
2% of the serial run's.

Repeat the first worker count (``1,1,...``): the second serial run's speedup changes are the timing
noise between two runs with nothing else changed, the floor against which the parallel runs' are
read. Changes are also given for items whose baseline takes 20 us or more, and for the items
the summary leaves unmarked (not ``~``, in the first run: ``scoring.host_set``): the host's launch
speed moves the others between any two runs. Each run's rows print as soon as it ends, so a run cut short keeps its figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _grade import describe_changes, grade, graded_items, host_set, lease_overlaps, speedup_change, speedup_pairs

LONG_US = 20.0  # baselines at least this long are GPU-bound in the bundled cases (docs/performance.md)


def _changes(items: list[dict[str, Any]], base: dict[str, dict[str, Any]], only: str = "") -> list[float]:
    out = []
    for ref, i in speedup_pairs(base, items):
        if only == "long" and (ref.get("t_baseline_us") or 0.0) < LONG_US:
            continue
        if only == "gpu" and host_set(ref):
            continue
        out.append(abs(speedup_change(ref, i)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,1,2", help="comma-separated xdist worker counts; the first is the reference run")
    parser.add_argument("--budget", type=float, default=0.2, help="--kcoral-timing-budget per callable (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON artifacts and logs")
    parser.add_argument("cases", nargs="*", default=["cases"])
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kcoral-scaling-"))
    out.mkdir(parents=True, exist_ok=True)

    print(f"timing budget {args.budget} s; seed {args.seed}; grading {' '.join(args.cases)}; speedup changes against the first run\n")
    print("| run | workers | items | wall s | items/s | vs first | median speedup change | within 2% | max change "
          f"| same, baseline >= {LONG_US:g} us: median / within 2% / max | same, unmarked (not ~) "
          "| lease overlaps | devices | timed by |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base_rate = 0.0
    base: dict[str, dict[str, Any]] = {}
    phase_rows = []
    fallbacks = []  # a run not timed by CUPTI on a GPU measures something else: say so below
    for k, n in enumerate(int(w) for w in args.workers.split(",")):
        json_path = out / f"scaling_{k}_n{n}.json"
        started = time.time()  # the lease history's clock
        wall_s, doc = grade([*args.cases, "-n", str(n), "--kcoral-seed", str(args.seed), "--kcoral-timing-budget", str(args.budget)],
                            json_path, log=out / f"scaling_{k}_n{n}.log")
        items = graded_items(doc)
        rate = len(items) / wall_s
        if k == 0:
            base_rate, base = rate, {i["nodeid"]: i for i in items}
        devices = ",".join(sorted({i["device"] for i in items if i.get("device")}))
        print(f"| {k + 1} | {n} | {len(items)} | {wall_s:.1f} | {rate:.2f} | {rate / base_rate:.2f}x | "
              f"{describe_changes(_changes(items, base))} | {describe_changes(_changes(items, base, 'long'), ' / ')} | "
              f"{describe_changes(_changes(items, base, 'gpu'), ' / ')} | "
              f"{lease_overlaps(doc)} | {devices} | {_timed_by(doc)} |", flush=True)
        fallbacks += [f"TIMER FALLBACK in run {k + 1} on {count} items: {why}" for why, count in doc.get("timers", {}).get("fallbacks", {}).items()]
        phase_rows.append((k, n, items, _lease_window(doc, started, started + wall_s)))

    if fallbacks:
        print("\n" + "\n".join(fallbacks))

    # where the time went: summed per phase over all items (seconds), lease hold and wait beside it;
    # a phase that grows with the worker count is contended (CPU, memory bandwidth, the GPU)
    # and the session's fixed cost: start-up before the first lease, the tail after the last
    phases = sorted({p for _, _, items, _ in phase_rows for i in items for p in i.get("phases_ms", {})})
    print("\n| run | workers | " + " | ".join(f"{p} s" for p in phases)
          + " | lease held s | lease wait s | start to first lease s | lease window s | last lease to end s | window vs first |")
    print("|---|---|" + "---|" * (len(phases) + 6))
    # the window's ratio is the speedup the workers reach on the GPU work itself, before the
    # session's fixed start and end, which no number of GPUs shortens
    first_window = phase_rows[0][3][1] if phase_rows else float("nan")
    for k, n, items, window in phase_rows:
        sums = [sum(i.get("phases_ms", {}).get(p, 0.0) for i in items) / 1e3 for p in phases]
        held = sum(i.get("lease_held_ms") or 0.0 for i in items) / 1e3
        wait = sum(i.get("lease_wait_ms") or 0.0 for i in items) / 1e3
        print(f"| {k + 1} | {n} | " + " | ".join(f"{v:.1f}" for v in sums) + f" | {held:.1f} | {wait:.1f} | "
              + " | ".join(f"{v:.1f}" for v in window) + f" | {first_window / window[1]:.2f}x |")

    # what the devices could not share: each one's idle time inside the runs' lease window, between
    # its leases (the next item's compile, outside the lease) and before its first or after its
    # last lease (xdist's hand-out leaving one worker with a queue while the other runs dry)
    print("\n| run | device | leases | held s | idle between leases s | idle before its first s | idle after its last s |")
    print("|---|---|---|---|---|---|---|")
    for k, n, _, _ in phase_rows:
        doc = json.loads((out / f"scaling_{k}_n{n}.json").read_text())
        for device, row in device_idle(doc).items():
            print(f"| {k + 1} | {device} | {row['leases']} | " + " | ".join(f"{row[key]:.1f}" for key in ("held_s", "between_s", "before_s", "after_s")) + " |")
    print(f"\nartifacts in {out}")


def _timed_by(doc: dict[str, Any]) -> str:
    """Items per timing method, from the artifact's ``timers``: ``cupti 49``."""
    from pytest_kcoral.report import fmt_methods

    return fmt_methods(doc.get("timers", {}).get("methods", {})) or "-"


def device_idle(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per device, inside the run's lease window (first lease of any device to last release):
    its leases, seconds held, and seconds idle between its leases, before its first, after its last."""
    leases = doc.get("lease_history", [])
    if not leases:
        return {}
    start = min(lease["t_acquired"] for lease in leases)
    end = max(lease["t_released"] for lease in leases)
    rows = {}
    for device in sorted({lease["device"] for lease in leases}):
        mine = sorted((lease for lease in leases if lease["device"] == device), key=lambda lease: lease["t_acquired"])
        rows[device] = {
            "leases": len(mine),
            "held_s": sum(lease["t_released"] - lease["t_acquired"] for lease in mine),
            "between_s": sum(max(0.0, b["t_acquired"] - a["t_released"]) for a, b in zip(mine, mine[1:])),
            "before_s": mine[0]["t_acquired"] - start,
            "after_s": end - mine[-1]["t_released"],
        }
    return rows


def _lease_window(doc: dict[str, Any], started: float, ended: float) -> tuple[float, float, float]:
    """Seconds from the session's start to its first lease, from the first lease to the last
    release, and from there to the session's end (nan when nothing was leased)."""
    leases = doc.get("lease_history", [])
    if not leases:
        return (float("nan"),) * 3
    first = min(lease["t_acquired"] for lease in leases)
    last = max(lease["t_released"] for lease in leases)
    return first - started, last - first, ended - last


if __name__ == "__main__":
    main()
