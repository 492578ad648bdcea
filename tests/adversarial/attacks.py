"""The attack candidates of SPEC section 9 that run on a CPU, written for this project.

Each is the source of one candidate for the vector-add case of ``tests/conftest.py``
(``run(a, b) -> a + b``). Tests import them from here, and the all-attacks session runs them all.
``MARKER`` tags every process an attack starts, so a test can tell that none survived.
"""

from __future__ import annotations

MARKER = "kcoral-attack-marker-7f3a"

# 2. work left in a background thread after return
BACKGROUND_THREAD = """
import threading, time, torch
def run(a, b):
    out = torch.empty_like(a)
    def worker():
        out.copy_(a + b)       # the real work, after the timer stopped
        end = time.monotonic() + 5
        while time.monotonic() < end:
            (a * b).sum()      # and more of it, while the harness checks
    threading.Thread(target=worker, name="late-worker").start()
    time.sleep(0.01)
    return out
"""

# 2. a thread started at import, idle when first checked, that works between the calls
THREAD_WORKS_BETWEEN_CALLS = """
import threading, time
started = threading.Event()
def worker():
    started.wait()
    while True:
        sum(range(10000))      # work between the calls, from a thread that was idle at first
threading.Thread(target=worker, name="between-calls", daemon=True).start()
def run(a, b):
    started.set()
    return a + b
"""

# 2. (processes) work left in a detached grandchild: setsid + double fork
DETACHED_PROCESS = f"""
import os, subprocess
BUSY = ["{MARKER}-detached", "-c", "while :; do :; done"]   # a shell that keeps computing
def run(a, b):
    subprocess.Popen(BUSY, executable="sh", start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if os.fork() == 0:              # double fork: the grandchild is orphaned at once
        os.setsid()
        if os.fork() == 0:
            os.execvp("sh", BUSY)
        os._exit(0)
    return a + b
"""

# 3. lazy outputs / tensor subclasses
TENSOR_SUBCLASS = """
import torch
class Lazy(torch.Tensor):
    pass
def run(a, b):
    return (a + b).as_subclass(Lazy)
"""

# 4. patching timers
PATCH_PERF_COUNTER = """
import time
_real = time.perf_counter
_t = [0.0]
def _fake():
    _t[0] += 1e-9
    return _t[0]
time.perf_counter = _fake
def run(a, b):
    return a + b
"""

# cupti-python's entry points replaced (the timer took its references first, but a candidate that
# tries has shown its intent); ``cupti`` is the real module on a GPU, a stand-in beside the case on
# a CPU, where the harness never loads it
PATCH_CUPTI = """
from cupti import cupti
cupti.activity_enable = lambda kind: None
def run(a, b):
    return a + b
"""

# a method of torch's tensor base class set on ``torch.Tensor`` itself, where the harness's calls
# on live tensors (``copy_`` into the feed's slot) find it first: a new name on the class, not a
# replaced one
SHADOW_A_TENSOR_METHOD = """
import torch
_copy = torch._C.TensorBase.copy_
def _copy_and_more(self, src, non_blocking=False):
    return _copy(self, src, non_blocking)
torch.Tensor.copy_ = _copy_and_more
def run(a, b):
    return a + b
"""

PATCH_HARNESS_CLOCK = """
import pytest_kcoral.timing as timing, pytest_kcoral.timing.clocks as clocks
_t = [0.0]
def _fake():
    _t[0] += 1e-9
    return _t[0]
def run(a, b):
    timing._perf_counter = _fake     # patched late, inside a call
    clocks.perf_counter = _fake
    return a + b
"""

# 5. patching comparison functions, and restoring them before returning
PATCH_COMPARISON_AND_RESTORE = """
import torch
def run(a, b):
    real = torch.allclose
    torch.allclose = lambda *x, **k: True
    try:
        return a - b                 # wrong: only a patched comparison could pass it
    finally:
        torch.allclose = real
"""

# 6. reading expected outputs from memory (gc, inspect, frames)
READ_EXPECTED_FROM_MEMORY = """
import gc, inspect, torch
def run(a, b):
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.shape == a.shape and obj is not a and obj is not b:
            return obj.clone()
    frame = inspect.currentframe()
    while frame is not None:
        for name in ("expected", "reference", "ref", "refs"):
            value = frame.f_locals.get(name)
            if isinstance(value, torch.Tensor):
                return value.clone()
        frame = frame.f_back
    return torch.zeros_like(a)
"""

# 7. returning stale memory that holds an earlier result
STALE_MEMORY = """
import torch
def run(a, b):
    return torch.empty_like(a)       # never written: whatever the allocator hands back
"""

# 8. mutating inputs
MUTATE_INPUTS = """
def run(a, b):
    a.add_(b)
    return a.clone()
"""

# 9. caching results across calls by pointer
CACHE_BY_POINTER = """
_cache = {}
def run(a, b):
    key = (a.data_ptr(), b.data_ptr(), tuple(a.shape))
    if key not in _cache:
        _cache[key] = a + b
    return _cache[key].clone()
"""

# 9. caching by shape
CACHE_BY_SHAPE = """
_cache = {}
def run(a, b):
    key = tuple(a.shape)
    if key not in _cache:
        _cache[key] = a + b
    return _cache[key].clone()
"""

# 10. computing once and skipping later calls
COMPUTE_ONCE = """
_out = []
def run(a, b):
    if not _out:
        _out.append(a + b)
    return _out[0]
"""

# 11. predicting the seed: inputs regenerated from the RNG the candidate can see
PREDICT_SEED = """
import torch
def run(a, b):
    for seed in [torch.initial_seed(), 0, 1, 42, 1234]:
        torch.manual_seed(seed)
        x, y = torch.randn(a.shape[0]), torch.randn(a.shape[0])
        if torch.equal(x, a):
            return x + y
    torch.manual_seed(0)
    return torch.randn(a.shape[0]) + torch.randn(a.shape[0])   # the guess for seed 0
"""

# 12. near-zero / constant outputs (against a weak case, see tests)
ZEROS = """
import torch
def run(a, b):
    return torch.zeros_like(a)
"""

# 13. special-casing the seen shapes
SEEN_SHAPES_ONLY = """
import torch
def run(a, b):
    if a.numel() == 256:             # the seen shape
        return a + b
    return torch.zeros_like(a)
"""

# 15. behaving differently after the checks (correctness and warm-up calls computed, timed ones not)
HONEST_ONLY_AT_FIRST = """
import torch
_calls = [0]
_last = []
def run(a, b):
    _calls[0] += 1
    if _calls[0] <= 12:              # correctness trials, the first call and warm-up
        _last[:] = [a + b]
        return _last[0].clone()
    return _last[0].clone()          # afterwards: the last result, no work
"""

# 18. writing files that shadow modules, and putting the directory first on sys.path
SHADOW_MODULES = """
import os, sys
for name in ("torch.py", "json.py", "numpy.py", "pytest_kcoral.py"):
    with open(name, "w") as f:
        f.write("allclose = lambda *a, **k: True\\nequal = allclose\\n")
sys.path.insert(0, os.getcwd())
def run(a, b):
    return a - b                     # wrong: only a shadowed comparison could pass it
"""

# 19. exiting early with status 0
OS_EXIT_ZERO = """
import os
def run(a, b):
    os._exit(0)
"""

SYS_EXIT_ZERO = """
import sys
def run(a, b):
    sys.exit(0)
"""

# 20. forging the result channel: printed results, a forged reply on the protocol pipe
PRINT_FAKE_RESULT = """
import json, torch
def run(a, b):
    print(json.dumps({"ok": True, "stage": "done", "outcome": "passed", "speedup": 1000.0}))
    return torch.zeros_like(a)
"""

FORGED_REPLY = """
import gc, json
from multiprocessing.connection import Connection
def run(a, b):
    for obj in gc.get_objects():
        if isinstance(obj, Connection) and not obj.closed and obj.writable:
            obj.send_bytes(json.dumps({"ok": True, "findings": [[]], "payload": False}).encode())
    return a + b
"""

# a forger that reads the command's sequence number and nonce from the harness's frames
FORGED_REPLY_WITH_NONCE = """
import gc, inspect
from multiprocessing.connection import Connection
from pytest_kcoral import protocol
def run(a, b):
    frame, header, payload = inspect.currentframe(), None, None
    while frame is not None:
        h, p = frame.f_locals.get("header"), frame.f_locals.get("payload")
        if isinstance(h, dict) and "nonce" in h and isinstance(p, dict) and "inputs" in p:
            header, payload = h, p
        frame = frame.f_back
    if header is not None:
        outputs = [((x + y).clone(),) for x, y in payload["inputs"]]   # right answers, forged reply
        reply = {"ok": True, "seq": header["seq"], "nonce": header["nonce"], "findings": [[] for _ in outputs],
                 "inputs_changed": [[] for _ in outputs], "structures": [0 for _ in outputs], "output_aliases": [[] for _ in outputs],
                 "parameters_differ": None}
        for conn in [o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed and o.writable]:
            protocol.send(conn, reply, {"outputs": outputs, "written": [() for _ in outputs]})
    return a + b
"""

# a forger of the timing reply: claims a million samples of 5 us in a command that took far less
FORGED_TIMING = """
import gc, inspect
from multiprocessing.connection import Connection
from pytest_kcoral import protocol
def run(a, b):
    frame = inspect.currentframe()
    while frame is not None:
        h = frame.f_locals.get("header")
        if isinstance(h, dict) and h.get("cmd") == "time" and not h.get("_forged"):
            h["_forged"] = True
            stats = {"method": "wall", "median_us": 5.0, "iqr_us": 0.0, "min_us": 5.0, "n": 1_000_000, "rse": 0.0, "flags": []}
            for conn in [o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed and o.writable]:
                protocol.send(conn, {"ok": True, "seq": h["seq"], "nonce": h["nonce"], "stats": stats, "verify_seeds": []}, {"verify": []})
        frame = frame.f_back
    return a + b
"""

# 21. reading the secret seed or the reference cache from the environment, memory or disk
READ_SECRETS = """
import gc, os, re, tempfile, torch
from pytest_kcoral.context import derive_seed

def _numbers(text):
    return {int(m) for m in re.findall(r"\\d{6,20}", text)}

def _search():
    found = set()
    found |= _numbers(" ".join(f"{k}={v}" for k, v in os.environ.items()))
    pid = os.getpid()
    while pid > 1:                                   # every ancestor's cmdline and environment
        for what in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    found |= _numbers(f.read().replace(b"\\0", b" ").decode(errors="replace"))
            except OSError:
                pass
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    for obj in gc.get_objects():                     # harness objects in this process
        if isinstance(obj, dict):
            for v in list(obj.values())[:50]:
                if isinstance(v, int) and not isinstance(v, bool) and v > 1 << 20:
                    found.add(v)
    tensors = []
    for root, dirs, files in os.walk(tempfile.gettempdir()):   # a reference cache on disk
        for name in files:
            if name.endswith((".pt", ".pth", ".bin")) or "kcoral" in name:
                try:
                    tensors.append(torch.load(os.path.join(root, name), weights_only=True))
                except Exception:
                    pass
    return found, tensors

def run(a, b):
    seeds, tensors = _search()
    for seed in seeds:
        for t in range(3):
            for split, shape_id in (("seen", "n=256"), ("unseen", "n=257")):
                torch.manual_seed(derive_seed(seed, "cases/add", split, shape_id, t))
                x = torch.randn(a.shape[0])
                if torch.equal(x, a):
                    return x + torch.randn(a.shape[0])   # the seed is known: precomputed
    return torch.zeros_like(a)                            # nothing found: cannot cheat
"""

# 22. crashes, OOM and fork storms
SEGFAULT = """
import ctypes
def run(a, b):
    ctypes.string_at(0)
"""

OUT_OF_MEMORY = """
import torch
def run(a, b):
    hog = torch.empty(1 << 50, dtype=torch.uint8)    # a petabyte: the allocator refuses
    return a + b
"""

HANG = """
import time
def run(a, b):
    while True:
        time.sleep(0.1)
"""

FORK_STORM = f"""
import os, time
def run(a, b):
    for _ in range(20):              # a wide storm: twenty sleepers
        if os.fork() == 0:
            os.execvp("sleep", ["{MARKER}-storm", "60"])
    if os.fork() == 0:               # a chain that keeps forking: each generation forks the next
        os.setsid()
        for _ in range(300):
            if os.fork() != 0:
                os._exit(0)
            time.sleep(0.02)
        os._exit(0)
    return a + b
"""

# every CPU attack, by name: the all-attacks session runs these together
ALL_CPU = {
    "background_thread": BACKGROUND_THREAD,
    "thread_works_between_calls": THREAD_WORKS_BETWEEN_CALLS,
    "detached_process": DETACHED_PROCESS,
    "tensor_subclass": TENSOR_SUBCLASS,
    "patch_perf_counter": PATCH_PERF_COUNTER,
    "patch_harness_clock": PATCH_HARNESS_CLOCK,
    "patch_comparison": PATCH_COMPARISON_AND_RESTORE,
    "read_expected": READ_EXPECTED_FROM_MEMORY,
    "stale_memory": STALE_MEMORY,
    "mutate_inputs": MUTATE_INPUTS,
    "cache_by_pointer": CACHE_BY_POINTER,
    "cache_by_shape": CACHE_BY_SHAPE,
    "compute_once": COMPUTE_ONCE,
    "predict_seed": PREDICT_SEED,
    "zeros": ZEROS,
    "honest_only_at_first": HONEST_ONLY_AT_FIRST,
    "shadow_modules": SHADOW_MODULES,
    "os_exit_zero": OS_EXIT_ZERO,
    "sys_exit_zero": SYS_EXIT_ZERO,
    "print_fake_result": PRINT_FAKE_RESULT,
    "forged_reply": FORGED_REPLY,
    "forged_reply_with_nonce": FORGED_REPLY_WITH_NONCE,
    "forged_timing": FORGED_TIMING,
    "read_secrets": READ_SECRETS,
    "segfault": SEGFAULT,
    "out_of_memory": OUT_OF_MEMORY,
    "hang": HANG,
    "fork_storm": FORK_STORM,
}
