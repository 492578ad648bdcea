"""Triton row softmax: one program per row, the whole row in one block, padding lanes at -inf."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # -inf padding: exp(-inf) = 0, so padding lanes touch neither the max nor the sum.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, y, mask=mask)


def _num_warps(block):
    return 4 if block <= 2048 else (8 if block <= 4096 else 16)


def run(x):
    rows, cols = x.shape
    out = torch.empty((rows, cols), device=x.device, dtype=x.dtype)
    block = triton.next_power_of_2(cols)
    _softmax_kernel[(rows,)](
        x, out, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=_num_warps(block)
    )
    return out
