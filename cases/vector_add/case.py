"""Elementwise vector add: ``out = a + b`` on two 1-D fp32 tensors of length ``n``.

The smallest possible kernel: memory bound, one load per input and one store per element. The seen
sizes are multiples of 1024 (a common block size); the unseen ones are not, so a kernel that drops
its bounds mask or its tail block shows up there.
"""

from __future__ import annotations

import torch

SEEN = [
    {"n": 1024},
    {"n": 4096},
    {"n": 1 << 24, "gpu_only": True},
]

UNSEEN = [
    {"n": 1},
    {"n": 1000},
    {"n": 4099},  # prime
    {"n": 1000003, "gpu_only": True},  # prime
]

TIER = 1


def make_inputs(shape, device):
    n = shape["n"]
    a = torch.randn(n, device=device, dtype=torch.float32)
    b = torch.randn(n, device=device, dtype=torch.float32)
    return a, b


def reference(a, b):
    return a + b


def cost(shape):
    n = shape["n"]
    return {"flops": n, "bytes": 3 * 4 * n}
