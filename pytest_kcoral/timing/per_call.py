"""Each timed call's time, from what the timing loop recorded (``timing._sample``): the timer's
own reading, the host-bound check, the CPU time of a CPU call, and CUPTI's extras. Runs in the
child, after the loop, outside every timing window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from pytest_kcoral.timing import stats
from pytest_kcoral.timing_flags import Flag, flag

# Host time this far above the GPU span (beyond the span itself) makes a call host-bound. Triton's
# Python launcher alone took over 100 us for a 1.5 us kernel while another worker was busy
# (docs/performance.md, scaling), so the slack is well above a loaded host's launch cost; a call
# fed by host-to-device copies is host-bound whatever its slack.
HOST_SLACK_US = 250.0
HOST_TO_DEVICE_COPY = "memcpy:1"  # CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, as the CUPTI timer names it
LAUNCH_BOUND_BUSY_FRACTION = 0.5  # busy under this share of the span: flag the call launch-bound


def per_call_times(
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
        primary = events_times(direct_us, roles, timed, flags)
    else:
        primary = [max(0.0, host_us[j] - host_overhead_us) for j in timed]
        if other_cpu_us is not None and timed and not interim:  # ``WallTimer``'s cpu_clock: CPU times too
            assert flags is not None
            primary = at_least_cpu_time(primary, direct_us, roles, timed, other_cpu_us, flags)
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
            flags.append(flag(Flag.HOST_BOUND, note=f"host time {extra['host_median_us']:.1f} us (harness overhead "
                                                    f"{host_overhead_us:.1f} us), GPU span {span_median:.1f} us; {why}; timed by the host clock"))
            primary = [max(p, h) for p, h in zip(primary, host_minus_overhead)]

    if timer.method == "cupti":
        extra["busy_us"] = stats.median(sorted(records[j].busy_us for j in timed))
        extra["records"] = int(round(stats.median(sorted(records[j].records for j in timed))))
        assert flags is not None
        if span_median > 0 and extra["busy_us"] < LAUNCH_BOUND_BUSY_FRACTION * span_median:
            # information, not a verdict: such a span moves with the host's launch speed within
            # seconds (docs/performance.md, "Process noise")
            flags.append(flag(Flag.LAUNCH_BOUND, note=f"the GPU was busy {extra['busy_us']:.1f} us of a {span_median:.1f} us span;"
                                                      " the rest is launch gaps, whose length follows the host's speed"))
        later = [records[j].work for j, r in enumerate(roles) if r in ("warmup", "timed")]
        same = all(w == later[0] for w in later)
        extra["same_work_every_call"] = same
        if not same:
            flags.append(flag(Flag.WORK_DIFFERS_BETWEEN_CALLS, note=describe_work_change(later)))
        first = [records[j].work for j, r in enumerate(roles) if r == "first"]
        if first and sum(first[0].values()) > 0 and all(sum(w.values()) == 0 for w in later):
            flags.append(flag(Flag.NO_GPU_WORK_AFTER_FIRST_CALL))
    return primary, extra


# CPU time this much above the wall time (and 1 us) says more than one core worked on the calls
CPU_ABOVE_WALL_FLAG = 1.1
def at_least_cpu_time(wall: list[float], thread_cpu_us: list[Any], roles: list[str], timed: list[int], other_cpu_us: float,
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
        flags.append(flag(Flag.CPU_TIME_ABOVE_WALL, note=f"the calls took {cpu_median:.1f} us of CPU time in {wall_median:.1f} us of wall"
                                                          f" time, {share_us:.1f} us of it in other threads or processes: timed by the CPU time"))
    return [max(w, c) for w, c in zip(wall, cpu)]


def describe_work_change(works: Sequence[Counter]) -> str:
    distinct: list[Counter] = []
    for w in works:
        if w not in distinct:
            distinct.append(w)
    shown = [", ".join(f"{name} x{count}" for name, count in sorted(w.items())) or "no GPU work"
             for w in distinct[:2]]
    return f"{len(distinct)} distinct kernel sets, e.g. [{shown[0]}] vs [{shown[1]}]"


def events_times(direct_us: list[Any], roles: list[str], timed: list[int], flags: list[str] | None) -> list[float]:
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
        flags.append(flag(Flag.EVENTS_SYNC_BIAS_SUBTRACTED_US, f"{bias_us:.2f}"))
        flags.append(flag(Flag.EVENTS_STREAM_BIAS_SUBTRACTED_US, f"{stream_bias_us:.2f}"))
        flags.append(flag(Flag.EVENTS_SPANS_US, note=f"stream {stream_median:.2f}, synchronized {sync_median:.2f}"))
        if side_work:
            flags.append(flag(Flag.EVENTS_SIDE_WORK, note="the call left work on another stream or in a thread; timed by the synchronized span"))
    # never less than the stream-ordered span: the bias estimate must not make a call look faster
    return [max(a, b) for a, b in zip(stream, synced)] if side_work else stream
