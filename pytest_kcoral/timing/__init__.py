"""Timing: one interface over the CUPTI, CUDA-events and wall-clock timers.

``measure`` is what the stage runner calls inside a child process (the candidate's, or the
trusted baseline's); ``benchmark`` is the public wrapper (``pytest_kcoral.benchmark``). Both
measure the same way:

1. one untimed call (JIT, autotune, lazy loading);
2. warm-up calls for ``warmup_s`` seconds, at least one; none when ``warmup_s`` is 0 and the
   first call took ``budget_s`` or longer (such a call is its own warm-up);
3. a calibration of the harness itself: empty calls through the same window;
4. timed calls, rotating through the input sets, until the relative standard error of the median
   is under ``rse_target`` or ``budget_s`` runs out (``min_samples``/``max_samples`` bound it).
   With ``budget_cap`` (the grader's ``BUDGET_CAP``), the calls stop past that many times the
   budget, however few: a call much longer than the budget is timed once or twice a round, not
   ``min_samples`` times.

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
from collections.abc import Callable, Sequence
from typing import Any

from pytest_kcoral.results import TIMER_METHODS, TimingStats
from pytest_kcoral.timing import clocks, guards, stats
from pytest_kcoral.timing.clocks import perf_counter as _perf_counter
from pytest_kcoral.timing.per_call import HOST_SLACK_US, per_call_times
from pytest_kcoral.timing.stats import RSE_TARGET
from pytest_kcoral.timing_flags import Flag, flag

_CALIBRATION_CALLS = 10
_CALIBRATE_EVERY = 4  # one empty window after every this many timed calls
_FIRST_CHECK = 20  # fewer samples than this never end the loop early
# The grader's rounds stop their timed calls past this many times their budget, even short of
# ``min_samples``: an item's precision comes from its rounds, and a call as long as a round
# needs no five of it in each.
BUDGET_CAP = 2.0
# The samples added before the next check, as a share of those taken, by timer: a check under
# CUPTI forces a flush (about half a millisecond on an H200), so its checks come at doubling
# counts; the others' are cheap and come often, which ends a steady round soon after it could.
_CHECK_GROWTH = {"cupti": 1.0}
_CHECK_GROWTH_DEFAULT = 0.25

# ``refresh(i)``: set ``i``'s fresh values; it may return the microseconds spent in another process
Refresh = Callable[[int], "float | None"]

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
    refresh: Refresh | None = None,
    on_output: Callable[[int, Any], None] | None = None,
    device: str = "cpu",
    method: str | None = None,
    warmup_s: float = 0.05,
    budget_s: float = 1.0,
    min_samples: int = 5,
    max_samples: int = 1000,
    budget_cap: float = math.inf,
    flush_l2: bool = True,
    rse_target: float = RSE_TARGET,
    host_slack_us: float = HOST_SLACK_US,
    untrusted: bool = True,
) -> TimingStats:
    """Time ``call(i)`` for input sets ``i`` in ``range(n_sets)``, rotating through them.

    ``refresh(i)`` gives set ``i`` fresh values and runs outside the timed window, before every
    timed call; it may return the microseconds of it spent waiting for another process (the
    trusted child's feed), which are not the call's time outside its window. ``on_output(i, out)`` receives each timed call's output, also outside the window,
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
        budget_s=budget_s, min_samples=min_samples, max_samples=max_samples, budget_cap=budget_cap,
        rse_target=rse_target, host_slack_us=host_slack_us, untrusted=untrusted,
    )

    if not _is_cuda(device):
        if method not in (None, "wall"):
            raise TimerUnavailable(
                f"timing method {method!r} needs a CUDA device, but this item runs on {device!r}"
            )
        from pytest_kcoral.timing.timers import WallTimer

        return _sample(WallTimer(None, cpu_clock=guards.thread_cpu_s if untrusted else None), sync=None, flusher=None, flags=[], **loop)

    return _measure_cuda(loop, device, method, flush_l2)


def _measure_cuda(loop: dict[str, Any], device: str, method: str | None, flush_l2: bool) -> TimingStats:
    """``measure`` on a CUDA device: CUPTI, else CUDA events (saying why), else the wall clock."""
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
            flags.append(flag(Flag.L2_FLUSH, f"read:{flusher.buffer_bytes >> 20}MiB"))
        else:
            flags.append(flag(Flag.L2_FLUSH, "off"))

        def run(timer: Any, run_flags: list[str]) -> TimingStats:
            stats_ = _sample(timer, sync=refs.synchronize, flusher=flusher, flags=run_flags, **loop)
            if flusher is not None:
                if flusher.persisting_reset_done:
                    stats_.flags.append(flag(Flag.PERSISTING_L2_RESET))
                else:
                    stats_.flags.append(flag(Flag.PERSISTING_L2_RESET_UNAVAILABLE, note=str(flusher.persisting.error)))
            return stats_

        if method in (None, "cupti"):
            busy = _profiler_active(torch)
            if busy is not None:
                # Taking CUPTI's callbacks from a running profiler starves it, and at its exit it
                # may flush through our callbacks while holding the GIL: leave CUPTI alone.
                if method == "cupti":
                    raise TimerUnavailable(f"CUPTI is in use: {busy}")
                flags.append(flag(Flag.FALLBACK_TO_EVENTS, note=f"CUPTI is in use: {busy}"))
                return run(EventsTimer(refs, torch.device(device)), flags)
            try:
                return run(CuptiTimer(refs.synchronize), list(flags))
            except CuptiUnavailable as exc:
                if method == "cupti":
                    raise TimerUnavailable(str(exc)) from exc
                flags.append(flag(Flag.FALLBACK_TO_EVENTS, note=str(exc)))
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
    refresh: Refresh | None,
    on_output: Callable[[int, Any], None] | None,
    warmup_s: float,
    budget_s: float,
    min_samples: int,
    max_samples: int,
    rse_target: float,
    host_slack_us: float,
    budget_cap: float = math.inf,
    untrusted: bool = True,
) -> TimingStats:
    perf = _perf_counter
    roles: list[str] = []  # one per window: "first", "warmup", "empty", "timed"
    host_us: list[float] = []  # per window
    outside_us: list[float] = []  # per timed call: its turn's host time outside the window
    direct_us: list[Any] = []  # per window: the events spans (stream, synchronized); None for CUPTI and wall
    window = _window_function(timer, sync, flusher, untrusted, roles, host_us, direct_us)

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
        while warmup_s > 0 or host_us[-1] < budget_s * 1e6:
            window(call, i % n_sets, "warmup")
            i += 1
            if perf() >= warm_until:
                break
        # The harness's own cost (synchronize wake-up, event record) drifts with clocks and load,
        # so besides these empty calls one more runs after every few timed calls.
        for _ in range(_CALIBRATION_CALLS):
            window(empty, 0, "empty")

        # the CPU time of the process's other threads (and reaped children) over the timed calls
        other_cpu_start = guards.other_cpu_s() if getattr(timer, "counts_cpu", False) else None
        loop_started = perf()
        converged = _timed_calls(window, empty, timer, call, i, n_sets, refresh, on_output, budget_s, min_samples, max_samples,
                                 budget_cap, rse_target, roles, host_us, direct_us, outside_us)
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

    return _sampled_stats(timer, roles, host_us, direct_us, outside_us, records, flags, host_slack_us=host_slack_us,
                          other_cpu_us=other_cpu_us, converged=converged, rse_target=rse_target)


def _sampled_stats(timer: Any, roles: list[str], host_us: list[float], direct_us: list[Any], outside_us: list[float], records: Any,
                   flags: list[str], *, host_slack_us: float, other_cpu_us: float | None, converged: bool, rse_target: float) -> TimingStats:
    """The statistics of a finished ``_sample``: each timed call's time, then their median and spread."""
    times, extra = per_call_times(timer, roles, host_us, direct_us, records=records,
                                   host_slack_us=host_slack_us, flags=flags, other_cpu_us=other_cpu_us)
    ordered = sorted(times)
    rse = stats.rse_of_median(ordered)
    if not converged and not rse < rse_target:
        flags.append(flag(Flag.RSE_TARGET_MISSED, note=f"{rse:.4f} >= {rse_target} after {len(times)} samples"))
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


def _window_function(timer: Any, sync: Callable[[], None] | None, flusher: Callable[[], None] | None, untrusted: bool,
                     roles: list[str], host_us: list[float], direct_us: list[Any]) -> Callable[[Callable[[int], Any], int, str], Any]:
    """``window(fn, k, role)``: ``fn(k)`` in one timing window, its host time and the timer's own
    reading appended (``roles``, ``host_us``, ``direct_us``); returns its output."""
    perf = _perf_counter
    sync_first = timer.sync_before_window and sync is not None

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

    return window


def _timed_calls(window: Callable[[Callable[[int], Any], int, str], Any], empty: Callable[[int], None], timer: Any,
                 call: Callable[[int], Any], start: int, n_sets: int, refresh: Refresh | None,
                 on_output: Callable[[int, Any], None] | None, budget_s: float, min_samples: int, max_samples: int,
                 budget_cap: float, rse_target: float, roles: list[str], host_us: list[float], direct_us: list[Any], outside_us: list[float]) -> bool:
    """The timed calls, input set ``(start + n) % n_sets`` for the ``n``-th, until ``budget_s``
    runs out (``min_samples`` at least, unless ``budget_cap`` times it ran out) or the median's
    error is under ``rse_target``; whether it converged."""
    perf = _perf_counter
    started = perf()
    deadline = started + budget_s
    cap = started + budget_cap * budget_s if math.isfinite(budget_cap) else math.inf  # never inf * 0
    n = 0
    next_check = max(min_samples, _FIRST_CHECK)
    growth = _CHECK_GROWTH.get(timer.method, _CHECK_GROWTH_DEFAULT)
    while n < max_samples:
        k = (start + n) % n_sets
        loop_start = perf()
        # the last output goes first: what its freeing sets off (a candidate's finalizer) runs
        # before the next inputs exist, within this turn's account, and never between a
        # window and the check of that window's output
        out = None
        elsewhere_us = refresh(k) if refresh is not None else None
        out = window(call, k, "timed")
        if on_output is not None:
            on_output(k, out)
        # what the call's turn took beyond its window: the refresh, the flush, the drop of the
        # last output, the output's check; the same harness on both sides, so a candidate's
        # excess is work done where it is not timed (``outside_window_excess``). A refresh's wait
        # for another process (the trusted child's feed) is that process's work, not the call's.
        outside_us.append((perf() - loop_start) * 1e6 - host_us[-1] - (elsewhere_us or 0.0))
        n += 1
        if n % _CALIBRATE_EVERY == 0:
            window(empty, 0, "empty")
        now = perf()
        if now >= cap or (n >= min_samples and now >= deadline):
            break
        if n >= next_check:
            next_check = n + max(5, int(n * growth))
            values = per_call_times(timer, roles, host_us, direct_us, interim=True)[0]
            if stats.rse_of_median(sorted(values)) < rse_target:
                return True
    return False


# The other threads' CPU time over the timed loop counts only above this share of the loop's wall
# time. A single-threaded baseline's child once read 3.6 ms of it (about one scheduler tick; the
# source was not found) in a loop of some hundreds of ms, which spread over its 8.7 us calls
# looked like a second core. Work in other threads under this share goes uncharged; the leftovers
# audit judges threads that work between calls.
OTHER_CPU_NOISE_SHARE = 0.05


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


