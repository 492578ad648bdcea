"""Grading a case in a pytest subprocess, for the GPU tests: each session then has its own template
process and CUDA state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path


def grade_in_subprocess(tmp_path: Path, case_src: str, candidates: dict[str, str], *args: str,
                        timeout: float = 600, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """Write ``cases/add`` (the case and its candidates) under ``tmp_path``, grade it there with a
    lease directory of its own (``env``: variables to set for it), and return the finished process
    and the JSON artifact."""
    case = tmp_path / "cases" / "add"
    (case / "candidates").mkdir(parents=True, exist_ok=True)
    (case / "case.py").write_text(textwrap.dedent(case_src))
    for name, src in candidates.items():
        (case / "candidates" / f"{name}.py").write_text(textwrap.dedent(src))
    cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "cases", "--kcoral-json", "out.json",
           "--kcoral-lease-dir", str(tmp_path / "leases"), *args]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    return proc, json.loads((tmp_path / "out.json").read_text())
