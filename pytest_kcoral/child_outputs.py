"""What a child does with a callable's results, and with the memory around a call: never run in
the pytest process.

A result is flattened into values and a structure (``flatten_outputs``); the values must be plain
dense tensors on the device that alias no input (``inspect_outputs``), and they are copied to the
CPU to cross the wire. Before a checked call, the memory the outputs will reuse is poisoned with
NaN (``poison``), so elements a kernel never writes show.

torch is imported inside the functions: the pytest process imports ``child`` (a child's entry
point) without it.
"""

from __future__ import annotations

from typing import Any

MAX_STRUCTURE_DEPTH = 8  # deeper nesting is a leaf, which the output checks then refuse


def flatten_outputs(out: Any) -> tuple[tuple, Any]:
    """A callable's result as its leaves (tensors, numbers, None, anything else) and its
    structure: ``0`` for a leaf, a list for a tuple or list (interchangeable), a dict for a dict
    with str keys (keys sorted, so their order does not matter). ``(a, (b, c))`` gives
    ``(a, b, c)`` and ``[0, [0, 0]]``; a single tensor gives ``(t,)`` and ``0``."""
    leaves: list[Any] = []
    structure = _walk(out, 0, leaves)
    return tuple(leaves), structure


def _walk(value: Any, depth: int, leaves: list[Any]) -> Any:
    # not a closure: a nested function that calls itself is a reference cycle, which would keep
    # every output alive until the next collection (and the garbage collector is off while timing)
    if depth < MAX_STRUCTURE_DEPTH:
        if isinstance(value, (tuple, list)):
            return [_walk(v, depth + 1, leaves) for v in value]
        if isinstance(value, dict) and all(type(k) is str for k in value):
            return {k: _walk(value[k], depth + 1, leaves) for k in sorted(value)}
    leaves.append(value)
    return 0


def leaves(out: Any) -> tuple:
    return flatten_outputs(out)[0]


def clone_values(args: tuple) -> tuple:
    return tuple(a.clone() if hasattr(a, "clone") else a for a in args)


def clone_outputs(out: Any) -> Any:
    """A copy of a call's outputs, structure and all (subclasses keep their type, so the later
    checks still see it)."""
    if isinstance(out, (tuple, list)):
        return [clone_outputs(v) for v in out]
    if isinstance(out, dict):
        return {k: clone_outputs(v) for k, v in out.items()}
    return out.clone() if hasattr(out, "clone") else out


def to_cpu(values: tuple) -> tuple:
    import torch

    return tuple(v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for v in values)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


# Cached free device memory a child gives back after its trials: the processes of one item share the
# GPU, and a KernelBench problem's transients (GBs a trial) cached in one would run another out.
RELEASE_CACHED_BYTES = 256 << 20


def release_cached_memory(device: str) -> None:
    """Give the device memory this process's allocator keeps cached but unused back to the GPU,
    when it is large: small items keep their cache, and with it their timing sets' placements."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() >= RELEASE_CACHED_BYTES:
            torch.cuda.empty_cache()


_PLAIN_SCALARS = (int, float, bool, type(None))  # exact types: a subclass could compare equal to anything


def inspect_outputs(values: tuple, args: tuple, device: str, allowed_aliases: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset()) -> list[str]:
    """Checks of a result's values (``flatten_outputs``) that need the live objects: plain dense
    tensors, on the device, not aliasing inputs (output ``i`` may share memory with input ``j``
    where the reference's does: ``(i, j)`` in ``allowed_aliases``, from ``aliases``). Plain
    Python numbers and None pass through (a reference may return a count, a scalar or an empty
    slot); the pytest process compares them with the reference's."""
    import torch

    problems = []
    want = torch.device(device)
    for i, value in enumerate(values):
        if type(value) in _PLAIN_SCALARS:
            continue
        if type(value) is not torch.Tensor:
            kind = f"{type(value).__module__}.{type(value).__qualname__}"
            problems.append(f"output {i} is a {kind}, not a plain torch.Tensor (subclasses and lazy objects are refused)")
            continue
        if value.is_meta:
            problems.append(f"output {i} is a meta tensor: it has a shape but no data")
            continue
        if value.layout != torch.strided:
            problems.append(f"output {i} is not a dense tensor (layout {value.layout})")
            continue
        if value.device.type != want.type or (want.index is not None and value.device.index != want.index):
            problems.append(f"output {i} is on {value.device}, expected {want}")
            continue
        for j, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and (i, j) not in allowed_aliases and _overlaps(value, arg):
                problems.append(f"output {i} shares memory with input {j}")
    return problems


def aliases(values: tuple, args: tuple) -> set[tuple[int, int]]:
    """``(output, input)`` index pairs of outputs that share memory with an input."""
    import torch

    return {(i, j) for i, value in enumerate(values) if type(value) is torch.Tensor
            for j, arg in enumerate(args) if isinstance(arg, torch.Tensor) and _overlaps(value, arg)}


def check_inplace_indices(inplace: set[int], args: tuple) -> None:
    """``INPLACE`` names inputs by index: each must be one of the inputs ``make_inputs`` made."""
    beyond = sorted(j for j in inplace if not 0 <= j < len(args))
    if beyond:
        raise ValueError(f"INPLACE lists input{'s' if len(beyond) > 1 else ''} {', '.join(map(str, beyond))}, but make_inputs"
                         f" returned {len(args)} input{'s' if len(args) != 1 else ''} (indices 0 to {len(args) - 1})")


def require_plain_outputs(values: tuple, who: str) -> None:
    """The case's own results must be what a candidate may return, or nothing can match them."""
    import torch

    for i, value in enumerate(values):
        if type(value) not in _PLAIN_SCALARS and not isinstance(value, torch.Tensor):
            kind = f"{type(value).__module__}.{type(value).__qualname__}"
            raise TypeError(f"the {who} returned a {kind} as output {i}: return tensors, plain numbers or None, "
                            "alone or in tuples, lists or dicts with str keys")


def _overlaps(a: Any, b: Any) -> bool:
    """Whether two tensors' bytes overlap: their own spans, not their storages' (a fed child's
    inputs are views of one region, ``shared_memory``)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return bool(a0 < b0 + _span(b) and b0 < a0 + _span(a))


def _span(t: Any) -> int:
    """Bytes from a tensor's first element to just past its last (strides of any sign)."""
    reach = sum((d - 1) * abs(s) for d, s in zip(t.shape, t.stride()))
    return int((reach + 1) * t.element_size())


def poison(nbytes: list[int], device: str) -> None:
    """Fill memory the next allocations will reuse with NaN, so unwritten output elements show.

    The bytes are all ones: NaN in every floating format (fp64 to fp8 e4m3fn and e5m2), -1 or
    the maximum in integer ones. A float32 NaN's bytes would read as 0.0 in every other element
    of an fp16 or bf16 output, and a kernel that skips the elements where the reference is zero
    would pass.

    The CUDA caching allocator hands a freed block of the same size straight back; on the CPU,
    glibc reuses freed heap chunks once ``mallopt`` keeps large blocks off ``mmap`` (which would
    return fresh zeroed pages instead).
    """
    if not nbytes:
        return
    blocks = [poison_block(n, device) for n in nbytes]
    synchronize(device)
    del blocks


def poison_block(nbytes: int, device: str) -> Any:
    """``nbytes`` of all-ones bytes on ``device`` (see ``poison``)."""
    import torch

    return torch.full((max(nbytes, 1),), 0xFF, dtype=torch.uint8, device=device)


def keep_large_allocations_on_heap() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        m_mmap_threshold = -3
        libc.mallopt(m_mmap_threshold, 1 << 30)
    except Exception:  # not glibc: poisoning then covers small outputs only
        pass
