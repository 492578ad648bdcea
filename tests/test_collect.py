"""Collection: the three case formats, candidates and submissions, ids, marks, malformed cases."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest

KCORAL_BENCH_PY = """
import torch

def make_inputs(case):
    # no device argument: the harness makes the item's device the default
    return (torch.randn(case["n"]),)

def reference(x):
    return torch.relu(x)
"""

KERNELBENCH_CASE = """
import torch
batch_size = 4
features = 8
SEEN = [{"batch_size": 4}]
UNSEEN = [{"batch_size": 5}]

class Model(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x))

def get_inputs():
    return [torch.randn(batch_size, features)]

def get_init_inputs():
    return [features]
"""

KERNELBENCH_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x):
        return torch.clamp_min(x @ self.linear.weight.T + self.linear.bias, 0.0)
"""


def test_native_case_items_ids_and_order(pytester, make_case, run_kcoral):
    make_case("cases/add", candidates={"b_torch": "def run(a, b):\n    return a + b\n", "a_prep": "def prepare(a, b):\n    return lambda: a + b\n"})
    result = run_kcoral("--collect-only", "-q")
    # shape by shape (seen, then unseen), candidates in name order within a shape
    result.stdout.fnmatch_lines([
        "cases/add::a_prep[[]seen-n=256[]]",
        "cases/add::b_torch[[]seen-n=256[]]",
        "cases/add::a_prep[[]unseen-n=257[]]",
        "cases/add::b_torch[[]unseen-n=257[]]",
    ])
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(passed=4)


def test_marks_select_splits_and_tiers(pytester, make_case, run_kcoral):
    make_case("cases/add")
    run_kcoral("--kcoral-mode", "correctness", "-m", "unseen").assert_outcomes(passed=1, deselected=1)
    run_kcoral("--kcoral-mode", "correctness", "-m", "seen and tier2 and kcoral").assert_outcomes(passed=1, deselected=1)
    run_kcoral("--kcoral-mode", "correctness", "-m", "tier1").assert_outcomes(deselected=2)


def test_kcoral_bench_folder(pytester, run_kcoral):
    folder = pytester.path / "bench_relu"
    folder.mkdir()
    (folder / "bench.json").write_text(json.dumps({"cases": [{"id": "small", "n": 64}, {"n": 100}], "atol": 1e-6, "rtol": 1e-6}))
    (folder / "unseen.json").write_text(json.dumps([{"id": "odd", "n": 31}]))
    (folder / "bench.py").write_text(textwrap.dedent(KCORAL_BENCH_PY))
    (folder / "v0.py").write_text("import torch\ndef run(x):\n    return torch.relu(x)\n")
    (folder / "v1.py").write_text("def run(x):\n    return x.abs()\n")
    result = run_kcoral("--kcoral-mode", "correctness", "-v")
    result.stdout.fnmatch_lines([
        "*bench_relu::v0[[]seen-small[]] PASSED*",
        "*bench_relu::v1[[]seen-small[]] FAILED*",
        "*bench_relu::v0[[]seen-n=100[]] PASSED*",
        "*bench_relu::v1[[]seen-n=100[]] FAILED*",
        "*bench_relu::v0[[]unseen-odd[]] PASSED*",
    ])
    result.assert_outcomes(passed=3, failed=3)


def test_bench_json_keys_nothing_reads_are_named_in_warnings(pytester, run_kcoral):
    # KCoral's warmup/repeat have a meaning there and none here; a misspelt atol would leave the
    # default tolerance in silence. Both are said, and the folder still grades.
    folder = pytester.path / "bench_relu"
    folder.mkdir()
    (folder / "bench.json").write_text(json.dumps({"cases": [{"n": 64}], "warmup": 3, "repeat": 20, "atoll": 1e-3}, indent=1))
    (folder / "bench.py").write_text(textwrap.dedent(KCORAL_BENCH_PY))
    (folder / "v0.py").write_text("import torch\ndef run(x):\n    return torch.relu(x)\n")
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(passed=1)  # the warnings counted below: pytest's own may join them in process
    assert sum("PytestWarning: bench_relu/bench.json: " in line for line in result.stdout.lines) == 3
    result.stdout.fnmatch_lines_random([
        '*bench_relu/bench.json:7: PytestWarning: bench_relu/bench.json: "warmup" is ignored: *set by --kcoral-timing-budget',
        '*bench_relu/bench.json:8: PytestWarning: bench_relu/bench.json: "repeat" is ignored: *set by --kcoral-timing-budget',
        '*bench_relu/bench.json:9: PytestWarning: bench_relu/bench.json: unknown key "atoll" is ignored (*); did you mean "atol"?',
    ])


HELPER_CASE = """
import torch
from task import N, make  # a module beside case.py, as GPU MODE problems keep task.py and utils.py
SEEN = [{"n": N}]
UNSEEN = []

def make_inputs(shape, device):
    return make(shape["n"], device)

def reference(a, b):
    import utils  # imported when called, in the trusted child
    return utils.add(a, b)
"""


def _helpers(n):
    return {
        "task.py": f"import torch\nN = {n}\ndef make(n, device):\n    return torch.randn(n, device=device), torch.randn(n, device=device)\n",
        "utils.py": "def add(a, b):\n    return a + b\n",
    }


def test_a_case_imports_the_modules_beside_it_and_each_case_its_own(pytester, make_case, run_kcoral):
    # two cases, each with its own task.py of the same name: neither may see the other's
    candidate = "from utils import add  # candidates may import the case's helpers too\ndef run(a, b):\n    return add(a, b)\n"
    make_case("cases/first", HELPER_CASE, {"c": candidate}, files=_helpers(3))
    make_case("cases/second", HELPER_CASE, {"c": candidate}, files=_helpers(5))
    result = run_kcoral("--kcoral-mode", "correctness", "-v")
    result.stdout.fnmatch_lines(["*cases/first::c[[]seen-n=3[]] PASSED*", "*cases/second::c[[]seen-n=5[]] PASSED*"])
    result.assert_outcomes(passed=2)
    import sys

    assert "task" not in sys.modules and "utils" not in sys.modules, "helpers leave the pytest process's modules"
    assert not any(p.endswith(("first", "second")) for p in sys.path)


def test_a_bench_folders_baseline_py_is_its_baseline(pytester, run_kcoral):
    # KCoral users keep the baseline beside bench.py: it is timed against, and checked, not ignored
    folder = pytester.path / "bench_relu"
    folder.mkdir()
    (folder / "bench.json").write_text(json.dumps({"cases": [{"n": 64}]}))
    (folder / "bench.py").write_text(textwrap.dedent(KCORAL_BENCH_PY))
    (folder / "baseline.py").write_text("def baseline(x):\n    return x.abs()\n")  # wrong on purpose: recorded, not failed
    (folder / "v0.py").write_text("import torch\ndef run(x):\n    return torch.relu(x)\n")
    run_kcoral("--kcoral-mode", "correctness", "--kcoral-json", "out.json").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["candidate"] == "v0" and item["baseline_correct"] is False


def test_a_bench_folder_never_imports_its_candidates_into_a_trusted_process(pytester, run_kcoral):
    # beside bench.py every other .py is a candidate: untrusted, so not importable by the case
    folder = pytester.path / "bench_relu"
    folder.mkdir()
    (folder / "bench.json").write_text(json.dumps({"cases": [{"n": 64}]}))
    (folder / "bench.py").write_text("import v0\n" + textwrap.dedent(KCORAL_BENCH_PY))
    (folder / "v0.py").write_text("import torch\ndef run(x):\n    return torch.relu(x)\n")
    result = run_kcoral("--kcoral-mode", "correctness")
    result.stdout.fnmatch_lines(["*bench_relu/bench.py: importing it raised ModuleNotFoundError: No module named 'v0'*"])


def test_kernelbench_problem(pytester, make_case, run_kcoral):
    make_case("kb/relu_linear", KERNELBENCH_CASE, {"fused": KERNELBENCH_CANDIDATE})
    result = run_kcoral("--kcoral-mode", "correctness", "-v")
    result.stdout.fnmatch_lines(["*kb/relu_linear::fused[[]seen-batch_size=4[]] PASSED*", "*unseen-batch_size=5*PASSED*"])
    result.assert_outcomes(passed=2)


def test_two_kernelbench_folders_with_the_same_files_keep_references_of_their_own(pytester, make_case, run_kcoral):
    # the weights come from an init seed derived from the case's id: a reference cached by content
    # alone gave the second folder the first one's, and failed every candidate there
    make_case("kb/a", KERNELBENCH_CASE, {"fused": KERNELBENCH_CANDIDATE})
    make_case("kb/b", KERNELBENCH_CASE, {"fused": KERNELBENCH_CANDIDATE})
    run_kcoral("--kcoral-mode", "correctness", "-m", "seen").assert_outcomes(passed=2, deselected=2)


def test_kernelbench_parameters_made_in_another_order_get_a_hint(pytester, make_case, run_kcoral):
    # a buffer drawn before the Linear layer: the same seed then gives the layer other weights
    reordered = KERNELBENCH_CANDIDATE.replace("        super().__init__()\n",
                                              "        super().__init__()\n        self.register_buffer('noise', torch.randn(3))\n")
    make_case("kb/relu_linear", KERNELBENCH_CASE, {"reordered": reordered})
    # a fixed seed: over 32 elements a random one leaves a trial under half wrong now and then,
    # and the hint rightly stays out
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "--kcoral-seed", "1")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*elements (*%) outside*",
                                 "hint: most elements differ in every trial: ModelNew's parameters are made under the same seed*"])


def test_kernelbench_with_model_s_own_parameters_and_a_wrong_kernel_gets_no_parameter_hint(pytester, make_case, run_kcoral):
    # ModelNew builds Model's layer, so its weights match: the kernel's maths is what is wrong
    wrong_maths = KERNELBENCH_CANDIDATE.replace("x @ self.linear.weight.T + self.linear.bias, 0.0)",
                                                "x @ self.linear.weight.T + self.linear.bias, 0.0) + 1.0")
    make_case("kb/relu_linear", KERNELBENCH_CASE, {"off_by_one": wrong_maths})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*trial 1 of 3: output 0: 32 of 32 elements (100%) outside*", "trial 3 of 3: *(100%) outside*"])
    assert "ModelNew's parameters" not in result.stdout.str()


def test_kernelbench_without_parameters_gets_no_parameter_hint(pytester, make_case, run_kcoral):
    # the hint blamed ModelNew's parameters where Model has none: there the candidate's maths is wrong
    no_parameters = KERNELBENCH_CASE.replace("        self.linear = torch.nn.Linear(features, features)\n", "").replace(
        "torch.relu(self.linear(x))", "torch.relu(x) * 2")
    wrong = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, features):\n        super().__init__()\n\n" \
            "    def forward(self, x):\n        return x.abs() * 2 + 1\n"
    make_case("kb/relu_double", no_parameters, {"wrong": wrong})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*trial 1 of 3: output 0: 32 of 32 elements (100%) outside*", "trial 3 of 3: *(100%) outside*"])
    assert "ModelNew's parameters" not in result.stdout.str()


def test_kernelbench_without_seen_uses_the_files_own_shape(pytester, make_case, run_kcoral):
    src = KERNELBENCH_CASE.replace('SEEN = [{"batch_size": 4}]\nUNSEEN = [{"batch_size": 5}]\n', "")
    make_case("kb/plain", src, {"fused": KERNELBENCH_CANDIDATE})
    result = run_kcoral("--kcoral-mode", "correctness", "-v")
    result.stdout.fnmatch_lines(["*kb/plain::fused[[]seen-default[]] PASSED*"])


def test_submissions_single_file_and_attempts(pytester, make_case, run_kcoral):
    make_case("cases/add", candidates={})
    subs = pytester.path / "subs"
    (subs / "team-a").mkdir(parents=True)
    (subs / "team-a" / "add.py").write_text("def run(a, b):\n    return a + b\n")
    (subs / "team-b" / "add").mkdir(parents=True)
    (subs / "team-b" / "add" / "try1.py").write_text("def run(a, b):\n    return a - b\n")
    (subs / "team-b" / "add" / "try2.py").write_text("def run(a, b):\n    return b + a\n")
    # a relative path, as users type it: each child works in a private directory of its own
    result = run_kcoral("cases", "--kcoral-submissions", "subs", "--kcoral-mode", "correctness", "-v", "-m", "seen")
    result.stdout.fnmatch_lines([
        "*cases/add::team-a[[]seen-n=256[]] PASSED*",
        "*cases/add::team-b/try1[[]seen-n=256[]] FAILED*",
        "*cases/add::team-b/try2[[]seen-n=256[]] PASSED*",
    ])
    assert "match no collected case" not in result.stdout.str()  # every file was taken


def test_a_submission_that_matches_no_case_is_named(pytester, make_case, run_kcoral):
    make_case("cases/add", candidates={})
    subs = pytester.path / "subs"
    (subs / "team-a").mkdir(parents=True)
    (subs / "team-a" / "add.py").write_text("def run(a, b):\n    return a + b\n")
    (subs / "team-c").mkdir(parents=True)
    (subs / "team-c" / "ad.py").write_text("def run(a, b):\n    return a + b\n")  # a typo: graded nowhere
    (subs / "team-c" / "mul" / "try1.py").parent.mkdir(parents=True)
    (subs / "team-c" / "mul" / "try1.py").write_text("def run(a, b):\n    return a * b\n")
    result = run_kcoral("cases", "--kcoral-submissions", "subs", "--kcoral-mode", "correctness", "-m", "seen", "-v")
    result.stdout.fnmatch_lines(["*cases/add::team-a[[]seen-n=256[]] PASSED*"])
    # at the folder it is about, not at the plugin's line that warns
    result.stdout.fnmatch_lines([f"*{subs}:1: PytestWarning: --kcoral-submissions {subs}: 2 file(s) match no collected case and are not graded:"
                                 " team-c/ad.py, team-c/mul/try1.py (a submission is <team>/<case>.py or*"])
    assert "failed to collect" not in result.stdout.str()
    # a case that fails to collect takes none of its files: the warning says so, as its error does
    (pytester.path / "cases/add/case.py").write_text("def broken(:\n")
    broken = run_kcoral("cases", "--kcoral-submissions", "subs", "--kcoral-mode", "correctness")
    broken.stdout.fnmatch_lines(["*3 file(s) match no collected case*; 1 case(s) failed to collect (the errors above),"
                                 " whose files would be among these"])


def test_a_submission_two_same_named_cases_take_is_named_with_both(pytester, make_case, run_kcoral):
    # a submission is matched by its case folder's name: cases/a/add and cases/b/add both graded
    # team-a/add.py, and nothing said so
    make_case("cases/a/add", candidates={})
    make_case("cases/b/add", candidates={})
    make_case("cases/b/mul", candidates={})
    subs = pytester.path / "subs"
    (subs / "team-a" / "add").mkdir(parents=True)
    (subs / "team-a" / "add.py").write_text("def run(a, b):\n    return a + b\n")
    (subs / "team-a" / "add" / "try1.py").write_text("def run(a, b):\n    return b + a\n")
    (subs / "team-a" / "mul.py").write_text("def run(a, b):\n    return a + b\n")  # one case only: not named
    result = run_kcoral("cases", "--kcoral-submissions", "subs", "--kcoral-mode", "correctness", "-m", "seen", "-v")
    result.assert_outcomes(passed=8, deselected=8)  # each case has its bundled "good" too
    result.stdout.fnmatch_lines(["*cases/a/add::team-a[[]seen-n=256[]] PASSED*", "*cases/b/add::team-a[[]seen-n=256[]] PASSED*"])
    result.stdout.fnmatch_lines([f"*PytestWarning: --kcoral-submissions {subs}: the case folders cases/a/add, cases/b/add share the name"
                                 " 'add', and a submission is matched by that name alone: each of them grades the same 2 file(s),"
                                 " team-a/add.py, team-a/add/try1.py; rename a case folder (and its submissions) to grade them apart"])
    assert result.stdout.str().count("share the name") == 1 and "match no collected case" not in result.stdout.str()
    # one of the two collected: nothing shared, nothing said
    result = run_kcoral("cases/a", "--kcoral-submissions", "subs", "--collect-only", "-q")
    assert "share the name" not in result.stdout.str()


def test_two_files_that_would_get_one_candidate_name_are_a_collection_error(pytester, make_case, run_kcoral):
    """A bundled teamB.py and team teamB's submission, or one team in two submissions folders,
    would share item ids: one file's results replaced the other's in the JSON and the scores,
    with no word said. The case is a collection error naming the files; the other cases run."""
    make_case("cases/add", candidates={"teamB": "def run(a, b):\n    return a + b\n"})
    make_case("cases/mul", candidates={})
    for root, body in (("r1", "def run(a, b):\n    return a - b\n"), ("r2", "def run(a, b):\n    return a * b\n")):
        (pytester.path / root / "teamB").mkdir(parents=True)
        (pytester.path / root / "teamB" / "add.py").write_text(body)
        (pytester.path / root / "teamX").mkdir(parents=True)
        (pytester.path / root / "teamX" / "mul.py").write_text(body)
    result = run_kcoral("cases", "--kcoral-submissions", "r1", "--kcoral-submissions", "r2", "--kcoral-mode", "correctness",
                        "-m", "seen", "--kcoral-json", "out.json")
    out = result.stdout.str()
    assert "two or more candidate files get one name: 'teamB' (" in out
    assert "'teamB' (cases/add/candidates/teamB.py, r1/teamB/add.py, r2/teamB/add.py)" in out
    assert "'teamX' (r1/teamX/mul.py, r2/teamX/mul.py)" in out
    doc = json.loads((pytester.path / "out.json").read_text())
    assert len(doc["collection_errors"]) == 2 and doc["items"] == []
    # without the clashes, the same files grade
    shutil.rmtree(pytester.path / "r2")
    (pytester.path / "cases/add/candidates/teamB.py").rename(pytester.path / "cases/add/candidates/bundled.py")
    outcomes = run_kcoral("cases", "--kcoral-submissions", "r1", "--kcoral-mode", "correctness", "-m", "seen").parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 4 and "errors" not in outcomes, outcomes  # 2 cases x 2 candidates


def test_candidates_without_a_case_say_so(make_case, run_kcoral, pytester):
    (make_case("cases/nocase") / "case.py").rename(pytester.path / "cases/nocase/case_draft.py")
    make_case("cases/add")
    result = run_kcoral("-m", "seen", "--kcoral-mode", "correctness")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["*cases/nocase:1: PytestWarning: nocase: has a candidates/ folder but no case.py (nor bench.json,"
                                 " nor task.yml with reference.py): not graded"])


def test_a_case_without_candidates_says_so(make_case, run_kcoral):
    shutil.rmtree(make_case("cases/lonely") / "candidates")
    make_case("cases/add")
    result = run_kcoral("-m", "seen", "--kcoral-mode", "correctness")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["*cases/lonely/case.py:1: PytestWarning: cases/lonely: no candidates to grade"
                                 " (no .py files in cases/lonely/candidates/)"])
    assert "cases/add: no candidates" not in result.stdout.str()


def test_a_missing_submissions_folder_is_a_usage_error(make_case, run_kcoral):
    make_case("cases/add")
    result = run_kcoral("cases", "--kcoral-submissions", "subs")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kcoral-submissions subs: no such directory (*subs)*"])


@pytest.mark.parametrize(("args", "message"), [
    (["--kcoral-timeout", "inf"], "--kcoral-timeout must be a number of seconds, above 0 and at most 604800, not inf"),
    (["--kcoral-timeout", "nan"], "--kcoral-timeout must be a number of seconds, above 0 and at most 604800, not nan"),
    (["--kcoral-timing-budget", "0"], "--kcoral-timing-budget must be a number of seconds, above 0 and at most 604800, not 0.0"),
    (["--kcoral-lease-timeout", "-1"], "--kcoral-lease-timeout must be a number of seconds, 0 or more and at most 604800, not -1.0"),
    (["--kcoral-min-speedup", "nan"], "--kcoral-min-speedup must be a positive number, not nan"),
    (["--kcoral-min-speedup", "1.5", "--kcoral-mode", "correctness"],
     "--kcoral-min-speedup 1.5 needs timing, and --kcoral-mode correctness times nothing; drop one of them"),
    (["--kcoral-compare", "old.json", "--kcoral-mode", "correctness"],
     "--kcoral-compare old.json compares speedups, and --kcoral-mode correctness times nothing; drop one of them"),
    (["--kcoral-trials", "10000000"], "--kcoral-trials must be from 1 to 1000, not 10000000"),
    (["--kcoral-lease-dir", "cases/add/case.py"], "--kcoral-lease-dir cases/add/case.py: cannot be made a directory (File exists)"),
    (["--kcoral-json", "cases"], "--kcoral-json cases: a directory; give the path of the file to write"),
    (["--kcoral-timer", "cupti"], "--kcoral-timer cupti times CUDA devices, and none is visible here; *"),
], ids=["timeout-inf", "timeout-nan", "budget-zero", "lease-timeout-negative", "min-speedup-nan", "min-speedup-untimed", "compare-untimed", "trials-huge",
        "lease-dir-a-file", "json-a-directory", "cupti-without-a-gpu"])
def test_a_bad_option_value_is_a_usage_error_at_the_start(make_case, run_kcoral, args, message):
    make_case("cases/add")
    result = run_kcoral("cases", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message.replace('[', '?')}"])


@pytest.mark.parametrize(
    ("case_src", "problem"),
    [
        ("SEEN = [\n", "syntax error at line 1"),
        ("SEEN = [{'n': 1}]\ndef reference(a):\n    return a\n", "missing required function make_inputs()"),
        ("SEEN = []\ndef make_inputs(s, d):\n    pass\ndef reference(a):\n    return a\n", "SEEN is empty"),
        ("SEEN = [4096]\ndef make_inputs(s, d):\n    pass\ndef reference(a):\n    return a\n", "SEEN[[]0[]] must be a shape dict, got int 4096"),
        ("SEEN = [{'n': 1}]\nTIER = 7\ndef make_inputs(s, d):\n    pass\ndef reference(a):\n    return a\n", "TIER must be an integer from 1 to 5, got 7"),
        ("def make_inputs(s, d):\n    pass\ndef reference(a):\n    return a\n", "missing required name SEEN"),
        # a KernelBench problem with get_inputs misspelt read as a native case missing SEEN
        ("class Model:\n    pass\ndef get_input():\n    return []\ndef get_init_inputs():\n    return []\n",
         "missing required function get_inputs() (read as a KernelBench problem, since it defines Model;*"),
    ],
)
def test_malformed_case_is_a_collection_error_and_the_rest_run(pytester, make_case, run_kcoral, case_src, problem):
    make_case("cases/good")
    make_case("cases/broken", case_src)
    result = run_kcoral("--kcoral-mode", "correctness")
    result.stdout.fnmatch_lines([f"*cases/broken/case.py: {problem}*"])
    result.assert_outcomes(passed=2, errors=1)
    assert result.ret != 0


def test_malformed_bench_json(pytester, run_kcoral):
    folder = pytester.path / "bench_bad"
    folder.mkdir()
    (folder / "bench.json").write_text('{"cases": [{"n": 64},], "atol": 1e-5}')  # a trailing comma, on one line
    (folder / "bench.py").write_text(KCORAL_BENCH_PY)
    result = run_kcoral("--kcoral-mode", "correctness")
    result.stdout.fnmatch_lines(["*bench_bad/bench.json: invalid JSON at line 1, column 22: Expecting value*"])
    result.assert_outcomes(errors=1)


def test_a_folder_with_both_case_py_and_bench_json_is_a_collection_error(pytester, make_case, run_kcoral):
    # which of the two formats the folder is would be a guess: it is said, and the other cases run
    make_case("cases/good")
    folder = make_case("cases/both")
    (folder / "bench.json").write_text(json.dumps({"cases": [{"n": 64}]}))
    (folder / "bench.py").write_text(textwrap.dedent(KCORAL_BENCH_PY))
    result = run_kcoral("--kcoral-mode", "correctness")
    result.stdout.fnmatch_lines(["*cases/both: holds both case.py and bench.json:*keep one*"])
    result.assert_outcomes(passed=2, errors=1)


def test_gpu_only_shape_skips_on_cpu(pytester, make_case, run_kcoral):
    src = textwrap.dedent(
        """
        import torch
        SEEN = [{"n": 64}, {"n": 1 << 26, "gpu_only": True}]
        def make_inputs(shape, device):
            return (torch.randn(shape["n"], device=device),)
        def reference(x):
            return x * 2
        """
    )
    make_case("cases/big", src, {"good": "def run(x):\n    return x * 2\n"})
    result = run_kcoral("--kcoral-mode", "correctness", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    # located at the case, as a skip mark's reason is at its test: once at pytest_kcoral/items.py
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] cases/big/case.py:1: shape is marked gpu_only and no GPU is visible*"])


@pytest.mark.parametrize("make", [
    'torch.randn(shape["n"], device="cuda")',
    # GPU MODE's reference.py draws from a CUDA generator; torch's CPU build words that error apart
    'torch.randn(shape["n"], device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))',
], ids=["cuda-tensor", "cuda-generator"])
def test_case_whose_inputs_need_cuda_skips_on_cpu(pytester, make_case, run_kcoral, make):
    src = textwrap.dedent(
        f"""
        import torch
        SEEN = [{{"n": 64}}]
        def make_inputs(shape, device):
            return ({make},)
        def reference(x):
            return x * 2
        """
    )
    make_case("cases/cuda_only", src, {"good": "def run(x):\n    return x * 2\n"})
    result = run_kcoral("--kcoral-mode", "correctness", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*the case needs CUDA*"])


def test_items_are_selected_by_the_ids_the_plugin_prints(pytester, make_case, run_kcoral):
    make_case("cases/add", candidates={"a": "def run(a, b):\n    return a + b\n", "b": "def run(a, b):\n    return a + b\n"})
    make_case("cases/other")
    result = run_kcoral("cases/add::a[unseen-n=257]", "--kcoral-mode", "correctness", "-v")
    result.stdout.fnmatch_lines(["*cases/add::a[[]unseen-n=257[]] PASSED*"])
    result.assert_outcomes(passed=1, deselected=3)
    # a candidate selects all its items; a case folder given beside it keeps all of its own
    result = run_kcoral("cases/add::b", "cases/other", "--kcoral-mode", "correctness", "-n", "2")
    assert result.parseoutcomes()["passed"] == 4  # (xdist does not report workers' deselections)
    assert result.ret == 0


def test_plain_pytest_never_imports_a_submission_into_its_own_process(pytester, make_case, run_kcoral):
    # pytest's own collection walked the submissions folder: a team's test_*.py and conftest.py
    # ran in the pytest process, which a candidate must never reach
    make_case("cases/add", candidates={})
    marker = 'import os\nopen(os.path.join({where!r}, "ran_in_%d" % os.getpid()), "w").close()\n'
    attempt = pytester.path / "subs" / "team" / "add"
    attempt.mkdir(parents=True)
    (attempt / "test_attempt1.py").write_text(marker.format(where=str(pytester.path)) + "def run(a, b):\n    return a + b\n")
    (pytester.path / "subs" / "team" / "conftest.py").write_text(marker.format(where=str(pytester.path)))
    # unconfined: the marker files are written outside the children's own directories
    result = run_kcoral("--kcoral-submissions", "subs", "--kcoral-mode", "correctness", "-m", "seen", "--kcoral-confinement", "off")
    result.assert_outcomes(passed=2, deselected=2)  # the bundled candidate and the team's
    ran_in = {p.name for p in pytester.path.glob("ran_in_*")}
    assert ran_in and f"ran_in_{os.getpid()}" not in ran_in, ran_in  # the candidate's child, never this process


def test_a_case_folder_still_holds_its_maintainers_tests_and_cases_below_it(pytester, make_case, run_kcoral):
    # a test_*.py beside case.py and a case in a subfolder were dropped without a word, and
    # naming either on the command line was "not found"
    make_case("cases/add", files={"test_reference.py": "def test_reference_is_sane():\n    assert 1 + 1 == 2\n"})
    make_case("cases/add/variant")
    result = run_kcoral("cases", "--co", "-q")
    result.stdout.fnmatch_lines(["cases/add/test_reference.py::test_reference_is_sane", "cases/add/variant::good[[]seen-n=256[]]"])
    run_kcoral("cases/add/test_reference.py").assert_outcomes(passed=1)


def test_a_candidates_file_selects_its_items(pytester, make_case, run_kcoral):
    make_case("cases/add", candidates={"a": "def run(a, b):\n    return a + b\n", "b": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("cases/add/candidates/b.py", "--kcoral-mode", "correctness", "-v")
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(["*cases/add::b[[]seen-n=256[]] PASSED*"])


def test_an_id_given_to_an_option_stays_whole(pytester, make_case, run_kcoral):
    # "--deselect cases/add::a[seen-n=256]" (space-separated) became "--deselect cases/add" and
    # deselected the whole case, while also selecting that one item
    make_case("cases/add", candidates={"a": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("cases", "--deselect", "cases/add::a[seen-n=256]", "--co", "-q")
    result.stdout.fnmatch_lines(["cases/add::a[[]unseen-n=257[]]", "1/2 tests collected (1 deselected)*"])


def test_an_id_that_names_no_item_is_not_found(pytester, make_case, run_kcoral):
    # a typo beside a good id once ran the good one alone, status 0, without a word
    make_case("cases/add", candidates={"a": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("cases/add::a[seen-n=256]", "cases/add::aa[seen-n=256]", "--kcoral-mode", "correctness")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: not found: cases/add::aa[[]seen-n=256[]] (no item of that case has this id*"])
    # -k or --lf dropping a found item is no typo
    run_kcoral("cases/add::a", "-k", "unseen", "--kcoral-mode", "correctness").assert_outcomes(passed=1, deselected=1)
    # a case that did not collect says why itself: its collection error, not "not found"
    make_case("cases/broken", "SEEN = [\n")
    result = run_kcoral("cases/broken::a[seen-n=256]", "--kcoral-mode", "correctness")
    result.stdout.fnmatch_lines(["*cases/broken/case.py: syntax error at line 1*"])
    assert "not found" not in result.stdout.str() + result.stderr.str()
    # under xdist a worker cannot stop the session: it warns
    result = run_kcoral("cases/add::a[seen-n=256]", "cases/add::aa", "--kcoral-mode", "correctness", "-n", "2")
    assert result.parseoutcomes()["passed"] == 1
    result.stdout.fnmatch_lines(["*not found: cases/add::aa (no item of that case has this id*"])


# A GPU MODE problem's own files (generate_input draws from a generator seeded by its argument),
# and a case.py beside them, as older versions needed (it takes precedence: docs/grading.md).
GPU_MODE_REFERENCE = """
import torch
from task import input_t, output_t

def generate_input(size: int, seed: int) -> input_t:
    with open(__SEEDS__, "a") as f:
        f.write(f"{seed}\\n")
    gen = torch.Generator()
    gen.manual_seed(seed)
    return torch.randn(size, generator=gen), torch.randn(size, generator=gen)

def ref_kernel(data: input_t) -> output_t:
    a, b = data
    return a + b
"""
GPU_MODE_TASK = "import torch\ninput_t = tuple[torch.Tensor, torch.Tensor]\noutput_t = torch.Tensor\n"
GPU_MODE_CASE = """
import torch
from reference import generate_input, ref_kernel

SEEN = [{"size": 127}, {"size": 1024}]

def make_inputs(shape, device):
    return generate_input(**shape, seed=torch.initial_seed())

def reference(*inputs):
    return ref_kernel(inputs[0] if len(inputs) == 1 else inputs)
"""


def test_a_gpu_mode_problem_runs_through_the_readme_recipe(make_case, run_kcoral, pytester):
    seeds = pytester.path / "seeds.log"
    make_case("cases/vectoradd", GPU_MODE_CASE, {
        "submission": "from task import input_t, output_t\n\ndef custom_kernel(data: input_t) -> output_t:\n    a, b = data\n    return a + b\n",
    }, files={"reference.py": GPU_MODE_REFERENCE.replace("__SEEDS__", repr(str(seeds))), "task.py": GPU_MODE_TASK})
    run_kcoral("--kcoral-trials", "3", "--kcoral-confinement", "off").assert_outcomes(passed=2)  # the log is outside the children's directories
    drawn = seeds.read_text().split()
    # each input set the harness made got a seed of its own (a timed set's seed comes back once
    # more, when its reference is computed to verify that call's output)
    assert len(drawn) >= 6 and len(set(drawn)) >= 0.9 * len(drawn), drawn


@pytest.mark.parametrize(("baseline_src", "problem"), [
    ("def baseline(a, b)\n    return a + b\n", "syntax error at line 1"),
    ("raise ImportError('no such kernel')\n", "importing it raised ImportError: no such kernel"),
    ("def prepare(a, b):\n    return lambda: a + b\n", "defines neither baseline(*inputs) nor run(*inputs)*"),
])
def test_a_broken_baseline_file_is_a_collection_error_naming_it(make_case, run_kcoral, baseline_src, problem):
    # it was a compile failure of every candidate's process instead, blamed on no one clearly
    make_case("cases/good")
    make_case("cases/broken", files={"baseline.py": baseline_src})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.stdout.fnmatch_lines([f"*cases/broken/baseline.py: {problem}*"])
    result.assert_outcomes(passed=2, errors=1)


def test_a_case_with_two_baselines_is_a_collection_error(make_case, run_kcoral):
    # which one speedups were measured against was case.py's, silently
    make_case("cases/good")
    two = "import torch\nSEEN = [{'n': 4}]\ndef make_inputs(s, d):\n    return (torch.ones(4),)\ndef reference(x):\n    return x\n"
    make_case("cases/two", two + "def baseline(x):\n    return x\n", files={"baseline.py": "def baseline(x):\n    return x\n"})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.stdout.fnmatch_lines(["*cases/two/case.py: defines baseline() and has a baseline.py beside it*"])
    result.assert_outcomes(passed=2, errors=1)


def test_a_syntax_error_in_a_helper_names_the_helper(make_case, run_kcoral):
    make_case("cases/add", "from utils import add\nSEEN = [{'n': 4}]\n", files={"utils.py": "def add(a, b)\n    return a + b\n"})
    result = run_kcoral()
    result.stdout.fnmatch_lines(["*cases/add/case.py: importing it raised SyntaxError in *cases/add/utils.py at line 1: *"])


def test_a_case_that_exits_at_import_is_its_own_collection_error(make_case, run_kcoral, pytester):
    # sys.exit() in a case.py once ended the whole session with an INTERNALERROR, grading nothing
    make_case("cases/exits", "import sys\nsys.exit(3)\n")
    make_case("cases/add")
    result = run_kcoral("-m", "seen", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, errors=1, deselected=1)
    result.stdout.fnmatch_lines(["*cases/exits/case.py: importing it called sys.exit(3)*"])
    doc = json.loads((pytester.path / "out.json").read_text())
    assert [e["nodeid"] for e in doc["collection_errors"]] == ["cases/exits"]


def test_a_case_never_graded_is_named_in_the_step_summary_and_junit(make_case, run_kcoral, pytester, monkeypatch):
    # a CI reader sees the step summary and the JUnit figures, not the terminal's collection errors
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    make_case("cases/exits", "import sys\nsys.exit(3)\n")
    make_case("cases/add")
    run_kcoral("-m", "seen", "--junitxml", "junit.xml").assert_outcomes(passed=1, errors=1, deselected=1)
    summary = (pytester.path / "summary.md").read_text()
    assert "> **1 collection error(s)**: not graded, not in the scores." in summary
    assert f"> - `cases/exits`: {pytester.path}/cases/exits/case.py: importing it called sys.exit(3)" in summary.splitlines()
    import xml.etree.ElementTree as ET

    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["kcoral_collection_errors"] == "1"


def test_files_whose_names_start_with_an_underscore_are_not_candidates(pytester, make_case, run_kcoral):
    # a draft or a helper kept beside the candidates, in a case or a submission, is never graded
    make_case("cases/add", candidates={"good": "def run(a, b):\n    return a + b\n", "_draft": "def run(a, b):\n    return a - b\n"})
    subs = pytester.path / "subs"
    (subs / "team-a" / "add").mkdir(parents=True)
    (subs / "team-a" / "add" / "try1.py").write_text("def run(a, b):\n    return a + b\n")
    (subs / "team-a" / "add" / "_scratch.py").write_text("def run(a, b):\n    return a - b\n")
    (subs / "team-a" / "_add.py").write_text("def run(a, b):\n    return a - b\n")
    result = run_kcoral("cases", "--kcoral-submissions", "subs", "--kcoral-mode", "correctness", "-m", "seen", "-v")
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(["*cases/add::good[[]seen-n=256[]] PASSED*", "*cases/add::team-a/try1[[]seen-n=256[]] PASSED*"])
    assert "_draft" not in result.stdout.str() and "scratch" not in result.stdout.str() and "_add" not in result.stdout.str()

