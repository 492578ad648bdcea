"""SPEC section 8 where no GPU is: the options' errors, the process the tools inspect, and the
reading of compute-sanitizer's log. The tools themselves run in tests/gpu/test_diagnostics_gpu.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from kernels import add_case

from pytest_kcoral.diagnostics import Diagnostics, DiagnosticsUnavailable, find_tool, ncu_command, sanitizer_findings


def test_a_missing_tool_stops_the_session_and_says_where_it_looked(make_case, run_kcoral, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without the CUDA tools
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    try:
        find_tool("compute-sanitizer")
        pytest.skip("compute-sanitizer is installed in /usr/local/cuda/bin here")
    except DiagnosticsUnavailable:
        pass
    make_case("cases/add")
    result = run_kcoral("--kcoral-sanitizer", "memcheck")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--kcoral-sanitizer: compute-sanitizer was not found on PATH or in {tmp_path / 'cuda' / 'bin'}*"])


def test_diagnostics_are_refused_with_a_remote_service(make_case, run_kcoral):
    make_case("cases/add")
    result = run_kcoral("--kcoral-ncu", "--kcoral-url", "http://127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kcoral-ncu runs the tools on this machine's GPUs: not with --kcoral-url*"])


def test_an_unknown_sanitizer_tool_is_refused(make_case, run_kcoral):
    make_case("cases/add")
    result = run_kcoral("--kcoral-sanitizer", "leakcheck")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kcoral-sanitizer: invalid choice: 'leakcheck'*memcheck*racecheck*initcheck*synccheck*"])


CASE = add_case([8])

# writes what it was called with, so the test sees the calls the tool would have watched
RECORDING = """
import json, os
def run(a, b):
    with open(os.environ["CALLS_FILE"], "a") as f:
        f.write(json.dumps({"sum": float((a + b).sum()), "cwd": os.getcwd()}) + "\\n")
    return a + b
"""


def _job(tmp_path, candidate_src: str, calls: int | None = None):
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    (case_dir / "case.py").write_text(textwrap.dedent(CASE))
    (case_dir / "cand.py").write_text(textwrap.dedent(candidate_src))
    inputs = [(torch.randn(8), torch.randn(8)) for _ in range(3)]
    work = tmp_path / "work"
    work.mkdir()
    torch.save(inputs, work / "inputs.pt")
    spec = {"format": "native", "source": str(case_dir / "case.py"), "baseline_file": None, "device": "cpu", "init_seed": 1}
    (work / "job.json").write_text(json.dumps({"case": spec, "candidate": str(case_dir / "cand.py"), "shape": {"n": 8}, "calls": calls}))
    return work, inputs


def _run_child(work, env_extra):
    import os

    return subprocess.run([sys.executable, "-m", "pytest_kcoral.diagnostics_child", str(work / "job.json")], cwd=work,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env_extra})


@pytest.mark.parametrize("calls", [None, 1])
def test_the_inspected_process_runs_the_candidate_on_the_saved_inputs(tmp_path, calls):
    work, inputs = _job(tmp_path, RECORDING, calls)
    log = tmp_path / "calls.jsonl"
    proc = _run_child(work, {"CALLS_FILE": str(log)})
    assert proc.returncode == 0, proc.stderr
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    expected = inputs[: calls or len(inputs)]
    assert [round(r["sum"], 4) for r in seen] == [round(float((a + b).sum()), 4) for a, b in expected]
    assert all(r["cwd"] == str(work) for r in seen)
    assert f"{len(expected)} call(s)" in proc.stdout


def test_a_failing_candidate_ends_the_inspected_process_with_its_error(tmp_path):
    work, _ = _job(tmp_path, "def run(a, b):\n    raise ValueError('no kernel today')\n")
    proc = _run_child(work, {})
    assert proc.returncode != 0
    assert "ValueError: no kernel today" in proc.stderr


# the shape of compute-sanitizer's memcheck log (CUDA 12/13)
MEMCHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at _add+0x1b0 in /tmp/cand.py:11
=========     by thread (1,0,0) in block (1,0,0)
=========     Address 0x7f1e2a000404 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f1e2a000000 of size 1028 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f1f3] in libcuda.so.1
=========
========= Invalid __global__ read of size 4 bytes
=========     at _add+0x1c0 in /tmp/cand.py:11
=========
========= ERROR SUMMARY: 510 errors
"""


def test_sanitizer_findings_count_the_summary_and_show_the_first_errors():
    count, lines = sanitizer_findings(MEMCHECK_LOG)
    assert count == 510
    assert lines == ["Invalid __global__ read of size 4 bytes"]  # one line per kind, not per thread
    assert sanitizer_findings("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") == (0, [])


def test_ncu_keeps_the_clocks_as_the_timer_sees_them(tmp_path):
    command = ncu_command("ncu", tmp_path / "profile")
    assert command[command.index("--clock-control") + 1] == "none"
    assert command[command.index("--export") + 1] == str(tmp_path / "profile")


def _diagnostics(tmp_path, timeout_s: float = 60.0):
    return Diagnostics(ncu=None, sanitizer=None, sanitizer_tool=None, artifacts=tmp_path / "art", timeout_s=timeout_s, child_env={})


def test_a_run_under_a_tool_gets_a_private_directory_that_is_removed(tmp_path, monkeypatch):
    work, inputs = _job(tmp_path, RECORDING)
    job = json.loads((work / "job.json").read_text())
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CALLS_FILE", str(log))
    # no tool in front: the same run the tools wrap
    status, output, seconds = _diagnostics(tmp_path)._run([], job, inputs, {})
    assert status == 0 and "3 call(s)" in output and seconds > 0
    cwds = {json.loads(line)["cwd"] for line in log.read_text().splitlines()}
    assert len(cwds) == 1 and "kcoral-diag-" in next(iter(cwds))
    assert not any(Path(json.loads(line)["cwd"]).exists() for line in log.read_text().splitlines())


HANGS = """
import os, subprocess, sys, time
def run(a, b):
    # a helper in the same session, then a hang: both must be gone when the run is cut off
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["PIDS_FILE"], "w") as f:
        f.write(f"{os.getpid()} {helper.pid}")
    time.sleep(600)
"""


def test_a_run_out_of_time_is_killed_with_what_it_started(tmp_path, monkeypatch):
    work, inputs = _job(tmp_path, HANGS)
    job = json.loads((work / "job.json").read_text())
    pids_file = tmp_path / "pids"
    monkeypatch.setenv("PIDS_FILE", str(pids_file))
    # the inspected process's own temp dir: its bytecode must go to the private directory instead,
    # removed with the run, since a killed process cannot remove a directory of its own
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    status, _, seconds = _diagnostics(tmp_path, timeout_s=8.0)._run([], job, inputs, {})
    assert status is None and seconds < 30
    for pid in map(int, pids_file.read_text().split()):
        deadline = time.monotonic() + 5  # SIGKILL lands when the process is next scheduled: a loaded host delays it
        while not _gone_or_zombie(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _gone_or_zombie(pid), f"pid {pid} still running 5 s after the run was cut off"
    assert list(temp.iterdir()) == []


def _gone_or_zombie(pid: int) -> bool:
    """Killed: gone, or a zombie its new parent has not reaped yet."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def test_an_earlier_sessions_files_never_pass_for_this_runs_output(tmp_path):
    diagnostics = _diagnostics(tmp_path)
    first = diagnostics._path("cases/add::good[seen-n=8]", "profile")
    first.with_name("profile.ncu-rep").write_text("an old report")
    log = diagnostics._path("cases/add::good[seen-n=8]", "sanitizer-memcheck.txt")
    log.write_text("========= ERROR SUMMARY: 3 errors\n")
    assert diagnostics._path("cases/add::good[seen-n=8]", "profile") == first
    assert not first.with_name("profile.ncu-rep").exists()
    diagnostics._path("cases/add::good[seen-n=8]", "sanitizer-memcheck.txt")
    assert not log.exists()
    assert first.parent == (tmp_path / "art" / "cases_add_good_seen-n=8").resolve()
