"""A child gives large cached device memory back after its trials (``child_outputs.release_cached_memory``):
an item's processes share one GPU, and KernelBench problems at their own sizes ran an 80 GB GPU out
of memory with GBs cached but unused in one process (docs/performance.md, ninth session)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from pytest_kcoral.child_outputs import RELEASE_CACHED_BYTES, release_cached_memory  # noqa: E402


def test_large_cached_memory_goes_back_and_small_stays():
    torch.cuda.empty_cache()
    kept = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    small = torch.empty(RELEASE_CACHED_BYTES // 4, dtype=torch.uint8, device="cuda")
    del small
    cached_small = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    release_cached_memory("cuda:0")
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() == cached_small > 0  # a small cache stays

    large = torch.empty(2 * RELEASE_CACHED_BYTES, dtype=torch.uint8, device="cuda")
    del large
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() >= 2 * RELEASE_CACHED_BYTES
    release_cached_memory("cuda:0")
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < RELEASE_CACHED_BYTES
    assert kept.data_ptr() and torch.cuda.memory_allocated() >= kept.numel()  # what is in use stays
