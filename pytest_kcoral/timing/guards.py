"""Guards on what stays in the candidate's process while it is timed.

The candidate shares its process with the timing loop, so code it installs runs inside the
harness's own calls. This module names and refuses what would reach the loop:

- a profile or trace function (``sys.setprofile``, ``sys.settrace``, their ``threading``
  versions, ``sys.monitoring`` tools on 3.12+): it runs inside every window, the harness's empty
  calibration windows included, whose time the wall and events timers subtract from each call;
- a torch function or dispatch mode left pushed: it runs inside every torch call, the harness's
  own included. A plain ``torch.set_default_device`` (a ``DeviceContext``) is no such mode.

``find_hooks`` says what is installed; ``clear_profile_and_trace`` takes them off before each
empty window, so a hook that hides from the checks still never runs inside the calibration. The
functions are taken here, before any candidate code loads (``capture_torch`` from
``timing.prepare``), so replacing ``sys.getprofile`` afterwards changes nothing.

``thread_cpu_s`` and ``other_cpu_s`` are the CPU time of the timing thread and of the rest of the
process (its reaped children included): on a CPU a call's time is never less than the CPU time
spent on it, so threads or processes that share the work earn nothing.

``gc_disabled`` turns the garbage collector off around a candidate's correctness calls, as the
timing loop does around its timed ones: a candidate cannot tell them apart by ``gc.isenabled()``.
"""

from __future__ import annotations

import contextlib
import gc
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_getprofile = sys.getprofile
_gettrace = sys.gettrace
_setprofile = sys.setprofile
_settrace = sys.settrace
_thread_getprofile = getattr(threading, "getprofile", None)  # 3.10+
_thread_gettrace = getattr(threading, "gettrace", None)
_monitoring = getattr(sys, "monitoring", None)  # 3.12+
_get_tool = getattr(_monitoring, "get_tool", None)
_get_events = getattr(_monitoring, "get_events", None)
_MONITORING_TOOL_IDS = range(6)  # 0-5 are the tools' ids; the rest are Python's own
_process_time = time.process_time
_thread_time = time.thread_time
_getrusage = resource.getrusage
_RUSAGE_CHILDREN = resource.RUSAGE_CHILDREN
_gc_isenabled, _gc_disable, _gc_enable = gc.isenabled, gc.disable, gc.enable


class HookDetected(RuntimeError):
    """Something the candidate installed runs inside the harness's timing windows."""


# torch's mode-stack functions and set_default_device's mode class, taken by ``capture_torch``:
# module globals, so that the tamper snapshot sees one rebound
_function_len: Callable[[], int] | None = None
_function_at: Callable[[int], Any] | None = None
_dispatch_len: Callable[[], int] | None = None
_dispatch_at: Callable[[int], Any] | None = None
_device_context: type | None = None
_device_context_fn: Any = None


def capture_torch() -> None:
    """torch's mode-stack functions, taken before candidate code loads; a no-op without torch."""
    global _function_len, _function_at, _dispatch_len, _dispatch_at, _device_context, _device_context_fn
    torch = sys.modules.get("torch")
    if torch is None or _function_len is not None:
        return
    C = torch._C
    _function_at = getattr(C, "_get_function_stack_at", None)
    _dispatch_len = getattr(C, "_len_torch_dispatch_stack", None)
    _dispatch_at = getattr(C, "_get_dispatch_stack_at", None)
    with contextlib.suppress(ImportError, AttributeError):
        from torch.utils._device import DeviceContext

        _device_context = DeviceContext
        _device_context_fn = DeviceContext.__dict__.get("__torch_function__")
    _function_len = getattr(C, "_len_torch_function_stack", None)  # last: it marks the capture done


def _describe(obj: Any) -> str:
    kind = type(obj)
    name = getattr(obj, "__qualname__", None) or kind.__qualname__
    module = getattr(obj, "__module__", None) or kind.__module__
    return f"{module}.{name}"


def _harmless_mode(mode: Any) -> bool:
    """``torch.set_default_device``'s mode, unchanged: it only fills in factories' device."""
    cls = _device_context
    return (cls is not None and type(mode) is cls and "__torch_function__" not in vars(mode)
            and cls.__dict__.get("__torch_function__") is _device_context_fn)


def _modes(length: Callable[[], int] | None, at: Callable[[int], Any] | None) -> list[Any]:
    if length is None or at is None:
        return []
    return [at(i) for i in range(length())]


def find_hooks() -> list[str]:
    """What is installed that would run inside the timing windows, in words; empty: nothing."""
    found = []
    profile, trace = _getprofile(), _gettrace()
    if profile is not None:
        found.append(f"a profile function (sys.setprofile: {_describe(profile)})")
    if trace is not None:
        found.append(f"a trace function (sys.settrace: {_describe(trace)})")
    if _thread_getprofile is not None and _thread_getprofile() is not None:
        found.append(f"a profile function for new threads (threading.setprofile: {_describe(_thread_getprofile())})")
    if _thread_gettrace is not None and _thread_gettrace() is not None:
        found.append(f"a trace function for new threads (threading.settrace: {_describe(_thread_gettrace())})")
    if _get_tool is not None:
        for tool_id in _MONITORING_TOOL_IDS:
            name = _get_tool(tool_id)
            if name is not None:
                events = _get_events(tool_id) if _get_events is not None else None
                found.append(f"a sys.monitoring tool (id {tool_id}, {name!r}, events {events})")
    modes = [m for m in _modes(_function_len, _function_at) if not _harmless_mode(m)]
    if modes:
        found.append(f"torch function mode{'s' if len(modes) > 1 else ''} left pushed ({', '.join(_describe(m) for m in modes)})")
    modes = _modes(_dispatch_len, _dispatch_at)
    if modes:
        found.append(f"torch dispatch mode{'s' if len(modes) > 1 else ''} left pushed ({', '.join(_describe(m) for m in modes)})")
    return found


def refuse_modes(when: str) -> None:
    """``HookDetected`` when a torch function or dispatch mode is pushed (``find_hooks``' torch
    half, cheap enough for every timed call): before the harness's own torch calls between them."""
    if (_function_len is not None and _function_len()) or (_dispatch_len is not None and _dispatch_len()):
        found = [h for h in find_hooks() if h.startswith("torch")]
        if found:
            raise HookDetected(f"{when}, the harness found {'; '.join(found)}: code that runs inside the harness's own calls is refused")


def refuse_hooks(when: str) -> None:
    """Raise ``HookDetected`` naming what ``find_hooks`` finds; ``when``: the loop's moment."""
    found = find_hooks()
    if found:
        raise HookDetected(f"{when}, the timing loop found {'; '.join(found)}: code that runs inside the harness's own timing"
                           " windows (its calibration included) is refused")


def clear_profile_and_trace() -> None:
    """Take this thread's profile and trace functions off, before a calibration window."""
    _setprofile(None)
    _settrace(None)


def thread_cpu_s() -> float:
    """CPU seconds of the calling thread: exact at any moment."""
    return _thread_time()


def other_cpu_s() -> float:
    """CPU seconds of this process's other threads (those gone included) and of its reaped
    children. The kernel adds a thread running on another core to the process's clock only at
    its scheduler ticks: take differences over many calls, not one."""
    children = _getrusage(_RUSAGE_CHILDREN)
    return _process_time() - _thread_time() + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def gc_disabled() -> Iterator[None]:
    """The garbage collector off for the block, as in the timing loop; back as it was after."""
    was_enabled = _gc_isenabled()
    _gc_disable()
    try:
        yield
    finally:
        if was_enabled:
            _gc_enable()
