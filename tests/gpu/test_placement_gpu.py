"""Small timing inputs are spread over placements on a GPU (``timing/placement.py``)."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from pytest_kcoral.timing import placement  # noqa: E402


def _make(n: int):
    return lambda seed: (torch.randn(n, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)),)


def test_small_sets_get_placements_of_their_own():
    seeds = [1, 2, 3]
    fresh = iter(range(100, 200))
    spread = placement.Placements("cuda", random.Random(0))
    sets = spread.make_sets(_make(4096), seeds, lambda: next(fresh))
    assert len(sets) == len(seeds) == placement.SMALL_SET_COUNT
    starts = [s[0].data_ptr() for s in sets]
    strides = {b - a for a, b in zip(starts, starts[1:])}
    # Back to back, every set would lie one 16 KiB stride after the last: one stride. Behind the
    # random pads they spread over several of the allocator's segments, though sets that find a
    # hole an earlier pad left fill it back to back (64 sets on an H200 showed 24 strides).
    assert len(strides) > len(sets) // 8, strides


def test_outputs_rotate_over_addresses():
    spread = placement.Placements("cuda", random.Random(0))
    sets = spread.make_sets(_make(4096), [1, 2, 3], iter(range(100, 200)).__next__)
    addresses = []
    for k in list(range(len(sets))) * 3:
        out = sets[k][0] + 1
        addresses.append(out.data_ptr())
        spread.keep_output(k, out)
        del out
    # without the ring, the caching allocator hands every call the block the last output freed
    assert len(set(addresses)) > len(sets), len(set(addresses))
    spread.release_outputs()


def test_large_sets_are_left_as_asked():
    seeds = [1, 2, 3]
    spread = placement.Placements("cuda", random.Random(0))
    sets = spread.make_sets(_make((placement.SMALL_SET_BYTES // 4) + 1), seeds, iter(range(100, 200)).__next__)
    assert len(sets) == 3
