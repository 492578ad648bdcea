"""Every correctness rule of spec section 3, each tripped by a real candidate in a real child."""

from __future__ import annotations

import pytest

CASE_WITH_INPLACE = """
import torch
SEEN = [{"n": 256}]
INPLACE = [0]

def make_inputs(shape, device):
    n = shape["n"]
    return torch.randn(n, device=device), torch.randn(n, device=device)

def reference(a, b):
    return a + b
"""

def _one_input_case(reference_body: str, n: int = 64, scale: str = "") -> str:
    """A case source with one random input of ``n`` elements (times ``scale``) and ``reference(x)``
    made of ``reference_body``: the shape the single-output rules below are tried on."""
    return (f'\nimport torch\nSEEN = [{{"n": {n}}}]\n\ndef make_inputs(shape, device):\n'
            f'    return (torch.randn(shape["n"], device=device){scale},)\n\ndef reference(x):\n{reference_body}')


RULES = {
    "structure": ("def run(a, b):\n    return a + b, a - b\n", "returned a tuple or list of 2, the reference returns a single value"),
    "wrapped": ("def run(a, b):\n    return [a + b]\n", "returned a tuple or list of 1, the reference returns a single value"),
    "dtype": ("def run(a, b):\n    return (a + b).double()\n", "output 0 has dtype torch.float64, expected torch.float32"),
    "shape": ("def run(a, b):\n    return (a + b)[:-1]\n", "output 0 has shape (255,), expected (256,)"),
    "not_a_tensor": ("def run(a, b):\n    return (a + b).cpu().numpy()\n", "output 0 is a numpy.ndarray, not a plain torch.Tensor*"),
    "number_for_a_tensor": ("def run(a, b):\n    return float((a + b).sum())\n", "output 0 is a float, expected a tensor"),
    "subclass": (
        "import torch\nclass Lazy(torch.Tensor):\n    pass\ndef run(a, b):\n    return (a + b).as_subclass(Lazy)\n",
        "output 0 is a kcoral_candidate.Lazy, not a plain torch.Tensor (subclasses and lazy objects are refused)",
    ),
    "sparse": ("def run(a, b):\n    return (a + b).to_sparse()\n", "output 0 is not a dense tensor (layout torch.sparse_coo)"),
    "finite": (
        "import torch\ndef run(a, b):\n    out = a + b\n    out[3] = float('inf')\n    return out\n",
        "output 0: 1 of 256 elements are NaN/Inf where the reference is finite, first at index (3,)*",
    ),
    "tolerance": ("def run(a, b):\n    return a + b + 1e-3\n", "output 0: 256 of 256 elements (100%) outside atol 0.0001 + rtol 0.0001 x |ref|*"),
    "aliasing": ("def run(a, b):\n    return a.add_(b)\n", "output 0 shares memory with input 0"),
    "inputs_changed": ("def run(a, b):\n    out = a + b\n    b.zero_()\n    return out\n", "input 1 was modified*only inputs listed in INPLACE may be written"),
    "unwritten": (
        "import torch\ndef run(a, b):\n    out = torch.empty_like(a)\n    out[:128] = (a + b)[:128]\n    return out\n",
        # NaN poison where the allocator reuses the poisoned block (always on CUDA), stale values otherwise
        "output 0: 128 of 256 elements*",
    ),
    "ignores_inputs": (
        "import torch\ndef run(a, b):\n    g = torch.Generator().manual_seed(0)\n    return torch.randn(a.shape, generator=g)\n",
        "*the output does not depend on the inputs*",
    ),
}


def _graded(make_case, run_kcoral, folder: str, case: str, candidates: dict[str, str], *, passed: int, failed: int):
    """``folder`` graded in correctness mode, verbosely, with the outcomes checked: the result."""
    make_case(folder, case, candidates)
    result = run_kcoral("--kcoral-mode", "correctness", "-v")
    result.assert_outcomes(passed=passed, failed=failed)
    return result


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_fails_the_item_with_its_message(make_case, run_kcoral, rule):
    source, message = RULES[rule]
    make_case("cases/add", CASE_WITH_INPLACE, {"bad": source, "good": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(passed=1, failed=1)
    assert "kcoral correctness failed" in result.stdout.str()
    result.stdout.fnmatch_lines([f"*{message}*"])


def test_inplace_inputs_may_be_written(make_case, run_kcoral):
    make_case("cases/add", CASE_WITH_INPLACE, {"inplace": "def run(a, b):\n    out = a + b\n    a.zero_()\n    return out\n"})
    run_kcoral("--kcoral-mode", "correctness").assert_outcomes(passed=1)


# the same case, but its reference's result is input 0, written in place; nothing is returned
IN_PLACE_REFERENCE = CASE_WITH_INPLACE.replace("    return a + b\n", "    a.add_(b)\n")
assert IN_PLACE_REFERENCE != CASE_WITH_INPLACE


def test_an_input_the_reference_writes_in_place_is_compared_as_its_result(make_case, run_kcoral):
    result = _graded(make_case, run_kcoral, "cases/iadd", IN_PLACE_REFERENCE, {
        "good": "def run(a, b):\n    a.add_(b)\n",
        "noop": "def run(a, b):\n    pass\n",
        "wrong": "def run(a, b):\n    a.sub_(b)\n",
    }, passed=1, failed=2)
    for name in ("noop", "wrong"):
        result.stdout.fnmatch_lines([f"*_ cases/iadd::{name}?seen-n=256? _*",
                                     "kcoral correctness failed: trial 1 of 3: input 0 (written in place by the reference):"
                                     " * of 256 elements (*%) outside atol*"])


@pytest.mark.parametrize(("baseline", "correct", "problem"), [
    ("a.add_(b)", True, None),
    ("pass", False, "input 0 (written in place by the reference): * of 256 elements * outside atol*"),
    ("a.sub_(b)", False, "input 0 (written in place by the reference): * of 256 elements * outside atol*"),
    ("a.add_(b)\n    b.zero_()", False, "input 1 was modified (* bytes changed); only inputs listed in INPLACE may be written"),
])
def test_an_in_place_baseline_is_held_to_what_the_reference_writes(make_case, run_kcoral, pytester, baseline, correct, problem):
    import fnmatch
    import json

    make_case("cases/iadd", IN_PLACE_REFERENCE + f"\ndef baseline(a, b):\n    {baseline}\n", {"good": "def run(a, b):\n    a.add_(b)\n"})
    run_kcoral("--kcoral-mode", "correctness", "--kcoral-json", "out.json").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["baseline_correct"] is correct
    if problem is not None:
        assert any(fnmatch.fnmatch(p, f"trial 1: {problem}") for p in item["extra"]["baseline_problems"]), item["extra"]


# the same, returning the input it wrote (``a.add_(b)`` returns ``a``), as docs/grading.md's
# in-place reference does
RETURNING_IN_PLACE_REFERENCE = CASE_WITH_INPLACE.replace("    return a + b\n", "    return a.add_(b)\n")
assert RETURNING_IN_PLACE_REFERENCE != CASE_WITH_INPLACE


def test_a_reference_that_returns_its_input_lets_candidates_do_the_same(make_case, run_kcoral):
    # a candidate identical to the reference read "output 0 shares memory with input 0", and one
    # returning a copy failed at timing as the case's fault, blamed on a baseline "keeping state"
    result = _graded(make_case, run_kcoral, "cases/iadd", RETURNING_IN_PLACE_REFERENCE, {
        "same": "def run(a, b):\n    return a.add_(b)\n",
        "copy": "def run(a, b):\n    a.add_(b)\n    return a.clone()\n",
        # sharing memory with the other input is still refused: the reference never does
        "other": "def run(a, b):\n    a.add_(b)\n    b.copy_(a)\n    return b\n",
    }, passed=2, failed=1)
    result.stdout.fnmatch_lines(["*output 0 shares memory with input 1*"])
    run_kcoral("-k", "same or copy").assert_outcomes(passed=2)  # timed too: the baseline is the reference


def test_an_inplace_index_beyond_the_inputs_names_inplace(make_case, run_kcoral):
    result = _graded(make_case, run_kcoral, "cases/add", CASE_WITH_INPLACE.replace("INPLACE = [0]", "INPLACE = [5]"),
                     {"good": "def run(a, b):\n    return a + b\n"}, passed=0, failed=1)
    result.stdout.fnmatch_lines(["*the case itself failed (not the candidate): ValueError: INPLACE lists input 5, but make_inputs"
                                 " returned 2 inputs (indices 0 to 1)*"])


def test_an_in_place_result_written_only_while_checked_fails_the_timed_check(make_case, run_kcoral):
    make_case("cases/iadd", IN_PLACE_REFERENCE, {
        "good": "def run(a, b):\n    a.add_(b)\n",
        # right for the three correctness trials, idle once timed
        "watched": "calls = 0\ndef run(a, b):\n    global calls\n    calls += 1\n    if calls <= 3:\n        a.add_(b)\n",
    })
    result = run_kcoral("-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*the outputs of timed calls are wrong (correct only while checked?)",
                                 "timed call 1: input 0 (written in place by the reference): *"])


def test_a_reference_that_returns_and_writes_nothing_fails_its_case(make_case, run_kcoral):
    # it writes input 0, but INPLACE does not list it: nothing a candidate does could be checked
    result = _graded(make_case, run_kcoral, "cases/iadd", IN_PLACE_REFERENCE.replace("INPLACE = [0]\n", ""),
                     {"noop": "def run(a, b):\n    pass\n"}, passed=0, failed=1)
    result.stdout.fnmatch_lines(["CASE FAILED cases/iadd on seen n=256, every candidate failing there: its reference returns"
                                 " nothing and writes none of its INPLACE inputs (none listed): nothing to compare a candidate against"])


def test_a_wrong_kind_of_output_is_said_before_what_its_values_suggest(make_case, run_kcoral):
    result = _graded(make_case, run_kcoral, "cases/add", CASE_WITH_INPLACE, {"count": "def run(a, b):\n    return 7\n"},
                     passed=0, failed=1)
    result.stdout.fnmatch_lines(["kcoral correctness failed: trial 1 of 3: output 0 is an int, expected a tensor",
                                 "trial 2 of 3: *", "trial 3 of 3: *",
                                 "the output does not depend on the inputs: *"])


def test_strict_tolerance_uses_max_abs_and_max_rel(make_case, run_kcoral):
    # a tiny absolute error on elements near zero: within atol + rtol*|ref| elementwise,
    # but its relative error is large, which strict mode refuses
    src = "import torch\ndef run(a, b):\n    out = a + b\n    out[0] = out[0] + 5e-5\n    return out\n"
    case = CASE_WITH_INPLACE.replace("return a + b", "out = a + b\n    out[0] = 1e-3\n    return out")
    cand = src.replace("out[0] = out[0] + 5e-5", "out[0] = 1e-3 + 5e-5")
    make_case("cases/add", case, {"near_zero": cand})
    run_kcoral("--kcoral-mode", "correctness").assert_outcomes(passed=1)
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-tolerance", "strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*max rel error 0.05 (rtol 0.0001) under --kcoral-tolerance strict*"])


def test_declared_tolerance_overrides_the_dtype_default(make_case, run_kcoral):
    case = CASE_WITH_INPLACE + "ATOL = 1e-2\nRTOL = 1e-2\n"
    make_case("cases/add", case, {"loose": "def run(a, b):\n    return a + b + 1e-3\n"})
    run_kcoral("--kcoral-mode", "correctness").assert_outcomes(passed=1)


def test_comparison_happens_outside_the_candidate_process(make_case, run_kcoral):
    # patching torch's comparison functions inside the candidate changes nothing (and is detected)
    src = (
        "import torch\n"
        "torch.allclose = lambda *a, **k: True\n"
        "torch.equal = lambda *a, **k: True\n"
        "torch.testing.assert_close = lambda *a, **k: None\n"
        "def run(a, b):\n    return a - b\n"
    )
    make_case("cases/add", CASE_WITH_INPLACE, {"patcher": src})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*replaced functions the harness relies on*torch.allclose*"])


CASE_RETURNING_A_PAIR = """
import torch
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b, a - b
"""


def test_a_tuple_and_a_list_are_the_same_structure_a_single_value_is_not(make_case, run_kcoral):
    result = _graded(make_case, run_kcoral, "cases/pair", CASE_RETURNING_A_PAIR, {
        "as_list": "def run(a, b):\n    return [a + b, a - b]\n",
        "single": "def run(a, b):\n    return a + b\n",
    }, passed=1, failed=1)
    result.stdout.fnmatch_lines(["*cases/pair::single?seen-n=64?*", "*returned a single value, the reference returns a tuple or list of 2"])


CASE_RETURNING_NUMBERS = _one_input_case('    return x * 2, x.numel(), float(x.double().sum()), None\n')


def test_plain_numbers_in_the_output_are_compared_by_type_and_value(make_case, run_kcoral):
    result = _graded(make_case, run_kcoral, "cases/numbers", CASE_RETURNING_NUMBERS, {
        "exact": "def run(x):\n    return x * 2, x.numel(), float(x.double().sum()), None\n",
        "float32_sum": "def run(x):\n    return x * 2, x.numel(), x.sum().item(), None\n",  # within fp32's tolerance
        "wrong_count": "def run(x):\n    return x * 2, x.numel() + 1, float(x.double().sum()), None\n",
        "count_as_float": "def run(x):\n    return x * 2, float(x.numel()), float(x.double().sum()), None\n",
        "sum_off": "def run(x):\n    return x * 2, x.numel(), float(x.double().sum()) + 1.0, None\n",
        "zero_for_none": "def run(x):\n    return x * 2, x.numel(), float(x.double().sum()), 0\n",
    }, passed=2, failed=4)
    result.stdout.fnmatch_lines(["*cases/numbers::exact?seen-n=64? PASSED*"], consecutive=False)
    out = result.stdout.str()
    assert "cases/numbers::float32_sum[seen-n=64] PASSED" in out
    assert "trial 1 of 3: output 1 is 65, expected 64" in out
    assert "trial 1 of 3: output 1 is float 64.0, expected int 64" in out
    assert "expected" in out and "(atol 0.0001 + rtol 0.0001 x |ref|)" in out
    assert "trial 1 of 3: output 3 is int 0, expected NoneType None" in out


CASE_RETURNING_A_SPECTRUM = _one_input_case('    return torch.fft.fft(x)\n')


def test_complex_outputs_are_compared_in_both_parts_within_the_parts_tolerance(make_case, run_kcoral):
    # a cast to a real dtype drops the imaginary part: the conjugate would pass, and complex64
    # (no default tolerance of its own) would need bit-exact real parts
    result = _graded(make_case, run_kcoral, "cases/fft", CASE_RETURNING_A_SPECTRUM, {
        "in_double": "import torch\ndef run(x):\n    return torch.fft.fft(x.double()).to(torch.complex64)\n",
        "conjugate": "import torch\ndef run(x):\n    return torch.fft.fft(x).conj().resolve_conj()\n",
    }, passed=1, failed=1)
    out = result.stdout.str()
    assert "cases/fft::in_double[seen-n=64] PASSED" in out
    # the index's last position is the part: 1, imaginary
    result.stdout.fnmatch_lines(["*trial 1 of 3: output 0: * of 128 elements * outside atol 0.0001 + rtol 0.0001 x |ref|*worst at index (*, 1)*"])


CASE_RETURNING_FP8 = _one_input_case('    return (x * 1.5).to(torch.float8_e4m3fn)\n', scale=" * 4")


def test_fp8_outputs_are_graded_within_one_unit_in_the_last_place(make_case, run_kcoral):
    # the weak-reference check once called ops fp8 lacks, and every fp8 case failed as a case
    result = _graded(make_case, run_kcoral, "cases/quantize", CASE_RETURNING_FP8, {
        "same": "import torch\ndef run(x):\n    return (x * 1.5).to(torch.float8_e4m3fn)\n",
        "off_by_two_steps": "import torch\ndef run(x):\n    return (x * 1.5 * 1.25).to(torch.float8_e4m3fn)\n",
    }, passed=1, failed=1)
    out = result.stdout.str()
    assert "CASE FAILED" not in out
    assert "cases/quantize::same[seen-n=64] PASSED" in out
    assert "outside atol 0.015625 + rtol 0.125 x |ref|" in out


def test_one_fp8_step_is_within_the_default_tolerance_two_are_not():
    import torch

    from pytest_kcoral.correctness import Tolerance, compare_outputs

    ref = torch.tensor([1.0, 2.0, -3.0]).to(torch.float8_e4m3fn)
    one_step = torch.tensor([1.125, 2.0, -3.0]).to(torch.float8_e4m3fn)  # e4m3 steps by 1/8 in [1, 2)
    two_steps = torch.tensor([1.25, 2.0, -3.0]).to(torch.float8_e4m3fn)
    assert compare_outputs([one_step], [ref], Tolerance(None, None)) == []
    assert compare_outputs([two_steps], [ref], Tolerance(None, None))


def test_a_near_miss_prints_the_digits_that_tell_got_from_expected():
    import torch

    from pytest_kcoral.correctness import Tolerance, compare_outputs

    ref = torch.tensor([10.740100, 1.0], dtype=torch.float64)
    out = torch.tensor([10.740105, 1.0], dtype=torch.float64)
    (problem,) = compare_outputs([out], [ref], Tolerance(1e-7, 1e-7))
    assert "got 10.740105, expected 10.7401" in problem, problem  # read 'got 10.7401, expected 10.7401'


CASE_WITH_INFINITIES = _one_input_case('    y = x.clone()\n    y[0] = float("inf")\n    y[1] = float("nan")\n    return y\n', n=8)


def test_a_wrong_infinity_is_named_not_measured(make_case, run_kcoral):
    # an error at an infinity has no size: it once read "max abs error 0"
    result = _graded(make_case, run_kcoral, "cases/inf", CASE_WITH_INFINITIES, {
        "same": "def run(x):\n    y = x.clone()\n    y[0] = float('inf')\n    y[1] = float('nan')\n    return y\n",
        "flipped": "def run(x):\n    y = x.clone()\n    y[0] = -float('inf')\n    y[1] = float('nan')\n    return y\n",
    }, passed=1, failed=1)
    out = result.stdout.str()
    assert "trial 1 of 3: output 0: 1 of 8 elements differ where the reference is NaN/Inf; first at index (0,): got -inf, expected inf" in out
    assert "max abs error" not in out



@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_the_poison_reads_as_nan_in_every_floating_format(dtype):
    # a float32 NaN's bytes read as 0.0 in every other fp16 or bf16 element (and in two of four
    # fp8 ones): a kernel that never wrote the elements where the reference is zero passed there.
    # The end-to-end check needs CUDA's allocator: tests/gpu/test_pipeline_gpu.py
    import torch

    from pytest_kcoral.child_outputs import poison_block

    values = poison_block(64, "cpu").view(getattr(torch, dtype))
    assert bool(values.to(torch.float32).isnan().all()), values


CASE_RETURNING_NESTED = _one_input_case('    return x * 2, (x + 1, x - 1), {"total": x.sum(), "count": x.numel()}\n', n=16)


def test_nested_and_dict_outputs_are_compared_leaf_by_leaf_and_by_shape(make_case, run_kcoral):
    # an nn.LSTM returns (out, (h, c)): a reference may nest its results, or name them in a dict
    result = _graded(make_case, run_kcoral, "cases/nested", CASE_RETURNING_NESTED, {
        "same": "def run(x):\n    return [x * 2, [x + 1, x - 1], {'count': x.numel(), 'total': x.sum()}]\n",
        "flat": "def run(x):\n    return x * 2, x + 1, x - 1, x.sum(), x.numel()\n",
        "wrong_leaf": "def run(x):\n    return x * 2, (x + 1, x + 1), {'total': x.sum(), 'count': x.numel()}\n",
        "other_key": "def run(x):\n    return x * 2, (x + 1, x - 1), {'sum': x.sum(), 'count': x.numel()}\n",
    }, passed=1, failed=3)
    out = result.stdout.str()
    assert "cases/nested::same[seen-n=16] PASSED" in out  # lists for tuples, keys in any order
    assert ("trial 1 of 3: returned outputs shaped (_, _, _, _, _), the reference's are shaped "
            "(_, (_, _), {count: _, total: _}) (_: one value)") in out
    assert "trial 1 of 3: output 2: 16 of 16 elements (100%) outside atol" in out  # leaves count in order
    assert "returned outputs shaped (_, (_, _), {count: _, sum: _})" in out


def test_a_reference_returning_what_no_candidate_may_is_the_cases_failure(make_case, run_kcoral):
    case = CASE_RETURNING_NESTED.replace('return x * 2, (x + 1, x - 1), {"total": x.sum(), "count": x.numel()}',
                                         "return x * 2, {1, 2}")
    make_case("cases/odd_output", case, {"any": "def run(x):\n    return x * 2, {1, 2}\n"})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CASE FAILED cases/odd_output on seen n=16*TypeError: the reference returned a builtins.set as output 1: "
                                 "return tensors, plain numbers or None, alone or in tuples, lists or dicts with str keys*"])


def test_inputs_made_as_a_dict_are_refused_with_what_to_return(make_case, run_kcoral):
    case = CASE_WITH_INPLACE.replace("return torch.randn(n, device=device), torch.randn(n, device=device)",
                                     "return {'a': torch.randn(n, device=device), 'b': torch.randn(n, device=device)}")
    make_case("cases/kwargs", case, {"add": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CASE FAILED cases/kwargs on seen n=256*TypeError: make_inputs returned a dict (keys a, b): "
                                 "return the inputs as a tuple or list, in the order the reference takes them*"])


# -- the timed calls' one-pass count (``correctness.mismatch_tally``), many calls at once ------------

def _tally(outputs, reference, before=(), after=(), may_change=()):
    from pytest_kcoral import correctness

    tally = correctness.mismatch_tally(outputs, reference, correctness.Tolerance(None, None), None, before, after, may_change)
    if tally is None:
        return None
    if tally[1] is None:  # nothing left to count (host tensors found equal at once)
        return [[] for _ in outputs]
    labels, counts = tally
    return [[label.format(n) for label, n in zip(labels, row) if n] for row in counts.tolist()]


def test_a_stacked_count_names_each_call_by_its_own_row():
    import torch

    refs = [(torch.randn(64), torch.arange(8)) for _ in range(5)]
    outs = [(r[0].clone(), r[1].clone()) for r in refs]
    outs[1][0][:3] += 1.0  # three elements of call 1's float output out of tolerance
    outs[3][1][0] = -1  # one element of call 3's integer output
    outs[4][0][7] = float("nan")  # a NaN where the reference is finite
    found = _tally(outs, refs)
    assert found[0] == found[2] == []
    assert found[1] == ["output 0: 3 of 64 elements outside atol 0.0001 + rtol 0.0001 x |ref|"]
    assert found[3] == ["output 1: 1 of 8 elements differ (exact match required for torch.int64)"]
    assert found[4] == ["output 0: 1 of 64 elements outside atol 0.0001 + rtol 0.0001 x |ref|"]


def test_a_stacked_count_matches_nan_to_nan_and_names_a_changed_input():
    import torch

    refs = [(torch.tensor([1.0, float("nan"), float("inf")]),) for _ in range(3)]
    outs = [(r[0].clone(),) for r in refs]
    before = [(torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.1, 0.2, 0.3, 0.4])) for _ in range(3)]
    after = [(b[0].clone(), b[1].clone()) for b in before]
    after[2][1][0] = -7.25  # call 2 wrote its second input, which must stay unchanged: all 4 bytes of 0.1 differ
    after[1][0][0] += 1.0  # call 1 wrote its first, which it may
    found = _tally(outs, refs, before, after, may_change=[0])
    assert found == [[], [], ["input 1 was modified (4 bytes changed); only inputs listed in INPLACE may be written"]]


def test_a_stacked_count_gives_calls_of_other_kinds_back_to_the_full_comparison():
    import torch

    refs = [(torch.randn(8),), (torch.randn(8),)]
    assert _tally([(refs[0][0].clone(),), (refs[1][0][:4].clone(),)], refs) is None  # another shape in one call
    assert _tally([(refs[0][0].double(),), (refs[1][0].clone(),)], refs) is None  # another dtype
    assert _tally([(r[0].clone(),) for r in refs], refs) == [[], []]


def test_large_tensors_are_compared_slice_by_slice_alike(monkeypatch):
    """Outputs of several GB are compared a slice at a time (``CHUNK_ELEMENTS``); the verdicts and
    their figures do not depend on where the slices fall."""
    import torch

    from pytest_kcoral import correctness

    torch.manual_seed(0)
    ref = torch.randn(1000)
    ref[[10, 500]] = float("inf")
    off = ref.clone()
    off[[3, 400, 401, 999]] += torch.tensor([0.5, 2.0, -3.0, 1.0])  # the worst, 401, in a later slice
    off[500] = 1.0  # where the reference is Inf
    poisoned = off.clone()
    poisoned[[700, 20]] = float("nan")
    cases = [(off, correctness.Tolerance(None, None, False)), (off, correctness.Tolerance(None, None, True)),
             (poisoned, correctness.Tolerance(None, None, False)), (ref.clone(), correctness.Tolerance(None, None, False))]
    whole = [correctness.compare_outputs([out], [ref], tol) for out, tol in cases]
    ints = correctness.mismatch_tally([(off,), (ref,)], [(ref,), (ref,)], correctness.Tolerance(None, None, False))
    changed = correctness.changed_inputs([ref], [off])
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", 7)
    assert [correctness.compare_outputs([out], [ref], tol) for out, tol in cases] == whole
    assert "4 of 1000 elements" in whole[0][0] and "index (401,)" in whole[0][0] and "where the reference is NaN/Inf" in whole[0][1]
    assert "first at index (20,)" in whole[2][0] and len(whole[2]) == 1 and whole[3] == []
    sliced = correctness.mismatch_tally([(off,), (ref,)], [(ref,), (ref,)], correctness.Tolerance(None, None, False))
    assert ints is not None and sliced is not None and ints[0] == sliced[0] and torch.equal(ints[1], sliced[1])
    assert ints[1][:, 0].tolist() == [5, 0]  # the four off, and the one where the reference is Inf
    assert correctness.changed_inputs([ref], [off]) == changed == [[0, changed[0][1]]] and changed[0][1] > 0


def test_weak_and_constant_checks_read_large_references_slice_by_slice_alike(monkeypatch):
    """Whether a case is weak, and whether an output is a constant where the reference varies, are
    decided a slice at a time: no tensor of the reference's size is made for them, and the
    verdicts do not depend on where the slices fall."""
    import torch

    from pytest_kcoral import correctness

    torch.manual_seed(0)
    loose = correctness.Tolerance(None, None, False)
    references = {
        "near zero": torch.randn(1000) * 1e-7,
        "near a constant": 5 + torch.randn(1000) * 1e-7,
        "near a constant, bf16": (5 + torch.randn(1000) * 1e-4).to(torch.bfloat16),
        "varied": torch.randn(1000),
        "varied, with an Inf": torch.cat([torch.randn(999), torch.tensor([float("inf")])]),
    }
    weak = {name: correctness.is_weak_reference([ref], loose) for name, ref in references.items()}
    assert weak == {"near zero": True, "near a constant": True, "near a constant, bf16": True, "varied": False,
                    "varied, with an Inf": False}
    zeros = torch.zeros(1000)
    three_values = torch.tensor([0.0, 1.0, 2.0]).repeat(334)[:1000]
    whole = correctness.constant_output(0, [zeros], [references["varied"]])
    assert whole is not None and "1000 distinct values range over" in whole
    assert correctness.constant_output(0, [zeros], [three_values]) is None
    assert correctness.constant_output(0, [zeros], [references["varied, with an Inf"]]) is None
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", 7)
    with _LargestResult() as largest:
        assert {name: correctness.is_weak_reference([ref], loose) for name, ref in references.items()} == weak
        sliced = correctness.constant_output(0, [zeros], [references["varied"]])
    assert largest.elements <= 2 * 7, "a tensor of the reference's size was made"
    assert sliced is not None and "at least" in sliced and sliced.split("range over")[1] == whole.split("range over")[1]
    assert correctness.constant_output(0, [zeros], [three_values]) is None  # three values in every slice, and in all
    assert correctness.constant_output(0, [zeros], [references["varied, with an Inf"]]) is None
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):  # dtypes torch has no isfinite, min or max for
        varied = (torch.randn(1000) * 4).to(fp8)
        assert "distinct values range over" in (correctness.constant_output(0, [zeros.to(fp8)], [varied]) or ""), fp8
        assert correctness.constant_output(0, [varied], [varied]) is None


class _LargestResult:
    """The most elements any torch operation's result held while entered (views of the inputs
    included: a slice of a reference is a view, a copy of it is not)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Watch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import torch

                result = func(*args, **(kwargs or {}))
                for leaf in result if isinstance(result, (tuple, list)) else [result]:
                    if isinstance(leaf, torch.Tensor) and not _returns_a_view(func):
                        outer.elements = max(outer.elements, leaf.numel())
                return result

        self.elements = 0
        self._mode = Watch()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


def _returns_a_view(func) -> bool:
    return any(r.alias_info is not None for r in func._schema.returns)
