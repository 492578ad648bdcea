"""Attacks on what the harness does in the candidate's process between timed calls (issue 29):
lazy objects returned by timed calls, a predictable input refresh, and the feed that now brings
the timed inputs from the trusted child."""

from __future__ import annotations

import json

MATMUL_CASE = """
import torch
SEEN = [{"n": 160}]

def make_inputs(shape, device):
    n = shape["n"]
    return torch.randn(n, n, device=device), torch.randn(n, n, device=device)

def reference(a, b):
    return a @ b
"""

HONEST = "def run(a, b):\n    return a @ b\n"

# Honest on the first call of each input set (the correctness trials call each set once), then a
# deferred object whose clone() does the work: the harness's copy of a kept output used to run it,
# outside the timing window.
LAZY_TIMED_OUTPUTS = """
import torch
_seen = set()

class Deferred:
    def __init__(self, a, b):
        self.a, self.b = a, b
    def clone(self):
        return self.a @ self.b
    def __getattr__(self, name):
        return getattr(self.a @ self.b, name)

def run(a, b):
    key = (a.data_ptr(), b.data_ptr())
    if key not in _seen:
        _seen.add(key)
        return a @ b
    return Deferred(a, b)
"""

# Makes random's draws constant, so that a refresh that takes its seeds from them draws the same
# inputs every time, and answers from a cache keyed by the inputs' first values.
PATCHED_RANDOM = """
import random
random.SystemRandom.getrandbits = lambda self, k: 12345
random.SystemRandom.random = lambda self: 0.5
random.Random.getrandbits = lambda self, k: 12345
_cache = {}

def run(a, b):
    key = (float(a[0, 0]), float(a[0, 1]), float(b[0, 0]), float(b[0, 1]))
    if key not in _cache:
        _cache[key] = a @ b
    return _cache[key]
"""


def _item(pytester, name):
    (item,) = [i for i in json.loads((pytester.path / "out.json").read_text())["items"] if i["candidate"] == name]
    return item


def test_a_timed_call_returning_a_lazy_object_fails(make_case, run_kcoral, pytester):
    make_case("cases/mm", MATMUL_CASE, {"lazy": LAZY_TIMED_OUTPUTS, "honest": HONEST})
    result = run_kcoral("--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, failed=1)
    lazy = _item(pytester, "lazy")
    assert lazy["stage"] == "timing" and lazy["correct"] is False
    assert "not a plain torch.Tensor" in lazy["message"] and "Deferred" in lazy["message"]
    assert _item(pytester, "honest")["outcome"] == "passed"


def test_a_patched_random_does_not_make_the_refresh_predictable(make_case, run_kcoral, pytester):
    make_case("cases/mm", MATMUL_CASE, {"patched": PATCHED_RANDOM, "honest": HONEST})
    run_kcoral("--kcoral-json", "out.json", "--kcoral-timing-budget", "0.2", "--kcoral-precision", "off")
    patched = _item(pytester, "patched")
    # with the refresh's seeds from random, the cache answered every timed call: 140-156x
    assert patched["speedup"] is None or patched["speedup"] < 1.3, patched["speedup"]
    honest = _item(pytester, "honest")
    assert honest["outcome"] == "passed" and 0.5 < honest["speedup"] < 2.0


# Learns each refresh's seed from a callee of torch.manual_seed, then makes that input set itself
# and its answer there, outside the timing window; the timed call returns the answer made ahead.
SEEDING_CALLEE_HOOK = """
import sys
import torch
import torch.xpu

_ahead = {}

def _learn(seed):
    case = next(m for name, m in sys.modules.items() if name.startswith("_kcoral_case_"))
    state = torch.random.get_rng_state()
    torch.default_generator.manual_seed(seed)
    a, b = case.make_inputs({"n": 160}, "cpu")
    torch.random.set_rng_state(state)
    _ahead[(float(a[0, 0]), float(b[0, 0]))] = a @ b

torch.xpu.manual_seed_all = _learn

def run(a, b):
    found = _ahead.pop((float(a[0, 0]), float(b[0, 0])), None)
    return found if found is not None else a @ b
"""


def test_a_hook_on_a_seeding_callee_never_sees_the_refreshs_seed(make_case, run_kcoral, pytester):
    make_case("cases/mm", MATMUL_CASE, {"hook": SEEDING_CALLEE_HOOK, "honest": HONEST})
    run_kcoral("--kcoral-json", "out.json", "--kcoral-timing-budget", "0.2", "--kcoral-precision", "off")
    hook = _item(pytester, "hook")
    # the answer made in the refresh: the call itself only looked it up
    assert hook["speedup"] is None or hook["speedup"] < 1.3, hook["speedup"]


# Caches its last output per input buffer, and answers from that stale cache on 60% of the calls
# on a buffer it has seen: every correctness trial is a first call, only timed calls repeat.
SOMETIMES_STALE = """
import os
_last = {}

def run(a, b):
    key = (a.data_ptr(), b.data_ptr())
    if key in _last and os.urandom(1)[0] < 154:
        return _last[key]
    _last[key] = a @ b
    return _last[key]
"""


def test_skipping_the_work_on_most_timed_calls_is_caught(make_case, run_kcoral, pytester):
    """Two checked timed outputs let such a candidate through in about half the sessions, at
    9-31x; the trusted child now judges every timed call."""
    make_case("cases/mm", MATMUL_CASE, {"stale": SOMETIMES_STALE, "honest": HONEST})
    result = run_kcoral("--kcoral-json", "out.json", "--kcoral-timing-budget", "0.2")
    result.assert_outcomes(passed=1, failed=1)
    stale = _item(pytester, "stale")
    assert stale["phase"] == "verify" and "the outputs of timed calls are wrong" in stale["message"], stale["message"]
    assert _item(pytester, "honest")["outcome"] == "passed"


# Finds the feed's socket among its process's descriptors (the Unix socket that was not there at
# its first call, a correctness trial) and writes a frame of its own into it while timed: the
# trusted child must refuse it, and end the feed.
FEED_WRITER = """
import os, socket, stat, struct
first_seen = None

def _sockets():
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                found[os.readlink("/proc/self/fd/" + name)] = int(name)
        except OSError:
            pass
    return found

def run(a, b):
    global first_seen
    now = _sockets()
    if first_seen is None:
        first_seen = set(now)
    for inode, fd in now.items():
        if inode not in first_seen:
            sock = socket.socket(fileno=os.dup(fd))
            body = b'{"op": "call", "set": 0, "prev": {"set": 0, "structure": 0, "leaves": [{"v": 1.0}], "problems": []}}'
            try:
                sock.send(struct.pack("!I", len(body)) + body, socket.MSG_DONTWAIT)
            except OSError:
                pass
            sock.close()
    return a @ b
"""


def test_writing_into_the_feed_from_the_candidates_call_fails_it(make_case, run_kcoral, pytester):
    make_case("cases/mm", MATMUL_CASE, {"writer": FEED_WRITER, "honest": HONEST})
    result = run_kcoral("--kcoral-json", "out.json", "--kcoral-timing-budget", "0.05", "--kcoral-precision", "off")
    result.assert_outcomes(passed=1, failed=1)
    writer = _item(pytester, "writer")
    assert writer["stage"] == "timing" and writer["correct"] is False and not writer["case_failed"], writer["message"]
    assert "feed" in writer["message"], writer["message"]
    assert _item(pytester, "honest")["outcome"] == "passed"
