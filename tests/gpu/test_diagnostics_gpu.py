"""SPEC section 8 on a real GPU: compute-sanitizer fails a kernel that reads past its inputs and
passes a masked one; Nsight Compute writes a report per item. Each test starts pytest in a
subprocess, so its template process and its CUDA state are its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from grading import grade_in_subprocess
from kernels import add_case, triton_add

from pytest_kcoral.diagnostics import DiagnosticsUnavailable, find_tool

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# 257 elements: the second program of a 256-wide kernel covers 256..511, past every tensor's end
CASE = add_case([257])

MASKED = triton_add(block=256)
# loads without the mask read past the inputs' ends; the masked store keeps the output right, so
# the correctness stage passes and only the sanitizer can tell
READS_PAST_THE_END = MASKED.replace("tl.load(a + i, mask=m)", "tl.load(a + i)").replace("tl.load(b + i, mask=m)", "tl.load(b + i)")


def _tool(name: str) -> str:
    try:
        return find_tool(name)
    except DiagnosticsUnavailable as exc:
        pytest.skip(str(exc))


def _grade(tmp_path: Path, candidates: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    return grade_in_subprocess(tmp_path, CASE, candidates, "--kcoral-mode", "correctness", "--kcoral-artifacts", "art",
                               "--junitxml", "junit.xml", *args, timeout=540)


def test_ncu_writes_a_report_per_item_and_the_grade_stands(tmp_path):
    _tool("ncu")
    proc, doc = _grade(tmp_path, {"masked": MASKED}, "--kcoral-ncu")
    (item,) = doc["items"]
    assert item["outcome"] == "passed", (item["message"], proc.stdout[-3000:])
    ncu = item["extra"]["diagnostics"]["ncu"]
    report = Path(ncu["report"] or "")
    assert ncu["report"] and report.suffix == ".ncu-rep" and report.stat().st_size > 0, ncu
    assert report.is_relative_to(tmp_path / "art")
    assert "kcoral_ncu_report" in (tmp_path / "junit.xml").read_text()


def test_memcheck_fails_reads_past_the_end_and_passes_the_masked_kernel(tmp_path):
    _tool("compute-sanitizer")
    proc, doc = _grade(tmp_path, {"masked": MASKED, "reads_past_the_end": READS_PAST_THE_END}, "--kcoral-sanitizer", "memcheck")
    items = {item["candidate"]: item for item in doc["items"]}
    masked, bad = items["masked"], items["reads_past_the_end"]
    assert masked["outcome"] == "passed", (masked["message"], proc.stdout[-3000:])
    assert masked["extra"]["diagnostics"]["sanitizer"]["errors"] == 0
    assert bad["outcome"] == "failed" and bad["stage"] == "correctness" and bad["phase"] == "sanitizer", bad["message"]
    assert "compute-sanitizer memcheck found" in bad["message"] and "Invalid __global__ read" in bad["message"], bad["message"]
    log = Path(bad["extra"]["diagnostics"]["sanitizer"]["log"])
    assert log.is_file() and log.is_relative_to(tmp_path / "art"), log
    assert bad["extra"]["diagnostics"]["sanitizer"]["errors"] > 0
    assert "kcoral_sanitizer" in (tmp_path / "junit.xml").read_text()
