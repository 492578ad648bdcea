"""``--kcoral-sandbox``: children under bubblewrap; a missing or broken bwrap is a clear error."""

from __future__ import annotations

import os
import shutil
import subprocess

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
def test_a_virtual_environment_under_tmp_still_starts_the_sandbox(make_case, pytester, tmp_path):
    # the sandbox mounts a fresh /tmp: a venv there (CI makes its own there) is bound back, bin/python included
    import sys
    import sysconfig

    venv = tmp_path / "venv"
    assert str(venv).startswith("/tmp/")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_packages = next(venv.glob("lib/python*/site-packages"))
    # this run's packages (torch, pytest, pytest-kcoral) seen from the new venv
    (site_packages / "outer.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    make_case("cases/add")
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "cases",
                           "--kcoral-sandbox", "--kcoral-mode", "correctness", "-m", "seen"],
                          cwd=pytester.path, capture_output=True, text=True, timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
