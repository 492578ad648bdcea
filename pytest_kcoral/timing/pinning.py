"""One CPU core for the host side of GPU timing, shared by the baseline and the candidate.

A launch-bound call (several small kernels, or a Python-heavy ``nn.Module``) has the host's launch
speed inside its GPU span. On the H200 host, five fresh processes timing the same five-kernel
softmax read 38-61 us (1.62x apart); pinned to one core, 39-51 us (1.32x), and the host time of a
single launch tightened from 15-21 us to 16-18 us (``bench/process_noise.py``, docs/performance.md).
The baseline and the candidate run in different processes, so both are pinned to the same core
while they are timed; which core depends on the device, so workers on different GPUs do not share
one. Only the timing thread is pinned (``sched_setaffinity`` of the calling thread), and the old
affinity is restored afterwards.

On a CPU device nothing is pinned: there the timed work itself runs on the host, and concurrent
workers would all land on one core.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

TIMING_CPU_CHOICES = ("auto", "off")


def choose(device: str, setting: str = "auto") -> int | None:
    """The core the timing stage of an item on ``device`` runs on, or None for no pinning.

    ``setting``: "auto" (a core per GPU, counted from the last allowed core, since core 0 takes
    most of the system's interrupts), "off", or a core number.
    """
    if setting == "off" or not device.startswith("cuda"):
        return None
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if setting != "auto":
        core = int(setting)
        if core not in allowed:
            raise ValueError(f"--kcoral-timing-cpu {core}: not one of this process's cores {allowed}")
        return core
    index = int(device.partition(":")[2] or 0)
    return allowed[-1 - index % len(allowed)]


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
