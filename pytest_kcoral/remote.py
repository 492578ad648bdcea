"""Run step, on a KCoral service (``--kcoral-url``): ``RemoteExecutor`` runs an item's stages over
KCoral programs (``kcoral_programs.py``).

Per item: a *trusted* program makes the inputs and runs the reference (cached, as locally); one
*candidate* program imports the candidate and runs correctness, timing and the last audit; in
full mode, a *baseline* program goes the candidate program's way with the baseline and times it,
and trusted programs give the case's cost and recompute the reference for the timed outputs the
candidate sent back. The candidate never shares a process with the reference or the baseline.

The stages are the local ones (``stage_reference``, ``stage_correctness``, ``stage_timing``),
under the ``context.REMOTE`` plan: one timing round a side, one pair of programs, the candidate's
first, no local lease and no timing core. So the messages, the JSON and the scores are the same.
The candidate program runs its stages in one go (a fresh worker per stage would import it again);
its replies are replayed in stage order, so an item still ends at the first stage that fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from pytest_kcoral.cases import Case
from pytest_kcoral.children import case_spec, child_env
from pytest_kcoral.context import REMOTE, Budget, ItemContext, ItemSpec, StageFailed, timed_phase
from pytest_kcoral.failures import candidate_call, candidate_failure, case_call, case_failure
from pytest_kcoral.grading import grade, new_result
from pytest_kcoral.isolation import ChildFailure
from pytest_kcoral.kcoral_programs import Programs, ReplayedChild, device_kind_of, health_of, server_info
from pytest_kcoral.messages import Command, Finish, LoadBaseline, LoadCandidate, R
from pytest_kcoral.options import Settings
from pytest_kcoral.results import ItemResult
from pytest_kcoral.stage_correctness import check_correctness
from pytest_kcoral.stage_reference import ReferenceCache, ReferenceData, correctness_run, untimed_reason
from pytest_kcoral.stage_timing import time_command, time_item
from pytest_kcoral.transport import Transport


class RemoteExecutor:
    def __init__(self, settings: Settings, url: str) -> None:
        self.settings = settings
        self.url = url
        self.programs = Programs(settings, url)
        self.device_kind = device_kind_of(self.programs.health)
        self.worker_device = "cuda:0" if self.device_kind == "cuda" else "cpu"  # a worker sees its own GPU(s) only
        self.server = server_info(url, self.programs.health)
        self.references = ReferenceCache()
        self.env = child_env(settings, self.device_kind, None)

    def start_template(self) -> None:
        """Nothing to start: every program gets a fresh worker from the service."""

    def close(self) -> None:
        self.programs.close()

    def run(self, spec: ItemSpec) -> ItemResult:
        self.programs.sent = []
        # who serves this item: a server restarted since the last item is another instance
        fresh = health_of(self.url)
        if fresh is not None and fresh[0] == 200:
            self.server = server_info(self.url, fresh[1])
        result = new_result(spec)
        grade(spec, result, self.settings, REMOTE, self.device_kind, self._run_stages)
        if result.message:
            result.message = local_paths(result.message, spec)
        sent = self.programs.sent
        if result.outcome != "skipped" or sent:
            result.extra.remote = dict(self.server, programs=sent)
            if sent:
                result.lease_wait_ms = sum(p["lease_wait_ms"] for p in sent)
                result.lease_held_ms = sum(p["lease_held_ms"] for p in sent)
        return result

    def _run_stages(self, ctx: ItemContext) -> None:
        result, processes = ctx.result, RemoteProcesses(self, ctx)
        ctx.device = self.worker_device
        result.device = f"{ctx.device}@{self.url}"
        # the inputs come from the trusted side first: the candidate's program carries them
        with timed_phase(result, "reference"):
            try:
                ref = self.references.reference(ctx, processes)
            except StageFailed as failure:
                if failure.case_failed:
                    # a local run compiles first: learn what it would have, so the item reads the same
                    result.compiled = self._compiles(ctx)
                raise
        # known before the candidate runs, so a compile failure still counts in the quadrants
        ref.record_into(result)
        # the candidate's whole program runs here; the phases below only replay its replies
        with timed_phase(result, "compile"):
            load, files = candidate_upload(ctx.spec)
            candidate = self._program(ctx, "candidate", self._side_commands(ctx, ref, (load, "import"), ("correctness", "timing"))
                                      + [(Finish(), "finish")], files)
            result.output_tail = candidate.take_output_tail()
            started(ctx, candidate)
            candidate_call(ctx, candidate, load, "import", "compile")
        result.compiled = True
        with timed_phase(result, "correctness"):
            check_correctness(ctx, candidate, ref, processes)
        result.correct = True
        if ctx.timed:
            with timed_phase(result, "timing"):
                baseline = self._baseline_program(ctx, ref) if self._timed(ctx, ref) else None
                if baseline is not None:
                    try:
                        baseline.start("baseline")
                    except ChildFailure as failure:
                        raise case_failure(ctx, failure, "baseline") from None
                    case_call(ctx, processes, LoadBaseline(), "baseline", baseline)
                time_item(ctx, candidate, baseline, ref, processes, self.references, None)
        candidate_call(ctx, candidate, Finish(), "finish", "timing" if ctx.timed else "correctness")

    def _timed(self, ctx: ItemContext, ref: ReferenceData) -> bool:
        """Whether the item reaches timing once correct (``stage_reference.untimed_reason``): a
        program's commands are fixed before it is sent, so an untimed item's carry no timing."""
        return ctx.timed and untimed_reason(ctx.spec, ref) is None

    def _compiles(self, ctx: ItemContext) -> bool:
        """Whether the candidate imports (a program of its own, run only when the case failed
        before the candidate's program could be built). A candidate that does not compile fails
        its item at compile, as it would locally, ahead of the case's failure."""
        # its own budget, as a local compile has: the case's failure (a hung reference) may have
        # used up the item's
        own = dataclasses.replace(ctx, budget=Budget(self.settings.timeout_s))
        load, files = candidate_upload(ctx.spec)
        program = self._program(own, "candidate", [(load, "import"), (Finish(), "finish")], files)
        try:
            program.start("startup")
        except ChildFailure:
            return False  # the case fails in the candidate's process too: the case's failure stands
        candidate_call(own, program, load, "import", "compile")
        return True

    def _baseline_program(self, ctx: ItemContext, ref: ReferenceData) -> ReplayedChild:
        """The baseline's timing: a program that goes the candidate's program's way, with the
        baseline in the candidate's place (``children.LocalChildren.baseline`` says why)."""
        return self._program(ctx, "baseline", self._side_commands(ctx, ref, (LoadBaseline(), "baseline"), ("baseline", "baseline"),
                                                                  send_kept=False))

    def _side_commands(self, ctx: ItemContext, ref: ReferenceData, load: tuple[Command[Any], str], phases: tuple[str, str],
                       send_kept: bool = True) -> list[tuple[Command[Any], str]]:
        """One side's load, correctness run and (unless ``--kcoral-mode correctness``) timing: a
        program's commands are fixed before it is sent, so both sides' are built here alike."""
        commands: list[tuple[Command[Any], str]] = [load, (correctness_run(ctx, ref), phases[0])]
        if self._timed(ctx, ref):
            commands.append((dataclasses.replace(time_command(ctx, ref), send_kept=send_kept), phases[1]))
        return commands

    def _program(self, ctx: ItemContext, role: str, commands: list[tuple[Command[Any], str]],
                 extra_files: dict[str, bytes] | None = None) -> ReplayedChild:
        """One program for the item's case, sent and done: its replies."""
        case = ctx.spec.case
        return self.programs.execute(role, case, remote_case_spec(case, self.settings, self.device_kind), self.env, commands,
                                     ctx.budget, extra_files)


class RemoteProcesses:
    """``transport.Processes`` for one item on a KCoral service: each trusted call is a program."""

    def __init__(self, executor: RemoteExecutor, ctx: ItemContext) -> None:
        self.executor = executor
        self.ctx = ctx

    def trusted(self) -> Transport:
        return RemoteTrusted(self.executor, self.ctx)

    def kept_trusted(self) -> Transport | None:
        return None  # each trusted call is a program of its own

    def forget(self, process: Transport) -> None:
        process.close()  # each program had a worker of its own, gone with it

    def further_candidate(self, index: int) -> contextlib.AbstractContextManager[Transport]:
        raise NotImplementedError("one pair of programs per item (context.REMOTE)")

    def further_baseline(self, index: int) -> contextlib.AbstractContextManager[Transport]:
        raise NotImplementedError("one pair of programs per item (context.REMOTE)")


class RemoteTrusted:
    """The trusted side of one item, as a local trusted child is driven: one program per call."""

    last_call_s = 0.0

    def __init__(self, executor: RemoteExecutor, ctx: ItemContext) -> None:
        self.executor = executor
        self.ctx = ctx

    def call(self, command: Command[R], phase: str, reply_limit_bytes: int | None = None, fds: Sequence[int] = ()) -> R:
        if fds:
            raise ValueError("a KCoral program takes no file descriptors: a feed is for local children")
        replay = self.executor._program(self.ctx, "trusted", [(command, phase)])
        replay.start("startup")
        return replay.call(command, phase)

    def close(self) -> None:
        pass  # each program had a worker of its own, gone with it


def started(ctx: ItemContext, candidate: ReplayedChild) -> None:
    """The candidate program's runner was built: its failure is the compile stage's."""
    try:
        candidate.start("startup")
    except ChildFailure as failure:
        raise candidate_failure(ctx, "compile", failure) from None


def remote_case_spec(case: Case, settings: Settings, device_kind: str) -> dict[str, Any]:
    """``children.case_spec`` with paths relative to the program's workspace, where
    ``kcoral_programs.case_files`` puts the case's files."""
    spec = case_spec(case, settings, device_kind, None)
    spec["source"] = f"case/{case.source.name}"
    spec["helper_files"] = {}  # uploaded beside the case's files
    if case.baseline_file:
        spec["baseline_file"] = f"case/{case.baseline_file.name}"
    return spec


def candidate_upload(spec: ItemSpec) -> tuple[LoadCandidate, dict[str, bytes]]:
    """A candidate program's ``load_candidate`` command and the candidate file it imports."""
    path = f"candidate/{spec.candidate.path.name}"
    return LoadCandidate(path=path, shape=spec.shape.params), {path: spec.candidate.path.read_bytes()}


def local_paths(text: str, spec: ItemSpec) -> str:
    """``text`` (a failure's traceback) with the program workspace's files named by their paths
    here: ``<workspace>/candidate/x.py`` is the candidate's file, ``<workspace>/case/y.py`` the
    case's (``candidate_upload``, ``kcoral_programs.case_files``)."""
    case = spec.case
    here = {f"candidate/{spec.candidate.path.name}": spec.candidate.path, f"case/{case.source.name}": case.source,
            **{f"case/{name}": path for name, path in case.helper_files.items()}}
    if case.baseline_file:
        here[f"case/{case.baseline_file.name}"] = case.baseline_file

    def local(found: re.Match[str]) -> str:
        path = here.get(found[2]) or (case.folder / found[2][len("case/"):] if found[2].startswith("case/") else None)
        return f'File "{path}"' if path is not None else found[0]

    return re.sub(r'File "([^"]*/)?((?:candidate|case)/[^"/]+)"', local, text)
