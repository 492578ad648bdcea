"""Seen-only on purpose: a Triton vector add that assumes ``n`` is a multiple of ``BLOCK``.

It launches ``n // BLOCK`` programs without a bounds mask, so the last ``n % BLOCK`` elements are
never computed. It passes every seen shape (all multiples of 1024) and fails the unseen ones
(``n = 1``, ``1000``, ``4099``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _add_kernel(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(a_ptr + offsets) + tl.load(b_ptr + offsets))


def run(a, b):
    n = a.numel()
    # zeros, not empty: the dropped tail must be a deterministic wrong answer. Uninitialized memory
    # can hold a stale a + b from an earlier call on the same inputs and pass by accident.
    out = torch.zeros(n, device=a.device, dtype=a.dtype)
    if n // BLOCK:
        _add_kernel[(n // BLOCK,)](a, b, out, BLOCK=BLOCK)
    return out
