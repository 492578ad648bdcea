"""Per-item cost of isolation: children forked from the warm template against plain interpreter starts.

Run: ``python bench/overhead.py`` (CPU or GPU machine). It prints

1. the start of one child forked from the template, against ``python -c "import torch, triton"``,
   which is what a fresh interpreter per candidate would pay (medians);
2. the per-item overhead of a real grading session: a case whose candidate and reference do
   almost nothing, graded with 2 and then with 2 + N items; the difference divided by N is what
   each item costs above its own work (``--kcoral-mode correctness``, and full mode with the
   timing budget subtracted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CASE = """
import torch
SEEN = [{"n": 16}]
UNSEEN = [{"n": 17}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b
"""
CANDIDATE = "def run(a, b):\n    return a + b\n"
TIMING_BUDGET_S = 0.05


def child_start_s(samples: int) -> float:
    from pytest_kcoral.isolation import Child

    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp) / "case.py"
        case.write_text(textwrap.dedent(CASE))
        spec = {"format": "native", "source": str(case), "device": "cpu"}
        Child("candidate", spec, {"TRITON_INTERPRET": "1"}, time.monotonic() + 120).close()  # warm the template
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            Child("candidate", spec, {"TRITON_INTERPRET": "1"}, time.monotonic() + 120).close()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interpreter_start_s(samples: int) -> float:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, triton"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def session_s(root: Path, n_candidates: int, mode: str) -> float:
    cands = root / "cases" / "add" / "candidates"
    for old in cands.glob("*.py"):
        old.unlink()
    for i in range(n_candidates):
        (cands / f"c{i:03d}.py").write_text(CANDIDATE)
    cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", "cases",
           "--kcoral-mode", mode, "--kcoral-timing-budget", str(TIMING_BUDGET_S)]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=root, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40, help="extra items graded to measure per-item cost")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    fork = child_start_s(30)
    fresh = interpreter_start_s(5)
    print(f"child forked from the template: {fork * 1000:8.1f} ms (median of 30)")
    print(f"python -c 'import torch, triton': {fresh * 1000:8.1f} ms (median of 5)  -> {fresh / fork:.0f}x the fork")

    extra_candidates = args.items // 2  # two shapes per candidate
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "cases" / "add" / "candidates").mkdir(parents=True)
        (root / "cases" / "add" / "case.py").write_text(textwrap.dedent(CASE))
        for mode in ("correctness", "full"):
            per_item = []
            for _ in range(args.repeats):
                small = session_s(root, 1, mode)
                large = session_s(root, 1 + extra_candidates, mode)
                per_item.append((large - small) / (2 * extra_candidates))
            cost = statistics.median(per_item)
            work = 2 * TIMING_BUDGET_S if mode == "full" else 0.0  # baseline and candidate budgets
            print(f"per item, --kcoral-mode {mode:11s}: {cost * 1000:7.1f} ms in all, {max(cost - work, 0) * 1000:7.1f} ms above the "
                  f"timing budget (median of {args.repeats}, {2 * extra_candidates} extra items)")


if __name__ == "__main__":
    main()
