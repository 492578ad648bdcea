"""SPEC section 9 on a CPU: each attack, run through the real pipeline against a real case, fails
its item (or earns no speedup credit) with a message naming what was detected.

The GPU-only attacks are in ``test_attacks_gpu.py``; the all-at-once session in
``test_attack_session.py``.
"""

from __future__ import annotations

import os
import textwrap
import time

import attacks
import pytest
from kernels import add_case

CORRECTNESS = ("--kcoral-mode", "correctness", "-m", "seen")
FULL = ("-m", "seen")


def _grade(make_case, run_kcoral, source: str, *args: str, case: str | None = None) -> pytest.RunResult:
    if case is None:
        make_case("cases/add", candidates={"attack": source})
    else:
        make_case("cases/add", case, {"attack": source})
    return run_kcoral(*args)


def _marker_processes(marker: str) -> list[str]:
    """Processes whose name (argv[0]) is exactly ``marker``: under xdist another test's strays
    (``-detached-exit`` beside ``-detached``) may be alive at the same moment."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if cmdline.split(b"\0", 1)[0] == marker.encode():
                found.append(f"{name}: {cmdline!r}")
    return found


def _no_marker_processes(marker: str, timeout_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _marker_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)  # SIGKILLed processes may take a moment to be reaped
    return left


# 2 ---------------------------------------------------------------------------------------------

def test_background_thread_left_working_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.BACKGROUND_THREAD, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: detected after the candidate ran in phase 'correctness': "
                                 "left a thread running after returning that keeps computing: 'late-worker'*ms of CPU in * ms after returning*"])


def test_thread_idle_at_import_that_works_between_calls_fails(make_case, run_kcoral):
    # idle when the import was audited, so watched; the CPU it used since (during the short
    # correctness run, or by the last check, 'finish') gives it away
    result = _grade(make_case, run_kcoral, attacks.THREAD_WORKS_BETWEEN_CALLS, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed*: detected after the candidate ran in phase *: "
                                 "left a thread running after returning that keeps computing: 'between-calls'*"
                                 "while the candidate was checked or timed*"])


def test_detached_processes_are_found_killed_and_fail(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.DETACHED_PROCESS, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines([f"*kcoral correctness failed: detected after the candidate ran in phase 'correctness': "
                                 f"left * process(es) running after returning, * working (using CPU or starting processes)*"
                                 f"pid * ({attacks.MARKER}-detached -c while :; do :; done)*"])
    assert not _no_marker_processes(attacks.MARKER + "-detached"), "a detached process outlived its item"


def test_detached_process_of_a_child_that_exits_is_killed(make_case, run_kcoral):
    # the child exits before the audit: its orphans land at the template (a subreaper) and die there
    src = attacks.DETACHED_PROCESS.replace("    return a + b", "    os._exit(0)").replace("-detached", "-detached-exit")
    result = _grade(make_case, run_kcoral, src, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*exited with status 0 in phase 'correctness' before replying*"])
    assert not _no_marker_processes(attacks.MARKER + "-detached-exit"), "a detached process outlived its item"


# 3 ---------------------------------------------------------------------------------------------

def test_tensor_subclass_output_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.TENSOR_SUBCLASS, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*output 0 is a kcoral_candidate.Lazy, not a plain torch.Tensor (subclasses and lazy objects are refused)*"])


# 4 ---------------------------------------------------------------------------------------------

def test_patching_perf_counter_is_detected(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.PATCH_PERF_COUNTER, *FULL)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': detected after the candidate ran in phase 'import': "
                                 "replaced functions the harness relies on (timers, synchronization, comparison or the harness itself): time.perf_counter*"])


def test_a_tensor_base_method_set_on_torch_tensor_is_detected(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.SHADOW_A_TENSOR_METHOD, *FULL)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': *replaced functions the harness relies on*"
                                 "torch.Tensor.copy_ (over a method of its base torch._C.TensorBase)*"])


def test_patching_cupti_is_detected(make_case, run_kcoral):
    # a CPU run never loads cupti-python, so the case loads a stand-in package beside it (on the
    # path of every process of the case, candidates' included) before the candidate does
    case_src = "import cupti.cupti\n" + textwrap.dedent(add_case([256], [257]))
    folder = make_case("cases/add", case_src, {"attack": attacks.PATCH_CUPTI})
    (folder / "cupti").mkdir()
    (folder / "cupti" / "__init__.py").write_text("")
    (folder / "cupti" / "cupti.py").write_text(
        "ActivityKind = object()\n"
        + "".join(f"def {name}(*args):\n    pass\n" for name in
                  ("get_timestamp", "activity_enable", "activity_disable", "activity_register_callbacks", "activity_flush_all")))
    result = run_kcoral(*FULL)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': detected after the candidate ran in phase 'import': "
                                 "replaced functions the harness relies on (timers, synchronization, comparison or the harness itself): cupti.cupti.activity_enable*"])


def test_patching_the_harness_clock_is_detected(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.PATCH_HARNESS_CLOCK, *FULL)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: detected after the candidate ran in phase 'correctness': "
                                 "replaced functions the harness relies on*pytest_kcoral.timing._perf_counter*"])


# 5 ---------------------------------------------------------------------------------------------

def test_patching_comparison_functions_changes_nothing(make_case, run_kcoral):
    # patched and restored inside the call: the comparison runs in the pytest process anyway
    result = _grade(make_case, run_kcoral, attacks.PATCH_COMPARISON_AND_RESTORE, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: trial 1 of 3: output 0: * of 256 elements * outside atol 0.0001 + rtol 0.0001 x |ref|*"])


# 6 ---------------------------------------------------------------------------------------------

def test_reading_expected_outputs_from_memory_finds_nothing(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.READ_EXPECTED_FROM_MEMORY, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    # what it finds is an input (of this trial or another one), never the reference's outputs
    out = result.stdout.str()
    assert "kcoral correctness failed: " in out
    assert ("of 256 elements" in out and "outside atol" in out) or "the output does not depend on the inputs" in out, out


# 7 ---------------------------------------------------------------------------------------------

def test_stale_memory_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.STALE_MEMORY, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    out = result.stdout.str()
    # poisoned memory reads back as NaN; where the allocator hands back other memory, stale values
    assert ("elements are NaN/Inf where the reference is finite" in out) or ("outside atol" in out), out


# 8 ---------------------------------------------------------------------------------------------

def test_mutating_inputs_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.MUTATE_INPUTS, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*trial 1 of 3: input 0 was modified (* bytes changed); only inputs listed in INPLACE may be written*"])


# 9 ---------------------------------------------------------------------------------------------

def test_cache_by_pointer_fails_on_the_timed_calls(make_case, run_kcoral):
    # correctness inputs live side by side (fresh pointers); timed inputs are refreshed in place
    result = _grade(make_case, run_kcoral, attacks.CACHE_BY_POINTER, *FULL)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral timing failed in phase 'verify': the outputs of timed calls are wrong (correct only while checked?)*",
                                 "*timed call 1: output 0: * outside atol*"])


def test_cache_by_shape_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.CACHE_BY_SHAPE, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the output does not depend on the inputs: every input set gave the same output, the reference's differ*"])


# 10 --------------------------------------------------------------------------------------------

def test_compute_once_and_skip_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.COMPUTE_ONCE, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the output does not depend on the inputs*"])


# 11 --------------------------------------------------------------------------------------------

def test_predicting_the_seed_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.PREDICT_SEED, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    # no seed it can see made the inputs; its fallback guess is the same for every input set
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the output does not depend on the inputs*", "*trial 1 of 3: output 0: * outside atol*"])


# 12 --------------------------------------------------------------------------------------------

WEAK_CASE = """
import torch
SEEN = [{"n": 256}]
UNSEEN = [{"n": 257}]
ATOL = 1e-3

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return (a + b) * 1e-4       # every element within ATOL of zero: zeros would pass
"""


def test_zeros_on_a_weak_case_fail(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.ZEROS, *CORRECTNESS, case=WEAK_CASE)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: trial 1: output 0 is the constant 0 in every element while the reference's "
                                 "* distinct values range over * (near-zero or constant output) (this case is weak: zeros or a constant match its reference within tolerance)*"])


def test_honest_candidate_on_a_weak_case_passes(make_case, run_kcoral):
    make_case("cases/add", WEAK_CASE, {"honest": "def run(a, b):\n    return (a + b) * 1e-4\n"})
    run_kcoral(*CORRECTNESS).assert_outcomes(passed=1, deselected=1)


def test_zeros_on_a_strong_case_fail(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.ZEROS, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: trial 1: output 0 is the constant 0 in every element*"])


# 13 --------------------------------------------------------------------------------------------

def test_special_casing_seen_shapes_fails_unseen(make_case, run_kcoral):
    make_case("cases/add", candidates={"attack": attacks.SEEN_SHAPES_ONLY})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED cases/add::attack?unseen-n=257? - kcoral correctness failed*"])
    result.stdout.fnmatch_lines(["cases/add::attack *yes *yes *- *0/1 *"])  # seen: yes, unseen: 0 of 1


# 15 --------------------------------------------------------------------------------------------

def test_honest_only_while_checked_fails_on_the_timed_calls(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.HONEST_ONLY_AT_FIRST, *FULL)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral timing failed in phase 'verify': the outputs of timed calls are wrong (correct only while checked?)*"])


# 16 --------------------------------------------------------------------------------------------

FLOOR_CASE = """
import time, torch
SEEN = [{"n": 256}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b

def baseline(a, b):
    time.sleep(0.02)            # a slow baseline: above any floor below
    return a + b

def cost(shape):
    return {"flops": shape["n"], "bytes": 1e9}   # claims a gigabyte: no CPU moves it in microseconds
"""


def test_time_below_the_physical_floor_fails(make_case, run_kcoral):
    make_case("cases/add", FLOOR_CASE, {"fast": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kcoral timing failed: time below the physical floor: * us to move 1e+09 bytes (cost(shape)) is faster than the floor * us (CPU: *"])


def test_floor_is_ignored_when_the_baseline_is_below_it(make_case, run_kcoral):
    # the case overstates its bytes (the baseline, trusted, beats the floor): no verdict from it
    make_case("cases/add", FLOOR_CASE.replace("    time.sleep(0.02)", "    pass"), {"fast": "def run(a, b):\n    return a + b\n"})
    run_kcoral().assert_outcomes(passed=1)


def test_honest_case_with_cost_passes(make_case, run_kcoral):
    honest_cost = FLOOR_CASE.replace('"bytes": 1e9', '"bytes": 3 * 4 * shape["n"]').replace("    time.sleep(0.02)\n", "")
    make_case("cases/add", honest_cost, {"fast": "def run(a, b):\n    return a + b\n"})
    run_kcoral().assert_outcomes(passed=1)


# 18 --------------------------------------------------------------------------------------------

def test_shadowing_modules_changes_nothing(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.SHADOW_MODULES, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: trial 1 of 3: output 0: * outside atol*"])


# 19 --------------------------------------------------------------------------------------------

def test_os_exit_zero_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.OS_EXIT_ZERO, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: exited with status 0 in phase 'correctness' before replying*"])


def test_sys_exit_zero_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.SYS_EXIT_ZERO, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: SystemExit: called sys.exit(0)*"])


# 20 --------------------------------------------------------------------------------------------

def test_printed_fake_result_is_ignored(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.PRINT_FAKE_RESULT, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: trial 1: output 0 is the constant 0 in every element*"])


def test_forged_reply_on_the_channel_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.FORGED_REPLY, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: a reply in phase 'correctness' does not answer the command sent "
                                 "(sequence None, expected *): a forged or duplicated result on the channel*"])


def test_forged_reply_with_the_right_nonce_is_caught_as_a_duplicate(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.FORGED_REPLY_WITH_NONCE, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    # the forged reply answers the run command, but names none of the trials the trusted child fed
    # (without the feed, a KCoral program's, it shows at the next command: 'finish')
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the candidate's child reported 0 trials, the trusted child fed 3 (results forged?)*"])


def test_forged_reply_is_caught_before_timing_results_count(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.FORGED_REPLY_WITH_NONCE, *FULL)
    result.assert_outcomes(failed=1, deselected=1)
    # caught at correctness, before any timing result could count (the trusted child fed trials the reply does not name)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the candidate's child reported 0 trials, the trusted child fed 3 (results forged?)*"])


def test_forged_timing_statistics_are_checked_against_the_parents_clock(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.FORGED_TIMING, *FULL)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral timing failed: the candidate's timing statistics are impossible: 1000000 samples with median 5 us and minimum 5 us "
                                 "need at least 5 s, but the whole timing command took * s by the parent's clock (timers patched or results forged?)*"])


@pytest.mark.parametrize(
    ("stats", "wall_s", "reason"),
    [
        ({"n": 10, "median_us": float("nan"), "min_us": 1.0}, 1.0, "not finite non-negative"),
        ({"n": 10, "median_us": -1.0, "min_us": -2.0}, 1.0, "not finite non-negative"),
        ({"n": 0, "median_us": 1.0, "min_us": 1.0}, 1.0, "not finite non-negative"),
        ({"n": 10, "median_us": 1.0, "min_us": 2.0}, 1.0, "exceeds the median"),
        ({"n": 1000, "median_us": 3000.0, "min_us": 1.0}, 1.0, "by the parent's clock"),
        ({"n": 3, "median_us": "x", "min_us": 1.0}, 1.0, "malformed"),
    ],
)
def test_implausible_statistics_are_named(stats, wall_s, reason):
    from pytest_kcoral.stage_timing import implausible_stats

    assert reason in (implausible_stats(stats, wall_s) or "")


def test_plausible_statistics_pass():
    from pytest_kcoral.stage_timing import implausible_stats

    assert implausible_stats({"n": 1000, "median_us": 400.0, "min_us": 300.0, "iqr_us": 5.0}, 0.5) is None


# 21 --------------------------------------------------------------------------------------------

def test_secret_seed_and_reference_are_out_of_reach(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.READ_SECRETS, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    # had it found the seed it would have returned the right answer; it fell back to zeros
    result.stdout.fnmatch_lines(["*kcoral correctness failed: trial 1: output 0 is the constant 0 in every element*"])


# 22 --------------------------------------------------------------------------------------------

def test_segfault_fails_its_item_and_the_next_runs(make_case, run_kcoral):
    make_case("cases/add", candidates={"attack": attacks.SEGFAULT, "z_good": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral(*CORRECTNESS)
    result.assert_outcomes(failed=1, passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: crashed with SIGSEGV in phase 'correctness'*"])


def test_out_of_memory_fails_its_item(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.OUT_OF_MEMORY, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: RuntimeError: *can't allocate memory*"])


def test_hang_times_out(make_case, run_kcoral):
    started = time.monotonic()
    result = _grade(make_case, run_kcoral, attacks.HANG, *CORRECTNESS, "--kcoral-timeout", "3")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: timed out in phase 'correctness' (item timeout reached)*"])
    assert time.monotonic() - started < 20


def test_an_import_that_hangs_costs_the_timeout_twice_not_once_per_shape(make_case, run_kcoral):
    """A fresh process would hang at the import again: after two did, the candidate's later shapes
    fail at once, naming the items where it hung. (One is not enough: a build cut off at the
    timeout resumes in the next process.)"""
    started = time.monotonic()
    hang = "import time\nwhile True:\n    time.sleep(0.1)\n"
    result = _grade(make_case, run_kcoral, hang, *CORRECTNESS, "--kcoral-timeout", "5", case=add_case([64, 96, 128, 160, 192]))
    result.assert_outcomes(failed=5)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': timed out in phase 'import' (item timeout reached)*"])
    # on a loaded machine the first item's start (the template's imports) may time out first: then three items hang, not two
    again = [line for line in result.stdout.lines if "not imported again: its import timed out in cases/add::attack[seen-n=" in line]
    assert len(again) >= 2 and all(" and cases/add::attack[seen-n=" in line and "(--kcoral-timeout 5 s)" in line for line in again), again
    assert time.monotonic() - started < 4 * 5, "each shape paid the timeout"


def test_fork_storm_is_stopped_and_fails(make_case, run_kcoral):
    result = _grade(make_case, run_kcoral, attacks.FORK_STORM, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: detected after the candidate ran in phase 'correctness': left * process(es) running after returning*"])
    assert not _no_marker_processes(attacks.MARKER + "-storm"), "a process of the storm outlived its item"


# honest candidates never trip a check ---------------------------------------------------------

def test_honest_candidate_passes_every_check(make_case, run_kcoral):
    make_case("cases/add", candidates={"honest": "import torch\ndef run(a, b):\n    return torch.add(a, b)\n"})
    run_kcoral().assert_outcomes(passed=2)


def test_honest_torch_compile_candidate_passes(make_case, run_kcoral):
    # inductor compiles in-process in a child (no worker pool left behind), and importing
    # torch._dynamo rewrapping torch functions is not tampering
    src = "import torch\n@torch.compile\ndef _add(a, b):\n    return a + b\ndef run(a, b):\n    return _add(a, b)\n"
    make_case("cases/add", candidates={"compiled": src})
    run_kcoral("-m", "seen").assert_outcomes(passed=1, deselected=1)


def test_honest_prepare_with_a_preallocated_output_passes(make_case, run_kcoral):
    # the verified timed outputs are copies: a buffer reused by the next call is no finding
    src = "import torch\ndef prepare(a, b):\n    out = torch.empty_like(a)\n    return lambda: torch.add(a, b, out=out)\n"
    make_case("cases/add", candidates={"honest": src})
    run_kcoral().assert_outcomes(passed=2)


# a forged run reply whose structure report cannot be read: refused, not a crash of the pytest process
FORGED_STRUCTURE = attacks.FORGED_REPLY_WITH_NONCE.replace('"structures": [0 for _ in outputs]', '"structures": ["yes" for _ in outputs]')


def test_a_forged_structure_report_is_refused(make_case, run_kcoral):
    assert FORGED_STRUCTURE != attacks.FORGED_REPLY_WITH_NONCE
    result = _grade(make_case, run_kcoral, FORGED_STRUCTURE, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    # the trusted child judged the trials itself; the forged reply does not even name them
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the candidate's child reported 0 trials, the trusted child fed 3 (results forged?)*"])


STOPS_ITS_SIBLINGS = """
import os
import signal

def run(a, b):
    # every other child of the process this one was forked from: the case's trusted child among them
    me, parent = os.getpid(), os.getppid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == parent and int(pid) != me:
                os.kill(int(pid), signal.SIGSTOP)
        except (OSError, ValueError):
            pass
    return a + b
"""


def test_kept_children_a_candidate_stopped_run_again_for_the_next_item(make_case, run_kcoral):
    """A candidate runs as the same user as the case's kept children and can SIGSTOP them. Left
    stopped after its process was gone, the trusted child hung the next item of the case, which
    then read as the case's failure: every later candidate failed. After each candidate's process
    ends, the kept children get SIGCONT."""
    make_case("cases/add", candidates={"attack": STOPS_ITS_SIBLINGS, "later": "def run(a, b):\n    return a + b\n"})
    # unconfined: under Landlock (ABI 6+) the SIGSTOPs are refused (test_confinement.py)
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-timeout", "20", "-p", "no:randomly", "-v", "--kcoral-confinement", "off")
    # the candidate's own items starve: the trusted child feeds its calls, and it stopped it
    result.assert_outcomes(passed=2, failed=2)  # both shapes of both candidates; the later ones need the trusted child
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the candidate's process stopped the case's trusted child (SIGSTOP) while it fed the candidate's calls*"])
    assert "the case itself failed" not in result.stdout.str()


# The case's reference (and a helper it imports) as a planted .pyc would have them: compiled from
# other source, stamped with the real source's size and time, so Python would take it for the
# source's own cache.
POISONED_CASE = """
import torch
from helper import combine
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return combine(a, b)
"""


def _plant_pyc(source_file, planted_source: str) -> None:
    import importlib.util
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    stat = source_file.stat()
    code = compile(planted_source, str(source_file), "exec")
    target = importlib.util.cache_from_source(str(source_file))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as f:
        f.write(_code_to_timestamp_pyc(code, int(stat.st_mtime), stat.st_size))


def test_a_planted_pyc_never_runs_in_place_of_the_cases_source(make_case, run_kcoral, pytester):
    """A candidate without --kcoral-sandbox can write a case's __pycache__ (here, before the
    session: an earlier session's candidate). The pytest process and every child compile the
    case and its helpers from their source: a wrong candidate matching the planted reference
    fails, the right one passes."""
    folder = make_case("cases/add", POISONED_CASE, {"right": "def run(a, b):\n    return a + b\n",
                                                    "planted": "def run(a, b):\n    return a - b\n"},
                       files={"helper.py": "def combine(a, b):\n    return a + b\n"})
    _plant_pyc(folder / "case.py", POISONED_CASE.replace("return combine(a, b)", "return a - b"))
    _plant_pyc(folder / "helper.py", "def combine(a, b):\n    return a - b\n")
    result = run_kcoral("--kcoral-mode", "correctness", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*cases/add::planted?seen-n=64? FAILED*"])


# The work of a timed call done where it is not timed: the harness refreshes the next call's
# inputs outside the window, through the case's make_inputs.
REPLACES_THE_CASES_MAKE_INPUTS = """
import sys
import torch
_ready = []
for _name, _module in list(sys.modules.items()):
    if _name.startswith("_kcoral_case_") and callable(getattr(_module, "make_inputs", None)):
        def _hooked(shape, device, _real=_module.make_inputs):
            fresh = _real(shape, device)
            _ready[:] = [fresh[0] + fresh[1]]
            return fresh
        _module.make_inputs = _hooked

def run(a, b):
    return _ready.pop() if _ready else a + b
"""


def test_replacing_the_cases_functions_is_detected(make_case, run_kcoral):
    # it passed at 27-110x: the harness looked make_inputs up on the case's module at every refresh
    result = _grade(make_case, run_kcoral, REPLACES_THE_CASES_MAKE_INPUTS, *FULL)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': *replaced functions the harness relies on*_kcoral_case_*.make_inputs*"])


# Each call's work: long beside the harness's own time between calls (0.3-0.6 ms here, and a CPU's
# slack is three times that: ``timing.OUTSIDE_SLACK_FRACTION``), so moving it matters.
WORK_S = 0.02

SLOW_CASE = f"""
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

# a cheat's call: the answer its other code made ready, else the work
ANSWER_READY_OR_WORK = f"""
def run(a, b):
    if _ready:
        return _ready.pop()
    _spin({WORK_S})
    return a + b
"""

# The same work, moved into torch.randn: the refresh calls it for the next call's inputs, so the
# answer is ready, computed outside the window, when the call comes.
WORKS_IN_THE_INPUT_REFRESH = SPIN + f"""
import gc
import torch
_real_randn = torch.randn
_made, _ready = [], []

def _randn(*args, **kwargs):
    t = _real_randn(*args, **kwargs)
    if not gc.isenabled():  # the timing loop: the harness is refreshing the next call's inputs
        _made.append(t)
        if len(_made) == 2:
            _spin({WORK_S})
            _ready[:] = [_made[0] + _made[1]]
            _made.clear()
    return t

torch.randn = _randn
""" + ANSWER_READY_OR_WORK

# The same through a library the case uses while it makes its inputs, which no snapshot watches (a
# package of the project's own, einops, numpy...): here ``caselib``, beside the case in ``lib/``.
CASELIB = "def finish(a, b):\n    return a, b\n"

SLOW_CASE_WITH_A_LIBRARY = SLOW_CASE.replace(
    "    return torch.randn(shape[\"n\"], device=device), torch.randn(shape[\"n\"], device=device)",
    "    return caselib.finish(torch.randn(shape[\"n\"], device=device), torch.randn(shape[\"n\"], device=device))").replace(
    "import time\n", "import os, sys, time\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'lib'))\nimport caselib\n", 1)

WORKS_IN_A_LIBRARY_CALL = SPIN + f"""
import gc
import caselib
_real_finish = caselib.finish
_ready = []

def _finish(a, b):
    if not gc.isenabled():  # the timing loop: the harness is refreshing the next call's inputs
        _spin({WORK_S})
        _ready[:] = [a + b]
    return _real_finish(a, b)

caselib.finish = _finish
""" + ANSWER_READY_OR_WORK

HONEST_SLOW = SPIN + f"""
def run(a, b):
    _spin({WORK_S})
    return a + b
"""


# 9: a cache keyed by the inputs' values, which answers a repeated input at once (correctly: the
# same values give the same result) and does the work otherwise
CACHE_BY_CONTENT = SPIN + f"""
import hashlib
_cache = {{}}
def run(a, b):
    key = hashlib.sha1(a.numpy().tobytes() + b.numpy().tobytes()).hexdigest()
    if key not in _cache:
        _spin({WORK_S})
        _cache[key] = a + b
    return _cache[key].clone()
"""


def test_cache_by_content_never_answers_a_timed_call(make_case, run_kcoral, pytester):
    import json

    # every timed call gets fresh values, so the cache misses and does the work every time; had
    # the timed calls repeated their inputs, it would read hundreds of times faster than the
    # reference, which does the same work on every call
    make_case("cases/slow", SLOW_CASE, {"cache": CACHE_BY_CONTENT})
    run_kcoral("--kcoral-timing-budget", "0.1", "--kcoral-json", "out.json").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["speedup"] < 1.5, (item["speedup"], item["candidate_timing"], item["baseline_timing"])


def test_replacing_torchs_input_makers_is_detected(make_case, run_kcoral):
    make_case("cases/slow", SLOW_CASE, {"attack": WORKS_IN_THE_INPUT_REFRESH})
    result = run_kcoral(*FULL)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': *replaced functions the harness relies on*torch.randn*"])


def test_work_hidden_in_the_cases_input_maker_never_runs_in_the_candidates_process(make_case, run_kcoral, pytester):
    import json

    # the attack's hook on the library the case's make_inputs calls would do the next call's work
    # while the harness refreshed its inputs, outside the window; the trusted child makes every
    # timed call's inputs (``feed.py``), so the hook never runs while timed and the call does the work
    assert SLOW_CASE_WITH_A_LIBRARY != SLOW_CASE
    folder = make_case("cases/slow", SLOW_CASE_WITH_A_LIBRARY, {"attack": WORKS_IN_A_LIBRARY_CALL, "honest": HONEST_SLOW})
    (folder / "lib").mkdir()
    (folder / "lib" / "caselib.py").write_text(CASELIB)
    result = run_kcoral("--kcoral-timing-budget", "0.1", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=2)
    items = {i["candidate"]: i for i in json.loads((pytester.path / "out.json").read_text())["items"]}
    for item in items.values():
        assert 0.8 < item["speedup"] < 1.25, (item["candidate"], item["speedup"])
        assert item["extra"]["timed_outputs"]["candidate"]["checked"] > 0


# Work left for after its window: a finalizer on the call's output runs when the harness lets the
# output go, outside the window. It cannot make a timed call's answer (the next inputs do not exist
# yet), but its time is the call's all the same.
WORKS_AFTER_ITS_WINDOW = SPIN + f"""
import weakref

def run(a, b):
    _spin({WORK_S})
    out = a + b
    weakref.finalize(out, _spin, {WORK_S})
    return out
"""


def test_work_done_outside_the_timing_window_is_charged(make_case, run_kcoral, pytester):
    import json

    make_case("cases/slow", SLOW_CASE, {"after": WORKS_AFTER_ITS_WINDOW, "honest": HONEST_SLOW})
    result = run_kcoral("--kcoral-timing-budget", "0.1", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=2)
    items = {i["candidate"]: i for i in json.loads((pytester.path / "out.json").read_text())["items"]}
    after, honest = items["after"], items["honest"]
    # 20 ms of work in each window and 20 ms after it: charged, it reads slower than the baseline
    assert after["candidate_timing"]["charged_us"] > 1000.0, after["candidate_timing"]
    assert any(f.startswith("outside_window_excess_us=") for f in after["candidate_timing"]["flags"])
    assert after["speedup"] < 0.8, after["speedup"]
    assert honest["candidate_timing"]["charged_us"] == 0.0 and after["baseline_timing"]["charged_us"] == 0.0
    assert not any(f.startswith("outside_window_excess_us=") for f in honest["candidate_timing"]["flags"]), (
        honest["candidate_timing"], honest["baseline_timing"])
    assert 0.8 < honest["speedup"] < 1.25, honest["speedup"]


TWO_SEEN_SHAPES = """
import torch
SEEN = [{"n": 256}, {"n": 128}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b
"""

# A reply nested deeper than the parent's recursion limit, written straight into the channel on
# the shape that the candidate gets wrong: the item vanished from the JSON and the scores, and
# the pair read correct on every seen shape.
DEEP_REPLY = """
import gc
from multiprocessing.connection import Connection

def run(a, b):
    if a.numel() == 256:
        return a + b
    for conn in [o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed and o.writable]:
        conn.send_bytes(b"[" * 100000 + b"]" * 100000)
    return a - b
"""


def test_a_reply_nested_too_deeply_fails_its_item_and_stays_in_the_json(make_case, run_kcoral, pytester):
    import json

    make_case("cases/add", TWO_SEEN_SHAPES, {"attack": DEEP_REPLY})
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, failed=1)
    doc = json.loads((pytester.path / "out.json").read_text())
    assert len(doc["items"]) == 2
    failed = [i for i in doc["items"] if i["outcome"] == "failed"]
    assert len(failed) == 1 and "nested too deeply" in failed[0]["message"], failed
    (pair,) = doc["candidates"]
    assert pair["correct_seen"] is False and pair["seen_items"] == 2



# A reply that claims a 1.5 GiB tensor: the parent allocated whatever a skeleton claimed, and
# read it all before it checked whom the reply answered (pytest's memory grew by the claim).
# Once with a forged sequence number, once with the command's own, read from the harness's frames.
FLOODS_THE_PARENT = """
import gc, inspect, json, os, struct
from multiprocessing.connection import Connection

def run(a, b):
    frame, seq, nonce = inspect.currentframe(), None, None
    while frame is not None:
        h = frame.f_locals.get("header")
        if isinstance(h, dict) and "nonce" in h:
            seq, nonce = h["seq"], h["nonce"]
        frame = frame.f_back
    header = {"ok": True, "seq": seq if ANSWERS else 999, "nonce": nonce, "payload": True}
    skeleton = {"dict": {"outputs": [{"tensor": 0, "dtype": "uint8", "shape": [3 << 29]}], "written": []}}
    zeros = bytes(16 << 20)
    for conn in [o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed and o.writable]:
        conn.send_bytes(json.dumps(header).encode())
        conn.send_bytes(json.dumps(skeleton).encode())
        os.write(conn.fileno(), struct.pack("!i", 3 << 29))  # the frame's true length, then its bytes
        for _ in range(96):
            os.write(conn.fileno(), zeros)
    return a + b
"""


@pytest.mark.parametrize(("answers", "message"), [
    (False, "a reply in phase 'correctness' does not answer the command sent (sequence 999, expected *)"),
    (True, "sent a malformed message in phase 'correctness': a payload of 1610612736 bytes of tensors, more than the * this reply can need"),
])
def test_a_reply_cannot_make_the_parent_allocate_what_it_claims(make_case, run_kcoral, answers, message):
    result = _grade(make_case, run_kcoral, f"ANSWERS = {answers}\n" + FLOODS_THE_PARENT, *CORRECTNESS)
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines([f"*kcoral correctness failed*: {message}*"])


# Kill the template every child is forked from (the same user may), leaving a detached process
# behind: the template's orphan sweep went with it, and multiprocessing quietly started a new
# template, outside --kcoral-sandbox, for every later child.
KILLS_THE_TEMPLATE = f"""
import ctypes, os, signal

def run(a, b):
    if os.fork() == 0:  # detached, and out of the template's reach once the template is gone
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["{attacks.MARKER}-template-orphan", "60"])
        os._exit(0)
    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG off: this process outlives the template
    os.kill(os.getppid(), signal.SIGKILL)
    os._exit(0)  # before the child's audit can find what it left: that lands at init, not the dead template
"""

# fails where it runs in the host's network namespace, out of the sandbox
OUTSIDE_THE_SANDBOX_FAILS = """
import os

def run(a, b):
    if os.readlink("/proc/self/ns/net") == os.environ.get("KCORAL_TEST_HOST_NET"):
        raise RuntimeError("running outside the sandbox")
    return a + b
"""


@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandbox"])
def test_killing_the_template_fails_the_item_and_changes_nothing_for_the_next(make_case, run_kcoral, monkeypatch, sandboxed):
    if sandboxed:
        if not _bwrap_works():
            pytest.skip("bubblewrap (bwrap) is not installed or cannot create a sandbox here")
        monkeypatch.setenv("KCORAL_TEST_HOST_NET", os.readlink("/proc/self/ns/net"))
    make_case("cases/add", candidates={"a_killer": KILLS_THE_TEMPLATE, "b_later": OUTSIDE_THE_SANDBOX_FAILS})
    # unconfined: under Landlock (ABI 6+) the kill is refused (test_confinement.py)
    result = run_kcoral(*CORRECTNESS, "-p", "no:randomly", "-v", "--kcoral-confinement", "off", *(["--kcoral-sandbox"] if sandboxed else []))
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    result.stdout.fnmatch_lines(["kcoral correctness failed: the process every child is forked from (the harness's template) died while this item ran*"])
    assert _no_marker_processes(f"{attacks.MARKER}-template-orphan") == []


def _bwrap_works() -> bool:
    from test_sandbox import _bwrap_works as works

    return works()


# A process the candidate detached (setsid) is idle when audited, so it may stay, and it is in no
# process group the kept child's SIGSTOP reaches: it ran on during the other candidates' items
# (here it only notes that it ran while its child was stopped; it could take cores or, on a GPU,
# launch work). ``Child.pause`` now stops what lies below the child too.
RUNS_WHILE_KEPT = """
import os
import time

CHILD = os.getpid()
MARK = {mark!r}

def _state(pid):
    try:
        with open(f"/proc/{{pid}}/stat", "rb") as f:
            s = f.read()
        return s[s.rfind(b")") + 2:].split()[0]
    except OSError:
        return b"?"

if os.fork() == 0:
    os.setsid()  # out of the child's process group
    while _state(CHILD) not in (b"?", b"Z", b"X"):
        time.sleep(0.05)  # idle by the audit's measure
        if _state(CHILD) in (b"T", b"t"):
            with open(MARK, "w") as f:
                f.write("ran while the child was kept, stopped")
            break
    os._exit(0)

def run(a, b):
    return a + b
"""


def test_nothing_a_kept_child_left_runs_while_it_is_paused(make_case, run_kcoral, pytester):
    mark = pytester.path / "ran-while-kept"
    make_case("cases/add", TWO_SEEN_SHAPES, {"attack": RUNS_WHILE_KEPT.format(mark=str(mark)), "other": "def run(a, b):\n    return a + b\n"})
    # unconfined, so that the detached process can leave a mark where the test reads it
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-confinement", "off", "-p", "no:randomly", "-v")
    result.assert_outcomes(passed=4)
    assert not mark.exists(), "a process the candidate detached ran on while its kept child was paused"
