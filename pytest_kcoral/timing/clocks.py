"""The clocks and synchronization calls the timers use, taken before candidate code can patch them.

The stage runner imports this package before it imports the candidate, so ``time.perf_counter``
is captured here at import. torch is imported lazily (importing pytest_kcoral never touches a
GPU); ``capture_torch()`` takes torch's references the first time a timer needs them, and the
pipeline calls ``pytest_kcoral.timing.prepare(device)`` before it loads a candidate so that moment
also comes first. We keep the C-level entry points (``torch._C._cuda_synchronize``, the methods of
``torch._C._CudaEventBase``) rather than the Python wrappers, so replacing
``torch.cuda.synchronize`` or ``torch.cuda.Event.record`` afterwards changes nothing here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

perf_counter: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class TorchRefs:
    torch: Any
    cuda_available: bool
    synchronize: Callable[[], None]  # device-wide synchronize of the current device
    event_type: Any  # constructor for timing events
    event_record: Callable[..., None]
    event_synchronize: Callable[[Any], None]
    event_elapsed_ms: Callable[[Any, Any], float]
    current_stream: Callable[[], Any]
    gpu_sleep: Callable[[int], None] | None  # ``torch.cuda._sleep``: a busy-wait kernel of N cycles


_torch_refs: TorchRefs | None = None


def capture_torch() -> TorchRefs:
    """torch's synchronization and event entry points, captured once per process."""
    global _torch_refs
    if _torch_refs is not None:
        return _torch_refs
    import torch

    cuda_available = bool(torch.cuda.is_available())
    sync = getattr(torch._C, "_cuda_synchronize", None)
    if sync is None:  # a CPU build: nothing to synchronize with
        sync = _no_sync
    # On a CUDA build the event methods live on the C base class; a CPU build lacks them.
    base = getattr(torch._C, "_CudaEventBase", None)
    event_type = torch.cuda.Event

    def method(name: str) -> Any:
        return getattr(base, name, None) or getattr(event_type, name)

    record = method("record")
    ev_sync = method("synchronize")
    elapsed = method("elapsed_time")
    _torch_refs = TorchRefs(torch, cuda_available, sync, event_type, record, ev_sync, elapsed,
                            torch.cuda.current_stream, getattr(torch.cuda, "_sleep", None))
    return _torch_refs


def _no_sync() -> None:
    return None


# torch's references are NOT taken at import: the template process that children fork from
# imports this module, and ``torch.cuda.is_available()`` there would initialize the CUDA driver
# and poison every fork ("Cannot re-initialize CUDA in forked subprocess"). The stage runner calls
# ``pytest_kcoral.timing.prepare()`` in the child, before the candidate loads, instead.
