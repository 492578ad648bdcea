"""How many timing rounds a side does a launch-bound item need? Identical code in two processes.

The grader times the baseline and the candidate in two processes, taking turns in rounds
(B C C B ..., ``pipeline.TIMING_ROUNDS`` a side). A launch-bound call's span is the host's launch
cadence, which moves by tens of percent from one second to the next on the H200 host
(docs/performance.md). Whether more, shorter rounds help depends on what moves: a drift shared by
both processes averages out with more turns; an offset that belongs to one process does not.

This script starts ``--pairs`` fresh pairs of processes per setting; in each pair both time the
same launch-bound function (the row-softmax baseline at 7x100, five kernels) in turns, A B B A ...,
both pinned to one core as the grader pins them, with the same total budget split into
``--rounds`` rounds a side. It prints, per setting, each pair's ratio of medians A/B (1.0 is
right) and, for the first pair of each setting, every round's median, so a shared drift (both
columns move together) can be told from a per-process offset (one column stays above the other).
Run on a GPU host:

    python bench/launch_drift.py --pairs 5 --rounds 4,16,64 --budget 1.0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r"""
import json, os, sys, time, torch
import pytest_kcoral
from pytest_kcoral.timing import pinning
device = sys.argv[1]
core = pinning.choose(device)
def softmax_chain(x):
    shifted = x - x.amax(dim=-1, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=-1, keepdim=True)
sets = [(3.0 * torch.randn(7, 100, device=device),) for _ in range(16)]
first = True
print("READY", flush=True)
for line in sys.stdin:
    budget = float(line)
    with pinning.pinned(core):
        t0 = time.time()
        r = pytest_kcoral.benchmark(softmax_chain, input_sets=sets, budget_s=budget,
                                    warmup_s=0.05 if first else 0.0, max_samples=100000)
    first = False
    print("R " + json.dumps({"t0": t0, "samples": r["samples_us"], "median": r["median_us"],
                             "host": r["host_median_us"], "method": r["method"]}), flush=True)
"""


_ADDR_NO_RANDOMIZE = 0x0040000  # personality(2): this process's children get a fixed address layout


def _no_aslr() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(ctypes.c_ulong(0xFFFFFFFF))  # 0xffffffff: query, change nothing
    if current == -1 or libc.personality(ctypes.c_ulong(current | _ADDR_NO_RANDOMIZE)) == -1:
        raise OSError(ctypes.get_errno(), "personality(ADDR_NO_RANDOMIZE) failed")

VARIANTS = {
    # what the two processes of a pair share beyond their code: nothing; the same str hash seed;
    # the same address layout; both
    "default": ({}, False),
    "hashseed": ({"PYTHONHASHSEED": "0"}, False),
    "noaslr": ({}, True),
    "both": ({"PYTHONHASHSEED": "0"}, True),
}


def _start_pair(device: str, variant: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    env_extra, no_aslr = VARIANTS[variant]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, device], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, **env_extra}, preexec_fn=_no_aslr if no_aslr else None)
             for _ in range(2)]
    for proc in procs:  # both import torch at once; then wait for each
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("READY"):
                break
        else:
            raise RuntimeError(f"worker exited before it was ready: {proc.wait()}")
    return procs[0], procs[1]


def _round(proc: subprocess.Popen, budget: float) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{budget}\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith("R "):
            return json.loads(line[2:])
    raise RuntimeError(f"worker exited mid-round: {proc.wait()}")


def run_pair(rounds: int, budget: float, device: str, variant: str = "default") -> tuple[float, list[tuple[float, float]]]:
    """Ratio of pooled medians A/B over ``rounds`` rounds a side, and every round's (A, B) median."""
    a, b = _start_pair(device, variant)
    try:
        per_round: list[tuple[float, float]] = []
        pooled_a: list[float] = []
        pooled_b: list[float] = []
        for r in range(rounds):
            order = (a, b) if r % 2 == 0 else (b, a)  # A B B A A B ...: each side goes first half the time
            results = {id(p): _round(p, budget / rounds) for p in order}
            ra, rb = results[id(a)], results[id(b)]
            pooled_a += ra["samples"]
            pooled_b += rb["samples"]
            per_round.append((ra["median"], rb["median"]))
        return statistics.median(pooled_a) / statistics.median(pooled_b), per_round
    finally:
        for p in (a, b):
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="fresh process pairs per setting")
    parser.add_argument("--rounds", default="4,16,64", help="rounds a side, comma-separated settings")
    parser.add_argument("--budget", type=float, default=1.0, help="timing budget a side, in seconds")
    parser.add_argument("--variants", default="default",
                        help="what the two processes share: " + ", ".join(VARIANTS) + " (comma-separated)")
    parser.add_argument("--show-rounds", action="store_true", help="print every round of each setting's first pair")
    parser.add_argument("--device", default="cuda:0", help="cpu only to try the script out")
    args = parser.parse_args()
    for variant in args.variants.split(","):
        for rounds in [int(r) for r in args.rounds.split(",")]:
            ratios = []
            for pair in range(args.pairs):
                ratio, per_round = run_pair(rounds, args.budget, args.device, variant)
                ratios.append(ratio)
                if pair == 0 and args.show_rounds:
                    print(f"{variant}, rounds={rounds}, pair 0, every round's median (A / B, us):")
                    print("  " + "  ".join(f"{x:.1f}/{y:.1f}" for x, y in per_round[:32]))
            within = sum(abs(r - 1) <= 0.02 for r in ratios)
            print(f"{variant}, rounds={rounds}: A/B over {args.pairs} pairs: " + " ".join(f"{r:.3f}" for r in ratios)
                  + f"; within 2%: {within}/{len(ratios)}; max |A/B - 1| = {max(abs(r - 1) for r in ratios):.3f}",
                  flush=True)

if __name__ == "__main__":
    main()
