"""Host speed: time one fixed piece of Python work back to back, and print it in time bins.

A machine whose cores change speed (a VM sharing its host, frequency scaling) shows it here as
bins whose medians move while their minimum stays. CPU figures from such a machine compare only
side by side, in turns (docs/performance.md, "This machine's own speed changes twofold").

    python bench/host_speed.py --seconds 40 --bin 4
"""

from __future__ import annotations

import argparse
import statistics
import time


def work() -> int:
    total = 0
    for i in range(200_000):
        total += i
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--bin", type=float, default=4.0, help="seconds per printed bin")
    args = parser.parse_args()
    t0 = time.perf_counter()
    marks: list[tuple[float, float]] = []
    while time.perf_counter() - t0 < args.seconds:
        start = time.perf_counter()
        work()
        marks.append((start - t0, (time.perf_counter() - start) * 1e3))
    print("| from s | calls | min ms | median ms | max ms |")
    print("|---|---|---|---|---|")
    edge = 0.0
    while edge < args.seconds:
        times = [ms for at, ms in marks if edge <= at < edge + args.bin]
        if times:
            print(f"| {edge:.0f} | {len(times)} | {min(times):.2f} | {statistics.median(times):.2f} | {max(times):.2f} |")
        edge += args.bin


if __name__ == "__main__":
    main()
