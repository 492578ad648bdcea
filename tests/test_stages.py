"""The stage pipeline: compile -> correctness -> timing, gated in order, one screen per failure."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kernels import triton_add

from conftest import VECTOR_ADD_CASE
from pytest_kcoral import combine
from pytest_kcoral.results import CASE_FAILED_PREFIX, TimingStats
from pytest_kcoral.stage_timing import (
    GPU_MAX_ROUNDS,
    GPU_SHORT_ROUNDS_MAX_BYTES,
    MIN_ROUND_PAIRS,
    SEVERAL_PAIRS_ROUND_PAIRS,
    TIMING_ROUNDS,
    asked_pairs,
    enough_for_one_of_several,
    enter_beside,
    timing_rounds,
)

GOOD = "def run(a, b):\n    return a + b\n"

# a call long enough (about 0.1 ms) that a loaded CPU's noise stays within tens of percent
MATMUL_ONE_SHAPE = """
import torch
SEEN = [{"n": 128}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], shape["n"], device=device), torch.randn(shape["n"], shape["n"], device=device)

def reference(a, b):
    return a @ b
"""

TRITON_COMPILE_ERROR = """
import torch
import triton
import triton.language as tl

@triton.jit
def _add(a, b, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(a + i) + undefined_name, mask=i < n)

def run(a, b):
    out = torch.empty_like(a)
    _add[(triton.cdiv(a.numel(), 64),)](a, b, out, a.numel(), BLOCK=64)
    return out
"""

TRITON_ADD = triton_add(block=64)

# Right while the correctness trials watch, wrong once the timing loop runs: the outputs of timed
# calls are checked against the reference too.
COMPUTES_ONLY_WHILE_WATCHED = """
calls = 0

def run(a, b):
    global calls
    calls += 1
    return a + b if calls <= 3 else a * b
"""


# A case whose baseline disagrees with its reference: a finding, never an item failure.
DISAGREEING_BASELINE = """
import torch
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b

def baseline(a, b):
    return a - b
"""


def _junit_properties(path):
    props = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        props[name] = {p.get("name"): p.get("value") for p in case.iter("property")}
    return props


def test_import_error_fails_compile_and_gates_later_stages(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"broken": "import no_such_module_anywhere\n"})
    result = run_kcoral("-m", "seen", "--junitxml", "junit.xml")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': ModuleNotFoundError: No module named 'no_such_module_anywhere'*"])
    props = _junit_properties(pytester.path / "junit.xml")
    (item,) = props.values()
    assert item["kcoral_stage"] == "compile"
    assert "kcoral_speedup" not in item


def test_compiler_error_at_first_call_counts_as_compile(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"tri": TRITON_COMPILE_ERROR})
    result = run_kcoral("-m", "seen", "--kcoral-mode", "correctness", "--kcoral-json", "out.json")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'correctness':*"])
    assert "undefined_name" in result.stdout.str()
    doc = json.loads((pytester.path / "out.json").read_text())
    (item,) = doc["items"]
    assert item["stage"] == "compile" and item["compiled"] is False  # no compile credit in the scores
    (pair,) = doc["candidates"]
    assert pair["compiled"] is False and pair["aka_score"] == 0


# Compiles and passes its correctness trials, then a compiler error once the timed calls run (a
# new specialization that does not build): a failure to run the timed calls, not a compile failure.
COMPILE_ERROR_ONCE_TIMED = """
import subprocess
calls = 0

def run(a, b):
    global calls
    calls += 1
    if calls > 3:
        raise subprocess.CalledProcessError(1, ["nvcc", "specialized.cu"])
    return a + b
"""


def test_a_compiler_error_once_timed_fails_the_timing_stage(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"late": COMPILE_ERROR_ONCE_TIMED})
    run_kcoral("-m", "seen", "--kcoral-json", "out.json").assert_outcomes(failed=1, deselected=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    # it read stage 'compile' with compiled false and correct true
    assert item["stage"] == "timing" and item["compiled"] is True and item["correct"] is False, item
    assert "CalledProcessError" in item["message"]


TRITON_AUTOTUNED = """
import torch
import triton
import triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def _add(a, b, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(a + offs, mask=mask) + tl.load(b + offs, mask=mask), mask=mask)

def run(a, b):
    out = torch.empty_like(a)
    _add[lambda meta: (triton.cdiv(a.numel(), meta["BLOCK"]),)](a, b, out, a.numel())
    return out
"""


def test_an_autotuned_triton_kernel_on_a_cpu_says_why_it_cannot_run(make_case, run_kcoral):
    make_case("cases/add", candidates={"tuned": TRITON_AUTOTUNED})
    result = run_kcoral("-m", "seen", "--kcoral-mode", "correctness")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*0 active drivers*", "hint: Triton found no GPU driver: *cannot run @triton.autotune*"])


def test_triton_candidate_passes_all_stages_with_timing_properties(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"tri": TRITON_ADD, "torch": GOOD})
    result = run_kcoral("--junitxml", "junit.xml", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=4)
    props = _junit_properties(pytester.path / "junit.xml")
    assert len(props) == 4
    items = {i["nodeid"].rsplit("::", 1)[1]: i for i in json.loads((pytester.path / "out.json").read_text())["items"]}
    for name, item in props.items():
        assert item["kcoral_stage"] == "done"
        assert item["kcoral_timer"] == "wall"
        t_base, t_cand = float(item["kcoral_t_baseline_us"]), float(item["kcoral_t_candidate_us"])
        assert t_base > 0 and t_cand > 0
        # the speedup is read pair by pair of rounds taken in turns: the median of the rounds' ratios
        timed = items[name]
        ratios = sorted(b / c for b, c in zip(timed["baseline_timing"]["round_medians_us"], timed["candidate_timing"]["round_medians_us"]))
        middle = len(ratios) // 2
        paired = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] * ratios[middle]) ** 0.5
        # less what the candidate was charged for work outside its windows (honest here; a loaded
        # CPU can still push an interpreted call's turn past the slack)
        charged = timed["candidate_timing"]["charged_us"]
        paired *= (timed["t_candidate_us"] - charged) / timed["t_candidate_us"]
        assert timed["speedup"] == pytest.approx(paired, rel=1e-9), (timed["candidate_timing"], timed["baseline_timing"])
        assert float(item["kcoral_speedup"]) == pytest.approx(paired, rel=1e-5)  # JUnit keeps six digits
        assert (t_base, t_cand) == pytest.approx((timed["t_baseline_us"], timed["t_candidate_us"]), rel=1e-5)
        assert item["kcoral_device"] == "cpu"
        assert item["kcoral_host_set"] == "False"  # the wall clock on a CPU times the work itself


def test_correctness_mode_stops_before_timing(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"torch": GOOD})
    run_kcoral("--kcoral-mode", "correctness", "--junitxml", "junit.xml").assert_outcomes(passed=2)
    for item in _junit_properties(pytester.path / "junit.xml").values():
        assert item["kcoral_stage"] == "done"
        assert "kcoral_speedup" not in item and "kcoral_timer" not in item


def test_min_speedup_fails_slow_items(make_case, run_kcoral):
    make_case("cases/add", candidates={"torch": GOOD})
    result = run_kcoral("--kcoral-min-speedup", "1000", "-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral timing failed: speedup *x is below --kcoral-min-speedup 1000 (baseline * us, candidate * us, wall)*"])


def test_a_candidate_that_fails_once_timed_is_not_correct_and_a_slow_one_is(make_case, run_kcoral, pytester):
    # right for the three correctness trials, then it raises
    breaks = "calls = 0\ndef run(a, b):\n    global calls\n    calls += 1\n    if calls > 3:\n        raise RuntimeError('boom')\n    return a + b\n"
    make_case("cases/add", candidates={"breaks": breaks, "torch": GOOD})
    result = run_kcoral("-m", "seen", "--kcoral-min-speedup", "1000", "--kcoral-json", "out.json")
    result.assert_outcomes(failed=2, deselected=2)
    result.stdout.fnmatch_lines(["*kcoral timing failed: RuntimeError: boom*"])
    items = {i["candidate"]: i for i in json.loads((pytester.path / "out.json").read_text())["items"]}
    assert items["breaks"]["stage"] == "timing" and items["breaks"]["correct"] is False
    assert items["torch"]["stage"] == "timing" and items["torch"]["correct"] is True  # below --kcoral-min-speedup: slow, not wrong


def test_timed_outputs_are_checked(make_case, run_kcoral):
    make_case("cases/add", candidates={"sly": COMPUTES_ONLY_WHILE_WATCHED})
    result = run_kcoral("-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral timing failed in phase 'verify': the outputs of timed calls are wrong*", "*timed call 1: output 0:*"])


def test_trials_option_sets_the_number_of_input_sets(make_case, run_kcoral):
    make_case("cases/add", candidates={"bad": "def run(a, b):\n    return a - b\n"})
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-trials", "5", "-m", "seen")
    result.stdout.fnmatch_lines(["*trial 5 of 5: output 0:*"])


def test_a_failing_reference_is_reported_as_the_cases_fault(make_case, run_kcoral, pytester):
    broken = """
import torch
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device),)

def reference(x):
    raise ValueError("reference bug")
"""
    make_case("cases/bad_ref", broken, {"good": "def run(x):\n    return x\n"})
    make_case("cases/add", candidates={"good": GOOD})
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*kcoral correctness failed in phase 'reference': the case itself failed (not the candidate): ValueError: reference bug*",
        "CASE FAILED cases/bad_ref on seen n=64, every candidate failing there: ValueError: reference bug",
    ])
    doc = json.loads((pytester.path / "out.json").read_text())
    (bad,) = [i for i in doc["items"] if i["case"] == "cases/bad_ref"]
    assert bad["case_failed"] is True and bad["outcome"] == "failed"  # failed still: never credited
    assert not any(i["case_failed"] for i in doc["items"] if i["case"] == "cases/add")
    assert doc["failed_cases"] == [{"case": "cases/bad_ref", "shapes": ["seen n=64"], "reason": "ValueError: reference bug", "other_reasons": []}]
    assert {c["case"]: c["case_failed_shapes"] for c in doc["cases"]} == {"cases/add": [], "cases/bad_ref": ["n=64"]}


def test_a_reference_that_is_not_deterministic_is_the_cases_failure(make_case, run_kcoral):
    unsteady = """
import torch
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device),)

def reference(x):
    return x + torch.randn_like(x)  # noise drawn at every call: no candidate can match it
"""
    make_case("cases/noisy", unsteady, {"same": "import torch\ndef run(x):\n    return x + torch.randn_like(x)\n"})
    make_case("cases/add", candidates={"good": GOOD})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*kcoral correctness failed in phase 'reference': the case itself failed (not the candidate): its reference is"
        " not deterministic: a second call on the same inputs gave output 0: *",
        "CASE FAILED cases/noisy on seen n=64, every candidate failing there: its reference is not deterministic*",
    ])


def test_an_untimed_run_writes_no_bench_lite_total_to_junit(make_case, run_kcoral, pytester):
    # it wrote 0.0, which reads as measured, where the terminal and the step summary show '-'
    make_case("cases/add", candidates={"good": GOOD})
    run_kcoral("-m", "seen", "--kcoral-mode", "correctness", "--junitxml", "junit.xml").assert_outcomes(passed=1, deselected=1)
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["kcoral_pairs"] == "1" and "kcoral_bench_lite_total" not in props, props


def test_a_baseline_that_disagrees_is_recorded_not_failed(make_case, run_kcoral, pytester):
    make_case("cases/add", DISAGREEING_BASELINE, {"good": GOOD})
    run_kcoral("--kcoral-mode", "correctness", "--kcoral-json", "out.json").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["correct"] is True and item["baseline_correct"] is False



def test_a_baseline_that_disagrees_is_named_in_the_summary(make_case, run_kcoral, pytester):
    # its speedups were shown, and the seen ones credited, as if measured against the right code
    shapes = 'SEEN = [{"n": 64}, {"n": 65}]\nUNSEEN = [{"n": 66}, {"n": 67}]'
    make_case("cases/add", DISAGREEING_BASELINE.replace('SEEN = [{"n": 64}]', shapes), {"good": GOOD})
    result = run_kcoral("--kcoral-json", "out.json")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["WRONG BASELINE cases/add on seen n=64, seen n=65, unseen n=66 and 1 more: its baseline"
                                 " disagrees with the reference; speedups there compare against wrong code"])
    assert all(i["speedup"] is not None for i in json.loads((pytester.path / "out.json").read_text())["items"])
    # a right baseline, no line
    make_case("cases/add", DISAGREEING_BASELINE.replace("a - b", "a + b"), {"good": GOOD})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(passed=1)
    assert "WRONG BASELINE" not in result.stdout.str()


RAISING_BASELINE = """
import torch
SEEN = [{"n": 64}]
UNSEEN = []

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b

def baseline(a, b):
    raise ValueError("no baseline today")
"""


def test_a_baseline_that_raises_fails_the_timing_as_the_cases_fault(make_case, run_kcoral, pytester):
    """The baseline's child (``children.LocalChildren.baseline``) runs it before timing it: an error
    there is the case's, said as such, and the candidate keeps its correctness."""
    make_case("cases/add", RAISING_BASELINE, {"good": GOOD})
    run_kcoral("--kcoral-json", "out.json").assert_outcomes(failed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["stage"] == "timing" and item["phase"] == "baseline" and item["case_failed"] is True
    assert item["message"].startswith(CASE_FAILED_PREFIX) and "ValueError: no baseline today" in item["message"], item["message"]
    assert item["correct"] is True and item["baseline_correct"] is False  # its check in the trusted child found it


def test_a_baseline_that_exits_is_the_cases_failure_at_timing_not_the_references(make_case, run_kcoral, pytester):
    # sys.exit in the baseline's check ended the trusted child's 'reference' command, and the
    # candidate was failed at correctness for it
    make_case("cases/add", RAISING_BASELINE.replace('raise ValueError("no baseline today")', "import sys\n    sys.exit(0)"), {"good": GOOD})
    run_kcoral("--kcoral-json", "out.json").assert_outcomes(failed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["correct"] is True and item["baseline_correct"] is False
    assert item["extra"]["baseline_problems"] == ["trial 1: the baseline called sys.exit(0)", "trial 2: the baseline called sys.exit(0)",
                                                  "trial 3: the baseline called sys.exit(0)"]
    assert item["stage"] == "timing" and item["phase"] == "baseline" and item["case_failed"] is True


def test_a_baseline_that_raises_on_an_unseen_shape_is_the_candidates_improvement(make_case, run_kcoral, pytester):
    # a kernel-to-kernel task whose original kernel handles even sizes only: on the odd unseen
    # shape the candidate that generalizes is 'candidate improved', not a failed case (it read as
    # both at once: a CASE FAILED item counted in the quadrants as an improvement)
    even_only = RAISING_BASELINE.replace('UNSEEN = []', 'UNSEEN = [{"n": 65}]').replace(
        'raise ValueError("no baseline today")', 'if a.numel() % 2:\n        raise ValueError("even sizes only")\n    return a + b')
    make_case("cases/add", even_only, {"good": GOOD})
    result = run_kcoral("--kcoral-json", "out.json")
    result.assert_outcomes(passed=2)
    assert "CASE FAILED" not in result.stdout.str()
    doc = json.loads((pytester.path / "out.json").read_text())
    seen, unseen = doc["items"]
    assert seen["speedup"] is not None and seen["baseline_correct"] is True
    assert unseen["correct"] is True and unseen["baseline_correct"] is False and unseen["speedup"] is None
    assert unseen["extra"]["untimed"].startswith("the baseline raises on this unseen shape"), unseen["extra"]
    assert "ValueError: even sizes only" in unseen["extra"]["untimed"]
    assert doc["suite"]["quadrants"]["candidate_improved"] == 1 and doc["cases"][0]["case_failed_shapes"] == []


def test_starting_the_baseline_child_does_not_use_up_the_items_time(make_case, run_kcoral, pytester):
    # a case that takes 3 s to import in each child: the candidate's, the baseline's and the trusted
    # child's starts (9 s) once ran past an 8 s --kcoral-timeout, blamed on the candidate's compile
    slow = RAISING_BASELINE.replace("import torch\n", "import os, time, torch\nif 'kcoral-' in os.getcwd():\n    time.sleep(3)\n", 1)
    make_case("cases/slow", slow.replace('raise ValueError("no baseline today")', "return a + b"), {"good": GOOD})
    run_kcoral("--kcoral-timeout", "8", "--kcoral-json", "out.json").assert_outcomes(passed=1)


def test_a_baseline_that_keeps_state_across_calls_is_the_cases_failure(make_case, run_kcoral, pytester):
    # kept across items, the process that times the baseline would time what its state answers
    # (a cache keyed on data_ptr returned another item's outputs). This one turns wrong after 20
    # calls: the trusted child's checks make 9 (3 trials, 3 shapes), the timing child's first item
    # more. Its timed calls are judged as they come (by the baseline, made afresh in the trusted
    # child), and each later item's process runs it on the correctness inputs first.
    drifting = RAISING_BASELINE.replace('raise ValueError("no baseline today")',
                                        "CALLS.append(1)\n    return a + b if len(CALLS) <= 20 else a - b")
    shapes = 'SEEN = [{"n": 64}, {"n": 65}, {"n": 66}]\nUNSEEN = []\nCALLS = []'
    make_case("cases/drift", drifting.replace('SEEN = [{"n": 64}]\nUNSEEN = []', shapes), {"good": GOOD})
    result = run_kcoral("--kcoral-json", "out.json")
    first, *later = json.loads((pytester.path / "out.json").read_text())["items"]
    assert first["baseline_correct"] is True and first["case_failed"] is True and first["phase"] == "baseline"
    assert "its baseline's timed calls went wrong (does it keep state across calls?)" in first["message"], first["message"]
    result.stdout.fnmatch_lines(["CASE FAILED cases/drift on seen n=64*"])
    # by then the trusted child's own baseline has drifted too: a wrong baseline, named as such
    for item in later:
        assert item["case_failed"] or item["baseline_correct"] is False, item


def test_a_case_whose_baseline_is_its_reference_stays_out_of_the_quadrants(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"good": GOOD})  # no baseline: the reference is timed
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["unseen P(candidate ok | baseline ok) -: *; 1 unseen item(s) left out: their baseline is their case's reference"])
    doc = json.loads((pytester.path / "out.json").read_text())
    assert [i["baseline_correct"] for i in doc["items"]] == [None] * 2  # nothing checked separately
    quadrants = doc["suite"]["quadrants"]
    assert quadrants.pop("left_out") == 1  # the unseen item, said in the summary
    assert set(quadrants.values()) == {0} and doc["suite"]["conditional_correctness"] is None


def test_baseline_correctness_is_recorded_when_the_candidate_does_not_compile(make_case, run_kcoral, pytester):
    make_case("cases/add", DISAGREEING_BASELINE, {"broken": "def run(a, b) return a\n"})
    run_kcoral("--kcoral-mode", "correctness", "--kcoral-json", "out.json").assert_outcomes(failed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["stage"] == "compile" and item["compiled"] is False
    assert item["baseline_correct"] is False  # known, so the quadrants can count this item


def test_a_case_that_hangs_at_import_in_the_trusted_child_fails_cleanly(make_case, run_kcoral, pytester):
    # the case imports fine in the pytest process but hangs in children (a marker file decides)
    marker = pytester.path / "in_pytest_process"
    case = f"""
import os, time, torch
if not os.path.exists({str(marker)!r}):
    while True:
        time.sleep(0.1)
SEEN = [{{"n": 64}}]

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device),)

def reference(x):
    return x
"""
    make_case("cases/slow", case, {"good": "def run(x):\n    return x\n"})
    marker.write_text("")
    # children run after collection: remove the marker once the case has been collected
    pytester.makeconftest(f"def pytest_collection_finish(session):\n    import os\n    os.remove({str(marker)!r})\n")
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-timeout", "3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kcoral * failed in phase 'startup': the case itself failed (not the candidate): *timed out in phase 'startup'*"])


def test_a_case_that_crashes_at_import_in_a_child_is_not_blamed_on_the_candidate(make_case, run_kcoral, pytester):
    # importable in the pytest process, broken in every child: the candidate never got to run
    case = """
import multiprocessing, torch
if multiprocessing.parent_process() is not None:
    raise RuntimeError("this case needs a resource children lack")
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device),)

def reference(x):
    return x
"""
    make_case("cases/fragile", case, {"good": "def run(x):\n    return x\n"})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*kcoral compile failed in phase 'startup': the case itself failed (not the candidate): "
        "CaseError: *case.py: importing it raised RuntimeError: this case needs a resource children lack*",
    ])


# Each call logs who was called (R reference, B baseline, C candidate), when, in which process
# and on which inputs (the first element of the first one).
# The log lies outside the children's directories: the tests that use it run unconfined.
LOGGING_CASE = """
import os
import time
import torch
SEEN = [{"n": 64}]
UNSEEN = []
LOG = __LOG__

def log(who, a):
    with open(LOG, "a") as f:
        f.write(f"{who} {time.monotonic_ns()} {os.getpid()} {float(a[0]):.6f}\\n")

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    log("R", a)
    return a + b

def baseline(a, b):
    log("B", a)
    return a + b
"""

LOGGING_CANDIDATE = """
import os
import time
def run(a, b):
    with open(__LOG__, "a") as f:
        f.write(f"C {time.monotonic_ns()} {os.getpid()} {float(a[0]):.6f}\\n")
    return a + b
"""


def _logged_calls(path: Path) -> list[tuple[int, str, int, str]]:
    """(time, who, pid, first input element) per call, in time order."""
    return sorted((int(t), who, int(pid), x) for who, t, pid, x in (line.split() for line in path.read_text().splitlines()))


def test_baseline_and_candidate_are_timed_in_interleaved_rounds(make_case, run_kcoral, pytester):
    log = repr(str(pytester.path / "calls.log"))
    make_case("cases/add", LOGGING_CASE.replace("__LOG__", log), {"logged": LOGGING_CANDIDATE.replace("__LOG__", log)})
    # every round: no stop at a precision target
    run_kcoral("--kcoral-json", "out.json", "--kcoral-precision", "off", "--kcoral-confinement", "off").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["baseline_timing"]["rounds"] == item["candidate_timing"]["rounds"] == TIMING_ROUNDS
    # a CPU's wall clock is not the host's speed setting a GPU's (``host_set_side``): one pair of processes
    assert item["baseline_timing"]["processes"] == item["candidate_timing"]["processes"] == 1
    assert len(item["candidate_timing"]["round_medians_us"]) == TIMING_ROUNDS
    assert item["candidate_timing"]["samples_us"] is None  # merged: the raw samples stay out of the artifact
    # where the item's time went, phase by phase (verify is part of timing)
    assert set(item["phases_ms"]) == {"compile", "reference", "correctness", "timing", "verify"}
    assert all(v > 0 for v in item["phases_ms"].values())
    assert item["phases_ms"]["verify"] <= item["phases_ms"]["timing"]
    assert sum(v for k, v in item["phases_ms"].items() if k != "verify") <= item["duration_s"] * 1e3
    calls = [who for _, who, _, _ in _logged_calls(pytester.path / "calls.log") if who != "R"]
    runs = [who for n, who in enumerate(calls) if n == 0 or calls[n - 1] != who]
    # correctness (the baseline's check in the trusted child, the candidate's run, the baseline's
    # child's run), then TIMING_ROUNDS rounds a side ordered F S S F F S S F..., F the side the
    # flag names (drawn per item): runs of one side merge, so timing ends in F S F S F
    (turns,) = [f for f in item["candidate_timing"]["flags"] if f.startswith("first_in_turns=")]
    first, second = ("B", "C") if turns.startswith("first_in_turns=baseline:") else ("C", "B")
    assert turns.startswith(("first_in_turns=baseline:", "first_in_turns=candidate:")), turns
    assert runs[-5:] == [first, second, first, second, first], runs


def test_gpu_items_take_shorter_rounds():
    """On a GPU the host's speed, which sets a launch-bound chain's time, changes within tens of
    milliseconds: shorter rounds taken in turns see it alike (docs/performance.md, "shorter rounds on a GPU").
    Fed by the trusted child, every item takes them; without the feed (a KCoral program) every round
    refreshes its inputs in the child, so items with large inputs and results keep the usual
    rounds there, as does a CPU's wall clock."""
    assert timing_rounds("cuda", 4096, 1.0) == GPU_MAX_ROUNDS == 32
    assert timing_rounds("cuda", GPU_SHORT_ROUNDS_MAX_BYTES + 1, 1.0) == 32
    assert timing_rounds("cuda", GPU_SHORT_ROUNDS_MAX_BYTES, 1.0, fed=False) == 32
    assert timing_rounds("cuda", GPU_SHORT_ROUNDS_MAX_BYTES + 1, 1.0, fed=False) == TIMING_ROUNDS
    assert timing_rounds("cpu", 4096, 1.0) == TIMING_ROUNDS
    # rounds of about 30 ms: a smaller budget, fewer rounds, never fewer than the usual ones
    assert timing_rounds("cuda", 4096, 0.5) == 16
    assert timing_rounds("cuda", 4096, 0.1) == TIMING_ROUNDS
    assert timing_rounds("cuda", 4096, 5.0) == GPU_MAX_ROUNDS


def _rounds(n: int, busy_us: float) -> list[TimingStats]:
    return [TimingStats(method="cupti", median_us=10.0, min_us=9.9, n=30, busy_us=busy_us, samples_us=[10.0] * 30) for _ in range(n)]


def test_a_pair_of_processes_among_several_takes_few_rounds():
    """A pair of processes reads its own speedup, which more rounds in it do not move: one of an
    item's several pairs stops at ``SEVERAL_PAIRS_ROUND_PAIRS`` pairs of rounds, and so does a
    first pair under auto once the host's speed turns out to set the item (its GPU idle between
    launches). A GPU-bound item's first pair goes on to its precision or its rounds."""
    def ctx(pairs: int | None = None, plan_max: int | None = None) -> Any:
        return SimpleNamespace(settings=SimpleNamespace(process_pairs=pairs), plan=SimpleNamespace(max_process_pairs=plan_max))

    def pair(n: int, busy_us: float) -> combine.ProcessPair:
        return combine.ProcessPair(baseline=_rounds(n, busy_us), candidate=_rounds(n, busy_us))

    cap = SEVERAL_PAIRS_ROUND_PAIRS
    assert MIN_ROUND_PAIRS <= cap < GPU_MAX_ROUNDS
    assert not enough_for_one_of_several(ctx(3), pair(cap - 1, 9.9), several=True)
    assert enough_for_one_of_several(ctx(3), pair(cap, 9.9), several=True)
    # under auto: the first pair stops at the cap only when it is host-set (busy 4 us of a 10 us span)
    assert enough_for_one_of_several(ctx(), pair(cap, 4.0), several=False)
    assert not enough_for_one_of_several(ctx(), pair(cap, 9.9), several=False)
    # one pair asked for, or a plan of one pair (KCoral programs): no more pairs follow, so no cap
    assert not enough_for_one_of_several(ctx(1), pair(cap, 4.0), several=False)
    assert not enough_for_one_of_several(ctx(plan_max=1), pair(cap, 4.0), several=False)
    assert asked_pairs(ctx()) == 1 and asked_pairs(ctx(3)) == 3 and asked_pairs(ctx(3, plan_max=1)) == 1


def test_a_fresh_pairs_baseline_starts_beside_the_candidate_and_is_always_left():
    """A further pair's baseline process starts in a thread beside the candidate's start-up
    (``enter_beside``): what it entered comes back, what entering raised is raised where it is
    asked for, and it is left when the block ends, also when the block fails before asking."""
    events: list[str] = []

    @contextlib.contextmanager
    def manager(fail: bool) -> Any:
        events.append(f"enter in {threading.current_thread().name}")
        if fail:
            raise RuntimeError("the baseline could not start")
        try:
            yield "baseline"
        finally:
            events.append("left")

    with contextlib.ExitStack() as stack:
        entered = enter_beside(stack, manager(False))
        assert entered() == "baseline"
        assert "left" not in events
    assert events == ["enter in kcoral-enter-beside_0", "left"]

    events.clear()
    with pytest.raises(ValueError, match="the candidate failed"), contextlib.ExitStack() as stack:
        enter_beside(stack, manager(False))
        raise ValueError("the candidate failed")
    assert events[-1] == "left"

    events.clear()
    with contextlib.ExitStack() as stack:
        entered = enter_beside(stack, manager(True))
        with pytest.raises(RuntimeError, match="could not start"):
            entered()
    assert "left" not in events


def test_the_baseline_is_timed_in_a_child_of_its_own_that_goes_the_candidates_way(make_case, run_kcoral, pytester):
    """Timed in the trusted child, a 32x256 layer norm read 5% slower than the same code timed in
    a fresh child that had gone the candidate's way, on every run and host (H200,
    docs/performance.md). So the baseline is timed in a child of its own (one per case, kept
    across items, as the trusted child is), which gets each item's correctness run, on the inputs
    the candidate's child got, before it is timed."""
    log = pytester.path / "calls.log"
    case = LOGGING_CASE.replace("__LOG__", repr(str(log))).replace("UNSEEN = []", 'UNSEEN = [{"n": 32}]')
    make_case("cases/add", case, {"logged": LOGGING_CANDIDATE.replace("__LOG__", repr(str(log)))})
    run_kcoral("--kcoral-confinement", "off").assert_outcomes(passed=2)
    calls = _logged_calls(log)
    trusted = {pid for _, who, pid, _ in calls if who == "R"}  # the reference runs only there
    candidates = [pid for _, who, pid, _ in calls if who == "C"]
    timing = {pid for _, who, pid, _ in calls if who == "B"} - trusted
    assert len(trusted) == 1 and len(set(candidates)) == 1  # the candidate's child is kept for its second item
    (baseline,) = timing  # neither side's process, and kept for the case's second item
    assert baseline not in candidates
    # each item: the candidate's first correctness input, then the baseline child's, the same
    seen_by_baseline = [x for _, _, pid, x in calls if pid == baseline]
    for pid in dict.fromkeys(candidates):
        first = next(x for _, _, p, x in calls if p == pid)
        assert first in seen_by_baseline
    assert seen_by_baseline[0] == next(x for _, _, p, x in calls if p == candidates[0])


def test_an_item_is_timed_again_in_fresh_pairs_of_processes_that_go_the_first_pairs_way(make_case, run_kcoral, pytester):
    """A launch-bound chain runs at the speed of its process, and one process can sit slower than
    another for seconds (docs/performance.md, "The level changes within a process, in time"): ``--kcoral-process-pairs N`` times
    an item in N pairs of processes (auto: three for host-set items on a GPU, one otherwise). Each new
    candidate child loads the candidate and gets the correctness run, each new baseline child the
    same run, and the pairs take turns within themselves, the side that goes first alternating
    from pair to pair (``stage_timing.alternating_sides``)."""
    log = pytester.path / "calls.log"
    make_case("cases/add", LOGGING_CASE.replace("__LOG__", repr(str(log))), {"logged": LOGGING_CANDIDATE.replace("__LOG__", repr(str(log)))})
    run_kcoral("--kcoral-json", "out.json", "--kcoral-process-pairs", "3", "--kcoral-confinement", "off").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    base, cand = item["baseline_timing"], item["candidate_timing"]
    pairs = cand["processes"]
    assert pairs == base["processes"] == 3
    phases = item["phases_ms"]  # the further pairs' start-up, within the timing stage
    assert 0 < phases["fresh_processes"] < phases["timing"], phases
    assert len(base["process_medians_us"]) == len(cand["process_medians_us"]) == pairs
    assert len(cand["round_medians_us"]) == len(base["round_medians_us"]) == pairs * TIMING_ROUNDS
    (turns,) = [f for f in cand["flags"] if f.startswith("first_in_turns=")]
    firsts = turns.split("=", 1)[1].split(":", 1)[0].split(",")
    assert len(firsts) == pairs and all(a != b for a, b in zip(firsts, firsts[1:])), turns
    assert turns in base["flags"]
    calls = _logged_calls(log)
    trusted = {pid for _, who, pid, _ in calls if who == "R"}
    candidates = list(dict.fromkeys(pid for _, who, pid, _ in calls if who == "C"))
    baselines = list(dict.fromkeys(pid for _, who, pid, _ in calls if who == "B" and pid not in trusted))
    assert len(candidates) == len(baselines) == pairs
    first_input = next(x for _, who, _, x in calls if who == "C")  # the correctness stage's first trial
    for p in range(pairs):
        mine = [(t, who) for t, who, pid, _ in calls if pid in (candidates[p], baselines[p])]
        # both children of a pair began with the correctness run, on the candidate's first inputs
        assert next(x for _, _, pid, x in calls if pid == candidates[p]) == first_input
        assert next(x for _, _, pid, x in calls if pid == baselines[p]) == first_input
        # a pair's calls lie after the last pair's, and its two sides take turns, F S S F F S ...
        # from the side the flag names: an even number of rounds ends with the first side's
        if p:
            assert mine[0][0] > max(t for t, _, pid, _ in calls if pid in (candidates[p - 1], baselines[p - 1]))
        runs = [who for n, (_, who) in enumerate(mine) if n == 0 or mine[n - 1][1] != who]
        first, second = ("B", "C") if firsts[p] == "baseline" else ("C", "B")
        assert runs[-5:] == [first, second, first, second, first], (firsts[p], runs)


RIGHT_IN_ITS_FIRST_PROCESS_ONLY = """
import os
import torch
MARK = __MARK__

def run(a, b):
    # the first of its processes to run makes the mark and computes; every later one returns zeros
    if not os.path.exists(MARK) or open(MARK).read() == str(os.getpid()):
        with open(MARK, "w") as f:
            f.write(str(os.getpid()))
        return a + b
    return torch.zeros_like(a)
"""


def test_a_candidate_wrong_in_a_later_process_only_fails(make_case, run_kcoral, pytester):
    """A candidate that learns it is being timed again (a mark it left on the host) and skips its
    work there is checked in every new process before it is timed, and is not correct."""
    mark = repr(str(pytester.path / "mark"))
    make_case("cases/add", LOGGING_CASE.replace("__LOG__", repr(str(pytester.path / "calls.log"))),
              {"first_only": RIGHT_IN_ITS_FIRST_PROCESS_ONLY.replace("__MARK__", mark)})
    result = run_kcoral("--kcoral-json", "out.json", "--kcoral-process-pairs", "2", "--kcoral-confinement", "off")
    result.assert_outcomes(failed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["stage"] == "timing" and item["correct"] is False and not item["case_failed"]
    assert "timed again in another pair of processes" in item["message"] and "failed at correctness" in item["message"]


def test_process_pairs_must_be_auto_or_a_small_number(make_case, run_kcoral):
    make_case("cases/add")
    for bad in ("0", "many", "9"):
        run_kcoral("--kcoral-process-pairs", bad).stderr.fnmatch_lines(["*--kcoral-process-pairs must be auto or a number from 1 to 8*"])


def test_a_candidate_that_rewrites_the_case_fails_the_case_instead_of_reaching_its_baseline(make_case, run_kcoral, pytester):
    """Without --kcoral-sandbox a candidate can write into the case tree. The case's trusted and
    baseline children import it before the first candidate runs; the writer's item then fails at
    its end, and a child that would import the case after that (the next item's) finds the
    case's files changed since collection: the case fails, saying so, and no item is graded
    against what the candidate wrote."""
    log = pytester.path / "calls.log"
    folder = make_case("cases/add", LOGGING_CASE.replace("__LOG__", repr(str(log))))
    rewriter = f"""
import pathlib
_case = pathlib.Path({str(folder / "case.py")!r})
_case.write_text(_case.read_text().replace('log("B", a)', 'log("X", a)'))
""" + LOGGING_CANDIDATE.replace("__LOG__", repr(str(log)))
    (folder / "candidates" / "good.py").unlink()
    (folder / "candidates" / "a_rewriter.py").write_text(rewriter)
    (folder / "candidates" / "b_honest.py").write_text(GOOD)
    run_kcoral("--kcoral-json", "out.json", "--kcoral-confinement", "off").assert_outcomes(failed=2)
    items = json.loads((pytester.path / "out.json").read_text())["items"]
    for item in items:
        assert item["case_failed"] is True and item["speedup"] is None
        assert "its files changed after collection (case.py)" in item["message"], item["message"]
    assert [i["stage"] for i in items] == ["timing", "compile"]  # the writer's item at its end; the next candidate's start
    assert not log.exists() or "X" not in {who for _, who, _, _ in _logged_calls(log)}


RELU_CASE = """
import torch
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device),)

def reference(x):
    return torch.relu(x)
"""


def test_a_gpu_mode_submission_gets_its_inputs_as_one_object(make_case, run_kcoral):
    # GPU MODE's custom_kernel(data): the tuple for several inputs, the tensor itself for one
    make_case("cases/relu", RELU_CASE, {"gm": "def custom_kernel(data):\n    return data.clamp_min(0)\n"})
    make_case("cases/add", candidates={
        "gm": "from task import input_t\n\ndef custom_kernel(data: input_t):\n    a, b = data\n    return a + b\n",
        "gm_wrong": "def custom_kernel(data):\n    a, b = data\n    return a - b\n",
        "nothing": "def kernel(a, b):\n    return a + b\n",
    }, files={"task.py": "import torch\ninput_t = tuple[torch.Tensor, torch.Tensor]\n"})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(passed=2, failed=2, deselected=3)
    result.stdout.fnmatch_lines_random([
        "*cases/add::gm_wrong?seen-n=* - kcoral correctness failed*",
        "*cases/add::nothing?seen-n=* - kcoral compile failed*",
    ])
    result.stdout.fnmatch_lines(["*nothing.py: defines none of run(?inputs), prepare(?inputs) or custom_kernel(data)*"])


def test_a_prepare_that_returns_no_callable_fails_the_compile_stage(make_case, run_kcoral, pytester):
    # prepare() is the candidate's setup: what it hands back is what gets called, so a None (a
    # forgotten return) is a candidate that never built, not one that ran and got it wrong
    make_case("cases/add", candidates={"no_fn": "def prepare(a, b):\n    a + b\n"})
    result = run_kcoral("-m", "seen", "--kcoral-mode", "correctness", "--kcoral-json", "out.json")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'correctness': *no_fn.py: prepare() returned NoneType None, not a callable*"])
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["stage"] == "compile" and item["compiled"] is False, item
    (pair,) = json.loads((pytester.path / "out.json").read_text())["candidates"]
    assert pair["compiled"] is False and pair["aka_score"] == 0


def test_timing_stops_once_the_speedup_is_as_precise_as_asked(make_case, run_kcoral, pytester):
    # identical code on both sides: within 90% at once, even on a loaded machine, so timing stops
    # at the fewest pairs of rounds that give a 95% interval (six); off, it takes every round
    make_case("cases/mm", MATMUL_ONE_SHAPE, {"same": "def run(a, b):\n    return a @ b\n"})
    run_kcoral("--kcoral-json", "loose.json", "--kcoral-precision", "90%", "--kcoral-timing-budget", "0.2").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "loose.json").read_text())["items"]
    assert item["candidate_timing"]["rounds"] == item["baseline_timing"]["rounds"] == MIN_ROUND_PAIRS
    assert any(f.startswith("precision_target=90.00%: pairs of rounds taken per pair of processes 6 of at most 8")
               for f in item["candidate_timing"]["flags"])
    run_kcoral("--kcoral-json", "off.json", "--kcoral-precision", "off").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "off.json").read_text())["items"]
    assert item["candidate_timing"]["rounds"] == TIMING_ROUNDS
    assert not any(f.startswith("precision_target") for f in item["candidate_timing"]["flags"])


@pytest.mark.parametrize("value", ["0", "100%", "-1%", "loose"])
def test_precision_must_be_a_percentage_or_off(make_case, run_kcoral, value):
    make_case("cases/add")
    result = run_kcoral(f"--kcoral-precision={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--kcoral-precision must be a percentage above 0 and below 100*{value}*"])



BIG_AND_SMALL_CASE = """
import torch
SEEN = [{"n": 256}, {"n": 1 << 26}]

def make_inputs(shape, device):
    n = shape["n"]
    if n > 4096:  # 256 MiB a tensor, made fast: the memory check comes before the values matter
        return torch.zeros(n, device=device), torch.zeros(n, device=device)
    return torch.randn(n, device=device), torch.randn(n, device=device)

def reference(a, b):
    return a + b
"""


@pytest.mark.parametrize("mode", ["correctness", "full"])
def test_a_shape_too_large_for_the_hosts_memory_fails_its_items_and_says_what_fits(make_case, run_kcoral, pytester, mode):
    # 1000 trials of 768 MiB each would need terabytes of host copies: refused after the first
    # trial, with what would fit, instead of the out-of-memory killer ending the session; once
    # per shape, not once per candidate
    make_case("cases/add", BIG_AND_SMALL_CASE, {"one": SAME_ADD, "two": SAME_ADD})
    result = run_kcoral("--kcoral-mode", mode, "--kcoral-trials", "1000", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=2, failed=2)
    items = {(i["candidate"], i["shape_id"]): i for i in json.loads((pytester.path / "out.json").read_text())["items"]}
    assert items["one", "n=256"]["outcome"] == items["two", "n=256"]["outcome"] == "passed"
    first, second = items["one", "n=67108864"], items["two", "n=67108864"]
    for big in (first, second):
        assert big["outcome"] == "failed" and "HostMemoryShort" in big["message"], big["message"]
        assert re.search(r"needs about [\d.]+ GB of host memory and the host has [\d.]+ GB available: 1000 trials of 0\.81 GB",
                         big["message"]), big["message"]
    assert second["message"] == first["message"] and second["phases_ms"]["reference"] < 50, second["phases_ms"]
    # what fits depends on the host's memory; on a CPU, a timed item's timing needs 32 trials' worth
    message = first["message"].split("\n", 1)[0]
    assert ("timing on the CPU" in message) == (mode == "full"), message
    assert ("--kcoral-mode correctness" in message) == (mode == "full" and "--kcoral-trials" in message), message
    assert re.search(r"grade it with --kcoral-(trials \d+ \(at most\)|trials 1|mode correctness)|even one trial does not fit", message), message


SAME_ADD = "def run(a, b):\n    return a + b\n"


def test_the_reference_cache_lets_the_least_recently_used_go_beyond_its_bytes(monkeypatch):
    # items run shape by shape, so the latest reference serves the next candidates; older ones
    # are kept while they fit, then the least recently used goes and is made again when needed
    import torch

    from pytest_kcoral import stage_reference
    from pytest_kcoral.stage_reference import ReferenceCache, ReferenceData

    made: list[str] = []

    def compute(ctx, processes):
        made.append(ctx.spec.shape.shape_id)
        n = 1024 if ctx.spec.shape.shape_id != "huge" else 1 << 20
        return ReferenceData(inputs=[(torch.zeros(n),)], reference=[(torch.zeros(n),)], baseline_correct=None)

    def ctx(shape_id):
        return SimpleNamespace(spec=SimpleNamespace(case=SimpleNamespace(case_id="cases/add", content_hash="h"),
                                                    shape=SimpleNamespace(split="seen", shape_id=shape_id)),
                               settings=SimpleNamespace(seed=1, trials=1), device="cpu")

    monkeypatch.setattr(stage_reference, "compute_reference", compute)
    cache = ReferenceCache()
    assert cache.max_bytes > 0
    cache.max_bytes = 2 * 8192  # two references of 4 KiB inputs and 4 KiB results
    for shape_id in ["s1", "s2", "s1", "s3", "s1", "s2", "huge", "huge", "s1"]:
        data = cache.reference(ctx(shape_id), None)
        assert stage_reference.reference_bytes(data) == (8192 if shape_id != "huge" else 8 << 20)
    # s1 used again before s3 came, so s2 went; the huge one, over the limit alone, stays while latest
    assert made == ["s1", "s2", "s3", "s2", "huge", "s1"]


LOAD_INLINE_CANDIDATE = """
from torch.utils.cpp_extension import load_inline

_ext = load_inline(name="kcoral_add_ext", cpp_sources="void add();", cuda_sources="__global__ void k() {} void add() {}",
                   functions=["add"])

def run(a, b):
    return a + b
"""


def test_a_cuda_extension_candidate_skips_on_a_host_without_cuda(make_case, run_kcoral, pytester):
    # KernelBench's usual candidate builds its kernel with load_inline at import: on a CPU host it
    # needs CUDA, as a candidate calling .cuda() does, and skips the same way instead of failing
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is not None:
        pytest.skip(f"a CUDA toolkit is here ({cpp_extension.CUDA_HOME}): the extension would build")
    make_case("cases/add", candidates={"ext": LOAD_INLINE_CANDIDATE})
    make_case("cases/twice", candidates={"good": GOOD})
    result = run_kcoral("-m", "seen", "-rs", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, skipped=1, deselected=2)
    result.stdout.fnmatch_lines(["*the candidate's process (ext.py) needs CUDA*CUDA_HOME environment variable is not set*"])
    # its scores leave it out, so the summary and the JSON name it
    result.stdout.fnmatch_lines(["SKIPPED cases/add::ext: all 1 item(s), not scored: the candidate's process (ext.py) needs CUDA*"])
    doc = json.loads((pytester.path / "out.json").read_text())
    assert [c["candidate"] for c in doc["candidates"]] == ["good"]
    (skipped,) = doc["skipped_candidates"]
    assert (skipped["case"], skipped["candidate"], skipped["items"]) == ("cases/add", "ext", 1)


def test_a_reference_out_of_device_memory_fails_the_case_with_a_hint(make_case, run_kcoral, pytester):
    """KernelBench problems at their own sizes ran an 80 GB GPU out of memory in the trusted child
    (docs/performance.md): the message says what the grader holds there and what to try."""
    oom = VECTOR_ADD_CASE.replace("    return a + b", "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 12.00 GiB.')")
    make_case("cases/add", oom)
    result = run_kcoral("-m", "seen", "--kcoral-json", "out.json")
    result.assert_outcomes(failed=1, deselected=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["case_failed"] is True
    assert item["message"].startswith(CASE_FAILED_PREFIX) and "CUDA out of memory" in item["message"]
    assert "hint: each of the grader's processes holds the shape's data on the device at once" in item["message"]
    assert "--kcoral-trials 1" in item["message"]
