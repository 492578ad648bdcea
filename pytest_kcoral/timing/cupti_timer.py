"""CUPTI activity timer: what the GPU did inside each call's host timestamp window.

cupti-python is an optional dependency (``pip install pytest-kcoral[gpu]``) imported only here,
and only when a CUPTI timer is built, so a CPU install never needs it.

Each call is bracketed by ``cupti.get_timestamp()`` after a device-wide synchronize (the GPU is
idle when the window opens) and after another device-wide synchronize (everything the call
started, on any stream or from any thread, has finished when it closes). Kernel, memcpy and
memset records whose start falls inside a window belong to that call; the call's time is the span
from the first start to the last end, launch gaps included. Records outside every window (the L2
flush, input refreshes) are ignored.

Activity callbacks are registered on every use: another profiler in the process (torch.profiler,
a second timer) may have replaced them since the last one.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Asked for anew after every forced flush; a larger buffer's fresh pages cost a grading child
# milliseconds each time (docs/performance.md). A full buffer is handed over and another asked for.
_BUFFER_BYTES = 1 << 20


class CuptiUnavailable(RuntimeError):
    """cupti-python cannot be imported or refuses to collect activity on this process."""


@dataclass(frozen=True)
class CuptiRefs:
    get_timestamp: Any
    enable: Any
    disable: Any
    register: Any
    flush_all: Any
    kernel_kind: Any
    memcpy_kind: Any
    memset_kind: Any


_refs: CuptiRefs | None = None
_load_error: str | None = None


def capture_cupti() -> CuptiRefs:
    """Import cupti-python and keep its entry points; raises CuptiUnavailable when it cannot."""
    global _refs, _load_error
    if _refs is not None:
        return _refs
    if _load_error is not None:
        raise CuptiUnavailable(_load_error)
    try:
        from cupti import cupti

        kinds = cupti.ActivityKind
        _refs = CuptiRefs(
            get_timestamp=cupti.get_timestamp,
            enable=cupti.activity_enable,
            disable=cupti.activity_disable,
            register=cupti.activity_register_callbacks,
            flush_all=cupti.activity_flush_all,
            kernel_kind=kinds.CONCURRENT_KERNEL,
            memcpy_kind=kinds.MEMCPY,
            memset_kind=kinds.MEMSET,
        )
    except Exception as exc:  # noqa: BLE001 - ImportError, or a missing libcupti / elftools
        _load_error = (
            f"cupti-python is not usable ({type(exc).__name__}: {exc}); "
            "install it with `pip install pytest-kcoral[gpu]`"
        )
        raise CuptiUnavailable(_load_error) from exc
    return _refs


@dataclass
class WindowRecords:
    """What CUPTI saw inside one call's window."""

    span_us: float = 0.0
    busy_us: float = 0.0
    records: int = 0
    work: Counter = field(default_factory=Counter)  # kernel names / "memcpy:<kind>" / "memset"


class CuptiTimer:
    method = "cupti"
    sync_before_window = True  # the window must open on an idle GPU

    def __init__(self, sync: Any) -> None:
        refs = capture_cupti()  # taken by ``prepare()`` before the candidate was imported
        self._get_timestamp = refs.get_timestamp
        self._enable = refs.enable
        self._disable = refs.disable
        self._register = refs.register
        self._flush_all = refs.flush_all
        self._kernel_kind = int(refs.kernel_kind)
        self._memcpy_kind = int(refs.memcpy_kind)
        self._memset_kind = int(refs.memset_kind)
        self._kinds = (refs.kernel_kind, refs.memcpy_kind, refs.memset_kind)
        self._sync = sync
        self._raw: list[tuple[int, int, int, str]] = []
        self._windows: list[tuple[int, int]] = []
        self._enabled: list[Any] = []
        self.callback_error: str | None = None

    # CUPTI calls these from its own thread; list.append is atomic under the GIL.
    def _buffer_requested(self) -> tuple[int, int]:
        return _BUFFER_BYTES, 0

    def _buffer_completed(self, activities: Any) -> None:
        raw = self._raw
        try:
            for a in activities:
                kind = int(a.kind)
                if kind == self._kernel_kind:
                    name = str(a.name)
                elif kind == self._memcpy_kind:
                    name = f"memcpy:{int(a.copy_kind)}"
                elif kind == self._memset_kind:
                    name = "memset"
                else:
                    continue
                raw.append((int(a.start), int(a.end), kind, name))
        except Exception as exc:  # noqa: BLE001 - an exception must not escape into CUPTI's thread
            self.callback_error = f"{type(exc).__name__}: {exc}"

    def start(self) -> None:
        """Register callbacks and enable collection; raises CuptiUnavailable when CUPTI refuses."""
        self._raw.clear()
        self._windows.clear()
        try:
            self._register(self._buffer_requested, self._buffer_completed)
            for kind in self._kinds:
                self._enable(kind)
                self._enabled.append(kind)
        except Exception as exc:  # noqa: BLE001 - cuptiError, e.g. another profiler owns CUPTI
            self.stop_quietly()
            raise CuptiUnavailable(f"CUPTI refused activity collection: {exc}") from exc

    def open_window(self) -> int:
        return int(self._get_timestamp())

    def close_window(self, token: int) -> float | None:
        self._sync()
        self._windows.append((token, self._get_timestamp()))
        return None

    def interim(self) -> list[WindowRecords]:
        """Records attributed so far (forces CUPTI to hand over its buffers)."""
        self._flush_all(1)
        return attribute(self._windows, self._raw)

    def stop(self) -> list[WindowRecords]:
        """Flush records, stop collecting, and attribute records to windows (in window order)."""
        self._sync()
        try:
            self._flush_all(1)
        finally:
            self.stop_quietly()
        if not self._raw:
            why = f": {self.callback_error}" if self.callback_error else " (another profiler may own it)"
            raise CuptiUnavailable(f"CUPTI delivered no activity records{why}")
        return attribute(self._windows, self._raw)

    def stop_quietly(self) -> None:
        for kind in self._enabled:
            try:
                self._disable(kind)
            except Exception:  # noqa: BLE001 - stopping must not mask the original error
                pass
        self._enabled.clear()


def attribute(windows: list[tuple[int, int]], raw: list[tuple[int, int, int, str]]) -> list[WindowRecords]:
    """Group records by the window their start falls in; windows are disjoint and in time order."""
    starts = [w[0] for w in windows]
    firsts: list[int | None] = [None] * len(windows)
    lasts: list[int] = [0] * len(windows)
    out = [WindowRecords() for _ in windows]
    for start, end, _kind, name in raw:
        i = bisect.bisect_right(starts, start) - 1
        if i < 0 or start > windows[i][1]:
            continue
        rec = out[i]
        rec.records += 1
        rec.busy_us += (end - start) / 1e3
        rec.work[name] += 1
        first = firsts[i]
        firsts[i] = start if first is None else min(first, start)
        lasts[i] = max(lasts[i], end)
    for i, rec in enumerate(out):
        first = firsts[i]
        if first is not None:
            rec.span_us = (lasts[i] - first) / 1e3
    return out
