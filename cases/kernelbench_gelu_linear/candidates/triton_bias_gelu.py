"""Linear + GELU: torch's matmul, then the bias add and GELU fused into one Triton kernel."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _bias_gelu_kernel(y_ptr, bias_ptr, out_ptr, numel, n_cols, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    b = tl.load(bias_ptr + offsets % n_cols, mask=mask, other=0.0)
    z = y + b
    # Exact GELU, as nn.GELU() with approximate="none": 0.5 * z * (1 + erf(z / sqrt(2))).
    out = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    tl.store(out_ptr + offsets, out, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = torch.matmul(x, self.linear.weight.t()).contiguous()
        out = torch.empty_like(y)
        numel = y.numel()
        _bias_gelu_kernel[(triton.cdiv(numel, BLOCK),)](
            y, self.linear.bias, out, numel, y.shape[-1], BLOCK=BLOCK
        )
        return out
