"""The grading pipeline on a real GPU: CUPTI timing end to end, the events fallback, poisoned
outputs, timed-output checks, and one worker per GPU under the lease. Each test starts pytest in
a subprocess, so its template process and its CUDA state are its own."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from grading import grade_in_subprocess
from kernels import add_case, triton_add

from pytest_kcoral.options import AUTO_PROCESS_PAIRS
from pytest_kcoral.stage_timing import MIN_ROUND_PAIRS, SEVERAL_PAIRS_ROUND_PAIRS, timing_rounds

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASE = add_case([1 << 22], [(1 << 22) + 3])

TRITON_ADD = triton_add(block=1024)

HALF_WRITTEN = """
import torch
def run(a, b):
    out = torch.empty_like(a)
    out[: a.numel() // 2] = (a + b)[: a.numel() // 2]
    return out
"""

POINTER_CACHE = """
_cache = {}
def run(a, b):
    key = (a.data_ptr(), b.data_ptr())
    if key not in _cache:
        _cache[key] = a + b
    return _cache[key]
"""


def _grade(tmp_path: Path, candidates: dict[str, str], *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    return grade_in_subprocess(tmp_path, CASE, candidates, "--kcoral-timing-budget", "0.3", *args, env=env)


def test_triton_candidate_graded_with_cupti(tmp_path):
    proc, doc = _grade(tmp_path, {"triton_add": TRITON_ADD, "torch_add": "def run(a, b):\n    return a + b\n"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    for item in doc["items"]:
        assert item["outcome"] == "passed"
        assert item["device"].startswith("cuda:")
        assert item["timer"] == "cupti", item["candidate_timing"]
        assert item["baseline_timing"]["method"] == "cupti"
        assert 0.3 < item["speedup"] < 3.0
        assert item["candidate_timing"]["records"] >= 1
    print(json.dumps([(i["nodeid"], i["t_baseline_us"], i["t_candidate_us"], i["speedup"]) for i in doc["items"]], indent=1))


def test_events_fallback_gives_like_for_like_speedups(tmp_path):
    proc, doc = _grade(tmp_path, {"torch_add": "def run(a, b):\n    return a + b\n"}, "--kcoral-timer", "events")
    assert proc.returncode == 0, proc.stdout[-3000:]
    for item in doc["items"]:
        assert item["timer"] == "events" and item["baseline_timing"]["method"] == "events"
        assert 0.9 < item["speedup"] < 1.1, _timing_figures(item)


def _timing_figures(item: dict) -> dict:
    """What a timing assertion's message needs: each side's median, rounds and their medians."""
    sides = {side: {k: item[f"{side}_timing"].get(k) for k in ("median_us", "n", "rounds", "rounds_dropped", "round_medians_us",
                                                               "processes", "flags")}
             for side in ("baseline", "candidate")}
    return {"nodeid": item["nodeid"], "speedup": item["speedup"], "interval": item.get("speedup_ci"), **sides}


# Eight launches: at 256 elements the GPU sits idle between them (host-set), at 2^24 it does not.
CHAIN_CASE = """
import torch
SEEN = [{"n": 256}, {"n": 1 << 24}]
UNSEEN = []

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    x = a
    for _ in range(8):
        x = x + b
    return x
"""


def test_a_host_set_item_is_timed_in_more_pairs_of_processes(tmp_path):
    """Under --kcoral-process-pairs auto, an item the host's speed sets (GPU idle between
    launches) is timed again in fresh pairs of processes; a GPU-bound one in one pair. Every item
    fed by the trusted child takes shorter rounds (``stage_timing.timing_rounds``), and each of
    several pairs at most ``SEVERAL_PAIRS_ROUND_PAIRS`` pairs of rounds."""
    chain = "def run(a, b):\n    x = a\n    for _ in range(8):\n        x = x + b\n    return x\n"
    proc, doc = grade_in_subprocess(tmp_path, CHAIN_CASE, {"chain": chain}, "--kcoral-timing-budget", "0.3")
    assert proc.returncode == 0, proc.stdout[-3000:]
    items = {i["shape_id"]: i for i in doc["items"]}
    small, large = items["n=256"], items[f"n={1 << 24}"]
    print(json.dumps({k: (i["speedup"], i["baseline_timing"]["process_medians_us"], i["candidate_timing"]["process_medians_us"])
                      for k, i in items.items()}))
    assert small["host_set"] and small["candidate_timing"]["processes"] == AUTO_PROCESS_PAIRS
    assert small["baseline_timing"]["processes"] == small["candidate_timing"]["processes"]
    assert not large["host_set"] and large["candidate_timing"]["processes"] == 1
    # both take the GPU's short rounds (10 of 30 ms at this budget); the host-set item's pairs 8 at most
    # each, the large one's all 10 or fewer once the speedup is precise enough (``stage_timing.precise_enough``)
    assert timing_rounds("cuda", 3072, 0.3) == timing_rounds("cuda", 3 << 26, 0.3) == 10 > SEVERAL_PAIRS_ROUND_PAIRS
    for side in ("baseline_timing", "candidate_timing"):
        assert AUTO_PROCESS_PAIRS * MIN_ROUND_PAIRS <= small[side]["rounds"] <= AUTO_PROCESS_PAIRS * SEVERAL_PAIRS_ROUND_PAIRS, small[side]["rounds"]
        assert MIN_ROUND_PAIRS <= large[side]["rounds"] <= 10, large[side]["rounds"]
    assert 0.8 < small["speedup"] < 1.25 and 0.95 < large["speedup"] < 1.05


def test_unwritten_output_elements_read_as_nan_poison(tmp_path):
    proc, doc = _grade(tmp_path, {"half": HALF_WRITTEN}, "-m", "seen")
    assert proc.returncode == 1
    (item,) = doc["items"]
    assert item["stage"] == "correctness"
    assert "NaN/Inf where the reference is finite" in item["message"], item["message"]


CASE_ZERO_AT_EVEN_INDICES = """
import torch
SEEN = [{"n": 4096}]
UNSEEN = [{"n": 4100}]

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device, dtype=torch.float16),)

def reference(x):
    out = x.clone()
    out[0::2] = 0
    return out
"""


def test_unwritten_half_precision_elements_read_as_nan_not_zero(tmp_path):
    # CUDA's allocator hands the poisoned block straight back. With a float32 NaN's bytes as the
    # poison, the even fp16 elements read 0.0, just where this reference is zero, and a kernel
    # that never wrote them passed
    odd_only = "import torch\ndef run(x):\n    out = torch.empty_like(x)\n    out[1::2] = x[1::2]\n    return out\n"
    proc, doc = grade_in_subprocess(tmp_path, CASE_ZERO_AT_EVEN_INDICES, {"odd_only": odd_only}, "-m", "seen", "--kcoral-mode", "correctness")
    (item,) = doc["items"]
    assert item["outcome"] == "failed" and item["stage"] == "correctness", item
    assert "2048 of 4096 elements are NaN/Inf where the reference is finite, first at index (0,)" in item["message"], item["message"]


CASE_IN_PLACE = """
import torch
SEEN = [{"n": 1 << 20}]
INPLACE = [0]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    a.add_(b)  # the result is input 0, written in place
"""


def test_an_in_place_result_is_checked_on_the_gpu_and_while_timed(tmp_path):
    watched = "calls = 0\ndef run(a, b):\n    global calls\n    calls += 1\n    if calls <= 3:\n        a.add_(b)\n"
    proc, doc = grade_in_subprocess(tmp_path, CASE_IN_PLACE, {"good": "def run(a, b):\n    a.add_(b)\n",
                                                             "noop": "def run(a, b):\n    pass\n", "watched": watched},
                                    "-m", "seen", "--kcoral-timing-budget", "0.1")
    items = {i["candidate"]: i for i in doc["items"]}
    assert items["good"]["outcome"] == "passed" and items["good"]["timer"] == "cupti", items["good"]
    assert items["noop"]["stage"] == "correctness" and "input 0 (written in place by the reference)" in items["noop"]["message"]
    assert items["watched"]["phase"] == "verify" and items["watched"]["correct"] is False, items["watched"]
    assert "input 0 (written in place by the reference)" in items["watched"]["message"]


def test_speed_of_light_against_the_spec_sheet(tmp_path):
    # a 16M-element fp32 add moves 192 MiB: a memory-bound kernel far from launch overhead, which
    # must reach a good share of the DRAM peak and can never pass it
    case = add_case([1 << 24]) + "\ndef cost(shape):\n    return {'flops': shape['n'], 'bytes': 12 * shape['n']}\n"
    proc, doc = grade_in_subprocess(tmp_path, case, {"torch_add": "def run(a, b):\n    return a + b\n"}, "-m", "seen",
                                    "--kcoral-timing-budget", "0.3")
    assert proc.returncode == 0, proc.stdout[-3000:]
    (item,) = doc["items"]
    sol = item["speed_of_light"]
    assert sol["candidate_gbps"] == pytest.approx(12 * (1 << 24) / (item["t_candidate_us"] * 1e3))
    from pytest_kcoral.physical_floor import GPU_PEAK_BYTES_PER_S

    name = torch.cuda.get_device_name(0)
    peak = next((p for key, p in GPU_PEAK_BYTES_PER_S if key in name), None)
    if peak is None:
        assert sol["peak_gbps"] is None, sol
        return
    assert sol["peak_gbps"] == pytest.approx(peak / 1e9)
    assert 0.3 < sol["candidate_of_peak"] < 1.0, sol
    assert "speed of light" in proc.stdout and "% of " in proc.stdout
    print(name, json.dumps(sol))


def test_pointer_keyed_cache_fails_the_timed_output_check(tmp_path):
    proc, doc = _grade(tmp_path, {"cache": POINTER_CACHE}, "-m", "seen")
    (item,) = doc["items"]
    assert item["outcome"] == "failed" and item["stage"] == "timing", item
    assert "outputs of timed calls are wrong" in item["message"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_one_worker_per_gpu_and_no_overlap(tmp_path):
    cands = {f"c{i}": "def run(a, b):\n    return a + b\n" for i in range(4)}
    proc, doc = _grade(tmp_path, cands, "-n", "auto")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "2 workers" in proc.stdout
    devices = {item["device"] for item in doc["items"]}
    assert devices == {"cuda:0", "cuda:1"}, devices
    by_key: dict[str, list[tuple[float, float]]] = {}
    for lease in doc["lease_history"]:
        by_key.setdefault(lease["lock_key"], []).append((lease["t_acquired"], lease["t_released"]))
    assert len(by_key) == 2
    for intervals in by_key.values():
        intervals.sort()
        assert all(b[0] >= a[1] for a, b in zip(intervals, intervals[1:]))


def test_the_timing_core_is_kept_for_the_timing_thread(tmp_path):
    # pinning.reserve: the candidate's process runs off the timing core except while it is timed
    log = tmp_path / "affinity.jsonl"
    spy = f"""
    import json, os
    def _log(where):
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps({{"where": where, "cores": sorted(os.sched_getaffinity(0))}}) + "\\n")
    _log("import")
    def run(a, b):
        _log("call")
        return a + b
    """
    proc, doc = _grade(tmp_path, {"spy": spy}, "-m", "seen", "--kcoral-confinement", "off")  # the log is outside its directory
    assert proc.returncode == 0, proc.stdout[-3000:]
    (item,) = doc["items"]
    (flag,) = [f for f in item["candidate_timing"]["flags"] if f.startswith("timing_cpu=")]
    core = int(flag.partition("=")[2])
    records = [json.loads(line) for line in log.read_text().splitlines()]
    at_import = [r["cores"] for r in records if r["where"] == "import"]
    calls = [r["cores"] for r in records if r["where"] == "call"]
    assert at_import and all(core not in cores for cores in at_import), (core, at_import)
    assert [core] in calls, "the timed calls run on the timing core"
    assert any(core not in cores for cores in calls), "the correctness calls run off it"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_sessions_on_different_gpus_time_on_different_cores(tmp_path):
    # each session sees its GPU as cuda:0; the timing core follows the GPU's host-wide number
    from pytest_kcoral.timing import pinning

    picks = pinning.timing_cores(os.sched_getaffinity(0))
    if len(picks) < 2:
        pytest.skip("one physical core: both GPUs' timing shares it")
    cores = []
    for gpu in ("0", "1"):
        proc, doc = _grade(tmp_path / f"gpu{gpu}", {"torch_add": "def run(a, b):\n    return a + b\n"}, "-m", "seen",
                           env={"CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        assert proc.returncode == 0, proc.stdout[-3000:]
        (item,) = doc["items"]
        assert item["device"] == "cuda:0"
        (flag,) = [f for f in item["candidate_timing"]["flags"] if f.startswith("timing_cpu=")]
        cores.append(int(flag.partition("=")[2]))
    assert cores == picks[:2], (cores, picks[:2])


def test_a_gpu_timed_without_cupti_python_says_so(tmp_path):
    # a GPU host without cupti-python: events time the items, and every report names the fallback
    blocker = tmp_path / "no_cupti" / "cupti"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('cupti-python hidden for this test')\n")
    path = os.pathsep.join(p for p in (str(blocker.parent), os.environ.get("PYTHONPATH", "")) if p)
    proc, doc = _grade(tmp_path / "grade", {"torch_add": "def run(a, b):\n    return a + b\n"}, "-m", "seen",
                       env={"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stdout[-3000:]
    (item,) = doc["items"]
    assert item["timer"] == "events" and item["baseline_timing"]["method"] == "events"
    assert any("cupti-python hidden for this test" in f for f in item["candidate_timing"]["flags"])
    assert doc["timers"]["methods"] == {"events": 1}
    (reason,) = doc["timers"]["fallbacks"]
    assert "cupti-python is not usable" in reason
    assert "TIMER FALLBACK on 1 item: CUDA events, not CUPTI" in proc.stdout


def test_the_candidates_torch_pool_is_its_share_of_the_cores(tmp_path):
    # cpu_share: each process gets the host's cores divided among its GPUs (or workers), each with
    # its child, not all
    log = tmp_path / "threads.log"
    spy = f"""
    import torch
    def run(a, b):
        with open({str(log)!r}, "a") as f:
            f.write(f"{{torch.get_num_threads()}}\\n")
        return a + b
    """
    proc, doc = _grade(tmp_path / "grade", {"spy": spy}, "-m", "seen", "--kcoral-confinement", "off")  # the log is outside its directory
    assert proc.returncode == 0, proc.stdout[-3000:]
    (item,) = doc["items"]
    share = item["extra"]["cpu_threads"]
    assert share <= max(1, len(os.sched_getaffinity(0)) // (2 * torch.cuda.device_count()))
    assert set(log.read_text().split()) == {str(share)}
