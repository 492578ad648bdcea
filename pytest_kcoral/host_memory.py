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


HOST_MEMORY_SHORT = HostMemoryShort.__name__  # how its failure reads in the item's message


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


def check(trial_bytes: int, trials: int, timed_on_cpu: bool, held_bytes: int = 0) -> None:
    """Raise ``HostMemoryShort`` when ``trials`` trials of ``trial_bytes`` of inputs and results
    each (timed on a CPU: and their timing) need more than the host's available memory, saying
    what would fit. ``held_bytes``: what the caller holds already of the first trial, counted in
    the need and so added back to what is available."""
    free = available_bytes()
    if free is None:
        return
    available = free + held_bytes
    per_trial = HOST_COPIES * trial_bytes
    fixed = CPU_TIMING_COPIES * trial_bytes if timed_on_cpu else 0
    need = per_trial * trials + fixed
    if need <= available:
        return
    fits = max(0, available - fixed) // per_trial  # need > available >= 0, so per_trial > 0
    untimed_fits = available // per_trial
    remedies = []
    if fits:
        remedies.append(_trials(fits))
    if timed_on_cpu and untimed_fits > fits:
        remedies.append("--kcoral-mode correctness (no timing)" + ("" if untimed_fits >= trials else f" and {_trials(untimed_fits)}"))
    remedy = ("grade it with " + ", or ".join(remedies) + ", or on a host with more memory" if remedies else
              "even one trial does not fit: grade it on a host with more memory, or at a smaller shape"
              " (a KernelBench file: its size constants, or a SEEN list of smaller shapes)")
    timing = f", and the timing on the CPU about {CPU_TIMING_COPIES} times one trial" if timed_on_cpu else ""
    raise HostMemoryShort(
        f"this shape needs about {need / 1e9:.1f} GB of host memory and the host has {available / 1e9:.1f} GB available:"
        f" {trials} trials of {trial_bytes / 1e9:.2f} GB of inputs and results each, held about {HOST_COPIES} times over by the"
        f" grading processes{timing}; {remedy}")


def _trials(n: int) -> str:
    return "--kcoral-trials 1" if n == 1 else f"--kcoral-trials {n} (at most)"
