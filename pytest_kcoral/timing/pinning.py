"""One CPU core for the host side of GPU timing, shared by the baseline and the candidate.

A launch-bound call (several small kernels, or a Python-heavy ``nn.Module``) has the host's launch
speed inside its GPU span, and processes pinned to one core read it closer together
(``bench/process_noise.py``, docs/performance.md, "Process noise"). The baseline and the
candidate run in different processes, so both are pinned to the same core while they are timed;
which core depends on the GPU's host-wide number (``DeviceSpec.timing_slot``, not its index among
the visible devices), so workers and sessions timing different GPUs never share one. Only the
timing thread is pinned (``sched_setaffinity`` of the calling thread), and the old affinity is
restored afterwards.

Two more things keep the timing thread's core its own (``reserve``, called once per pytest process
before any child starts):

- each GPU gets a core on a physical core of its own: a core that is an SMT sibling (hyperthread)
  of an earlier GPU's core is skipped, so two workers never time on one physical core;
- the timing cores of every GPU on the host (also those this session does not use), and the
  siblings that share their physical cores, are taken out of the affinity of the pytest process and so of every process it starts afterwards (the template and
  every child forked from it, their CUDA and compiler threads). Only a timing thread pins itself
  there: another worker's compiles and comparisons on the timing core may slow a launch-bound
  call (docs/performance.md, "Scaling with THP off and on, same host").

On a CPU device nothing is pinned: there the timed work itself runs on the host, and concurrent
workers would all land on one core.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator

TIMING_CPU_CHOICES = ("auto", "off")
MIN_CORES_LEFT = 2  # fewer left for everything else than this: reserve nothing

# This process's cores before ``reserve`` took the timing cores out; None: nothing reserved.
_all_cores: frozenset[int] | None = None


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list ("0-3,8,10-11") as a set of core numbers."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


@functools.cache  # the topology holds for the session; ``choose`` runs per item
def siblings(core: int) -> frozenset[int]:
    """The hardware threads that share ``core``'s physical core, ``core`` included (sysfs; only
    ``core`` where the topology cannot be read)."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list") as f:
            return frozenset(parse_cpu_list(f.read()) | {core})
    except (OSError, ValueError):
        return frozenset({core})


def timing_cores(allowed: Iterable[int], siblings_of: Callable[[int], frozenset[int]] = siblings) -> list[int]:
    """The timing core of GPU 0, 1, ...: the allowed cores counted from the last (core 0 takes most
    of the system's interrupts), one per physical core."""
    picks: list[int] = []
    taken: set[int] = set()
    for core in sorted(allowed, reverse=True):
        if core not in taken:
            picks.append(core)
            taken |= siblings_of(core)
    return picks


def _universe() -> list[int]:
    """The cores timing may pin to: this process's, as they were before ``reserve``."""
    return sorted(_all_cores if _all_cores is not None else os.sched_getaffinity(0))


def choose(slot: int | None, setting: str = "auto") -> int | None:
    """The core the timing stage of an item on the GPU with timing slot ``slot`` runs on
    (``DeviceSpec.timing_slot``; None for the CPU), or None for no pinning.

    ``setting``: "auto" (slot ``i`` gets ``timing_cores(...)[i]``, wrapping around when there are
    more GPUs than physical cores), "off", or a core number.
    """
    if setting == "off" or slot is None:
        return None
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = _universe()
    if setting != "auto":
        core = int(setting)
        if core not in allowed:
            raise ValueError(f"--kcoral-timing-cpu {core}: not one of this process's cores {allowed}")
        return core
    picks = timing_cores(allowed)
    return picks[slot % len(picks)]


def reserve(slots: Iterable[int | None], setting: str = "auto", min_left: int = MIN_CORES_LEFT) -> frozenset[int]:
    """Take the timing cores of ``slots``, with their SMT siblings, out of the affinity of every
    thread of this process (and so of every process started from now on); ``choose`` still picks
    from the cores as they were. Returns the cores taken out: none when pinning is off, without
    GPUs, or when fewer than ``min_left`` cores would be left for everything else."""
    global _all_cores
    if not hasattr(os, "sched_setaffinity"):
        return frozenset()
    cores = {choose(slot, setting) for slot in slots} - {None}
    if not cores:
        return frozenset()
    allowed = set(_universe())
    reserved = set().union(*(siblings(core) for core in cores)) & allowed
    left = allowed - reserved
    if len(left) < min_left:
        return frozenset()
    _all_cores = frozenset(allowed)
    for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]:
        with contextlib.suppress(OSError):  # a thread that has just exited
            os.sched_setaffinity(int(task), left)
    return frozenset(reserved)


@contextlib.contextmanager
def pinned(core: int | None) -> Iterator[bool]:
    """Run the body on ``core``; yields whether the pin took effect."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        yield False
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {core})
    except OSError:  # the core is not ours (a cgroup changed, a sandbox): time unpinned
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)
