"""GPU MODE's reference-kernels as published: a problem folder with ``task.yml`` and
``reference.py`` (and ``task.py``, ``../utils.py``, ``submission.py``, ``solutions/``) is a case
with no glue, judged by its own ``check_implementation`` in the trusted child; candidates under
``wrong/`` are known answers, expected to fail.

The problems here are written for these tests, in GPU MODE's layout; their ``generate_input``
honours the default device, so they run on a CPU.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import VECTOR_ADD_CASE

CORRECTNESS = ("--kcoral-mode", "correctness")

UTILS = """
import torch

def match_reference(data, output, reference, rtol=1e-5, atol=1e-8):
    expected = reference(data)
    if output.shape != expected.shape:
        return "SIZE MISMATCH"
    bad = ~torch.isclose(output.to(expected.dtype), expected, rtol=rtol, atol=atol)
    if bad.any():
        return f"mismatch found! custom implementation doesn't match reference: {int(bad.sum())} elements differ"
    return ""
"""

TASK_YML = """
# name: scan-py
files:
  - {"name": "submission.py", "source": "@SUBMISSION@"}
  - {"name": "task.py", "source": "task.py"}
  - {"name": "utils.py", "source": "../utils.py"}
  - {"name": "reference.py", "source": "reference.py"}
  - {"name": "eval.py", "source": "../eval.py"}
lang: "py"
config:
  main: "eval.py"
tests:
  - {"size": 63, "seed": 4242}
  - {"size": 64, "seed": 5236}
benchmarks:
  - {"size": 64, "seed": 1001}
  - {"size": 256, "seed": 31232}
"""

TASK_PY = """
from typing import TypeVar
import torch

input_t = TypeVar("input_t", bound=torch.Tensor)
output_t = TypeVar("output_t", bound=torch.Tensor)
"""

# an inclusive scan: the reference in float64, candidates in float32; the checker scales its
# tolerance by sqrt(n), as GPU MODE's prefixsum does, and refuses to run where a candidate ran
REFERENCE = """
import sys
import torch
from task import input_t, output_t
from utils import match_reference

def ref_kernel(data: input_t) -> output_t:
    return torch.cumsum(data.to(torch.float64), dim=0)

def generate_input(size: int, seed: int) -> input_t:
    gen = torch.Generator(device=torch.get_default_device())
    gen.manual_seed(seed)
    return torch.randn(size, dtype=torch.float32, generator=gen).contiguous()

def check_implementation(data: input_t, output: output_t) -> str:
    if "kcoral_candidate" in sys.modules:
        return "checked in a process that imported a candidate"
    scale = data.numel() ** 0.5
    return match_reference(data, output, reference=ref_kernel, rtol=1e-5 * scale, atol=1e-5 * scale)
"""

FP32_SCAN = """
import torch
from task import input_t, output_t

def custom_kernel(data: input_t) -> output_t:
    return torch.cumsum(data, dim=0)
"""

SOLUTIONS = {
    "submission.py": FP32_SCAN,
    "solutions/correct/fp32.py": FP32_SCAN,
    "solutions/wrong/empty.py": "import torch\ndef custom_kernel(data):\n    return torch.zeros_like(data)\n",
    "solutions/wrong/off_by_one.py": "import torch\ndef custom_kernel(data):\n    return torch.cumsum(data, 0) - data\n",
}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, src in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))


def gpumode_problem(root: Path, reference: str = REFERENCE, task_yml: str = TASK_YML, solutions: dict[str, str] | None = None) -> Path:
    """``problems/pmpp/scan_py`` in GPU MODE's layout, ``utils.py`` one folder up."""
    folder = root / "problems" / "pmpp" / "scan_py"
    _write(root / "problems" / "pmpp", {"utils.py": UTILS})
    _write(folder, {"task.yml": task_yml, "task.py": TASK_PY, "reference.py": reference, **(SOLUTIONS if solutions is None else solutions)})
    return folder


def _items(root: Path) -> dict[str, dict]:
    doc = json.loads((root / "out.json").read_text())
    return {f"{i['candidate']}[{i['shape_id']}]": i for i in doc["items"]}


def test_a_gpumode_problem_is_judged_by_its_own_checker_with_known_answers(pytester, run_kcoral):
    gpumode_problem(pytester.path)
    result = run_kcoral("problems", *CORRECTNESS, "--kcoral-json", "out.json", "-rx")
    # shapes: 63 and 64 from tests, 256 from benchmarks (64 once: its seed is replaced)
    result.assert_outcomes(passed=6, xfailed=6)
    result.stdout.fnmatch_lines(["*known answers: 2 of 2 wrong failed as expected, 1 of 1 correct passed; 0 unexpected*",
                                 "*XFAIL problems/pmpp/scan_py::wrong/empty[[]seen-size=63] - known answer: a wrong candidate, expected to fail;"
                                 " correctness failed: trial 1 of 3: check_implementation: mismatch found!*"])
    items = _items(pytester.path)
    assert set(items) == {f"{c}[size={n}]" for c in ("submission", "correct/fp32", "wrong/empty", "wrong/off_by_one") for n in (63, 64, 256)}
    # float32 outputs against a float64 reference: the problem's checker accepts them
    assert items["correct/fp32[size=256]"]["outcome"] == "passed" and items["correct/fp32[size=256]"]["expected"] == "pass"
    # its message is the failure's
    wrong = items["wrong/off_by_one[size=64]"]
    assert wrong["outcome"] == "failed" and wrong["expected"] == "fail"
    assert "check_implementation: mismatch found! custom implementation doesn't match reference: 64 elements differ" in wrong["message"]
    doc = json.loads((pytester.path / "out.json").read_text())
    assert doc["known_answers"]["unexpected"] == []
    assert doc["suite"]["pairs"] == 2  # the known-wrong candidates are not entries


def test_a_planted_wrong_solution_that_passes_fails_the_session(pytester, run_kcoral):
    gpumode_problem(pytester.path, solutions={"solutions/correct/fp32.py": FP32_SCAN, "solutions/wrong/planted.py": FP32_SCAN})
    result = run_kcoral("problems", *CORRECTNESS)
    result.assert_outcomes(passed=3, xpassed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*UNEXPECTED PASS problems/pmpp/scan_py::wrong/planted: passed all 3 item(s), expected to fail (XPASS(strict))*"])


def test_timed_outputs_are_rechecked_by_the_checker(pytester, run_kcoral):
    # right on the correctness trials, wrong once timed: the checker judges the timed outputs too
    honest_at_first = FP32_SCAN.replace("    return torch.cumsum(data, dim=0)", """    global calls
    calls += 1
    return torch.cumsum(data, dim=0) if calls <= 3 else torch.cumsum(data, dim=0) * 2

calls = 0""")
    gpumode_problem(pytester.path, solutions={"submission.py": FP32_SCAN, "solutions/wrong/late.py": honest_at_first})
    result = run_kcoral("problems", "-k", "64", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, xfailed=1, deselected=4)
    items = _items(pytester.path)
    assert items["submission[size=64]"]["speedup"] is not None
    late = items["wrong/late[size=64]"]
    assert (late["stage"], late["phase"]) == ("timing", "verify")
    assert "the outputs of timed calls are wrong" in late["message"] and "check_implementation: mismatch found!" in late["message"]


def test_the_harness_checks_stay_on_around_a_checker_that_accepts_anything(pytester, run_kcoral):
    lax = REFERENCE.replace('''    scale = data.numel() ** 0.5''', '''    return ""''')
    gpumode_problem(pytester.path, reference=lax, solutions={
        "solutions/wrong/nan.py": "import torch\ndef custom_kernel(data):\n    return torch.full_like(data, float('nan'))\n",
        "solutions/wrong/mutates.py": "import torch\ndef custom_kernel(data):\n    out = torch.cumsum(data, 0)\n    data.zero_()\n    return out\n",
        "solutions/wrong/constant.py": "import torch\ndef custom_kernel(data):\n    return torch.ones_like(data)\n",
    })
    result = run_kcoral("problems", *CORRECTNESS, "-k", "64", "--kcoral-json", "out.json")
    result.assert_outcomes(xfailed=3, deselected=6)
    items = _items(pytester.path)
    assert "elements are NaN/Inf where the reference is finite (unwritten elements read back as NaN poison)" in items["wrong/nan[size=64]"]["message"]
    assert "input 0 was modified" in items["wrong/mutates[size=64]"]["message"]
    assert "the output does not depend on the inputs" in items["wrong/constant[size=64]"]["message"]


OUTPUT_BUFFER_REFERENCE = """
import torch

def ref_kernel(data):
    a, b, c = data
    return a + b

def generate_input(size: int, seed: int):
    gen = torch.Generator()
    gen.manual_seed(seed)
    a = torch.randn(size, generator=gen)
    b = torch.randn(size, generator=gen)
    return a, b, torch.empty(size)

def check_implementation(data, output):
    expected = ref_kernel(data)
    return "" if torch.allclose(output, expected) else "mismatch found!"
"""


def test_an_output_buffer_carried_in_the_data_may_be_written_and_returned(pytester, run_kcoral):
    # as pmpp_v2's matmul: the data carries c, and the solution writes it and returns it
    gpumode_problem(pytester.path, reference=OUTPUT_BUFFER_REFERENCE, solutions={
        "solutions/correct/into_c.py": "def custom_kernel(data):\n    a, b, c = data\n    c[...] = a + b\n    return c\n",
        "solutions/wrong/into_a.py": "def custom_kernel(data):\n    a, b, c = data\n    out = a + b\n    a.zero_()\n    return out\n",
    })
    result = run_kcoral("problems", *CORRECTNESS, "-k", "64", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, xfailed=1, deselected=4)
    assert "input 0 was modified" in _items(pytester.path)["wrong/into_a[size=64]"]["message"]


def test_without_a_checker_the_dtype_and_tolerance_rules_apply(pytester, run_kcoral):
    no_checker = REFERENCE[:REFERENCE.index("def check_implementation")]
    gpumode_problem(pytester.path, reference=no_checker, solutions={"solutions/wrong/fp32.py": FP32_SCAN})
    result = run_kcoral("problems", *CORRECTNESS, "-k", "63", "--kcoral-json", "out.json")
    result.assert_outcomes(xfailed=1, deselected=2)
    assert "output 0 has dtype torch.float32, expected torch.float64" in _items(pytester.path)["wrong/fp32[size=63]"]["message"]


def test_unseen_json_beside_task_yml_holds_held_out_shapes(pytester, run_kcoral):
    folder = gpumode_problem(pytester.path, solutions={"submission.py": FP32_SCAN})
    (folder / "unseen.json").write_text('[{"size": 1000, "seed": 7}]')
    result = run_kcoral("problems", "--co", "-q")
    result.stdout.fnmatch_lines(["problems/pmpp/scan_py::submission[[]seen-size=63]", "problems/pmpp/scan_py::submission[[]seen-size=64]",
                                 "problems/pmpp/scan_py::submission[[]seen-size=256]", "problems/pmpp/scan_py::submission[[]unseen-size=1000]"])


def test_a_malformed_task_is_a_collection_error_naming_task_yml(pytester, run_kcoral):
    gpumode_problem(pytester.path, task_yml=TASK_YML.replace('{"size": 63, "seed": 4242}', '{"sise": 63, "seed": 4242}'))
    result = run_kcoral("problems", "--co")
    result.stdout.fnmatch_lines(["*scan_py/task.yml: seen shape sise=63 does not fit generate_input(size, seed) in reference.py,"
                                 " called with the shape's keys and a seed: missing a required argument: 'size'*"])


def test_native_cases_have_known_answers_too(make_case, run_kcoral):
    make_case("cases/add", candidates={"good": "def run(a, b):\n    return a + b\n"})
    folder = Path(make_case("cases/add", candidates={}))
    _write(folder / "candidates", {"wrong/minus.py": "def run(a, b):\n    return a - b\n", "correct/plus.py": "def run(a, b):\n    return b + a\n"})
    result = run_kcoral(*CORRECTNESS, "-m", "seen")
    result.assert_outcomes(passed=2, xfailed=1, deselected=3)
    result.stdout.fnmatch_lines(["*known answers: 1 of 1 wrong failed as expected, 1 of 1 correct passed; 0 unexpected*"])


# right on small vectors only: wrong wherever n is over 100
WRONG_ABOVE_100 = "def run(a, b):\n    out = a + b\n    out[100:] = 0\n    return out\n"


def test_a_known_wrong_candidate_run_on_a_few_of_its_shapes_is_not_judged(make_case, run_kcoral):
    # "-m seen" runs only the shape the candidate gets right: no unexpected pass, the session passes
    case = VECTOR_ADD_CASE.replace('SEEN = [{"n": 256}]', 'SEEN = [{"n": 64}]')
    assert case != VECTOR_ADD_CASE
    folder = Path(make_case("cases/add", case, candidates={}))
    _write(folder / "candidates", {"wrong/tail.py": WRONG_ABOVE_100})
    few = run_kcoral(*CORRECTNESS, "-m", "seen")
    assert few.ret == 0, few.stdout.str()
    few.stdout.fnmatch_lines(["*known-wrong cases/add::wrong/tail: passed the 1 item(s) run of its 2; not judged*"])
    few.stdout.no_fnmatch_line("*UNEXPECTED PASS*")
    every = run_kcoral(*CORRECTNESS)
    every.stdout.fnmatch_lines(["*known answers: 1 of 1 wrong failed as expected*"])


def test_a_problem_drawing_on_cuda_as_published_skips_on_a_cpu(pytester, run_kcoral):
    on_cuda = (REFERENCE.replace("torch.Generator(device=torch.get_default_device())", "torch.Generator(device='cuda')")
               .replace("dtype=torch.float32, generator=gen", "device='cuda', dtype=torch.float32, generator=gen"))
    gpumode_problem(pytester.path, reference=on_cuda, solutions={"submission.py": FP32_SCAN})
    result = run_kcoral("problems", *CORRECTNESS, "-k", "63", "-rs")
    result.assert_outcomes(skipped=1, deselected=2)
    result.stdout.fnmatch_lines(["*SKIPPED*scan_py/reference.py*needs CUDA*"])


@pytest.mark.parametrize(("verdict", "problems"), [
    ("", []),
    ("mismatch found! 3 elements", ["check_implementation: mismatch found! 3 elements"]),
    ((True, ""), []),  # pmpp_v2's checkers
    ((False, "bad"), ["check_implementation: bad"]),
    ((False, ""), ["check_implementation: rejected, without a message"]),
    (None, []),
    (False, ["check_implementation: rejected, without a message"]),
])
def test_a_checkers_answer_is_read_in_each_of_gpu_modes_forms(verdict, problems):
    from pytest_kcoral.checker import problems_of

    assert problems_of(verdict) == problems


def test_outputs_are_rebuilt_in_the_structure_they_were_returned_in():
    from pytest_kcoral.checker import rebuild

    assert rebuild(0, ["t"]) == "t"
    assert rebuild([0, {"h": 0, "c": 0}], [1, 2, 3]) == (1, {"h": 2, "c": 3})
