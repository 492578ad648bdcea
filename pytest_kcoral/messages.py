"""The commands a child serves and the replies it sends, as dataclasses parsed strictly.

Both sides of the wire use these types: the pytest process builds a command, the channel
(``protocol.py``) carries it as a JSON header and a tensor payload, and the child parses it back
(``child._Runner.handle``); the reply goes the same way back. Parsing refuses an unknown field, a
missing one without a default, and a value of the wrong type, naming where it is: a child's reply
is untrusted, and what it sends must not reach the grading code as anything but what it says.
Each default is written once, in its field.

A field named ``payload`` travels as the message's payload (tensors and plain values), every other
field in its header. ``op`` names a command on the wire.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar, Union

from pytest_kcoral.results import TimingStats


class MessageError(ValueError):
    """A message that does not parse: the text names the message, the field and what was wrong."""


M = TypeVar("M", bound="Message")

# Keys the channel adds around a message (``isolation.Child.call``, ``protocol.send``, the child's
# echo): not the message's own.
ENVELOPE_KEYS = frozenset({"cmd", "ok", "seq", "nonce", "payload", "stack_dump_after_s", "fds"})


@dataclass(frozen=True)
class Message:
    """A header's fields (and a ``payload`` field's) as a dataclass, read with ``parse``."""

    @classmethod
    def parse(cls: type[M], data: Any, what: str | None = None) -> M:
        """``cls`` from a JSON-like mapping; ``MessageError`` unless it fits field for field."""
        return typing.cast(M, _parse_dataclass(cls, data, what or _name(cls)))

    @classmethod
    def from_wire(cls: type[M], header: Mapping[str, Any], payload: Any = None) -> M:
        """``cls`` from a header (less the channel's keys) and the message's payload."""
        fields = {k: v for k, v in header.items() if k not in ENVELOPE_KEYS}
        if _has_payload(cls):
            fields["payload"] = payload
        elif payload is not None:
            raise MessageError(f"{_name(cls)}: a payload, where none belongs")
        return cls.parse(fields)

    def to_wire(self) -> tuple[dict[str, Any], Any]:
        """(header fields, payload): the payload as plain containers, for ``protocol.send``."""
        header = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "payload"}
        payload = getattr(self, "payload", None)
        return header, None if payload is None else _plain(payload)


R = TypeVar("R", bound=Message)


@dataclass(frozen=True)
class Command(Message, Generic[R]):
    """A command a child serves; ``reply`` is the type of what it answers."""

    op: ClassVar[str]
    reply: ClassVar[type[Message]]

    def parse_reply(self, header: Mapping[str, Any], payload: Any) -> R:
        return typing.cast(R, self.reply.from_wire(header, payload))


# -- what is shared ------------------------------------------------------------------------------

Shape = dict[str, Any]  # a case's shape: its parameters by name (``cases.Shape.params``)


@dataclass(frozen=True)
class ErrorInfo(Message):
    """Why a command failed in the child (a reply with ``ok`` false)."""

    type: str
    message: str
    traceback: str = ""
    compile_error: bool = False  # a compiler's error, at import or at the first call
    needs_cuda: bool = False  # the code needs CUDA, and this machine has none
    detected: bool = False  # the child's audit after the command found something


NO_ERROR = ErrorInfo(type="", message="")  # a failure that is no child's error reply (a crash, a timeout)


@dataclass(frozen=True)
class Started(Message):
    """A child's first word: it is ready for commands."""

    pid: int
    startup_s: float = 0.0  # a KCoral worker's start (imports), which the item's time leaves out


@dataclass(frozen=True)
class ToleranceSpec(Message):
    """``correctness.Tolerance`` on the wire."""

    atol: float | None
    rtol: float | None
    strict: bool = False


# -- loading -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Loaded(Message):
    entry: str  # what the module offers: run, prepare, custom_kernel or ModelNew
    kept: bool = False  # a kept child that held the candidate already, built for the new shape


@dataclass(frozen=True)
class LoadCandidate(Command[Loaded]):
    """Import the candidate (a candidate's child), or build the one it holds for a new shape."""

    op: ClassVar[str] = "load_candidate"
    reply: ClassVar[type[Message]] = Loaded
    path: str
    shape: Shape


@dataclass(frozen=True)
class LoadBaseline(Command[Loaded]):
    """Hold the case's baseline in a candidate's place (a baseline child)."""

    op: ClassVar[str] = "load_baseline"
    reply: ClassVar[type[Message]] = Loaded


# -- the correctness run -------------------------------------------------------------------------

@dataclass(frozen=True)
class RunInputs(Message):
    inputs: list[Any]  # per trial, the input tuple, CPU tensors


@dataclass(frozen=True)
class RunResults(Message):
    outputs: list[Any]  # per trial, the output values (``child.flatten_outputs``), or None after findings
    written: Any  # per trial, the written INPLACE inputs' values, or None; ``pipeline`` checks its shape


@dataclass(frozen=True)
class RunReply(Message):
    findings: list[list[str]]  # per trial, what the child found wrong with the outputs it saw
    inputs_changed: list[list[list[int | None]]]  # per trial, [input index, bytes changed or None]
    structures: list[Any]  # per trial, the outputs' containers; checked by ``correctness.structure_leaves``
    output_aliases: list[list[list[int]]]  # per trial, [output, input] pairs sharing memory
    parameters_differ: bool | None  # a KernelBench ModelNew's weights are not Model's
    payload: RunResults


@dataclass(frozen=True)
class Run(Command[RunReply]):
    """Run the loaded callable once per trial: on inputs the trusted child feeds (``fed``), or on
    device copies of those sent; report findings, and outputs unless fed."""

    op: ClassVar[str] = "run"
    reply: ClassVar[type[Message]] = RunReply
    shape: Shape
    device: str
    poison_bytes: list[int]  # NaN-poison blocks of these sizes before each call
    written_inputs: list[int]  # the INPLACE inputs whose values after the call are results
    allowed_aliases: list[list[int]]  # [output, input] pairs that may share memory
    payload: RunInputs  # no inputs when ``fed``
    # the trusted child feeds each trial's inputs and judges its outputs (``feed.py``, after
    # ``AttachFeed``): the reply carries no tensors
    fed: bool = False
    trials: int = 0  # how many trials a fed run calls (the trusted child picks which trial each call gets)


# -- timing --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TimedOutput(Message):
    """A timed call's outputs, kept with its inputs' seed for the check against the reference."""

    seed: int
    outputs: Any  # the output values, or None when the child refused them
    written: Any  # the written INPLACE inputs' values, or None


@dataclass(frozen=True)
class TimedOutputs(Message):
    verify: list[TimedOutput]


@dataclass(frozen=True)
class TimeReply(Message):
    stats: TimingStats
    verify_seeds: list[int]
    payload: TimedOutputs


@dataclass(frozen=True)
class Time(Command[TimeReply]):
    """One timing round of the loaded callable (``timing.measure``) on input sets it keeps."""

    op: ClassVar[str] = "time"
    reply: ClassVar[type[Message]] = TimeReply
    shape: Shape
    device: str
    budget_s: float  # of timed samples in this round
    timer: str | None  # None: the best the device has
    verify: int  # timed outputs to keep (a reservoir sample)
    written_inputs: list[int]
    n_sets: int = 3  # input sets the timed calls rotate through
    cpu: int | None = None  # the core the timing thread pins itself to (``timing/pinning.py``)
    warmup_s: float = 0.05  # warm-up by time before the round's first timed call
    min_samples: int = 5
    send_kept: bool = True  # False: keep timed outputs as the candidate does, and drop them unsent
    # the trusted child feeds the inputs and judges the outputs (``feed.py``, after ``AttachFeed``);
    # False: the child makes its own inputs and keeps ``verify`` outputs for the parent (a KCoral program)
    fed: bool = False


@dataclass(frozen=True)
class Attached(Message):
    pass


@dataclass(frozen=True)
class AttachFeed(Command[Attached]):
    """The item's feed (one file descriptor beside the command): the trusted child's socket, over
    which a fed ``time`` command gets its inputs (``feed.py``)."""

    op: ClassVar[str] = "attach_feed"
    reply: ClassVar[type[Message]] = Attached


@dataclass(frozen=True)
class Finished(Message):
    pass


@dataclass(frozen=True)
class Finish(Command[Finished]):
    """The item's last command to a child: its timing sets go, and the audit runs once more."""

    op: ClassVar[str] = "finish"
    reply: ClassVar[type[Message]] = Finished


# -- the trusted child ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ReferenceResults(Message):
    inputs: list[Any]  # per seed, the input tuple
    reference: list[Any]  # per seed, the reference's output values
    written: list[Any]  # per seed, the written INPLACE inputs' values after the reference's call


@dataclass(frozen=True)
class ReferenceReply(Message):
    baseline_problems: list[str]
    baseline_raised: bool  # the baseline raised (or exited) on some seed
    weak: bool  # zeros or a constant match the reference within tolerance
    structure: Any  # the reference's containers (``child.flatten_outputs``)
    unsteady: list[str]  # a second call on the first inputs disagreed
    written_inputs: list[int]
    output_aliases: list[list[int]]  # [output, input] pairs where the reference returns an input
    payload: ReferenceResults  # empty when ``keep``: the trusted child holds the trials
    # one trial's sizes: each input's and each output's tensor bytes (0 for a plain value), the
    # written INPLACE inputs' together
    input_bytes: list[int] = field(default_factory=list)
    output_bytes: list[int] = field(default_factory=list)
    written_bytes: int = 0
    returns_nothing: bool = False  # every output of every trial is None


@dataclass(frozen=True)
class Reference(Command[ReferenceReply]):
    """Inputs and the reference's outputs per seed; with a ``tolerance``, the verdicts that need no
    candidate (the baseline's problems, a weak or unsteady reference)."""

    op: ClassVar[str] = "reference"
    reply: ClassVar[type[Message]] = ReferenceReply
    shape: Shape
    device: str
    seeds: list[int]
    baseline: bool = False  # check the baseline against the reference
    tolerance: ToleranceSpec | None = None  # None: compute only (the timed outputs' check)
    inplace: list[int] = field(default_factory=list)  # the case's INPLACE inputs
    written_inputs: list[int] | None = None  # whose values to send after the call; None: those it wrote
    # refuse the shape when its trials would not fit in the host's memory (``host_memory``): the
    # item's reference only, and its timing's share counted only when the item is timed
    check_host_memory: bool = False
    timed: bool = True
    # keep the trials on the device for a feed of them (``FeedPeer.trials``), and send none
    keep: bool = False


@dataclass(frozen=True)
class CheckOutputs(Message):
    outputs: list[Any]  # per seed, the candidate's output values


@dataclass(frozen=True)
class CheckReply(Message):
    verdicts: list[list[str]]  # per seed, the case's checker's problems


@dataclass(frozen=True)
class Check(Command[CheckReply]):
    """The case's own checker on a candidate's outputs (``checker.py``)."""

    op: ClassVar[str] = "check"
    reply: ClassVar[type[Message]] = CheckReply
    shape: Shape
    device: str
    seeds: list[int]
    structures: list[Any]
    payload: CheckOutputs


@dataclass(frozen=True)
class Feeding(Message):
    pass


@dataclass(frozen=True)
class FeedPeer(Command[Feeding]):
    """Feed a child for an item (its socket: one file descriptor beside the command): make its timed
    calls' inputs, judge their outputs (``child_feeder.Feeder``)."""

    op: ClassVar[str] = "feed_peer"
    reply: ClassVar[type[Message]] = Feeding
    peer: str  # "candidate" or "baseline": ``FeedReport`` asks by it
    shape: Shape
    device: str
    tolerance: ToleranceSpec
    inplace: list[int]  # the case's INPLACE inputs
    written_inputs: list[int]  # the INPLACE inputs the reference writes: results, compared as outputs are
    may_write: list[int]  # the inputs a call may change (INPLACE, and output buffers the reference returns)
    checker: bool = False  # the case judges outputs itself (GPU MODE's check_implementation)
    # what the outputs must match: the reference, or for the baseline's own child the baseline
    # itself (one that disagrees with the reference is timed all the same, and judged by its own answers)
    against: Literal["reference", "baseline"] = "reference"
    # the correctness trials' seeds: feed each trial's inputs (kept by ``Reference.keep``) and judge
    # its outputs in full; empty: feed timed calls
    trials: list[int] = field(default_factory=list)
    aliases_may_write: bool = False  # an input a call returns as an output may be written (GPU MODE's output buffers)


@dataclass(frozen=True)
class FeedRound(Message):
    """What the trusted child saw of one timing round of a fed child."""

    calls: int  # timed calls it made inputs for
    checked: int  # of them, those whose outputs' values it checked
    problems: list[str]  # the first problems found, each naming its timed call
    turn_median_us: float | None  # a call's turn by the trusted child's clock: from its answer to the next request
    closed: str = ""  # why the feed broke (the fed child's doing), or ""


@dataclass(frozen=True)
class FeedReportReply(Message):
    rounds: list[FeedRound]
    error: str = ""  # the case failed while feeding (its make_inputs or reference raised)
    # a feed of trials: per trial, what is wrong with its outputs and inputs (the fed child's own
    # findings left to its reply), and what only all of them together tell
    trials: list[list[str]] = field(default_factory=list)
    same_kinds: bool = True  # every trial's outputs of the reference's kinds (``correctness.same_kinds``)
    ignores_inputs: bool = False  # ``correctness.TrialsTogether.ignores_inputs``
    constant: str = ""  # ``correctness.constant_output``, the first trial's that has one


@dataclass(frozen=True)
class FeedReport(Command[FeedReportReply]):
    """The rounds a fed child timed since the last report; ``final``: the feed is done."""

    op: ClassVar[str] = "feed_report"
    reply: ClassVar[type[Message]] = FeedReportReply
    peer: str
    final: bool = False


@dataclass(frozen=True)
class CostReply(Message):
    cost: dict[str, float] | None  # ``cost(shape)``, validated (``speed_of_light.valid_cost``)
    floor: dict[str, Any] | None = None  # the physical floor (``physical_floor.measure``)


@dataclass(frozen=True)
class Cost(Command[CostReply]):
    """The case's cost at a shape, and the physical floor its bytes allow on the device."""

    op: ClassVar[str] = "cost"
    reply: ClassVar[type[Message]] = CostReply
    shape: Shape
    device: str


COMMANDS: dict[str, type[Command[Any]]] = {c.op: c for c in (LoadCandidate, LoadBaseline, Run, Time, AttachFeed, Finish, Reference, Check,
                                                                FeedPeer, FeedReport, Cost)}


def parse_command(header: Mapping[str, Any], payload: Any) -> Command[Any]:
    """The command a header names (``cmd``), parsed from it and its payload."""
    op = header.get("cmd")
    kind = COMMANDS.get(op) if isinstance(op, str) else None
    if kind is None:
        raise MessageError(f"unknown command {op!r}")
    return kind.from_wire(header, payload)


def wire_header(command: Command[Any]) -> tuple[dict[str, Any], Any]:
    """A command's header, ``cmd`` included, and its payload."""
    header, payload = command.to_wire()
    return dict(header, cmd=command.op), payload


# -- parsing -------------------------------------------------------------------------------------

def _name(cls: type) -> str:
    return cls.__name__


def _has_payload(cls: type) -> bool:
    return any(f.name == "payload" for f in dataclasses.fields(cls))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise MessageError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise MessageError(f"{where}: unknown field(s) {', '.join(unknown[:5])}")
    values = {}
    for name, f in fields.items():
        if name in data:
            values[name] = _parse_value(data[name], hints[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise MessageError(f"{where}: missing field {name}")
    return cls(**values)


def _parse_value(value: Any, tp: Any, where: str) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _parse_value(value, option, where)
            except MessageError as exc:
                errors.append(str(exc))
        raise MessageError(errors[0] if len(errors) == 1 else f"{where}: {_describe(value)} fits none of {tp}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise MessageError(f"{where}: {value!r} is none of {typing.get_args(tp)}")
    if origin is list:
        if not isinstance(value, list):
            raise MessageError(f"{where}: expected a list, got {_describe(value)}")
        (item,) = typing.get_args(tp)
        return value if item is Any else [_parse_value(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_type, item = typing.get_args(tp)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise MessageError(f"{where}: expected an object, got {_describe(value)}")
        return value if item is Any else {k: _parse_value(v, item, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _parse_dataclass(tp, value, where)
    if tp is bool:
        if type(value) is bool:
            return value
    elif tp is int:
        if type(value) is int:
            return value
    elif tp is float:
        if type(value) in (int, float):
            return float(value)
    elif tp is str:
        if type(value) is str:
            return value
    else:
        raise TypeError(f"{where}: no parser for {tp!r}")
    raise MessageError(f"{where}: expected {tp.__name__}, got {_describe(value)}")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _plain(value: Any) -> Any:
    """A message's value as containers ``protocol.send`` carries (dataclasses as dicts)."""
    if isinstance(value, Message) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
