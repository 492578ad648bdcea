"""The fallback timers: CUDA events with a device-wide synchronize, and the wall clock.

Events: the start event is recorded on the current stream right behind the L2 flush (no host
synchronize in between, so the flush keeps the GPU busy while the call is launched and the launch
latency is hidden, as in ``triton.testing.do_bench``). The window is closed by a device-wide
synchronize *before* the end event is recorded, so work the call left on another stream or
started from a thread is inside the span. The price is a bias: the end event is stamped only after
the host wakes up from the synchronize and records it (a few microseconds). The sampling loop
measures that bias with an empty call in the same process and subtracts its median; the amount is
recorded in the item's flags.

Wall: ``perf_counter`` around the synchronized call. On a CPU that is the whole story; on a GPU it
is the forced last resort, with the median host time of an empty synchronized call subtracted.
"""

from __future__ import annotations

from typing import Any

from pytest_kcoral.timing.clocks import TorchRefs


class EventsTimer:
    method = "events"
    sync_before_window = False  # the L2 flush in front of the start event hides the launch

    def __init__(self, refs: TorchRefs) -> None:
        self._refs = refs
        self._start_ev: Any = None
        self._end_ev: Any = None

    def start(self) -> None:
        self._start_ev = self._refs.event_type(enable_timing=True)
        self._end_ev = self._refs.event_type(enable_timing=True)

    def open_window(self) -> None:
        self._refs.event_record(self._start_ev, self._refs.current_stream())

    def close_window(self, token: Any) -> float:
        refs = self._refs
        refs.synchronize()  # device-wide: side streams and threads' work included
        refs.event_record(self._end_ev, refs.current_stream())
        refs.event_synchronize(self._end_ev)
        return refs.event_elapsed_ms(self._start_ev, self._end_ev) * 1e3

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
