"""Run step, correctness: the candidate's outputs on the reference's inputs, judged by the rules of
SPEC section 3 (``correctness.py``) or by the case's own checker (``checker.py``), never in a
process the candidate ran in.

- On this host the case's trusted child feeds each trial's inputs into the candidate's process and
  judges the outputs there (``child_judges.TrialCalls``); this module words its verdict.
- In a KCoral program the candidate's process runs each trial on device copies of the inputs sent,
  and sends outputs and the inputs it changed; they are judged here.

Either way the candidate's process checks its outputs for plain dense tensors on the device that
alias no input (after NaN-poisoning the allocator). Everything it reports is checked for shape
here first: a forged report fails the item, never this process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pytest_kcoral import checker, correctness
from pytest_kcoral.cases import KERNELBENCH, Case
from pytest_kcoral.context import ItemContext, StageFailed
from pytest_kcoral.failures import candidate_call, case_call, one_screen
from pytest_kcoral.feeding import attach_feed, feed_report
from pytest_kcoral.messages import Check, CheckReply, RunReply
from pytest_kcoral.results import CASE_FAILED_PREFIX
from pytest_kcoral.stage_reference import ReferenceData, correctness_run, reply_limit
from pytest_kcoral.transport import Processes, Transport


@dataclass
class TrialVerdict:
    """The correctness trials' verdict: per trial what is wrong (prefixed ``trial t of n``), and
    what the trials tell together."""

    problems: list[str]
    same_kinds: bool = True
    ignores_inputs: bool = False
    constant: str | None = None
    parameters_differ: bool | None = None


def check_correctness(ctx: ItemContext, candidate: Transport, ref: ReferenceData, processes: Processes) -> None:
    """Run the candidate on every trial's inputs; ``StageFailed`` at correctness with one screen
    of what is wrong."""
    verdict = run_and_judge(ctx, candidate, "candidate", ref, processes)
    problems = verdict.problems
    if ctx.spec.case.format == KERNELBENCH and verdict.parameters_differ is True and mostly_wrong(problems, len(ref.seeds)):
        # ModelNew's child found its weights differ from Model's: it draws them in another
        # order or shape (where they match, the kernel itself is wrong, and the hint would mislead)
        problems.append("hint: most elements differ in every trial: ModelNew's parameters are made under the same seed"
                        " as Model's, so they match only when ModelNew creates the same parameters, in the same order and shapes")
    # what explains wrong values goes first; after a wrong kind of output (an int where the
    # reference returns a tensor) it is a footnote
    first = 0 if verdict.same_kinds else len(problems)
    if verdict.ignores_inputs:
        problems.insert(first, "the output does not depend on the inputs: every input set gave the same output, the reference's differ")
    if verdict.constant:
        weak = " (this case is weak: zeros or a constant match its reference within tolerance)" if ref.weak else ""
        problems.insert(first, verdict.constant + weak)
    if problems:
        raise StageFailed("correctness", one_screen(problems), "correctness")


def run_and_judge(ctx: ItemContext, side: Transport, peer: str, ref: ReferenceData, processes: Processes) -> TrialVerdict:
    """``side`` (the candidate's process, or the baseline's) run on every trial, and judged: by the
    trusted child, which feeds the trials it kept (``feeding``), or here, on the outputs the
    side sends back (a KCoral program)."""
    run = correctness_run(ctx, ref)
    stage = "correctness" if peer == "candidate" else "timing"

    def call() -> RunReply:
        if peer == "candidate":
            return candidate_call(ctx, side, run, "correctness", "correctness", reply_limit(ref, len(ref.seeds)))
        return case_call(ctx, processes, run, "baseline", side)

    if not ref.kept:
        reply = call()
        outputs = reply.payload.outputs
        if peer != "candidate":  # the case's own code: its outputs against the reference's, no more
            return TrialVerdict(run_problems(reply, ref, ctx.tolerance))
        together = correctness.TrialsTogether.of(outputs, ref.reference)
        return TrialVerdict(trial_problems(ctx, reply, ref, processes), together.same_kinds, together.ignores_inputs, together.constant,
                            reply.parameters_differ)
    attach_feed(ctx, processes, ref, peer, side, stage, trials=True)
    try:
        reply = call()
    except StageFailed as failure:
        if not failure.case_failed:
            feed_report(ctx, processes, peer, stage, after_failure=True)  # raises the case's failure, if feeding found one
        raise
    judged = feed_report(ctx, processes, peer, stage)
    trials = len(ref.seeds)
    if len(reply.findings) != trials or len(judged.trials) != trials:
        raise StageFailed(stage, f"the {peer}'s child reported {len(reply.findings)} trials, the trusted child fed {trials}"
                          " (results forged?)", "correctness" if peer == "candidate" else "baseline", case_failed=peer != "candidate")
    problems = [f"trial {t + 1} of {trials}: {p}" for t in range(trials) for p in (reply.findings[t] or judged.trials[t])]
    problems += [f"the feed of trials broke: {r.closed}" for r in judged.rounds if r.closed]
    return TrialVerdict(problems, judged.same_kinds, judged.ignores_inputs, judged.constant or None, reply.parameters_differ)


def trial_problems(ctx: ItemContext, reply: RunReply, ref: ReferenceData, processes: Processes) -> list[str]:
    """Per trial, what the candidate's ``run`` reply gets wrong: the child's findings, the
    outputs' structure, their values (or the case's checker's verdict), inputs it should not have
    changed. ``StageFailed`` when the reply itself cannot be read (results forged?)."""
    outputs, written = reply.payload.outputs, reply.payload.written
    trials = len(ref.inputs)
    if not well_formed_written(written, outputs, len(ref.written_inputs)):
        raise StageFailed("correctness", f"the candidate's child returned unreadable in-place results {str(written)[:200]} (results forged?)",
                          "correctness")
    changed = reply.inputs_changed
    if not well_formed_changes(changed, trials):
        raise StageFailed("correctness", f"the candidate's child reported unreadable input changes {str(changed)[:200]} (results forged?)",
                          "correctness")
    structures = reply.structures
    if not well_formed_structures(structures, outputs, trials):
        raise StageFailed("correctness", f"the candidate's child reported an unreadable output structure {str(structures)[:200]}"
                          " (results forged?)", "correctness")
    judged = None  # the case's own checker's verdicts (GPU MODE), asked of the trusted child
    if ctx.spec.case.checker:
        judge = [None if reply.findings[t] or correctness.compare_structure(structures[t], ref.structure) else out
                 for t, out in enumerate(outputs)]

        def ask(command: Check, phase: str) -> CheckReply:
            return case_call(ctx, processes, command, phase)

        judged = checker.trial_problems(ask, ctx.spec.shape.params, ctx.device, ref.seeds, judge, structures, ref.reference)
    problems: list[str] = []
    for t in range(trials):
        trial = [*reply.findings[t]]
        if not trial:
            trial += correctness.compare_structure(structures[t], ref.structure)
        if not trial:
            trial += judged[t] if judged is not None else compare_trial(ref, t, outputs[t], written[t], ctx.tolerance)
        trial += correctness.describe_changed_inputs(changed[t], may_write(ctx.spec.case, reply, t))
        problems += [f"trial {t + 1} of {trials}: {p}" for p in trial]
    return problems


def baseline_goes_the_candidates_way(ctx: ItemContext, baseline: Transport, ref: ReferenceData, processes: Processes) -> None:
    """The baseline's process gets the correctness stage's run, as sent to the candidate, before
    it is timed: both sides come to their timing with the same history."""
    verdict = run_and_judge(ctx, baseline, "baseline", ref, processes)
    if ref.baseline_correct is not False and verdict.problems:  # a baseline found wrong is recorded, and timed all the same
        raise StageFailed("timing", CASE_FAILED_PREFIX + "its baseline, run on the correctness inputs in the process that times it,"
                          " disagrees with the reference where its check agreed (does it keep state across calls or items?): "
                          + one_screen(verdict.problems), "baseline", case_failed=True)


def may_write(case: Case, reply: RunReply, trial: int) -> tuple[int, ...]:
    """The inputs a candidate's call may change in a trial: ``INPLACE``'s, and, where a case's data
    carries output buffers (GPU MODE), the inputs the call returned as outputs (``c[...] = a @ b;
    return c``). Any other input must come back unchanged."""
    if not case.output_buffers_in_inputs:
        return case.inplace
    returned = reply.output_aliases[trial] if trial < len(reply.output_aliases) else []
    return (*case.inplace, *(pair[1] for pair in returned if len(pair) == 2))


def run_problems(reply: RunReply, ref: ReferenceData, tol: correctness.Tolerance) -> list[str]:
    """What a ``run`` reply (outputs, in-place results, findings) gets wrong against the reference, per trial."""
    outputs, written, findings = reply.payload.outputs, reply.payload.written or [], reply.findings
    problems: list[str] = []
    for t in range(len(ref.inputs)):
        trial = list(findings[t]) if t < len(findings) else []
        if not trial:
            trial += compare_trial(ref, t, outputs[t], written[t] if t < len(written) else None, tol)
        problems += [f"trial {t + 1} of {len(ref.inputs)}: {p}" for p in trial]
    return problems


def compare_trial(ref: ReferenceData, t: int, outputs: Any, written: Any, tol: correctness.Tolerance) -> list[str]:
    """One trial's outputs and in-place results against the reference's."""
    return (correctness.compare_outputs(outputs, ref.reference[t], tol)
            + correctness.compare_outputs(written, ref.written[t], tol, correctness.written_input_names(ref.written_inputs)))


def mostly_wrong(problems: list[str], trials: int) -> bool:
    """Whether every trial has an output with over half of its elements out of tolerance."""
    shares: dict[str, float] = {}
    for line in problems:
        found = re.match(r"trial (\d+) of \d+: .* elements \(([\d.]+)%\) outside", line)
        if found:
            shares[found[1]] = max(shares.get(found[1], 0.0), float(found[2]))
    return len(shares) == trials and all(share > 50 for share in shares.values())


def well_formed_changes(changes: Any, trials: int) -> bool:
    """``[[input index, bytes or None], ...]`` per trial, as ``correctness.changed_inputs`` makes them."""
    def entry_ok(e: Any) -> bool:
        return (isinstance(e, list) and len(e) == 2 and type(e[0]) is int
                and (e[1] is None or type(e[1]) is int))
    return isinstance(changes, list) and len(changes) == trials and all(isinstance(c, list) and all(entry_ok(e) for e in c) for c in changes)


def well_formed_written(written: Any, outputs: list[Any], count: int) -> bool:
    """Per trial, the written INPLACE inputs' values (``count`` of them), or None where the
    trial's outputs did not come back either."""
    return (isinstance(written, list) and len(written) == len(outputs)
            and all((w is None) == (o is None) and (w is None or (isinstance(w, (list, tuple)) and len(w) == count))
                    for w, o in zip(written, outputs)))


def well_formed_structures(structures: Any, outputs: list[Any], trials: int) -> bool:
    """One structure per trial, each of the kind ``child_outputs.flatten_outputs`` makes and
    holding as many values as came back (none come back from a trial with findings)."""
    if not (isinstance(structures, list) and len(structures) == trials):
        return False
    for structure, values in zip(structures, outputs):
        leaves = correctness.structure_leaves(structure)
        if leaves is None or (values is not None and (not isinstance(values, (list, tuple)) or leaves != len(values))):
            return False
    return True
