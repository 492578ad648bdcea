"""The CPU core GPU timing runs on: chosen per device in the parent, applied in the child."""

from __future__ import annotations

import os

import pytest

from pytest_kcoral.timing import pinning

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity (Linux)")


def test_each_gpu_gets_its_own_core_counted_from_the_last():
    allowed = sorted(os.sched_getaffinity(0))
    assert pinning.choose("cuda:0") == allowed[-1]
    assert pinning.choose("cuda") == allowed[-1]
    if len(allowed) > 1:
        assert pinning.choose("cuda:1") == allowed[-2]
    # more GPUs than cores wraps around rather than failing
    assert pinning.choose(f"cuda:{len(allowed)}") == allowed[-1]


def test_no_pinning_on_a_cpu_device_or_when_off():
    assert pinning.choose("cpu") is None
    assert pinning.choose("cuda:0", "off") is None


def test_an_explicit_core_must_be_ours():
    allowed = sorted(os.sched_getaffinity(0))
    assert pinning.choose("cuda:0", str(allowed[0])) == allowed[0]
    with pytest.raises(ValueError, match="not one of this process's cores"):
        pinning.choose("cuda:0", str(max(allowed) + 1000))


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
