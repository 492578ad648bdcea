"""Commands and replies as typed messages: parsed strictly, each default written once."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_kcoral import messages
from pytest_kcoral.messages import (
    COMMANDS,
    Check,
    CheckOutputs,
    FeedPeer,
    FeedReport,
    Finish,
    LoadCandidate,
    MessageError,
    Reference,
    Run,
    RunInputs,
    RunReply,
    Time,
    TimeReply,
    ToleranceSpec,
    parse_command,
    wire_header,
)
from pytest_kcoral.results import TimingStats

RUN = Run(shape={"n": 4}, device="cpu", poison_bytes=[16], written_inputs=[0], allowed_aliases=[[0, 1]], payload=RunInputs(inputs=[(1, 2.0)]))


@pytest.mark.parametrize("command", [
    RUN,
    LoadCandidate(path="/tmp/c.py", shape={"n": 4}),
    Finish(),
    Time(shape={"n": 4}, device="cuda:0", budget_s=0.5, timer="cupti", verify=1, written_inputs=[], cpu=3, send_kept=False),
    Reference(shape={"n": 4}, device="cpu", seeds=[1, 2], baseline=True, tolerance=ToleranceSpec(atol=None, rtol=0.1), inplace=[1]),
    Check(shape={}, device="cpu", seeds=[3], structures=[[0, 0]], payload=CheckOutputs(outputs=[[1, 2]])),
    FeedPeer(peer="baseline", shape={"n": 4}, device="cuda:1", tolerance=ToleranceSpec(atol=1e-3, rtol=None, strict=True), inplace=[0],
             written_inputs=[0], may_write=[0, 2], checker=True, against="baseline"),
    FeedReport(peer="candidate", final=True),
])
def test_a_command_goes_over_the_wire_and_back_unchanged(command):
    header, payload = wire_header(command)
    assert header["cmd"] == command.op and "payload" not in header
    assert parse_command(dict(header, seq=3, nonce=4, stack_dump_after_s=1.0), payload) == command


def test_every_command_names_its_reply_and_its_op_once():
    assert sorted(COMMANDS) == ["attach_feed", "check", "cost", "feed_peer", "feed_report", "finish", "load_baseline", "load_candidate",
                                "reference", "run", "time"]
    assert all(issubclass(c.reply, messages.Message) for c in COMMANDS.values())


@pytest.mark.parametrize(("header", "payload", "error"), [
    ({"cmd": "nope"}, None, "unknown command 'nope'"),
    (dict(wire_header(RUN)[0], extra=1), {"inputs": []}, "Run: unknown field(s) extra"),
    ({k: v for k, v in wire_header(RUN)[0].items() if k != "device"}, {"inputs": []}, "Run: missing field device"),
    (dict(wire_header(RUN)[0], poison_bytes=["16"]), {"inputs": []}, "Run.poison_bytes[0]: expected int, got str '16'"),
    (dict(wire_header(RUN)[0], poison_bytes=[True]), {"inputs": []}, "Run.poison_bytes[0]: expected int, got bool"),
    (wire_header(RUN)[0], {"inputs": [], "more": 1}, "Run.payload: unknown field(s) more"),
    (wire_header(RUN)[0], None, "Run.payload: expected an object, got NoneType"),
    (wire_header(Finish())[0], {"x": 1}, "Finish: a payload, where none belongs"),
])
def test_a_malformed_command_is_refused_naming_the_field(header, payload, error):
    with pytest.raises(MessageError, match="^" + error.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        parse_command(header, payload)


def test_defaults_are_written_once_in_the_field():
    time_ = Time(shape={}, device="cpu", budget_s=1.0, timer=None, verify=2, written_inputs=[])
    header, _ = wire_header(time_)
    defaults = {f.name: f.default for f in dataclasses.fields(Time) if f.default is not dataclasses.MISSING}
    assert defaults == {"n_sets": 3, "cpu": None, "warmup_s": 0.05, "min_samples": 5, "send_kept": True, "fed": False}
    sparse = {k: v for k, v in header.items() if k not in defaults}
    assert parse_command(sparse, None) == time_  # what is left out takes the field's default


def test_a_reply_is_typed_down_to_its_timing_statistics():
    stats = TimingStats(method="wall", median_us=5.0, min_us=4, n=3)
    reply = TimeReply.from_wire({"ok": True, "seq": 2, "nonce": 9, "stats": dataclasses.asdict(stats), "verify_seeds": [7]},
                                {"verify": [{"seed": 7, "outputs": (1,), "written": ()}]})
    assert reply.stats == stats and isinstance(reply.stats.min_us, float)
    assert reply.payload.verify[0].seed == 7
    with pytest.raises(MessageError, match=r"TimeReply.stats.median_us: expected float, got str 'x'"):
        TimeReply.from_wire({"stats": dict(dataclasses.asdict(stats), median_us="x"), "verify_seeds": []}, {"verify": []})
    with pytest.raises(MessageError, match=r"RunReply: missing field parameters_differ"):
        RunReply.from_wire({"findings": [], "inputs_changed": [], "structures": [], "output_aliases": []}, {"outputs": [], "written": []})
