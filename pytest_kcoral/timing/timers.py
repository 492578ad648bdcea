"""The fallback timers: CUDA events with a device-wide synchronize, and the wall clock.

Events: each window is bracketed by a start event and two end events.

- In front of the start event, behind the L2 flush, the stream gets a GPU busy-wait
  (``torch.cuda._sleep``). The call is launched while the GPU is still busy, so its first kernel
  starts right behind the start event: the host's launch latency of the first kernel is not
  charged to the call (CUPTI's span starts at the first kernel, too). Without it, a fresh
  candidate process and the trusted baseline process launched at different speeds, and an add
  identical to its baseline read 0.87x on an H200. The busy-wait must outlast the host's launch:
  a fixed 20 us did on one H200 host and not on another, whose Python took longer to launch, and an
  add of 11.8 us (CUPTI) read 15.9 us. So it lasts twice the longest host time of the last few
  windows, between ``GPU_SLEEP_US`` and ``MAX_GPU_SLEEP_US`` (the longest, not the median: the
  sampling loop's empty calibration windows take almost no host time, and a busy-wait that runs
  too long costs only wall time, one too short costs accuracy).
- ``end_stream`` is recorded on the current stream as soon as the call returns: the stream-ordered
  span, with no host wake-up in it. It does hold the GPU's own processing of the end event (2.9 us
  on one H200 host); the empty windows measure that too, and it is subtracted likewise.
- ``end_sync`` is recorded after a device-wide synchronize, so work the call left on another stream
  or started from a thread is inside it. Its price is the host's wake-up from the synchronize (a
  few microseconds): the sampling loop measures that bias with empty windows in the same process
  and subtracts its median.

The call's time is the stream-ordered span, unless the synchronized span (less the bias) is
clearly longer (``side_work_detected``): then the call left work behind on another stream or in a
thread, and every call is timed by the synchronized span, with a flag.

Wall: ``perf_counter`` around the synchronized call. On a CPU that is the whole story; on a GPU it
is the forced last resort, with the median host time of an empty synchronized call subtracted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_kcoral.timing.clocks import TorchRefs, perf_counter

GPU_SLEEP_US = 20.0
MAX_GPU_SLEEP_US = 250.0  # a call that takes longer on the host synchronizes inside, or is host-bound
_HOST_HISTORY = 8  # recent calls whose host time sizes the busy-wait
_FALLBACK_CLOCK_KHZ = 1_500_000  # when the device does not report its SM clock
# The synchronized span must exceed the stream-ordered one by both margins to count as side work:
# the bias subtraction leaves a few microseconds of wake-up jitter either way.
SIDE_WORK_REL = 0.05
SIDE_WORK_ABS_US = 3.0


def side_work_detected(stream_median_us: float, sync_median_us: float) -> bool:
    """Whether the synchronized span says the call left work on another stream or a thread."""
    return sync_median_us > stream_median_us * (1 + SIDE_WORK_REL) + SIDE_WORK_ABS_US


class EventsTimer:
    method = "events"
    sync_before_window = False  # the flush and the busy-wait in front of the start event hide the launch

    def __init__(self, refs: TorchRefs, device: Any = None) -> None:
        self._refs = refs
        self._start_ev: Any = None
        self._end_stream_ev: Any = None
        self._end_sync_ev: Any = None
        self._cycles_per_us = 0.0
        self._host_us: list[float] = []
        self._opened_at = 0.0
        if refs.gpu_sleep is not None:
            props = refs.torch.cuda.get_device_properties(device)
            self._cycles_per_us = int(getattr(props, "clock_rate", 0) or _FALLBACK_CLOCK_KHZ) / 1000

    def sleep_us(self) -> float:
        """The busy-wait in front of the next window: twice the recent windows' longest host time."""
        launch_us = max(self._host_us, default=0.0)
        return min(max(GPU_SLEEP_US, 2 * launch_us), MAX_GPU_SLEEP_US)

    def start(self) -> None:
        event = self._refs.event_type
        self._start_ev = event(enable_timing=True)
        self._end_stream_ev = event(enable_timing=True)
        self._end_sync_ev = event(enable_timing=True)

    def open_window(self) -> None:
        refs = self._refs
        if self._cycles_per_us and refs.gpu_sleep is not None:
            refs.gpu_sleep(int(self.sleep_us() * self._cycles_per_us))
        refs.event_record(self._start_ev, refs.current_stream())
        self._opened_at = perf_counter()

    def close_window(self, token: Any) -> tuple[float, float]:
        """(stream-ordered span, synchronized span) in microseconds; the latter still holds the bias."""
        refs = self._refs
        self._host_us.append((perf_counter() - self._opened_at) * 1e6)
        del self._host_us[:-_HOST_HISTORY]
        refs.event_record(self._end_stream_ev, refs.current_stream())
        refs.synchronize()  # device-wide: side streams and threads' work included
        refs.event_record(self._end_sync_ev, refs.current_stream())
        refs.event_synchronize(self._end_sync_ev)
        return (refs.event_elapsed_ms(self._start_ev, self._end_stream_ev) * 1e3,
                refs.event_elapsed_ms(self._start_ev, self._end_sync_ev) * 1e3)

    def stop(self) -> None:
        return None

    def stop_quietly(self) -> None:
        return None


class WallTimer:
    """``cpu_clock`` (the timing thread's CPU seconds, for a CPU's graded timing): each window also
    reports the CPU time spent in it, in microseconds; the sampling loop adds the other threads'
    and makes the sum the floor of the call's time."""

    method = "wall"
    sync_before_window = True

    def __init__(self, refs: TorchRefs | None, cpu_clock: Callable[[], float] | None = None) -> None:
        self._sync = refs.synchronize if refs is not None and refs.cuda_available else None
        self._cpu_clock = cpu_clock
        self.counts_cpu = cpu_clock is not None

    def start(self) -> None:
        return None

    def open_window(self) -> float | None:
        return self._cpu_clock() if self._cpu_clock is not None else None

    def close_window(self, token: Any) -> float | None:
        if self._sync is not None:
            self._sync()
        return None if token is None or self._cpu_clock is None else (self._cpu_clock() - token) * 1e6

    def stop(self) -> None:
        return None

    def stop_quietly(self) -> None:
        return None
