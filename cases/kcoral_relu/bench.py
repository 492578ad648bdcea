"""KCoral bench folder: ReLU on a 1-D fp32 tensor of length ``n``.

``make_inputs`` takes the bench case dict and creates tensors without a device: the harness makes
the item's device the default torch device before calling it. The candidates are the other
``.py`` files in this folder (``v0.py``, ``v1.py``).
"""

from __future__ import annotations

import torch


def make_inputs(case):
    return (torch.randn(case["n"], dtype=torch.float32),)


def reference(x):
    return torch.relu(x)
