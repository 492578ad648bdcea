"""Row softmax: ``softmax(x, dim=-1)`` over the last dim of a 2-D fp32 tensor ``(rows, cols)``.

The seen column counts are powers of two, the unseen ones are not, so a kernel whose padding lanes
leak into the row max or the row sum fails there. The baseline is the textbook max/exp/sum formula
in plain PyTorch (five kernels and three temporaries), not ``torch.softmax`` itself, so speedups
are measured kernel against kernel.
"""

from __future__ import annotations

import torch

SEEN = [
    {"rows": 16, "cols": 128},
    {"rows": 32, "cols": 256},
    {"rows": 4096, "cols": 4096, "gpu_only": True},
]

UNSEEN = [
    {"rows": 3, "cols": 3},
    {"rows": 7, "cols": 100},
    {"rows": 37, "cols": 129},
    {"rows": 1021, "cols": 8191, "gpu_only": True},  # both prime
]

TIER = 2


def make_inputs(shape, device):
    # Scaled so that rows have a clear maximum and exp() spans several orders of magnitude.
    x = 3.0 * torch.randn(shape["rows"], shape["cols"], device=device, dtype=torch.float32)
    return (x,)


def reference(x):
    return torch.softmax(x, dim=-1)


def baseline(x):
    shifted = x - x.amax(dim=-1, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=-1, keepdim=True)


def cost(shape):
    elements = shape["rows"] * shape["cols"]
    # max, subtract, exp, sum, divide: about five operations per element; one read, one write.
    return {"flops": 5 * elements, "bytes": 2 * 4 * elements}
