"""PyTorch LayerNorm written out: mean, biased variance, rsqrt, scale and shift."""

from __future__ import annotations

import torch

EPS = 1e-5


def run(x, weight, bias):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)
    return (x - mean) * torch.rsqrt(var + EPS) * weight + bias
