"""Seen-only on purpose: a Triton LayerNorm whose variance counts the padding lanes.

Padding lanes load 0.0, which is harmless for the mean, but after centring each one contributes
``mean**2`` to the variance because the kernel does not re-mask. When ``cols`` is a power of two
there is no padding (every seen shape); the unseen ``cols = 3``, ``100`` and ``257`` come out
wrong.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

EPS = 1e-5


@triton.jit
def _layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, eps,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    centred = x - mean
    var = tl.sum(centred * centred, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    tl.store(out_ptr + row * out_row_stride + cols, centred * rstd * w + b, mask=mask)


def run(x, weight, bias):
    rows, cols = x.shape
    out = torch.empty((rows, cols), device=x.device, dtype=x.dtype)
    block = triton.next_power_of_2(cols)
    num_warps = 4 if block <= 2048 else (8 if block <= 4096 else 16)
    _layernorm_kernel[(rows,)](
        x, weight, bias, out, cols, x.stride(0), out.stride(0), EPS,
        BLOCK=block, num_warps=num_warps,
    )
    return out
