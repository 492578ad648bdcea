"""Timing rounds in a plain process and inside a real grading child, side by side.

On an H200 a grading child took about 38 timed calls in a round of 31 ms, where the same rounds in
a plain process took 90-130 (``bench/sample_cost.py``). This tells whether the child's process
(forked from the template, confined, pinned) is the cause: it runs the same rounds

1. in this process, and
2. inside a candidate's child, from the candidate's first call (a probe candidate that prints its
   figures to stderr; the JSON's ``output_tail`` brings them back).

Run: ``python bench/round_probe.py`` (a GPU, or the CPU).
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHAPE = {"n": 4096}

PROBE_CANDIDATE = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import round_probe
_done = []

def run(a, b):
    if not _done:
        _done.append(1)
        print("PROBE " + round_probe.probe(str(a.device)), file=sys.stderr, flush=True)
    return a + b
"""


def probe(device: str, rounds: int = 12) -> str:
    """Rounds of 1/32 s as the grader takes them, with the time of each part of the loop: a JSON line."""
    import torch

    from pytest_kcoral import timing
    from pytest_kcoral.case_runtime import CaseRuntime
    from pytest_kcoral.cases import NATIVE
    from pytest_kcoral.child_timing import new_timing_sets, time_round
    from pytest_kcoral.messages import Time

    kind = "cuda" if device.startswith("cuda") else "cpu"
    case = CaseRuntime({"format": NATIVE, "device": device, "device_kind": kind, "source": str(ROOT / "cases" / "vector_add" / "case.py")})
    reference = case.module.reference
    rng = random.Random(1)
    command = Time(shape=SHAPE, device=device, budget_s=1 / 32, timer=None, verify=1, written_inputs=[], warmup_s=0.0)
    held = new_timing_sets(case, command, device, rng, lambda _s, values: (lambda: reference(*values)))
    spent: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    # the parts of a round, wrapped where the timing loop finds them
    saved = {name: getattr(timing, name) for name in ("per_call_times", "_sampled_stats")}
    timing.per_call_times = timed("interim and final per-call times", timing.per_call_times)  # type: ignore[attr-defined]
    timing._sampled_stats = timed("final stats", timing._sampled_stats)  # type: ignore[attr-defined]
    try:
        time_round(held, case, command, device, rng)
        spent.clear()
        counts, walls = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            reply = time_round(held, case, command, device, rng)
            walls.append(time.perf_counter() - t0)
            counts.append(reply.stats.n)
    finally:
        for name, fn in saved.items():
            setattr(timing, name, fn)
    import os

    from pytest_kcoral.child_outputs import inspect_outputs, leaves

    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    values = held.sets[0]
    parts = {
        "refresh": lambda: [d.copy_(s) for d, s in zip(values, case.make_inputs(SHAPE, rng.getrandbits(62)))],
        "make_inputs": lambda: case.make_inputs(SHAPE, rng.getrandbits(62)),
        "randn": lambda: torch.randn(SHAPE["n"], device=device),
        "call": lambda: reference(*values),
        "inspect_outputs": lambda: inspect_outputs(leaves(reference(*values)), (), device),
        "inspect an input": lambda: inspect_outputs((values[0],), (), device),
        "leaves of the call": lambda: leaves(reference(*values)),
        "empty": lambda: None,
    }
    part_us = {}
    for name, fn in parts.items():
        times = []
        for _ in range(300):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - t0) * 1e6)
        part_us[name] = round(statistics.median(times), 1)
    return json.dumps({"part_us": part_us, "pid": os.getpid(), "samples_per_round": statistics.median(counts),
                       "wall_ms_per_round": round(statistics.median(walls) * 1e3, 1),
                       "outside_us": round(reply.stats.outside_us or 0, 1), "host_us": round(reply.stats.host_median_us or 0, 1),
                       "method": reply.stats.method, "threads": torch.get_num_threads(),
                       "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                       "ms_per_round": {k: round(v * 1e3 / rounds, 2) for k, v in spent.items()}})


def main() -> None:
    import subprocess

    import torch

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    print("this process:", probe(device))
    work = Path(tempfile.mkdtemp(prefix="kcoral-probe-"))
    try:
        case = work / "cases" / "vector_add"
        shutil.copytree(ROOT / "cases" / "vector_add", case, ignore=shutil.ignore_patterns("candidates", "__pycache__"))
        (case / "candidates").mkdir()
        (case / "candidates" / "probe.py").write_text(PROBE_CANDIDATE)
        for confinement in ("auto", "off"):
            proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", "cases/vector_add::probe[seen-n=4096]",
                            "--kcoral-mode", "correctness", "--kcoral-confinement", confinement, "--kcoral-json", "out.json",
                            "--kcoral-timeout", "120"], cwd=work, capture_output=True, text=True, timeout=300)
            items = json.loads((work / "out.json").read_text())["items"]
            if len(items) != 1:
                print(proc.stdout[-3000:])
                continue
            (item,) = items
            text = ((item.get("output_tail") or {}).get("stderr") or {}).get("text", "")
            lines = [line for line in text.splitlines() if line.startswith("PROBE ")]
            print(f"a grading child (confinement {confinement}):", lines[0][6:] if lines else f"no figures: {item['outcome']} {item['message']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
