"""What the cold-cache preparation before every timed call costs the host, part by part.

A GPU profile of fed calls (docs/performance.md, 2026-12-07 sixth session) read 207 us of host
time in ``timing.l2.L2Flusher.__call__`` per call, a quarter of a call's turn. The flusher does
three things each call: ``cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0)``,
``cudaCtxResetPersistingL2Cache`` and a read of twice the L2 (``torch.sum``). This times each
alone, and ``cudaDeviceGetLimit`` (a cheaper test of whether a reset is needed), with a small
kernel between calls as in a round. Medians over ``--calls``:

    python3 bench/flush_cost.py [--calls 2000]    (a GPU machine with cuda-bindings)
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import torch

    from pytest_kcoral.timing.l2 import L2Flusher

    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart  # cuda-python < 12.6
    limit = cudart.cudaLimit.cudaLimitPersistingL2CacheSize
    flusher = L2Flusher(torch, torch.device("cuda"))
    x = torch.randn(4096, device="cuda")
    parts = {
        "whole flusher": flusher,
        "set limit 0": lambda: cudart.cudaDeviceSetLimit(limit, 0),
        "reset persisting": cudart.cudaCtxResetPersistingL2Cache,
        "get limit": lambda: cudart.cudaDeviceGetLimit(limit),
        "read 2 x L2": lambda: flusher._sum(flusher._buffer, 0, out=flusher._out),
    }
    for name, part in parts.items():
        times = []
        for _ in range(args.calls):
            torch.relu(x)  # the timed call's kind of work between preparations
            torch.cuda.synchronize()
            started = time.perf_counter()
            part()
            times.append((time.perf_counter() - started) * 1e6)
        torch.cuda.synchronize()
        print(f"{name:18s} host us: median {statistics.median(times):7.1f}  p90 {sorted(times)[len(times) * 9 // 10]:7.1f}")


if __name__ == "__main__":
    main()
