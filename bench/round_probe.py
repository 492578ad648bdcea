"""Timing rounds in a plain process and inside a real grading child, side by side.

On an H200 a grading child took about 38 timed calls in a round of 31 ms, where the same rounds in
a plain process took 90-130 (``bench/sample_cost.py``). This tells whether the child's process
(forked from the template, confined, pinned) is the cause: it runs the same rounds

1. in this process, and
2. inside a candidate's child, from the candidate's first call (a probe candidate that prints its
   figures to stderr; the JSON's ``output_tail`` brings them back).

Each runs in a few variants (``VARIANTS``), so one run says which part of a round costs the calls.
Run: ``python bench/round_probe.py`` (a GPU, or the CPU), on its own: its lines are long.
"""

from __future__ import annotations

import json
import os
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


# What each variant changes for its rounds: module globals of the timing code, set for the
# variant and put back after. The child's lost time was CUPTI's buffer (asked for anew after each
# forced flush) and the interim checks (a forced flush and a re-attribution each); the variants
# put back the settings before the fix, one at a time and together.
_BUFFER = ("pytest_kcoral.timing.cupti_timer", "_BUFFER_BYTES")
_GROWTH = ("pytest_kcoral.timing", "_CHECK_GROWTH")  # {}: every timer checks at n/4, as all did before
VARIANTS: dict[str, dict[tuple[str, str], Any]] = {
    "as is": {},
    "8 MiB buffer": {_BUFFER: 8 << 20},
    "checks every n/4": {_GROWTH: {}},
    "both (before)": {_BUFFER: 8 << 20, _GROWTH: {}},
    "no interim checks": {("pytest_kcoral.timing", "_FIRST_CHECK"): 1 << 30},
}


def _timed(fn: Any, spent: list[float]) -> Any:
    """``fn``, adding the time each call takes to ``spent[0]``."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0
    return wrapper


def probe(device: str, rounds: int = 12) -> str:
    """Rounds of 1/32 s as the grader takes them, once per variant: one line each, with the
    calls a round, the wall time a round and the time in the interim and final per-call times."""
    import importlib

    import torch

    from pytest_kcoral import timing
    from pytest_kcoral.case_runtime import CaseRuntime
    from pytest_kcoral.cases import NATIVE
    from pytest_kcoral.child_timing import new_own_sets, time_round
    from pytest_kcoral.messages import Time

    kind = "cuda" if device.startswith("cuda") else "cpu"
    case = CaseRuntime({"format": NATIVE, "device": device, "device_kind": kind, "source": str(ROOT / "cases" / "vector_add" / "case.py")})
    reference = case.module.reference
    rng = random.Random(1)
    command = Time(shape=SHAPE, device=device, budget_s=1 / 32, timer=None, verify=1, written_inputs=[], warmup_s=0.0)
    held = new_own_sets(case, command, device, rng, lambda _s, values: (lambda: reference(*values)))
    time_round(held, case, command, device, rng)
    lines = [f"torch threads {torch.get_num_threads()}, cores {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}"]
    from pytest_kcoral.timing import cupti_timer

    for name, changes in VARIANTS.items():
        spent, timer_spent = [0.0], [0.0]
        per_call_times = timing.per_call_times
        start, stop = cupti_timer.CuptiTimer.start, cupti_timer.CuptiTimer.stop
        modules = {module: importlib.import_module(module) for module, _ in changes}
        saved = {(module, attr): getattr(modules[module], attr) for module, attr in changes}
        for (module, attr), value in changes.items():
            setattr(modules[module], attr, value)
        timing.per_call_times = _timed(per_call_times, spent)  # type: ignore[attr-defined]
        # CUPTI's enabling and disabling of its activity kinds, once a round each
        cupti_timer.CuptiTimer.start = _timed(start, timer_spent)  # type: ignore[method-assign]
        cupti_timer.CuptiTimer.stop = _timed(stop, timer_spent)  # type: ignore[method-assign]
        try:
            counts, walls = [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                reply = time_round(held, case, command, device, rng)
                walls.append(time.perf_counter() - t0)
                counts.append(reply.stats.n)
        finally:
            timing.per_call_times = per_call_times  # type: ignore[attr-defined]
            cupti_timer.CuptiTimer.start, cupti_timer.CuptiTimer.stop = start, stop  # type: ignore[method-assign]
            for (module, attr), value in saved.items():
                setattr(modules[module], attr, value)
        lines.append(f"{name:20s} {statistics.median(counts):6.1f} calls a round, {statistics.median(walls) * 1e3:5.1f} ms a round,"
                     f" per-call times {spent[0] * 1e3 / rounds:5.1f} ms and CUPTI start+stop {timer_spent[0] * 1e3 / rounds:5.1f} ms a round,"
                     f" outside {reply.stats.outside_us or 0:5.1f} us,"
                     f" inside {reply.stats.host_median_us or 0:5.1f} us ({reply.stats.method})")
    lines.append(round_parts(held, case, command, device, rng, rounds))
    return " | ".join(lines)


def round_parts(held: Any, case: Any, command: Any, device: str, rng: Any, rounds: int) -> str:
    """Where a round's time goes besides its timed calls, as the code is: the round's wall time,
    the timed loop's, and the rest (warm-up, calibration, CUPTI's start and stop, the final
    attribution, the kept output); then what the child does after a round, as medians: the audit
    (in a grading child, whose runner holds the snapshot and the leftovers baseline) and the
    reply's header as JSON."""
    import gc
    import json as json_module

    from pytest_kcoral import timing
    from pytest_kcoral.child_timing import time_round

    loop, walls, loops, encodes, audits = [0.0], [], [], [], []
    timed_calls = timing._timed_calls
    timing._timed_calls = _timed(timed_calls, loop)  # type: ignore[attr-defined]
    try:
        for _ in range(rounds):
            loop[0] = 0.0
            t0 = time.perf_counter()
            reply = time_round(held, case, command, device, rng)
            walls.append(time.perf_counter() - t0)
            loops.append(loop[0])
            t0 = time.perf_counter()
            json_module.dumps(reply.to_wire()[0])
            encodes.append(time.perf_counter() - t0)
    finally:
        timing._timed_calls = timed_calls  # type: ignore[attr-defined]
    runners = [o for o in gc.get_objects() if type(o).__name__ == "_Runner" and getattr(o, "snapshot", None) is not None]
    tampers, leftovers = [], []
    for runner in runners[:1]:
        for _ in range(rounds):
            t0 = time.perf_counter()
            runner._audit()
            t1 = time.perf_counter()
            runner.snapshot.changed()
            t2 = time.perf_counter()
            runner.baseline.find()
            audits.append(t1 - t0)
            tampers.append(t2 - t1)
            leftovers.append(time.perf_counter() - t2)
    audit = (f"{statistics.median(audits) * 1e3:5.2f} ms (tamper snapshot {statistics.median(tampers) * 1e3:.2f} ms,"
             f" leftovers {statistics.median(leftovers) * 1e3:.2f} ms)") if audits else "- (not in a grading child)"
    return (f"round parts: wall {statistics.median(walls) * 1e3:5.1f} ms, timed loop {statistics.median(loops) * 1e3:5.1f} ms,"
            f" the rest {statistics.median(w - t for w, t in zip(walls, loops)) * 1e3:5.1f} ms;"
            f" after it: reply header as JSON {statistics.median(encodes) * 1e3:5.2f} ms, audit {audit}")


def main() -> None:
    import subprocess

    import torch

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    print("this process:\n  " + probe(device).replace(" | ", "\n  "))
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
            figures = lines[0][6:].replace(" | ", "\n  ") if lines else f"no figures: {item['outcome']} {item['message']}"
            print(f"a grading child (confinement {confinement}):\n  {figures}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
