"""How close pytest-kcoral's timer comes to Nsight Compute, beside the usual alternatives.

Times kernels from about 1 us to 10 ms (elementwise adds over a range of sizes, a Triton add,
matmuls, a multi-kernel PyTorch function) with:

- ``kcoral``        pytest-kcoral's default timer (CUPTI span; read-flushed L2, fresh input sets)
- ``kcoral-events`` pytest-kcoral's events fallback (``method="events"``)
- ``events``        plain CUDA events around each call, L2 read-flushed before each
- ``do_bench``      ``triton.testing.do_bench(fn, return_mode="median")`` (flushes with ``zero_``)
- ``ncu``           Nsight Compute ``gpu__time_duration.sum`` summed over the call's kernels,
                    ``--clock-control none --cache-control all`` (L2 flushed before every kernel)
- ``ncu_callflush`` the same with ``--cache-control none`` and pytest-kcoral's read flush before
                    each call (for multi-kernel calls: later kernels pay for earlier kernels'
                    dirty lines, as they do in real use)

and prints each method's ratio to Nsight Compute. Target for ``kcoral``: within 5% of ncu for
every case of 20 us or more, within 1.5 us for shorter ones.

    python bench/timing_fidelity.py [--json results.json] [--budget 0.5] [--no-ncu]
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch

NCU_CALLS = 5  # profiled calls per case under ncu
_MARKER_CYCLES = 1000  # torch.cuda._sleep: its spin_kernel brackets each case under ncu


def _add_case(n: int) -> Callable[[], tuple[list[tuple], Callable]]:
    def setup():
        sets = [(torch.randn(n, device="cuda"), torch.randn(n, device="cuda"),
                 torch.empty(n, device="cuda")) for _ in range(3)]
        return sets, lambda a, b, out: torch.add(a, b, out=out)
    return setup


def _triton_add_case(n: int):
    def setup():
        import triton
        import triton.language as tl

        @triton.jit
        def add_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n_elements
            tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask),
                     mask=mask)

        def fn(a, b, out):
            add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
            return out

        sets = [(torch.randn(n, device="cuda"), torch.randn(n, device="cuda"),
                 torch.empty(n, device="cuda")) for _ in range(3)]
        return sets, fn
    return setup


def _matmul_case(m: int, dtype: torch.dtype):
    def setup():
        sets = [(torch.randn(m, m, device="cuda", dtype=dtype), torch.randn(m, m, device="cuda", dtype=dtype),
                 torch.empty(m, m, device="cuda", dtype=dtype)) for _ in range(3)]
        return sets, lambda a, b, out: torch.mm(a, b, out=out)
    return setup


def _multi_kernel_case(rows: int, cols: int):
    def setup():
        sets = [(torch.randn(rows, cols, device="cuda"),) for _ in range(3)]

        def fn(x):
            y = torch.softmax(x, dim=-1)
            z = y * 2.0 + x
            return z.sum(dim=0)
        return sets, fn
    return setup


CASES: list[tuple[str, Callable]] = [
    ("add fp32 n=2^10", _add_case(1 << 10)),
    ("add fp32 n=2^16", _add_case(1 << 16)),
    ("add fp32 n=2^20", _add_case(1 << 20)),
    ("add fp32 n=2^22", _add_case(1 << 22)),
    ("add fp32 n=2^24", _add_case(1 << 24)),
    ("add fp32 n=2^26", _add_case(1 << 26)),
    ("triton add n=2^22", _triton_add_case(1 << 22)),
    ("mm bf16 4096", _matmul_case(4096, torch.bfloat16)),
    ("mm fp32 6144", _matmul_case(6144, torch.float32)),
    ("softmax*2+x, sum 4096x4096", _multi_kernel_case(4096, 4096)),
]


def ncu_child(names_path: str, flush: bool) -> None:
    """Run under ncu: per case, set up and warm up, then NCU_CALLS calls, each between two markers.

    With ``flush`` each call is preceded (outside its markers) by pytest-kcoral's L2 read flush,
    for the pass that runs ncu with ``--cache-control none``.
    """
    torch.backends.cuda.matmul.allow_tf32 = False
    flusher = None
    if flush:
        from pytest_kcoral.timing.l2 import L2Flusher

        flusher = L2Flusher(torch, torch.device("cuda"))
    for _name, setup in CASES:
        sets, fn = setup()
        fn(*sets[0])
        torch.cuda.synchronize()
        for _ in range(NCU_CALLS):
            if flusher is not None:
                flusher()
            torch.cuda._sleep(_MARKER_CYCLES)
            fn(*sets[0])
            torch.cuda._sleep(_MARKER_CYCLES)
        torch.cuda.synchronize()
        del sets
    with open(names_path, "w") as f:
        json.dump([name for name, _ in CASES], f)


def run_ncu(cache_control: str) -> tuple[dict[str, float], str]:
    """Median over NCU_CALLS calls of the summed ``gpu__time_duration.sum`` of each call's kernels."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise RuntimeError("ncu not found on PATH")
    tmp = tempfile.mkdtemp(prefix="kcoral-ncu-")
    log = os.path.join(tmp, "ncu.csv")
    names_path = os.path.join(tmp, "names.json")
    child = [sys.executable, os.path.abspath(__file__), "--ncu-child", names_path]
    if cache_control == "none":
        child.append("--ncu-flush")
    cmd = [ncu, "--clock-control", "none", "--cache-control", cache_control,
           "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
           "--log-file", log, *child]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    if proc.returncode != 0:
        raise RuntimeError(f"ncu failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    with open(names_path) as f:
        names = json.load(f)
    with open(log) as f:
        text = "".join(line for line in f if line.startswith('"'))
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r.get("Metric Name") == "gpu__time_duration.sum"]
    scales = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
              "second": 1e9, "s": 1e9}
    calls: list[float] = []  # ns per call, in order
    inside, acc = False, 0.0
    for r in rows:
        if "spin_kernel" in r["Kernel Name"]:
            if inside:
                calls.append(acc)
            inside, acc = not inside, 0.0
            continue
        if inside:
            acc += float(r["Metric Value"].replace(",", "")) * scales.get(r.get("Metric Unit", "ns"), 1.0)
    per_case: dict[str, float] = {}
    for i, name in enumerate(names):
        chunk = sorted(calls[i * NCU_CALLS:(i + 1) * NCU_CALLS])
        if len(chunk) == NCU_CALLS:
            per_case[name] = chunk[NCU_CALLS // 2] / 1e3
    placeholders = {log: "LOG.csv", names_path: "NAMES.json", sys.executable: "python",
                    os.path.abspath(__file__): "bench/timing_fidelity.py"}
    shown = [placeholders.get(c, c) for c in cmd]
    return per_case, " ".join(shown)


def events_around_each_call(fn: Callable, args: tuple, reps: int = 50) -> float:
    from pytest_kcoral.timing.l2 import L2Flusher

    flusher = L2Flusher(torch, torch.device("cuda"))
    times = []
    for _ in range(5):
        fn(*args)
    for _ in range(reps):
        flusher()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ncu-child", metavar="NAMES_JSON")
    parser.add_argument("--ncu-flush", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--budget", type=float, default=0.5, help="kcoral timing budget per case (s)")
    parser.add_argument("--no-ncu", action="store_true")
    args = parser.parse_args()
    if args.ncu_child:
        ncu_child(args.ncu_child, args.ncu_flush)
        return 0

    from pytest_kcoral import timing

    timing.prepare("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    import triton
    import triton.testing

    env: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }
    try:
        from importlib.metadata import version

        env["cupti-python"] = version("cupti-python")
    except Exception:  # noqa: BLE001
        env["cupti-python"] = None
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
        env["ncu"] = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except Exception:  # noqa: BLE001
        pass
    print("environment:", json.dumps(env), flush=True)

    results: list[dict[str, Any]] = []
    for name, setup in CASES:
        sets, fn = setup()

        def call(i: int, fn=fn, sets=sets):
            return fn(*sets[i])

        row: dict[str, Any] = {"case": name}
        k = timing.measure(call, n_sets=len(sets), device="cuda", budget_s=args.budget)
        row.update(kcoral=k.median_us, kcoral_method=k.method, kcoral_busy=k.busy_us,
                   kcoral_records=k.records, kcoral_n=k.n, kcoral_rse=k.rse,
                   kcoral_host=k.host_median_us, kcoral_flags=[f for f in k.flags if not f.startswith("l2_flush")])
        e = timing.measure(call, n_sets=len(sets), device="cuda", method="events", budget_s=args.budget)
        row["kcoral_events"] = e.median_us
        row["events"] = events_around_each_call(fn, sets[0])
        row["do_bench"] = triton.testing.do_bench(functools.partial(fn, *sets[0]), return_mode="median") * 1e3
        results.append(row)
        print(f"{name:28s} kcoral {k.median_us:10.2f} us ({k.method}, n={k.n}, rse={k.rse:.4f}, "
              f"busy {k.busy_us}, records {k.records})  kcoral-events {e.median_us:10.2f}  "
              f"events {row['events']:10.2f}  do_bench {row['do_bench']:10.2f}", flush=True)
        del sets, fn, call
        torch.cuda.empty_cache()

    ncu_cmds = []
    if not args.no_ncu:
        for cache_control, key in (("all", "ncu"), ("none", "ncu_callflush")):
            try:
                ncu_us, cmd = run_ncu(cache_control)
                ncu_cmds.append(cmd)
            except Exception as exc:  # noqa: BLE001
                print(f"ncu --cache-control {cache_control}: {exc}", flush=True)
                ncu_us = {}
            for row in results:
                row[key] = ncu_us.get(row["case"])

    methods = ["kcoral", "kcoral_busy", "kcoral_events", "events", "do_bench", "ncu_callflush"]
    header = "| case | ncu us | " + " | ".join(f"{m} us (x ncu)" for m in methods) + " | kcoral target |"
    lines = [header, "|" + "---|" * (len(methods) + 3)]
    failures = 0
    for row in results:
        ncu = row.get("ncu")
        cells = []
        for m in methods:
            v = row.get(m)
            if v is None:
                cells.append("-")
            else:
                cells.append(f"{v:.2f} ({v / ncu:.3f})" if ncu else f"{v:.2f}")
        verdict = "n/a"
        if ncu:
            ok = abs(row["kcoral"] / ncu - 1) <= 0.05 if ncu >= 20 else abs(row["kcoral"] - ncu) <= 1.5
            verdict = "pass" if ok else "FAIL"
            failures += not ok
        lines.append(f"| {row['case']} | {ncu:.2f} | " if ncu else f"| {row['case']} | - | ")
        lines[-1] += " | ".join(cells) + f" | {verdict} |"
    table = "\n".join(lines)
    print("\n" + table, flush=True)
    for cmd in ncu_cmds:
        print("ncu command:", cmd)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": results, "ncu_commands": ncu_cmds, "table": table}, f,
                      indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
