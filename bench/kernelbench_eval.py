"""KernelBench-sized problems: our grader against a KernelBench-style eval loop, side by side.

For every problem file in ``bench/kernelbench/level1`` (KernelBench level 1 problems at their own
sizes, written for this bench), two candidates are made in a KernelBench run folder
(``level_1_problem_<id>_sample_<k>_kernel.py``): sample 0 is the problem's ``Model`` renamed
``ModelNew`` (identical code), sample 1 scales its output by 1.5 (wrong). Then, per problem:

1. the eval loop below, in a fresh interpreter per candidate, as KernelBench evaluates one
   generated kernel: build both models under one seed, 5 correctness trials on fresh inputs
   (``get_inputs()`` on the host, then copied to the GPU), and for a correct candidate 100 timed
   calls a side with CUDA events and an L2 flush before each;
2. ``pytest -p kcoral <problem file> --kcoral-submissions <run folder>``: both candidates in full
   mode, one session.

It prints each side's wall time per problem, and the grader's speedup for the identical
candidate (which must lie within 2% of 1.0). Run on a GPU host:

    python bench/kernelbench_eval.py [--only 19_ReLU] [--skip-eval] [--out DIR]

``--eval-child`` is the eval loop itself, started by this script.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LEVEL = HERE / "kernelbench" / "level1"
ROOT = HERE.parent
TRIALS = 5
TIMED_CALLS = 100
WARMUP_CALLS = 3
L2_FLUSH_BYTES = 256 << 20
ATOL = RTOL = 1e-2  # KernelBench's tolerance


def write_run_folder(level: Path, run: Path) -> list[Path]:
    """Two samples per problem in KernelBench's run layout; returns the problem files."""
    problems = sorted(p for p in level.glob("*.py") if re.match(r"\d+_", p.name))
    run.mkdir(parents=True, exist_ok=True)
    for problem in problems:
        pid = problem.name.split("_", 1)[0]
        source = problem.read_text().replace("class Model(", "class ModelNew(")
        (run / f"level_1_problem_{pid}_sample_0_kernel.py").write_text(source)
        wrong = source + ("\n\n_forward = ModelNew.forward\n\n\ndef _wrong(self, *args):\n    return _forward(self, *args) * 1.5\n\n\n"
                          "ModelNew.forward = _wrong\n")
        (run / f"level_1_problem_{pid}_sample_1_kernel.py").write_text(wrong)
    return problems


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eval_loop(problem_path: Path, kernel_path: Path, device: str = "cuda") -> dict:
    """KernelBench's evaluation of one generated kernel, written afresh: correctness, then timing."""
    import torch

    started = time.perf_counter()
    problem = _load(problem_path, "problem")
    kernel = _load(kernel_path, "kernel")
    init = problem.get_init_inputs()
    torch.manual_seed(42)
    model = problem.Model(*init).to(device)
    torch.manual_seed(42)
    new = kernel.ModelNew(*init).to(device)
    correct = True
    with torch.no_grad():
        for trial in range(TRIALS):
            torch.manual_seed(trial)
            inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
            if not torch.allclose(model(*inputs), new(*inputs), atol=ATOL, rtol=RTOL):
                correct = False
                break
        times_ms = {}
        if correct:
            flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
            for side, fn in (("reference", model), ("candidate", new)):
                for _ in range(WARMUP_CALLS):
                    fn(*inputs)
                torch.cuda.synchronize()
                samples = []
                for _ in range(TIMED_CALLS):
                    flush.zero_()
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record()
                    fn(*inputs)
                    end.record()
                    torch.cuda.synchronize()
                    samples.append(begin.elapsed_time(end))
                times_ms[side] = sorted(samples)[len(samples) // 2]
    return {"correct": correct, "times_ms": times_ms, "loop_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="problem file stems to run (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--skip-eval", action="store_true", help="the grader only (the eval loop's columns left empty)")
    parser.add_argument("--eval-child", nargs=2, metavar=("PROBLEM", "KERNEL"), help=argparse.SUPPRESS)
    parser.add_argument("pytest_args", nargs="*", default=[])
    args = parser.parse_args()
    if args.eval_child:
        print(json.dumps(eval_loop(Path(args.eval_child[0]), Path(args.eval_child[1]))))
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="kcoral-kernelbench-"))
    run = out / "runs" / "self"
    problems = [p for p in write_run_folder(LEVEL, run) if not args.only or p.stem in args.only]
    print("| problem | eval loop s (sample 0 + 1, fresh interpreters) | loop only s | grader s (both, one session) | grader / eval |"
          " speedup (identical) | eval: correct (0 / 1); ours: outcome (0 / 1) |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for problem in problems:
        pid = problem.name.split("_", 1)[0]
        eval_s, loop_s, verdicts = 0.0, 0.0, []
        for sample in () if args.skip_eval else (0, 1):
            kernel = run / f"level_1_problem_{pid}_sample_{sample}_kernel.py"
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--eval-child", str(problem), str(kernel)], capture_output=True, text=True)
            eval_s += time.perf_counter() - started
            result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {"correct": None, "loop_s": 0.0}
            loop_s += result["loop_s"]
            verdicts.append(result["correct"])
        json_path = out / f"{problem.stem}.json"
        cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", str(problem), "--kcoral-submissions",
               str(run.parent), "--kcoral-json", str(json_path), *args.pytest_args]
        started = time.perf_counter()
        with open(out / f"{problem.stem}.log", "w") as log:
            subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        grader_s = time.perf_counter() - started
        items = {i["candidate"]: i for i in json.loads(json_path.read_text())["items"]} if json_path.exists() else {}
        same = next((i for name, i in items.items() if name.endswith("sample_0")), {})
        # the item's outcome, not its correctness stage: a correct sample can still fail in timing (the device's memory)
        ours = [next((i.get("outcome") for name, i in items.items() if name.endswith(f"sample_{k}")), None) for k in (0, 1)]
        speedup = same.get("speedup")
        ratio = f"{grader_s / eval_s:.2f}" if eval_s else "-"
        print(f"| {problem.stem} | {eval_s:.1f} | {loop_s:.1f} | {grader_s:.1f} | {ratio} | "
              f"{speedup if speedup is None else f'{speedup:.4f}'} | eval {verdicts}, ours {ours} |", flush=True)
    print(f"\nJSON and logs: {out}")


if __name__ == "__main__":
    main()
