"""What a candidate leaves behind: threads, processes and sockets still alive after a call returns.

Work left in a background thread or a detached process after ``run`` returns is work the timer
never saw, so an item whose candidate leaves any fails. The child takes a ``Baseline`` after the
harness's own start-up and before the candidate loads; after every candidate command it asks
``find`` what is new. Processes are found through ``/proc`` (no psutil in a child): the child is a
*subreaper* (``PR_SET_CHILD_SUBREAPER``), so a grandchild that detaches itself (``setsid`` and a
double fork) is re-parented to the child instead of to init and stays among its descendants.

``kill_tree`` is what both sides use to end a process tree that may still be forking: it stops
every descendant with SIGSTOP until no new one appears, then kills them all, so a fork storm
cannot outrun it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from dataclasses import dataclass, field

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
# Set by ``isolation.ensure_template`` when the main thread starts the template: a parent's death
# signal fires when the thread that started the process ends, and the main thread ends only with
# the pytest process.
TEMPLATE_DIES_WITH_PARENT_ENV = "KCORAL_TEMPLATE_DIES_WITH_PARENT"

# How long a thread the candidate started may take to finish after its call returned.
THREAD_GRACE_S = 0.2


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (Linux); False elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> bool:
    """This process gets SIGKILL when the thread that started it ends (Linux); False elsewhere.

    A child holds the template's liveness pipe, so the template outlives the pytest process as
    long as any child does, and a child busy in candidate code never reads its parent's channel:
    without this, a pytest process killed outright (SIGKILL, a cancelled CI job) leaves the
    template and a sleeping candidate running for good."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields follow its last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def _state_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2 :].split()[0].decode()
    except (OSError, IndexError):
        return "?"


def is_alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (nor dead and not yet reaped)."""
    return _state_of(pid) not in ("?", "Z", "X")


def wait_stopped(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` is stopped by a signal (or gone); False if it is still running after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while _state_of(pid) not in ("T", "t", "?", "Z", "X"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def carrying(marker: bytes) -> list[int]:
    """Processes of this user whose environment holds ``marker`` (``NAME=value``): every process a
    child started inherits its environment, also one that left its process tree."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:  # gone, or another user's
            continue
    return found


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = ""
    return f"pid {pid} ({cmdline[:120] or '?'})"


def _children_files(pid: int) -> list[int] | None:
    """``pid``'s children from ``/proc/<pid>/task/*/children`` (fast), or None where the kernel lacks it."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
    return found


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (its children, their children, ...)."""
    found, todo = [], [root]
    while todo:
        kids = _children_files(todo.pop())
        if kids is None:
            return _descendants_by_scan(root)
        found += kids
        todo += kids
    return found


def _descendants_by_scan(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = parent_of(int(name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def kill_tree(root: int, include_root: bool = False, rounds: int = 50) -> list[int]:
    """Freeze every descendant of ``root`` until none is new, then kill them; returns their pids."""
    frozen: set[int] = set()
    for _ in range(rounds):
        new = [p for p in descendants(root) if p not in frozen]
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
            frozen.add(pid)
    targets = sorted(frozen) + ([root] if include_root else [])
    for pid in targets:
        _signal(pid, signal.SIGKILL)
    return sorted(frozen)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap() -> None:
    """Collect exited children (a subreaper inherits zombies that nobody else will wait for)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _socket_inodes() -> set[str]:
    inodes = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            inodes.add(target)
    return inodes


@dataclass
class Baseline:
    """What the harness itself has running before the candidate loads."""

    threads: set[int] = field(default_factory=set)
    sockets: set[str] = field(default_factory=set)

    @classmethod
    def take(cls) -> Baseline:
        return cls({t.ident for t in threading.enumerate() if t.ident is not None}, _socket_inodes())

    def find(self, grace_s: float = THREAD_GRACE_S) -> list[str]:
        """Sentences naming each thread, process and socket left behind since the baseline.

        Processes found are killed (they are the candidate's, and nothing should outlive a call).
        """
        problems = []
        deadline = time.monotonic() + grace_s
        threads = self._new_threads()
        while threads and time.monotonic() < deadline:
            threads[0].join(max(0.0, deadline - time.monotonic()))
            threads = self._new_threads()
        for t in threads:
            problems.append(f"left a thread running after returning: {t.name!r} (daemon={t.daemon})")
        reap()
        pids = [p for p in descendants(os.getpid()) if _state_of(p) != "Z"]
        if pids:
            names = [describe(p) for p in pids]
            kill_tree(os.getpid())
            reap()
            problems.append(f"left {len(pids)} process(es) running after returning: " + ", ".join(names[:5]) + (" ..." if len(names) > 5 else ""))
        sockets = _socket_inodes() - self.sockets
        if sockets:
            problems.append(f"left {len(sockets)} socket(s) open after returning")
        return problems

    def _new_threads(self) -> list[threading.Thread]:
        # a _DummyThread is a native thread (CUPTI's buffer callbacks, a driver's worker) that ran
        # Python code: not one the candidate started through threading
        return [t for t in threading.enumerate()
                if t.ident not in self.threads and t.is_alive() and not isinstance(t, threading._DummyThread)]
