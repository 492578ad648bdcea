"""The feed (``feed.py``, ``shared_memory.py``, ``child_feeder.py``, ``child_timing.FedSets``): the
trusted side makes each call's inputs in the fed side's memory and judges its outputs there. Real
processes, a real socket pair and real shared memory; on a GPU the same over CUDA IPC."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import socket
import struct
import textwrap
import threading
import time

import pytest
import torch

from pytest_kcoral.child_feeder import ONE_SET_BYTES
from pytest_kcoral.feed import SPIN_S, FeedChannel, FeedClosed, FeedError
from pytest_kcoral.shared_memory import ALIGN, MappedRegion, Region, RegionInfo, SharedMemoryError

ADD_CASE = """
import torch

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b
"""


# -- shared memory ---------------------------------------------------------------------------------

def test_a_host_region_is_the_same_memory_in_another_process():
    region = Region(4096, "cpu")
    view = region.view(0, torch.float32, [16], [1])
    view.zero_()
    pid = os.fork()
    if pid == 0:  # the importer: writes through its own mapping
        try:
            mapped = MappedRegion(region.info, "cpu", os.dup(region.fd))
            mapped.view(0, torch.float32, [16], [1]).copy_(torch.arange(16.0))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert torch.equal(view, torch.arange(16.0))
    region.close()


def test_a_view_outside_its_region_is_refused():
    region = Region(2 * ALIGN, "cpu")
    mapped = MappedRegion(region.info, "cpu", os.dup(region.fd))
    assert mapped.view(ALIGN, torch.float32, [ALIGN // 4], [1]).numel() == ALIGN // 4
    with pytest.raises(SharedMemoryError, match="overruns its region"):
        mapped.view(ALIGN, torch.float32, [ALIGN // 4 + 1], [1])
    with pytest.raises(SharedMemoryError, match="overruns its region"):
        mapped.view(0, torch.float32, [2, 4], [1024, 1])  # strides reach past the end
    with pytest.raises(SharedMemoryError, match="multiple of"):
        mapped.view(4, torch.float32, [4], [1])
    with pytest.raises(SharedMemoryError, match="non-negative"):
        mapped.view(0, torch.float32, [4], [-1])


def test_a_host_file_that_could_shrink_is_refused():
    unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC)
    os.ftruncate(unsealed, 4096)
    with pytest.raises(SharedMemoryError, match="not sealed against shrinking"):
        MappedRegion(RegionInfo("cpu", 4096), "cpu", unsealed)
    read_end, write_end = os.pipe()
    os.close(write_end)
    with pytest.raises(SharedMemoryError, match="not a sealed memory file"):
        MappedRegion(RegionInfo("cpu", 4096), "cpu", read_end)
    sealed = os.memfd_create("small", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(sealed, 1024)
    fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    with pytest.raises(SharedMemoryError, match="holds 1024 bytes, not 4096"):
        MappedRegion(RegionInfo("cpu", 4096), "cpu", sealed)


# -- the channel -----------------------------------------------------------------------------------

def test_frames_carry_file_descriptors():
    a, b = socket.socketpair()
    sender, receiver = FeedChannel(a), FeedChannel(b)
    region = Region(ALIGN, "cpu")
    sender.send({"op": "map"}, [region.fd])
    message, fds = receiver.recv(deadline=time.monotonic() + 5)
    assert message == {"op": "map"} and len(fds) == 1
    MappedRegion(region.info, "cpu", fds[0]).view(0, torch.uint8, [4], [1]).fill_(7)
    assert region.bytes[:4].tolist() == [7, 7, 7, 7]


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])  # a feed on a GPU polls before it sleeps
def test_frames_are_read_whole_however_they_arrive(device):
    """One read may hold two frames, or part of one: each comes out whole and in order, with the
    descriptors sent beside it, and a closed channel after the last reads as closed."""
    a, b = socket.socketpair()
    receiver = FeedChannel(b)
    receiver.spin_on(device)
    assert bool(receiver.spin_s) == device.startswith("cuda")
    first, second = (json.dumps(m).encode() for m in ({"op": "call", "set": 1}, {"op": "end"}))
    a.sendall(struct.pack("!I", len(first)) + first + struct.pack("!I", len(second)) + second[:3])
    assert receiver.recv(deadline=time.monotonic() + 5) == ({"op": "call", "set": 1}, [])
    a.sendall(second[3:])
    assert receiver.recv(deadline=time.monotonic() + 5) == ({"op": "end"}, [])
    region = Region(ALIGN, "cpu")
    FeedChannel(a).send({"op": "map"}, [region.fd])
    message, fds = receiver.recv(deadline=time.monotonic() + 5)
    assert message == {"op": "map"} and len(fds) == 1
    os.close(fds[0])
    a.close()
    with pytest.raises(FeedClosed):
        receiver.recv(deadline=time.monotonic() + 5)


@pytest.mark.parametrize("raw, error", [
    (b"\xff\xff\xff\xff", "more than the"),  # a length past the limit: refused before it is read
    (b"\x00\x00\x00\x03{{{", "unreadable feed frame"),
    (b"\x00\x00\x00\x09{\"op\":", "closed it in the middle"),
])
def test_an_unreadable_frame_is_refused(raw, error):
    a, b = socket.socketpair()
    a.sendall(raw)
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(FeedError, match=error):
        FeedChannel(b).recv(deadline=time.monotonic() + 5)


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_a_silent_peer_runs_into_the_deadline(device):
    a, b = socket.socketpair()
    receiver = FeedChannel(b)
    receiver.spin_on(device)
    started = time.monotonic()
    with pytest.raises(FeedError, match="did not answer in time"):
        receiver.recv(deadline=started + 0.2)
    assert time.monotonic() - started < 2
    a.close()


def test_a_polling_feed_still_reads_a_frame_that_comes_after_its_polling():
    """Past ``SPIN_S`` a polling end sleeps until the frame comes, as any other."""
    a, b = socket.socketpair()
    receiver = FeedChannel(b)
    receiver.spin_on("cuda:0")
    sender = threading.Timer(20 * SPIN_S, FeedChannel(a).send, args=({"op": "end"},))
    sender.start()
    started = time.monotonic()
    assert receiver.recv(deadline=started + 5) == ({"op": "end"}, [])
    assert time.monotonic() - started >= 20 * SPIN_S
    sender.join()
    a.close()


# -- a fed round, the trusted side in a process of its own -------------------------------------------

def _trusted_side(sock: socket.socket, case_path: str, device: str, n: int, results) -> None:
    from pytest_kcoral.case_runtime import CaseRuntime
    from pytest_kcoral.child import Unpredictable
    from pytest_kcoral.child_feeder import Feeder
    from pytest_kcoral.child_judges import Pricing, TimedCalls
    from pytest_kcoral.messages import FeedPeer, ToleranceSpec

    kind = "cuda" if device.startswith("cuda") else "cpu"
    case = CaseRuntime({"format": "native", "source": case_path, "device": device, "device_kind": kind})
    config = FeedPeer(peer="candidate", shape={"n": n}, device=device, tolerance=ToleranceSpec(atol=None, rtol=None), inplace=[],
                      written_inputs=[], may_write=[])
    feeder = Feeder(case, FeedChannel(sock), config, TimedCalls(case, config, Unpredictable(), Pricing()))
    while feeder.open:
        feeder.serve_one()
    results.put([(r.calls, r.checked, r.problems, r.turn_median_us, r.closed) for r in feeder.report(final=True).rounds])


def _fed_round(tmp_path, kernel, calls: int = 40, device: str = "cpu", n: int = 64, tamper=None):
    """Rounds of ``calls`` timed calls of ``kernel(a, b)`` on fed sets; the trusted side's report."""
    from pytest_kcoral.child_timing import FedSets

    case_path = tmp_path / "case.py"
    case_path.write_text(textwrap.dedent(ADD_CASE))
    ours, theirs = socket.socketpair()
    ctx = multiprocessing.get_context("spawn")  # no CUDA state may cross a fork
    results = ctx.Queue()
    trusted = ctx.Process(target=_trusted_side, args=(theirs, str(case_path), device, n, results))
    trusted.start()
    theirs.close()
    try:
        sets = FedSets(FeedChannel(ours), {"n": n}, 3, device, lambda _shape, args: (lambda: kernel(*args)))
        try:
            for i in range(calls):
                k = i % len(sets.sets)
                sets.refresh(k)
                sets.keep(k, sets.fns[k](), [])
                if tamper is not None:
                    tamper(sets, i)
            sets.end_round()
        except FeedError as exc:
            sets.channel.close()
            return results.get(timeout=60), exc
        sets.channel.close()
        return results.get(timeout=60), None
    finally:
        trusted.join(30)


def test_an_honest_round_is_fed_and_every_call_checked(tmp_path):
    (round_,), error = _fed_round(tmp_path, lambda a, b: a + b, calls=40)
    calls, checked, problems, turn_us, closed = round_
    assert error is None and (calls, checked, problems, closed) == (40, 40, [], "")
    assert turn_us is not None and turn_us > 0


def test_every_call_gets_inputs_no_one_saw_before(tmp_path):
    seen = []

    def remember(a, b):
        seen.append((float(a[0]), float(b[0])))
        return a + b

    _fed_round(tmp_path, remember, calls=30)
    assert len(set(seen)) == 30


# on a GPU a round's checks are judged together at its end: each call must still be named
BOTH_DEVICES = pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda:0", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
])


@BOTH_DEVICES
def test_wrong_outputs_are_named_by_their_timed_call(tmp_path, device):
    calls = []

    def wrong_on_the_fifth(a, b):
        calls.append(1)
        return a - b if len(calls) in (5, 8) else a + b

    (round_,), _ = _fed_round(tmp_path, wrong_on_the_fifth, calls=10, device=device)
    assert round_[0] == 10 and len(round_[2]) == 2, round_
    assert round_[2][0].startswith("timed call 5: output 0:") and "outside atol" in round_[2][0]
    assert round_[2][1].startswith("timed call 8: output 0:")


@BOTH_DEVICES
def test_an_input_changed_by_a_call_is_named(tmp_path, device):
    def writes_its_input(a, b):
        out = a + b
        b.zero_()
        return out

    (round_,), _ = _fed_round(tmp_path, writes_its_input, calls=3, device=device)
    assert len(round_[2]) == 3 and all("input 1 was modified" in p for p in round_[2]), round_


def test_a_forged_outcome_ends_the_feed_as_the_fed_sides_failure(tmp_path):
    def forge(sets, i):
        if i == 2:
            sets._outcome = type(sets._outcome)(99, 0, [("slot", "float32", [64])], [])  # a set that does not exist

    (round_,), error = _fed_round(tmp_path, lambda a, b: a + b, calls=5, tamper=forge)
    assert isinstance(error, FeedError) and "names input set 99" in str(error)
    assert "names input set 99" in round_[4]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the feed's device memory travels over CUDA IPC")
def test_a_fed_round_over_cuda_ipc(tmp_path):
    (round_,), error = _fed_round(tmp_path, lambda a, b: a + b, calls=50, device="cuda:0", n=4096)
    assert error is None and round_[:3] == (50, 50, [])
    (round_,), _ = _fed_round(tmp_path, lambda a, b: a - b, calls=3, device="cuda:0", n=4096)
    assert len(round_[2]) == 3 and "outside atol" in round_[2][0]


def test_figures_beyond_the_trusted_childs_account_are_forged():
    from pytest_kcoral.messages import FeedRound
    from pytest_kcoral.results import TimingStats
    from pytest_kcoral.stage_timing import _forged_rounds

    fed = [FeedRound(calls=100, checked=100, problems=[], turn_median_us=40.0)]
    assert _forged_rounds(fed, [TimingStats(method="cupti", median_us=12.0, n=100)]) == []
    assert "201 timed samples reported, the trusted child fed 100" in _forged_rounds(fed, [TimingStats(method="cupti", median_us=12.0, n=201)])[0]
    assert "a call's whole turn took 40 us" in _forged_rounds(fed, [TimingStats(method="cupti", median_us=50.0, n=100)])[0]
    assert "2 timing rounds reported, the trusted child fed 1" in _forged_rounds(fed, [TimingStats(method="cupti", median_us=1.0, n=1)] * 2)[0]
    # on a CPU a call's time may be its CPU time, which other threads' work spread over the calls raises
    assert _forged_rounds(fed, [TimingStats(method="wall", median_us=43.0, n=100)]) == []
    assert _forged_rounds(fed, [TimingStats(method="wall", median_us=400.0, n=100, flags=["cpu_time_above_wall"])]) == []


# -- fed correctness trials, the trusted side in a process of its own -------------------------------

def _trusted_trials_side(sock: socket.socket, case_path: str, seeds: list[int], remade: bool, n: int, results) -> None:
    from pytest_kcoral.case_runtime import CaseRuntime
    from pytest_kcoral.child import Unpredictable
    from pytest_kcoral.child_feeder import Feeder
    from pytest_kcoral.child_judges import TrialCalls
    from pytest_kcoral.child_trusted import Trials, make_trials
    from pytest_kcoral.messages import FeedPeer, ToleranceSpec

    case = CaseRuntime({"format": "native", "source": case_path, "device": "cpu", "device_kind": "cpu"})
    trials = make_trials(case, {"n": n}, seeds, [])
    if not remade:  # kept, as ``child_trusted.reference`` keeps trials that fit on the device
        trials = Trials(seeds, kept=[trials.trial(t) for t in range(len(seeds))])
    config = FeedPeer(peer="candidate", shape={"n": n}, device="cpu", tolerance=ToleranceSpec(atol=None, rtol=None), inplace=[],
                      written_inputs=[], may_write=[], trials=seeds)
    feeder = Feeder(case, FeedChannel(sock), config, TrialCalls(case, config, Unpredictable(), trials))
    while feeder.open:
        feeder.serve_one()
    reply = feeder.report(final=True)
    results.put((reply.trials, reply.ignores_inputs, reply.constant, [r.closed for r in reply.rounds]))


def _fed_trials(tmp_path, kernel, remade: bool, calls: int = 3, n: int = 64):
    """``calls`` calls of ``kernel(a, b)`` on the trials of three seeds, each call naming the next
    of the sets the trusted side laid out; its account, the fed side's error and how many sets."""
    from pytest_kcoral.child_timing import FedSets

    case_path = tmp_path / "case.py"
    case_path.write_text(textwrap.dedent(ADD_CASE))
    ours, theirs = socket.socketpair()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    trusted = ctx.Process(target=_trusted_trials_side, args=(theirs, str(case_path), [11, 12, 13], remade, n, results))
    trusted.start()
    theirs.close()
    error = None
    try:
        fed = FedSets(FeedChannel(ours), {"n": n}, 1, "cpu", lambda _shape, args: (lambda: kernel(*args)))
        try:
            for i in range(calls):
                k = i % len(fed.sets)
                fed.refresh(k)
                fed.keep(k, fed.fns[k](), [])
            fed.end_round()
        except FeedError as exc:
            error = exc
        fed.channel.close()
        return results.get(timeout=60), error, len(fed.sets)
    finally:
        trusted.join(30)


@pytest.mark.parametrize("remade", [False, True], ids=["kept", "remade"])
@pytest.mark.parametrize("n", [64, ONE_SET_BYTES // 8 + 1], ids=["a-set-each", "one-set"])  # two fp32 inputs: just over ONE_SET_BYTES
def test_fed_trials_are_judged_each_on_its_own_inputs(tmp_path, remade, n):
    seen = []

    def wrong_on_the_second(a, b):
        seen.append(float(a[0]))
        return a - b if len(seen) == 2 else a + b

    (trials, ignores, constant, closed), error, n_sets = _fed_trials(tmp_path, wrong_on_the_second, remade, n=n)
    assert error is None and n_sets == (3 if n == 64 else 1) and closed == []
    assert len(set(seen)) == 3  # three trials' inputs, in their own sets or one after another in one
    assert trials[0] == [] and trials[2] == [] and "outside atol" in trials[1][0], trials
    assert not ignores and constant == ""


@pytest.mark.parametrize("remade", [False, True], ids=["kept", "remade"])
def test_outputs_that_ignore_the_trials_inputs_are_found_one_trial_at_a_time(tmp_path, remade):
    first = []

    def first_answer_always(a, b):
        if not first:
            first.append(a + b)
        return first[0].clone()

    (trials, ignores, _, _), error, _ = _fed_trials(tmp_path, first_answer_always, remade)
    assert error is None and ignores and trials[0] == [] and trials[1] and trials[2]


def test_a_call_past_the_trials_ends_the_feed_and_a_skipped_trial_is_named(tmp_path):
    (trials, _, _, closed), error, _ = _fed_trials(tmp_path, lambda a, b: a + b, remade=True, calls=4)
    assert isinstance(error, FeedError) and "a call past the 3 trials" in str(error)
    assert "a call past the 3 trials" in closed[0]
    (trials, _, _, _), error, _ = _fed_trials(tmp_path, lambda a, b: a + b, remade=True, calls=2)
    assert error is None and trials[:2] == [[], []] and "never called it" in trials[2][0]


INPLACE_CASE = """
import torch

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    a.add_(b)
    return a * 2
"""


def test_trials_too_large_to_keep_are_made_again_alike(tmp_path, monkeypatch):
    from pytest_kcoral import child_trusted
    from pytest_kcoral.case_runtime import CaseRuntime
    from pytest_kcoral.messages import Reference, ToleranceSpec

    (tmp_path / "case.py").write_text(textwrap.dedent(INPLACE_CASE))
    case = CaseRuntime({"format": "native", "source": str(tmp_path / "case.py"), "device": "cpu", "device_kind": "cpu"})
    command = Reference(shape={"n": 64}, device="cpu", seeds=[5, 6, 7], tolerance=ToleranceSpec(atol=None, rtol=None), inplace=[0], keep=True)
    kept, remade = child_trusted.KeptTrials(), child_trusted.KeptTrials()
    as_kept = child_trusted.reference(case, command, kept)
    monkeypatch.setattr(child_trusted, "keeps_on_device", lambda *_: False)  # as for a KernelBench problem at its own size on a GPU
    as_remade = child_trusted.reference(case, command, remade)
    assert as_kept == as_remade and as_kept.written_inputs == [0] and as_kept.written_bytes == 64 * 4
    key = child_trusted.KeptTrials.key(command.shape, command.seeds, "cpu")
    first, second = kept.get(key), remade.get(key)
    assert first is not None and second is not None and not first.remade and second.remade
    for t in range(3):
        a, b = first.trial(t), second.trial(t)
        for x, y in zip((*a.inputs, *a.reference, *a.written), (*b.inputs, *b.reference, *b.written)):
            assert torch.equal(x, y)
        assert a.structure == b.structure == 0
    assert not torch.equal(first.trial(0).inputs[0], first.trial(1).inputs[0])
