"""Memory one child hands to another: device memory over CUDA IPC, host memory over a sealed memfd.

The trusted child writes each timed call's fresh inputs straight into a candidate child's input
sets, and reads the call's outputs back from the same child's output slot (``child_feeder``,
``feed``). Nothing crosses the pytest process, and nothing that makes or checks data runs in the
candidate's interpreter.

- ``Region``: memory a child allocated and hands out (the exporter: a candidate's or the
  baseline's child). On a GPU a torch allocation, exported with ``cuIpcGetMemHandle``; on the
  host an anonymous file (``memfd_create``) sealed against shrinking, its descriptor passed over
  a Unix socket.
- ``MappedRegion``: another child's region, opened here (the importer: the trusted child). Every
  view is checked against the region's bounds, and a host file that could still shrink (a
  ``SIGBUS`` on the next read) is refused, so what a hostile exporter sends can fail its own item
  and never this process.

The CUDA side calls the driver through ctypes (``libcuda`` comes with the driver): torch's own
sharing keeps reference counts in files under ``/dev/shm``, and needs the two processes to be
parent and child. torch is imported inside the functions, as in ``child_outputs``.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
from dataclasses import dataclass
from typing import Any

ALIGN = 512  # every view starts here: any dtype's alignment, and the CUDA caching allocator's rounding
_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
_HANDLE_BYTES = 64  # CUipcMemHandle


class SharedMemoryError(RuntimeError):
    """Memory could not be exported, opened or viewed as described."""


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


# -- the CUDA driver --------------------------------------------------------------------------------

class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _HANDLE_BYTES)]


_driver: Any = None


def _cuda() -> Any:
    """libcuda's entry points this module calls, loaded once."""
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise SharedMemoryError(f"cannot load the CUDA driver (libcuda.so.1): {exc}") from None
        lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_IpcHandle), ctypes.c_uint64]
        open_handle = getattr(lib, "cuIpcOpenMemHandle_v2", None) or lib.cuIpcOpenMemHandle
        open_handle.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
        address_range = getattr(lib, "cuMemGetAddressRange_v2", None) or lib.cuMemGetAddressRange
        address_range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _driver = (lib, open_handle, address_range)
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        lib = _cuda()[0]
        name = ctypes.c_char_p()
        lib.cuGetErrorName(result, ctypes.byref(name))
        raise SharedMemoryError(f"{what} failed: {name.value.decode() if name.value else result}")


def _address_range(ptr: int) -> tuple[int, int]:
    """The allocation ``ptr`` lies in: its base and size."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(_cuda()[2](ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)), "cuMemGetAddressRange")
    return int(base.value), int(size.value)


class _CudaArray:
    """A device pointer as ``__cuda_array_interface__`` bytes: how torch wraps memory it did not allocate."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


# -- exporting ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RegionInfo:
    """What the importer needs besides the memory itself (and, for the host, its descriptor)."""

    kind: str  # "cuda" or "cpu"
    nbytes: int
    handle: str = ""  # CUDA: the allocation's IPC handle, hex
    offset: int = 0  # CUDA: where the region starts in that allocation

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "nbytes": self.nbytes, "handle": self.handle, "offset": self.offset}


class Region:
    """``nbytes`` of memory on ``device``, as a uint8 tensor (``bytes``), that another process can map."""

    def __init__(self, nbytes: int, device: str) -> None:
        import torch

        self.device = device
        self.nbytes = aligned(max(nbytes, 1))
        self.fd: int | None = None
        self.bytes: Any
        if device.startswith("cuda"):
            self.bytes = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
            ptr = self.bytes.data_ptr()
            base, _ = _address_range(ptr)
            handle = _IpcHandle()
            _check(_cuda()[0].cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(base)), "cuIpcGetMemHandle")
            self.info = RegionInfo("cuda", self.nbytes, bytes(memoryview(handle)).hex(), ptr - base)  # all 64 bytes, zeros too
        else:
            fd = os.memfd_create("kcoral-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, self.nbytes)
                # sealed before anyone else sees it: the importer refuses a file that could shrink
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
                self._map = mmap.mmap(fd, self.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
            self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)
            self.info = RegionInfo("cpu", self.nbytes)

    def view(self, offset: int, dtype: Any, shape: list[int], strides: list[int]) -> Any:
        return _view(self.bytes, self.nbytes, offset, dtype, shape, strides)

    def close(self) -> None:
        """Let the memory go (the importer has closed its mapping by now, or holds its own pages)."""
        self.bytes = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# -- importing ---------------------------------------------------------------------------------------

_VIEWS_KEPT = 256  # per mapped region: the sets' inputs and the slot's outputs, by dtype and shape


class MappedRegion:
    """Another process's ``Region``, opened in this one."""

    def __init__(self, info: RegionInfo, device: str, fd: int | None = None) -> None:
        import torch

        self.info = info
        self.nbytes = info.nbytes
        self._views: dict[tuple, Any] = {}
        self._cuda_base: int | None = None
        self.bytes: Any
        if info.kind == "cuda":
            if not device.startswith("cuda"):
                raise SharedMemoryError(f"a CUDA region offered to a process on {device}")
            handle = _handle_bytes(info.handle)
            torch.empty(1, device=device)  # the device's context made and current in this thread
            base = ctypes.c_uint64()
            _check(_cuda()[1](ctypes.byref(base), _IpcHandle.from_buffer_copy(handle), _CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle")
            self._cuda_base = int(base.value)
            try:
                _, size = _address_range(self._cuda_base)
                if info.offset < 0 or info.offset + info.nbytes > size:
                    raise SharedMemoryError(f"a region of {info.nbytes} bytes at offset {info.offset} does not fit its allocation"
                                            f" of {size} bytes")
                self.bytes = torch.as_tensor(_CudaArray(self._cuda_base + info.offset, info.nbytes), device=device)
            except BaseException:
                self.close()
                raise
        elif info.kind == "cpu":
            if fd is None:
                raise SharedMemoryError("a host region came without its file descriptor")
            self.bytes = torch.frombuffer(_map_sealed(fd, info.nbytes), dtype=torch.uint8)
        else:
            raise SharedMemoryError(f"unknown region kind {info.kind!r}")

    def view(self, offset: int, dtype: Any, shape: list[int], strides: list[int]) -> Any:
        """``_view``, each asked-for view made once: the trusted child reads a call's outputs through one every call."""
        key = (offset, dtype, tuple(shape), tuple(strides))
        found = self._views.get(key)
        if found is None:
            found = _view(self.bytes, self.nbytes, offset, dtype, shape, strides)
            if len(self._views) < _VIEWS_KEPT:
                self._views[key] = found
        return found

    def close(self) -> None:
        self.bytes = None
        self._views = {}
        if self._cuda_base is not None:
            base, self._cuda_base = self._cuda_base, None
            _cuda()[0].cuIpcCloseMemHandle(ctypes.c_uint64(base))


def _handle_bytes(text: str) -> bytes:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != _HANDLE_BYTES:
        raise SharedMemoryError(f"an IPC handle must be {_HANDLE_BYTES} bytes in hex, got {text[:20]!r}")
    return raw


def _map_sealed(fd: int, nbytes: int) -> mmap.mmap:
    """Map ``fd`` (closed here either way) when it is a memfd that can no longer shrink below ``nbytes``."""
    try:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise SharedMemoryError("a host region's descriptor is not a sealed memory file") from None
        if not seals & fcntl.F_SEAL_SHRINK:
            raise SharedMemoryError("a host region's memory file is not sealed against shrinking")
        if os.fstat(fd).st_size < nbytes:
            raise SharedMemoryError(f"a host region's memory file holds {os.fstat(fd).st_size} bytes, not {nbytes}")
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


# -- views -------------------------------------------------------------------------------------------

def contiguous_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return list(reversed(strides))


def span_bytes(itemsize: int, shape: list[int], strides: list[int]) -> int:
    """Bytes from a strided tensor's first element to just past its last (0 when it is empty)."""
    if any(d == 0 for d in shape):
        return 0
    return itemsize * (1 + sum((d - 1) * s for d, s in zip(shape, strides)))


def _view(raw: Any, nbytes: int, offset: int, dtype: Any, shape: list[int], strides: list[int]) -> Any:
    """A ``dtype`` tensor of ``shape`` and ``strides`` at ``offset`` in the uint8 tensor ``raw``,
    refused unless it lies wholly inside the ``nbytes`` of it."""
    import torch

    if not isinstance(dtype, torch.dtype):
        raise SharedMemoryError(f"not a dtype: {dtype!r}")
    if len(shape) != len(strides) or any(type(v) is not int or v < 0 for v in (*shape, *strides)):
        raise SharedMemoryError(f"a view needs non-negative integer sizes and strides, got {shape} and {strides}")
    if type(offset) is not int or offset < 0 or offset % ALIGN:
        raise SharedMemoryError(f"a view must start at a multiple of {ALIGN} bytes, got {offset!r}")
    itemsize = dtype.itemsize
    span = span_bytes(itemsize, shape, strides)
    if offset + span > nbytes:
        raise SharedMemoryError(f"a view of {span} bytes at offset {offset} overruns its region of {nbytes} bytes")
    elements = -(-span // itemsize)
    flat = raw[offset:offset + elements * itemsize].view(dtype)
    return flat.as_strided(shape, strides)
