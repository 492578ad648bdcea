"""The CUDA events' own cost on this GPU, and what the events timer reads against CUPTI.

``python3 bench/events_cost.py`` (on a GPU machine; CUPTI rows need cupti-python). Prints:
plain events around an fp32 add of 2^22 elements after a read flush, with GPU busy-waits of
several lengths in front (if the busy-wait hides the launch, the length changes nothing); the span
between two consecutive events with nothing between them (the events' own cost, which the events
timer subtracts); and ``timing.measure`` by events and by CUPTI with their flags. Session 3's
figures (two-GPU H200 host): plain events 15.9 us whatever the busy-wait, two events 2.9 us apart,
CUPTI 11.8 us.
"""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 22)
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    import torch

    from pytest_kcoral import timing

    sets = [(torch.randn(args.n, device="cuda"), torch.randn(args.n, device="cuda"), torch.empty(args.n, device="cuda")) for _ in range(3)]

    def call(i: int):
        a, b, out = sets[i]
        return torch.add(a, b, out=out)

    start, end, after = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    flush = torch.empty(60 << 20, dtype=torch.int32, device="cuda")
    for cycles in (0, 40_000, 200_000):
        spans, pairs = [], []
        for k in range(args.calls):
            flush.sum()
            if cycles:
                torch.cuda._sleep(cycles)
            start.record()
            call(k % 3)
            end.record()
            after.record()
            torch.cuda.synchronize()
            spans.append(start.elapsed_time(end) * 1e3)
            pairs.append(end.elapsed_time(after) * 1e3)
        print(f"plain events, busy-wait {cycles} cycles: add {statistics.median(spans):.3f} us; two consecutive events {statistics.median(pairs):.3f} us")
    for method in ("events", "cupti"):
        try:
            r = timing.measure(call, n_sets=3, device="cuda", method=method, budget_s=0.4)
        except timing.TimerUnavailable as exc:
            print(f"timing.measure {method}: unavailable ({exc})")
            continue
        print(f"timing.measure {method}: {r.median_us:.3f} us {r.flags}")


if __name__ == "__main__":
    main()
