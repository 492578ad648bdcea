"""The stage runner: the code that runs inside a child process, never in the pytest process.

A child has one role. A *trusted* child imports only the case (reference, inputs, the baseline's
correctness, the case's cost); a *candidate* child imports one candidate; a *baseline* child
imports only the case and goes the candidate's way with the baseline (load, one correctness run,
timing), so the two sides of a speedup are timed in processes with the same history. The parent
drives each with commands over a pipe (``protocol.py``) and always knows which phase a child is
in, so a crash or a hang is reported with the phase it reached.

Everything the harness relies on (torch, the timer, the checks) is imported before the candidate
loads, and the candidate's working directory is not on ``sys.path``, so files it writes there
cannot shadow a module the harness imports later.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import multiprocessing.connection
import os
import select
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from pytest_kcoral import child_trusted, confine, leftovers, protocol, tamper, timing
from pytest_kcoral.case_runtime import BaselineRuntime, CandidateError, CandidateRuntime, CaseRuntime
from pytest_kcoral.child_feeder import Feeder
from pytest_kcoral.child_judges import Pricing, TimedCalls, TrialCalls
from pytest_kcoral.child_outputs import keep_large_allocations_on_heap, release_cached_memory
from pytest_kcoral.child_run import run_trials
from pytest_kcoral.child_timing import FedSets, OwnSets, new_own_sets, sets_key, time_round
from pytest_kcoral.child_trusted import KeptTrials
from pytest_kcoral.feed import FeedChannel, spin_until_ready
from pytest_kcoral.messages import (
    Attached,
    AttachFeed,
    Check,
    Command,
    Cost,
    ErrorInfo,
    Feeding,
    FeedPeer,
    FeedReport,
    FeedReportReply,
    Finish,
    Finished,
    LoadBaseline,
    LoadCandidate,
    Loaded,
    Message,
    MessageError,
    Reference,
    Run,
    RunReply,
    Time,
    parse_command,
)

TRUSTED = "trusted"
CANDIDATE = "candidate"
BASELINE = "baseline"

# Taken at import, before any candidate loads: the timing inputs' seeds and the choice of the
# timed outputs checked come from the kernel's random source through this reference, so a
# candidate that replaces ``random``'s methods or ``os.urandom`` cannot make them predictable.
_urandom = os.urandom


class Unpredictable:
    """The few draws the harness makes in a child, each straight from ``_urandom`` (its methods
    are watched by the tamper snapshot: ``tamper._WATCHED_CLASSES``)."""

    @staticmethod
    def getrandbits(bits: int) -> int:
        return int.from_bytes(_urandom((bits + 7) // 8), "little") & ((1 << bits) - 1)

    @staticmethod
    def randrange(start: int, stop: int | None = None) -> int:
        low, high = (0, start) if stop is None else (start, stop)
        return low + Unpredictable.getrandbits(64) % (high - low)  # bias under 2**-50 for the harness's ranges

    @staticmethod
    def random() -> float:
        return Unpredictable.getrandbits(53) / (1 << 53)


_rng = Unpredictable()


def main(conn: Connection, stdout: Connection, stderr: Connection, role: str, workdir: str, env: dict[str, str], case_spec: dict[str, Any],
         live_output: bool = False) -> None:
    """Entry point of a child (a multiprocessing target started from the template process).
    ``live_output``: stdout flushed at every line, for ``-s``."""
    os.setsid()  # own process group: the parent kills the child and whatever it started at once
    leftovers.die_with_parent()  # the template dies with the pytest process, and the child with it
    # detached grandchildren (setsid + double fork) come back to this process, where they are found
    leftovers.become_subreaper()
    for fd, pipe in ((1, stdout), (2, stderr)):
        os.dup2(pipe.fileno(), fd)
        pipe.close()
    if live_output:
        with contextlib.suppress(Exception):
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper here
    _std_streams[:] = [sys.stdout, sys.stderr]  # the harness's own: a candidate may replace sys.stdout
    os.chdir(workdir)
    os.environ.update(env)
    sys.path[:] = [p for p in sys.path if p not in ("", ".", workdir)]
    sys.dont_write_bytecode = True
    # bytecode is read from, and written to, this child's own directory only: a .pyc a candidate
    # planted in a case's __pycache__ (matching its source's size and time) would otherwise run in
    # place of the case's checked source, in the trusted child and the baseline's
    sys.pycache_prefix = os.path.join(workdir, "pycache")
    if role in (CANDIDATE, BASELINE):
        keep_large_allocations_on_heap()
    if role in (TRUSTED, BASELINE):
        _compile_without_shared_caches(workdir)
    try:
        confine.confine_child(role, workdir)  # writes only here and to the caches
        runner = _Runner(role, case_spec)
    except BaseException as exc:  # noqa: BLE001 - the parent must hear why startup failed
        protocol.send(conn, dict(_error_reply(exc), seq=0))
        return
    protocol.send(conn, {"ok": True, "pid": os.getpid(), "seq": 0})
    runner.serve(conn)


_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))


_std_streams: list[Any] = []  # stdout and stderr as the child started (``main``)


def _flush_std_streams() -> None:
    """Flush the streams the child started with: never a flush() a candidate put in their place,
    which would run its code after the command's audit."""
    for stream in _std_streams:
        with contextlib.suppress(Exception):  # a candidate may have closed them
            stream.flush()


def _compile_without_shared_caches(workdir: str) -> None:
    """The trusted and the baseline child compile the reference's and the baseline's kernels
    themselves and never load compiled code from a disk cache.

    Compile caches are shared: Triton's (``~/.triton/cache``), Inductor's
    (``/tmp/torchinductor_<user>``) and ``torch.utils.cpp_extension``'s builds, and under
    ``--kcoral-sandbox`` the session workspace that holds them is writable by every child. A
    candidate that replaced a cached baseline kernel with a slower one would earn a speedup; one
    that planted an extension build would run its code in this process. So Triton always compiles,
    Inductor's caches are off, and every cache directory is in this child's private directory.
    """
    os.environ.update({
        "TRITON_ALWAYS_COMPILE": "1",  # read at every compile: the template's import predates it
        "TRITON_CACHE_DIR": os.path.join(workdir, "triton-cache"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(workdir, "inductor-cache"),
        "TORCH_EXTENSIONS_DIR": os.path.join(workdir, "torch-extensions"),
    })
    # read from the environment when torch was imported, in the template, before this child existed
    compile_config: Any
    try:
        import torch.compiler.config as compile_config
    except ImportError:  # older torch keeps the flag in Inductor's own config
        import torch._inductor.config as compile_config
    # a torch without the flag still keeps Inductor's cache in the private directory above
    with contextlib.suppress(AttributeError):
        compile_config.force_disable_caches = True


def _error_reply(exc: BaseException) -> dict[str, Any]:
    """A failed command's reply header (``ok`` false, an ``ErrorInfo``), from what it raised."""
    # the harness's own frames say nothing to the kernel author: keep the candidate's and the case's
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith((_HARNESS_DIR, "<frozen"))]
    tb = traceback.format_list(frames[-10:]) + traceback.format_exception_only(type(exc), exc)
    return _failed(ErrorInfo(
        type=type(exc).__name__,
        message=_exit_message(exc) if isinstance(exc, SystemExit) else str(exc)[:4000],
        traceback="".join(tb)[-6000:],
        compile_error=_is_compile_error(exc),
        needs_cuda=_needs_cuda(exc),
    ))


def _failed(error: ErrorInfo) -> dict[str, Any]:
    return {"ok": False, "error": error.to_wire()[0]}


def _exit_message(exc: SystemExit) -> str:
    return f"called sys.exit({exc.code!r})"


def _is_compile_error(exc: BaseException) -> bool:
    """Compiler errors that surface at the first call count as compile failures, and so does a
    candidate found at its first call not to have a candidate's shape (a ``prepare()`` that returns
    no callable): neither ever built something to run."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    for e in chain:
        kind = type(e)
        if kind.__module__.startswith(("triton.compiler", "triton.runtime.errors")) or kind.__name__ in (
            "CompilationError",
            "CompileTimeAssertionFailure",
            "NVRTCError",
        ):
            return True
        if isinstance(e, (subprocess.CalledProcessError, CandidateError)) or "Error building extension" in str(e):
            return True
    return False


# what torch says when a case needs CUDA on a machine without it; a CPU build of torch raises the
# last one for ``torch.Generator(device="cuda")``, which GPU MODE's reference.py files use
# the last: a CUDA extension (``load_inline`` with ``cuda_sources``) built where there is no CUDA toolkit
_CUDA_MISSING = ("Torch not compiled with CUDA", "No CUDA GPUs are available", "Found no NVIDIA driver", "CUDA driver",
                 "without ATen_cuda library", "CUDA_HOME environment variable is not set")


def _needs_cuda(exc: BaseException) -> bool:
    return any(text in str(exc) for text in _CUDA_MISSING)


class _Runner:
    """Serves one child's commands: parsed strictly (``messages.py``), run, audited, answered."""

    def __init__(self, role: str, case_spec: dict[str, Any]) -> None:
        import torch  # here, not at the top: the pytest process imports this module too

        # the timers' clocks, synchronize and CUPTI entry points, taken before candidate code loads
        timing.prepare(case_spec.get("device_kind", "cpu"))
        if case_spec.get("device_kind", "cpu") == "cpu":
            # CPU timing is single-threaded: OpenMP workers of one child spinning after its last
            # parallel region would steal the cores from the next child's timed calls
            torch.set_num_threads(1)
        elif case_spec.get("cpu_threads"):
            # this worker's share of the host's cores (``cpu_share``): pools as wide as the machine
            # in every worker's processes fight over each core
            torch.set_num_threads(int(case_spec["cpu_threads"]))
        self.role = role
        self.case = CaseRuntime(case_spec)
        self.device = self.case.device
        self.candidate: CandidateRuntime | BaselineRuntime | None = None
        # what the harness itself runs and relies on, taken before any candidate code loads
        self.baseline: leftovers.Baseline | None = None
        self.snapshot: tamper.Snapshot | None = None
        self._timing_sets: OwnSets | FedSets | None = None  # the item's timing input sets (``child_timing``)
        self._feed: FeedChannel | None = None  # a fed child's: its socket to the trusted child (``AttachFeed``)
        self.feeders: dict[str, Feeder] = {}  # the trusted child's: the children it feeds, by role (``FeedPeer``)
        self.pricing: tuple[str, Pricing] | None = None  # the trusted child's: how often its item's timed calls are checked
        self.kept_trials = KeptTrials()  # the trusted child's: the trials kept for feeds (``Reference.keep``)
        self._fds: list[int] = []  # the descriptors that came with the command being served

    def serve(self, conn: Connection) -> None:
        while True:
            if self._serve_feeders(conn):
                continue
            try:
                header, payload = protocol.recv(conn)
                fds = protocol.recv_fds(conn, header["fds"]) if header.get("fds") else []
            except EOFError:
                return
            if header.get("cmd") == "exit":
                return
            # every reply names the command it answers, so a forged or duplicated reply shows
            echo = {"seq": header.get("seq"), "nonce": header.get("nonce")}
            # a command still running just before the parent's deadline prints every thread's
            # stack to the output, so a timeout can say where the candidate was
            dump_after_s = header.get("stack_dump_after_s")
            if isinstance(dump_after_s, (int, float)) and dump_after_s > 0:
                faulthandler.dump_traceback_later(dump_after_s, repeat=False, file=sys.stderr, exit=False)
            try:
                reply, reply_payload = self.handle(header, payload, fds)
            finally:
                faulthandler.cancel_dump_traceback_later()
            _flush_std_streams()  # what the command printed is in the pipes before its reply
            protocol.send(conn, dict(reply, **echo), reply_payload)

    def _serve_feeders(self, conn: Connection) -> bool:
        """The trusted child: wait for the parent's next command or a fed child's request, and
        answer the requests that came. True when no command came meanwhile."""
        feeders = [f for f in self.feeders.values() if f.open]
        if not feeders:
            return False
        by_fd = {feeder.fileno(): feeder for feeder in feeders}
        ready: list[Any] = []
        spin_s = max(f.channel.spin_s for f in feeders)
        if spin_s:  # a fed child's next request comes soon: poll before sleeping
            poll = select.poll()
            for watched in (conn.fileno(), *by_fd):
                poll.register(watched, select.POLLIN)
            ready = [conn if fd == conn.fileno() else fd for fd in spin_until_ready(poll, spin_s)]
        if not ready:
            ready = multiprocessing.connection.wait([conn, *by_fd])
        for fd in ready:
            feeder = by_fd.get(fd) if isinstance(fd, int) else None
            if feeder is not None:
                self._use_device(feeder.config.device)
                feeder.serve_one()
        return conn not in ready

    def handle(self, header: dict[str, Any], payload: Any, fds: list[int] | None = None) -> tuple[dict[str, Any], Any]:
        """Run one command and audit afterwards: the reply (``ok`` true or false) and its payload.
        ``fds``: the file descriptors that came with it (a feed's socket).

        Shared by the pipe loop above and the KCoral runner (``remote_runner.py``)."""
        self._fds = list(fds or [])
        try:
            try:
                command = parse_command(header, payload)
            except MessageError as exc:
                return _failed(ErrorInfo(type="ProtocolError", message=str(exc))), None
            try:
                device = getattr(command, "device", None)
                if device:
                    self._use_device(device)
                reply = self._serve(command)
                detected = self._audit()
            except BaseException as exc:  # noqa: BLE001 - SystemExit from candidate code included
                return _error_reply(exc), None
        finally:
            for fd in self._fds:  # those no command took
                os.close(fd)
            self._fds = []
        if detected:
            return _failed(ErrorInfo(type="Detected", message="; ".join(detected), detected=True)), None
        reply_header, reply_payload = reply.to_wire()
        return dict(reply_header, ok=True), reply_payload

    def _serve(self, command: Command[Any]) -> Message:
        """The command's reply, from the role's handler (a command of another role raises)."""
        if isinstance(command, (Reference, Check, Cost, FeedPeer, FeedReport)):
            self._require(TRUSTED)
            if isinstance(command, Reference):
                return child_trusted.reference(self.case, command, self.kept_trials)
            if isinstance(command, Check):
                return child_trusted.check(self.case, command)
            if isinstance(command, FeedPeer):
                return self._feed_peer(command)
            if isinstance(command, FeedReport):
                return self._feed_report(command)
            return child_trusted.cost(self.case, command, self.device)
        if isinstance(command, AttachFeed):
            return self._attach_feed()
        if isinstance(command, LoadCandidate):
            return self._load_candidate(command)
        if isinstance(command, LoadBaseline):
            return self._load_baseline()
        if isinstance(command, Run):
            return self._run(command)
        if isinstance(command, Time):
            return self._time(command)
        if isinstance(command, Finish):
            return self._finish()
        raise RuntimeError(f"no handler for the command {command.op!r}")

    def _audit(self) -> list[str]:
        """After candidate code ran: what it left running and which harness functions it replaced."""
        if self.baseline is None or self.snapshot is None:
            return []
        problems = self.baseline.find()
        patched = self.snapshot.changed()
        if patched:
            shown = ", ".join(patched[:6]) + (f" and {len(patched) - 6} more" if len(patched) > 6 else "")
            problems.append(f"replaced functions the harness relies on (timers, synchronization, comparison or the harness itself): {shown}")
        return problems

    def _take_fd(self) -> int:
        if len(self._fds) != 1:
            raise RuntimeError(f"this command takes one file descriptor, {len(self._fds)} came with it")
        return self._fds.pop()

    # -- the feed (``feed.py``) -----------------------------------------------------------------

    def _feed_peer(self, command: FeedPeer) -> Feeding:
        """Feed a child for an item, over the socket that came with the command: its correctness
        trials (``trials``: their seeds), or its timed calls."""
        old = self.feeders.pop(command.peer, None)
        if old is not None:
            old.close()
        judge: TimedCalls | TrialCalls
        if command.trials:
            trials = self.kept_trials.get(KeptTrials.key(command.shape, command.trials, command.device))
            if trials is None:  # this child started after the reference's (the last one failed)
                trials = child_trusted.make_trials(self.case, command.shape, command.trials, command.written_inputs)
            judge = TrialCalls(self.case, command, _rng, trials)
        else:
            # both sides of an item are checked alike (``child_judges.Pricing``)
            item = json.dumps([command.shape, command.device], sort_keys=True)
            if self.pricing is None or self.pricing[0] != item:
                self.pricing = (item, Pricing())  # the item before's goes
            judge = TimedCalls(self.case, command, _rng, self.pricing[1])
        channel = FeedChannel.from_fd(self._take_fd())
        channel.spin_on(command.device)
        self.feeders[command.peer] = Feeder(self.case, channel, command, judge)
        return Feeding()

    def _feed_report(self, command: FeedReport) -> FeedReportReply:
        feeder = self.feeders.get(command.peer)
        if feeder is None:  # never attached: its side failed before
            return FeedReportReply(rounds=[])
        reply = feeder.report(command.final)
        if command.final:
            del self.feeders[command.peer]
            release_cached_memory(self.device)  # a large feed's trials and checks: the next fed process needs the room
        return reply

    def _attach_feed(self) -> Attached:
        """The item's feed from the trusted child: the timing sets of an earlier feed go."""
        self._require(CANDIDATE, BASELINE)
        self._drop_timing_sets()
        if self._feed is not None:
            self._feed.close()
        self._feed = FeedChannel.from_fd(self._take_fd())
        if self.baseline is not None:
            self.baseline.allow_socket(self._feed.fileno())
        return Attached()

    def _drop_timing_sets(self) -> None:
        if isinstance(self._timing_sets, FedSets):
            self._timing_sets.close()
        self._timing_sets = None

    def _use_device(self, device: str) -> None:
        """The lease picks the device after compile, so a child learns it with its first GPU command."""
        if device == self.device:
            return
        if device.startswith("cuda"):
            import torch  # as in ``__init__``

            torch.cuda.set_device(torch.device(device))
        self.device = self.case.device = device

    def _require(self, *roles: str) -> None:
        if self.role not in roles:
            raise RuntimeError(f"command needs a {' or '.join(roles)} child, this one is {self.role}")

    def _loaded(self) -> CandidateRuntime | BaselineRuntime:
        if self.candidate is None:
            raise RuntimeError("no candidate loaded: load_candidate (or load_baseline) comes first")
        return self.candidate

    # -- the baseline's role -----------------------------------------------------------------

    def _load_baseline(self) -> Loaded:
        """The baseline in place of a candidate: the commands after this one (``run``, ``time``,
        ``finish``) are the candidate's, audits included."""
        self._require(BASELINE)
        self.baseline = leftovers.Baseline.take()
        self.snapshot = tamper.Snapshot.take()
        self.candidate = BaselineRuntime(self.case)
        return Loaded(entry=self.candidate.entry)

    # -- the candidate's role ----------------------------------------------------------------

    def _load_candidate(self, command: LoadCandidate) -> Loaded:
        """Import the candidate, or, in a kept child that already holds it (``pipeline`` keeps a
        candidate's child across its items), build it for the next item's shape: the audits'
        snapshots stay those taken before its first import."""
        self._require(CANDIDATE)
        if isinstance(self.candidate, CandidateRuntime) and str(self.candidate.path) == command.path:
            self.candidate.build_for(command.shape)
            return Loaded(entry=self.candidate.entry, kept=True)
        if self.candidate is not None:
            raise RuntimeError(f"this child holds {getattr(self.candidate, 'path', 'the baseline')}, not {command.path}")
        self.baseline = leftovers.Baseline.take()
        self.snapshot = tamper.Snapshot.take()
        self.candidate = CandidateRuntime(command.path, self.case, command.shape)
        return Loaded(entry=self.candidate.entry)

    def _finish(self) -> Finished:
        """The parent's last word with a child for an item: the audit runs after it, as after any
        command. The item's timing sets go: a kept child (the case's baseline child, a candidate's
        child kept for its next item) then draws new sets and placements for its next item, and
        holds no device memory and no queued work while it waits."""
        self._drop_timing_sets()
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        if str(self.device).startswith("cuda"):
            import torch  # as in ``__init__``

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return Finished()

    def _run(self, command: Run) -> RunReply:
        """Run the candidate once per trial (``child_run``); report outputs (unless fed), the
        inputs it changed and findings."""
        self._require(CANDIDATE, BASELINE)
        candidate = self._loaded()
        self._drop_timing_sets()  # an item's timing draws its own sets (see ``_finish``)
        reply = run_trials(command, candidate.bind, self.device, getattr(candidate, "parameters_differ", None), self._feed)
        release_cached_memory(self.device)  # the trials' inputs: the other side's process runs them next
        return reply

    def _time(self, command: Time) -> Message:
        """One timing round (``child_timing``). The baseline's kept outputs are kept as the
        candidate's are, and not sent: nothing checks them."""
        self._require(CANDIDATE, BASELINE)
        candidate = self._loaded()
        if self._timing_sets is None or self._timing_sets.key != sets_key(command, self.device) or command.fed != isinstance(self._timing_sets, FedSets):
            self._drop_timing_sets()  # the old shape's sets go before the new ones are made
            if command.fed:
                if self._feed is None:
                    raise RuntimeError("a fed time command before attach_feed")
                self._timing_sets = FedSets(self._feed, command.shape, command.n_sets, self.device, candidate.bind)
            else:
                self._timing_sets = new_own_sets(self.case, command, self.device, _rng, candidate.bind)
        return time_round(self._timing_sets, self.case, command, self.device, _rng)
