"""Suites as users bring them, on a real GPU: a GPU MODE problem folder whose ``generate_input``
draws on ``cuda`` as published, its checker run in the trusted child on the device, and
``torch.compile`` candidates (Inductor's Triton kernels, and CUDA graphs as GPU MODE's
vectorsum solutions use them) with the leftovers audit on. Each test starts pytest in a
subprocess, so its template process and its CUDA state are its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from grading import grade_in_subprocess
from kernels import add_case
from test_gpumode_suite import FP32_SCAN, REFERENCE, gpumode_problem

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TORCH_COMPILE = """
import torch

def _add(a, b):
    return a + b

run = torch.compile(_add)
"""

# as GPU MODE's vectorsum and sort solutions: CUDA graphs through torch.compile
TORCH_COMPILE_REDUCE_OVERHEAD = """
import torch

def _add(a, b):
    return a + b

run = torch.compile(_add, mode="reduce-overhead")
"""

# no Inductor cache: a cached graph compiles nothing, and leaves no progress bar behind
FRESH_COMPILE = {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}


def test_torch_compile_candidates_pass_on_the_gpu(tmp_path):
    proc, doc = grade_in_subprocess(tmp_path, add_case([1 << 20]), {"compiled": TORCH_COMPILE, "graphs": TORCH_COMPILE_REDUCE_OVERHEAD},
                                    "--kcoral-timing-budget", "0.3", env=FRESH_COMPILE)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for item in doc["items"]:
        assert item["outcome"] == "passed" and item["device"].startswith("cuda:"), item["message"]
        assert item["speedup"] is not None
    print(json.dumps([(i["nodeid"], i["t_baseline_us"], i["t_candidate_us"], i["speedup"], i["phases_ms"]) for i in doc["items"]], indent=1))


def test_a_gpumode_problem_as_published_grades_on_the_gpu(tmp_path):
    on_cuda = (REFERENCE.replace("torch.Generator(device=torch.get_default_device())", "torch.Generator(device='cuda')")
               .replace("dtype=torch.float32, generator=gen", "device='cuda', dtype=torch.float32, generator=gen"))
    compiled_scan = FP32_SCAN.replace("def custom_kernel(data: input_t) -> output_t:\n    return torch.cumsum(data, dim=0)",
                                      "def _scan(data):\n    return torch.cumsum(data, dim=0)\n\ncustom_kernel = torch.compile(_scan)")
    gpumode_problem(tmp_path, reference=on_cuda, solutions={
        "submission.py": FP32_SCAN,
        "solutions/correct/compiled.py": compiled_scan,
        "solutions/wrong/zeros.py": "import torch\ndef custom_kernel(data):\n    return torch.zeros_like(data)\n",
    })
    cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "problems", "--kcoral-json", "out.json",
           "--kcoral-lease-dir", str(tmp_path / "leases"), "--kcoral-timing-budget", "0.3", "-rxX"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=dict(os.environ, **FRESH_COMPILE))
    assert proc.returncode == 0, proc.stdout[-4000:]
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["known_answers"]["unexpected"] == [] and doc["known_answers"]["failed_as_expected"] == 1
    for item in doc["items"]:
        assert item["device"].startswith("cuda:")
        if item["expected"] != "fail":
            assert item["outcome"] == "passed" and item["timer"] == "cupti", item["message"]
    print(json.dumps([(i["nodeid"], i["outcome"], i["speedup"]) for i in doc["items"]], indent=1))


def test_a_kernelbench_level_and_run_folder_grade_on_the_gpu(tmp_path):
    from test_kernelbench_suite import ADD_KERNEL, ADD_PROBLEM, _write

    compiled = "import torch\nimport torch.nn as nn\n_add = torch.compile(lambda a, b: a + b)\n\nclass ModelNew(nn.Module):\n" \
               "    def forward(self, a, b):\n        return _add(a, b)\n"
    _write(tmp_path, {"level1/1_Add.py": ADD_PROBLEM.replace("N = 64", "N = 1 << 20"),
                      "runs/r/level_1_problem_1_sample_0_kernel.py": ADD_KERNEL,
                      "runs/r/level_1_problem_1_sample_1_kernel.py": compiled})
    cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "level1", "--kcoral-submissions", "runs/r",
           "--kcoral-json", "out.json", "--kcoral-lease-dir", str(tmp_path / "leases"), "--kcoral-timing-budget", "0.3"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=dict(os.environ, **FRESH_COMPILE))
    assert proc.returncode == 0, proc.stdout[-4000:]
    doc = json.loads((tmp_path / "out.json").read_text())
    assert sorted(i["candidate"] for i in doc["items"]) == ["r/sample_0", "r/sample_1"]
    assert doc["suite"]["pass_at_k"]["2"] == 1.0
