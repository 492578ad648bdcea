"""Run step: one item's stages, compile -> correctness -> timing, gated in order.

``LocalExecutor`` runs them in child processes on this host: the candidate in a fresh child of
its own; the reference, the baseline's correctness and the case's cost in a trusted child that
never imports a candidate; the baseline's timing in a fresh child that goes the candidate's way
and never imports a candidate either. The GPU stages run under the device lease; compile does
not. Where an item's work executes is behind the ``Executor`` interface, so a remote executor (a
KCoral service) can take its place.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import random
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from pytest_kcoral import checker, combine, confine, correctness, cpu_share, isolation, speed_of_light, speedup_interval, static_report
from pytest_kcoral.candidates import Candidate
from pytest_kcoral.cases import KERNELBENCH, Case, Shape, changed_case_files
from pytest_kcoral.child import BASELINE as BASELINE_ROLE
from pytest_kcoral.devices import DeviceSpec
from pytest_kcoral.diagnostics import Diagnostics
from pytest_kcoral.isolation import Child, ChildFailure
from pytest_kcoral.kept_children import KeptCandidates
from pytest_kcoral.options import AUTO_PROCESS_PAIRS, Settings
from pytest_kcoral.results import CASE_FAILED_PREFIX, ItemResult, TimingStats
from pytest_kcoral.timing import pinning

# Timed-call samples kept for checking against the reference.
VERIFIED_TIMED_CALLS = 2
BASELINE_PROBLEMS_KEPT = 5  # lines of why a baseline is wrong, per item in the JSON
TIMING_INPUT_SETS = 3
# Per side, interleaved (see LocalExecutor._time_pair). Short rounds: one process's speed changes
# within a second or so, and a pair of rounds it slowed is left out (``combine.undisturbed_pairs``);
# with more pairs, more of them are left undisturbed.
TIMING_ROUNDS = 8
_WARMUP_S = 0.05  # warm-up by time before the first round; later rounds follow a warm call
# On a GPU, shorter still: a launch-bound chain runs at the host's speed, which changes within tens
# of milliseconds, and rounds of about 30 ms taken in turns see the same speed on both sides
# (docs/performance.md, "shorter rounds on a GPU"). Launch-bound items work on little data. A round
# takes at least ``min_samples`` samples, each with its inputs' refresh, and sends a kept timed
# output back, so items whose inputs and results are large keep ``TIMING_ROUNDS``: many rounds of
# host-built inputs cost more than they settle.
GPU_ROUND_S = 1 / 32
GPU_MAX_ROUNDS = 32
GPU_SHORT_ROUNDS_MAX_BYTES = 1 << 20


def timing_rounds(device_kind: str, item_bytes: int, budget_s: float) -> int:
    """Rounds a side for an item on ``device_kind`` whose inputs and results (outputs and in-place
    results) for one input set take ``item_bytes``, timed for ``budget_s`` a side: on a GPU, rounds
    of ``GPU_ROUND_S`` for a small item (no fewer than ``TIMING_ROUNDS``, no more than
    ``GPU_MAX_ROUNDS``)."""
    if device_kind == "cpu" or item_bytes > GPU_SHORT_ROUNDS_MAX_BYTES:
        return TIMING_ROUNDS
    return max(TIMING_ROUNDS, min(GPU_MAX_ROUNDS, round(budget_s / GPU_ROUND_S)))


# Fewest pairs of rounds before timing may stop at the precision target: a distribution-free 95%
# interval of a median needs six values (their extremes, 96.9%).
MIN_ROUND_PAIRS = 6


# Trusted children, and baseline children, kept alive per worker (one per case each, least
# recently used closed first).
MAX_TRUSTED_CHILDREN = 4


def _warmup_s(round_index: int) -> float:
    return _WARMUP_S if round_index == 0 else 0.0


@contextlib.contextmanager
def timed_phase(result: ItemResult, name: str) -> Iterator[None]:
    """Add the body's wall time to ``result.phases_ms[name]`` (also when it fails)."""
    started = time.monotonic()
    try:
        yield
    finally:
        result.phases_ms[name] = result.phases_ms.get(name, 0.0) + (time.monotonic() - started) * 1e3


@dataclass(frozen=True)
class ItemSpec:
    nodeid: str
    case: Case
    candidate: Candidate
    shape: Shape


# ``factory(label)`` holds a device for a ``with`` block; the lease it yields has ``device_name``,
# ``wait_ms`` and, once released, ``held_ms`` (``pytest_kcoral.lease.Lease``).
LeaseFactory = Callable[[str], contextlib.AbstractContextManager[Any]]


class Executor(Protocol):
    """Grades items: ``LocalExecutor`` here, ``remote.RemoteExecutor`` on a KCoral service."""

    def start_template(self) -> None:
        """Start what children are forked from, early (a no-op where there is none)."""

    def run(self, spec: ItemSpec) -> ItemResult: ...

    def close(self) -> None: ...


class StageFailed(Exception):
    """Ends an item: the stage, the phase and one screen of why. ``case_failed``: the case itself
    failed (its import, inputs, reference or baseline, in a process without the candidate).
    ``disqualifies``: a failure after the correctness stage that takes back its verdict (the
    candidate raised, crashed or exited while timed, forged its results, or computed wrong ones
    once timed); being slow, or running out of time, does not."""

    def __init__(self, stage: str, message: str, phase: str | None = None, *, case_failed: bool = False,
                 disqualifies: bool = False) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.phase = phase
        self.case_failed = case_failed
        self.disqualifies = disqualifies


class ItemSkipped(Exception):
    pass


class ServiceUnavailable(Exception):
    """The grading service (``--kcoral-url``) stopped answering: the item was never graded, and
    neither the candidate nor the case is to blame. The session stops (``items.KernelItem``)."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


@dataclass
class ReferenceData:
    """What the trusted child computed for one (case, shape, seed, device): shared by candidates."""

    inputs: list[tuple]
    reference: list[tuple]
    baseline_correct: bool | None  # None: the baseline is the reference, nothing to check
    baseline_problems: list[str] = field(default_factory=list)
    baseline_raised: bool = False  # the baseline raised (or exited) on some trial: it cannot be timed here
    weak: bool = False
    structure: Any = None  # the reference's containers (``child.flatten_outputs``); None: not known
    # INPLACE inputs the reference writes, and their values after its call, per trial: results a
    # candidate must leave the same (``x.add_(y)``), compared as outputs are
    written_inputs: tuple[int, ...] = ()
    written: list[tuple] = field(default_factory=list)
    # (output, input) pairs where the reference returns one of its inputs (``return a.add_(b)``):
    # a candidate's output may share memory with that input too
    output_aliases: tuple[tuple[int, int], ...] = ()
    seeds: list[int] = field(default_factory=list)  # each trial's: a case's checker makes its inputs again

    def record_into(self, result: ItemResult) -> None:
        """What the reference's side found, known before the candidate runs, into the item."""
        result.baseline_correct = self.baseline_correct
        result.weak_reference = self.weak
        if self.baseline_problems:  # why the baseline is wrong here (``baseline_correct`` false)
            result.extra["baseline_problems"] = self.baseline_problems[:BASELINE_PROBLEMS_KEPT]


def untimed_reason(spec: ItemSpec, ref: ReferenceData) -> str | None:
    """Why a correct item is not timed, or None. A baseline that raises on an unseen shape is the
    quadrants' 'candidate improved' (a kernel-to-kernel task's original kernel that handles some
    shapes only), not a broken case, and there is nothing to time the candidate against. On a seen
    shape it stays the case's failure: no pair of the case could earn its scored speedup."""
    if ref.baseline_raised and spec.shape.split == "unseen":
        return "the baseline raises on this unseen shape, so there is nothing to time the candidate against: " + ref.baseline_problems[0]
    return None


def derive_seed(session_seed: int, *parts: Any) -> int:
    """A per-purpose seed from the session seed; without the session seed it cannot be predicted."""
    digest = hashlib.sha256(repr((session_seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 62) - 1)


class LocalExecutor:
    def __init__(self, settings: Settings, lease_factory: LeaseFactory, device_kind: str, sandbox: Any = None,
                 cpu_threads: int | None = None) -> None:
        self.settings = settings
        # torch CPU threads of this process and its children (``cpu_share``); None: torch's default
        self.cpu_threads = cpu_threads
        self.sandbox = sandbox  # sandbox.Sandbox under --kcoral-sandbox: children run inside it
        self.lease_factory = lease_factory
        self.device_kind = device_kind  # "cpu" or "cuda": decides the child environment
        self._references: dict[tuple, ReferenceData] = {}
        self._trusted: dict[tuple[str, str], Child] = {}
        self._baselines: dict[tuple[str, str], Child] = {}  # see ``_baseline_child``
        self._costs: dict[tuple, tuple[dict | None, dict | None]] = {}  # see ``_cost``
        self._kept_candidates = KeptCandidates()  # see ``_candidate_child``
        # --kcoral-ncu / --kcoral-sanitizer (SPEC section 8); the plugin checked the tools exist
        self.diagnostics = Diagnostics.from_settings(settings, self._child_env())

    # -- public -----------------------------------------------------------------------------

    def start_template(self) -> None:
        """Start the process children are forked from, without waiting for its imports (torch,
        Triton: seconds), so that they overlap collection instead of delaying the first item."""
        isolation.ensure_template(self._child_env(), self.sandbox)

    def run(self, spec: ItemSpec) -> ItemResult:
        case, cand, shape = spec.case, spec.candidate, spec.shape
        result = ItemResult(
            nodeid=spec.nodeid,
            case=case.case_id,
            candidate=cand.name,
            split=shape.split,
            shape=dict(shape.params),
            shape_id=shape.shape_id,
            tier=case.tier,
            team=cand.team,
            attempt=cand.attempt,
            expected=cand.expected,
        )
        started = time.monotonic()
        if self.cpu_threads is not None:
            result.extra["cpu_threads"] = self.cpu_threads
            cpu_share.limit(self.cpu_threads)  # here, not at start-up: torch is imported by now; no-op once set
        result.suspicious = static_report.scan_file(cand.path)
        try:
            if shape.gpu_only and self.device_kind == "cpu":
                raise ItemSkipped("shape is marked gpu_only and no GPU is visible")
            self._run_stages(spec, result, deadline=started + self.settings.timeout_s)
            result.stage = "done"
            result.outcome = "passed"
        except StageFailed as failure:
            result.stage = failure.stage
            result.phase = failure.phase
            result.outcome = "failed"
            result.message = failure.message
            result.case_failed = failure.case_failed
            if failure.stage == "compile":  # also a compiler error at the first call (Triton, cpp_extension)
                result.compiled = False
            if failure.stage == "correctness" or failure.disqualifies:
                result.correct = False
        except ServiceUnavailable as outage:
            # failed, so the run cannot pass, but kept out of the scores: nothing was graded
            result.stage = outage.stage
            result.outcome = "failed"
            result.message = outage.message
            result.extra["service_unavailable"] = True
        except ItemSkipped as skip:
            result.outcome = "skipped"
            result.message = str(skip)
        except Exception as exc:  # noqa: BLE001 - a harness error (or one a child provoked): failed, never lost
            # an item without a result is missing from the JSON and every score; a candidate that
            # could provoke one (a reply the parent chokes on) would hide its failing shapes
            self._fail_after_the_stages(result, f"the harness failed on this item: {type(exc).__name__}: {exc}"[:2000], "harness_error")
        finally:
            result.duration_s = time.monotonic() - started
        if self.settings.url is None and isolation.template_lost():
            # the template every child is forked from died while this item ran: its candidate (the
            # same user) killed it, to switch off the sandbox or the orphan sweep for what follows
            self._fail_after_the_stages(result, "the process every child is forked from (the harness's template) died while this item"
                                                " ran: killed by the candidate? Its processes were stopped and the template started anew",
                                        "template_killed")
        return result

    def _fail_after_the_stages(self, result: ItemResult, why: str, marker: str) -> None:
        """Fail an item for what went wrong around its stages (``extra[marker]`` says what): at the
        stage it had reached, and not correct once it compiled, so that nothing a candidate can
        provoke earns a grade. A failure the stages had found already stays in the message."""
        if result.outcome != "failed":
            timed = result.correct and self.settings.mode != "correctness"
            result.stage = "timing" if timed else ("correctness" if result.compiled else "compile")
        elif result.message:
            why = f"{why}\n(before that: {result.message.splitlines()[0]})"
        result.outcome = "failed"
        result.correct = False if result.compiled else None
        result.message = why
        result.extra[marker] = True

    # -- stages -----------------------------------------------------------------------------

    def _case_spec(self, case: Case) -> dict[str, Any]:
        return {
            "format": case.format,
            "source": str(case.source),
            "baseline_file": str(case.baseline_file) if case.baseline_file else None,
            "device": "cpu",  # until the lease names the device
            "device_kind": self.device_kind,
            "init_seed": derive_seed(self.settings.seed, case.case_id, "init"),
            "cpu_threads": self.cpu_threads,
            "helper_files": {name: str(path) for name, path in case.helper_files.items()},
        }

    def _child_env(self) -> dict[str, str]:
        # torch.compile compiles in this process rather than in a pool of workers that would outlive
        # the call (and count as processes left behind). On a CPU, Triton kernels run through its
        # interpreter.
        env = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
        if self.device_kind == "cpu":
            env["TRITON_INTERPRET"] = "1"
        env.update(confine.child_env(self.settings.confinement, self.sandbox, remote=self.settings.url is not None))
        return env

    def _run_stages(self, spec: ItemSpec, result: ItemResult, deadline: float) -> None:
        case, shape = spec.case, spec.shape
        tol = correctness.Tolerance(case.atol, case.rtol, strict=self.settings.tolerance == "strict")
        with contextlib.ExitStack() as stack:
            candidate: Child | None = None
            try:
                with timed_phase(result, "compile"):
                    candidate = self._candidate_child(spec, stack, deadline, reuse=True)
                stack.callback(_keep_output, candidate, result)
                # before any candidate code of the item runs (see ``_baseline_child``); starting it
                # is the case's work, not the item's: the item's deadline moves by what it took
                baseline_started = time.monotonic()
                baseline = self._baseline_child(spec.case) if self.settings.mode != "correctness" else None
                deadline += time.monotonic() - baseline_started
                candidate.deadline = deadline
                with timed_phase(result, "compile"):
                    self._stage("compile", lambda: candidate.call("load_candidate", "import", path=str(spec.candidate.path), shape=shape.params))
            except StageFailed:
                self._record_baseline_only(spec, result, tol)
                raise
            finally:
                if candidate is not None:  # which process ran the candidate, its how-manieth item there
                    result.extra["candidate_process"] = {"pid": candidate.pid, "item": candidate.items_served}
            result.compiled = True

            lease = stack.enter_context(self._lease(spec, result))
            # --kcoral-timeout bounds the item's own work; waiting for the device is bounded by
            # --kcoral-lease-timeout, so an item queued behind a hung one keeps its full budget
            deadline += lease.wait_ms / 1000.0
            candidate.deadline = deadline
            # the candidate's process ends, or is paused to be kept, before the device is given
            # back: nothing it left running may overlap the next holder's measurements; then
            # the kept children it may have stopped run again (callbacks run last-in, first-out)
            stack.callback(self._resume_kept_children)
            passed: list[bool] = []  # set once the item's last command came back: the child may be kept
            stack.callback(self._keep_or_close_candidate, spec, candidate, passed)
            if isinstance(baseline, Child):
                baseline.deadline = deadline
            device = result.device or "cpu"

            def trusted() -> Child:
                return self._trusted_child(case, deadline)

            with timed_phase(result, "reference"):
                ref = self._reference_data(spec, device, trusted, tol)
            ref.record_into(result)
            with timed_phase(result, "correctness"):
                self._check_correctness(spec, candidate, ref, device, tol, trusted)
            if self.diagnostics and self.diagnostics.sanitizer:
                deadline = self._diagnose(spec, ref, device, result, "sanitizer", candidate, deadline)
            result.correct = True
            if self.settings.mode != "correctness":
                with timed_phase(result, "timing"):
                    self._time(spec, candidate, baseline, trusted, ref, device, self._timing_cpu(lease), tol, result)
                    if isinstance(baseline, Child):  # an untimed item (``untimed_reason``) needs none
                        self._baseline_call(baseline, "finish", "baseline")  # kept: its item's timing sets go
            if self.diagnostics and self.diagnostics.ncu:
                deadline = self._diagnose(spec, ref, device, result, "ncu", candidate, deadline)
            # the last word: the child's audit runs once more, and a reply left over in the
            # channel (a forged one answered a command before the genuine one) shows here
            self._stage("correctness" if self.settings.mode == "correctness" else "timing", lambda: candidate.call("finish", "finish"))
            passed.append(True)

    def _candidate_child(self, spec: ItemSpec, stack: contextlib.ExitStack, deadline: float, reuse: bool = False) -> Child:
        """The candidate's child, holding the case; closed when ``stack`` unwinds unless it was kept
        meanwhile (``_keep_or_close_candidate``). With ``reuse``, the child the candidate's last
        passed item of this case left (``kept_children``), which holds the candidate already.
        Otherwise a fresh one, in which nothing of the candidate has run yet (``load_candidate``
        comes next): a failure here is the case's (one that crashes or hangs at import in a child
        only), and the message says so."""
        child = self._kept_candidates.take(_candidate_key(spec)) if reuse else None
        if child is None:
            self._require_case_as_collected(spec.case, "compile", "startup")
            try:
                child = Child("candidate", self._case_spec(spec.case), self._child_env(), deadline, spec.candidate.name, self.sandbox,
                              live_output=self.settings.live_output)
            except ChildFailure as failure:
                self._skip_if_case_needs_cuda(failure)
                raise StageFailed("compile", CASE_FAILED_PREFIX + _describe_child_failure("compile", failure), failure.phase,
                                  case_failed=True) from None
        child.deadline = deadline
        child.items_served += 1
        stack.callback(self._close_unless_kept, child)
        return child

    def _keep_or_close_candidate(self, spec: ItemSpec, child: Child, passed: list[bool]) -> None:
        """At the end of an item, before the device is given back: a child whose item passed is
        paused and kept for the candidate's next item; any other is closed, so nothing it left
        running overlaps the next holder's measurements."""
        if passed and child.process.exitcode is None:
            self._kept_candidates.keep(_candidate_key(spec), child)
        else:
            child.close()

    def _close_unless_kept(self, child: Child) -> None:
        if not self._kept_candidates.holds(child):
            child.close()

    def _baseline_child(self, case: Case) -> Child | StageFailed:
        """The case's baseline child, which times the baseline the way a candidate's child times
        the candidate: it holds the baseline in the candidate's place (``load_baseline``) and gets,
        per item, the correctness stage's ``run`` the candidate got, then the same ``time``
        commands. Or the case's failure, raised when timing starts (the candidate's compile and
        correctness come first).

        Not the trusted child: the same code timed there and in a fresh child that went the
        candidate's way read apart (docs/performance.md, "The short-kernel lean was the trusted
        child's"). Kept across the case's items, as
        the trusted child is, so a baseline that compiles (``torch.compile``, Triton) compiles
        once per worker, not under the lease of every item. Started before the first item's
        candidate code runs, and only from the case's files as collected
        (``_require_case_as_collected``), so a candidate that rewrites them (no
        ``--kcoral-sandbox``) cannot reach the baseline it is timed against."""
        key = (case.case_id, case.content_hash)
        child = self._baselines.pop(key, None)
        if child is None or child.process.exitcode is not None:
            fresh = self._fresh_baseline_child(case)
            if isinstance(fresh, StageFailed):
                return fresh
            child = fresh
        return _keep(self._baselines, key, child)

    def _fresh_baseline_child(self, case: Case) -> Child | StageFailed:
        """A new baseline child holding the baseline (``_baseline_child`` keeps one per case; a
        host-set item's further pairs of processes each start one). One started after candidate
        code ran is as safe as the first: it imports the case only as collected, and compiles its
        kernels in a directory of its own (``child._compile_without_shared_caches``)."""
        child = None
        try:
            self._require_case_as_collected(case, "timing", "baseline")
            # a budget of its own, as the case's work has in ``_record_baseline_only``
            child = Child(BASELINE_ROLE, self._case_spec(case), self._child_env(), time.monotonic() + self.settings.timeout_s,
                          f"baseline:{case.case_id}", self.sandbox)
            child.call("load_baseline", "baseline")
            return child
        except StageFailed as failure:
            return failure
        except ChildFailure as failure:
            if child is not None:
                child.close()
            self._skip_if_case_needs_cuda(failure)
            return StageFailed("timing", CASE_FAILED_PREFIX + _describe_child_failure("timing", failure), failure.phase, case_failed=True)

    def _require_case_as_collected(self, case: Case, stage: str, phase: str) -> None:
        """Before a child imports the case: its files as they were at collection, or the case's
        failure. Without ``--kcoral-sandbox`` a candidate can write into the case tree; a child
        started later (the next item's, a trusted child restarted) would run what it wrote."""
        changed = changed_case_files(case)
        if changed:
            raise StageFailed(stage, CASE_FAILED_PREFIX + f"its files changed after collection ({', '.join(changed)}): a candidate may have"
                              " written them; --kcoral-sandbox keeps the case tree read-only", phase, case_failed=True)

    def _diagnose(self, spec: ItemSpec, ref: ReferenceData, device: str, result: ItemResult, tool: str,
                  candidate: Child, deadline: float) -> float:
        """Run the candidate under compute-sanitizer or Nsight Compute (``diagnostics.py``), still
        under the lease; returns the item's deadline, moved by the time the tool took (the tools
        have their own limit, and the stages after them keep their budget)."""
        assert self.diagnostics is not None
        job = {"case": dict(self._case_spec(spec.case), device=device), "candidate": str(spec.candidate.path),
               "shape": spec.shape.params}
        started = time.monotonic()
        with timed_phase(result, tool):
            run = self.diagnostics.sanitize if tool == "sanitizer" else self.diagnostics.profile
            record = run(job, ref.inputs, spec.nodeid)
        result.extra.setdefault("diagnostics", {})[tool] = record
        deadline += time.monotonic() - started
        candidate.deadline = deadline
        if record.get("failure"):  # only the sanitizer's verdict can fail an item
            raise StageFailed("correctness", record["failure"], tool)
        return deadline

    def _record_baseline_only(self, spec: ItemSpec, result: ItemResult, tol: correctness.Tolerance) -> None:
        """Whether the baseline is correct on this shape, also when the candidate never compiled:
        conditional correctness and its quadrants count every item (usually a cache hit)."""
        # the case's own work gets its own budget: the candidate may have used up the item's
        deadline = time.monotonic() + self.settings.timeout_s
        try:
            with self._lease(spec, result) as lease:
                deadline += lease.wait_ms / 1000.0
                ref = self._reference_data(spec, result.device or "cpu", lambda: self._trusted_child(spec.case, deadline), tol)
        except (StageFailed, ItemSkipped, ChildFailure):
            return  # the compile failure stays the item's verdict
        ref.record_into(result)

    def _stage(self, stage: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ChildFailure as failure:
            if failure.kind == "outage":
                raise ServiceUnavailable(stage, failure.message) from None
            # the candidate's commands; a KernelBench ModelNew is built from the case's get_init_inputs there too
            self._skip_if_case_needs_cuda(failure, "the candidate's process")
            # a compiler error at the first call is the compile stage's; once the candidate has
            # run (timing comes after correctness), it is a failure to run the timed calls
            if failure.kind == "error" and failure.error.get("compile_error") and stage != "timing":
                stage = "compile"
            # a candidate that raises, crashes or lies once timed is not correct; one that runs out of time may be
            raise StageFailed(stage, _describe_child_failure(stage, failure), failure.phase,
                              disqualifies=stage == "timing" and failure.kind != "timeout") from None

    def _skip_if_case_needs_cuda(self, failure: ChildFailure, who: str = "the case") -> None:
        """On a machine without a GPU, code that needs CUDA skips instead of failing: the case's
        (its inputs), or what runs in the candidate's process (``who``)."""
        if failure.kind == "error" and failure.error.get("needs_cuda") and self.device_kind == "cpu":
            raise ItemSkipped(f"{who} needs CUDA: {failure.message}") from None

    @contextlib.contextmanager
    def _lease(self, spec: ItemSpec, result: ItemResult) -> Iterator[Any]:
        """Hold a device for the GPU stages; record which one, the wait and the hold."""
        from pytest_kcoral.lease import LeaseError

        holding = self.lease_factory(spec.nodeid)
        try:
            lease = holding.__enter__()
        except LeaseError as exc:
            raise StageFailed("correctness", f"no device: {exc}", "lease") from None
        result.device = lease.device_name
        result.lease_wait_ms = lease.wait_ms
        try:
            yield lease
        finally:
            holding.__exit__(None, None, None)
            result.lease_held_ms = lease.held_ms
            if hasattr(lease, "to_dict"):
                result.extra["lease"] = lease.to_dict()  # absolute times, for the overlap audit

    def _reference_data(self, spec: ItemSpec, device: str, trusted: Callable[[], Child], tol: correctness.Tolerance) -> ReferenceData:
        case, shape = spec.case, spec.shape
        # the case's id too: a KernelBench model's weights come from an init seed derived from it, so
        # two folders holding the same files have different references
        key = (case.case_id, case.content_hash, shape.split, shape.shape_id, self.settings.seed, device, self.settings.trials)
        cached = self._references.get(key)
        if cached is not None:
            return cached
        seeds = [derive_seed(self.settings.seed, case.case_id, shape.split, shape.shape_id, t) for t in range(self.settings.trials)]
        # a KernelBench baseline is the reference module itself: nothing to check
        check_baseline = case.has_baseline and case.format != KERNELBENCH
        header, payload = self._trusted_call(
            trusted, "reference", "reference", shape=shape.params, seeds=seeds, device=device,
            baseline=check_baseline, tolerance=[tol.atol, tol.rtol, tol.strict], inplace=list(case.inplace),
        )
        if header.get("unsteady"):
            raise StageFailed("correctness", CASE_FAILED_PREFIX + "its reference is not deterministic: a second call on"
                              " the same inputs gave " + "; ".join(header["unsteady"]), "reference", case_failed=True)
        baseline_problems = list(header["baseline_problems"])
        data = ReferenceData(
            inputs=payload["inputs"],
            reference=payload["reference"],
            # None where the baseline is the reference: such shapes stay out of the quadrants
            baseline_correct=not baseline_problems if check_baseline else None,
            baseline_problems=baseline_problems,
            baseline_raised=bool(header.get("baseline_raised")),
            weak=bool(header["weak"]),
            structure=header.get("structure"),
            written_inputs=tuple(header.get("written_inputs") or ()),
            written=payload.get("written") or [],
            output_aliases=tuple((int(i), int(j)) for i, j in header.get("output_aliases") or ()),
            seeds=seeds,
        )
        if not data.written_inputs and all(v is None for ref in data.reference for v in ref):
            raise StageFailed("correctness", CASE_FAILED_PREFIX + "its reference returns nothing and writes none of its INPLACE"
                              f" inputs ({list(case.inplace) or 'none listed'}): nothing to compare a candidate against", "reference",
                              case_failed=True)
        self._references[key] = data
        return data

    def _trusted_child(self, case: Case, deadline: float) -> Child:
        """The case's trusted child, kept across items: it only ever imports the case, and reusing
        it saves a process start, a case import and, on a GPU, a CUDA context per item."""
        key = (case.case_id, case.content_hash)
        child = self._trusted.pop(key, None)
        if child is None or child.process.exitcode is not None:
            self._require_case_as_collected(case, "correctness", "reference")
            child = Child("trusted", self._case_spec(case), self._child_env(), deadline, f"reference:{case.case_id}", self.sandbox)
        child.deadline = deadline
        return _keep(self._trusted, key, child)

    def close(self) -> None:
        """End the trusted and baseline children (the session is over), and whatever any child
        left running outside its tree (``isolation.sweep_session_processes``)."""
        self._kept_candidates.close()
        for kept in (self._trusted, self._baselines):
            while kept:
                kept.popitem()[1].close()
        isolation.sweep_session_processes()

    def _trusted_call(self, trusted: Callable[[], Child], cmd: str, phase: str, **fields: Any) -> tuple[dict, Any]:
        """A trusted child failing is the case's fault, not the candidate's: say so."""
        child = None
        try:
            child = trusted()  # starting it can fail too (a case that crashes or hangs at import)
            return child.call(cmd, phase, **fields)
        except ChildFailure as failure:
            if child is not None:
                self._forget(child)
            self._raise_case_failure(failure, phase)

    def _baseline_call(self, baseline: Child, cmd: str, phase: str, **fields: Any) -> tuple[dict, Any]:
        """The baseline's child failing is the case's fault too."""
        try:
            return baseline.call(cmd, phase, **fields)
        except ChildFailure as failure:
            self._forget(baseline)
            self._raise_case_failure(failure, phase)

    def _resume_kept_children(self) -> None:
        """SIGCONT to the kept trusted and baseline children. A candidate runs as the same user as
        they do, and can stop them (SIGSTOP); once its process is gone, a child it left stopped
        would hang the next item of its case, and that item would read as the case's failure."""
        for kept in (self._trusted, self._baselines):
            for child in kept.values():
                if child.process.exitcode is None and child.process.pid is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(child.process.pid, signal.SIGCONT)

    def _forget(self, child: Any) -> None:
        """Never reuse a kept child that failed: it may be dead, hung or in a bad state."""
        for kept in (self._trusted, self._baselines):
            for key, value in list(kept.items()):
                if value is child:
                    del kept[key]
        child.close()

    def _raise_case_failure(self, failure: ChildFailure, phase: str) -> NoReturn:
        stage = "timing" if phase in ("baseline", "cost", "verify") else "correctness"
        if failure.kind == "outage":
            raise ServiceUnavailable(stage, failure.message) from None
        self._skip_if_case_needs_cuda(failure)
        raise StageFailed(stage, CASE_FAILED_PREFIX + _describe_child_failure(stage, failure), phase, case_failed=True) from None

    def _check_correctness(self, spec: ItemSpec, candidate: Child, ref: ReferenceData, device: str, tol: correctness.Tolerance,
                           trusted: Callable[[], Child]) -> None:
        header, payload = self._stage("correctness", lambda: candidate.call("run", "correctness", reply_limit_bytes=_reply_limit(ref, len(ref.inputs)),
                                                                            **correctness_run(spec, ref, device)))
        outputs = payload["outputs"]
        written = payload.get("written")
        if not _well_formed_written(written, outputs, len(ref.written_inputs)):
            raise StageFailed("correctness", f"the candidate's child returned unreadable in-place results {str(written)[:200]} (results forged?)",
                              "correctness")
        changed = header.get("inputs_changed")
        if not _well_formed_changes(changed, len(ref.inputs)):
            raise StageFailed("correctness", f"the candidate's child reported unreadable input changes {str(changed)[:200]} (results forged?)", "correctness")
        problems: list[str] = []
        structures = header.get("structures")
        if not _well_formed_structures(structures, outputs, len(ref.inputs)):
            raise StageFailed("correctness", f"the candidate's child reported an unreadable output structure {str(structures)[:200]}"
                              " (results forged?)", "correctness")
        judged = None  # the case's own checker's verdicts (GPU MODE), asked of the trusted child
        if spec.case.checker:
            judge = [None if header["findings"][t] or correctness.compare_structure(structures[t], ref.structure) else out
                     for t, out in enumerate(outputs)]
            judged = checker.trial_problems(functools.partial(self._trusted_call, trusted), spec.shape.params, device, ref.seeds, judge,
                                            structures, ref.reference)
        for t in range(len(ref.inputs)):
            trial = [*header["findings"][t]]
            if not trial:
                trial += correctness.compare_structure(structures[t], ref.structure)
            if not trial:
                trial += judged[t] if judged is not None else _compare_trial(ref, t, outputs[t], written[t], tol)
            trial += correctness.describe_changed_inputs(changed[t], _may_write(spec.case, header, t))
            problems += [f"trial {t + 1} of {len(ref.inputs)}: {p}" for p in trial]
        if spec.case.format == KERNELBENCH and header.get("parameters_differ") is True and _mostly_wrong(problems, len(ref.inputs)):
            # ModelNew's child found its weights differ from Model's: it draws them in another
            # order or shape (where they match, the kernel itself is wrong, and the hint would mislead)
            problems.append("hint: most elements differ in every trial: ModelNew's parameters are made under the same seed"
                            " as Model's, so they match only when ModelNew creates the same parameters, in the same order and shapes")
        # what explains wrong values goes first; after a wrong kind of output (an int where the
        # reference returns a tensor) it is a footnote
        first = 0 if correctness.same_kinds(outputs, ref.reference) else len(problems)
        if correctness.ignores_inputs(outputs, ref.reference):
            problems.insert(first, "the output does not depend on the inputs: every input set gave the same output, the reference's differ")
        constant = correctness.constant_where_reference_varies(outputs, ref.reference, tol)
        if constant:
            weak = " (this case is weak: zeros or a constant match its reference within tolerance)" if ref.weak else ""
            problems.insert(first, constant + weak)
        if problems:
            raise StageFailed("correctness", _one_screen(problems), "correctness")

    def _time(self, spec: ItemSpec, candidate: Child, baseline: Child | StageFailed | None, trusted: Callable[[], Child],
              ref: ReferenceData, device: str, cpu: int | None, tol: correctness.Tolerance, result: ItemResult) -> None:
        untimed = untimed_reason(spec, ref)
        if untimed:
            result.extra["untimed"] = untimed
            return
        if isinstance(baseline, StageFailed):
            raise baseline
        assert baseline is not None, "timing needs the baseline's child (None only in --kcoral-mode correctness and untimed items)"
        written_inputs = ref.written_inputs
        self._baseline_goes_the_candidates_way(baseline, spec, ref, device, tol)
        # Both sides run one harness with one set of fields: the baseline's child keeps timed
        # outputs as the candidate's does, then drops them, since keeping them allocates between
        # timed calls and a small kernel's time follows where its outputs land.
        timed_alike = dict(self._time_fields(spec, ref, device), cpu=cpu)
        first_sides = self._first_sides(spec)
        pairs = [self._time_pair(candidate, baseline, ref, timed_alike, next(first_sides))]
        # A launch-bound chain runs at the speed of the process it runs in, and a process can sit
        # at a slower level than another's for seconds (docs/performance.md, "host-set items in
        # three pairs of processes"): an item the host's speed sets is timed again in fresh pairs of processes, and the
        # median pair's figures are its own (``combine.median_pair``).
        while len(pairs) < self._process_pairs_for(pairs):
            pairs.append(self._time_in_fresh_processes(spec, ref, device, tol, timed_alike, candidate.deadline, next(first_sides)))
        floor, cost = self._cost(spec, trusted, device)
        try:
            baseline_stats = combine.combine_processes(pairs, "baseline")
        except ValueError as exc:
            raise StageFailed("timing", f"the baseline's timing rounds disagree: {exc}", "baseline") from exc
        try:
            candidate_stats = combine.combine_processes(pairs, "candidate")
        except ValueError as exc:
            raise StageFailed("timing", f"the candidate's timing rounds disagree: {exc}", "timing") from exc
        all_base = [r for pair in pairs for r in pair.baseline]
        all_cand = [r for pair in pairs for r in pair.candidate]
        # time outside the windows is judged between rounds taken in turns, in every pair
        combine.charge_outside_work(all_base, all_cand, candidate_stats, keep=combine.rounds_in_turns(pairs))
        if self.settings.precision is not None:
            taken = ", ".join(str(len(p.candidate)) for p in pairs)
            candidate_stats.flags.append(f"precision_target={self.settings.precision:.2%}: pairs of rounds taken per pair of processes"
                                         f" {taken} of at most {self._timing_rounds(ref)}")
        result.baseline_timing = baseline_stats.to_dict()
        result.candidate_timing = candidate_stats.to_dict()
        result.t_baseline_us = baseline_stats.median_us
        result.t_candidate_us = candidate_stats.median_us
        result.timer = candidate_stats.method
        result.speedup = combine.item_speedup(pairs, baseline_stats, candidate_stats)
        speedup_interval.record_interval(result, pairs, candidate_stats, spec.candidate.path, self.device_kind)
        # the trusted child sent the case's cost already validated (``speed_of_light.valid_cost``)
        result.speed_of_light = speed_of_light.report(cost, (floor or {}).get("spec_bytes_per_s"), result.t_baseline_us, result.t_candidate_us)
        checked = _timed_outputs_to_check(all_cand, [v for pair in pairs for v in pair.verify], combine.kept_rounds(pairs, "candidate"),
                                          random.Random(derive_seed(self.settings.seed, spec.nodeid, "verify")))
        with timed_phase(result, "verify"):
            self._verify_timed_outputs(trusted, checked, spec, device, tol, written_inputs, ref.structure)
        self._check_floor(floor, baseline_stats, candidate_stats, result)
        minimum = self.settings.min_speedup
        if minimum is not None:
            if result.speedup is None:
                raise StageFailed("timing", f"no speedup: baseline timed by {baseline_stats and baseline_stats.method}, candidate by {result.timer}", "timing")
            if result.speedup < minimum:
                raise StageFailed(
                    "timing",
                    f"speedup {result.speedup:.3g}x is below --kcoral-min-speedup {minimum:g} "
                    f"(baseline {result.t_baseline_us:.1f} us, candidate {result.t_candidate_us:.1f} us, {result.timer})",
                    "timing",
                )

    def _baseline_goes_the_candidates_way(self, baseline: Child, spec: ItemSpec, ref: ReferenceData, device: str, tol: correctness.Tolerance) -> None:
        """The baseline's child gets the correctness stage's run, as sent to the candidate, before
        it is timed: both sides come to their timing with the same history."""
        header, payload = self._baseline_call(baseline, "run", "baseline", **correctness_run(spec, ref, device))
        if ref.baseline_correct is not False:  # a baseline found wrong is recorded, and timed all the same
            problems = _run_problems(header, payload, ref, tol)
            if problems:
                raise StageFailed("timing", CASE_FAILED_PREFIX + "its baseline, run on the correctness inputs in the process that times it,"
                                  " disagrees with the reference where its check agreed (does it keep state across calls or items?): "
                                  + _one_screen(problems), "baseline", case_failed=True)

    def _time_pair(self, candidate: Child, baseline: Child, ref: ReferenceData, timed_alike: dict[str, Any],
                   first: str) -> combine.ProcessPair:
        """One pair of processes' timing rounds. Baseline and candidate take turns in rounds,
        ordered ABBA ABBA..., ``first``'s round first, all under one lease: the host's speed
        drifts within seconds (docs/performance.md, "Process noise"), and a drift then hits both sides alike; a slowdown of one process
        alone moves its pair of rounds' ratio, and the pair is left out
        (``combine.undisturbed_pairs``). Which side goes first need not be neutral (``_alternating_sides``). The candidate
        keeps timed outputs in every round; one of its fastest round's is checked against the
        reference, and others drawn from the session seed, so no round is safe to cheat in
        (``_timed_outputs_to_check``)."""
        keep = timed_alike["verify"]
        pair = combine.ProcessPair(first=first)

        def time_baseline(r: int) -> None:
            header, _ = self._baseline_call(baseline, "time", "baseline", warmup_s=_warmup_s(r), send_kept=False, **timed_alike)
            pair.baseline.append(TimingStats.from_dict(header["stats"]))

        def time_candidate(r: int) -> None:
            header, payload = self._stage("timing", lambda: candidate.call("time", "timing", warmup_s=_warmup_s(r), reply_limit_bytes=_reply_limit(ref, keep),
                                                                           **timed_alike))
            impossible = implausible_stats(header["stats"], candidate.last_call_s)
            if impossible:
                raise StageFailed("timing", f"the candidate's timing statistics are impossible: {impossible} (timers patched or results forged?)", "timing",
                                  disqualifies=True)
            stats_ = TimingStats.from_dict(header["stats"])
            if len(payload["verify"]) != min(keep, stats_.n if stats_ else 0):
                raise StageFailed("timing", f"the candidate's child returned {len(payload['verify'])} timed outputs to verify, expected {keep}"
                                  " (results forged?)", "verify",
                                  disqualifies=True)
            pair.candidate.append(stats_)
            pair.verify.append(payload["verify"])

        leads, follows = (time_baseline, time_candidate) if first == "baseline" else (time_candidate, time_baseline)
        for r in range(self._timing_rounds(ref)):
            one, other = (leads, follows) if r % 2 == 0 else (follows, leads)
            one(r)
            other(r)
            if self._precise_enough(pair):
                break
        return pair

    def _precise_enough(self, pair: combine.ProcessPair) -> bool:
        """Whether the pair's rounds so far pin its speedup down to ``--kcoral-precision``: the 95%
        interval of the median of the rounds' ratios lies within it. Checked after an even number
        of round pairs only, so that each side went first equally often."""
        precision = self.settings.precision
        taken = len(pair.candidate)
        if precision is None or taken < MIN_ROUND_PAIRS or taken % 2:
            return False
        ratios = combine.round_ratios(pair.baseline, pair.candidate)
        interval = speedup_interval.speedup_interval(ratios)
        if interval is None or len(ratios) < taken:
            return False
        centre = combine.median_ratio(ratios)
        return centre * (1 - precision) <= interval[0] and interval[1] <= centre * (1 + precision)

    def _first_sides(self, spec: ItemSpec) -> Iterator[str]:
        """The side that goes first in each pair of processes' turns (``_alternating_sides``),
        the first pair's drawn from the session seed and the item."""
        return _alternating_sides(derive_seed(self.settings.seed, spec.nodeid, "turns"))

    def _process_pairs_for(self, pairs: list[combine.ProcessPair]) -> int:
        """How many pairs of processes the item is timed in, given those timed so far:
        ``--kcoral-process-pairs`` N for every item; under auto one, and ``AUTO_PROCESS_PAIRS``
        when the first pair found the host's speed setting a side's time
        (``combine.host_set_side``)."""
        if self.settings.process_pairs is not None:
            return self.settings.process_pairs
        return AUTO_PROCESS_PAIRS if len(pairs) > 1 or self._host_set(pairs[0]) else 1

    @staticmethod
    def _host_set(pair: combine.ProcessPair) -> bool:
        try:
            return any(combine.host_set_side(combine.combine_processes([pair], side).to_dict()) for side in combine.SIDES)
        except ValueError:
            return False  # a side without samples: combining all pairs says which

    def _time_in_fresh_processes(self, spec: ItemSpec, ref: ReferenceData, device: str, tol: correctness.Tolerance,
                                 timed_alike: dict[str, Any], deadline: float, first: str) -> combine.ProcessPair:
        """Another pair of rounds, in a fresh candidate child and a fresh baseline child, each
        brought to its timing the way the first pair's were: the candidate loaded and its
        correctness run checked (a candidate right in one process only is wrong), the baseline
        loaded and given the same run. Both end before this returns, still under the lease."""
        with contextlib.ExitStack() as stack:
            try:
                candidate = self._candidate_child(spec, stack, deadline)
                self._stage("compile", lambda: candidate.call("load_candidate", "import", path=str(spec.candidate.path), shape=spec.shape.params))
                self._check_correctness(spec, candidate, ref, device, tol, lambda: self._trusted_child(spec.case, deadline))
            except StageFailed as failure:
                raise StageFailed("timing", "timed again in fresh processes (the host's speed sets this item's), the candidate's"
                                  f" new process failed at {failure.stage}: {failure.message}", failure.phase, case_failed=failure.case_failed,
                                  disqualifies=not failure.case_failed) from None
            baseline = self._fresh_baseline_child(spec.case)
            if isinstance(baseline, StageFailed):
                raise baseline
            stack.callback(baseline.close)
            self._baseline_goes_the_candidates_way(baseline, spec, ref, device, tol)
            pair = self._time_pair(candidate, baseline, ref, timed_alike, first)
            self._baseline_call(baseline, "finish", "baseline")
            self._stage("timing", lambda: candidate.call("finish", "finish"))
            return pair

    def _time_fields(self, spec: ItemSpec, ref: ReferenceData, device: str) -> dict[str, Any]:
        """One round's ``time`` command, the same for both sides, locally and remotely: the
        timing budget per callable (--kcoral-timing-budget, or the device's default) split over
        ``_timing_rounds``, and the timed outputs each round keeps for the check."""
        budget = self._timing_budget_s()
        rounds = self._timing_rounds(ref)
        return dict(shape=spec.shape.params, device=device, n_sets=TIMING_INPUT_SETS, budget_s=budget / rounds, timer=self.settings.timer,
                    verify=max(1, VERIFIED_TIMED_CALLS // rounds), written_inputs=list(ref.written_inputs))

    def _timing_budget_s(self) -> float:
        """Seconds of timed samples per callable: --kcoral-timing-budget, or the device's default."""
        return self.settings.timing_budget_s or (0.2 if self.device_kind == "cpu" else 1.0)

    def _timing_rounds(self, ref: ReferenceData) -> int:
        return timing_rounds(self.device_kind, _tensor_bytes(ref.inputs[0]) + _result_bytes(ref), self._timing_budget_s())

    def _cost(self, spec: ItemSpec, trusted: Callable[[], Child], device: str) -> tuple[dict | None, dict | None]:
        """The physical floor (a bandwidth measurement, under the lease) and the case's cost at
        the shape, from the trusted child; once per case, shape and device, not per candidate."""
        case = spec.case
        key = (case.case_id, case.content_hash, spec.shape.split, spec.shape.shape_id, device)
        if key not in self._costs:
            header, _ = self._trusted_call(trusted, "cost", "cost", shape=spec.shape.params, device=device)
            self._costs[key] = (header.get("floor"), header.get("cost"))
        return self._costs[key]

    def _timing_cpu(self, lease: Any) -> int | None:
        """The core both sides' timing runs on (``timing/pinning.py``), or None: chosen by the
        leased GPU's host-wide number, so sessions timing different GPUs never share a core."""
        device = getattr(lease, "device", None)
        return pinning.choose(device.timing_slot if isinstance(device, DeviceSpec) else None, self.settings.timing_cpu)

    def _check_floor(self, floor: dict | None, baseline: TimingStats | None, candidate: TimingStats | None, result: ItemResult) -> None:
        """No time below bytes / peak bandwidth (``physical_floor``), when the case declares ``cost``."""
        if not floor or candidate is None:
            return
        result.extra["physical_floor"] = floor
        floor_us = float(floor["floor_us"])
        if baseline is not None and baseline.median_us < floor_us:
            # the baseline moves the bytes faster than the floor allows: the case's cost overstates them
            result.extra["physical_floor_ignored"] = f"the baseline ({baseline.median_us:.3g} us) is below the floor: cost(shape) overstates the bytes"
            return
        if candidate.median_us < floor_us:
            raise StageFailed(
                "timing",
                f"time below the physical floor: {candidate.median_us:.3g} us to move {floor['bytes']:.4g} bytes "
                f"(cost(shape)) is faster than the floor {floor_us:.3g} us ({floor['how']})",
                "timing",
                disqualifies=True,
            )

    def _verify_timed_outputs(self, trusted: Callable[[], Child], verify: list[dict], spec: ItemSpec, device: str, tol: correctness.Tolerance,
                              written_inputs: tuple[int, ...] = (), structure: Any = None) -> None:
        """The outputs of timed calls must be right too, and the inputs they write in place: no
        computing only while watched. A case with a checker of its own judges them (``structure``:
        the reference's outputs', which the candidate's matched in the correctness stage)."""
        if not verify:
            return
        if spec.case.checker:
            found = checker.timed_problems(functools.partial(self._trusted_call, trusted), spec.shape.params, device, verify, structure)
            problems = [f"timed call {n + 1}: {p}" for n, trial in enumerate(found) for p in trial]
            if problems:
                raise StageFailed("timing", _one_screen(["the outputs of timed calls are wrong (correct only while checked?)", *problems]), "verify",
                                  disqualifies=True)
            return
        seeds = [v["seed"] for v in verify]
        _, payload = self._trusted_call(trusted, "reference", "verify", shape=spec.shape.params, seeds=seeds, device=device,
                                        baseline=False, written_inputs=list(written_inputs))
        names = correctness.written_input_names(written_inputs)
        problems = []
        for n, (entry, expected, expected_written) in enumerate(zip(verify, payload["reference"], payload["written"])):
            wrong = correctness.compare_outputs(entry["outputs"], expected, tol)
            if not wrong and entry["outputs"] is not None:
                wrong = correctness.compare_outputs(entry.get("written"), expected_written, tol, names)
            problems += [f"timed call {n + 1}: {p}" for p in wrong]
        if problems:
            raise StageFailed("timing", _one_screen(["the outputs of timed calls are wrong (correct only while checked?)", *problems]), "verify",
                              disqualifies=True)


def _alternating_sides(seed: int) -> Iterator[str]:
    """The side whose round comes first in each pair of processes' turns (``_time_pair``): the
    first pair's drawn from ``seed`` (the session seed and the item), then alternating.

    Going first need not be neutral: on a GPU the side whose round came first has read fast
    (docs/performance.md, "the side that goes first in the turns reads fast"). Alternating cancels
    such an advantage, whichever side it favours on a host, between an item's pairs of processes;
    the draw spreads it evenly, in both directions, over items timed in one pair."""
    sides = combine.SIDES if seed % 2 == 0 else combine.SIDES[::-1]
    return itertools.cycle(sides)


def _candidate_key(spec: ItemSpec) -> tuple[str, str, str]:
    """Which kept child an item may reuse: one of the same case (as collected) and candidate file."""
    return spec.case.case_id, spec.case.content_hash, str(spec.candidate.path)


def _keep(kept: dict[tuple[str, str], Child], key: tuple[str, str], child: Child) -> Child:
    """``child`` as the most recently used of ``kept`` (a case's trusted or baseline children);
    beyond ``MAX_TRUSTED_CHILDREN``, the least recently used one is closed."""
    kept[key] = child  # most recently used last
    while len(kept) > MAX_TRUSTED_CHILDREN:
        kept.pop(next(iter(kept))).close()
    return child


def _timed_outputs_to_check(rounds: list[TimingStats], kept_outputs: list[list[dict]], kept_rounds: list[int] | None,
                            rng: random.Random) -> list[dict]:
    """``VERIFIED_TIMED_CALLS`` of the candidate's kept timed outputs (``kept_outputs``: per
    round): one of its fastest round's among those that set its time (``kept_rounds``, from
    ``combine.undisturbed_pairs``; None: all), the rest drawn from all the others. A candidate
    that skips its work to be fast is fastest where it skipped, and that round is always checked."""
    timed = [r for r in (range(len(rounds)) if kept_rounds is None else kept_rounds) if kept_outputs[r]]
    if not timed:
        return []
    fastest = min(timed, key=lambda r: rounds[r].median_us)
    first = kept_outputs[fastest][rng.randrange(len(kept_outputs[fastest]))]
    others = [v for entries in kept_outputs for v in entries if v is not first]
    return [first, *rng.sample(others, min(len(others), VERIFIED_TIMED_CALLS - 1))]


def _reply_limit(ref: ReferenceData, results: int) -> int:
    """The most tensor bytes a candidate's reply carrying ``results`` results (outputs and in-place
    results, each the size of the reference's) may hold: four times that, and 64 MiB over, so a
    wrong dtype or shape still reads as such; more is a child flooding this process's memory."""
    return 4 * results * _result_bytes(ref) + (64 << 20)


def _result_bytes(ref: ReferenceData) -> int:
    """Tensor bytes of one result: the reference's outputs and in-place results for one input."""
    return _tensor_bytes(ref.reference[0]) + (_tensor_bytes(ref.written[0]) if ref.written else 0)


def _tensor_bytes(values: Any) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values or () if isinstance(v, torch.Tensor))


def correctness_run(spec: ItemSpec, ref: ReferenceData, device: str) -> dict[str, Any]:
    """The correctness stage's ``run`` command (payload and fields): the candidate's child gets it,
    and the baseline's child the same before it is timed."""
    import torch

    poison = [r.numel() * r.element_size() for r in ref.reference[0] if isinstance(r, torch.Tensor)]
    aliases = ref.output_aliases
    if spec.case.output_buffers_in_inputs:  # any output may be an input: ``_may_write`` judges the writes
        aliases = tuple((i, j) for i in range(len(ref.reference[0])) for j in range(len(ref.inputs[0])))
    return dict(payload={"inputs": ref.inputs}, shape=spec.shape.params, device=device, poison_bytes=poison,
                written_inputs=list(ref.written_inputs), allowed_aliases=[list(pair) for pair in aliases])


def _may_write(case: Case, header: dict[str, Any], trial: int) -> tuple[int, ...]:
    """The inputs a candidate's call may change in a trial: ``INPLACE``'s, and, where a case's data
    carries output buffers (GPU MODE), the inputs the call returned as outputs (``c[...] = a @ b;
    return c``). Any other input must come back unchanged."""
    if not case.output_buffers_in_inputs:
        return case.inplace
    aliases = header.get("output_aliases")
    returned = aliases[trial] if isinstance(aliases, list) and trial < len(aliases) and isinstance(aliases[trial], list) else []
    return (*case.inplace, *(pair[1] for pair in returned if isinstance(pair, list) and len(pair) == 2 and type(pair[1]) is int))


def _run_problems(header: dict[str, Any], payload: Any, ref: ReferenceData, tol: correctness.Tolerance) -> list[str]:
    """What a ``run`` reply (outputs, in-place results, findings) gets wrong against the reference, per trial."""
    outputs, written, findings = payload["outputs"], payload.get("written") or [], header.get("findings") or []
    problems: list[str] = []
    for t in range(len(ref.inputs)):
        trial = list(findings[t]) if t < len(findings) else []
        if not trial:
            trial += _compare_trial(ref, t, outputs[t], written[t] if t < len(written) else None, tol)
        problems += [f"trial {t + 1} of {len(ref.inputs)}: {p}" for p in trial]
    return problems


def _compare_trial(ref: ReferenceData, t: int, outputs: Any, written: Any, tol: correctness.Tolerance) -> list[str]:
    """One trial's outputs and in-place results against the reference's."""
    return (correctness.compare_outputs(outputs, ref.reference[t], tol)
            + correctness.compare_outputs(written, ref.written[t], tol, correctness.written_input_names(ref.written_inputs)))


def implausible_stats(stats: dict[str, Any] | None, parent_wall_s: float) -> str | None:
    """Why reported timing statistics cannot be true, checked against the parent's own clock.

    Every timed call runs inside the ``time`` command, so the timed calls together cannot take longer
    than the parent saw the command take: at least half of the ``n`` samples are >= the median and
    every one is >= the minimum. Values must be finite, non-negative and ordered.
    """
    if not isinstance(stats, dict):
        return "no statistics"
    try:
        n = int(stats["n"])
        median_us, min_us, iqr_us = float(stats["median_us"]), float(stats["min_us"]), float(stats.get("iqr_us", 0.0))
    except (KeyError, TypeError, ValueError):
        return "malformed statistics"
    values = [median_us, min_us, iqr_us]
    if n < 1 or any(not (v == v and 0.0 <= v < float("inf")) for v in values):
        return f"n={n}, median {median_us} us, min {min_us} us, iqr {iqr_us} us are not finite non-negative numbers"
    if min_us > median_us:
        return f"the minimum {min_us:.3g} us exceeds the median {median_us:.3g} us"
    wall_us = parent_wall_s * 1e6
    if any(str(f).startswith("cpu_time_above_wall") for f in stats.get("flags") or ()):
        wall_us *= os.cpu_count() or 1  # timed by CPU time (``timing._at_least_cpu_time``): each core adds its own
    lower_bound_us = max(n * min_us, (n + 1) // 2 * median_us)
    if lower_bound_us > wall_us:
        return (f"{n} samples with median {median_us:.3g} us and minimum {min_us:.3g} us need at least {lower_bound_us / 1e6:.3g} s, "
                f"but the whole timing command took {parent_wall_s:.3g} s by the parent's clock")
    return None


def _mostly_wrong(problems: list[str], trials: int) -> bool:
    """Whether every trial has an output with over half of its elements out of tolerance."""
    shares: dict[str, float] = {}
    for line in problems:
        found = re.match(r"trial (\d+) of \d+: .* elements \(([\d.]+)%\) outside", line)
        if found:
            shares[found[1]] = max(shares.get(found[1], 0.0), float(found[2]))
    return len(shares) == trials and all(share > 50 for share in shares.values())


def _well_formed_changes(changes: Any, trials: int) -> bool:
    """``[[input index, bytes or None], ...]`` per trial, as ``correctness.changed_inputs`` makes them."""
    def entry_ok(e: Any) -> bool:
        return (isinstance(e, list) and len(e) == 2 and type(e[0]) is int
                and (e[1] is None or type(e[1]) is int))
    return isinstance(changes, list) and len(changes) == trials and all(isinstance(c, list) and all(entry_ok(e) for e in c) for c in changes)


def _well_formed_written(written: Any, outputs: list[Any], count: int) -> bool:
    """Per trial, the written INPLACE inputs' values (``count`` of them), or None where the
    trial's outputs did not come back either."""
    return (isinstance(written, list) and len(written) == len(outputs)
            and all((w is None) == (o is None) and (w is None or (isinstance(w, (list, tuple)) and len(w) == count))
                    for w, o in zip(written, outputs)))


def _well_formed_structures(structures: Any, outputs: list[Any], trials: int) -> bool:
    """One structure per trial, each of the kind ``child.flatten_outputs`` makes and holding as
    many values as came back (none come back from a trial with findings)."""
    if not (isinstance(structures, list) and len(structures) == trials):
        return False
    for structure, values in zip(structures, outputs):
        leaves = correctness.structure_leaves(structure)
        if leaves is None or (values is not None and (not isinstance(values, (list, tuple)) or leaves != len(values))):
            return False
    return True


def _keep_output(candidate: Child, result: ItemResult) -> None:
    """What the candidate's process printed during the item, into the item (the process may
    serve the candidate's next item too)."""
    result.output_tail = candidate.take_output_tail()


def _one_screen(lines: list[str], limit: int = 12) -> str:
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
    return "\n".join(lines)


# Known failures whose message does not say what to do: (text in the message, the hint)
_HINTS = (
    ("0 active drivers", "Triton found no GPU driver: without a GPU, Triton kernels run in its interpreter, which"
                         " cannot run @triton.autotune (its benchmarking needs a GPU); grade autotuned kernels on a GPU"),
)


def _describe_child_failure(stage: str, failure: ChildFailure) -> str:
    lines = [f"{failure.message}"]
    lines += [f"hint: {hint}" for text, hint in _HINTS if text in failure.message]
    tb = failure.error.get("traceback", "")
    if failure.kind == "error" and tb:
        lines += ["", "traceback (candidate and case frames):", *("  " + ln for ln in tb.rstrip().splitlines()[-16:])]
    output = failure.output.strip()
    if output:
        out_lines = output.splitlines()[-12:]
        lines += ["", "child output (last lines):", *("  " + ln for ln in out_lines)]
    return "\n".join(lines)
