"""SPEC section 8 on a real GPU: compute-sanitizer fails a kernel that reads past its inputs and
passes a masked one; Nsight Compute writes a report per item. Each test starts pytest in a
subprocess, so its template process and its CUDA state are its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kernels import triton_add

from pytest_kcoral.diagnostics import DiagnosticsUnavailable, find_tool

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# 257 elements: the second program of a 256-wide kernel covers 256..511, past every tensor's end
CASE = """
import torch
SEEN = [{"n": 257}]
UNSEEN = []

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b
"""

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
    case = tmp_path / "cases" / "add"
    (case / "candidates").mkdir(parents=True, exist_ok=True)
    (case / "case.py").write_text(textwrap.dedent(CASE))
    for name, src in candidates.items():
        (case / "candidates" / f"{name}.py").write_text(textwrap.dedent(src))
    cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "cases", "--kcoral-json", "out.json",
           "--kcoral-mode", "correctness", "--kcoral-artifacts", "art", "--kcoral-lease-dir", str(tmp_path / "leases"),
           "--junitxml", "junit.xml", *args]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=540, env=dict(os.environ))
    return proc, json.loads((tmp_path / "out.json").read_text())


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
