"""The feed's cost per timed call: a trusted ``Feeder`` and a fed child's ``FedSets`` in two fresh
processes, as the grader pairs them (``pytest_kcoral/feed.py``), without the timing loop.

    python bench/feed_cost.py [--device cuda:0] [--calls 2000] [--n 4096 --n 16777216] [--tree DIR]

For each size of ``cases/vector_add`` it prints, medians over the calls: the fed child's round
trip for one call's fresh inputs (its request, the trusted child's judging and writing, the
answer), and the trusted child's own share of it. The difference is the two processes' wake-ups
and the messages. The trusted child's share is split into its parts: the judging of the last
call (``judge``), of which the values' check (``values``), and the writing of the next set
(``write``, the case's make_inputs and the copies) and its wait for the device (``sync``).
``--tree``: the ``pytest_kcoral`` to import (an older tree, for a side-by-side run).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = ROOT / "cases" / "vector_add" / "case.py"


def _timed(owner: object, name: str, parts: dict[str, list[float]], key: str) -> None:
    """Wrap ``owner.name`` so that each call's wall time lands in ``parts[key]``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            parts.setdefault(key, []).append((time.perf_counter() - started) * 1e6)

    setattr(owner, name, wrapper)


def _trusted(sock: socket.socket, device: str, n: int, tree: str, out: mp.Queue) -> None:
    sys.path.insert(0, tree)
    import torch

    from pytest_kcoral.case_runtime import CaseRuntime
    from pytest_kcoral.child import Unpredictable
    from pytest_kcoral.child_feeder import Feeder
    from pytest_kcoral.child_judges import Pricing, TimedCalls
    from pytest_kcoral.feed import FeedChannel
    from pytest_kcoral.messages import FeedPeer, ToleranceSpec

    torch.set_num_threads(1)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    case = CaseRuntime({"format": "native", "source": str(CASE), "device": device, "device_kind": kind})
    config = FeedPeer(peer="candidate", shape={"n": n}, device=device, tolerance=ToleranceSpec(atol=None, rtol=None), inplace=[],
                      written_inputs=[], may_write=[])
    feeder = Feeder(case, FeedChannel(sock), config, TimedCalls(case, config, Unpredictable(), Pricing()))
    from pytest_kcoral import child_feeder

    parts: dict[str, list[float]] = {}
    _timed(feeder.judge, "judge", parts, "judge")
    if hasattr(feeder.judge, "_values"):
        _timed(feeder.judge, "_values", parts, "values")
    _timed(feeder, "_write", parts, "write")
    _timed(child_feeder, "synchronize", parts, "sync")
    profile = None
    if os.environ.get("KCORAL_FEED_PROFILE"):  # where the trusted child's time goes, function by function
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    work_us = []
    while feeder.open:
        select.select([sock], [], [])  # as the trusted child's loop waits: the request is there
        started = time.perf_counter()
        feeder.serve_one()
        work_us.append((time.perf_counter() - started) * 1e6)
    if profile is not None:
        import pstats

        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(22)
    rounds = feeder.report(final=True).rounds
    out.put({"trusted_us": statistics.median(work_us[2:-1]) if len(work_us) > 3 else None,
             "parts": {k: statistics.median(v[2:]) for k, v in parts.items() if len(v) > 3},
             "checked": sum(r.checked for r in rounds), "calls": sum(r.calls for r in rounds), "problems": [p for r in rounds for p in r.problems][:3]})


def _fed(sock: socket.socket, device: str, n: int, calls: int, tree: str, out: mp.Queue) -> None:
    sys.path.insert(0, tree)
    import torch

    from pytest_kcoral.child_timing import FedSets
    from pytest_kcoral.feed import FeedChannel

    torch.set_num_threads(1)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    started = time.perf_counter()
    sets = FedSets(FeedChannel(sock), {"n": n}, 3, device, lambda _shape, args: (lambda: args[0] + args[1]))
    setup_ms = (time.perf_counter() - started) * 1e3
    trips = []
    for i in range(calls):
        k = i % len(sets.sets)
        t0 = time.perf_counter()
        sets.refresh(k)
        trips.append((time.perf_counter() - t0) * 1e6)
        sets.keep(k, sets.fns[k](), [])
    sets.end_round()
    sets.channel.close()
    out.put({"round_trip_us": statistics.median(trips), "p90_us": sorted(trips)[int(0.9 * len(trips))], "setup_ms": setup_ms,
             "sets": len(sets.sets)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--n", type=int, action="append", help="vector_add sizes (default 4096 and 2**24)")
    parser.add_argument("--tree", default=str(ROOT), help="the folder holding the pytest_kcoral to time (default: this checkout)")
    args = parser.parse_args()
    tree = str(Path(args.tree).resolve())
    ctx = mp.get_context("spawn")  # neither process may inherit a CUDA context
    print(f"pytest_kcoral from {tree}")
    print("| n | sets | fed child's round trip us (median) | p90 us | trusted child's own us | its parts us | checked/calls | setup ms |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.n or [4096, 1 << 24]:
        trusted_end, fed_end = socket.socketpair()
        queue: mp.Queue = ctx.Queue()
        procs = [ctx.Process(target=_trusted, args=(trusted_end, args.device, n, tree, queue)),
                 ctx.Process(target=_fed, args=(fed_end, args.device, n, args.calls, tree, queue))]
        for p in procs:
            p.start()
        trusted_end.close()
        fed_end.close()
        found: dict = {}
        for _ in procs:
            found.update(queue.get(timeout=300))
        for p in procs:
            p.join(30)
        parts = " ".join(f"{k} {v:.0f}" for k, v in found.get("parts", {}).items())
        print(f"| {n} | {found.get('sets')} | {found.get('round_trip_us', 0):.1f} | {found.get('p90_us', 0):.1f} | "
              f"{found.get('trusted_us') or 0:.1f} | {parts} | {found.get('checked')}/{found.get('calls')} | {found.get('setup_ms', 0):.1f} |"
              + (f" problems: {found['problems']}" if found.get("problems") else ""), flush=True)


if __name__ == "__main__":
    main()
