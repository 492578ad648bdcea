"""The fallback timers: CUDA events with a device-wide synchronize, and the wall clock.

Events: each window is bracketed by a start event and two end events.

- In front of the start event, behind the L2 flush, the stream gets a short GPU busy-wait
  (``torch.cuda._sleep``, about ``GPU_SLEEP_US``). The call is launched while the GPU is still
  busy, so its first kernel starts right behind the start event: the host's launch latency of the
  first kernel is not charged to the call (CUPTI's span starts at the first kernel, too). Without
  it, a fresh candidate process and the trusted baseline process launched at different speeds, and
  an add identical to its baseline read 0.87x on an H200.
- ``end_stream`` is recorded on the current stream as soon as the call returns: the stream-ordered
  span, with no host wake-up in it.
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

from typing import Any

from pytest_kcoral.timing.clocks import TorchRefs

GPU_SLEEP_US = 20.0
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
        self._sleep_cycles = 0
        if refs.gpu_sleep is not None:
            props = refs.torch.cuda.get_device_properties(device)
            khz = int(getattr(props, "clock_rate", 0) or _FALLBACK_CLOCK_KHZ)
            self._sleep_cycles = int(GPU_SLEEP_US * khz / 1000)

    def start(self) -> None:
        event = self._refs.event_type
        self._start_ev = event(enable_timing=True)
        self._end_stream_ev = event(enable_timing=True)
        self._end_sync_ev = event(enable_timing=True)

    def open_window(self) -> None:
        refs = self._refs
        if self._sleep_cycles:
            refs.gpu_sleep(self._sleep_cycles)
        refs.event_record(self._start_ev, refs.current_stream())

    def close_window(self, token: Any) -> tuple[float, float]:
        """(stream-ordered span, synchronized span) in microseconds; the latter still holds the bias."""
        refs = self._refs
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
    method = "wall"
    sync_before_window = True

    def __init__(self, refs: TorchRefs | None) -> None:
        self._sync = refs.synchronize if refs is not None and refs.cuda_available else None

    def start(self) -> None:
        return None

    def open_window(self) -> None:
        return None

    def close_window(self, token: Any) -> None:
        if self._sync is not None:
            self._sync()
        return None

    def stop(self) -> None:
        return None

    def stop_quietly(self) -> None:
        return None
