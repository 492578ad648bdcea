"""The timing module on a GPU: CUPTI attribution, side streams, host-bound calls, the events fallback.

Run on a GPU machine; every test skips with a reason elsewhere.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from pytest_kcoral import timing  # noqa: E402
from pytest_kcoral.timing.timers import MAX_GPU_SLEEP_US  # noqa: E402

timing.prepare("cuda")  # as the stage runner does, before any candidate-style code runs


def _has_cupti() -> bool:
    return "cupti" in timing.available_methods("cuda")


needs_cupti = pytest.mark.skipif(not _has_cupti(), reason="cupti-python is not usable here")


def add_inputs(n: int, sets: int = 3) -> list[tuple]:
    return [(torch.randn(n, device="cuda"), torch.randn(n, device="cuda"),
             torch.empty(n, device="cuda")) for _ in range(sets)]


def add_call(sets: list[tuple]):
    def call(i: int):
        a, b, out = sets[i]
        return torch.add(a, b, out=out)
    return call


@needs_cupti
def test_cupti_is_the_default_and_reports_its_records() -> None:
    sets = add_inputs(1 << 24)
    result = timing.measure(add_call(sets), n_sets=3, device="cuda", budget_s=0.5)
    assert result.method == "cupti"
    assert result.records == 1
    assert result.same_work_every_call is True
    assert result.host_bound is False
    # 2^24 fp32 add moves 201 MB: between 30 us (6.7 TB/s) and 150 us on any datacenter GPU.
    assert 30 < result.median_us < 150, result
    assert result.busy_us == pytest.approx(result.median_us, rel=0.05)
    assert "persisting_l2_reset" in result.flags, result.flags
    assert any(f.startswith("l2_flush=read") for f in result.flags)


@needs_cupti
def test_tiny_launch_bound_kernel_is_not_host_bound() -> None:
    sets = add_inputs(1 << 10)
    result = timing.measure(add_call(sets), n_sets=3, device="cuda", budget_s=0.3)
    assert result.method == "cupti"
    assert result.host_bound is False, result.flags
    assert result.median_us < 10


def _side_stream_work(on_side: bool):
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    out = torch.empty(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def call(i: int):
        if on_side:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.mm(a, b, out=out)  # never joined back to the current stream
        else:
            torch.mm(a, b, out=out)
        return out
    return call


@pytest.mark.parametrize("method", [pytest.param("cupti", marks=needs_cupti), "events"])
def test_kernel_on_a_side_stream_is_counted(method: str) -> None:
    main = timing.measure(_side_stream_work(False), n_sets=1, device="cuda", method=method,
                          budget_s=0.5)
    side = timing.measure(_side_stream_work(True), n_sets=1, device="cuda", method=method,
                          budget_s=0.5)
    assert main.median_us > 500  # a 4096^3 fp32 matmul
    assert side.median_us == pytest.approx(main.median_us, rel=0.1), (main, side)


@pytest.mark.parametrize("method", [pytest.param("cupti", marks=needs_cupti), "events"])
def test_host_compute_plus_copy_is_not_credited_with_the_copy_time(method: str) -> None:
    n = 1 << 16
    src = torch.randn(n)
    dst = torch.empty(n, device="cuda")

    def call(i: int):
        end = time.perf_counter() + 0.003  # 3 ms of "host compute"
        while time.perf_counter() < end:
            pass
        return dst.copy_(src)  # a 256 KB copy: a few microseconds on the GPU

    result = timing.measure(call, n_sets=1, device="cuda", method=method, budget_s=0.5)
    # Events: the busy-wait in front of the start event hides the host's time up to its own length
    # (at most MAX_GPU_SLEEP_US), as it should for the launch of a call's first kernel; the rest
    # of the host compute is in the span.
    hidden_us = MAX_GPU_SLEEP_US if method == "events" else 0.0
    assert result.median_us >= 2900 - hidden_us, result
    if method == "cupti":
        # CUPTI sees only the copy; the host clock catches the rest.
        assert result.busy_us < 200
        assert result.host_bound is True, result
        assert any(f.startswith("host_bound") for f in result.flags)
    # With events the GPU sat idle between the start event and the copy: the span already holds it.


@needs_cupti
def test_short_host_compute_fed_by_a_copy_is_host_bound():
    # 60 us of "host compute", well inside the slack, then a 4 KB copy: the copy gives it away
    src = torch.randn(1024)
    dst = torch.empty(1024, device="cuda")

    def call(i: int):
        end = time.perf_counter() + 60e-6
        while time.perf_counter() < end:
            pass
        return dst.copy_(src)

    result = timing.measure(call, n_sets=1, device="cuda", method="cupti", budget_s=0.3)
    assert result.host_bound is True, result
    assert result.median_us >= 55, result
    assert any("the calls copy data from the host" in f for f in result.flags), result.flags


@needs_cupti
@pytest.mark.parametrize("n", [1 << 22, 1 << 24, 1 << 26])
def test_events_fallback_is_like_for_like(n: int) -> None:
    sets = add_inputs(n)
    cupti = timing.measure(add_call(sets), n_sets=3, device="cuda", method="cupti", budget_s=0.4)
    events = timing.measure(add_call(sets), n_sets=3, device="cuda", method="events", budget_s=0.4)
    assert events.method == "events"
    assert any(f.startswith("events_sync_bias_subtracted_us") for f in events.flags)
    # events carry a fixed cost CUPTI's kernel records do not; the harness subtracts it
    # (docs/performance.md, "The events' own cost: confirmed")
    assert abs(events.median_us - cupti.median_us) <= max(0.1 * cupti.median_us, 3.0), (cupti, events)


def test_events_without_cupti_still_work_with_patched_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    sets = add_inputs(1 << 24)
    honest = timing.measure(add_call(sets), n_sets=3, device="cuda", method="events", budget_s=0.3)
    # A candidate that makes synchronize a no-op and events report nothing, after prepare().
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, other: 0.001)
    patched = timing.measure(add_call(sets), n_sets=3, device="cuda", method="events", budget_s=0.3)
    assert patched.median_us == pytest.approx(honest.median_us, rel=0.15)


@needs_cupti
def test_work_skipped_after_a_few_calls_is_detected() -> None:
    sets = add_inputs(1 << 20)
    cache: dict[int, torch.Tensor] = {}

    def call(i: int):
        a, b, out = sets[i]
        key = a.data_ptr()
        if key not in cache:  # a pointer-keyed cache
            cache[key] = torch.add(a, b, out=out)
        return cache[key]

    result = timing.measure(call, n_sets=3, device="cuda", budget_s=0.3)
    assert result.same_work_every_call is False
    assert any(f.startswith("work_differs_between_calls") for f in result.flags)


@needs_cupti
def test_cupti_works_again_after_another_profiler_took_the_callbacks() -> None:
    sets = add_inputs(1 << 22)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        add_call(sets)(0)
        torch.cuda.synchronize()
    assert prof.key_averages()  # the profiler really collected through CUPTI
    result = timing.measure(add_call(sets), n_sets=3, device="cuda", budget_s=0.3)
    assert result.method == "cupti", result.flags
    assert result.records == 1


@needs_cupti
def test_measure_inside_another_profiler_leaves_cupti_alone() -> None:
    # In a child process, so that a profiler fight could not take this session down.
    code = """
import torch
from pytest_kcoral import timing
timing.prepare("cuda")
a = torch.randn(1 << 22, device="cuda")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    r = timing.measure(lambda i: torch.sin(a), n_sets=1, device="cuda", budget_s=0.2)
print("INSIDE", r.method, [f for f in r.flags if f.startswith("fallback")])
assert prof.key_averages()
r = timing.measure(lambda i: torch.sin(a), n_sets=1, device="cuda", budget_s=0.2)
print("AFTER", r.method, r.records)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "INSIDE events ['fallback_to_events: CUPTI is in use: a torch profiler is running']" in out.stdout
    assert "AFTER cupti 1" in out.stdout, out.stdout


def test_benchmark_on_gpu() -> None:
    a = torch.randn(1 << 22, device="cuda")
    result = timing.benchmark(torch.sin, a, budget_s=0.3)
    assert result["method"] in ("cupti", "events")
    assert 0 < result["latency_ms_median"] < 1
    wall = timing.benchmark(torch.sin, a, budget_s=0.3, method="wall")
    assert wall["method"] == "wall"
