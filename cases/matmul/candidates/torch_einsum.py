"""PyTorch matmul spelled as ``einsum("mk,kn->mn")``."""

from __future__ import annotations

import torch


def run(a, b):
    return torch.einsum("mk,kn->mn", a, b)
