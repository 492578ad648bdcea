"""Where a grading session's fixed start-up time goes: what runs once before the first item can take
the device, and what every child pays before the candidate's code loads.

Run: ``python bench/startup.py`` (on the GPU machine: after ``source bench/gpu_env.sh``). It prints
medians over ``--repeats`` of

1. fresh interpreters importing what the pytest process and the template import (torch, triton);
2. the GPU listing that device selection runs (``nvidia-smi``, as ``devices.py`` calls it);
3. a child forked from a process that imported the template's modules (no CUDA initialized, as in
   the template), in parts: ``torch.cuda.is_available()``, importing cupti-python and
   cuda-bindings, the CUDA context (set_device and a first kernel), and a CUPTI-timed call; once
   as the template is now, and once with cupti-python and cuda-bindings imported before the fork
   (``preloaded``), which shows whether that preload would be safe and what it would save;
4. a real child started from the template (``isolation.Child``) for a CUDA case: start-up to its
   first reply;
5. a grading session of one case in correctness mode: its wall time, when the first lease was
   taken, the first item's compile phase (which waits for the template's imports), the later
   items' (a child's start and the candidate's import: the device's idle time between items on
   one GPU), and the time from the last lease to the end.

Scaling's fixed cost (``bench/scaling.py``'s "start to first lease" and "last lease to end") is
what the two GPUs cannot share; this bench says what it is made of.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS = ("is_available", "import cupti", "import cuda.bindings", "context + first kernel", "timing.prepare",
         "cupti-timed call (0.05 s budget)")
sys.path.insert(0, str(REPO))


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interpreter(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True)


def nvidia_smi() -> None:
    from pytest_kcoral.devices import query_nvidia_smi

    query_nvidia_smi()


def _child_parts() -> dict:
    """In a forked child of this process (which imported the template's modules, CUDA untouched):
    the time of each step a child takes on a GPU before the candidate's code runs."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report one JSON line, exit without cleanup handlers
        os.close(read_fd)
        parts: dict = {}
        try:
            import torch

            def step(name, fn):
                t0 = time.perf_counter()
                value = fn()
                parts[name] = time.perf_counter() - t0
                return value

            step("is_available", torch.cuda.is_available)
            step("import cupti", lambda: __import__("cupti.cupti"))
            step("import cuda.bindings", lambda: __import__("cuda.bindings.runtime"))

            def context():
                torch.cuda.set_device(0)
                torch.empty(1, device="cuda").add_(1)
                torch.cuda.synchronize()

            step("context + first kernel", context)
            from pytest_kcoral import timing

            step("timing.prepare", lambda: timing.prepare("cuda:0"))
            x = torch.randn(1 << 20, device="cuda")
            stats = step("cupti-timed call (0.05 s budget)",
                         lambda: timing.measure(lambda i: x * 2, n_sets=1, device="cuda:0", method="cupti", budget_s=0.05))
            parts["method"] = stats.method
            parts["median_us"] = stats.median_us
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            parts["error"] = f"{type(exc).__name__}: {exc}"
        os.write(write_fd, (json.dumps(parts) + "\n").encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        line = pipe.readline()
    os.waitpid(pid, 0)
    return json.loads(line) if line else {"error": "no reply"}


def child_parts(repeats: int) -> list[tuple[str, dict]]:
    """Both variants; the preloaded one last, since its imports cannot be undone in this process."""
    import importlib

    from pytest_kcoral.isolation import TEMPLATE_PRELOAD

    for name in TEMPLATE_PRELOAD:
        importlib.import_module(name)
    rows = []
    for label, preload in (("as the template is now", False), ("cupti + cuda.bindings preloaded", True)):
        if preload:
            try:
                importlib.import_module("cupti.cupti")
                importlib.import_module("cuda.bindings.runtime")
            except ImportError as exc:
                rows.append((label, {"error": f"cannot preload: {exc}"}))
                continue
        runs = [_child_parts() for _ in range(repeats)]
        errors = [r["error"] for r in runs if "error" in r]
        if errors:
            rows.append((label, {"error": errors[0]}))
            continue
        merged = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], float)}
        merged["method"] = ",".join(sorted({r["method"] for r in runs}))
        rows.append((label, merged))
    return rows


def real_child_start(repeats: int) -> float:
    """A child of the real template for a CUDA case, start to its first reply."""
    from pytest_kcoral.isolation import Child

    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp) / "case.py"
        case.write_text("import torch\nSEEN = [{'n': 16}]\nUNSEEN = [{'n': 17}]\n"
                        "def make_inputs(shape, device):\n    return (torch.randn(shape['n'], device=device),)\n"
                        "def reference(a):\n    return a * 2\n")
        spec = {"format": "native", "source": str(case), "device": "cpu", "device_kind": "cuda"}
        Child("candidate", spec, {}, time.monotonic() + 120).close()  # the template's own start, not counted
        times = []
        for _ in range(repeats):
            child = Child("candidate", spec, {}, time.monotonic() + 120)
            times.append(child.startup_s)
            child.close()
    return statistics.median(times)


def session_timeline(case: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        artifact = Path(tmp) / "results.json"
        cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", case, "-m", "seen",
               "--kcoral-mode", "correctness", "--kcoral-json", str(artifact), *extra]
        started = time.time()  # the lease history's clock
        subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ended = time.time()
        doc = json.loads(artifact.read_text())
    leases = sorted(doc["lease_history"], key=lambda r: r["t_acquired"])
    first = next((it for it in doc["items"] if leases and it["nodeid"] == leases[0]["label"]), {})
    return {
        "command": shlex.join(cmd[1:]),
        "wall_s": ended - started,
        "first_lease_s": leases[0]["t_acquired"] - started if leases else None,
        "first_compile_s": (first.get("phases_ms") or {}).get("compile", 0) / 1000,
        # every later item's compile: a candidate child's start and import, outside the lease,
        # so on one GPU the device idles for it between items
        "later_compile_s": statistics.median(later) if (later := [it["phases_ms"]["compile"] / 1000 for it in doc["items"]
                                                                  if it is not first and "compile" in (it.get("phases_ms") or {})]) else None,
        "last_lease_to_end_s": ended - leases[-1]["t_released"] if leases else None,
        "items": len(doc["items"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--case", default="cases/vector_add", help="the case graded for the session timeline")
    args = parser.parse_args()

    print(f"medians of {args.repeats}; python {sys.version.split()[0]}\n")
    print("| what | s |\n|---|---|")
    print(f"| fresh interpreter: import torch | {median_s(lambda: interpreter('import torch'), args.repeats):.2f} |")
    print(f"| fresh interpreter: import torch, triton | {median_s(lambda: interpreter('import torch, triton'), args.repeats):.2f} |")
    collect = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "--collect-only", "-q", "cases"]
    collect_s = median_s(lambda: subprocess.run(collect, cwd=REPO, stdout=subprocess.DEVNULL, check=True), args.repeats)
    print(f"| pytest --collect-only -p kcoral cases | {collect_s:.2f} |")
    print(f"| nvidia-smi GPU listing (devices.py) | {median_s(nvidia_smi, args.repeats):.3f} |")

    timeline = session_timeline(args.case, [])
    print(f"\nsession: `{timeline['command']}` ({timeline['items']} items)\n")
    print("| wall s | first lease at s | first item's compile s | later items' compile s (median) | last lease to end s |\n|---|---|---|---|---|")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    print(f"| {fmt(timeline['wall_s'])} | {fmt(timeline['first_lease_s'])} | {fmt(timeline['first_compile_s'])} | "
          f"{fmt(timeline['later_compile_s'])} | {fmt(timeline['last_lease_to_end_s'])} |")

    if not _has_gpu():
        print("\nno CUDA device: the child's GPU start-up parts are not measured")
        return
    print(f"\nreal child from the template, CUDA case, start to first reply: {real_child_start(max(args.repeats, 5)):.3f} s")
    print("\nparts of a child's GPU start-up, forked from a process holding the template's imports:\n")
    rows = child_parts(args.repeats)
    print("| variant | " + " | ".join(f"{k} s" for k in STEPS) + " | method | median us |")
    print("|---|" + "---|" * (len(STEPS) + 2))
    for label, r in rows:
        if "error" in r:
            print(f"| {label} | {r['error']} |")
            continue
        print(f"| {label} | " + " | ".join(f"{r[k]:.3f}" for k in STEPS) + f" | {r['method']} | {r['median_us']:.1f} |")


def _has_gpu() -> bool:
    """Whether this process sees a GPU, without initializing CUDA here (the forks need it clean)."""
    from pytest_kcoral.devices import map_visible_gpus, query_nvidia_smi

    rows = query_nvidia_smi()
    return bool(rows) and bool(map_visible_gpus(rows, os.environ.get("CUDA_VISIBLE_DEVICES")))


if __name__ == "__main__":
    main()
