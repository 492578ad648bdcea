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
right); with ``--show-rounds``, every round's median of each setting's first pair, so a shared
drift (both columns move together) can be told from a per-process offset (one column stays above
the other). ``--variants`` picks how the two processes of a pair are made: fresh interpreters
(``default``), fresh interpreters with the same str hash seed (``hashseed``), the same address
layout (``noaslr``) or both (``both``), or forked from one template process that imported torch,
as the grader's children were until session 6 (``forked``), and with their inputs placed as the grader's children
place them, behind random pads (``placed``), or behind the same pads in both (``shared``), or
forked without transparent huge pages, as the grader's children are now (``nothp``).
``--probes`` also times, in each round, three parts of a launch gap (pure Python, a cached
allocation, one launch) and prints how their per-pair ratios follow the chain's.
Run on a GPU host:

    python bench/launch_drift.py --pairs 5 --rounds 4,16,64 --budget 1.0
    python bench/launch_drift.py --pairs 8 --rounds 8 --budget 0.5 --variants default,both,forked
    python bench/launch_drift.py --pairs 8 --rounds 8 --budget 0.5 --variants forked,placed,shared --probes
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any


def _probes(device: str, x: Any) -> dict[str, float]:
    """Host microseconds of three things the chain's launch gaps are made of, each a median:
    pure Python (``py``), a cached allocation (``alloc``) and one kernel launch (``launch``).
    Which of them moves with the chain's per-process offset tells where the offset lives."""
    import time

    import torch

    def median_us(fn: Callable[[], Any], reps: int = 200) -> float:
        times = []
        for k in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
            if k % 20 == 19 and device.startswith("cuda"):
                torch.cuda.synchronize(device)  # the launch queue never fills
        return statistics.median(times)

    table = {k: k * 3 for k in range(64)}
    y = torch.zeros_like(x)
    result = {
        "py": median_us(lambda: sum(table[k % 64] for k in range(400))),
        "alloc": median_us(lambda: torch.empty_like(x)),
        "launch": median_us(lambda: y.add_(1.0)),
    }
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return result


def softmax_chain(x: Any) -> Any:
    """The launch-bound function these benches time: the row-softmax baseline, five kernels."""
    import torch

    shifted = x - x.amax(dim=-1, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_input(device: str) -> tuple:
    """One input set for ``softmax_chain`` at 7x100, where its span is mostly launch gaps."""
    import torch

    return (3.0 * torch.randn(7, 100, device=device),)


def _serve(device: str, recv: Callable[[], float | None], send: Callable[[dict], None], placed: bool = False,
           pad_seed: int | None = None, probes: bool = False) -> None:
    """A worker: time the launch-bound function for each budget received, until None. ``placed``:
    its 16 input sets behind random pads and its outputs kept in rotation, as the grader's
    children place them (``timing/placement.py``), with pads drawn anew in each worker, or from
    ``pad_seed`` (the same pads in both workers of a pair)."""
    import random

    import pytest_kcoral
    from pytest_kcoral.timing import pinning, placement

    core = pinning.choose(int(device.partition(":")[2] or 0))  # the grader keys it by the host-wide GPU

    def make(_seed: int) -> tuple:
        return softmax_input(device)

    on_output = None
    if placed:
        spread = placement.Placements(device, random.Random(pad_seed))  # None: seeded from os.urandom
        seeds = [0, 1, 2]
        sets = spread.make_sets(make, seeds, lambda: len(seeds))
        on_output = spread.keep_output
    else:
        sets = [make(k) for k in range(16)]
    send({"ready": True})
    first = True
    while (budget := recv()) is not None:
        with pinning.pinned(core):
            r = pytest_kcoral.benchmark(softmax_chain, input_sets=sets, on_output=on_output, budget_s=budget,
                                        warmup_s=0.05 if first else 0.0, max_samples=100000)
            parts = _probes(device, sets[0][0]) if probes else {}
        first = False
        send({"samples": r["samples_us"], "median": r["median_us"], "probes": parts})


class _Interpreter:
    """A worker in a fresh interpreter (``python launch_drift.py --serve DEVICE``)."""

    def __init__(self, device: str, env_extra: dict[str, str], no_aslr: bool, probes: bool) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", device, *(["--probes"] if probes else [])], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, **env_extra},
                                     preexec_fn=_no_aslr if no_aslr else None)

    def recv(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited: {self.proc.wait()}")
        return json.loads(line)

    def round(self, budget: float) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{budget}\n")
        self.proc.stdin.flush()
        return self.recv()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class _Forked:
    """A worker forked from one template that imported torch, as the grader's children are."""

    def __init__(self, device: str, setting: dict[str, Any], pad_seed: int | None) -> None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "pytest_kcoral.timing"])
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_forked_main, args=(child_conn, device, setting, pad_seed))
        self.proc.start()
        child_conn.close()

    def recv(self) -> dict:
        return self.conn.recv()

    def round(self, budget: float) -> dict:
        self.conn.send(budget)
        return self.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=30)


_PR_SET_THP_DISABLE = 41  # prctl(2): no transparent huge pages for this process from now on


def _forked_main(conn: Any, device: str, setting: dict[str, Any], pad_seed: int | None) -> None:
    if setting.get("no_thp"):
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")
    _serve(device, conn.recv, conn.send, setting.get("placed", False), pad_seed, setting.get("probes", False))


def _stdio_main(device: str, probes: bool) -> None:
    def recv() -> float | None:
        line = sys.stdin.readline()
        return float(line) if line else None

    _serve(device, recv, lambda msg: print(json.dumps(msg), flush=True), probes=probes)


_ADDR_NO_RANDOMIZE = 0x0040000  # personality(2): the program exec'd next gets a fixed address layout


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
FORKED_VARIANTS: dict[str, dict[str, Any]] = {
    # both forked from one template process, as in the grader; "placed": and their inputs placed
    # behind random pads, as the grader's children place them; "shared": behind the same pads in
    # both workers of a pair; "nothp": forked, without transparent huge pages (the H200 host has
    # them "always": whether a hot page got one is up to each process)
    "forked": {},
    "placed": {"placed": True},
    "shared": {"placed": True, "shared_pads": True},
    "nothp": {"no_thp": True},
}


def _start_pair(device: str, variant: str, probes: bool) -> tuple[Any, Any]:
    if variant in FORKED_VARIANTS:
        setting = FORKED_VARIANTS[variant]
        pad_seed = int.from_bytes(os.urandom(8), "little") if setting.get("shared_pads") else None
        workers = [_Forked(device, {**setting, "probes": probes}, pad_seed) for _ in range(2)]
    else:
        env_extra, no_aslr = VARIANTS[variant]
        workers = [_Interpreter(device, env_extra, no_aslr, probes) for _ in range(2)]
    for worker in workers:  # both start at once; then wait for each
        worker.recv()
    return workers[0], workers[1]


def run_pair(rounds: int, budget: float, device: str, variant: str = "default",
             probes: bool = False) -> tuple[float, list[tuple[float, float]], dict[str, float]]:
    """Ratio of pooled medians A/B over ``rounds`` rounds a side, every round's (A, B) median, and
    each probe's ratio A/B (medians over the rounds)."""
    a, b = _start_pair(device, variant, probes)
    try:
        per_round: list[tuple[float, float]] = []
        pooled_a: list[float] = []
        pooled_b: list[float] = []
        probes_a: list[dict[str, float]] = []
        probes_b: list[dict[str, float]] = []
        for r in range(rounds):
            order = (a, b) if r % 2 == 0 else (b, a)  # A B B A A B ...: each side goes first half the time
            results = {id(p): p.round(budget / rounds) for p in order}
            ra, rb = results[id(a)], results[id(b)]
            pooled_a += ra["samples"]
            pooled_b += rb["samples"]
            probes_a.append(ra["probes"])
            probes_b.append(rb["probes"])
            per_round.append((ra["median"], rb["median"]))
        probe_ratios = {name: statistics.median(p[name] for p in probes_a) / statistics.median(p[name] for p in probes_b)
                        for name in probes_a[0]}
        return statistics.median(pooled_a) / statistics.median(pooled_b), per_round, probe_ratios
    finally:
        a.close()
        b.close()


def _correlation(xs: list[float], ys: list[float]) -> float:
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # a constant column: nothing to correlate
        return float("nan")


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _stdio_main(sys.argv[2], "--probes" in sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="fresh process pairs per setting")
    parser.add_argument("--rounds", default="4,16,64", help="rounds a side, comma-separated settings")
    parser.add_argument("--budget", type=float, default=1.0, help="timing budget a side, in seconds")
    parser.add_argument("--variants", default="default",
                        help="what the two processes share: " + ", ".join([*VARIANTS, *FORKED_VARIANTS]) + " (comma-separated)")
    parser.add_argument("--show-rounds", action="store_true", help="print every round of each setting's first pair")
    parser.add_argument("--probes", action="store_true",
                        help="also print each pair's A/B of pure Python, a cached allocation and one launch, with their correlation to the chain's")
    parser.add_argument("--device", default="cuda:0", help="cpu only to try the script out")
    args = parser.parse_args()
    for variant in args.variants.split(","):
        for rounds in [int(r) for r in args.rounds.split(",")]:
            ratios = []
            probe_ratios: list[dict[str, float]] = []
            for pair in range(args.pairs):
                ratio, per_round, probes = run_pair(rounds, args.budget, args.device, variant, args.probes)
                ratios.append(ratio)
                probe_ratios.append(probes)
                if pair == 0 and args.show_rounds:
                    print(f"{variant}, rounds={rounds}, pair 0, every round's median (A / B, us):")
                    print("  " + "  ".join(f"{x:.1f}/{y:.1f}" for x, y in per_round[:32]))
            within = sum(abs(r - 1) <= 0.02 for r in ratios)
            print(f"{variant}, rounds={rounds}: A/B over {args.pairs} pairs: " + " ".join(f"{r:.3f}" for r in ratios)
                  + f"; within 2%: {within}/{len(ratios)}; max |A/B - 1| = {max(abs(r - 1) for r in ratios):.3f}",
                  flush=True)
            if args.probes:  # does the chain's offset follow one of its parts?
                for name in probe_ratios[0]:
                    column = [p[name] for p in probe_ratios]
                    print(f"  probe {name}: A/B " + " ".join(f"{r:.3f}" for r in column)
                          + f"; correlation with the chain's A/B: {_correlation(ratios, column):+.2f}", flush=True)

if __name__ == "__main__":
    main()
