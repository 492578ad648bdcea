"""The trusted child's side of the feed (``feed.py``): it makes the inputs of every timed call of a
fed child (the candidate's or the baseline's) in that child's memory, and judges the outputs there.

One ``Feeder`` per fed child and item. Before each timed call it judges the last call's outcome,
then writes fresh values, from a seed drawn here, into the set the next call uses, waits for the
writes, and only then answers. So:

- the seeds, the inputs as made and the reference never leave this process;
- a call's inputs do not exist before its turn, so no call can work ahead for the next ones;
- every timed call's outputs are judged where the child left them: their kinds, dtypes and shapes
  every time, their values, read as plain tensors built here, on a share of the calls (all of them
  unless checks are slow next to the calls: ``Pricing``). The draw is made after the call, so
  neither the call nor its child can know whether it will be checked.

Judged as the correctness stage judges (``correctness.py``, or the case's own checker): the
outputs' structure and values, the INPLACE inputs the reference writes, and every other input
unchanged. What the pytest process hears is the verdict (``report``): calls, checks, the first
problems, and how long each call's turn took by this process's clock.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_kcoral import checker, correctness
from pytest_kcoral.case_runtime import CaseRuntime
from pytest_kcoral.child_outputs import clone_values, flatten_outputs, leaves, require_plain_outputs, synchronize
from pytest_kcoral.feed import PLAIN_VALUES, FeedChannel, FeedClosed, FeedError, Layout, Outcome, SlotPlace, TensorPlace
from pytest_kcoral.messages import FeedPeer, FeedRound
from pytest_kcoral.shared_memory import ALIGN, MappedRegion, RegionInfo, SharedMemoryError, aligned, contiguous_strides, span_bytes
from pytest_kcoral.timing.placement import SMALL_SET_BYTES, SMALL_SET_COUNT, tensor_bytes

# Inputs larger than this get one set: fresh values before every call already defeat a cache, and
# three sets of a KernelBench problem at its own size would take tens of GB in each fed child.
ONE_SET_BYTES = 256 << 20
MAX_SETS = SMALL_SET_COUNT
_PAD_QUANTA = 2048  # small sets lie behind pads of up to this many ``ALIGN`` units (``timing.placement``)
# Which timed calls have their values checked (their kinds, dtypes and shapes are, every one): all
# of them while a check (the reference and the comparison) takes at most CHECK_FREE_S; past that,
# as many as keep the checks to CHECK_TURN_SHARE of a baseline call's turn, and never fewer than
# MIN_CHECK_SHARE. Both sides of an item get the same share (``Pricing``), so neither's time
# outside its windows grows by the other's checks. A candidate must skip its work on half its
# calls or more to move a median, so even the floor catches it within a few dozen calls.
CHECK_FREE_S = 50e-6
CHECK_TURN_SHARE = 0.5
MIN_CHECK_SHARE = 0.05
_COSTS_KEPT = 15  # the latest checks' costs, whose median prices the next ones
# A check's cost, waited for on the device: the first few checks of a feed, then one in so many
_PRICED_FIRST = 4
_PRICE_EVERY = 32
PROBLEMS_KEPT = 5
FRAME_DEADLINE_S = 10.0  # for the rest of a frame once its first bytes came


@dataclass
class _Round:
    calls: int = 0
    checked: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # (timed call, problem)
    # checks counted on the device and not read yet: (timed call, messages, counts), read once a round
    tallies: list[tuple[int, list[str], Any]] = field(default_factory=list)
    intervals_us: list[float] = field(default_factory=list)

    def read_tallies(self) -> None:
        """The round's counted checks, read with one wait for the device: a message for each count that is not zero."""
        if not self.tallies:
            return
        import torch

        values = torch.cat([counts.reshape(-1) for _, _, counts in self.tallies]).tolist()
        at = 0
        for call, labels, _ in self.tallies:
            self.problems += [(call, label.format(n)) for label, n in zip(labels, values[at:at + len(labels)]) if n]
            at += len(labels)
        self.tallies = []

    def report(self, closed: str = "") -> FeedRound:
        self.read_tallies()
        median = statistics.median(self.intervals_us) if self.intervals_us else None
        problems = [f"timed call {call}: {p}" for call, p in sorted(self.problems, key=lambda entry: entry[0])]
        return FeedRound(calls=self.calls, checked=self.checked, problems=problems[:PROBLEMS_KEPT], turn_median_us=median, closed=closed)


class Pricing:
    """How often an item's timed calls are checked, shared by the feeds of its two sides
    (``CHECK_FREE_S``): from what checks cost, and how long the baseline's calls take."""

    def __init__(self) -> None:
        self.costs_s: list[float] = []
        self.baseline_turns_us: list[float] = []
        self.share = 1.0

    def add_cost(self, took_s: float) -> None:
        self.costs_s = [*self.costs_s[-(_COSTS_KEPT - 1):], took_s]
        cost_s = statistics.median(self.costs_s)
        if cost_s <= CHECK_FREE_S or not self.baseline_turns_us:
            self.share = 1.0
            return
        turn_s = statistics.median(self.baseline_turns_us) / 1e6
        self.share = min(1.0, max(MIN_CHECK_SHARE, CHECK_TURN_SHARE * turn_s / cost_s))

    def add_baseline_turns(self, turns_us: list[float]) -> None:
        self.baseline_turns_us = turns_us[-256:]


class Feeder:
    """Feeds one child for one item: its input sets and output slot, in its own memory."""

    def __init__(self, case: CaseRuntime, channel: FeedChannel, config: FeedPeer, rng: Any, pricing: Pricing | None = None) -> None:
        self.case = case
        self.channel = channel
        self.config = config
        self.tol = correctness.Tolerance(config.tolerance.atol, config.tolerance.rtol, config.tolerance.strict)
        self.rng = rng
        self.layout: Layout | None = None
        self.regions: dict[str, MappedRegion] = {}
        self.sets: list[tuple] = []  # per set, the child's inputs as views here (plain values as they are)
        self.expected_structure: Any = None
        self.expected_leaves: list[tuple[str, list[int]] | None] = []  # the reference's outputs: dtype and shape, None for a value
        self.pending: tuple[int, tuple] | None = None  # the set written for the call in flight, and its inputs as made
        self.pricing = pricing or Pricing()
        self.rounds: list[_Round] = []
        self.current = _Round()
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
            self.current.intervals_us.append((time.perf_counter() - self.turn_started) * 1e6)
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
            self.current.read_tallies()  # the last calls' checks, while the slot still holds the last outputs
            if self.config.peer == "baseline":
                self.pricing.add_baseline_turns(self.current.intervals_us)
            self.rounds.append(self.current)
            self.current = _Round()
            return {"ok": True}
        raise FeedError(f"an unknown feed request {str(op)[:40]!r}")

    def report(self, final: bool) -> list[FeedRound]:
        """The rounds since the last report (one cut short included); ``final``: the item is
        done with this child, whose memory is let go."""
        rounds = [r.report() for r in self.rounds]
        if self.current.calls or self.closed:
            rounds.append(self.current.report(self.closed))
            self.current = _Round()
        self.rounds = []
        if final:
            self.close()
        return rounds

    @property
    def open(self) -> bool:
        """Whether the child's socket is still served (a closed feed is only reported)."""
        return not self.ended

    def close(self) -> None:
        for region in self.regions.values():
            region.close()
        self.regions, self.sets, self.pending = {}, [], None
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
        """One input set made here tells each input's kind, dtype, shape and strides; the
        reference's outputs on it, the slot's."""
        if self.layout is not None:
            raise FeedError("a second hello on one feed")
        wanted = message.get("sets")
        if type(wanted) is not int or not 1 <= wanted <= MAX_SETS:
            raise FeedError(f"asked for {wanted!r} input sets (1 to {MAX_SETS})")
        shape = self.config.shape
        args = self.case.make_inputs(shape, self.rng.getrandbits(62))
        outputs, self.expected_structure = flatten_outputs(self.case.reference(shape, clone_values(args)))
        require_plain_outputs(outputs, "reference")
        self.expected_leaves = [(str(o.dtype).removeprefix("torch."), list(o.shape)) if hasattr(o, "dtype") else None for o in outputs]
        self.layout = choose_layout(args, outputs, self.config.device, wanted, self.rng, self.config.checker)
        return self.layout

    def _map(self, message: dict[str, Any], fds: list[int]) -> None:
        """The child's regions, opened here, checked against the layout, and every set filled."""
        layout = self.layout
        if layout is None or self.regions:
            _close_fds(fds)
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
                _close_fds([host_fd])
        self.sets = [tuple(self._view(p) if isinstance(p, TensorPlace) else p[1] for p in inputs) for inputs in layout.sets]
        for k in range(len(self.sets)):
            self._write(k)
        synchronize(self.config.device)
        self.pending = None

    def _view(self, place: TensorPlace) -> Any:
        import torch

        return self.regions[place.region].view(place.offset, getattr(torch, place.dtype), place.shape, place.strides)

    # -- a call --------------------------------------------------------------------------------------

    def _write(self, k: int) -> tuple:
        """Fresh values, from a seed of this process's, into set ``k``; the inputs as made."""
        import torch

        made = self.case.make_inputs(self.config.shape, self.rng.getrandbits(62))
        target = self.sets[k]
        if len(made) != len(target):
            raise RuntimeError(f"the case's make_inputs returned {len(made)} inputs for one seed and {len(target)} for another")
        for j, (dst, src) in enumerate(zip(target, made)):
            if isinstance(dst, torch.Tensor):
                if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
                    raise RuntimeError(f"the case's make_inputs returned input {j} of another kind, dtype or shape for another seed")
                dst.copy_(src)
        return made

    def _refresh(self, k: int) -> None:
        made = self._write(k)
        synchronize(self.config.device)  # written before the child may call: its window opens after the answer
        self.pending = (k, made)

    def _judge(self, prev: Any) -> None:
        """The last call's outcome: counted, its kinds checked, and (with the item's share, drawn
        now) its values."""
        if self.pending is None:
            if prev is not None:
                raise FeedError("an outcome reported before any call")
            return
        k, made = self.pending
        self.pending = None
        if prev is None:
            raise FeedError("a call's outcome went unreported")
        assert self.layout is not None
        outcome = Outcome.parse(prev, len(self.sets), len(self.layout.slot) + 64)
        call = self.current.calls = self.current.calls + 1
        problems = list(outcome.problems)
        if outcome.set_index != k:
            problems.append(f"its child says it called input set {outcome.set_index}, the set made for it was {k}")
        if not problems:
            problems = self._check_kinds(outcome)
        if not problems and self.rng.random() < self.pricing.share:
            self.current.checked += 1
            problems = self._check(outcome, call, k, made)
        self.current.problems += [(call, p) for p in problems]

    def _check(self, outcome: Outcome, call: int, k: int, made: tuple) -> list[str]:
        """The call's values, as the correctness stage judges them. What can be counted on the
        device is left counting (``_Round.tallies``); the rest is decided now."""
        assert self.layout is not None
        outputs, problems = outputs_of(outcome, self.layout.slot, self.regions, self.config.checker)
        if problems:
            return problems
        after, config = self.sets[k], self.config
        priced = len(self.pricing.costs_s) < _PRICED_FIRST or self.current.checked % _PRICE_EVERY == 0
        if priced:
            synchronize(config.device)
        started = time.perf_counter()
        if config.checker:
            try:
                problems = checker.problems_of(self.case.check(clone_values(made), checker.rebuild(outcome.structure, outputs)))
            except Exception as exc:  # noqa: BLE001 - a checker that raises on an output rejects it
                problems = [f"the problem's check_implementation raised {type(exc).__name__} on this output: {exc}"[:checker.MESSAGE_LIMIT_CHARS]]
            problems += correctness.describe_changed_inputs(correctness.changed_inputs(made, after), config.may_write)
        else:
            ref_args = clone_values(made)
            judge = self.case.baseline if config.against == "baseline" else self.case.reference
            expected = leaves(judge(config.shape, ref_args))
            written = config.written_inputs
            names = [f"output {i}" for i in range(len(outputs))] + correctness.written_input_names(written)
            tally = correctness.mismatch_tally((*outputs, *(after[j] for j in written)), (*expected, *(ref_args[j] for j in written)),
                                               self.tol, names, made, after, config.may_write)
            if tally is not None:
                if tally[1] is not None:
                    self.current.tallies.append((call, *tally))
            else:  # kinds that differ, or rules of more than one pass: decided now, in full
                problems = correctness.compare_outputs(outputs, expected, self.tol)
                if not problems and written:
                    problems = correctness.compare_outputs(tuple(after[j] for j in written), tuple(ref_args[j] for j in written), self.tol,
                                                           correctness.written_input_names(written))
                problems += correctness.describe_changed_inputs(correctness.changed_inputs(made, after), config.may_write)
        if priced:
            synchronize(config.device)
            self.pricing.add_cost(time.perf_counter() - started)
        return problems

    def _check_kinds(self, outcome: Outcome) -> list[str]:
        """Every call's outputs, by what its child says of them: the reference's structure, and
        each a tensor of the reference's dtype and shape (or a plain value where it returns one).
        A case's own checker may take other dtypes and shapes: then only tensors against values."""
        problems = correctness.compare_structure(outcome.structure, self.expected_structure)
        if problems:
            return problems
        if len(outcome.leaves) != len(self.expected_leaves):
            return [f"returned {len(outcome.leaves)} output(s), the reference returns {len(self.expected_leaves)}"]
        for i, (leaf, expected) in enumerate(zip(outcome.leaves, self.expected_leaves)):
            if (leaf[0] == "value") != (expected is None):
                problems.append(f"output {i} is {'a plain value' if leaf[0] == 'value' else 'a tensor'}, the reference returns"
                                f" {'a plain value' if expected is None else 'a tensor'}")
            elif expected is not None and not self.config.checker and (leaf[1], list(leaf[2])) != expected:
                problems.append(f"output {i} is a {leaf[1]} tensor of shape {tuple(leaf[2])}, the reference's a {expected[0]} of shape"
                                f" {tuple(expected[1])}")
        return problems


def choose_layout(args: tuple, outputs: tuple, device: str, wanted: int, rng: Any, any_dtype: bool = False) -> Layout:
    """Where a fed child puts its input sets (each tensor like ``args``' in kind, dtype, shape and
    strides, with pads before small sets) and its output slot (room for each of ``outputs``, for
    any dtype of up to 8 bytes an element with ``any_dtype``: a case's own checker may take
    another dtype than its reference's), and how many sets: ``wanted``, ``SMALL_SET_COUNT`` for
    small inputs on a GPU, one for large ones."""
    import torch  # as in ``child_outputs``

    set_bytes = tensor_bytes(args)
    small = device.startswith("cuda") and set_bytes <= SMALL_SET_BYTES
    n_sets = 1 if set_bytes > ONE_SET_BYTES else SMALL_SET_COUNT if small else wanted
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
    for _ in range(n_sets):
        inputs: list[Any] = []
        for j, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                inputs.append(place(a, pad=small and j == 0))
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
        _close_fds(fds)
        raise FeedError("file descriptors came with a frame that takes none")


def _close_fds(fds: list[int]) -> None:
    import os

    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
