"""Process-to-process timing noise: one callable timed in several fresh processes, one after another.

The grader times the baseline and the candidate in two different processes; any difference
between two processes running the same code is noise in every speedup. This script times the same
small kernels (a one-kernel add, and the five-kernel launch-bound row-softmax baseline) in
``--processes`` fresh interpreters in turn, each with ``pytest_kcoral.benchmark``, optionally all
pinned to one CPU core (``--pin CORE``), and prints per kernel the medians and their spread
(max/min), across processes and within each (every kernel is timed twice in a row). Run on a GPU
host:

    python bench/process_noise.py --processes 6 [--pin 2] [--method cupti|events]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, sys, torch
import pytest_kcoral
if {pin!r} is not None:
    os.sched_setaffinity(0, {{{pin!r}}})
dev = "cuda"
def softmax_chain(x):
    shifted = x - x.amax(dim=-1, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=-1, keepdim=True)
def add(a, b):
    return a + b
out = {{}}
for name, fn, sets in [
    ("add_4096", add, [(torch.randn(4096, device=dev), torch.randn(4096, device=dev)) for _ in range(3)]),
    ("add_2^22", add, [(torch.randn(1 << 22, device=dev), torch.randn(1 << 22, device=dev)) for _ in range(3)]),
    ("softmax_chain_16x128", softmax_chain, [(torch.randn(16, 128, device=dev),) for _ in range(3)]),
    ("softmax_chain_4096^2", softmax_chain, [(torch.randn(4096, 4096, device=dev),) for _ in range(3)]),
]:
    rs = [pytest_kcoral.benchmark(fn, input_sets=sets, budget_s={budget!r}, method={method!r}) for _ in range(2)]
    out[name] = ([r["median_us"] for r in rs], rs[0].get("host_median_us"), rs[0]["method"])
print("RESULT " + json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--pin", type=int, default=None, help="pin every process to this CPU core")
    parser.add_argument("--method", default=None)
    parser.add_argument("--budget", type=float, default=0.3)
    args = parser.parse_args()
    code = CHILD.format(pin=args.pin, budget=args.budget, method=args.method)
    runs = []
    for _ in range(args.processes):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(proc.stdout[-2000:], proc.stderr[-2000:])
            sys.exit(1)
        runs.append(json.loads(line[len("RESULT "):]))
    print(f"pin={args.pin} method={args.method or 'best'} processes={args.processes} budget={args.budget}s")
    # each process times each kernel twice in a row: "a/b" per process; the spread within a
    # process (a vs b) against the spread between processes tells drift in time from per-process luck
    print("| kernel | method | median per process, two runs each (us) | max/min across | max/min within | host median per process (us) |")
    print("|---|---|---|---|---|---|")
    for name in runs[0]:
        pairs = [r[name][0] for r in runs]
        firsts = [p[0] for p in pairs]
        within = max(max(p) / min(p) for p in pairs)
        hosts = [r[name][1] for r in runs]
        print(f"| {name} | {runs[0][name][2]} | {' '.join(f'{a:.2f}/{b:.2f}' for a, b in pairs)} | "
              f"{max(firsts) / min(firsts):.4f} | {within:.4f} | {' '.join(f'{h:.1f}' for h in hosts)} |")


if __name__ == "__main__":
    main()
