"""Run step: what a failed call to a process means for the item, and the screen that says so.

- The candidate's process failing (``candidate_call``) is the candidate's failure, at the stage
  that called it: a compiler's error at its first call is still the compile stage's.
- A process without the candidate failing (``case_call``: the trusted child, the baseline's) is
  the case's failure, and the message says so.
- A grading service that stopped answering is nobody's (``ServiceUnavailable``).
- Code that needs CUDA on a machine without a GPU skips instead of failing.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kcoral.context import ItemContext, ItemSkipped, ServiceUnavailable, StageFailed
from pytest_kcoral.isolation import ChildFailure
from pytest_kcoral.messages import Command, R
from pytest_kcoral.results import CASE_FAILED_PREFIX
from pytest_kcoral.transport import Processes, Transport

# The stage a crash or a timeout in each phase belongs to, where a reply can be read after later
# stages ran (``Plan.stage_by_phase``: a KCoral program's replies are replayed in stage order).
STAGE_OF_PHASE = {"startup": "compile", "import": "compile", "correctness": "correctness", "timing": "timing"}
# Phases of the case's processes that belong to the timing stage; the others to correctness.
CASE_TIMING_PHASES = ("baseline", "cost", "verify", "feed")
TRACEBACK_LINES = 16  # of the candidate's and the case's frames
OUTPUT_LINES = 12  # of what the process printed last
SCREEN_LINES = 12  # problems listed before "... and N more"


def candidate_call(ctx: ItemContext, process: Transport, command: Command[R], phase: str, stage: str,
                   reply_limit_bytes: int | None = None, fds: Sequence[int] = ()) -> R:
    """``command``'s reply from the candidate's process; its failure fails ``stage``."""
    try:
        return process.call(command, phase, reply_limit_bytes, fds)
    except ChildFailure as failure:
        raise candidate_failure(ctx, stage, failure) from None


def candidate_failure(ctx: ItemContext, stage: str, failure: ChildFailure) -> Exception:
    """The item's failure for the candidate's process failing in ``stage``."""
    if ctx.plan.stage_by_phase and failure.kind in ("crash", "timeout") and failure.phase in STAGE_OF_PHASE:
        stage = STAGE_OF_PHASE[failure.phase]
    if failure.kind == "outage":
        return ServiceUnavailable(stage, failure.message)
    # the candidate's commands; a KernelBench ModelNew is built from the case's get_init_inputs there too
    # named: ``-rs`` groups skips by the case file's location and the reason
    skipped = needs_cuda(ctx, failure, f"the candidate's process ({ctx.spec.candidate.path.name})")
    if skipped is not None:
        return skipped
    # a compiler error at the first call is the compile stage's; once the candidate has run
    # (timing comes after correctness), it is a failure to run the timed calls
    if failure.kind == "error" and failure.error.compile_error and stage != "timing":
        stage = "compile"
    # a candidate that raises, crashes or lies once timed is not correct; one that runs out of time may be
    return StageFailed(stage, describe_child_failure(failure), failure.phase, disqualifies=stage == "timing" and failure.kind != "timeout")


def case_call(ctx: ItemContext, processes: Processes, command: Command[R], phase: str, process: Transport | None = None,
              fds: Sequence[int] = ()) -> R:
    """``command``'s reply from a process of the case (``process``, or the trusted one): its
    failure is the case's, not the candidate's, and the process is never used again."""
    try:
        if process is None:
            process = processes.trusted()  # starting it can fail too (a case that crashes or hangs at import)
        return process.call(command, phase, None, fds)
    except ChildFailure as failure:
        if process is not None:
            processes.forget(process)
        raise case_failure(ctx, failure, phase) from None


def case_failure(ctx: ItemContext, failure: ChildFailure, phase: str) -> Exception:
    """The item's failure for a process of the case failing in ``phase``."""
    stage = "timing" if phase in CASE_TIMING_PHASES else "correctness"
    if failure.kind == "outage":
        return ServiceUnavailable(stage, failure.message)
    skipped = needs_cuda(ctx, failure)
    if skipped is not None:
        return skipped
    return StageFailed(stage, CASE_FAILED_PREFIX + describe_child_failure(failure), phase, case_failed=True)


def needs_cuda(ctx: ItemContext, failure: ChildFailure, who: str = "the case") -> ItemSkipped | None:
    """On a machine without a GPU, code that needs CUDA skips instead of failing: the case's (its
    inputs), or what runs in the candidate's process (``who``)."""
    if failure.kind == "error" and failure.error.needs_cuda and ctx.device_kind == "cpu":
        return ItemSkipped(f"{who} needs CUDA: {failure.message}")
    return None


# Known failures whose message does not say what to do: (text in the message, the hint)
HINTS = (
    ("0 active drivers", "Triton found no GPU driver: without a GPU, Triton kernels run in its interpreter, which"
                         " cannot run @triton.autotune (its benchmarking needs a GPU); grade autotuned kernels on a GPU"),
    ("CUDA out of memory", "each of the grader's processes holds the shape's data on the device at once: the trusted child a"
                           " trial's inputs and the reference's outputs (every trial's while they take at most an eighth of the"
                           " device), and the candidate's and the baseline's processes their own inputs and outputs. For tensors"
                           " of several GB, grade with fewer trials (--kcoral-trials 1) or on a GPU with more memory"),
)


def describe_child_failure(failure: ChildFailure) -> str:
    """One screen: the message, a hint where one is known, the traceback's last frames, the output's last lines."""
    lines = [f"{failure.message}"]
    lines += [f"hint: {hint}" for text, hint in HINTS if text in failure.message]
    tb = failure.error.traceback
    if failure.kind == "error" and tb:
        lines += ["", "traceback (candidate and case frames):", *("  " + ln for ln in tb.rstrip().splitlines()[-TRACEBACK_LINES:])]
    output = failure.output.strip()
    if output:
        out_lines = output.splitlines()[-OUTPUT_LINES:]
        lines += ["", "child output (last lines):", *("  " + ln for ln in out_lines)]
    return "\n".join(lines)


def one_screen(lines: list[str], limit: int = SCREEN_LINES) -> str:
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
    return "\n".join(lines)
