"""The wire between the pytest process and a child: JSON headers and tensor payloads.

Nothing a child sends is ever unpickled. A message is a JSON header, and when it carries a payload
(inputs, outputs: containers of CPU tensors and plain values) two more parts: the payload's
*skeleton*, JSON in which every tensor is a placeholder ``{"tensor": i, "dtype": ..., "shape":
[...]}``, then each tensor's raw bytes. The receiver checks every dtype against torch's dtypes and
every buffer's size against its shape before it allocates, and reads the bytes straight into the
new tensor. A candidate that forges a message can only send data.

Raw bytes also make the wire cheap: ``torch.save`` + pipe + ``torch.load`` moved 128 MiB of fp32
in 0.33 s on the 2-core CI machine, the pipe alone takes 0.15 s of that (docs/performance.md).
The receiver reads every frame itself, straight from the socket into its destination (a tensor's
storage), instead of through ``Connection.recv_bytes``, which buffers a frame twice; and it reads
against a deadline, so a child that sends half a message and stalls cannot hang the parent.

Over a pipe the tensors go as separate frames (``send``/``recv``); for KCoral programs, which
carry one ``bytes`` value, ``encode_payload``/``decode_payload`` pack the same parts into one blob.
"""

from __future__ import annotations

import json
import math
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

# A header or a skeleton never needs more; anything larger is a child flooding the channel.
MAX_HEADER_BYTES = 8 << 20
MAX_TENSORS = 4096  # per payload
_BLOB_MAGIC = b"KCP1"


class ProtocolError(Exception):
    """The other side sent something that is not a valid message."""


def send(conn: Connection, header: dict[str, Any], payload: Any = None) -> None:
    header = dict(header, payload=payload is not None)
    conn.send_bytes(json.dumps(header).encode())
    if payload is not None:
        skeleton, tensors = _flatten(payload)
        conn.send_bytes(json.dumps(skeleton).encode())
        for t in tensors:
            conn.send_bytes(_byte_view(t))


def send_fds(conn: Connection, fds: list[int]) -> None:
    """File descriptors after a message whose header says how many (``fds``): one marker byte
    carrying them (``SCM_RIGHTS``). The receiver has read the message's frames, and no more."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        socket.send_fds(sock, [b"F"], fds)


def recv_fds(conn: Connection, count: int, deadline: float | None = None) -> list[int]:
    """The ``count`` descriptors ``send_fds`` sent after the message just read."""
    if not 0 < count <= 4:
        raise ProtocolError(f"a message announces {count!r} file descriptors")
    _FrameReader(conn.fileno(), deadline)._wait_readable()
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        marker, fds, _, _ = socket.recv_fds(sock, 1, count)
    if marker != b"F" or len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise ProtocolError(f"expected {count} file descriptors after the message, got {len(fds)}")
    return list(fds)


def recv(conn: Connection, deadline: float | None = None, *, check_header: Callable[[dict[str, Any]], None] | None = None,
         max_payload_bytes: int | None = None) -> tuple[dict[str, Any], Any]:
    """The next message. With a ``deadline`` (``time.monotonic()``), ``TimeoutError`` once it passes
    before the whole message arrived; ``EOFError`` when the other side closes mid-message.

    ``check_header(header)`` runs before any payload is read (a reply that answers no command is
    refused before its tensors are allocated), and a payload whose tensors hold more than
    ``max_payload_bytes`` is refused from its skeleton alone: a child cannot make this process
    allocate what it likes."""
    reader = _FrameReader(conn.fileno(), deadline)
    header = _load_json(reader.frame(MAX_HEADER_BYTES, "message header"), "message header")
    if not isinstance(header, dict):
        raise ProtocolError("message header is not a JSON object")
    if check_header is not None:
        check_header(header)
    if not header.get("payload"):
        return header, None
    skeleton = _load_json(reader.frame(MAX_HEADER_BYTES, "payload skeleton"), "payload skeleton")
    specs = _nested("payload skeleton", _tensor_specs, skeleton)
    claimed = sum(nbytes for _, _, nbytes in specs)
    if max_payload_bytes is not None and claimed > max_payload_bytes:
        raise ProtocolError(f"a payload of {claimed} bytes of tensors, more than the {max_payload_bytes} this reply can need")
    tensors = []
    for dtype, shape, nbytes in specs:
        size = reader.frame_size()
        if size != nbytes:  # refused before anything is allocated or read
            raise ProtocolError(f"a tensor frame of {size} bytes, but its shape {list(shape)} ({dtype}) needs {nbytes}")
        tensor = _empty(dtype, shape)
        if nbytes:
            reader.read_into(_byte_view(tensor))
        tensors.append(tensor)
    return header, _nested("payload skeleton", _rebuild, skeleton, tensors)


def _nested(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` over a skeleton, whose nesting a child chooses: too deep is a protocol error,
    not a ``RecursionError`` that would end the item without a result."""
    try:
        return fn(*args)
    except RecursionError:
        raise ProtocolError(f"unreadable {what}: nested too deeply") from None


class _FrameReader:
    """Reads ``Connection.send_bytes`` frames from a socket's descriptor, without extra copies.

    The frame format is CPython's (``multiprocessing/connection.py``, stable since 3.8): a 4-byte
    big-endian signed length, or -1 and then an 8-byte length for frames over 2 GiB; then the bytes.
    """

    def __init__(self, fd: int, deadline: float | None) -> None:
        self.fd = fd
        self.deadline = deadline
        self._poll: Any = None
        if deadline is not None:  # poll, not select: a long session's descriptors pass 1024
            self._poll = select.poll()
            self._poll.register(fd, select.POLLIN)

    def frame_size(self) -> int:
        (size,) = struct.unpack("!i", self._exactly(4))
        if size == -1:
            (size,) = struct.unpack("!Q", self._exactly(8))
        if size < 0:
            raise ProtocolError(f"a frame of negative length {size}")
        return int(size)

    def frame(self, limit: int, what: str) -> bytes:
        size = self.frame_size()
        if size > limit:
            raise ProtocolError(f"unreadable {what}: a frame of {size} bytes, more than the {limit} allowed")
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        self.read_into(memoryview(buf))
        return bytes(buf)

    def read_into(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            self._wait_readable()
            got = os.readv(self.fd, [view[done:]])
            if got == 0:
                raise EOFError("the channel closed in the middle of a message")
            done += got

    def _wait_readable(self) -> None:
        if self._poll is None or self.deadline is None:
            return
        while True:
            remaining_ms = (self.deadline - time.monotonic()) * 1e3
            if remaining_ms <= 0:
                raise TimeoutError("the rest of the message did not arrive before the deadline")
            # readable, or hung up (then the read returns what is left, and finally end of file)
            if self._poll.poll(math.ceil(remaining_ms)):
                return


def encode_payload(obj: Any) -> bytes:
    """The payload as one blob: magic, skeleton length, skeleton JSON, the tensors' bytes."""
    skeleton, tensors = _flatten(obj)
    head = json.dumps(skeleton).encode()
    return b"".join([_BLOB_MAGIC, struct.pack("<Q", len(head)), head, *(_byte_view(t) for t in tensors)])


def decode_payload(data: bytes) -> Any:
    view = memoryview(data)
    if len(view) < 12 or bytes(view[:4]) != _BLOB_MAGIC:
        raise ProtocolError("unreadable tensor payload: not a pytest-kcoral payload blob")
    (head_len,) = struct.unpack("<Q", view[4:12])
    if head_len > MAX_HEADER_BYTES or 12 + head_len > len(view):
        raise ProtocolError("unreadable tensor payload: skeleton length out of range")
    skeleton = _load_json(bytes(view[12:12 + head_len]), "payload skeleton")
    offset = 12 + head_len
    tensors = []
    for dtype, shape, nbytes in _nested("payload skeleton", _tensor_specs, skeleton):
        if offset + nbytes > len(view):
            raise ProtocolError(f"unreadable tensor payload: truncated tensor of shape {list(shape)} ({dtype})")
        tensor = _empty(dtype, shape)
        _byte_view(tensor)[:] = view[offset:offset + nbytes]
        offset += nbytes
        tensors.append(tensor)
    if offset != len(view):
        raise ProtocolError(f"unreadable tensor payload: {len(view) - offset} bytes after the last tensor")
    return _nested("payload skeleton", _rebuild, skeleton, tensors)


# -- the skeleton ------------------------------------------------------------------------------

def _flatten(obj: Any) -> tuple[Any, list[Any]]:
    """JSON-able skeleton of ``obj`` and its tensors (contiguous CPU tensors, in order)."""
    import torch

    tensors: list[Any] = []

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.device.type != "cpu":
                raise TypeError(f"payload tensors must be on the CPU, not {t.device}")
            tensors.append(t.contiguous())
            return {"tensor": len(tensors) - 1, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, tuple):
            return {"tuple": [walk(v) for v in x]}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise TypeError("payload dicts need string keys")
            return {"dict": {k: walk(v) for k, v in x.items()}}
        raise TypeError(f"a payload holds tensors, numbers, strings, None, lists, tuples and dicts, not {type(x).__name__}")

    return walk(obj), tensors


def _tensor_specs(skeleton: Any) -> list[tuple[Any, tuple[int, ...], int]]:
    """(dtype, shape, bytes) of every tensor placeholder, in index order, validated."""
    import torch

    found: dict[int, tuple[Any, tuple[int, ...], int]] = {}

    def walk(x: Any) -> None:
        if isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            if "tensor" in x:
                index, name, shape = x.get("tensor"), x.get("dtype"), x.get("shape")
                dtype = getattr(torch, name, None) if isinstance(name, str) else None
                if not isinstance(dtype, torch.dtype):
                    raise ProtocolError(f"unreadable tensor payload: unknown dtype {name!r}")
                if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
                    raise ProtocolError(f"unreadable tensor payload: bad shape {shape!r}")
                if not isinstance(index, int) or index in found or not 0 <= index < MAX_TENSORS:
                    raise ProtocolError(f"unreadable tensor payload: bad tensor index {index!r}")
                numel = 1
                for d in shape:
                    numel *= d
                found[index] = (dtype, tuple(shape), numel * dtype.itemsize)
            elif set(x) == {"tuple"} and isinstance(x["tuple"], list):
                walk(x["tuple"])
            elif set(x) == {"dict"} and isinstance(x["dict"], dict):
                walk(list(x["dict"].values()))
            else:
                raise ProtocolError(f"unreadable tensor payload: unexpected object with keys {sorted(x)[:5]}")

    walk(skeleton)
    if sorted(found) != list(range(len(found))):
        raise ProtocolError("unreadable tensor payload: tensor indices are not 0..n-1")
    return [found[i] for i in range(len(found))]


def _rebuild(skeleton: Any, tensors: list[Any]) -> Any:
    if isinstance(skeleton, list):
        return [_rebuild(v, tensors) for v in skeleton]
    if isinstance(skeleton, dict):
        if "tensor" in skeleton:
            return tensors[skeleton["tensor"]]
        if "tuple" in skeleton:
            return tuple(_rebuild(v, tensors) for v in skeleton["tuple"])
        return {k: _rebuild(v, tensors) for k, v in skeleton["dict"].items()}
    return skeleton


# -- raw bytes ----------------------------------------------------------------------------------

def _empty(dtype: Any, shape: tuple[int, ...]) -> Any:
    import torch

    try:
        return torch.empty(shape, dtype=dtype)
    except RuntimeError as exc:  # e.g. more memory than the host has
        raise ProtocolError(f"cannot allocate a tensor of shape {list(shape)} ({dtype}): {exc}") from None


def _byte_view(tensor: Any) -> memoryview:
    """The tensor's storage as writable bytes (any dtype, bfloat16 and float8 included)."""
    import torch

    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(bytearray())
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _load_json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"unreadable {what}: {exc}") from None
    except RecursionError:  # "[" * 100000: the item would end without a result
        raise ProtocolError(f"unreadable {what}: nested too deeply") from None
