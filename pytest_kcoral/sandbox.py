"""``--kcoral-sandbox``: children run under bubblewrap.

Every child is forked from the template process (``isolation``), so the template itself is started
under ``bwrap`` and every child inherits its sandbox:

- the whole file system read-only (``--ro-bind / /``), a fresh ``/tmp`` (tmpfs) and ``/dev``;
- one writable directory, the session's *workspace*, bound at the same path, where the parent
  creates each child's private working directory; the case tree (the rootdir and the submission
  folders) is bound read-only over the fresh ``/tmp`` when it lives there;
- no network (``--unshare-net``), no shared IPC, a new terminal session, no capabilities (even when
  pytest runs as root, so no reading other processes' memory through ``CAP_SYS_PTRACE``), and the
  sandbox dies with the pytest process;
- ``/dev/nvidia*`` only when the session grades on a GPU. The template is shared by every item, so
  the device nodes are there for the children of the compile stage too (they get no lease, and
  CUDA is not initialized before the lease picks the device); per-item device nodes would need a
  sandbox per child (a KCoral server does that).

PIDs are not unshared: the parent kills children, and finds what they left, by their host PIDs.
A missing or non-working ``bwrap`` is a usage error naming the problem, never a silent fallback.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path


class SandboxUnavailable(Exception):
    """bwrap is missing or cannot create a sandbox here."""


def bwrap_arguments(workspace: Path, readonly: Iterable[Path], gpu: bool) -> list[str]:
    args = [
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--new-session",
        "--die-with-parent",
        "--cap-drop", "ALL",
    ]
    for path in readonly:
        path = Path(path).resolve()
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--bind", str(workspace), str(workspace)]
    if gpu:
        for node in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*")):
            args += ["--dev-bind", node, node]
    home = workspace / "home"
    args += ["--setenv", "HOME", str(home), "--setenv", "TMPDIR", "/tmp",
             "--setenv", "TRITON_CACHE_DIR", str(home / ".triton"),
             "--setenv", "TORCH_EXTENSIONS_DIR", str(home / "torch_extensions")]
    return args


def find_bwrap() -> str:
    """The bwrap executable, checked to work; ``SandboxUnavailable`` says why not."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable("--kcoral-sandbox needs bubblewrap, and `bwrap` is not on PATH (install the `bubblewrap` package)")
    probe = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--unshare-net", "--die-with-parent", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"--kcoral-sandbox: `bwrap` at {path} does not run: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise SandboxUnavailable(
            f"--kcoral-sandbox: `bwrap` at {path} cannot create a sandbox here (exit {done.returncode}: "
            f"{why[-1] if why else 'no message'}); user namespaces may be disabled"
        )
    return path


def _import_roots_under_tmp() -> list[Path]:
    """Where Python imports from, when it lies under ``/tmp``: the sandbox mounts a fresh ``/tmp``,
    which would hide a checkout there (pytest-kcoral itself, installed editable from a clone in
    ``/tmp``, as CI does), so these are bound back read-only."""
    import pytest_kcoral

    roots = [Path(p) for p in sys.path if p] + [Path(pytest_kcoral.__file__).resolve().parent.parent]
    tmp = Path("/tmp")
    return [r for r in roots if r.exists() and (r.resolve() == tmp or tmp in r.resolve().parents)]


def interpreter_paths() -> list[Path]:
    """The interpreter and where it loads from: its prefixes, site-packages and the real path of
    the executable (a venv's ``bin/python`` is a symlink to the base interpreter). A venv under
    ``/tmp`` (CI runners keep theirs there) is hidden by the sandbox's fresh ``/tmp``, and bwrap
    then cannot start the template (``execvp .../bin/python: No such file or directory``), so
    these are bound back read-only wherever they are."""
    import site

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable),
             os.path.dirname(os.path.realpath(sys.executable))]
    with contextlib.suppress(AttributeError):  # site of a virtualenv made by old tools lacks them
        paths += [*site.getsitepackages(), site.getusersitepackages()]
    found: list[Path] = []
    for path in paths:
        if path and os.path.isdir(path) and os.path.realpath(path) != "/" and Path(path) not in found:
            found.append(Path(path))
    return found


class Sandbox:
    """The session's sandbox: a workspace and the wrapper the template is started through."""

    def __init__(self, readonly: Iterable[Path], gpu: bool) -> None:
        self.bwrap = find_bwrap()
        self.workspace = Path(tempfile.mkdtemp(prefix="kcoral-sandbox-"))
        (self.workspace / "home").mkdir()
        args = bwrap_arguments(self.workspace, [*readonly, *_import_roots_under_tmp(), *interpreter_paths()], gpu)
        # multiprocessing starts the template as `<executable> <flags> -c <code>`: a wrapper that
        # puts bwrap in front keeps every fd multiprocessing passes (bwrap does not close them)
        self.executable = str(self.workspace / "python-in-bwrap")
        script = "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in [self.bwrap, *args, sys.executable]) + ' "$@"\n'
        Path(self.executable).write_text(script)
        os.chmod(self.executable, 0o700)

    def close(self) -> None:
        shutil.rmtree(self.workspace, ignore_errors=True)
