"""Run step, on this host: ``LocalExecutor`` runs an item's stages, compile -> correctness ->
timing, gated in order, in child processes (``children.py``).

- compile: the candidate's child (kept from the candidate's last passed item, or fresh) loads the
  candidate, without the device lease;
- then, under the lease: the reference (``stage_reference``), correctness
  (``stage_correctness``), the sanitizer, timing (``stage_timing``) and Nsight Compute.

The candidate never shares a process with the reference or the baseline. The stages are the same
functions ``remote.RemoteExecutor`` runs over KCoral programs; this module only says where the
processes come from and what holds the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from pytest_kcoral import cpu_share, isolation
from pytest_kcoral.children import LocalChildren, LocalProcesses, load_candidate, require_case_as_collected
from pytest_kcoral.context import LOCAL, Budget, ItemContext, ItemSkipped, ItemSpec, LeaseFactory, StageFailed, timed_phase
from pytest_kcoral.devices import DeviceSpec
from pytest_kcoral.diagnostics import Diagnostics
from pytest_kcoral.failures import candidate_call, case_call
from pytest_kcoral.grading import fail_after_the_stages, grade, new_result
from pytest_kcoral.isolation import Child, ChildFailure
from pytest_kcoral.lease import LeaseError
from pytest_kcoral.messages import Finish
from pytest_kcoral.options import Settings
from pytest_kcoral.results import ItemResult
from pytest_kcoral.stage_correctness import check_correctness
from pytest_kcoral.stage_reference import ReferenceCache, ReferenceData, trial_inputs
from pytest_kcoral.stage_timing import time_item
from pytest_kcoral.timing import pinning


class LocalExecutor:
    def __init__(self, settings: Settings, lease_factory: LeaseFactory, device_kind: str, sandbox: Any = None,
                 cpu_threads: int | None = None) -> None:
        self.settings = settings
        self.lease_factory = lease_factory
        self.device_kind = device_kind  # "cpu" or "cuda": decides the child environment
        # torch CPU threads of this process and its children (``cpu_share``); None: torch's default
        self.cpu_threads = cpu_threads
        self.children = LocalChildren(settings, device_kind, sandbox, cpu_threads)
        self.references = ReferenceCache()
        # --kcoral-ncu / --kcoral-sanitizer (SPEC section 8); the plugin checked the tools exist
        self.diagnostics = Diagnostics.from_settings(settings, self.children.env)

    def start_template(self) -> None:
        """Start the process children are forked from, without waiting for its imports (torch,
        Triton: seconds), so that they overlap collection instead of delaying the first item."""
        isolation.ensure_template(self.children.env, self.children.sandbox)

    def run(self, spec: ItemSpec) -> ItemResult:
        result = new_result(spec)
        if self.cpu_threads is not None:
            result.extra.cpu_threads = self.cpu_threads
            cpu_share.limit(self.cpu_threads)  # here, not at start-up: torch is imported by now; no-op once set
        grade(spec, result, self.settings, LOCAL, self.device_kind, self._run_stages)
        if isolation.template_lost():
            # the template every child is forked from died while this item ran: its candidate (the
            # same user) killed it, to switch off the sandbox or the orphan sweep for what follows
            fail_after_the_stages(result, self.settings, "the process every child is forked from (the harness's template) died while this"
                                  " item ran: killed by the candidate? Its processes were stopped and the template started anew",
                                  "template_killed")
        return result

    def close(self) -> None:
        """End the kept children (the session is over), and whatever any child left running."""
        self.children.close()

    def _run_stages(self, ctx: ItemContext) -> None:
        result, processes = ctx.result, LocalProcesses(self.children, ctx)
        with contextlib.ExitStack() as stack:
            candidate, baseline = self._compile(ctx, stack)
            lease = stack.enter_context(self._lease(ctx))
            # --kcoral-timeout bounds the item's own work; waiting for the device is bounded by
            # --kcoral-lease-timeout, so an item queued behind a hung one keeps its full budget
            ctx.budget.extend(lease.wait_ms / 1000.0)
            # the candidate's process ends, or is paused to be kept, before the device is given
            # back: nothing it left running may overlap the next holder's measurements; then
            # the kept children it may have stopped run again (callbacks run last-in, first-out)
            stack.callback(self.children.resume_kept)
            passed: list[bool] = []  # set once the item's last command came back: the child may be kept
            stack.callback(lambda: self.children.keep_or_close(ctx.spec, candidate, bool(passed)))
            stack.callback(lambda: processes.settle_further(bool(passed)))
            if isinstance(baseline, Child):
                ctx.budget.hold(baseline)
            with timed_phase(result, "reference"):
                ref = self.references.reference(ctx, processes)
            ref.record_into(result)
            with timed_phase(result, "correctness"):
                check_correctness(ctx, candidate, ref, processes)
            if self.diagnostics and self.diagnostics.sanitizer:
                self._diagnose(ctx, ref, "sanitizer")
            result.correct = True
            if ctx.timed:
                with timed_phase(result, "timing"):
                    time_item(ctx, candidate, baseline, ref, processes, self.references, self._timing_cpu(lease))
                    if isinstance(baseline, Child):  # an untimed item (``stage_reference.untimed_reason``) needs none
                        case_call(ctx, processes, Finish(), "baseline", baseline)  # kept: its item's timing sets go
            if self.diagnostics and self.diagnostics.ncu:
                self._diagnose(ctx, ref, "ncu")
            # the last word: the child's audit runs once more, and a reply left over in the
            # channel (a forged one answered a command before the genuine one) shows here
            last_stage = "timing" if ctx.timed else "correctness"
            candidate_call(ctx, candidate, Finish(), "finish", last_stage)
            # the case's children imported it before the candidate ran; a candidate that wrote
            # into it meanwhile (no --kcoral-sandbox) fails here, not only the next child to start
            require_case_as_collected(ctx.spec.case, last_stage, "finish")
            passed.append(True)

    def _compile(self, ctx: ItemContext, stack: contextlib.ExitStack) -> tuple[Child, Child | StageFailed | None]:
        """The compile stage: the candidate's child, with the candidate loaded, and the case's
        baseline child (None in ``--kcoral-mode correctness``), or the case's failure to start it."""
        result = ctx.result
        candidate: Child | None = None
        hung = self.children.import_hung(ctx.spec)
        if hung is not None:
            self._record_baseline_only(ctx)
            raise hung
        starting = self.children.start_case_children(ctx)
        try:
            with timed_phase(result, "compile"):
                candidate = self.children.candidate(ctx, stack, reuse=True)
            stack.callback(_keep_output, candidate, result)
            # before any candidate code of the item runs (``LocalChildren.start_case_children``);
            # the case's work, not the item's: the item's deadline moves by the wait
            with ctx.budget.paused():
                baseline = starting.baseline()
            with timed_phase(result, "compile"):
                try:
                    candidate_call(ctx, candidate, load_candidate(ctx.spec), "import", "compile")
                except StageFailed as failure:
                    if candidate.timed_out and candidate.items_served == 1:  # a fresh process: the import itself hung
                        self.children.note_import_hang(ctx.spec, failure.message)
                    raise
        except StageFailed:
            starting.settle()
            self._record_baseline_only(ctx)
            raise
        finally:
            starting.settle()
            if candidate is not None:  # which process ran the candidate, its how-manieth item there
                result.extra.candidate_process = {"pid": candidate.pid, "item": candidate.items_served}
        result.compiled = True
        return candidate, baseline

    def _record_baseline_only(self, ctx: ItemContext) -> None:
        """Whether the baseline is correct on this shape, also when the candidate never compiled:
        conditional correctness and its quadrants count every item (usually a cache hit)."""
        # the case's own work gets its own budget: the candidate may have used up the item's
        own = dataclasses.replace(ctx, budget=Budget(self.settings.timeout_s))
        try:
            with self._lease(own) as lease:
                own.budget.extend(lease.wait_ms / 1000.0)
                ref = self.references.reference(own, LocalProcesses(self.children, own))
        except (StageFailed, ItemSkipped, ChildFailure):
            return  # the compile failure stays the item's verdict
        ref.record_into(ctx.result)

    @contextlib.contextmanager
    def _lease(self, ctx: ItemContext) -> Iterator[Any]:
        """Hold a device for the GPU stages; record which one, the wait and the hold."""
        result = ctx.result
        holding = self.lease_factory(ctx.spec.nodeid)
        try:
            lease = holding.__enter__()
        except LeaseError as exc:
            raise StageFailed("correctness", f"no device: {exc}", "lease") from None
        result.device = ctx.device = lease.device_name
        result.lease_wait_ms = lease.wait_ms
        try:
            yield lease
        finally:
            holding.__exit__(None, None, None)
            result.lease_held_ms = lease.held_ms
            if hasattr(lease, "to_dict"):
                result.extra.lease = lease.to_dict()  # absolute times, for the overlap audit

    def _timing_cpu(self, lease: Any) -> int | None:
        """The core both sides' timing runs on (``timing/pinning.py``), or None: chosen by the
        leased GPU's host-wide number, so sessions timing different GPUs never share a core."""
        device = getattr(lease, "device", None)
        return pinning.choose(device.timing_slot if isinstance(device, DeviceSpec) else None, self.settings.timing_cpu)

    def _diagnose(self, ctx: ItemContext, ref: ReferenceData, tool: str) -> None:
        """Run the candidate under compute-sanitizer or Nsight Compute (``diagnostics.py``), still
        under the lease. The tools have their own limit, so the item's deadline moves by the time
        the tool took, and the stages after them keep their budget."""
        assert self.diagnostics is not None
        spec, result = ctx.spec, ctx.result
        job = {"case": dict(self.children.case_spec(spec.case), device=ctx.device), "candidate": str(spec.candidate.path),
               "shape": spec.shape.params}
        with ctx.budget.paused(), timed_phase(result, tool):
            run = self.diagnostics.sanitize if tool == "sanitizer" else self.diagnostics.profile
            record = run(job, trial_inputs(ctx, ref, LocalProcesses(self.children, ctx), tool), spec.nodeid)
        result.extra.diagnostics = dict(result.extra.diagnostics or {}, **{tool: record})
        if record.get("failure"):  # only the sanitizer's verdict can fail an item
            raise StageFailed("correctness", record["failure"], tool)


def _keep_output(candidate: Child, result: ItemResult) -> None:
    """What the candidate's process printed during the item, into the item (the process may
    serve the candidate's next item too)."""
    result.output_tail = candidate.take_output_tail()
