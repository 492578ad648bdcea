"""An item's processes share one GPU, and KernelBench problems at their own sizes ran an 80 GB GPU
out of memory (docs/performance.md, ninth session). So a child gives large cached device memory
back after its trials (``child_outputs.release_cached_memory``), and trials too large to keep are
made again as they are fed (``child_trusted.Trials``)."""

from __future__ import annotations

import pytest
from adversarial.attacks import COMPUTE_ONCE
from grading import grade_in_subprocess
from kernels import add_case

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from pytest_kcoral.child_outputs import RELEASE_CACHED_BYTES, release_cached_memory  # noqa: E402
from pytest_kcoral.child_trusted import KEPT_SHARE, keeps_on_device  # noqa: E402


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


def test_trials_too_large_to_keep_are_made_again_and_judged_alike(tmp_path):
    total = torch.cuda.get_device_properties(0).total_memory
    n = int(KEPT_SHARE * total / (3 * 12)) + (1 << 20)  # three trials of two fp32 inputs and an output: just over the share
    assert not keeps_on_device(12 * n, 3, "cuda:0")
    candidates = {"same": "def run(a, b):\n    return a + b\n", "wrong": "def run(a, b):\n    return a - b\n",
                  "first_answer": COMPUTE_ONCE}
    proc, doc = grade_in_subprocess(tmp_path, add_case([n]), candidates, "--kcoral-timing-budget", "0.3")
    items = {item["candidate"]: item for item in doc["items"]}
    assert items["same"]["outcome"] == "passed", proc.stdout[-3000:]
    assert 0.95 < items["same"]["speedup"] < 1.05
    assert items["wrong"]["outcome"] == "failed" and "trial 1 of 3" in items["wrong"]["message"], items["wrong"]["message"]
    assert items["first_answer"]["outcome"] == "failed" and "does not depend on the inputs" in items["first_answer"]["message"], items["first_answer"]["message"]
