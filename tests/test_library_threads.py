"""Threads and processes that libraries leave behind are not cheats: what counts is whether they
work. An idle one (tqdm's monitor, ``torch.compile``'s workers) passes; one that keeps computing
after its call returned, or between calls, fails with its name (``leftovers.Baseline``).

The attacks that must still fail are in ``tests/adversarial/test_attacks.py``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pytest_kcoral import leftovers

# an idle monitor named as tqdm names its own, and an idle process, started by the candidate
IDLE_THREAD_AND_PROCESS = """
import subprocess, threading
stop = threading.Event()
threading.Thread(target=stop.wait, name="tqdm_monitor", daemon=True).start()
sleeper = subprocess.Popen(["kcoral-idle-sleeper-5c1d", "60"], executable="sleep")
def run(a, b):
    return a + b
"""

REAL_TQDM = """
from tqdm import tqdm
bar = tqdm(total=1, delay=0)   # starts tqdm's monitor thread, as torch.compile's progress bar does
def run(a, b):
    return a + b
"""

TORCH_COMPILE = """
import torch

def _add(a, b):
    return a + b

run = torch.compile(_add)
"""


def _processes_named(name: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().split(b"\0", 1)[0] == name.encode():
                        found.append(int(pid))
            except OSError:
                continue
    return found


# -- the rule, in a fresh interpreter ------------------------------------------------------------
# (the audit kills every process below the one it runs in, and this test session's has others:
# the template children are forked from)


def _run_fresh(code: str) -> None:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code) + "\nprint('ok')\n"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().endswith("ok"), out.stdout + out.stderr


def test_an_idle_thread_is_watched_and_one_that_then_works_is_named():
    _run_fresh("""
        import threading, time
        from pytest_kcoral import leftovers
        baseline = leftovers.Baseline.take()
        wake = threading.Event()
        def sometimes_busy():
            wake.wait()
            while True:
                sum(range(1000))
        thread = threading.Thread(target=sometimes_busy, name="sometimes-busy", daemon=True)
        thread.start()
        assert baseline.find() == []  # idle over the grace: watched, not a finding
        assert thread.ident in baseline.watched_threads
        wake.set()
        time.sleep(0.3)  # the next command's time, during which it works
        problems = baseline.find()
        assert len(problems) == 1 and "'sometimes-busy'" in problems[0], problems
        assert "while the candidate was checked or timed" in problems[0], problems
    """)


def test_a_fresh_thread_that_keeps_computing_is_named_with_its_cpu_time():
    _run_fresh("""
        import threading
        from pytest_kcoral import leftovers
        baseline = leftovers.Baseline.take()
        def busy():
            while True:
                sum(range(1000))
        threading.Thread(target=busy, name="busy-after-return", daemon=True).start()
        problems = baseline.find()
        assert len(problems) == 1, problems
        assert problems[0].startswith("left a thread running after returning that keeps computing: 'busy-after-return' (daemon=True; "), problems
        assert "ms of CPU in" in problems[0] and "after returning" in problems[0], problems
    """)


def test_the_idle_allowance_is_far_below_a_busy_core():
    # a busy thread uses about a core; over the 0.2 s grace the allowance is 9 ms
    assert leftovers.idle_allowance_s(leftovers.THREAD_GRACE_S) < 0.05 * leftovers.THREAD_GRACE_S + leftovers.IDLE_CPU_S
    cpu = leftovers.thread_cpu_s(threading.current_thread())
    assert cpu is not None and cpu > 0


def test_an_idle_process_is_watched_and_a_working_one_is_killed():
    _run_fresh("""
        import subprocess, time
        from pytest_kcoral import leftovers
        baseline = leftovers.Baseline.take()
        idle = subprocess.Popen(["sleep", "30"])
        deadline = time.monotonic() + 5  # its start-up is not what is judged, and a loaded host can stretch it into the audit
        while leftovers._state_of(idle.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        problems = baseline.find()
        assert problems == [] and idle.pid in baseline.watched_processes, (problems, baseline.watched_processes)
        busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])
        problems = baseline.find()
        assert len(problems) == 1 and "working (using CPU or starting processes)" in problems[0], problems
        assert f"pid {busy.pid}" in problems[0], problems
        # the item fails: all of them are killed. The audit reaps what it killed, so Popen may find
        # no child left to wait for and say 0; neither process can end by itself within 5 s.
        assert busy.wait(5) in (-9, 0) and idle.wait(5) in (-9, 0), (busy.returncode, idle.returncode)
    """)


# -- through the pipeline -----------------------------------------------------------------------

def test_idle_library_thread_and_process_pass_and_the_process_dies_with_the_item(make_case, run_kcoral):
    make_case("cases/add", candidates={"idle": IDLE_THREAD_AND_PROCESS})
    result = run_kcoral("-m", "seen")
    result.assert_outcomes(passed=1, deselected=1)
    deadline = time.monotonic() + 5
    while _processes_named("kcoral-idle-sleeper-5c1d") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_named("kcoral-idle-sleeper-5c1d"), "an idle process outlived its item"


@pytest.mark.skipif(importlib.util.find_spec("tqdm") is None, reason="tqdm is not installed (the test extra has it)")
def test_tqdm_monitor_thread_passes(make_case, run_kcoral):
    make_case("cases/add", candidates={"tqdm_bar": REAL_TQDM})
    result = run_kcoral("-m", "seen", "--kcoral-mode", "correctness")
    result.assert_outcomes(passed=1, deselected=1)


def test_torch_compile_candidate_passes_on_the_cpu(tmp_path):
    """Inductor on the CPU, compiling for real (no cache: a cached graph compiles nothing, and
    leaves no thread); with tqdm installed its progress bar leaves tqdm's monitor behind."""
    from grading import grade_in_subprocess
    from kernels import add_case

    proc, doc = grade_in_subprocess(tmp_path, add_case([256]), {"compiled": TORCH_COMPILE}, "--kcoral-timing-budget", "0.02",
                                    env={"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    [item] = doc["items"]
    assert item["outcome"] == "passed" and item["speedup"] is not None


def test_torch_compile_leaves_only_idle_threads_when_imported_with_tqdm():
    """What the rule is for: torch.compile with tqdm installed leaves tqdm's monitor thread, which
    the old rule (any thread left running fails) failed every such candidate for."""
    if importlib.util.find_spec("tqdm") is None:
        pytest.skip("tqdm is not installed (the test extra has it)")
    code = (
        "import threading, torch\n"
        "from pytest_kcoral import leftovers\n"
        "baseline = leftovers.Baseline.take()\n"
        "f = torch.compile(lambda a, b: (a + b).relu())\n"
        "f(torch.randn(100), torch.randn(100))\n"
        "left = [t.name for t in baseline._new_threads()]\n"
        "print('left', left, 'problems', baseline.find())\n"
    )
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", TORCHINDUCTOR_COMPILE_THREADS="1", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "problems []" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "tqdm_monitor" in out.stdout, out.stdout
