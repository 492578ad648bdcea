"""``--kcoral-sandbox``: children under bubblewrap; a missing or broken bwrap is a clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def _bwrap_works() -> bool:
    path = shutil.which("bwrap")
    if path is None:
        return False
    probe = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--unshare-net", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


needs_bwrap = pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap (bwrap) is not installed or cannot create a sandbox here")

ESCAPE = """
import os, socket, sys
def run(a, b):
    blocked = []
    try:
        socket.create_connection(("192.0.2.1", 80), timeout=1)
    except OSError as exc:
        blocked.append(f"network: {exc.strerror}")
    for path in ("/usr/kcoral-escape", os.path.dirname(sys.executable) + "/kcoral-escape", CASE_DIR + "/kcoral-escape"):
        try:
            open(path, "w").close()
        except OSError as exc:
            blocked.append(f"write {path}: {exc.strerror}")
    with open("scratch.txt", "w") as f:      # the private workspace is writable
        f.write("ok")
    raise RuntimeError(" | ".join(blocked))
"""


@needs_bwrap
def test_sandbox_blocks_network_and_writes_outside_the_workspace(make_case, run_kcoral, pytester):
    root = make_case("cases/add", candidates={"escape": ESCAPE.replace("CASE_DIR", repr(str(pytester.path))),
                                              "good": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("--kcoral-sandbox", "--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    result.stdout.fnmatch_lines(["*RuntimeError: network: Network is unreachable | write /usr/kcoral-escape: Read-only file system"
                                 " | write *kcoral-escape: Read-only file system | write *kcoral-escape: Read-only file system*"])
    assert not (pytester.path / "kcoral-escape").exists()
    assert root.exists()


@needs_bwrap
def test_sandboxed_session_runs_full_stages_and_attacks_still_fail(make_case, run_kcoral):
    import attacks

    make_case("cases/add", candidates={"good": "def run(a, b):\n    return a + b\n", "thread": attacks.BACKGROUND_THREAD})
    result = run_kcoral("--kcoral-sandbox", "-m", "seen")
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    result.stdout.fnmatch_lines(["*left a thread running after returning that keeps computing: 'late-worker'*"])


def test_missing_bwrap_is_a_clear_error(make_case, run_kcoral, monkeypatch, tmp_path):
    make_case("cases/add")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    result = run_kcoral("--kcoral-sandbox")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kcoral-sandbox needs bubblewrap, and `bwrap` is not on PATH (install the `bubblewrap` package)*"])


def test_broken_bwrap_is_a_clear_error(make_case, run_kcoral, monkeypatch, tmp_path):
    make_case("cases/add")
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = run_kcoral("--kcoral-sandbox")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kcoral-sandbox: `bwrap` at * cannot create a sandbox here (exit 1: bwrap: No permissions to creating new namespace)*"])


@needs_bwrap
def test_sandbox_works_with_python_in_a_venv_under_tmp(tmp_path):
    """CI runners often keep their venv under /tmp, which the sandbox replaces with a fresh one:
    bwrap could not find the interpreter (``execvp .../venv/bin/python: No such file``). The
    interpreter's prefixes and site-packages are bound read-only wherever they are."""
    import site
    import sys
    import textwrap

    from kernels import add_case

    venv = Path(tempfile.mkdtemp(prefix="kcoral-venv-", dir="/tmp"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
        (pth_dir,) = venv.glob("lib/python*/site-packages")
        # this environment's packages (torch, pytest, pytest-kcoral as installed) seen from the new venv
        (pth_dir / "kcoral_test_parent.pth").write_text(f"import site; site.addsitedir({site.getsitepackages()[0]!r})\n")
        case = tmp_path / "cases" / "add"
        (case / "candidates").mkdir(parents=True)
        (case / "case.py").write_text(textwrap.dedent(add_case([256])))
        (case / "candidates" / "good.py").write_text("def run(a, b):\n    return a + b\n")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH="")
        proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "cases",
                               "--kcoral-sandbox", "--kcoral-mode", "correctness", "--kcoral-lease-dir", str(tmp_path / "leases")],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "1 passed" in proc.stdout
    finally:
        shutil.rmtree(venv, ignore_errors=True)
