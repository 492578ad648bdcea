"""Timing: one interface over the CUPTI, CUDA-events and wall-clock timers.

``measure`` is what the stage runner calls inside a child process (the candidate's, or the
trusted baseline's); ``benchmark`` is the public wrapper (``pytest_kcoral.benchmark``). Both
measure the same way:

1. one untimed call (JIT, autotune, lazy loading);
2. warm-up calls for ``warmup_s`` seconds;
3. a calibration of the harness itself: empty calls through the same window;
4. timed calls, rotating through the input sets, until the relative standard error of the median
   is under ``rse_target`` or ``budget_s`` runs out (``min_samples``/``max_samples`` bound it).

The garbage collector is off from the first call to the last (as in ``timeit``). The reported
median is ``stats.grouped_median``: a GPU timer's samples come in steps, and it places the median
within its step.

Before every call (warm-up included, so warm-up looks like timing): the persisting-L2 limit is
reset and L2 is flushed by a read, outside the window. Before every timed call ``refresh(i)``
gives input set ``i`` fresh values; after it ``on_output(i, out)`` sees the output; both are
outside the window.

A call's time is the GPU span (CUPTI), the synchronized event span (events) or the host time
(wall). Its host time (the saved ``perf_counter`` around the call and the device-wide synchronize
that closes the window) is recorded beside it. When the host time, less the harness's own
overhead, exceeds the GPU span by more than the span itself plus ``host_slack_us``, the call is
host-bound: its time is the host time (never less than the span), ``host_bound`` is set and the
``host_bound`` flag raised. The method stays the timer's, so baseline and candidate remain
comparable; see docs/performance.md.

Importing this package imports neither torch nor cupti. The stage runner calls ``prepare(device)``
before it imports a candidate, so every clock, synchronize and CUPTI entry point the timers use
was taken before candidate code could patch it.
"""

from __future__ import annotations

import gc
import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from pytest_kcoral.results import TIMER_METHODS, TimingStats
from pytest_kcoral.timing import clocks, guards, stats
from pytest_kcoral.timing.clocks import perf_counter as _perf_counter
from pytest_kcoral.timing.stats import RSE_TARGET

# Host time this far above the GPU span (beyond the span itself) makes a call host-bound. Triton's
# Python launcher alone took over 100 us for a 1.5 us kernel while another worker was busy
# (docs/performance.md, scaling), so the slack is well above a loaded host's launch cost; a call
# fed by host-to-device copies is host-bound whatever its slack.
HOST_SLACK_US = 250.0
HOST_TO_DEVICE_COPY = "memcpy:1"  # CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, as the CUPTI timer names it
LAUNCH_BOUND_BUSY_FRACTION = 0.5  # busy under this share of the span: flag the call launch-bound
_CALIBRATION_CALLS = 10
_CALIBRATE_EVERY = 4  # one empty window after every this many timed calls
_FIRST_CHECK = 20  # fewer samples than this never end the loop early

__all__ = [
    "HOST_SLACK_US",
    "RSE_TARGET",
    "TimerUnavailable",
    "available_methods",
    "benchmark",
    "measure",
    "prepare",
]


class TimerUnavailable(RuntimeError):
    """The requested timing method cannot run here (no CUDA, no cupti-python, CUPTI refused)."""

    kind = "timing"


def _is_cuda(device: Any) -> bool:
    return str(device).startswith("cuda")


def prepare(device: Any = "cpu") -> None:
    """Take the references the timers use; call before importing candidate code.

    On a CPU device it keeps torch's mode-stack functions (``guards``; the clocks were captured at
    import). On a CUDA device it also imports torch, cupti-python (when installed) and
    cuda-bindings, and keeps their entry points.
    """
    guards.capture_torch()
    if not _is_cuda(device):
        return
    refs = clocks.capture_torch()
    if not refs.cuda_available:
        return
    from pytest_kcoral.timing import cupti_timer, l2

    l2.capture_cudart()
    try:
        cupti_timer.capture_cupti()
    except cupti_timer.CuptiUnavailable:
        pass  # measure() falls back to events and says why


def available_methods(device: Any = None) -> list[str]:
    """Timing methods usable on ``device`` (default: the first GPU if any), best first."""
    refs = clocks.capture_torch()
    if device is None:
        device = "cuda" if refs.cuda_available else "cpu"
    if not _is_cuda(device) or not refs.cuda_available:
        return ["wall"]
    from pytest_kcoral.timing import cupti_timer

    methods = ["events", "wall"]
    try:
        cupti_timer.capture_cupti()
        methods.insert(0, "cupti")
    except cupti_timer.CuptiUnavailable:
        pass
    return methods


def measure(
    call: Callable[[int], Any],
    *,
    n_sets: int,
    refresh: Callable[[int], None] | None = None,
    on_output: Callable[[int, Any], None] | None = None,
    device: str = "cpu",
    method: str | None = None,
    warmup_s: float = 0.05,
    budget_s: float = 1.0,
    min_samples: int = 5,
    max_samples: int = 1000,
    flush_l2: bool = True,
    rse_target: float = RSE_TARGET,
    host_slack_us: float = HOST_SLACK_US,
    untrusted: bool = True,
) -> TimingStats:
    """Time ``call(i)`` for input sets ``i`` in ``range(n_sets)``, rotating through them.

    ``refresh(i)`` gives set ``i`` fresh values and runs outside the timed window, before every
    timed call. ``on_output(i, out)`` receives each timed call's output, also outside the window,
    so the caller can verify it. ``method`` forces a timer ("cupti", "events", "wall"); None picks
    the best one available for ``device``. A forced method that cannot run raises
    ``TimerUnavailable``; with ``method=None`` a CUPTI failure falls back to events and says so
    in ``flags``. ``untrusted`` (a graded candidate's callable): the loop refuses profile and
    trace hooks and torch modes (``guards``), and on a CPU a call's time is never less than the
    CPU time spent on it (``_at_least_cpu_time``); ``benchmark`` (a user's own code) sets it False.
    """
    if n_sets < 1:
        raise ValueError("n_sets must be at least 1")
    if method is not None and method not in TIMER_METHODS:
        raise ValueError(f"unknown timing method {method!r}; choose one of {', '.join(TIMER_METHODS)}")
    min_samples = max(1, min_samples)
    max_samples = max(min_samples, max_samples)
    loop: dict[str, Any] = dict(
        call=call, n_sets=n_sets, refresh=refresh, on_output=on_output, warmup_s=warmup_s,
        budget_s=budget_s, min_samples=min_samples, max_samples=max_samples,
        rse_target=rse_target, host_slack_us=host_slack_us, untrusted=untrusted,
    )

    if not _is_cuda(device):
        if method not in (None, "wall"):
            raise TimerUnavailable(
                f"timing method {method!r} needs a CUDA device, but this item runs on {device!r}"
            )
        from pytest_kcoral.timing.timers import WallTimer

        return _sample(WallTimer(None, cpu_clock=guards.thread_cpu_s if untrusted else None), sync=None, flusher=None, flags=[], **loop)

    refs = clocks.capture_torch()
    if not refs.cuda_available:
        raise TimerUnavailable(f"device {device!r} requested but CUDA is not available in this process")
    prepare(device)
    torch = refs.torch
    from pytest_kcoral.timing.cupti_timer import CuptiTimer, CuptiUnavailable
    from pytest_kcoral.timing.l2 import L2Flusher
    from pytest_kcoral.timing.timers import EventsTimer, WallTimer

    with torch.cuda.device(torch.device(device)):
        flags: list[str] = []
        flusher = None
        if flush_l2:
            flusher = L2Flusher(torch, torch.device(device))
            flags.append(f"l2_flush=read:{flusher.buffer_bytes >> 20}MiB")
        else:
            flags.append("l2_flush=off")

        def run(timer: Any, run_flags: list[str]) -> TimingStats:
            stats_ = _sample(timer, sync=refs.synchronize, flusher=flusher, flags=run_flags, **loop)
            if flusher is not None:
                if flusher.persisting_reset_done:
                    stats_.flags.append("persisting_l2_reset")
                else:
                    stats_.flags.append(f"persisting_l2_reset_unavailable: {flusher.persisting.error}")
            return stats_

        if method in (None, "cupti"):
            busy = _profiler_active(torch)
            if busy is not None:
                # Taking CUPTI's callbacks from a running profiler starves it, and at its exit it
                # may flush through our callbacks while holding the GIL: leave CUPTI alone.
                if method == "cupti":
                    raise TimerUnavailable(f"CUPTI is in use: {busy}")
                flags.append(f"fallback_to_events: CUPTI is in use: {busy}")
                return run(EventsTimer(refs, torch.device(device)), flags)
            try:
                return run(CuptiTimer(refs.synchronize), list(flags))
            except CuptiUnavailable as exc:
                if method == "cupti":
                    raise TimerUnavailable(str(exc)) from exc
                flags.append(f"fallback_to_events: {exc}")
        if method in (None, "events"):
            return run(EventsTimer(refs, torch.device(device)), flags)
        return run(WallTimer(refs), flags)


def _profiler_active(torch: Any) -> str | None:
    """Why CUPTI is busy in this process (a torch profiler is running), or None."""
    try:
        if torch.autograd.profiler._is_profiler_enabled:
            return "a torch profiler is running"
    except Exception:  # noqa: BLE001 - a private attribute: absence means we cannot tell
        pass
    try:
        if torch._C._autograd._profiler_enabled():
            return "a torch profiler is running"
    except Exception:  # noqa: BLE001
        pass
    return None


def _sample(
    timer: Any,
    *,
    sync: Callable[[], None] | None,
    flusher: Callable[[], None] | None,
    flags: list[str],
    call: Callable[[int], Any],
    n_sets: int,
    refresh: Callable[[int], None] | None,
    on_output: Callable[[int, Any], None] | None,
    warmup_s: float,
    budget_s: float,
    min_samples: int,
    max_samples: int,
    rse_target: float,
    host_slack_us: float,
    untrusted: bool = True,
) -> TimingStats:
    perf = _perf_counter
    sync_first = timer.sync_before_window and sync is not None
    roles: list[str] = []  # one per window: "first", "warmup", "empty", "timed"
    host_us: list[float] = []  # per window
    outside_us: list[float] = []  # per timed call: its turn's host time outside the window
    direct_us: list[Any] = []  # per window: the events spans (stream, synchronized); None for CUPTI and wall

    def window(fn: Callable[[int], Any], k: int, role: str) -> Any:
        if untrusted and role == "empty":
            # a hook the candidate installed would run inside the calibration, whose time is
            # subtracted from every call: named and refused, and taken off in any case
            guards.refuse_hooks("before a calibration window")
            guards.clear_profile_and_trace()
        if flusher is not None:
            flusher()
        if sync_first and sync is not None:
            sync()
        h0 = perf()
        token = timer.open_window()
        out = fn(k)
        direct = timer.close_window(token)
        h1 = perf()
        roles.append(role)
        host_us.append((h1 - h0) * 1e6)
        direct_us.append(direct)
        return out

    def empty(_k: int) -> None:
        return None

    # As timeit does: a collection inside a window would charge the call for the harness's garbage.
    # No gc.collect() first: with torch loaded it takes about 0.1 s, and an item measures 8 times.
    gc_was_enabled = gc.isenabled()
    if untrusted:
        guards.refuse_hooks("before the first call")
    gc.disable()
    timer.start()
    try:
        window(call, 0, "first")
        i = 0
        warm_until = perf() + warmup_s
        while True:
            window(call, i % n_sets, "warmup")
            i += 1
            if perf() >= warm_until:
                break
        # The harness's own cost (synchronize wake-up, event record) drifts with clocks and load,
        # so besides these empty calls one more runs after every few timed calls.
        for _ in range(_CALIBRATION_CALLS):
            window(empty, 0, "empty")

        deadline = perf() + budget_s
        # the CPU time of the process's other threads (and reaped children) over the timed calls
        other_cpu_start = guards.other_cpu_s() if getattr(timer, "counts_cpu", False) else None
        loop_started = perf()
        n = 0
        next_check = max(min_samples, _FIRST_CHECK)
        converged = False
        while n < max_samples:
            k = (i + n) % n_sets
            loop_start = perf()
            # the last output goes first: what its freeing sets off (a candidate's finalizer) runs
            # before the next inputs exist, within this turn's account, and never between a
            # window and the check of that window's output
            out = None
            if refresh is not None:
                refresh(k)
            out = window(call, k, "timed")
            if on_output is not None:
                on_output(k, out)
            # what the call's turn took beyond its window: the refresh, the flush, the drop of the
            # last output, the output's check; the same harness on both sides, so a candidate's
            # excess is work done where it is not timed (``outside_window_excess``)
            outside_us.append((perf() - loop_start) * 1e6 - host_us[-1])
            n += 1
            if n % _CALIBRATE_EVERY == 0:
                window(empty, 0, "empty")
            if n >= min_samples and perf() >= deadline:
                break
            if n >= next_check:
                next_check = n + max(5, n // 4)
                values = _per_call_times(timer, roles, host_us, direct_us, interim=True)[0]
                if stats.rse_of_median(sorted(values)) < rse_target:
                    converged = True
                    break
        if untrusted:
            guards.refuse_hooks("after the last call")
        other_cpu_us = None
        if other_cpu_start is not None:
            other_cpu_us = (guards.other_cpu_s() - other_cpu_start) * 1e6
            if other_cpu_us <= OTHER_CPU_NOISE_SHARE * (perf() - loop_started) * 1e6:
                other_cpu_us = 0.0  # noise of the process's clock, not work (``OTHER_CPU_NOISE_SHARE``)
        records = timer.stop()
    except BaseException:
        timer.stop_quietly()
        raise
    finally:
        if gc_was_enabled:
            gc.enable()

    times, extra = _per_call_times(timer, roles, host_us, direct_us, records=records,
                                   host_slack_us=host_slack_us, flags=flags, other_cpu_us=other_cpu_us)
    ordered = sorted(times)
    rse = stats.rse_of_median(ordered)
    if not converged and not rse < rse_target:
        flags.append(f"rse_target_missed: {rse:.4f} >= {rse_target} after {len(times)} samples")
    return TimingStats(
        method=timer.method,
        median_us=stats.grouped_median(ordered),
        iqr_us=stats.iqr(ordered),
        min_us=ordered[0],
        n=len(ordered),
        rse=rse if math.isfinite(rse) else 0.0,
        flags=flags,
        samples_us=times,
        outside_us=stats.median(sorted(outside_us)) if outside_us else None,
        **extra,
    )


def _per_call_times(
    timer: Any,
    roles: list[str],
    host_us: list[float],
    direct_us: list[Any],
    *,
    interim: bool = False,
    records: Any = None,
    host_slack_us: float = HOST_SLACK_US,
    flags: list[str] | None = None,
    other_cpu_us: float | None = None,
) -> tuple[list[float], dict[str, Any]]:
    """Per timed call: the time and (final pass) the host-bound check and CUPTI's extras."""
    timed = [j for j, r in enumerate(roles) if r == "timed"]
    empties = sorted(host_us[j] for j, r in enumerate(roles) if r == "empty")
    host_overhead_us = stats.median(empties) if empties else 0.0
    extra: dict[str, Any] = {}

    if timer.method == "cupti":
        if interim:
            records = timer.interim()
        primary = [records[j].span_us for j in timed]
    elif timer.method == "events":
        primary = _events_times(direct_us, roles, timed, flags)
    else:
        primary = [max(0.0, host_us[j] - host_overhead_us) for j in timed]
        if other_cpu_us is not None and timed and not interim:  # ``WallTimer``'s cpu_clock: CPU times too
            assert flags is not None
            primary = _at_least_cpu_time(primary, direct_us, roles, timed, other_cpu_us, flags)
    if interim:
        return primary, extra

    host_timed = [host_us[j] for j in timed]
    extra["host_median_us"] = stats.median(sorted(host_timed))
    span_median = stats.median(sorted(primary))  # the GPU's own figure, before any host-bound rule
    if timer.method in ("cupti", "events"):
        host_minus_overhead = [h - host_overhead_us for h in host_timed]
        unaccounted = sorted(h - p for h, p in zip(host_minus_overhead, primary))
        # computed on the host and copied in: the copy is all CUPTI sees of the work
        fed_from_host = timer.method == "cupti" and any(records[j].work.get(HOST_TO_DEVICE_COPY) for j in timed)
        if fed_from_host or stats.median(unaccounted) > span_median + host_slack_us:
            extra["host_bound"] = True
            assert flags is not None
            why = "the calls copy data from the host" if fed_from_host else "far above the GPU span"
            flags.append(
                f"host_bound: host time {extra['host_median_us']:.1f} us (harness overhead "
                f"{host_overhead_us:.1f} us), GPU span {span_median:.1f} us; {why}; "
                "timed by the host clock"
            )
            primary = [max(p, h) for p, h in zip(primary, host_minus_overhead)]

    if timer.method == "cupti":
        extra["busy_us"] = stats.median(sorted(records[j].busy_us for j in timed))
        extra["records"] = int(round(stats.median(sorted(records[j].records for j in timed))))
        assert flags is not None
        if span_median > 0 and extra["busy_us"] < LAUNCH_BOUND_BUSY_FRACTION * span_median:
            # information, not a verdict: such a span moves with the host's launch speed, by tens
            # of percent within seconds on the H200 host (docs/performance.md, process noise)
            flags.append(f"launch_bound: the GPU was busy {extra['busy_us']:.1f} us of a {span_median:.1f} us span; "
                         "the rest is launch gaps, whose length follows the host's speed")
        later = [records[j].work for j, r in enumerate(roles) if r in ("warmup", "timed")]
        same = all(w == later[0] for w in later)
        extra["same_work_every_call"] = same
        if not same:
            flags.append("work_differs_between_calls: " + _describe_work_change(later))
        first = [records[j].work for j, r in enumerate(roles) if r == "first"]
        if first and sum(first[0].values()) > 0 and all(sum(w.values()) == 0 for w in later):
            flags.append("no_gpu_work_after_first_call")
    return primary, extra


# CPU time this much above the wall time (and 1 us) says more than one core worked on the calls
CPU_ABOVE_WALL_FLAG = 1.1
# The other threads' CPU time over the timed loop counts only above this share of the loop's wall
# time. A single-threaded baseline's child once read 3.6 ms of it (about one scheduler tick; the
# source was not found) in a loop of some hundreds of ms, which spread over its 8.7 us calls
# looked like a second core. Work in other threads under this share goes uncharged; the leftovers
# audit judges threads that work between calls.
OTHER_CPU_NOISE_SHARE = 0.05


def _at_least_cpu_time(wall: list[float], thread_cpu_us: list[Any], roles: list[str], timed: list[int], other_cpu_us: float,
                       flags: list[str]) -> list[float]:
    """On a CPU, each timed call's wall time or, when larger, its CPU time: the timing thread's
    own in the call's window (less the empty windows' median), plus an even share of what the
    process's other threads and the children it reaped spent during the timed calls. Extra
    threads or processes earn nothing; a single thread's CPU time is never above its wall time,
    so honest single-threaded calls read as before.

    The other threads' time is taken over the whole loop, not per window: the kernel folds a
    thread running on another core into the process's CPU clock only at its scheduler ticks
    (4 ms apart at 250 Hz), so one window's figure jumps, while the loop's total holds."""
    empties = sorted(thread_cpu_us[j] for j, r in enumerate(roles) if r == "empty")
    overhead_us = stats.median(empties) if empties else 0.0
    share_us = max(0.0, other_cpu_us) / len(timed)
    cpu = [max(0.0, thread_cpu_us[j] - overhead_us) + share_us for j in timed]
    wall_median, cpu_median = stats.median(sorted(wall)), stats.median(sorted(cpu))
    if cpu_median > CPU_ABOVE_WALL_FLAG * wall_median + 1.0:
        flags.append(f"cpu_time_above_wall: the calls took {cpu_median:.1f} us of CPU time in {wall_median:.1f} us of wall time,"
                     f" {share_us:.1f} us of it in other threads or processes: timed by the CPU time")
    return [max(w, c) for w, c in zip(wall, cpu)]


def _describe_work_change(works: Sequence[Counter]) -> str:
    distinct: list[Counter] = []
    for w in works:
        if w not in distinct:
            distinct.append(w)
    shown = [", ".join(f"{name} x{count}" for name, count in sorted(w.items())) or "no GPU work"
             for w in distinct[:2]]
    return f"{len(distinct)} distinct kernel sets, e.g. [{shown[0]}] vs [{shown[1]}]"


def benchmark(
    fn: Callable[..., Any],
    *args: Any,
    input_sets: Sequence[Sequence[Any]] | None = None,
    refresh: Callable[[int], None] | None = None,
    on_output: Callable[[int, Any], None] | None = None,
    method: str | None = None,
    budget_s: float = 1.0,
    warmup_s: float = 0.05,
    min_samples: int = 5,
    max_samples: int = 1000,
    flush_l2: bool = True,
    device: Any = None,
    rse_target: float = RSE_TARGET,
) -> dict[str, Any]:
    """Time ``fn`` the way the grader does and return the statistics as a dict.

    ``fn(*args)`` is called, or with ``input_sets`` (a list of argument tuples) ``fn(*input_sets[i])``
    rotating over the sets; ``refresh(i)`` may rewrite set ``i`` in place before each timed call.
    ``device`` defaults to the device of the first tensor argument (else the current GPU, else
    the CPU). Keys: those of ``TimingStats`` (``method``, ``median_us``, ``iqr_us``, ``min_us``,
    ``n``, ``rse``, ``busy_us``, ``records``, ``host_median_us``, ``host_bound``,
    ``same_work_every_call``, ``flags``, ``rounds``, and ``samples_us``: every timed call's time in
    call order) plus KCoral's ``latency_ms_median``, ``latency_ms_mean``, ``latency_ms_min``,
    ``latency_ms_max`` and ``latency_ms_iqr``.

    As ``kcoral.builtins.benchmark(fn, *tensors, cfg)``, a last positional argument that is a dict
    of KCoral's settings only (``KCORAL_SETTINGS``) configures the timing instead of reaching
    ``fn``: ``warmup_ms`` and ``repeat_ms`` (the warm-up and the sampling budget), ``warmup`` (that
    many untimed calls first), ``repeat`` (exactly that many timed calls, budget allowing) and
    ``flush_l2``.
    """
    if not callable(fn):
        raise TypeError(f"benchmark(fn, ...): fn must be callable, got {type(fn).__name__} {fn!r:.60}")
    warmup_calls = 0
    if args and isinstance(args[-1], dict) and args[-1] and set(args[-1]) <= KCORAL_SETTINGS:
        cfg, args = args[-1], args[:-1]
        warmup_s = cfg["warmup_ms"] / 1e3 if "warmup_ms" in cfg else warmup_s
        budget_s = cfg["repeat_ms"] / 1e3 if "repeat_ms" in cfg else budget_s
        flush_l2 = bool(cfg.get("flush_l2", flush_l2))
        warmup_calls = int(cfg.get("warmup", 0))
        if "repeat" in cfg:
            min_samples = max_samples = max(1, int(cfg["repeat"]))
    sets = [tuple(s) for s in input_sets] if input_sets is not None else [tuple(args)]
    if input_sets is not None and args:
        raise TypeError("pass the inputs either as positional arguments or as input_sets, not both")
    if not sets:
        raise ValueError("input_sets is empty")
    if device is None:
        device = _infer_device(sets[0])
    prepare(device)

    def call(i: int) -> Any:
        return fn(*sets[i])

    for i in range(warmup_calls):  # before the timer's own first call and warm-up by time
        call(i % len(sets))
    result = measure(
        call, n_sets=len(sets), refresh=refresh, on_output=on_output, device=str(device),
        method=method, warmup_s=warmup_s, budget_s=budget_s, min_samples=min_samples,
        max_samples=max_samples, flush_l2=flush_l2, rse_target=rse_target, untrusted=False,
    ).to_dict()
    result["latency_ms_median"] = result["median_us"] / 1e3
    result["latency_ms_min"] = result["min_us"] / 1e3
    result["latency_ms_iqr"] = result["iqr_us"] / 1e3
    samples = result.get("samples_us") or [result["median_us"]]
    result["latency_ms_mean"] = statistics.fmean(samples) / 1e3
    result["latency_ms_max"] = max(samples) / 1e3
    return result


# The settings of ``kcoral.builtins.benchmark``'s trailing configuration dict (see ``benchmark``)
KCORAL_SETTINGS = frozenset({"warmup_ms", "repeat_ms", "warmup", "repeat", "flush_l2"})


def _infer_device(args: Sequence[Any]) -> str:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        for a in args:
            if isinstance(a, torch.Tensor):
                return str(a.device)
        if clocks.capture_torch().cuda_available:
            return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _events_times(direct_us: list[Any], roles: list[str], timed: list[int], flags: list[str] | None) -> list[float]:
    """Per timed call: the stream-ordered event span, or the synchronized one when the call left
    work on another stream or in a thread (see ``timers.EventsTimer``).

    Both carry costs of the harness, measured with empty windows in the same process and
    subtracted: the synchronized span the host's wake-up, the stream-ordered span the GPU's own
    processing of the end event. The latter was 2.9 us between two consecutive events on a two-GPU
    H200 host, where an 11.8 us add (CUPTI) read 15.9 us by events (docs/performance.md)."""
    from pytest_kcoral.timing.timers import side_work_detected

    empty = [j for j, r in enumerate(roles) if r == "empty"]
    bias_us = stats.median(sorted(direct_us[j][1] for j in empty))
    stream_bias_us = stats.median(sorted(direct_us[j][0] for j in empty))
    stream = [max(0.0, direct_us[j][0] - stream_bias_us) for j in timed]
    synced = [max(0.0, direct_us[j][1] - bias_us) for j in timed]
    stream_median, sync_median = stats.median(sorted(stream)), stats.median(sorted(synced))
    side_work = side_work_detected(stream_median, sync_median)
    if flags is not None:
        flags.append(f"events_sync_bias_subtracted_us={bias_us:.2f}")
        flags.append(f"events_stream_bias_subtracted_us={stream_bias_us:.2f}")
        flags.append(f"events_spans_us: stream {stream_median:.2f}, synchronized {sync_median:.2f}")
        if side_work:
            flags.append("events_side_work: the call left work on another stream or in a thread; "
                         "timed by the synchronized span")
    # never less than the stream-ordered span: the bias estimate must not make a call look faster
    return [max(a, b) for a, b in zip(stream, synced)] if side_work else stream
