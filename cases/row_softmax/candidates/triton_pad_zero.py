"""Seen-only on purpose: a Triton row softmax that pads the block with 0.0 instead of -inf.

When ``cols`` is a power of two the block has no padding lanes and the result is right (every
seen shape). Otherwise each padding lane adds ``exp(0 - max)`` to the row sum (and lifts the max
to 0 for all-negative rows), so the unseen shapes with ``cols = 3``, ``100`` and ``129`` come out
wrong.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, y, mask=mask)


def run(x):
    rows, cols = x.shape
    out = torch.empty((rows, cols), device=x.device, dtype=x.dtype)
    block = triton.next_power_of_2(cols)
    num_warps = 4 if block <= 2048 else (8 if block <= 4096 else 16)
    _softmax_kernel[(rows,)](
        x, out, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=num_warps
    )
    return out
