"""What a candidate leaves behind: threads, processes and sockets still alive after a call returns.

Work left in a background thread or a detached process after ``run`` returns is work the timer
never saw, so an item whose candidate leaves one that *works* fails. Libraries leave idle ones
(tqdm's monitor, ``torch.compile``'s compile workers): those are told apart by the CPU time they
use (``/proc/<pid>/task/<tid>/schedstat``), and watched from one command to the next. The child
takes a ``Baseline`` after the harness's own start-up and before the candidate loads; after every
candidate command it asks ``find`` what is new and what the watched ones did. Processes are found through ``/proc`` (no psutil in a child): the child is a
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
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
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
        return bool(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0)
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


def is_stopped(pid: int) -> bool:
    """Whether a process is stopped (SIGSTOP, or traced)."""
    return _state_of(pid) in ("T", "t")


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


def stop_tree(root: int, rounds: int = 50) -> list[int]:
    """Freeze every descendant of ``root`` (SIGSTOP) until none is new; returns their pids."""
    frozen: set[int] = set()
    for _ in range(rounds):
        new = [p for p in descendants(root) if p not in frozen]
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
            frozen.add(pid)
    return sorted(frozen)


def kill_tree(root: int, include_root: bool = False, rounds: int = 50) -> list[int]:
    """Freeze every descendant of ``root`` until none is new, then kill them; returns their pids."""
    frozen = stop_tree(root, rounds)
    targets = frozen + ([root] if include_root else [])
    for pid in targets:
        _signal(pid, signal.SIGKILL)
    return frozen


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
    inodes: set[str] = set()
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


# What a thread or process left running may use of a CPU and still count as idle: a library's
# monitor that wakes now and then (tqdm's every 10 s) uses microseconds, a thread doing a kernel's
# work uses most of a core. The allowance: IDLE_CPU_S, plus IDLE_CPU_SHARE of the wall time watched.
IDLE_CPU_S = 0.005
IDLE_CPU_SHARE = 0.02


def idle_allowance_s(watched_s: float) -> float:
    """CPU seconds a leftover may use over ``watched_s`` of wall time and still be idle."""
    return IDLE_CPU_S + IDLE_CPU_SHARE * max(watched_s, 0.0)


def _task_cpu_s(task_dir: str) -> float | None:
    """CPU time of one thread (``/proc/<pid>/task/<tid>``): nanoseconds from ``schedstat``, else
    the clock ticks of ``stat``; None when it is gone."""
    try:
        with open(f"{task_dir}/schedstat", "rb") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"{task_dir}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rfind(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def thread_cpu_s(thread: threading.Thread) -> float | None:
    """CPU time a thread of this process has used; None when it is gone."""
    if thread.native_id is None:
        return None
    return _task_cpu_s(f"/proc/self/task/{thread.native_id}")


def process_cpu_s(pid: int) -> float | None:
    """CPU time a process has used, all its threads together; None when it is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    used = [_task_cpu_s(f"/proc/{pid}/task/{tid}") for tid in tasks]
    return sum(u for u in used if u is not None) if any(u is not None for u in used) else None


@dataclass
class Baseline:
    """What the harness itself has running before the candidate loads, and the idle leftovers
    accepted at the last audit (``find``), watched since with their CPU time then."""

    threads: set[int] = field(default_factory=set)
    sockets: set[str] = field(default_factory=set)
    watched_threads: dict[int, float] = field(default_factory=dict)  # thread ident -> CPU s at the last audit
    watched_processes: dict[int, float] = field(default_factory=dict)  # pid -> CPU s at the last audit
    last_audit: float = field(default_factory=time.monotonic)

    @classmethod
    def take(cls) -> Baseline:
        return cls({t.ident for t in threading.enumerate() if t.ident is not None}, _socket_inodes())

    def allow_socket(self, fd: int) -> None:
        """A socket the harness opened after the baseline was taken (the item's feed): not the candidate's."""
        try:
            self.sockets.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass

    def find(self, grace_s: float = THREAD_GRACE_S) -> list[str]:
        """Sentences naming each thread, process and socket left behind since the baseline that
        works: an idle one (a library's monitor, a pool of compile workers) is watched instead.

        A thread or process new since the last audit gets ``grace_s`` to end, and is judged by the
        CPU it uses meanwhile; one already watched, by the CPU it used since the last audit (the
        command just run: its calls, the checks between them and after them). Processes found
        working are killed with all others (they are the candidate's, and the item fails).
        """
        problems = []
        started = time.monotonic()
        since_last_s = started - self.last_audit
        threads = self._new_threads()
        fresh = [t for t in threads if t.ident not in self.watched_threads]
        fresh_cpu = {t.ident: thread_cpu_s(t) for t in fresh}
        reap()
        pids = self._live_descendants()
        fresh_pids = [p for p in pids if p not in self.watched_processes]
        fresh_pid_cpu = {p: process_cpu_s(p) for p in fresh_pids}
        deadline = started + grace_s
        waiting = [t for t in fresh if t.is_alive()]
        while waiting and time.monotonic() < deadline:
            waiting[0].join(max(0.0, deadline - time.monotonic()))
            waiting = [t for t in waiting if t.is_alive()]
        if fresh_pids:  # a process has the same grace, to be seen at rest or working
            time.sleep(max(0.0, deadline - time.monotonic()))
        watched_s = time.monotonic() - started
        kept_threads: dict[int, float] = {}
        for t in self._new_threads():
            now = thread_cpu_s(t)
            if now is None:
                continue  # ended meanwhile
            if t.ident in self.watched_threads:
                used, over = now - self.watched_threads[t.ident], since_last_s + watched_s
                when = "while the candidate was checked or timed (since the last check)"
            else:
                start = fresh_cpu.get(t.ident)  # None: started while watched, by another leftover
                used, over = now - (start if start is not None else 0.0), watched_s
                when = "after returning"
            if used > idle_allowance_s(over):
                problems.append(f"left a thread running after returning that keeps computing: {t.name!r} (daemon={t.daemon}; "
                                f"{used * 1e3:.0f} ms of CPU in {over * 1e3:.0f} ms {when}; an idle thread uses next to none)")
            elif t.ident is not None:  # a listed thread has started, so it has one
                kept_threads[t.ident] = now
        reap()
        working, kept_processes = [], {}
        now_pids = self._live_descendants()
        for pid in now_pids:
            now = process_cpu_s(pid)
            if now is None:
                continue
            if pid in self.watched_processes:
                used, over = now - self.watched_processes[pid], since_last_s + watched_s
            elif pid in fresh_pid_cpu:
                start = fresh_pid_cpu[pid]
                used, over = now - (start if start is not None else 0.0), watched_s
            else:  # started while watched: a process that keeps starting others
                used, over = float("inf"), watched_s
            if used > idle_allowance_s(over):
                working.append(pid)
            else:
                kept_processes[pid] = now
        if working:
            names = [describe(p) for p in working]
            kill_tree(os.getpid())
            reap()
            problems.append(f"left {len(now_pids)} process(es) running after returning, {len(working)} of them working (using CPU or"
                            " starting processes) while the candidate was checked or timed: "
                            + ", ".join(names[:5]) + (" ..." if len(names) > 5 else ""))
            kept_processes = {}
        sockets = _socket_inodes() - self.sockets
        if sockets:
            problems.append(f"left {len(sockets)} socket(s) open after returning")
        self.watched_threads, self.watched_processes = kept_threads, kept_processes
        self.last_audit = time.monotonic()
        return problems

    @staticmethod
    def _live_descendants() -> list[int]:
        return [p for p in descendants(os.getpid()) if _state_of(p) != "Z"]

    def _new_threads(self) -> list[threading.Thread]:
        # a _DummyThread is a native thread (CUPTI's buffer callbacks, a driver's worker) that ran
        # Python code: not one the candidate started through threading
        return [t for t in threading.enumerate()
                if t.ident not in self.threads and t.is_alive() and not isinstance(t, threading._DummyThread)]
