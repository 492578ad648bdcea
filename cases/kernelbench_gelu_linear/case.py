"""KernelBench-format problem: a Linear layer followed by exact (erf) GELU.

``Model(in_features, out_features)`` maps ``x (batch_size, in_features)`` to
``gelu(x @ W.T + b)``. ``SEEN``/``UNSEEN`` entries are values for the module globals below, set
before ``get_inputs()`` and ``get_init_inputs()`` are called. Candidates define ``ModelNew`` with
the same constructor and parameter names, so both models built under one seed share weights.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.gelu = nn.GELU()

    def forward(self, x):
        return self.gelu(self.linear(x))


batch_size = 16
in_features = 64
out_features = 32

# Not a KernelBench name: pytest-kcoral reads it for the bench-lite weight. A matmul with a fused
# epilogue, as in KernelBench's level 2.
TIER = 2

SEEN = [
    {"batch_size": 16, "in_features": 64, "out_features": 32},
    {"batch_size": 64, "in_features": 128, "out_features": 256},
    {"batch_size": 4096, "in_features": 4096, "out_features": 4096, "gpu_only": True},
]

UNSEEN = [
    {"batch_size": 1, "in_features": 1, "out_features": 1},
    {"batch_size": 7, "in_features": 33, "out_features": 17},
    {"batch_size": 1021, "in_features": 4093, "out_features": 4099, "gpu_only": True},
]


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
