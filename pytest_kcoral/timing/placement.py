"""Where the timed calls' data lies: many placements on both sides, so no median rests on one.

After the L2 flush, a small kernel's time depends on where its inputs lie. On an H200 a
4096-element add read 1.15 to 1.31 us over six placements in one process; each placement read the
same in two sweeps and in a second process that placed its tensors the same way
(``bench/placement_noise.py``, docs/performance.md). The baseline's process and the candidate's
allocate differently, so each side's median came from placements of its own: a per-process offset
of a few CUPTI ticks, which no number of samples removes, and which made an add identical to its
baseline read 0.91x.

So for a device whose input sets are small, the timer gets more sets, each placed at a random
offset (a pad tensor of random size is allocated before it and kept alive with it), and every
timed call's output stays alive until its set is called again, so outputs rotate over as many
addresses. Both sides' medians are then medians over the same distribution of placements.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class RandomSource(Protocol):
    """What placement draws from: ``random.Random``, or the child's own ``Unpredictable``."""

    def randrange(self, start: int, stop: int | None = None) -> int: ...

SMALL_SET_BYTES = 4 << 20  # a set up to this size gets the placements below
# Input sets for a small set, each a placement of its own. A process's median is a median over the
# placements it drew, so the count sets how far two processes' medians lie apart: with 16, 24 of 30
# self-speedups of 1-10 us kernels came within 2%; with 64, 28 of 30 (H200, docs/performance.md).
SMALL_SET_COUNT = 64
_PAD_QUANTUM = 512  # the CUDA caching allocator's rounding
_MAX_PAD_QUANTA = 2048  # pads up to 1 MiB stay in the allocator's small pool, where small inputs go


def tensor_bytes(values: Any) -> int:
    """Bytes of the tensors in a set (other values count nothing)."""
    return sum(v.numel() * v.element_size() for v in values if hasattr(v, "element_size"))


class Placements:
    """Input sets at random offsets on a GPU, and the outputs of timed calls kept in rotation."""

    def __init__(self, device: str, rng: RandomSource) -> None:
        self.spread = str(device).startswith("cuda")  # a CPU has no such effect to average out
        self._device = device
        self._rng = rng
        self._small = False
        self._pads: list[Any] = []  # kept alive: a freed pad would let the next set fill its place
        self._outputs: dict[int, Any] = {}

    def make_sets(self, make: Callable[[int], tuple], seeds: list[int], new_seed: Callable[[], int]) -> list[tuple]:
        """``make(seed)`` for each seed, each behind a random pad; on a GPU, small sets are made
        until there are ``SMALL_SET_COUNT`` (``seeds`` grows with them)."""
        sets = [self._placed(make, seed) for seed in seeds]
        self._small = self.spread and bool(sets) and tensor_bytes(sets[0]) <= SMALL_SET_BYTES
        if self._small:
            while len(sets) < SMALL_SET_COUNT:
                seeds.append(new_seed())
                sets.append(self._placed(make, seeds[-1]))
        return sets

    def _placed(self, make: Callable[[int], tuple], seed: int) -> tuple:
        if self.spread:
            import torch

            quanta = self._rng.randrange(1, _MAX_PAD_QUANTA)
            self._pads.append(torch.empty(quanta * _PAD_QUANTUM, dtype=torch.uint8, device=self._device))
        return make(seed)

    def keep_output(self, k: int, out: Any) -> None:
        """Keep set ``k``'s output alive until set ``k`` is called again: the next call's output
        then goes elsewhere, so the outputs, too, rotate over addresses (small sets only: large
        outputs would cost memory, and large kernels do not feel their placement)."""
        if self._small:
            self._outputs[k] = out

    def release_outputs(self) -> None:
        self._outputs.clear()
