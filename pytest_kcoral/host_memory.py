"""Whether the host has the memory to grade a shape, asked before it runs out.

Every trial's inputs and reference results cross the grading process as host copies, and stay there
for the item's candidates; the children hold copies of their own on the way. A shape too large for
that is refused with what it needs and how to grade it, instead of the kernel's out-of-memory
killer ending the whole session (and its JSON) at the first large item.
"""

from __future__ import annotations

from typing import Any

# Host bytes the grading processes hold at once per byte of the trials' inputs and results: the
# parent's copies (inputs and reference results, a candidate's results, the comparison's
# temporaries) and the children's on the way. On a CPU the timing children's input sets, outputs
# and kept copies are host memory too, whatever the trials. Both measured on a CPU
# (docs/performance.md, "a shape too large for the host").
HOST_COPIES = 4
CPU_TIMING_COPIES = 32


class HostMemoryShort(MemoryError):
    """The trials of a shape would need more host memory than the host has available."""


def tensor_bytes(values: Any) -> int:
    """Bytes of the tensors among ``values``."""
    import torch

    return sum(v.numel() * v.element_size() for v in values or () if isinstance(v, torch.Tensor))


def available_bytes() -> int | None:
    """The host's ``MemAvailable`` (free memory and what the kernel can reclaim), or None where
    ``/proc/meminfo`` does not say."""
    return _meminfo("MemAvailable")


def total_bytes() -> int | None:
    """The host's memory (``MemTotal``), or None where ``/proc/meminfo`` does not say."""
    return _meminfo("MemTotal")


def _meminfo(name: str) -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check(trial_bytes: int, trials: int, on_cpu: bool) -> None:
    """Raise ``HostMemoryShort`` when ``trials`` trials of ``trial_bytes`` of inputs and results
    each need more than the host's available memory, naming the trials that would fit."""
    available = available_bytes()
    fixed = CPU_TIMING_COPIES * trial_bytes if on_cpu else 0
    need = HOST_COPIES * trial_bytes * trials + fixed
    if available is None or need <= available:
        return
    fits = max(0, available - fixed) // (HOST_COPIES * trial_bytes) if trial_bytes else trials
    remedy = (f"grade it with --kcoral-trials {fits} or fewer, or on a host with more memory" if fits
              else "even one trial does not fit: grade it on a host with more memory, or at a smaller shape")
    raise HostMemoryShort(
        f"this shape needs about {need / 1e9:.1f} GB of host memory and the host has {available / 1e9:.1f} GB available:"
        f" {trials} trials of {trial_bytes / 1e9:.2f} GB of inputs and results each, held about {HOST_COPIES} times over by the"
        f" grading processes{', and the timing on the CPU about ' + str(CPU_TIMING_COPIES) + ' times one trial' if on_cpu else ''};"
        f" {remedy}")
