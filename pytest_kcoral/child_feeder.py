"""The trusted child's side of the feed (``feed.py``): it makes a fed child's inputs (the
candidate's or the baseline's) in that child's memory, call by call, and has them judged there.

One ``Feeder`` per fed child and item. Before each call it has the last call's outcome judged, then
writes the set the next call uses, waits for the writes, and only then answers. So:

- the seeds, the inputs as made and the reference never leave this process;
- a call's inputs do not exist before its turn, so no call can work ahead for the next ones;
- a call's outputs are read where its child left them, as plain tensors built here.

What is written and how it is judged is the judge's (``child_judges``): for timed calls fresh values
from a seed drawn here, judged on a share of the calls and counted on the device; for the
correctness trials the trials the reference kept, judged in full. What the pytest process hears is
the verdict (``report``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from pytest_kcoral.case_runtime import CaseRuntime
from pytest_kcoral.child_outputs import synchronize
from pytest_kcoral.feed import PLAIN_VALUES, FeedChannel, FeedClosed, FeedError, Layout, Outcome, SlotPlace, TensorPlace, close_fds
from pytest_kcoral.messages import FeedPeer, FeedReportReply
from pytest_kcoral.shared_memory import ALIGN, MappedRegion, RegionInfo, SharedMemoryError, aligned, contiguous_strides, span_bytes
from pytest_kcoral.timing.placement import SMALL_SET_BYTES, SMALL_SET_COUNT

# Inputs larger than this get one set: fresh values before every call already defeat a cache, and
# three sets of a KernelBench problem at its own size would take tens of GB in each fed child.
ONE_SET_BYTES = 256 << 20
MAX_SETS = SMALL_SET_COUNT
_PAD_QUANTA = 2048  # small sets lie behind pads of up to this many ``ALIGN`` units (``timing.placement``)
FRAME_DEADLINE_S = 10.0  # for the rest of a frame once its first bytes came


class Judge(Protocol):
    """What a feed's calls are fed, and how they are judged (``child_judges``)."""

    rng: Any  # this process's unpredictable draws

    def layout_inputs(self, wanted: int) -> tuple[list[tuple], tuple, bool]:
        """Per set, inputs like those it will hold; the reference's outputs on them; whether each set gets a pad."""
        ...

    def prefill(self, k: int) -> tuple:
        """The inputs set ``k`` holds once mapped, before any call."""
        ...

    def inputs_for(self, k: int) -> tuple:
        """The inputs set ``k`` gets before its next call."""
        ...

    def judge(self, outcome: Outcome, k: int, made: tuple, after: tuple, outputs: Callable[[], tuple[list[Any], list[str]]]) -> None:
        """One call on set ``k``: its child's ``outcome``, the inputs as ``made``, the set as the
        call left it (``after``), and its outputs as read from the slot (``outputs()``)."""
        ...

    def turn(self, us: float) -> None:
        """A call's whole turn, by this process's clock."""

    def end(self) -> None:
        """The child's round (or its trials) is over."""

    def report(self, closed: str, error: str) -> FeedReportReply: ...

    def let_go(self) -> None:
        """The feed is over: the device memory held for its calls goes."""


class Feeder:
    """Feeds one child for one item: its input sets and output slot, in its own memory."""

    def __init__(self, case: CaseRuntime, channel: FeedChannel, config: FeedPeer, judge: Judge) -> None:
        self.case = case
        self.channel = channel
        self.config = config
        self.judge = judge
        self.layout: Layout | None = None
        self.regions: dict[str, MappedRegion] = {}
        self.sets: list[tuple] = []  # per set, the child's inputs as views here (plain values as they are)
        self.pending: tuple[int, tuple] | None = None  # the set written for the call in flight, and its inputs as made
        self.closed = ""  # why the feed ended early (the child's fault), or ""
        self.error = ""  # the case's own failure while feeding, or ""
        self.ended = False  # the socket is closed
        self.turn_started: float | None = None

    def fileno(self) -> int:
        return self.channel.fileno()

    # -- serving ----------------------------------------------------------------------------------

    def serve_one(self) -> None:
        """Answer the child's next frame. A frame that does not parse, or a feed that broke,
        closes the feed, with why in the next report: the child's failure. The case's own code
        raising (its make_inputs, its reference) closes it too, as the case's failure (``error``)."""
        if self.ended:
            return
        try:
            message, fds = self.channel.recv(deadline=time.monotonic() + FRAME_DEADLINE_S)
        except FeedClosed as exc:
            # between rounds, a fed child that is done (or gone: its own failure says so first)
            self._close(str(exc) if self.pending is not None else "")
            return
        except FeedError as exc:
            self._close(str(exc))
            return
        if self.turn_started is not None and isinstance(message, dict) and message.get("op") in ("call", "end"):
            self.judge.turn((time.perf_counter() - self.turn_started) * 1e6)
        try:
            reply = self._handle(message, fds)
        except FeedError as exc:
            self._refuse(str(exc))
            return
        except SharedMemoryError as exc:
            self._refuse(f"its memory could not be used: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - the case's code, run here: the case's failure, said in the report
            self.error = f"{type(exc).__name__}: {exc}"[:2000]
            self._refuse(f"the case itself failed while making inputs or checking outputs: {self.error}")
            return
        self.turn_started = time.perf_counter() if message.get("op") == "call" else None
        try:
            self.channel.send(reply)
        except FeedError as exc:
            self._close(str(exc))

    def _handle(self, message: Any, fds: list[int]) -> dict[str, Any]:
        op = message.get("op") if isinstance(message, dict) else None
        if op == "hello":
            _no_fds(fds)
            return {"ok": True, "layout": self._hello(message).to_wire()}
        if op == "map":
            self._map(message, fds)
            return {"ok": True}
        _no_fds(fds)
        if self.layout is None or not self.sets:
            raise FeedError(f"a {op!r} before the feed was set up")
        if op == "call":
            self._judge(message.get("prev"))
            k = message.get("set")
            if type(k) is not int or not 0 <= k < len(self.sets):
                raise FeedError(f"a call on input set {k!r} of {len(self.sets)}")
            self._refresh(k)
            return {"ok": True}
        if op == "end":
            self._judge(message.get("prev"))
            self.judge.end()  # while the slot still holds the last outputs
            return {"ok": True}
        raise FeedError(f"an unknown feed request {str(op)[:40]!r}")

    def report(self, final: bool) -> FeedReportReply:
        """What the judge found since the last report; ``final``: the item is done with this
        child, whose memory is let go."""
        reply = self.judge.report(self.closed, self.error)
        if final:
            self.close()
        return reply

    @property
    def open(self) -> bool:
        """Whether the child's socket is still served (a closed feed is only reported)."""
        return not self.ended

    def close(self) -> None:
        for region in self.regions.values():
            region.close()
        self.regions, self.sets, self.pending = {}, [], None
        self.judge.let_go()
        self.channel.close()

    def _refuse(self, why: str) -> None:
        try:
            self.channel.send({"ok": False, "error": why})
        except FeedError:
            pass
        self._close(why)

    def _close(self, why: str) -> None:
        """The feed ends: the child's next request finds its socket closed. ``why``: how it broke
        (the fed child's failure), or empty for a child that closed it between rounds."""
        if why and not self.error:
            self.closed = f"the feed of inputs from the trusted child broke: {why}"
        self.ended = True
        self.close()

    # -- the layout and the memory ----------------------------------------------------------------

    def _hello(self, message: dict[str, Any]) -> Layout:
        """The layout of the child's sets and slot, from the inputs the judge will write and the
        reference's outputs on them."""
        if self.layout is not None:
            raise FeedError("a second hello on one feed")
        wanted = message.get("sets")
        if type(wanted) is not int or not 1 <= wanted <= MAX_SETS:
            raise FeedError(f"asked for {wanted!r} input sets (1 to {MAX_SETS})")
        per_set, outputs, pads = self.judge.layout_inputs(wanted)
        self.layout = choose_layout(per_set, outputs, self.config.device, pads, self.judge.rng, self.config.checker)
        return self.layout

    def _map(self, message: dict[str, Any], fds: list[int]) -> None:
        """The child's regions, opened here, checked against the layout, and every set filled."""
        layout = self.layout
        if layout is None or self.regions:
            close_fds(fds)
            raise FeedError("a map before the hello, or a second map")
        offered = message.get("regions")
        host_fd = fds[0] if fds else None
        try:
            if not isinstance(offered, dict) or set(offered) != set(layout.region_bytes) or len(fds) > 1:
                raise FeedError(f"regions {sorted(offered) if isinstance(offered, dict) else offered!r} offered for"
                                f" {sorted(layout.region_bytes)}")
            for kind, need in layout.region_bytes.items():
                info = _region_info(offered[kind], kind)
                if info.nbytes < need:
                    raise FeedError(f"a {kind} region of {info.nbytes} bytes, the layout needs {need}")
                device = self.config.device if kind == "cuda" else "cpu"
                self.regions[kind] = MappedRegion(info, device, host_fd if kind == "cpu" else None)
                if kind == "cpu":
                    host_fd = None
        finally:
            if host_fd is not None:
                close_fds([host_fd])
        self.sets = [tuple(self._view(p) if isinstance(p, TensorPlace) else p[1] for p in inputs) for inputs in layout.sets]
        for k in range(len(self.sets)):
            self._write(k, self.judge.prefill(k))
        synchronize(self.config.device)
        self.pending = None

    def _view(self, place: TensorPlace) -> Any:
        import torch

        return self.regions[place.region].view(place.offset, getattr(torch, place.dtype), place.shape, place.strides)

    # -- a call --------------------------------------------------------------------------------------

    def _write(self, k: int, made: tuple) -> None:
        """The judge's inputs ``made``, written into set ``k``."""
        import torch

        target = self.sets[k]
        if len(made) != len(target):
            raise RuntimeError(f"the case's make_inputs returned {len(made)} inputs for one seed and {len(target)} for another")
        for j, (dst, src) in enumerate(zip(target, made)):
            if isinstance(dst, torch.Tensor):
                if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
                    raise RuntimeError(f"the case's make_inputs returned input {j} of another kind, dtype or shape for another seed")
                dst.copy_(src)

    def _refresh(self, k: int) -> None:
        made = self.judge.inputs_for(k)
        self._write(k, made)
        synchronize(self.config.device)  # written before the child may call: its window opens after the answer
        self.pending = (k, made)

    def _judge(self, prev: Any) -> None:
        """The last call's outcome, for the judge."""
        if self.pending is None:
            if prev is not None:
                raise FeedError("an outcome reported before any call")
            return
        k, made = self.pending
        self.pending = None
        if prev is None:
            raise FeedError("a call's outcome went unreported")
        layout = self.layout
        assert layout is not None
        outcome = Outcome.parse(prev, len(self.sets), len(layout.slot) + 64)
        self.judge.judge(outcome, k, made, self.sets[k], lambda: outputs_of(outcome, layout.slot, self.regions, self.config.checker))


def timed_sets(set_bytes: int, device: str, wanted: int) -> tuple[int, bool]:
    """How many sets a timed call's inputs of ``set_bytes`` rotate over, and whether each lies
    behind a pad of its own: ``wanted``; ``SMALL_SET_COUNT``, padded, for small inputs on a GPU;
    one for large ones."""
    small = device.startswith("cuda") and set_bytes <= SMALL_SET_BYTES
    return (1 if set_bytes > ONE_SET_BYTES else SMALL_SET_COUNT if small else wanted), small


def choose_layout(per_set: list[tuple], outputs: tuple, device: str, pads: bool, rng: Any, any_dtype: bool = False) -> Layout:
    """Where a fed child puts its input sets (each tensor like the one ``per_set`` holds for it, in
    kind, dtype, shape and strides; with ``pads``, each set behind a random pad) and its output
    slot (room for each of ``outputs``, for any dtype of up to 8 bytes an element with
    ``any_dtype``: a case's own checker may take another dtype than its reference's)."""
    import torch  # as in ``child_outputs``

    ends: dict[str, int] = {}

    def room(region: str, nbytes: int, pad: bool) -> int:
        start = ends.get(region, 0)
        if pad:  # each small set behind a pad of its own: no median rests on one placement
            start += rng.randrange(1, _PAD_QUANTA) * ALIGN
        ends[region] = start + aligned(nbytes)
        return start

    def place(t: Any, pad: bool) -> TensorPlace:
        region = "cuda" if t.is_cuda else "cpu"
        strides = _dense_strides(list(t.shape), list(t.stride()))
        start = room(region, span_bytes(t.element_size(), list(t.shape), strides), pad)
        return TensorPlace(region, start, str(t.dtype).removeprefix("torch."), list(t.shape), strides)

    sets = []
    for args in per_set:
        inputs: list[Any] = []
        for j, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                inputs.append(place(a, pad=pads and j == 0))
            elif type(a) in PLAIN_VALUES:
                inputs.append(("value", a))
            else:
                raise TypeError(f"the case's inputs hold a {type(a).__name__} (input {j}): the timed calls' inputs must be tensors"
                                " or plain numbers, strings and None")
        sets.append(inputs)
    slot: list[SlotPlace | None] = []
    for o in outputs:
        if not isinstance(o, torch.Tensor):
            slot.append(None)
            continue
        region = "cuda" if device.startswith("cuda") else "cpu"
        capacity = aligned(max(o.numel() * o.element_size(), o.numel() * 8 if any_dtype else 0))
        slot.append(SlotPlace(region, room(region, capacity, pad=False), capacity))
    return Layout(region_bytes={k: aligned(v) for k, v in ends.items()}, sets=sets, slot=slot)


def outputs_of(outcome: Outcome, slot: list[SlotPlace | None], regions: dict[str, MappedRegion], checker: bool) -> tuple[list[Any], list[str]]:
    """The call's outputs, tensors over the slot and plain values as they came; or the problems
    that say why they cannot be read. A tensor too large for its place is stood in for by a
    ``meta`` tensor of its dtype and shape, which the comparison refuses before it reads a value
    (a case's checker gets the problem instead)."""
    import torch

    if len(outcome.leaves) != len(slot):
        return [], [f"returned {len(outcome.leaves)} output(s), the reference returns {len(slot)}"]
    values: list[Any] = []
    problems: list[str] = []
    for i, (leaf, place) in enumerate(zip(outcome.leaves, slot)):
        if leaf[0] == "value":
            values.append(leaf[1])
            continue
        dtype = getattr(torch, leaf[1], None)
        if not isinstance(dtype, torch.dtype):
            problems.append(f"output {i} has an unknown dtype {leaf[1]!r}")
        elif leaf[0] == "tensor" or place is None:
            if checker or place is None:
                problems.append(f"output {i} is a {leaf[1]} tensor of shape {tuple(leaf[2])}, larger than the reference's output"
                                if place is not None else f"output {i} is a tensor, the reference returns a plain value")
            else:
                values.append(torch.empty(leaf[2], dtype=dtype, device="meta"))
        elif span_bytes(dtype.itemsize, leaf[2], contiguous_strides(leaf[2])) > place.capacity:
            problems.append(f"output {i} was said to fit its place in the slot, and does not (results forged?)")
        else:
            values.append(regions[place.region].view(place.offset, dtype, leaf[2], contiguous_strides(leaf[2])))
    return values, problems


def _dense_strides(shape: list[int], strides: list[int]) -> list[int]:
    """A tensor's own strides when its elements fill their span once each (a transposed or
    permuted input keeps its layout), else the contiguous ones (an expanded input gets memory of
    its own for each element)."""
    order = sorted((s, d) for d, s in zip(shape, strides) if d != 1)
    step = 1
    for s, d in order:
        if s != step:
            return contiguous_strides(shape)
        step *= d
    return strides


def _region_info(value: Any, kind: str) -> RegionInfo:
    if not (isinstance(value, dict) and set(value) == {"kind", "nbytes", "handle", "offset"} and value["kind"] == kind
            and type(value["nbytes"]) is int and type(value["offset"]) is int and isinstance(value["handle"], str)):
        raise FeedError(f"an unreadable {kind} region {str(value)[:120]}")
    return RegionInfo(kind, value["nbytes"], value["handle"], value["offset"])


def _no_fds(fds: list[int]) -> None:
    if fds:
        close_fds(fds)
        raise FeedError("file descriptors came with a frame that takes none")
