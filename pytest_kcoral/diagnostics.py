"""SPEC section 8: an Nsight Compute report (``--kcoral-ncu``) and a compute-sanitizer check
(``--kcoral-sanitizer TOOL``) of a candidate, under the item's lease, files in ``--kcoral-artifacts``.

Both tools start the process they inspect, so the candidate runs here in a fresh interpreter
(``diagnostics_child.py``) under the tool, not in a child forked from the template: in a private
directory, in its own session (killed as a whole when it is done or out of time), on the inputs of
the correctness stage. Profiling numbers are diagnostics, never speedups: the timing stage's
figures stay the grade. A sanitizer finding fails the item (the pipeline reads ``failure``); a
report Nsight Compute could not write only says why, beside the item's results.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# compute-sanitizer's exit status when it found errors (``--error-exitcode``); any other non-zero
# status is the run itself failing
FINDINGS_EXIT = 86
# kernels profiled per report: a candidate launching thousands would keep the device for minutes
NCU_LAUNCH_COUNT = 100
DEFAULT_ARTIFACTS = "kcoral-artifacts"


class DiagnosticsUnavailable(Exception):
    """A requested tool is missing; the message names it and where it was looked for."""


class DiagnosticsWarning(pytest.PytestWarning):
    """A report that could not be written: the item's grade stands."""


def find_tool(name: str) -> str:
    """The path of ``ncu`` or ``compute-sanitizer``: on PATH, else in $CUDA_HOME/bin or the usual
    CUDA directory."""
    found = shutil.which(name)
    if found:
        return found
    places = [Path(os.environ[v]) / "bin" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    places.append(Path("/usr/local/cuda/bin"))
    for place in places:
        if (place / name).is_file() and os.access(place / name, os.X_OK):
            return str(place / name)
    where = ", ".join(str(p) for p in places)
    raise DiagnosticsUnavailable(f"{name} was not found on PATH or in {where}")


def ncu_command(ncu: str, report: Path) -> list[str]:
    """Nsight Compute around a command: the GPU's clocks as they are (as the timer sees them), the
    report written to ``report`` (``.ncu-rep`` appended)."""
    return [ncu, "--clock-control", "none", "--target-processes", "all", "--launch-count", str(NCU_LAUNCH_COUNT),
            "--force-overwrite", "--export", str(report)]


def sanitizer_command(sanitizer: str, tool: str, log: Path) -> list[str]:
    return [sanitizer, "--tool", tool, "--target-processes", "all", "--error-exitcode", str(FINDINGS_EXIT),
            "--print-limit", "20", "--log-file", str(log)]


_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+) error")
# a finding's first line follows the frame after one space; its details are indented further
_ERROR_LINE = re.compile(r"^=+ (?!ERROR SUMMARY|COMPUTE-SANITIZER)(\S.*)$")


def sanitizer_findings(log_text: str) -> tuple[int, list[str]]:
    """The error count of compute-sanitizer's summary and its first three kinds of error (a bad
    kernel repeats one error per thread: 66 times "Invalid __global__ read of size 8 bytes")."""
    match = _SUMMARY.search(log_text)
    count = int(match.group(1)) if match else 0
    lines = [m.group(1).strip() for m in map(_ERROR_LINE.match, log_text.splitlines()) if m]
    return count, list(dict.fromkeys(lines))[:3]


@dataclass
class Diagnostics:
    """The diagnostics a session asked for; one instance per executor."""

    ncu: str | None  # path of ncu, None: no report wanted
    sanitizer: str | None  # path of compute-sanitizer, None: no check wanted
    sanitizer_tool: str | None
    artifacts: Path
    timeout_s: float
    child_env: dict[str, str]

    @classmethod
    def from_settings(cls, settings: Any, child_env: dict[str, str]) -> Diagnostics | None:
        if not settings.ncu and not settings.sanitizer:
            return None
        return cls(
            ncu=find_tool("ncu") if settings.ncu else None,
            sanitizer=find_tool("compute-sanitizer") if settings.sanitizer else None,
            sanitizer_tool=settings.sanitizer,
            artifacts=settings.artifacts or Path(DEFAULT_ARTIFACTS),
            timeout_s=settings.timeout_s,
            child_env=child_env,
        )

    def sanitize(self, job: dict[str, Any], inputs: list, nodeid: str) -> dict[str, Any]:
        """Run the candidate on every correctness input set under compute-sanitizer. The record's
        ``failure`` says why the item fails (findings, a failed run, a timeout), or is None."""
        assert self.sanitizer and self.sanitizer_tool
        log = self._path(nodeid, f"sanitizer-{self.sanitizer_tool}.txt")
        # without the caching allocator every tensor is its own allocation, so an access past
        # a tensor's end is past an allocation's end, which is what memcheck sees
        env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
        status, output, seconds = self._run(sanitizer_command(self.sanitizer, self.sanitizer_tool, log), job, inputs, env)
        count, lines = sanitizer_findings(log.read_text(errors="replace") if log.is_file() else "")
        what = f"compute-sanitizer {self.sanitizer_tool}"
        failure = None
        if status is None:
            failure = f"{what} timed out after {self.timeout_s:g} s (--kcoral-timeout); log: {log}"
        elif status == FINDINGS_EXIT or count:
            failure = f"{what} found {count or 'some'} error(s): {'; '.join(lines) or 'see the log'} (log: {log})"
        elif status != 0:
            failure = f"the candidate's run under {what} failed with exit status {status}: {output[-1500:]}"
        return {"tool": self.sanitizer_tool, "log": str(log), "errors": count, "seconds": round(seconds, 1), "failure": failure}

    def profile(self, job: dict[str, Any], inputs: list, nodeid: str) -> dict[str, Any]:
        """One call of the candidate under Nsight Compute. A report that could not be written is
        recorded with the reason and warned about; it never fails the item."""
        assert self.ncu
        report = self._path(nodeid, "profile")
        status, output, seconds = self._run(ncu_command(self.ncu, report), dict(job, calls=1), inputs, {})
        written = report.with_name(report.name + ".ncu-rep")
        record: dict[str, Any] = {"report": str(written), "seconds": round(seconds, 1)}
        if status == 0 and written.is_file():
            return record
        why = "timed out" if status is None else f"exit status {status}" if status else "no report written"
        record.update(report=None, error=f"{why}: {output[-800:]}")
        warnings.warn(DiagnosticsWarning(f"--kcoral-ncu: no report for {nodeid} ({why}); see the item's diagnostics in the JSON"), stacklevel=1)
        return record

    # -- running a candidate under a tool ---------------------------------------------------

    def _path(self, nodeid: str, what: str) -> Path:
        """The item's file ``what`` in its folder, with an earlier session's copy removed: a tool
        that fails before writing must not leave a stale file to be read as its output."""
        folder = self.artifacts / re.sub(r"[^A-Za-z0-9_.=+-]+", "_", nodeid).strip("_")
        folder.mkdir(parents=True, exist_ok=True)
        path = (folder / what).resolve()
        for stale in (path, path.with_name(path.name + ".ncu-rep")):
            stale.unlink(missing_ok=True)
        return path

    def _run(self, tool: list[str], job: dict[str, Any], inputs: list, env: dict[str, str]) -> tuple[int | None, str, float]:
        """Exit status (None: out of time), the output's tail and the seconds it took."""
        import torch

        workdir = Path(tempfile.mkdtemp(prefix="kcoral-diag-"))
        try:
            torch.save(inputs, workdir / "inputs.pt")
            (workdir / "job.json").write_text(json.dumps(job))
            command = [*tool, sys.executable, "-m", "pytest_kcoral.diagnostics_child", str(workdir / "job.json")]
            started = time.monotonic()
            with open(workdir / "output.txt", "wb") as output:  # a file: a flood cannot block the child
                proc = subprocess.Popen(command, cwd=workdir, stdout=output, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        env={**os.environ, **self.child_env, **env})
                try:
                    status: int | None = proc.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    status = None
                finally:
                    # the tool, the candidate and whatever it started in its session
                    _kill_session(proc.pid)
                    proc.wait()
            seconds = time.monotonic() - started
            text = (workdir / "output.txt").read_bytes()[-20000:].decode(errors="replace")
            return status, text, seconds
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
