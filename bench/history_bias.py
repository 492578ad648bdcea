"""History bias: does what a process did on the GPU before timing move a short kernel's time?

Self-speedup runs put the same LayerNorm (32 x 256, fp32, about 2.9 us) 5-6% slower in the
baseline's trusted child than in the candidate's child, on every run of one host, whether the
trusted child was kept across items or fresh (``bench/role_bias.py``). The two children reach the
timer by different paths: the trusted one makes the correctness inputs on the device and calls the
reference on them; the candidate's gets them from the host, allocates the NaN poison and calls the
candidate. This bench starts fresh processes that take one path or none, then time the kernel as
``child._time`` does (16 placed input sets, outputs kept in rotation, CUPTI on a GPU), alternating
the variants, and prints each variant's medians.

Run on a GPU host: ``python bench/history_bias.py --processes 6``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("none", "trusted", "candidate")
TRIALS = 3  # correctness input sets, as --kcoral-trials' default


def _case(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "cases" / name / "case.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child(variant: str, case_name: str, shape: dict, budget_s: float) -> dict:
    import torch

    from pytest_kcoral import child as child_mod
    from pytest_kcoral import timing
    from pytest_kcoral.timing import placement

    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = _case(case_name)

    def make(seed: int) -> tuple:
        torch.manual_seed(seed)
        return tuple(case.make_inputs(shape, device))

    rng = random.Random()
    if variant == "trusted":  # child._cmd_reference: inputs made on the device, reference twice, baseline once
        for t in range(TRIALS):
            args = make(rng.getrandbits(62))
            outs = [case.reference(*[a.clone() for a in args]) for _ in range(3 if t == 0 else 2)]
            child_mod._to_cpu(child_mod._leaves(outs[0]))
    elif variant == "candidate":  # child._cmd_run: inputs from the host, copies, the poison, one call
        host_inputs = []
        for _ in range(TRIALS):
            torch.manual_seed(rng.getrandbits(62))
            host_inputs.append(tuple(case.make_inputs(shape, "cpu")))
        out_bytes = [t.numel() * t.element_size() for t in child_mod._leaves(case.reference(*host_inputs[0]))]
        for cpu_args in host_inputs:
            args = tuple(a.to(device, copy=True) for a in cpu_args)
            before = tuple(a.clone() for a in args)
            child_mod._poison(out_bytes, device)
            out = case.reference(*args)
            child_mod._synchronize(device)
            child_mod._to_cpu(child_mod._leaves(out))
            del before
    spread = placement.Placements(device, rng)
    seeds = [rng.getrandbits(62) for _ in range(3)]
    sets = spread.make_sets(make, seeds, lambda: rng.getrandbits(62))
    fns = [(lambda a=args: case.reference(*a)) for args in sets]
    stats = timing.measure(lambda k: fns[k](), n_sets=len(sets), on_output=spread.keep_output, device=device,
                           budget_s=budget_s, warmup_s=0.05)
    return {"variant": variant, "median_us": stats.median_us, "method": stats.method, "n": stats.n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6, help="fresh processes per variant, alternating")
    parser.add_argument("--case", default="layer_norm")
    parser.add_argument("--shape", default='{"rows": 32, "cols": 256}')
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = json.loads(args.shape)
    if args.child:
        print(json.dumps(child(args.child, args.case, shape, args.budget)))
        return
    medians: dict[str, list[float]] = {v: [] for v in VARIANTS}
    methods = set()
    for p in range(args.processes):
        order = VARIANTS if p % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--case", args.case, "--shape", args.shape,
                                  "--budget", str(args.budget)], capture_output=True, text=True, cwd=ROOT, check=False)
            if out.returncode:
                print(f"{variant}: exit {out.returncode}: {out.stderr[-800:]}", file=sys.stderr)
                continue
            result = json.loads(out.stdout.strip().splitlines()[-1])
            medians[variant].append(result["median_us"])
            methods.add(result["method"])
    print(f"{args.case} {shape}, {args.processes} processes per variant, budget {args.budget} s, timed by {', '.join(sorted(methods))}\n")
    print("| variant | median of medians us | per process us | vs none |\n|---|---|---|---|")
    base = statistics.median(medians["none"]) if medians["none"] else float("nan")
    for variant, values in medians.items():
        if values:
            m = statistics.median(values)
            print(f"| {variant} | {m:.3f} | {' '.join(f'{v:.3f}' for v in values)} | {m / base:.4f} |")


if __name__ == "__main__":
    main()
