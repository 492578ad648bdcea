"""Kernel sources the tests' cases and candidates share."""

from __future__ import annotations


def triton_add(block: int, name: str = "run") -> str:
    """A masked Triton add as a module's source, its entry point called ``name``."""
    return f"""
import torch
import triton
import triton.language as tl

@triton.jit
def _add(a, b, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, tl.load(a + i, mask=m) + tl.load(b + i, mask=m), mask=m)

def {name}(a, b):
    out = torch.empty_like(a)
    _add[(triton.cdiv(a.numel(), {block}),)](a, b, out, a.numel(), BLOCK={block})
    return out
"""


def add_case(seen: list[int], unseen: list[int] = ()) -> str:
    """A native case's source: ``a + b`` over fp32 vectors of the given lengths."""
    return f"""
import torch
SEEN = {[{"n": n} for n in seen]!r}
UNSEEN = {[{"n": n} for n in unseen]!r}

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b
"""
