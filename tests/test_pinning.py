"""The CPU core GPU timing runs on: chosen per device in the parent, applied in the child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pytest_kcoral.timing import pinning

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity (Linux)")


def test_each_gpu_gets_its_own_core_counted_from_the_last():
    allowed = sorted(os.sched_getaffinity(0))
    picks = pinning.timing_cores(allowed)
    assert pinning.choose(0) == allowed[-1] == picks[0]
    if len(picks) > 1:
        assert pinning.choose(1) == picks[1]
        assert picks[1] not in pinning.siblings(picks[0])
    # more GPUs than physical cores wraps around rather than failing
    assert pinning.choose(len(picks)) == allowed[-1]


def test_two_gpus_never_time_on_one_physical_core():
    adjacent = {0: {0, 1}, 1: {0, 1}, 2: {2, 3}, 3: {2, 3}}  # SMT siblings numbered side by side
    assert pinning.timing_cores(range(4), lambda c: frozenset(adjacent[c])) == [3, 1]
    split = {0: {0, 2}, 2: {0, 2}, 1: {1, 3}, 3: {1, 3}}  # siblings half the machine apart
    assert pinning.timing_cores(range(4), lambda c: frozenset(split[c])) == [3, 2]
    assert pinning.timing_cores([5, 1, 3], lambda c: frozenset({c})) == [5, 3, 1]


def test_kernel_cpu_lists_parse():
    assert pinning.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert pinning.parse_cpu_list("7") == {7}
    assert pinning.siblings(max(os.sched_getaffinity(0))) >= {max(os.sched_getaffinity(0))}


def _in_a_fresh_process(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (reserving changes the whole process's affinity) and
    return the JSON it prints last."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_reserved_timing_core_is_left_to_the_timing_thread():
    allowed = os.sched_getaffinity(0)
    last = max(allowed)
    if len(allowed - pinning.siblings(last)) < 1:
        pytest.skip("every core of this machine shares the last core's physical core: nothing would be left")
    out = _in_a_fresh_process("""
        import json, os, threading
        from pytest_kcoral.timing import pinning

        started = threading.Event()
        stop = threading.Event()
        thread = threading.Thread(target=lambda: (started.set(), stop.wait()))
        thread.start()  # a thread that existed before the reservation loses the core too
        started.wait()
        reserved = pinning.reserve([0], "auto", min_left=1)
        core = pinning.choose(0)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a process started afterwards inherits the reservation
            os.write(write, json.dumps(sorted(os.sched_getaffinity(0))).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = json.loads(os.read(read, 1 << 16))
        with pinning.pinned(core) as ok:
            inside = sorted(os.sched_getaffinity(0))
        after = sorted(os.sched_getaffinity(0))
        other = sorted(os.sched_getaffinity(thread.native_id))
        stop.set()
        thread.join()
        print(json.dumps({"reserved": sorted(reserved), "core": core, "child": child, "pinned": ok,
                          "inside": inside, "after": after, "other_thread": other}))
    """)
    assert out["core"] == last and last in out["reserved"]
    assert set(out["reserved"]) == set(pinning.siblings(last)) & allowed
    left = sorted(allowed - set(out["reserved"]))
    assert out["child"] == left and out["after"] == left and out["other_thread"] == left
    assert out["pinned"] and out["inside"] == [last], "the timing thread may still pin to the reserved core"


def test_nothing_reserved_when_too_few_cores_would_be_left_or_pinning_is_off():
    out = _in_a_fresh_process(f"""
        import json, os
        from pytest_kcoral.timing import pinning

        before = sorted(os.sched_getaffinity(0))
        too_few = pinning.reserve([0], "auto", min_left={len(os.sched_getaffinity(0)) + 1})
        off = pinning.reserve([0], "off", min_left=1)
        cpu = pinning.reserve([None], "auto", min_left=1)
        print(json.dumps({{"reserved": [sorted(too_few), sorted(off), sorted(cpu)], "same": sorted(os.sched_getaffinity(0)) == before}}))
    """)
    assert out == {"reserved": [[], [], []], "same": True}


def test_no_pinning_on_a_cpu_device_or_when_off():
    assert pinning.choose(None) is None
    assert pinning.choose(0, "off") is None


def test_an_explicit_core_must_be_ours():
    allowed = sorted(os.sched_getaffinity(0))
    assert pinning.choose(0, str(allowed[0])) == allowed[0]
    with pytest.raises(ValueError, match="not one of this process's cores"):
        pinning.choose(0, str(max(allowed) + 1000))


def test_pinned_runs_the_body_on_the_core_and_restores_the_affinity():
    before = os.sched_getaffinity(0)
    core = sorted(before)[-1]
    with pinning.pinned(core) as ok:
        assert ok
        assert os.sched_getaffinity(0) == {core}
    assert os.sched_getaffinity(0) == before
    with pinning.pinned(None) as ok:
        assert not ok
        assert os.sched_getaffinity(0) == before


def test_a_core_we_may_not_use_times_unpinned():
    before = os.sched_getaffinity(0)
    with pinning.pinned(max(before) + 1000) as ok:
        assert not ok
    assert os.sched_getaffinity(0) == before


def test_bad_timing_cpu_option_is_a_usage_error(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "kcoral", "--kcoral-timing-cpu", "fast")
    result.stderr.fnmatch_lines(["*--kcoral-timing-cpu must be auto, off or a core number, not 'fast'*"])


def test_a_core_outside_the_affinity_is_a_usage_error(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "kcoral", "--kcoral-timing-cpu", str(max(os.sched_getaffinity(0)) + 1000))
    result.stderr.fnmatch_lines(["*--kcoral-timing-cpu *: not one of this process's cores*"])
