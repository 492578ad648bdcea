"""The feed: the channel between the case's trusted child and a child it feeds (the candidate's or
the baseline's), and what travels on it.

The trusted child makes every timed call's inputs and judges its outputs; the fed child only calls
the candidate (``child_feeder`` is the trusted side, ``child_timing.FedSets`` the fed one). They
talk over a Unix socket pair the pytest process made for the item, in small JSON frames; host
memory travels as file descriptors beside a frame (``SCM_RIGHTS``), device memory as CUDA IPC
handles inside one (``shared_memory``).

A round, as the fed child sees it:

1. ``hello`` (once per item and process): the trusted child answers with the ``Layout`` it chose
   for the input sets and the output slot, placement pads included;
2. ``map``: the fed child sends the regions it allocated to that layout; the trusted child maps
   them and writes fresh values into every set;
3. ``call`` before each timed call: the outcome of the last call (its outputs are in the slot),
   and which set comes next; the trusted child judges the last outputs, then writes set ``k``
   afresh, and only then answers;
4. ``end`` after the round's last call.

The fed child is hostile: the trusted side parses every frame strictly and bounds what it reads
(``recv``), and a frame that does not parse ends the feed with the candidate's failure.
"""

from __future__ import annotations

import array
import json
import math
import os
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

MAX_FRAME_BYTES = 1 << 20  # a frame holds a few numbers per tensor: more is a child flooding the channel
MAX_FDS = 4
# How long a feed on a GPU waits for the other side's next frame by polling before it sleeps: a
# turn of a small kernel's call is shorter, and two wake-ups cost a sizeable share of it. On a CPU
# the cores time the work itself, so a feed there never polls.
SPIN_S = 2e-3
_LENGTH = struct.Struct("!I")
_READ_BYTES = 1 << 16

PLAIN_VALUES = (int, float, bool, str, type(None))  # inputs and outputs that are no tensors


class FeedError(RuntimeError):
    """The other side of the feed sent something unreadable, closed, or did not answer in time."""


class FeedClosed(FeedError):
    """The other side closed the feed between frames."""


class FeedChannel:
    """One end of the socket pair: JSON frames, each with up to ``MAX_FDS`` file descriptors."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self.spin_s = 0.0  # ``SPIN_S`` for a feed on a GPU (``spin_on``)
        # read past the last frame: the start of the next, and the descriptors that came with it;
        # one read takes a whole small frame, where a read of its length first took two
        self._buffer = bytearray()
        self._fds: list[int] = []

    @classmethod
    def from_fd(cls, fd: int) -> FeedChannel:
        return cls(socket.socket(fileno=fd))

    def fileno(self) -> int:
        return self.sock.fileno()

    def spin_on(self, device: str) -> None:
        """Poll before sleeping (``SPIN_S``) when the feed serves calls on a GPU."""
        self.spin_s = SPIN_S if device.startswith("cuda") else 0.0

    def send(self, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
        body = json.dumps(message, separators=(",", ":")).encode()
        frame = _LENGTH.pack(len(body)) + body
        try:
            if fds:
                self.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                self.sock.sendall(frame)
        except OSError as exc:
            raise FeedError(f"the other side of the feed is gone ({exc.strerror or exc})") from None

    def recv(self, deadline: float | None = None) -> tuple[Any, list[int]]:
        """The next frame's JSON and the descriptors that came with it. ``FeedError`` when the
        other side closed, sent an unreadable frame, or (with a ``deadline``, ``time.monotonic``)
        took too long."""
        try:
            while (body := self._next_frame()) is None:
                if not (self.spin_s and spin_until_ready(self._poll, self.spin_s)):
                    self._wait(deadline)
                try:
                    data, ancillary, _, _ = self.sock.recvmsg(_READ_BYTES, socket.CMSG_SPACE(MAX_FDS * 4))
                except OSError as exc:
                    raise FeedError(f"the other side of the feed is gone ({exc.strerror or exc})") from None
                self._fds += _descriptors(ancillary)
                if not data:
                    if self._buffer:
                        raise FeedError("the other side of the feed closed it in the middle of a frame")
                    raise FeedClosed("the other side of the feed closed it")
                self._buffer += data
            fds, self._fds = self._fds, []
            try:
                return json.loads(body), fds
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                close_fds(fds)
                raise FeedError(f"an unreadable feed frame: {str(exc)[:200]}") from None
        except BaseException:
            close_fds(self._fds)
            self._fds = []
            raise

    def _next_frame(self) -> bytes | None:
        """The next whole frame's body out of what was read, or None until it is all in."""
        if len(self._buffer) < _LENGTH.size:
            return None
        (size,) = _LENGTH.unpack_from(self._buffer)
        if size > MAX_FRAME_BYTES:
            raise FeedError(f"a feed frame of {size} bytes, more than the {MAX_FRAME_BYTES} allowed")
        end = _LENGTH.size + size
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[_LENGTH.size:end])
        del self._buffer[:end]
        return body

    def _wait(self, deadline: float | None) -> None:
        if deadline is None:
            return
        remaining_ms = (deadline - time.monotonic()) * 1e3
        if remaining_ms <= 0 or not self._poll.poll(math.ceil(remaining_ms)):
            raise FeedError("the other side of the feed did not answer in time")

    def close(self) -> None:
        self.sock.close()


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(data[: len(data) - len(data) % received.itemsize])
            fds.extend(received)
    return fds


def spin_until_ready(poll: Any, spin_s: float) -> list[int]:
    """The descriptors ``poll`` finds ready within ``spin_s``, polled without sleeping; empty if none."""
    end = time.perf_counter() + spin_s
    while True:
        ready = poll.poll(0)
        if ready:
            return [fd for fd, _ in ready]
        if time.perf_counter() >= end:
            return []


def close_fds(fds: list[int]) -> None:
    """Close descriptors that came with a frame and are not taken."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """The item's feed: the trusted child's end first."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


# -- the layout ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorPlace:
    """Where one tensor of a set, or one output of the slot, lies: a region (by device kind) and an offset."""

    region: str  # "cuda" or "cpu"
    offset: int
    dtype: str  # torch's name without ``torch.``
    shape: list[int]
    strides: list[int]

    def to_wire(self) -> list[Any]:
        return [self.region, self.offset, self.dtype, self.shape, self.strides]

    @classmethod
    def from_wire(cls, value: Any) -> TensorPlace:
        region, offset, dtype, shape, strides = value
        return cls(str(region), int(offset), str(dtype), [int(d) for d in shape], [int(s) for s in strides])


@dataclass(frozen=True)
class SlotPlace:
    """Where one output of a call goes in the slot: a region, an offset, and room for this many
    bytes, which the output fills as one contiguous tensor of its own dtype and shape."""

    region: str
    offset: int
    capacity: int

    def to_wire(self) -> list[Any]:
        return [self.region, self.offset, self.capacity]

    @classmethod
    def from_wire(cls, value: Any) -> SlotPlace:
        region, offset, capacity = value
        return cls(str(region), int(offset), int(capacity))


@dataclass(frozen=True)
class Layout:
    """What the trusted child chose for a fed child: each region's size, each set's inputs (a
    tensor's place, or a plain value), and the output slot (a place per output the reference
    returns as a tensor, None for a plain value). Sent once per item; the fed child builds its
    tensors from it, nothing else."""

    region_bytes: dict[str, int]
    sets: list[list[Any]]  # per set, per input: a TensorPlace or ("value", v)
    slot: list[SlotPlace | None]

    def to_wire(self) -> dict[str, Any]:
        return {"region_bytes": self.region_bytes,
                "sets": [[p.to_wire() if isinstance(p, TensorPlace) else {"v": p[1]} for p in inputs] for inputs in self.sets],
                "slot": [p.to_wire() if p is not None else None for p in self.slot]}

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Layout:
        """In the fed child, from the trusted child (trusted: a malformed one is a harness bug)."""
        sets = [[TensorPlace.from_wire(p) if isinstance(p, list) else ("value", p["v"]) for p in inputs] for inputs in value["sets"]]
        slot = [SlotPlace.from_wire(p) if p is not None else None for p in value["slot"]]
        return cls({str(k): int(v) for k, v in value["region_bytes"].items()}, sets, slot)


# -- a call's outcome, as the fed child reports it --------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """What a timed call returned, as its child says: the outputs' structure, and per output a
    tensor copied to its place in the slot (its dtype and shape), a plain value, or a tensor too
    large for its place (its dtype and shape only); and what the child itself found wrong (a
    lazy object, a tensor on another device)."""

    set_index: int
    structure: Any
    leaves: list[Any]  # ("slot", dtype, shape) | ("value", v) | ("tensor", dtype, shape)
    problems: list[str]
    aliases: list[list[int]] = field(default_factory=list)  # [output, input] pairs that share memory

    def to_wire(self) -> dict[str, Any]:
        keys = {"slot": "s", "tensor": "t"}
        leaves = [{"v": leaf[1]} if leaf[0] == "value" else {keys[leaf[0]]: [leaf[1], leaf[2]]} for leaf in self.leaves]
        return {"set": self.set_index, "structure": self.structure, "leaves": leaves, "problems": self.problems, "aliases": self.aliases}

    @classmethod
    def parse(cls, value: Any, n_sets: int, max_leaves: int) -> Outcome:
        """From the fed child: ``FeedError`` unless every field is what ``to_wire`` makes."""
        if not isinstance(value, dict) or set(value) != {"set", "structure", "leaves", "problems", "aliases"}:
            raise FeedError(f"a call's outcome is not an outcome: {str(value)[:120]}")
        set_index, leaves, problems, aliases = value["set"], value["leaves"], value["problems"], value["aliases"]
        if not (isinstance(aliases, list) and len(aliases) <= 4096
                and all(isinstance(a, list) and len(a) == 2 and all(type(i) is int and i >= 0 for i in a) for a in aliases)):
            raise FeedError("a call's outcome lists its outputs' aliases unreadably")
        if type(set_index) is not int or not 0 <= set_index < n_sets:
            raise FeedError(f"a call's outcome names input set {set_index!r} of {n_sets}")
        if not isinstance(leaves, list) or len(leaves) > max_leaves:
            raise FeedError(f"a call's outcome holds {len(leaves) if isinstance(leaves, list) else 'no list of'} outputs")
        if not isinstance(problems, list) or len(problems) > 64 or not all(isinstance(p, str) for p in problems):
            raise FeedError("a call's outcome lists its problems unreadably")
        parsed: list[Any] = []
        for leaf in leaves:
            key = next(iter(leaf), None) if isinstance(leaf, dict) and len(leaf) == 1 else None
            if key == "v" and type(leaf["v"]) in PLAIN_VALUES:
                parsed.append(("value", leaf["v"]))
            elif key in ("s", "t") and _dtype_and_shape(leaf[key]):
                parsed.append(("slot" if key == "s" else "tensor", leaf[key][0], leaf[key][1]))
            else:
                raise FeedError(f"a call's outcome holds an unreadable output {str(leaf)[:80]}")
        return cls(set_index, value["structure"], parsed, [p[:500] for p in problems], aliases)


def _dtype_and_shape(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and len(value[0]) <= 40
            and isinstance(value[1], list) and len(value[1]) <= 64 and all(type(d) is int and d >= 0 for d in value[1]))
