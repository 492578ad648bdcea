"""Guards on what stays in the candidate's process while it is timed (``timing/guards.py``): hooks
that run inside the harness's calibration, torch modes left pushed, CPU threads beyond the one the
harness allows, and a garbage collector whose state told checked calls from timed ones."""

from __future__ import annotations

import json

import pytest

FULL = ("-m", "seen")
CORRECTNESS = ("--kcoral-mode", "correctness", "-m", "seen")

# Each call's honest work, long beside the harness's overhead, so that a distorted calibration
# shows as a large speedup.
WORK_S = 0.002

SPIN_CASE = f"""
import time
import torch
SEEN = [{{"n": 256}}]

def _spin(seconds):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    _spin({WORK_S})
    return a + b
"""

SPIN = """
import time

def _spin(seconds):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass
"""

HONEST_SPIN = SPIN + f"""
def run(a, b):
    _spin({WORK_S})
    return a + b
"""

# Honest work, and a profile hook, installed at the first call, that busy-waits inside the
# harness's empty calibration windows: the wall timer subtracts their median from every call.
PROFILE_HOOK_ON_THE_CALIBRATION = SPIN + f"""
import sys

def _hook(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "empty":
        _spin({WORK_S * 0.9})

def run(a, b):
    sys.setprofile(_hook)
    _spin({WORK_S})
    return a + b
"""

# The same hook, hiding: it takes itself off as soon as the harness's checks start, and the
# next call puts it back.
HIDING_PROFILE_HOOK = SPIN + f"""
import sys

def _hook(frame, event, arg):
    if event == "call" and frame.f_code.co_name in ("refuse_hooks", "find_hooks", "clear_profile_and_trace"):
        sys.setprofile(None)
    elif event == "call" and frame.f_code.co_name == "empty":
        _spin({WORK_S * 0.9})

def run(a, b):
    sys.setprofile(_hook)
    _spin({WORK_S})
    return a + b
"""


def _speedups(pytester) -> dict[str, dict]:
    return {i["candidate"]: i for i in json.loads((pytester.path / "out.json").read_text())["items"]}


def test_a_profile_hook_on_the_calibration_is_refused_and_named(make_case, run_kcoral, pytester):
    make_case("cases/spin", SPIN_CASE, {"attack": PROFILE_HOOK_ON_THE_CALIBRATION, "honest": HONEST_SPIN})
    result = run_kcoral("--kcoral-timing-budget", "0.1", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*kcoral timing failed*HookDetected: before *, the timing loop found a profile"
                                 " function (sys.setprofile: kcoral_candidate._hook): code that runs inside the harness's own"
                                 " timing windows (its calibration included) is refused*"])
    honest = _speedups(pytester)["honest"]
    assert 0.8 < honest["speedup"] < 1.25, honest["speedup"]


def test_a_profile_hook_that_hides_from_the_checks_earns_nothing(make_case, run_kcoral, pytester):
    # it read 8.8-42x before the hooks were taken off ahead of each calibration window
    make_case("cases/spin", SPIN_CASE, {"attack": HIDING_PROFILE_HOOK})
    run_kcoral("--kcoral-timing-budget", "0.1", "--kcoral-json", "out.json").assert_outcomes(passed=1)
    attack = _speedups(pytester)["attack"]
    assert attack["speedup"] < 1.3, (attack["speedup"], attack["candidate_timing"], attack["baseline_timing"])


# A torch function mode pushed at import and left there: it runs inside every torch call of the
# process, the harness's own between the windows included.
TORCH_MODE_LEFT_PUSHED = """
import torch
from torch.overrides import TorchFunctionMode

class Watcher(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

Watcher().__enter__()

def run(a, b):
    return a + b
"""

# what an honest author may write: a default device, which torch keeps as a mode of its own
SETS_THE_DEFAULT_DEVICE = """
import torch
torch.set_default_device("cpu")

def run(a, b):
    return torch.add(a, b)
"""


def test_a_torch_function_mode_left_pushed_is_refused_and_named(make_case, run_kcoral):
    make_case("cases/add", candidates={"attack": TORCH_MODE_LEFT_PUSHED, "honest": SETS_THE_DEFAULT_DEVICE})
    result = run_kcoral(*FULL)
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    # found after its first call, before the harness copies what the call returned
    result.stdout.fnmatch_lines(["*kcoral correctness failed*HookDetected: after the candidate's call, the harness found torch function mode"
                                 " left pushed (kcoral_candidate.Watcher)*"])


# Widened CPU timing: the harness times a CPU with one thread, and the candidate takes them all.
MATMUL_CASE = """
import torch
SEEN = [{"n": 384}]

def make_inputs(shape, device):
    n = shape["n"]
    return torch.randn(n, n, device=device), torch.randn(n, n, device=device)

def reference(a, b):
    return a @ b
"""

WIDENS_THE_THREADS = """
import os
import torch

def run(a, b):
    torch.set_num_threads(len(os.sched_getaffinity(0)))   # every core, not the one the harness set
    return a @ b
"""

HONEST_MATMUL = "def run(a, b):\n    return a @ b\n"


def test_widened_cpu_threads_earn_nothing(make_case, run_kcoral, pytester):
    make_case("cases/matmul", MATMUL_CASE, {"attack": WIDENS_THE_THREADS, "honest": HONEST_MATMUL})
    run_kcoral("--kcoral-timing-budget", "0.2", "--kcoral-json", "out.json").assert_outcomes(passed=2)
    items = _speedups(pytester)
    attack, honest = items["attack"], items["honest"]
    # 1.7x on 2 cores when only the wall clock counted
    assert attack["speedup"] < 1.3, (attack["speedup"], attack["candidate_timing"], attack["baseline_timing"])
    assert 0.8 < honest["speedup"] < 1.25, honest["speedup"]
    assert not any(f.startswith("cpu_time_above_wall") for f in honest["candidate_timing"]["flags"] + honest["baseline_timing"]["flags"])


# Honest only while the garbage collector runs: off in the timing loop alone, it told timed calls
# from checked ones.
GC_STATE_ORACLE = """
import gc
_last = []

def run(a, b):
    if gc.isenabled() or not _last:      # a correctness call: do the work
        _last[:] = [a + b]
        return _last[0].clone()
    return _last[0].clone()               # a timed call: the last answer, no work
"""


def test_a_gc_state_oracle_fails(make_case, run_kcoral):
    make_case("cases/add", candidates={"attack": GC_STATE_ORACLE})
    result = run_kcoral(*CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the output does not depend on the inputs*"])


@pytest.mark.parametrize("source", [HONEST_MATMUL, "import gc\ndef run(a, b):\n    gc.collect()\n    return a @ b\n"],
                         ids=["plain", "collects"])
def test_honest_candidates_pass_the_guards(make_case, run_kcoral, source):
    make_case("cases/matmul", MATMUL_CASE.replace('"n": 384', '"n": 64'), {"honest": source})
    run_kcoral(*FULL).assert_outcomes(passed=1)
