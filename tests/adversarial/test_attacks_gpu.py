"""SPEC section 9 attacks that need a GPU: side streams, persisting L2, host compute plus copy,
and patching CUDA events, synchronization and CUPTI. They skip with a reason on a machine without
CUDA; the lead runs them on the H200 (``python -m pytest tests/adversarial/test_attacks_gpu.py -v``)."""

from __future__ import annotations

import json

import attacks
import pytest
import torch
from kernels import triton_add

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the attack works on CUDA streams, events or L2)"),
]

# memory-bound and large enough that skipping the work would show as a large speedup
GPU_CASE = """
import torch
SEEN = [{"n": 1 << 24}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b

def cost(shape):
    return {"flops": shape["n"], "bytes": 3 * 4 * shape["n"]}
"""

SIDE_STREAM = """
import torch
_side = None
def run(a, b):
    global _side
    if _side is None:
        _side = torch.cuda.Stream()
    out = torch.empty_like(a)
    with torch.cuda.stream(_side):       # the work, on another stream, not waited for
        for _ in range(20):
            torch.add(a, b, out=out)
    return out
"""

HOST_COMPUTE = """
def run(a, b):
    return (a.cpu() + b.cpu()).to(a.device)   # computed on the host, copied back
"""

PATCH_SYNC_AND_EVENTS = """
import torch
class FakeEvent:
    def __init__(self, *a, **k): pass
    def record(self, *a, **k): pass
    def synchronize(self): pass
    def elapsed_time(self, other): return 1e-6
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.Event = FakeEvent
def run(a, b):
    return a + b
"""

PERSISTING_L2 = """
import torch
_set = False
def _persist(a):
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart
    prop = torch.cuda.get_device_properties(a.device)
    limit = getattr(prop, "persisting_l2_cache_max_size", 0) or (prop.L2_cache_size * 3 // 4)
    cudart.cudaDeviceSetLimit(cudart.cudaLimit.cudaLimitPersistingL2CacheSize, limit)
    attr = cudart.cudaStreamAttrValue()
    window = attr.accessPolicyWindow
    window.base_ptr = a.data_ptr()
    window.num_bytes = min(a.numel() * a.element_size(), limit)
    window.hitRatio = 1.0
    window.hitProp = cudart.cudaAccessProperty.cudaAccessPropertyPersisting
    window.missProp = cudart.cudaAccessProperty.cudaAccessPropertyStreaming
    attr.accessPolicyWindow = window
    ids = cudart.cudaStreamAttrID  # cuda-bindings 13 names the member after the launch attributes
    attr_id = (ids.cudaStreamAttributeAccessPolicyWindow if hasattr(ids, "cudaStreamAttributeAccessPolicyWindow")
               else ids.cudaLaunchAttributeAccessPolicyWindow)
    return cudart.cudaStreamSetAttribute(torch.cuda.current_stream().cuda_stream, attr_id, attr)
def run(a, b):
    global _set
    if not _set:
        _set = True
        try:
            status = repr(_persist(a))
        except Exception as exc:  # the attack could not be mounted on this driver / cuda-python
            status = f"failed: {type(exc).__name__}: {exc}"
        with open(STATUS_PATH, "a") as f:
            f.write(status + "\\n")
    return a + b
"""


@pytest.fixture
def run_kcoral_gpu(pytester: pytest.Pytester):
    """Grade the pytester directory on the GPU, in a pytest subprocess: the shared ``run_kcoral``
    hides the GPUs (its runs assert the same things on every host), these attacks need one."""

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "kcoral", "-p", "no:cacheprovider",
                                             "--kcoral-lease-dir", str(pytester.path / "leases"), *args,
                                             timeout=300)

    return run


def _items(pytester):
    items = json.loads((pytester.path / "out.json").read_text())["items"]
    assert all(str(it["device"]).startswith("cuda") for it in items), [it["device"] for it in items]
    return {it["candidate"]: it for it in items}


def test_side_stream_work_is_timed(make_case, run_kcoral_gpu, pytester):
    make_case("cases/add", GPU_CASE, {"side_stream": SIDE_STREAM})
    result = run_kcoral_gpu("--kcoral-timing-budget", "0.3", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1)
    item = _items(pytester)["side_stream"]
    # 20 adds on the side stream are inside the window (device-wide synchronize): far slower than one
    assert item["speedup"] < 0.5, item
    assert any(".Stream" in s for s in item["suspicious"]), item["suspicious"]


def test_host_compute_and_copy_is_timed_by_the_host_clock(make_case, run_kcoral_gpu, pytester):
    make_case("cases/add", GPU_CASE, {"host": HOST_COMPUTE})
    result = run_kcoral_gpu("--kcoral-timing-budget", "0.3", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1)
    item = _items(pytester)["host"]
    assert item["speedup"] < 0.5, item
    # the host work is inside every call's time: the GPU span alone would have shown a tiny copy
    assert item["candidate_timing"]["host_bound"] or item["speedup"] < 0.2, item["candidate_timing"]


def test_patching_cuda_events_and_synchronize_is_detected(make_case, run_kcoral_gpu):
    make_case("cases/add", GPU_CASE, {"patcher": PATCH_SYNC_AND_EVENTS})
    result = run_kcoral_gpu("--kcoral-timing-budget", "0.3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': detected after the candidate ran in phase 'import': "
                                 "replaced functions the harness relies on*torch.cuda.synchronize*"])


def test_patching_cupti_is_detected_on_a_gpu(make_case, run_kcoral_gpu):
    pytest.importorskip("cupti", reason="the attack patches cupti-python, which the GPU timer reads")
    make_case("cases/add", GPU_CASE, {"patcher": attacks.PATCH_CUPTI})
    result = run_kcoral_gpu("--kcoral-timing-budget", "0.3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': detected after the candidate ran in phase 'import': "
                                 "replaced functions the harness relies on*cupti.cupti.activity_enable*"])


def test_persisting_l2_is_reset_and_earns_nothing(make_case, run_kcoral_gpu, pytester):
    pytest.importorskip("cuda.bindings", reason="the attack needs cuda-python (cuda-bindings) to set an access policy window")
    status = pytester.path / "persist_status.txt"
    make_case("cases/add", GPU_CASE, {"persist": PERSISTING_L2.replace("STATUS_PATH", repr(str(status))),
                                      "plain": "def run(a, b):\n    return a + b\n"})
    # the status file is outside the candidate's directory
    result = run_kcoral_gpu("--kcoral-timing-budget", "0.3", "--kcoral-json", "out.json", "--kcoral-confinement", "off")
    result.assert_outcomes(passed=2)
    if "failed:" in status.read_text():
        pytest.skip(f"the persisting-L2 window could not be set here: {status.read_text().strip()}")
    items = _items(pytester)
    assert "persisting_l2_reset" in items["persist"]["candidate_timing"]["flags"], items["persist"]["candidate_timing"]["flags"]
    # no better than the same kernel without the persisting window
    assert items["persist"]["speedup"] < items["plain"]["speedup"] * 1.15, (items["persist"]["speedup"], items["plain"]["speedup"])


TRITON_BASELINE_CASE = GPU_CASE + triton_add(block=1024, name="baseline")

# Overwrites every compiled kernel in the shared Triton cache at import, before the trusted child
# compiles the baseline: had the baseline loaded one of them, it would crash or come out wrong.
# A quieter attacker would plant a slower kernel and earn a speedup.
CACHE_POISONER = """
import os, pathlib
_root = pathlib.Path(os.environ.get("TRITON_CACHE_DIR") or pathlib.Path.home() / ".triton" / "cache")
for _f in list(_root.rglob("*")):
    if _f.is_file():
        _f.write_bytes(b"poisoned")
def run(a, b):
    return a + b
"""


def test_a_poisoned_triton_cache_never_reaches_the_baseline(make_case, run_kcoral_gpu, pytester, monkeypatch):
    import subprocess
    import sys

    cache = pytester.path / "shared-triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    root = make_case("cases/add", TRITON_BASELINE_CASE, {"poisoner": CACHE_POISONER})
    # the baseline's kernel compiled once on this host, into the shared cache
    warm = ("import importlib.util, torch; s = importlib.util.spec_from_file_location('c', {!r}); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "a, b = m.make_inputs({{'n': 1 << 24}}, 'cuda'); m.baseline(a, b); torch.cuda.synchronize()").format(str(root / "case.py"))
    subprocess.run([sys.executable, "-c", warm], check=True, timeout=300)
    assert any(cache.rglob("*.cubin")), "the shared cache holds no compiled kernel: the attack would prove nothing"
    # unconfined, so that the poisoner reaches the shared cache: the private caches must still keep
    # it from the baseline (confined, its writes there are refused: test_confinement.py)
    result = run_kcoral_gpu("--kcoral-timing-budget", "0.3", "--kcoral-json", "out.json", "--kcoral-confinement", "off")
    result.assert_outcomes(passed=1)
    item = _items(pytester)["poisoner"]
    assert any(f.read_bytes() == b"poisoned" for f in cache.rglob("*.cubin")), "the poisoner did not run"
    assert item["baseline_correct"] is True, item
    assert item["speedup"] is not None and 0.5 < item["speedup"] < 2.0, item


# A matmul long enough (about 2.7 ms on an H200) that its work, moved out of the timing window,
# would stand far above the slack the outside-window charge allows (50 us and the baseline's own
# time there). The case's inputs pass through a library of its own (``caselib``, in ``lib/``),
# which the candidate hooks to do the next call's work while the harness refreshes inputs; the
# trusted child makes every timed call's inputs (``feed.py``), so the hook never runs while timed.
CASELIB = "def finish(a, b):\n    return a, b\n"

MATMUL_CASE = """
import os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
import caselib
SEEN = [{"n": 4096}]

def make_inputs(shape, device):
    n = shape["n"]
    return caselib.finish(torch.randn(n, n, device=device), torch.randn(n, n, device=device))

def reference(a, b):
    return a @ b
"""

MATMUL_IN_THE_REFRESH = """
import torch
import caselib
_real_finish = caselib.finish
_ready = []

def _finish(a, b):
    _ready[:] = [a @ b]
    torch.cuda.synchronize()
    return _real_finish(a, b)

caselib.finish = _finish

def run(a, b):
    return _ready.pop() if _ready else a @ b
"""

# The same work left for after its window: a finalizer on the call's output runs when the harness
# lets the output go. It cannot make an answer (the next inputs do not exist yet), but its time is
# the call's all the same.
MATMUL_AFTER_ITS_WINDOW = """
import weakref
import torch

def _more(a, b):
    a @ b
    torch.cuda.synchronize()

def run(a, b):
    out = a @ b
    weakref.finalize(out, _more, a, b)
    return out
"""


def test_work_hidden_in_the_cases_input_maker_earns_nothing_on_a_gpu(make_case, run_kcoral_gpu, pytester):
    folder = make_case("cases/mm", MATMUL_CASE, {"refresh": MATMUL_IN_THE_REFRESH, "plain": "def run(a, b):\n    return a @ b\n"})
    (folder / "lib").mkdir()
    (folder / "lib" / "caselib.py").write_text(CASELIB)
    result = run_kcoral_gpu("--kcoral-timing-budget", "0.5", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=2)
    for name, item in _items(pytester).items():
        assert 0.9 < item["speedup"] < 1.1, (name, item["speedup"], item["candidate_timing"])
        assert item["extra"]["timed_outputs"]["candidate"]["checked"] > 0, (name, item["extra"])


def test_work_done_after_the_timing_window_is_charged_on_a_gpu(make_case, run_kcoral_gpu, pytester):
    folder = make_case("cases/mm", MATMUL_CASE, {"after": MATMUL_AFTER_ITS_WINDOW, "plain": "def run(a, b):\n    return a @ b\n"})
    (folder / "lib").mkdir()
    (folder / "lib" / "caselib.py").write_text(CASELIB)
    result = run_kcoral_gpu("--kcoral-timing-budget", "0.5", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=2)
    items = _items(pytester)
    after, plain = items["after"], items["plain"]
    # a second matmul after each window: charged, it reads about half the baseline's speed
    assert any(f.startswith("outside_window_excess_us=") for f in after["candidate_timing"]["flags"]), after["candidate_timing"]
    assert after["candidate_timing"]["charged_us"] > 1000.0, after["candidate_timing"]
    assert after["speedup"] < 0.8, after["speedup"]
    assert plain["candidate_timing"]["charged_us"] == 0.0, plain["candidate_timing"]
    assert 0.9 < plain["speedup"] < 1.1, plain["speedup"]
