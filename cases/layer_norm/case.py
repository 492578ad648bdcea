"""LayerNorm over the last dimension of a 2-D fp32 tensor ``(rows, cols)``, with weight and bias.

``y = (x - mean) / sqrt(var + 1e-5) * weight + bias``, mean and biased variance per row, as
``torch.nn.functional.layer_norm``. The inputs have a non-zero mean on purpose: padding lanes
that leak into the variance then change the result visibly. The seen column counts are powers of
two, the unseen ones are not.
"""

from __future__ import annotations

import torch

EPS = 1e-5

SEEN = [
    {"rows": 16, "cols": 128},
    {"rows": 32, "cols": 256},
    {"rows": 4096, "cols": 8192, "gpu_only": True},
]

UNSEEN = [
    {"rows": 1, "cols": 3},
    {"rows": 5, "cols": 100},
    {"rows": 33, "cols": 257},  # prime width
    {"rows": 1021, "cols": 6007, "gpu_only": True},  # both prime
]

TIER = 2


def make_inputs(shape, device):
    rows, cols = shape["rows"], shape["cols"]
    x = 2.0 * torch.randn(rows, cols, device=device, dtype=torch.float32) + 0.5
    weight = 1.0 + 0.5 * torch.randn(cols, device=device, dtype=torch.float32)
    bias = 0.5 * torch.randn(cols, device=device, dtype=torch.float32)
    return x, weight, bias


def reference(x, weight, bias):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps=EPS)


def cost(shape):
    rows, cols = shape["rows"], shape["cols"]
    # mean, centre, square, sum, scale, weight, bias: about eight operations per element.
    return {"flops": 8 * rows * cols, "bytes": 4 * (2 * rows * cols + 2 * cols)}
