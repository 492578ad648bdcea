"""Confinement by default: children write only to their own directory and the session's caches.

Every child (candidate, baseline and trusted) applies a Landlock ruleset to itself right after it
enters its private working directory, before any case or candidate code runs. Landlock is a Linux
security module (5.13+) that any process can apply to itself, without root; the rules bind the
process and everything it starts, for good. Only ctypes is needed.

What a confined child may write:

- its private working directory (which also holds its temp files: ``TMPDIR``);
- a candidate child: the session's compile caches (Triton, Inductor, torch extensions, CUDA's
  JIT cache, ``HOME``), one directory per session, removed at its end;
- ``/dev/null``, ``/dev/zero``, ``/dev/full``, ``/dev/tty``, ``/dev/shm`` (multiprocessing's
  semaphores), and the GPU's device nodes;
- its own threads' files under ``/proc/<its pid>/task`` (CUDA names its threads through them).

Reading and executing stay allowed. Everything else is refused with ``PermissionError``: the lease
directory, the report paths, site-packages (a ``.pth`` file there would run in every later Python
process), the user's home and the case tree.

From Landlock ABI 6 (Linux 6.12) a child also cannot signal processes outside its own domain: the
pytest process, the template, the case's other children. The harness still signals every child.

The session's verdict (``session_status``) goes into the JSON's ``environment.confinement`` and,
when there is no confinement, into the terminal summary.
"""

from __future__ import annotations

import atexit
import ctypes
import glob
import os
import platform
import shutil
import sys
import tempfile
from typing import Any

CONFINE_ENV = "KCORAL_CONFINE"  # set in the children's environment when they must confine themselves
CACHES_ENV = "KCORAL_CONFINE_CACHES"  # the session's cache directory for candidate children
CONFINEMENT_CHOICES = ("auto", "landlock", "off")

# Linux's system call numbers for Landlock: the same on every architecture but alpha
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Landlock's file-system access rights (include/uapi/linux/landlock.h), by bit
_WRITE_FILE = 1 << 1
_REMOVE_DIR = 1 << 4
_REMOVE_FILE = 1 << 5
_MAKE_CHAR = 1 << 6
_MAKE_DIR = 1 << 7
_MAKE_REG = 1 << 8
_MAKE_SOCK = 1 << 9
_MAKE_FIFO = 1 << 10
_MAKE_BLOCK = 1 << 11
_MAKE_SYM = 1 << 12
_REFER = 1 << 13  # ABI 2: renames and links between directories
_TRUNCATE = 1 << 14  # ABI 3
_SCOPE_SIGNAL = 1 << 1  # ABI 6: no signals to processes outside the domain

_WRITE_RIGHTS_V1 = (_WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_CHAR | _MAKE_DIR | _MAKE_REG | _MAKE_SOCK | _MAKE_FIFO
                    | _MAKE_BLOCK | _MAKE_SYM)
# Landlock ABI 1 refuses every rename between directories, which Triton's cache does: too old
_MIN_ABI = 2

# Device files a program may open for writing (a shell's ``> /dev/null`` truncates it)
_WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom")
_WRITABLE_DEVICE_DIRS = ("/dev/shm",)
_GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*")


class ConfinementError(RuntimeError):
    """Landlock is there, and applying it failed."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> tuple[int, str]:
    """Landlock's ABI version on this kernel, or 0 and why there is none."""
    if not sys.platform.startswith("linux"):
        return 0, f"Landlock is a Linux feature, this is {sys.platform}"
    if platform.machine().startswith("alpha"):
        return 0, "Landlock's system calls have other numbers on alpha"
    try:
        libc = _libc()
    except OSError as exc:
        return 0, f"cannot load the C library ({exc})"
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if abi < 0:
        errno = ctypes.get_errno()
        why = {38: f"the kernel ({platform.release()}) has no Landlock (Linux 5.13+ needed)",
               95: "Landlock is built into the kernel but not enabled at boot (lsm=...landlock)",
               1: "a seccomp filter (a container's?) refuses Landlock's system calls"}.get(errno, os.strerror(errno))
        return 0, why
    if abi < _MIN_ABI:
        return 0, f"Landlock ABI {abi} (Linux 5.13-5.18) refuses renames between directories, which compile caches need"
    return abi, ""


_status: dict[str, str] = {}


def session_status(setting: str = "auto", remote: bool = False) -> str:
    """What confines this session's children, in words for the JSON and the summary:
    ``landlock ABI 7``, ``off (--kcoral-confinement off)``, or ``none: <why>``."""
    if remote:
        return "remote: the KCoral server's isolation"
    if setting == "off":
        return "off (--kcoral-confinement off)"
    if "abi" not in _status:
        abi, why = landlock_abi()
        _status["abi"] = f"landlock ABI {abi}" if abi else f"none: {why}"
    return _status["abi"]


def is_confined(status: str) -> bool:
    return status.startswith("landlock")


_caches: dict[str, str] = {}


def child_env(setting: str, sandbox: Any = None, remote: bool = False) -> dict[str, str]:
    """What the children's environment needs for ``confine_child``, said either way (the template
    a child is forked from may carry an earlier session's word). The session's cache directory is
    made on first use (in the sandbox's workspace under ``--kcoral-sandbox``) and removed when the
    process exits."""
    if not is_confined(session_status(setting, remote)):
        return {CONFINE_ENV: "off", CACHES_ENV: ""}
    if "dir" not in _caches:
        path = tempfile.mkdtemp(prefix="kcoral-caches-", dir=getattr(sandbox, "workspace", None))
        atexit.register(shutil.rmtree, path, True)
        _caches["dir"] = path
    return {CONFINE_ENV: "landlock", CACHES_ENV: _caches["dir"]}


def confine_child(role: str, workdir: str) -> str | None:
    """In a child, right after it entered ``workdir``: point temp files and compile caches at the
    directories it may write, then apply Landlock. Returns what confines it (None: the session
    does not confine its children); raises ``ConfinementError`` when applying it fails."""
    if os.environ.pop(CONFINE_ENV, None) != "landlock":
        return None
    tmp = os.path.join(workdir, "tmp")
    os.makedirs(tmp, exist_ok=True)
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None  # the template may have asked already: ask the environment again
    writable = [workdir]
    caches = os.environ.pop(CACHES_ENV, None)
    if role == "candidate" and caches:
        # one per session: a kernel compiles once per session, not once per child
        writable.append(caches)
        os.environ.update({
            "TRITON_CACHE_DIR": os.path.join(caches, "triton"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(caches, "inductor"),
            "TORCH_EXTENSIONS_DIR": os.path.join(caches, "torch-extensions"),
        })
    else:
        # the trusted and baseline children keep their compile caches in their own directory
        # (``child._compile_without_shared_caches``), and the rest here
        caches = os.path.join(workdir, "caches")
    home = os.path.join(caches, "home")
    os.makedirs(home, exist_ok=True)
    os.environ.update({
        "HOME": home,  # what programs write under ``~`` (CuPy's kernel cache, ~/.nv, ...)
        "XDG_CACHE_HOME": os.path.join(home, ".cache"),
        "CUDA_CACHE_PATH": os.path.join(caches, "cuda"),
    })
    return apply(writable)


def apply(writable: list[str]) -> str:
    """Confine this process for good: writes only beneath ``writable`` and to the devices above."""
    abi, why = landlock_abi()
    if not abi:
        raise ConfinementError(f"cannot confine this process: {why}")
    dir_rights = _WRITE_RIGHTS_V1 | _REFER | (_TRUNCATE if abi >= 3 else 0)
    file_rights = _WRITE_FILE | (_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(dir_rights, 0, _SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    libc = _libc()
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise ConfinementError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    try:
        for path in writable:
            _allow(libc, ruleset, path, dir_rights, required=True)
        for path in _WRITABLE_DEVICE_DIRS:
            _allow(libc, ruleset, path, dir_rights)
        for path in [*_WRITABLE_DEVICES, *(p for pattern in _GPU_DEVICES for p in sorted(glob.glob(pattern)))]:
            _allow(libc, ruleset, path, file_rights if not os.path.isdir(path) else dir_rights)
        # this process's own threads (``/proc/self`` resolves to its pid now): cuInit names the
        # threads it starts through ``task/<tid>/comm``, and fails with error 304 when refused
        _allow(libc, ruleset, "/proc/self/task", file_rights)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise ConfinementError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise ConfinementError(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return f"landlock ABI {abi}"


def _allow(libc: Any, ruleset: int, path: str, rights: int, required: bool = False) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        if required:
            raise ConfinementError(f"cannot open {path} to allow writes there: {exc.strerror}") from None
        return  # a device this host lacks
    try:
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise ConfinementError(f"landlock_add_rule for {path} failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
