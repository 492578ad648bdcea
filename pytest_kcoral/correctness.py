"""Compare step: the correctness rules of spec section 3.

A candidate's outputs are compared in a process no candidate ever ran in: the case's trusted
child, on the device, where the candidate's child left them (``child_judges``), or the pytest
process, on CPU copies sent over the wire by a KCoral program. The trusted child applies the same
rules to the baseline against the reference and to the weak-reference test. Each check returns
plain sentences that name the output, the rule and the numbers, for the one-screen report.

Passing outputs take one ``torch.isclose`` pass in the output's own precision (float32 for the
half types); only a failure pays for the float64 diagnosis that finds the worst element.

Each function imports torch itself: the plugin imports this module at start-up, and torch takes
seconds to import.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_kcoral.child_outputs import clone_values

if TYPE_CHECKING:  # annotations only: the functions import torch when they run
    import torch

# Elements per slice where a comparison of large tensors goes slice by slice, so that its
# temporaries stay a slice's size (a KernelBench problem at its own size has 6 GB outputs)
CHUNK_ELEMENTS = 1 << 24

# (atol, rtol) by output dtype's name; a case's ATOL/RTOL override them (e.g. for TF32-like matmuls)
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
}
# fp8 outputs: one unit in the last place (rtol = the format's epsilon), and near zero one step of
# its smallest normal number: two correct kernels that round an fp32 value differently differ by one
FP8_DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


@functools.cache
def _default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    import torch  # here, not at the top: importing this module keeps torch out of pytest's start-up

    name = str(dtype).removeprefix("torch.")
    if name in FP8_DTYPES:
        return torch.finfo(dtype).smallest_normal, torch.finfo(dtype).eps
    return DEFAULT_TOLERANCES.get(name, (0.0, 0.0))  # integers and bools: exact


@dataclass(frozen=True)
class Tolerance:
    atol: float | None  # None: by dtype
    rtol: float | None
    strict: bool = False  # max-abs <= atol AND max-rel <= rtol, instead of elementwise

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        default = _default_tolerance(dtype)
        return (default[0] if self.atol is None else self.atol, default[1] if self.rtol is None else self.rtol)


def compare_structure(structure: Any, reference_structure: Any) -> list[str]:
    """The result's containers against the reference's (``child.flatten_outputs``: ``0`` a
    value, a list a tuple or list, either, a dict a dict). A drop-in replacement returns what the
    reference returns: ``[out]`` for ``out`` breaks its callers. None: not reported."""
    if structure is None or reference_structure is None or structure == reference_structure:
        return []
    if reference_structure == 0 and isinstance(structure, list):
        return [f"returned a tuple or list of {len(structure)}, the reference returns a single value"]
    if structure == 0 and isinstance(reference_structure, list):
        return [f"returned a single value, the reference returns a tuple or list of {len(reference_structure)}"]
    return [f"returned outputs shaped {describe_structure(structure)}, the reference's are shaped "
            f"{describe_structure(reference_structure)} (_: one value)"]


def describe_structure(structure: Any, limit: int = 200) -> str:
    """``[0, {"h": 0}]`` as ``(_, {h: _})``, cut at ``limit`` characters."""
    def render(node: Any) -> str:
        if isinstance(node, list):
            return "(" + ", ".join(render(n) for n in node) + ")"
        if isinstance(node, dict):
            return "{" + ", ".join(f"{k}: {render(v)}" for k, v in node.items()) + "}"
        return "_"
    text = render(structure)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def structure_leaves(structure: Any, budget: int = 100_000) -> int | None:
    """How many values a reported structure holds, or None when it is not one that
    ``child.flatten_outputs`` makes (a forged report): 0 for a value, lists, dicts with str keys."""
    count = 0
    stack = [(structure, 0)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0 or depth > 64:
            return None
        if isinstance(node, list):
            stack.extend((n, depth + 1) for n in node)
        elif isinstance(node, dict) and all(isinstance(k, str) for k in node):
            stack.extend((n, depth + 1) for n in node.values())
        elif node == 0 and type(node) is int:
            count += 1
        else:
            return None
    return count


def compare_outputs(outputs: Sequence[Any] | None, reference: Sequence[Any], tol: Tolerance,
                    names: Sequence[str] | None = None) -> list[str]:
    """Problems with ``outputs`` against ``reference`` (both tuples of CPU tensors); ``names``
    label the values in messages (default ``output 0``, ``output 1``, ...)."""
    import torch

    if outputs is None:
        return ["no outputs came back"]
    if len(outputs) != len(reference):
        return [f"returned {len(outputs)} output(s), the reference returns {len(reference)}"]
    problems: list[str] = []
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        name = names[i] if names is not None else f"output {i}"
        if not isinstance(ref, torch.Tensor):
            problems.extend(_compare_plain(name, out, ref, tol))
            continue
        if not isinstance(out, torch.Tensor):
            problems.append(f"{name} is {_a(type(out).__name__)}, expected a tensor")
            continue
        if out.dtype != ref.dtype:
            problems.append(f"{name} has dtype {out.dtype}, expected {ref.dtype}")
            continue
        if out.shape != ref.shape:
            problems.append(f"{name} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
            continue
        problems.extend(_compare_values(name, out, ref, tol))
    return problems


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _compare_plain(name: str, out: Any, ref: Any, tol: Tolerance) -> list[str]:
    """An output the reference returns as a plain Python value: the same type, equal, or for a
    float within the case's tolerance (fp32's by default: such a float usually comes from
    ``.item()`` on a float32 tensor)."""
    import torch

    if type(out) is not type(ref):
        return [f"{name} is {type(out).__name__} {out!r:.60}, expected {type(ref).__name__} {ref!r:.60}"]
    if isinstance(ref, float) and not (math.isnan(ref) and math.isnan(out)):
        atol, rtol = tol.for_dtype(torch.float32)
        if not abs(out - ref) <= atol + rtol * abs(ref):
            return [f"{name} is {out!r}, expected {ref!r} (atol {atol:g} + rtol {rtol:g} x |ref|)"]
        return []
    return [f"{name} is {out!r:.60}, expected {ref!r:.60}"] if out != ref else []


def _index(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return tuple(reversed(idx))


def _compare_values(name: str, out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> list[str]:
    import torch

    if out.numel() == 0:
        return []
    if ref.dtype == torch.bool or not (ref.is_floating_point() or ref.is_complex()):
        bad = out != ref
        if bad.any():
            first = int(bad.flatten().nonzero()[0])
            return [f"{name}: {int(bad.sum())} of {ref.numel()} elements differ (exact match required for {ref.dtype});"
                    f" first at index {_index(first, ref.shape)}"]
        return []
    if ref.is_complex():
        # compared as (real, imaginary) pairs, each within the tolerance of the parts' dtype: a
        # cast to a real dtype would drop the imaginary part. An index gains a last position,
        # 0 for the real part and 1 for the imaginary.
        out, ref = torch.view_as_real(out.detach().resolve_conj()), torch.view_as_real(ref.detach().resolve_conj())
    atol, rtol = tol.for_dtype(ref.dtype)
    if not tol.strict and _all_close(out, ref, atol, rtol):
        return []
    found = _Diagnosis()
    for k, (o, r) in enumerate(zip(_slices(out), _slices(ref))):
        found.add(k * CHUNK_ELEMENTS, o.to(torch.float64), r.to(torch.float64), atol, rtol, tol.strict)
    return found.problems(name, ref.numel(), ref.shape, atol, rtol, tol.strict)


class _Diagnosis:
    """A failing comparison's figures, gathered slice by slice in float64 (``CHUNK_ELEMENTS``): the
    whole tensors in float64 at once took several times a 6 GB output's size on the device."""

    def __init__(self) -> None:
        self.nonfinite = self.special = self.bad = 0
        self.nonfinite_first = self.special_first = -1
        self.special_values = (0.0, 0.0)
        self.max_abs = self.max_rel = -1.0
        self.worst, self.worst_values = -1, (0.0, 0.0)  # the largest error (strict), or the largest outside the tolerance
        self.worst_error = -1.0

    def add(self, at: int, o: Any, r: Any, atol: float, rtol: float, strict: bool) -> None:
        import torch

        ref_finite = torch.isfinite(r)
        nonfinite = ~torch.isfinite(o) & ref_finite
        n = int(nonfinite.sum())
        if n:
            self.nonfinite_first = self.nonfinite_first if self.nonfinite else at + int(nonfinite.nonzero()[0])
            self.nonfinite += n
        if self.nonfinite:
            return  # only the NaN/Inf are told then
        # where the reference itself is not finite, the candidate must match it exactly
        special = ~ref_finite & ~((o == r) | (torch.isnan(o) & torch.isnan(r)))
        n = int(special.sum())
        if n:
            if not self.special:
                first = int(special.nonzero()[0])
                self.special_first, self.special_values = at + first, (float(o[first]), float(r[first]))
            self.special += n
        diff = torch.where(ref_finite, (o - r).abs(), torch.zeros_like(r))
        self.max_abs = max(self.max_abs, float(diff.max()))
        if strict:
            scale = r.abs().where(ref_finite & (r != 0), torch.ones_like(r))
            self.max_rel = max(self.max_rel, float((diff / scale).max()))
            candidates = diff
        else:
            bad = (diff > atol + rtol * r.abs()) & ref_finite
            self.bad += int(bad.sum())
            candidates = torch.where(bad, diff, torch.full_like(diff, -1.0))
        i = int(candidates.argmax())
        if float(candidates[i]) > self.worst_error:
            self.worst_error, self.worst, self.worst_values = float(candidates[i]), at + i, (float(o[i]), float(r[i]))

    def problems(self, name: str, numel: int, shape: Any, atol: float, rtol: float, strict: bool) -> list[str]:
        if self.nonfinite:
            return [f"{name}: {self.nonfinite} of {numel} elements are NaN/Inf where the reference is finite, "
                    f"first at index {_index(self.nonfinite_first, shape)} (unwritten elements read back as NaN poison)"]
        problems = []
        if strict and (self.max_abs > atol or self.max_rel > rtol):
            problems.append(
                f"{name}: max abs error {self.max_abs:.3g} (atol {atol:g}), max rel error {self.max_rel:.3g} (rtol {rtol:g}) "
                f"under --kcoral-tolerance strict; worst at index {_index(self.worst, shape)}: {_got_expected(*self.worst_values)}")
        if not strict and self.bad:
            problems.append(
                f"{name}: {self.bad} of {numel} elements ({100.0 * self.bad / numel:.3g}%) outside atol {atol:g} + rtol {rtol:g} x |ref|; "
                f"max abs error {self.max_abs:.3g}; worst at index {_index(self.worst, shape)}: {_got_expected(*self.worst_values)}")
        if self.special:
            problems.append(f"{name}: {self.special} of {numel} elements differ where the reference is NaN/Inf; "
                            f"first at index {_index(self.special_first, shape)}: got {self.special_values[0]:.6g}, expected {self.special_values[1]:.6g}")
        return problems


def _got_expected(got: float, expected: float) -> str:
    """``got X, expected Y`` with the digits that tell the two apart (at six significant digits a
    miss just over a tight tolerance read 'got 10.7401, expected 10.7401')."""
    digits = 6
    while digits < 17 and f"{got:.{digits}g}" == f"{expected:.{digits}g}" and got != expected:
        digits += 1
    return f"got {got:.{digits}g}, expected {expected:.{digits}g}"


def _all_close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> bool:
    """Every element within atol + rtol x |ref| (NaN matching NaN, an infinity itself): the fast,
    allocation-light test that passing outputs stop at."""
    import torch

    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    return all(bool(torch.isclose(o.to(work), r.to(work), rtol=rtol, atol=atol, equal_nan=True).all())
               for o, r in zip(_slices(out), _slices(ref)))


def mismatch_tally(outputs: Sequence[Sequence[Any]], reference: Sequence[Sequence[Any]], tol: Tolerance,
                   names: Sequence[str] | None = None, inputs_before: Sequence[Sequence[Any]] = (),
                   inputs_after: Sequence[Sequence[Any]] = (), may_change: Sequence[int] = ()) -> tuple[list[str], Any] | None:
    """``compare_outputs`` and ``changed_inputs`` for many calls at once, without waiting for the
    device: ``outputs[c]`` against ``reference[c]`` and, per input outside ``may_change``,
    ``inputs_before[c]`` against ``inputs_after[c]`` (empty: no inputs judged). Each call's
    elements outside the tolerance, and its bytes changed, are counted where the tensors are, in
    one pass over all the calls stacked, and read later (the trusted child reads a round's at its end).

    Returns the messages, each with a ``{}`` for its count, and the counts (an int64 tensor on the
    device, a row per call, a column per message; None when there is nothing to count); a message
    stands where its count is not zero. None when the kinds differ (dtype, shape, a plain value,
    between the calls too), or the rules need more than one pass (the strict tolerance, a complex
    output): then ``compare_outputs`` decides each call at once."""
    import torch

    if tol.strict or not outputs or len(outputs) != len(reference) or len({len(o) for o in (*outputs, *reference)}) != 1:
        return None
    n_calls = len(outputs)
    labels: list[str] = []
    counts = []
    for i, ref in enumerate(reference[0]):
        name = names[i] if names is not None else f"output {i}"
        column = [(out[i], r[i]) for out, r in zip(outputs, reference)]
        if not isinstance(ref, torch.Tensor):
            if any(type(o) is not type(ref) or _compare_plain(name, o, r, tol) for o, r in column):
                return None
            continue
        if ref.is_complex() or any(not isinstance(t, torch.Tensor) or t.dtype != ref.dtype or t.shape != ref.shape
                                   for pair in column for t in pair):
            return None
        if ref.numel() == 0 or _equal_on_the_host(column):
            continue
        out_rows, ref_rows = _rows([o for o, _ in column]), _rows([r for _, r in column])
        if ref.dtype == torch.bool or not ref.is_floating_point():
            counts.append(_row_counts(lambda o, r: o != r, out_rows, ref_rows))
            labels.append(f"{name}: {{}} of {ref.numel()} elements differ (exact match required for {ref.dtype})")
        else:
            atol, rtol = tol.for_dtype(ref.dtype)
            work = torch.float64 if ref.dtype == torch.float64 else torch.float32
            counts.append(_row_counts(lambda o, r: ~torch.isclose(o.to(work), r.to(work), rtol=rtol, atol=atol, equal_nan=True),  # noqa: B023
                                      out_rows, ref_rows))
            labels.append(f"{name}: {{}} of {ref.numel()} elements outside atol {atol:g} + rtol {rtol:g} x |ref|")
    if inputs_before:
        if len(inputs_before) != n_calls or len(inputs_after) != n_calls:
            return None
        for j, before in enumerate(inputs_before[0]):
            if j in may_change or not isinstance(before, torch.Tensor):
                continue
            column = [(b[j], a[j]) for b, a in zip(inputs_before, inputs_after)]
            if any(not isinstance(t, torch.Tensor) or t.shape != before.shape or t.dtype != before.dtype for pair in column for t in pair):
                return None
            bits = [(_bits(b), _bits(a)) for b, a in column]
            if before.numel() and not _equal_on_the_host(bits):
                counts.append(_row_counts(lambda a, b: a != b, _rows([a for _, a in bits]), _rows([b for b, _ in bits])))
                labels.append(f"input {j} was modified ({{}} bytes changed); only inputs listed in INPLACE may be written")
    return labels, torch.stack([c.to(torch.int64) for c in counts], dim=1) if counts else None


def _equal_on_the_host(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Whether every pair of host tensors is equal element for element: the common case, at a
    fraction of a pass's cost. On a device it would wait for the device, so it is not tried there."""
    import torch

    return all(o.device.type == "cpu" and r.device.type == "cpu" and torch.equal(o, r) for o, r in pairs)


def _row_counts(flags: Callable[..., torch.Tensor], *rows: torch.Tensor) -> torch.Tensor:
    """Per row, the true elements of ``flags`` over the ``rows`` (a byte sum: a bool sum is several
    times slower on a CPU), a slice of columns at a time (``CHUNK_ELEMENTS``): a sum to int64 makes
    an int64 copy, 48 GB for a 6 GB input's bytes."""
    import torch

    total = None
    for at in range(0, rows[0].shape[1], CHUNK_ELEMENTS):
        part = flags(*(r[:, at:at + CHUNK_ELEMENTS] for r in rows)).view(torch.uint8).sum(dim=1, dtype=torch.int64)
        total = part if total is None else total + part
    assert total is not None  # every row has elements (empty tensors are not counted)
    return total


def _rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Tensors of one dtype and shape as the rows of one tensor (the one's own memory when there is one)."""
    import torch

    if len(tensors) == 1:
        return tensors[0].detach().reshape(1, -1)
    return torch.stack([t.detach().reshape(-1) for t in tensors])


def changed_inputs(before: Sequence[Any], after: Sequence[Any]) -> list[list[Any]]:
    """``[input index, bytes changed or None when replaced or reshaped]`` for each input a call
    changed; runs where the inputs are (the candidate's child, on the device), on its own copies."""
    import torch

    changes: list[list[Any]] = []
    for j, (b, a) in enumerate(zip(before, after)):
        if not isinstance(b, torch.Tensor):
            continue
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            changes.append([j, None])
        elif not torch.equal(_bits(a), _bits(b)):
            changes.append([j, int(_row_counts(lambda x, y: x != y, _bits(a).reshape(1, -1), _bits(b).reshape(1, -1))[0])])
    return changes


def written_input_names(indices: Sequence[int]) -> list[str]:
    """How messages name the INPLACE inputs a reference writes."""
    return [f"input {j} (written in place by the reference)" for j in indices]


def describe_changed_inputs(changes: Sequence[Sequence[Any]], inplace: Sequence[int]) -> list[str]:
    """Inputs must stay bit for bit unchanged unless the case lists them in INPLACE."""
    problems = []
    for j, n in changes:
        if j in inplace:
            continue
        if n is None:
            problems.append(f"input {j} was replaced or reshaped")
        else:
            problems.append(f"input {j} was modified ({n} bytes changed); only inputs listed in INPLACE may be written")
    return problems


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, so NaN inputs compare equal to themselves."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same_kinds(outputs_per_trial: Sequence[Sequence[Any] | None], reference_per_trial: Sequence[Sequence[Any]]) -> bool:
    """Whether every trial's outputs that came back are of the reference's kinds: as many, each
    a tensor of the same dtype and shape, or a plain value of the same type. Only then do the
    findings about values (ignoring the inputs, a constant) say more than the kind mismatch."""
    import torch

    for outs, refs in zip(outputs_per_trial, reference_per_trial):
        if outs is None:
            continue
        if len(outs) != len(refs):
            return False
        for out, ref in zip(outs, refs):
            if isinstance(ref, torch.Tensor):
                if not (isinstance(out, torch.Tensor) and out.dtype == ref.dtype and out.shape == ref.shape):
                    return False
            elif type(out) is not type(ref):
                return False
    return True


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    import torch

    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            # bit for bit (torch.equal is missing for fp8, and NaN would never equal itself)
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(_bits(x), _bits(y)):
                return False
        elif x != y:
            return False
    return True


def is_weak_reference(reference: Sequence[Any], tol: Tolerance) -> bool:
    """A reference that zeros or a constant would match within tolerance cannot tell kernels apart."""
    import torch

    tensors = [r for r in reference if isinstance(r, torch.Tensor) and r.is_floating_point() and r.numel() > 0]
    if not tensors:
        return False
    if all(_constant_matches(0.0, r, tol) for r in tensors):
        return True
    # any one-element output equals a constant: only outputs of several elements can say it is weak
    several = [r for r in tensors if r.numel() > 1]
    return bool(several) and all(_constant_matches(_finite_mean(r), r, tol) for r in several)


def _slices(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """``t``'s elements in order, ``CHUNK_ELEMENTS`` at a time."""
    flat = t.detach().reshape(-1)
    for at in range(0, flat.numel(), CHUNK_ELEMENTS):
        yield flat[at:at + CHUNK_ELEMENTS]


def _finite_mean(t: torch.Tensor) -> float:
    """The mean of a tensor's finite elements (0 when none is): the constant a kernel that skips
    the work would return. Summed in float64, which every floating dtype, fp8 included, converts
    to, a slice at a time."""
    import torch

    total, count = 0.0, 0
    for part in _slices(t):
        values = part.to(torch.float64)
        finite = torch.isfinite(values)
        total += float(torch.where(finite, values, 0.0).sum())
        count += int(finite.sum())
    return total / count if count else 0.0


def _constant_matches(value: float, ref: torch.Tensor, tol: Tolerance) -> bool:
    """Whether an output holding ``value`` (in ``ref``'s dtype) in every element passes against
    ``ref``, with no output of ``ref``'s size made where the fast test decides."""
    import torch

    if tol.strict or ref.is_complex():  # the rules of several passes: a whole output to compare
        return _matches(torch.full_like(ref, value), ref, tol)
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    constant = float(torch.full((), value, dtype=ref.dtype).to(work))  # rounded to the dtype, as a kernel's output would be
    atol, rtol = tol.for_dtype(ref.dtype)
    return all(bool(torch.isclose(torch.full_like(part, constant, dtype=work), part.to(work), rtol=rtol, atol=atol, equal_nan=True).all())
               for part in _slices(ref))


def _matches(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> bool:
    """Whether ``out`` passes against ``ref``, without the diagnosis a failure report needs."""
    if not tol.strict and not ref.is_complex():  # a complex output's parts are compared in _compare_values
        return _all_close(out, ref, *tol.for_dtype(ref.dtype))
    return not compare_outputs([out], [ref], tol)


def constant_output(t: int, outs: Sequence[Any], refs: Sequence[Any]) -> str | None:
    """A constant output (zeros, a mean, a random number) in trial ``t`` (counted from 0) where the
    reference's elements vary. On a weak case (one that zeros or a constant would match within
    tolerance) such an output passes the tolerance check; a kernel that computes something never
    returns the same value in every element when the reference holds several distinct ones."""
    import torch

    for i, (out, ref) in enumerate(zip(outs, refs)):
        if not (isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor)) or out.numel() < 2:
            continue
        if out.shape != ref.shape or not out.is_floating_point() or not ref.is_floating_point():
            continue
        first = out.detach().reshape(-1)[0]
        if not all(bool((part == first).all()) for part in _slices(out)):
            continue  # the usual case, decided before the reference is read
        spread = _finite_range(ref)
        if spread is None:
            continue
        distinct, complete = _distinct_values(ref)
        if distinct >= _DISTINCT_VALUES:
            counted = f"{distinct}" if complete else f"at least {distinct}"
            return (f"trial {t + 1}: output {i} is the constant {float(first):.6g} in every element while the reference's "
                    f"{counted} distinct values range over {spread:.3g} (near-zero or constant output)")
    return None


def _finite_range(t: torch.Tensor) -> float | None:
    """``t``'s max less its min, in one pass; None if any is NaN/Inf (float64: fp8 has no isfinite, min, max)."""
    import torch

    low, high = math.inf, -math.inf
    for part in _slices(t):
        values = part.to(torch.float64)
        if not bool(torch.isfinite(values).all()):
            return None
        low, high = min(low, float(values.min())), max(high, float(values.max()))
    return high - low


def _distinct_values(t: torch.Tensor) -> tuple[int, bool]:
    """How many distinct values ``t`` holds, and whether that is all of them: exact for a tensor
    of one slice (``CHUNK_ELEMENTS``); for a larger one, counted slice by slice only until
    ``_DISTINCT_VALUES`` are found, so the values seen stay few."""
    import torch

    seen = None
    for part in _slices(t):
        values = torch.unique(part.to(torch.float64))
        seen = values if seen is None else torch.unique(torch.cat([seen, values]))
        if seen.numel() >= _DISTINCT_VALUES and t.numel() > CHUNK_ELEMENTS:
            return int(seen.numel()), False
    return (int(seen.numel()) if seen is not None else 0), True


class TrialsTogether:
    """What the trials tell together, told one trial at a time and in trial order: whether every
    output is of the reference's kind (``same_kinds``), outputs that do not depend on the inputs
    while the reference's do (``ignores_inputs``), a constant output (``constant_output``). Only
    the first readable trial's outputs and reference are held: a feed of trials of many GB holds
    one trial beside them (``child_judges.TrialCalls``)."""

    @classmethod
    def of(cls, outputs_per_trial: Sequence[Sequence[Any] | None], reference_per_trial: Sequence[Sequence[Any]]) -> TrialsTogether:
        """Every trial's outputs that came back (None: a trial's that did not)."""
        together = cls()
        for t, (outs, refs) in enumerate(zip(outputs_per_trial, reference_per_trial)):
            if outs is not None:
                together.add(t, outs, refs)
        return together

    def __init__(self) -> None:
        self.same_kinds = True
        self.first: tuple[tuple, Sequence[Any]] | None = None  # a copy of the first readable outputs, and their reference
        self.later = 0  # readable trials after the first
        self.reference_varies = False
        self.outputs_vary = False
        self.constant: str | None = None

    def add(self, t: int, outs: Sequence[Any], refs: Sequence[Any]) -> None:
        """Trial ``t``'s outputs that came back. One too large to be read came as a ``meta``
        tensor: of its kind, not its values."""
        self.same_kinds = self.same_kinds and same_kinds([outs], [refs])
        if any(getattr(v, "is_meta", False) for v in outs):
            return
        if self.first is None:
            self.first = (clone_values(tuple(outs)), refs)
        else:
            self.later += 1
            self.reference_varies = self.reference_varies or not _same(self.first[1], refs)
            self.outputs_vary = self.outputs_vary or not _same(self.first[0], outs)
        self.constant = self.constant or constant_output(t, outs, refs)

    @property
    def ignores_inputs(self) -> bool:
        return self.later > 0 and self.reference_varies and not self.outputs_vary


# a reference with at least this many distinct values is not matched by an honest constant output
_DISTINCT_VALUES = 4
