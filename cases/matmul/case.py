"""Matrix multiply: ``C = A @ B`` with fp32 ``A (m, k)`` and ``B (k, n)``, fp32 output.

``B`` is scaled by ``1 / sqrt(k)`` so that ``C`` has unit variance at every ``k``: one absolute
tolerance then means the same thing at ``k = 32`` and at ``k = 4096``. The seen sizes are
multiples of 32 (a common ``BLOCK_K``); the unseen ones are odd or prime in all three dimensions,
so a kernel that drops a K tail or an M/N edge tile shows up there.
"""

from __future__ import annotations

import math

import torch

SEEN = [
    {"m": 32, "n": 32, "k": 32},
    {"m": 64, "n": 64, "k": 64},
    {"m": 4096, "n": 4096, "k": 4096, "gpu_only": True},
]

UNSEEN = [
    {"m": 1, "n": 1, "k": 1},
    {"m": 33, "n": 17, "k": 45},
    {"m": 61, "n": 53, "k": 59},  # all prime
    {"m": 4093, "n": 4099, "k": 4091, "gpu_only": True},  # all prime
]

TIER = 3

# Tolerances for fp32 inputs multiplied on TF32 tensor cores, which is what Triton's tl.dot does
# with fp32 operands on Ampere and newer by default (and cuBLAS under
# torch.backends.cuda.matmul.allow_tf32). TF32 keeps 10 mantissa bits, so each product is off by
# about 2**-11 relative; over k terms of a unit-variance C that is a random walk of about 8e-4 rms
# at any k. Measured on an H200 (Triton 3.6, default tl.dot, 64x64x32 tiles) against torch's
# true-fp32 reference: max |diff| 3e-3 at 64^3 and 4.5e-3 at 4096^3, i.e. an honest kernel fails
# 1e-3 even at the smallest seen shape and uses at most 16% of 1e-2. 1e-2 is also KernelBench's
# fp32 tolerance; a dropped K tail or a wrong tile is off by O(1) and still fails by far. (The
# Triton interpreter computes tl.dot in true fp32, so on a CPU the differences are about 1e-6.)
ATOL = 1e-2
RTOL = 1e-2


def make_inputs(shape, device):
    m, n, k = shape["m"], shape["n"], shape["k"]
    a = torch.randn(m, k, device=device, dtype=torch.float32)
    b = torch.randn(k, n, device=device, dtype=torch.float32) / math.sqrt(k)
    return a, b


def reference(a, b):
    return torch.matmul(a, b)


def cost(shape):
    m, n, k = shape["m"], shape["n"], shape["k"]
    return {"flops": 2 * m * n * k, "bytes": 4 * (m * k + k * n + m * n)}
