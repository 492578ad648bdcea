"""KernelBench as published: a level folder of problem files, and a run folder of generated
kernels (``level_<L>_problem_<id>_sample_<k>_kernel.py``), graded with no glue."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_kcoral.cases import is_kernelbench_problem_file

ADD_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b

N = 64

def get_inputs():
    return [torch.randn(N), torch.randn(N)]

def get_init_inputs():
    return []
"""

SCALE_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale

N = 32
SEEN = [{"N": 32}, {"N": 48}]

def get_inputs():
    return [torch.randn(N)]

def get_init_inputs():
    return [3.0]
"""

ADD_KERNEL = """
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
"""

WRONG_ADD_KERNEL = ADD_KERNEL.replace("a + b", "a - b")

SCALE_KERNEL = """
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for name, src in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))


@pytest.fixture
def level_and_run(pytester: pytest.Pytester) -> Path:
    """``KernelBench/level1`` with two problems and a file that is none; ``runs/gpt`` with three
    samples of problem 1 (one wrong), one of problem 2, and two that match no problem."""
    _write(pytester.path, {
        "KernelBench/level1/1_Add.py": ADD_PROBLEM,
        "KernelBench/level1/2_Scale.py": SCALE_PROBLEM,
        "KernelBench/level1/3_helpers.py": "def get_inputs():\n    return []\n",  # no Model: not a problem
        "runs/gpt/level_1_problem_1_sample_0_kernel.py": ADD_KERNEL,
        "runs/gpt/level_1_problem_1_sample_1_kernel.py": WRONG_ADD_KERNEL,
        "runs/gpt/level_1_problem_1_sample_2_kernel.py": ADD_KERNEL,
        "runs/gpt/level_1_problem_2_sample_0_kernel.py": SCALE_KERNEL,
        "runs/gpt/level_1_problem_7_sample_0_kernel.py": SCALE_KERNEL,  # no problem 7
        "runs/gpt/level_2_problem_2_sample_0_kernel.py": SCALE_KERNEL,  # problem 2 of level 2
    })
    return pytester.path


def test_a_level_folder_and_a_run_folder_grade_with_pass_at_k_and_a_warning_for_strays(level_and_run, run_kcoral):
    result = run_kcoral("KernelBench/level1", "--kcoral-submissions", "runs/gpt", "--kcoral-mode", "correctness",
                        "--kcoral-json", "out.json", "-W", "always")
    # problem 1: three samples; problem 2: one sample on two shapes
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "*_ KernelBench/level1/1_Add.py::gpt/sample_1[[]seen-default] _*",  # a failure's header is its id
        "*--kcoral-submissions *runs/gpt: 2 file(s) match no collected case and are not graded:"
        " level_1_problem_7_sample_0_kernel.py, level_2_problem_2_sample_0_kernel.py*",
        "*FAILED KernelBench/level1/1_Add.py::gpt/sample_1[[]seen-default]*",
    ])
    doc = json.loads((level_and_run / "out.json").read_text())
    matched = {(i["case"], i["candidate"], i["team"], i["attempt"]) for i in doc["items"]}
    assert matched == {
        ("KernelBench/level1/1_Add", "gpt/sample_0", "gpt", "sample_0"),
        ("KernelBench/level1/1_Add", "gpt/sample_1", "gpt", "sample_1"),
        ("KernelBench/level1/1_Add", "gpt/sample_2", "gpt", "sample_2"),
        ("KernelBench/level1/2_Scale", "gpt/sample_0", "gpt", "sample_0"),
    }
    rows = {row["case"]: row for row in doc["suite"]["pass_at_k_by_team_case"]}
    assert (rows["KernelBench/level1/1_Add"]["n"], rows["KernelBench/level1/1_Add"]["c"]) == (3, 2)
    assert doc["suite"]["pass_at_k"]["1"] == pytest.approx((2 / 3 + 1) / 2)
    assert doc["leaderboard"][0]["team"] == "gpt" and doc["leaderboard"][0]["cases_correct"] == 2


def test_team_folders_of_run_files_and_a_problem_file_given_alone(level_and_run, run_kcoral):
    # --kcoral-submissions runs: runs/<team>/level_..._kernel.py, a team per folder
    _write(level_and_run, {"runs/claude/level_1_problem_2_sample_3_kernel.py": SCALE_KERNEL})
    result = run_kcoral("KernelBench/level1/2_Scale.py", "--kcoral-submissions", "runs", "--kcoral-mode", "correctness", "--co", "-q")
    result.stdout.fnmatch_lines([
        "KernelBench/level1/2_Scale.py::claude/sample_3[[]seen-N=32]",
        "KernelBench/level1/2_Scale.py::gpt/sample_0[[]seen-N=32]",
        "KernelBench/level1/2_Scale.py::claude/sample_3[[]seen-N=48]",
        "KernelBench/level1/2_Scale.py::gpt/sample_0[[]seen-N=48]",
    ])
    assert "1_Add" not in result.stdout.str()


def test_a_problem_file_without_submissions_says_how_its_candidates_are_named(level_and_run, run_kcoral):
    result = run_kcoral("KernelBench/level1/1_Add.py", "--co", "-q", "-W", "always")
    result.stdout.fnmatch_lines(["*KernelBench/level1/1_Add: no candidates to grade (a KernelBench problem's are --kcoral-submissions"
                                 " RUN_DIR files named level_1_problem_1_sample_<k>_kernel.py, or <team>/1_Add.py)*"])


def test_a_broken_problem_file_is_a_collection_error_and_the_others_still_run(level_and_run, run_kcoral):
    _write(level_and_run, {"KernelBench/level1/4_Broken.py": ADD_PROBLEM.replace("def get_init_inputs():", "def get_init_inputs(:")})
    result = run_kcoral("KernelBench/level1", "--kcoral-submissions", "runs/gpt", "--kcoral-mode", "correctness")
    result.assert_outcomes(passed=4, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*4_Broken.py: syntax error at line *"])


def test_problem_files_are_told_from_other_files_without_importing_them(tmp_path):
    files = {
        "1_Add.py": ADD_PROBLEM,
        "2_NoModel.py": "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n",
        "add.py": ADD_PROBLEM,  # not named <id>_<Name>.py
        "0001_migration.py": "raise SystemExit('never imported')\n",
        "5_Imported.py": "from elsewhere import Model, get_inputs, get_init_inputs\n",
    }
    for name, src in files.items():
        (tmp_path / name).write_text(textwrap.dedent(src))
    assert [n for n in files if is_kernelbench_problem_file(tmp_path / n)] == ["1_Add.py", "5_Imported.py"]


def test_a_problem_file_lacking_a_name_is_named_in_a_warning(pytester, run_kcoral):
    # given on the command line or met in a walk: not a problem, and said so (it was "no tests ran")
    _write(pytester.path, {"level1/5_Add.py": ADD_PROBLEM.replace("def get_init_inputs():\n    return []\n", ""),
                           "level1/6_helpers.py": "def shared():\n    return 1\n"})
    for args in (["level1/5_Add.py"], ["level1"]):
        result = run_kcoral(*args)
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
        result.stdout.fnmatch_lines(["*level1/5_Add.py:1: PytestWarning: 5_Add.py: not graded as a KernelBench problem: it does not"
                                     " define get_init_inputs (a problem defines Model, get_inputs, get_init_inputs)"])
        assert "6_helpers" not in result.stdout.str()  # defines none of the names: not a problem, nothing to say
