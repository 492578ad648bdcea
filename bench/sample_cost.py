"""Where a timing round's time goes, for a small kernel: samples per round, and the harness's
own cost per timed call, part by part.

Run: ``python bench/sample_cost.py`` (a GPU if there is one, else the CPU). It loads a bundled
case in this process, as a child would, and prints:

1. rounds of ``1/32`` s as the grader takes them (``child_timing.time_round``): samples per
   round and the wall time per round;
2. the median cost of each part of a timed call's turn: the refresh, the L2 flush (with and
   without the persisting-L2 reset), a synchronize, the check of the output;
3. a cProfile of some rounds, by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def per_call_us(fn: Any, sync: Any, repeats: int = 200) -> float:
    """Median wall time of ``fn()`` followed by ``sync()``, in us."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="vector_add")
    parser.add_argument("--shape", default='{"n": 4096}')
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--pin", action="store_true", help="as a grading session does: the timing core reserved, the round pinned to it")
    args = parser.parse_args()

    import json

    import torch

    from pytest_kcoral.case_runtime import CaseRuntime
    from pytest_kcoral.cases import NATIVE
    from pytest_kcoral.child_outputs import inspect_outputs, leaves
    from pytest_kcoral.child_timing import new_own_sets, time_round
    from pytest_kcoral.messages import Time
    from pytest_kcoral.timing.l2 import L2Flusher, PersistingL2Reset

    kind = "cuda" if torch.cuda.is_available() else "cpu"
    device = "cuda:0" if kind == "cuda" else "cpu"
    shape = json.loads(args.shape)
    case = CaseRuntime({"format": NATIVE, "device": device, "device_kind": kind, "source": str(ROOT / "cases" / args.case / "case.py")})
    rng = random.Random(1)
    reference = case.module.reference

    def bind(_shape: dict, values: tuple) -> Any:
        return lambda: reference(*values)

    from pytest_kcoral.timing import pinning

    core = None
    if args.pin and kind == "cuda":
        pinning.reserve([0])
        core = pinning.choose(0)
    command = Time(shape=shape, device=device, budget_s=1 / 32, timer=None, verify=1, written_inputs=[], warmup_s=0.0, cpu=core)
    held = new_own_sets(case, command, device, rng, bind)
    time_round(held, case, Time(shape=shape, device=device, budget_s=0.05, timer=None, verify=1, written_inputs=[]), device, rng)

    print(f"device {device}, case {args.case} {shape}, {len(held.sets)} input sets, timing core {core}")
    # the interim checks' share of a round: how long CUPTI's forced flushes and the re-attribution take
    from pytest_kcoral.timing import cupti_timer

    interim_s = [0.0]
    interim = cupti_timer.CuptiTimer.interim

    def timed_interim(self: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return interim(self)
        finally:
            interim_s[0] += time.perf_counter() - t0

    cupti_timer.CuptiTimer.interim = timed_interim  # type: ignore[method-assign]
    walls, counts, methods = [], [], set()
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        reply = time_round(held, case, command, device, rng)
        walls.append((time.perf_counter() - t0) * 1e3)
        counts.append(reply.stats.n)
        methods.add(reply.stats.method)
    cupti_timer.CuptiTimer.interim = interim  # type: ignore[method-assign]
    print(f"interim checks: {interim_s[0] * 1e3 / args.rounds:.1f} ms a round")
    print(f"rounds of {command.budget_s * 1e3:.1f} ms ({', '.join(sorted(methods))}): median {statistics.median(counts)} samples, "
          f"median wall {statistics.median(walls):.1f} ms a round, so {statistics.median(walls) * 1e3 / statistics.median(counts):.0f} us "
          f"a sample; median time {reply.stats.median_us:.2f} us, harness outside the window {reply.stats.outside_us or 0:.0f} us")

    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    values = held.sets[0]
    parts: dict[str, Any] = {
        "refresh (make_inputs + copy_)": lambda: [d.copy_(s) for d, s in zip(values, case.make_inputs(shape, rng.getrandbits(62)))],
        "make_inputs alone": lambda: case.make_inputs(shape, rng.getrandbits(62)),
        "the call": lambda: reference(*values),
        "inspect_outputs": lambda: inspect_outputs(leaves(reference(*values)), (), device),
        "synchronize": lambda: None,
    }
    if kind == "cuda":
        flusher = L2Flusher(torch, torch.device(device))
        reset = PersistingL2Reset()
        parts["L2 flush with persisting reset"] = flusher
        parts["persisting-L2 reset alone"] = reset
        parts["L2 flush read alone"] = lambda: torch.sum(flusher._buffer, 0, out=flusher._out)
    for name, fn in parts.items():
        print(f"  {name:34s} {per_call_us(fn, sync):8.1f} us")

    # the guards refuse a profile hook inside the timing loop, as they should; off for this profile only
    from pytest_kcoral.timing import guards

    guards.refuse_hooks = lambda when: None
    guards.clear_profile_and_trace = lambda: None
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(4):
        time_round(held, case, command, device, rng)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(22)
    print(out.getvalue())


if __name__ == "__main__":
    main()
