"""Run step, timing: the baseline and the candidate timed in turns, in pairs of processes, then the
gates that can still fail a correct item (timed outputs checked, the physical floor, the
minimum speedup).

- ``time_item``: the stage, from the baseline's correctness run to the last gate.
- ``time_pair``: one pair of processes' rounds, taken in turns, until the rounds are precise
  enough (``--kcoral-precision``) or the rounds run out.
- Further pairs of processes for an item the host's speed sets (``process_pairs_for``), kept
  by pair across the case's items.
- The figures come from ``combine.py``; how sure the speedup is from ``speedup_interval.py``.

The plan (``context.Plan``) says how many rounds and pairs a transport can take, and which side
goes first.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import math
import os
import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pytest_kcoral import checker, combine, correctness, speed_of_light, speedup_interval
from pytest_kcoral.context import ItemContext, StageFailed, timed_phase
from pytest_kcoral.failures import candidate_call, case_call, one_screen
from pytest_kcoral.feeding import attach_feed, feed_report
from pytest_kcoral.messages import (
    Check,
    CheckReply,
    FeedRound,
    Finish,
    Reference,
    Time,
    TimedOutput,
)
from pytest_kcoral.options import AUTO_PROCESS_PAIRS
from pytest_kcoral.results import CASE_FAILED_PREFIX, TimingStats
from pytest_kcoral.stage_correctness import baseline_goes_the_candidates_way, check_correctness
from pytest_kcoral.stage_reference import ReferenceCache, ReferenceData, item_bytes, reply_limit, untimed_reason
from pytest_kcoral.timing.per_call import CPU_ABOVE_WALL_FLAG
from pytest_kcoral.timing_flags import Flag, flag, has
from pytest_kcoral.transport import Processes, Transport

T = TypeVar("T")

# Timed outputs checked against the reference. A candidate must skip its work on half of its timed
# calls or more to move a median, so each check catches it with even odds at least: k checks let it
# pass with chance 2**-k at most. Each check recomputes the reference, so large items get fewer.
MIN_VERIFIED_TIMED_CALLS = 2
MAX_VERIFIED_TIMED_CALLS = 8
VERIFY_BYTES = 64 << 20  # inputs and results checked per item, up to MAX_VERIFIED_TIMED_CALLS
TIMING_INPUT_SETS = 3
# Per side, interleaved (``time_pair``). Short rounds: one process's speed changes within a second
# or so, and a pair of rounds it slowed is left out (``combine.undisturbed_pairs``); with more
# pairs, more of them are left undisturbed.
TIMING_ROUNDS = 8
WARMUP_S = 0.05  # warm-up by time before the first round; later rounds follow a warm call
# On a GPU, shorter still: a launch-bound chain runs at the host's speed, which changes within tens
# of milliseconds, and rounds of about 30 ms taken in turns see the same speed on both sides
# (docs/performance.md, "shorter rounds on a GPU"). Without the trusted feed (a KCoral program's own
# sets) a round refreshes its inputs through the case's make_inputs in the child and sends a kept
# timed output back, so items whose inputs and results are large keep ``TIMING_ROUNDS`` there:
# many such rounds cost more than they settle. Fed, inputs are made on the device, and every item
# takes short rounds.
GPU_ROUND_S = 1 / 32
GPU_MAX_ROUNDS = 32
GPU_SHORT_ROUNDS_MAX_BYTES = 1 << 20
# Fewest pairs of rounds before timing may stop at the precision target: a distribution-free 95%
# interval of a median needs six values (their extremes, 96.9%).
MIN_ROUND_PAIRS = 6
# Most pairs of rounds in each pair of processes when an item is timed in several: a pair of
# processes reads its own speedup, off by up to 2% for identical code (docs/performance.md), which
# more rounds in it do not move; the median pair's settles the item.
SEVERAL_PAIRS_ROUND_PAIRS = 8
# The harness's own timing budget per callable when --kcoral-timing-budget is not given.
DEFAULT_BUDGET_S = {"cpu": 0.2, "cuda": 1.0}


def timing_rounds(device_kind: str, item_bytes: int, budget_s: float, fed: bool = True) -> int:
    """Rounds a side for an item on ``device_kind`` whose inputs and results (outputs and in-place
    results) for one input set take ``item_bytes``, timed for ``budget_s`` a side: on a GPU, rounds
    of ``GPU_ROUND_S`` (no fewer than ``TIMING_ROUNDS``, no more than ``GPU_MAX_ROUNDS``), for
    every item when ``fed``, else for small ones only."""
    if device_kind == "cpu" or (not fed and item_bytes > GPU_SHORT_ROUNDS_MAX_BYTES):
        return TIMING_ROUNDS
    return max(TIMING_ROUNDS, min(GPU_MAX_ROUNDS, round(budget_s / GPU_ROUND_S)))


def time_item(ctx: ItemContext, candidate: Transport, baseline: Transport | StageFailed | None, ref: ReferenceData,
              processes: Processes, references: ReferenceCache, cpu: int | None) -> None:
    """The timing stage: figures and speedup into ``ctx.result``, or ``StageFailed``. ``baseline``
    is the case's failure to start one, raised only now (compile and correctness come first);
    ``cpu``: the core the timing threads pin themselves to."""
    result = ctx.result
    untimed = untimed_reason(ctx.spec, ref)
    if untimed:
        result.extra.untimed = untimed
        return
    if isinstance(baseline, StageFailed):
        raise baseline
    assert baseline is not None, "timing needs the baseline's process (None only in --kcoral-mode correctness and untimed items)"
    baseline_goes_the_candidates_way(ctx, baseline, ref, processes)
    # Both sides run one harness with one set of fields: the baseline's child keeps timed
    # outputs as the candidate's does, then drops them, since keeping them allocates between
    # timed calls and a small kernel's time follows where its outputs land.
    timed_alike = dataclasses.replace(time_command(ctx, ref), cpu=cpu)
    first_sides = first_sides_of(ctx)
    pairs = [timed_pair(ctx, candidate, baseline, ref, processes, timed_alike, next(first_sides), several=asked_pairs(ctx) > 1)]
    # A launch-bound chain runs at the speed of the process it runs in, and a process can sit at a
    # slower level than another's for seconds (docs/performance.md, "host-set items in three pairs
    # of processes"): an item the host's speed sets is timed again in further pairs of processes, and
    # the median pair's figures are its own (``combine.median_pair``).
    while len(pairs) < process_pairs_for(ctx, pairs):
        pairs.append(time_in_further_processes(ctx, ref, processes, timed_alike, next(first_sides), len(pairs)))
    floor, cost = references.floor_and_cost(ctx, processes)
    baseline_stats, candidate_stats = record_figures(ctx, pairs, ref)
    # the trusted child sent the case's cost already validated (``speed_of_light.valid_cost``)
    result.speed_of_light = speed_of_light.report(cost, (floor or {}).get("spec_bytes_per_s"), result.t_baseline_us, result.t_candidate_us)
    if not timed_alike.fed:  # the trusted child judged every fed call's outputs already (``judge_feeds``)
        checked = timed_outputs_to_check([r for pair in pairs for r in pair.candidate], [v for pair in pairs for v in pair.verify],
                                         combine.kept_rounds(pairs, "candidate"), random.Random(ctx.seed(ctx.spec.nodeid, "verify")),
                                         verified_timed_calls(item_bytes(ref)))
        with timed_phase(result, "verify"):
            verify_timed_outputs(ctx, checked, ref, processes)
    check_floor(ctx, floor, baseline_stats, candidate_stats)
    check_min_speedup(ctx, baseline_stats)


def record_figures(ctx: ItemContext, pairs: list[combine.ProcessPair], ref: ReferenceData) -> tuple[TimingStats, TimingStats]:
    """Each side's figures from the pairs of processes (``combine``), the speedup and its interval,
    into the item's record."""
    result = ctx.result
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
    if ctx.settings.precision is not None:
        taken = ", ".join(str(len(p.candidate)) for p in pairs)
        candidate_stats.flags.append(flag(Flag.PRECISION_TARGET, f"{ctx.settings.precision:.2%}",
                                          f"pairs of rounds taken per pair of processes {taken} of at most {rounds_of(ctx, ref)}"))
    result.baseline_timing = baseline_stats.to_dict()
    result.candidate_timing = candidate_stats.to_dict()
    result.t_baseline_us = baseline_stats.median_us
    result.t_candidate_us = candidate_stats.median_us
    result.timer = candidate_stats.method
    result.speedup = combine.item_speedup(pairs, baseline_stats, candidate_stats)
    speedup_interval.record_interval(result, pairs, candidate_stats, ctx.spec.candidate.path, ctx.device_kind)
    return baseline_stats, candidate_stats


def timed_pair(ctx: ItemContext, candidate: Transport, baseline: Transport, ref: ReferenceData, processes: Processes,
               timed_alike: Time, first: str, several: bool = False) -> combine.ProcessPair:
    """``time_pair``, and under a plan with a feed (``feed.py``) the trusted child feeding both
    sides for it: attached before the first round, its verdict on every timed call judged after
    the last (``judge_feeds``). When a side fails meanwhile, a failure of the case's while feeding
    it comes first: the side only saw its feed break. ``several``: as ``time_pair``'s."""
    if not timed_alike.fed:
        return time_pair(ctx, candidate, baseline, ref, processes, timed_alike, first, several)
    sides = {"candidate": candidate, "baseline": baseline}
    for peer, side in sides.items():
        attach_feed(ctx, processes, ref, peer, side, "timing")
    try:
        pair = time_pair(ctx, candidate, baseline, ref, processes, timed_alike, first, several)
    except StageFailed as failure:
        if not failure.case_failed:
            feed_reports(ctx, processes, after_failure=True)  # raises the case's failure, if feeding found one
        raise
    with timed_phase(ctx.result, "verify"):
        try:
            judge_feeds(ctx, pair, feed_reports(ctx, processes))
        except StageFailed as failure:
            if failure.case_failed:  # a baseline that answers by its state: never timed again
                processes.forget(baseline)
            raise
    return pair


def feed_reports(ctx: ItemContext, processes: Processes, after_failure: bool = False) -> dict[str, list[FeedRound]]:
    """Each side's fed rounds, as the trusted child saw them (``feeding.feed_report``)."""
    return {peer: feed_report(ctx, processes, peer, "timing", after_failure).rounds for peer in combine.SIDES}


def judge_feeds(ctx: ItemContext, pair: combine.ProcessPair, reports: dict[str, list[FeedRound]]) -> None:
    """What the trusted child saw of each side's timed calls, against what the side reported:
    every output right, as many rounds as timed, no more samples than calls fed, and a median no
    longer than a call's whole turn by the trusted child's clock. The candidate's failure
    disqualifies it; the baseline's is the case's (one that keeps state across calls)."""
    counts = dict(ctx.result.extra.timed_outputs or {})
    for side in combine.SIDES:
        rounds, timed = reports[side], pair.rounds(side)
        problems = [p for r in rounds for p in ([r.closed] if r.closed else []) + r.problems]
        if not problems:
            problems = _forged_rounds(rounds, timed)
        if problems:
            if side == "baseline":
                raise StageFailed("timing", CASE_FAILED_PREFIX + one_screen(["its baseline's timed calls went wrong (does it keep state"
                                  " across calls?)", *problems]), "baseline", case_failed=True)
            raise StageFailed("timing", one_screen(["the outputs of timed calls are wrong (correct only while checked?)", *problems]),
                              "verify", disqualifies=True)
        seen = counts.get(side, {"calls": 0, "checked": 0})
        counts[side] = {"calls": seen["calls"] + sum(r.calls for r in rounds), "checked": seen["checked"] + sum(r.checked for r in rounds)}
    ctx.result.extra.timed_outputs = counts


def _forged_rounds(rounds: list[FeedRound], timed: list[TimingStats]) -> list[str]:
    """Where a side's timing replies contradict the trusted child's account of its rounds."""
    if len(rounds) != len(timed):
        return [f"{len(timed)} timing rounds reported, the trusted child fed {len(rounds)} (results forged?)"]
    for n, (fed, stats) in enumerate(zip(rounds, timed)):
        if stats.n > fed.calls:
            return [f"round {n + 1}: {stats.n} timed samples reported, the trusted child fed {fed.calls} calls (results forged?)"]
        if fed.turn_median_us is not None and stats.median_us > turn_allowance(stats) * fed.turn_median_us + TURN_SLACK_US:
            return [f"round {n + 1}: a median of {stats.median_us:.4g} us reported, but a call's whole turn took {fed.turn_median_us:.4g} us"
                    " by the trusted child's clock (results forged?)"]
    return []


# Clock granularity between two processes' ``perf_counter`` readings of one turn: a call's time can
# never exceed its turn, which holds the window, the flush and both messages.
TURN_SLACK_US = 1.0


def turn_allowance(stats: TimingStats) -> float:
    """How many turns a call's reported time may take: one, but a CPU call's time is its CPU time
    where that is larger (``per_call.at_least_cpu_time``): up to ``CPU_ABOVE_WALL_FLAG`` of its
    wall time unflagged, and no bound once flagged (the other threads' time, spread over the
    calls, was spent between them too)."""
    if stats.method != "wall":
        return 1.0
    return math.inf if has(stats.flags, Flag.CPU_TIME_ABOVE_WALL) else CPU_ABOVE_WALL_FLAG


def time_pair(ctx: ItemContext, candidate: Transport, baseline: Transport, ref: ReferenceData, processes: Processes,
              timed_alike: Time, first: str, several: bool = False) -> combine.ProcessPair:
    """One pair of processes' timing rounds. Baseline and candidate take turns in rounds, ordered
    ABBA ABBA..., ``first``'s round first, all under one lease: the host's speed drifts within
    seconds (docs/performance.md, "Process noise"), and a drift then hits both sides alike; a
    slowdown of one process alone moves its pair of rounds' ratio, and the pair is left out
    (``combine.undisturbed_pairs``). Which side goes first need not be neutral
    (``alternating_sides``). The candidate keeps timed outputs in every round; one of its fastest
    round's is checked against the reference, and others drawn from the session seed, so no
    round is safe to cheat in (``timed_outputs_to_check``, ``verified_timed_calls``). ``several``:
    the item is timed in several pairs of processes, so this pair takes
    ``SEVERAL_PAIRS_ROUND_PAIRS`` at most; a first pair that finds it will be (``host_set``) stops
    there too."""
    keep = timed_alike.verify
    pair = combine.ProcessPair(first=first)

    def time_baseline(r: int) -> None:
        command = dataclasses.replace(timed_alike, warmup_s=warmup_s(r), send_kept=False)
        pair.baseline.append(case_call(ctx, processes, command, "baseline", baseline).stats)

    def time_candidate(r: int) -> None:
        command = dataclasses.replace(timed_alike, warmup_s=warmup_s(r))
        reply = candidate_call(ctx, candidate, command, "timing", "timing", reply_limit(ref, keep))
        impossible = implausible_stats(reply.stats, candidate.last_call_s)
        if impossible:
            raise StageFailed("timing", f"the candidate's timing statistics are impossible: {impossible} (timers patched or results forged?)",
                              "timing", disqualifies=True)
        verify = reply.payload.verify
        if len(verify) != min(keep, reply.stats.n):
            raise StageFailed("timing", f"the candidate's child returned {len(verify)} timed outputs to verify, expected {keep}"
                              " (results forged?)", "verify", disqualifies=True)
        pair.candidate.append(reply.stats)
        pair.verify.append(verify)

    leads, follows = (time_baseline, time_candidate) if first == "baseline" else (time_candidate, time_baseline)
    for r in range(rounds_of(ctx, ref)):
        one, other = (leads, follows) if r % 2 == 0 else (follows, leads)
        one(r)
        other(r)
        if precise_enough(ctx, pair) or enough_for_one_of_several(ctx, pair, several):
            break
    return pair


def warmup_s(round_index: int) -> float:
    return WARMUP_S if round_index == 0 else 0.0


def precise_enough(ctx: ItemContext, pair: combine.ProcessPair) -> bool:
    """Whether the pair's rounds so far pin its speedup down to ``--kcoral-precision``: the 95%
    interval of the median of the rounds' ratios lies within it. Checked after an even number of
    round pairs only, so that each side went first equally often."""
    precision = ctx.settings.precision
    taken = len(pair.candidate)
    if precision is None or taken < MIN_ROUND_PAIRS or taken % 2:
        return False
    ratios = combine.round_ratios(pair.baseline, pair.candidate)
    interval = speedup_interval.speedup_interval(ratios)
    if interval is None or len(ratios) < taken:
        return False
    centre = combine.median_ratio(ratios)
    return centre * (1 - precision) <= interval[0] and interval[1] <= centre * (1 + precision)


def enough_for_one_of_several(ctx: ItemContext, pair: combine.ProcessPair, several: bool) -> bool:
    """Whether a pair of processes has its ``SEVERAL_PAIRS_ROUND_PAIRS`` and is (or, under auto,
    just turned out to be: ``host_set``) one of the item's several pairs."""
    taken = len(pair.candidate)
    if taken < SEVERAL_PAIRS_ROUND_PAIRS:
        return False
    return several or (taken == SEVERAL_PAIRS_ROUND_PAIRS and process_pairs_for(ctx, [pair]) > 1)


def asked_pairs(ctx: ItemContext) -> int:
    """The pairs of processes asked for before any is timed: ``--kcoral-process-pairs`` N within the
    plan's limit, or 1 under auto (more once the first pair is ``host_set``)."""
    asked = ctx.settings.process_pairs or 1
    return min(asked, ctx.plan.max_process_pairs) if ctx.plan.max_process_pairs is not None else asked


def first_sides_of(ctx: ItemContext) -> Iterator[str]:
    """The side that goes first in each pair of processes' turns: the candidate's under a plan
    that runs its program whole first, else ``alternating_sides`` from the session seed and the item."""
    if ctx.plan.candidate_first:
        return itertools.repeat("candidate")
    return alternating_sides(ctx.seed(ctx.spec.nodeid, "turns"))


def alternating_sides(seed: int) -> Iterator[str]:
    """The side whose round comes first in each pair of processes' turns (``time_pair``): the
    first pair's drawn from ``seed`` (the session seed and the item), then alternating.

    Going first need not be neutral: on a GPU the side whose round came first has read fast
    (docs/performance.md, "the side that goes first in the turns reads fast"). Alternating cancels
    such an advantage, whichever side it favours on a host, between an item's pairs of processes;
    the draw spreads it evenly, in both directions, over items timed in one pair."""
    sides = combine.SIDES if seed % 2 == 0 else combine.SIDES[::-1]
    return itertools.cycle(sides)


def process_pairs_for(ctx: ItemContext, pairs: list[combine.ProcessPair]) -> int:
    """How many pairs of processes the item is timed in, given those timed so far: at most the
    plan's; ``--kcoral-process-pairs`` N for every item; under auto one, and
    ``AUTO_PROCESS_PAIRS`` when the first pair found the host's speed setting a side's time
    (``combine.host_set_side``)."""
    if ctx.plan.max_process_pairs is not None and len(pairs) >= ctx.plan.max_process_pairs:
        return len(pairs)
    if ctx.settings.process_pairs is not None:
        return ctx.settings.process_pairs
    return AUTO_PROCESS_PAIRS if len(pairs) > 1 or host_set(pairs[0]) else 1


def host_set(pair: combine.ProcessPair) -> bool:
    try:
        return any(combine.host_set_side(combine.combine_processes([pair], side).to_dict()) for side in combine.SIDES)
    except ValueError:
        return False  # a side without samples: combining all pairs says which


def time_in_further_processes(ctx: ItemContext, ref: ReferenceData, processes: Processes, timed_alike: Time, first: str,
                              index: int) -> combine.ProcessPair:
    """Another pair of rounds, the item's pair of processes ``index`` (1, 2, ...): a candidate
    process and a baseline process other than the first pair's, fresh or kept by this pair from
    the case's earlier items (``children.LocalChildren.further_candidate``), each brought to its
    timing the way the first pair's were: the candidate loaded and its correctness run checked
    (a candidate right in one process only is wrong), the baseline given the same run. Both are
    done with the item (``Finish``) before this returns, still under the lease."""
    with contextlib.ExitStack() as stack:
        with timed_phase(ctx.result, "fresh_processes"):  # their start-up, apart from their rounds
            # the baseline's process starts while the candidate's loads and runs its trials: the
            # two start-ups (an interpreter, a CUDA context) overlap, and nothing is timed meanwhile
            started_baseline = enter_beside(stack, processes.further_baseline(index))
            try:
                candidate = stack.enter_context(processes.further_candidate(index))
                check_correctness(ctx, candidate, ref, processes)
            except StageFailed as failure:
                raise StageFailed("timing", "timed again in another pair of processes (the host's speed sets this item's), the"
                                  f" candidate's process there failed at {failure.stage}: {failure.message}", failure.phase,
                                  case_failed=failure.case_failed, disqualifies=not failure.case_failed) from None
            baseline = started_baseline()
            baseline_goes_the_candidates_way(ctx, baseline, ref, processes)
        pair = timed_pair(ctx, candidate, baseline, ref, processes, timed_alike, first, several=True)
        case_call(ctx, processes, Finish(), "baseline", baseline)
        candidate_call(ctx, candidate, Finish(), "finish", "timing")
        return pair


def enter_beside(stack: contextlib.ExitStack, manager: contextlib.AbstractContextManager[T]) -> Callable[[], T]:
    """Enter ``manager`` in a thread of its own, beside what this thread does next; the returned
    function waits for it and gives what it entered (or raises what entering raised). ``stack``
    waits for it too, and leaves the manager, however the block ends."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kcoral-enter-beside")
    entering = pool.submit(manager.__enter__)
    pool.shutdown(wait=False)

    def leave() -> None:
        if entering.exception() is None:  # waits for the thread; a manager never entered is not left
            manager.__exit__(None, None, None)

    stack.callback(leave)
    return entering.result


def time_command(ctx: ItemContext, ref: ReferenceData) -> Time:
    """One round's ``time`` command, the same for both sides, locally and remotely: the timing
    budget per callable (--kcoral-timing-budget, or the device's default) split over the rounds,
    and the timed outputs each round keeps for the check."""
    rounds = rounds_of(ctx, ref)
    fed = ctx.plan.fed  # then the trusted child judges every call, and none is kept here
    return Time(shape=ctx.spec.shape.params, device=ctx.device, n_sets=TIMING_INPUT_SETS, budget_s=timing_budget_s(ctx) / rounds,
                timer=ctx.settings.timer, verify=0 if fed else -(-verified_timed_calls(item_bytes(ref)) // rounds),
                written_inputs=list(ref.written_inputs), fed=fed)


def timing_budget_s(ctx: ItemContext) -> float:
    """Seconds of timed samples per callable: --kcoral-timing-budget, or the device's default."""
    return ctx.settings.timing_budget_s or DEFAULT_BUDGET_S["cpu" if ctx.device_kind == "cpu" else "cuda"]


def rounds_of(ctx: ItemContext, ref: ReferenceData) -> int:
    """The plan's rounds a side, or ``timing_rounds`` for the item's device and size."""
    if ctx.plan.rounds is not None:
        return ctx.plan.rounds
    return timing_rounds(ctx.device_kind, item_bytes(ref), timing_budget_s(ctx), ctx.plan.fed)


def verified_timed_calls(item_bytes: int) -> int:
    """How many timed outputs are checked for an item of ``item_bytes``."""
    return max(MIN_VERIFIED_TIMED_CALLS, min(MAX_VERIFIED_TIMED_CALLS, VERIFY_BYTES // max(item_bytes, 1)))


def check_floor(ctx: ItemContext, floor: dict[str, Any] | None, baseline: TimingStats | None, candidate: TimingStats | None) -> None:
    """No time below bytes / peak bandwidth (``physical_floor``), when the case declares ``cost``."""
    if not floor or candidate is None:
        return
    ctx.result.extra.physical_floor = floor
    floor_us = float(floor["floor_us"])
    if baseline is not None and baseline.median_us < floor_us:
        # the baseline moves the bytes faster than the floor allows: the case's cost overstates them
        ctx.result.extra.physical_floor_ignored = (f"the baseline ({baseline.median_us:.3g} us) is below the floor:"
                                                   " cost(shape) overstates the bytes")
        return
    if candidate.median_us < floor_us:
        raise StageFailed(
            "timing",
            f"time below the physical floor: {candidate.median_us:.3g} us to move {floor['bytes']:.4g} bytes "
            f"(cost(shape)) is faster than the floor {floor_us:.3g} us ({floor['how']})",
            "timing",
            disqualifies=True,
        )


def check_min_speedup(ctx: ItemContext, baseline: TimingStats) -> None:
    """``--kcoral-min-speedup``: a correct candidate slower than that fails its item, still correct."""
    result, minimum = ctx.result, ctx.settings.min_speedup
    if minimum is None:
        return
    if result.speedup is None:
        raise StageFailed("timing", f"no speedup: baseline timed by {baseline.method}, candidate by {result.timer}", "timing")
    if result.speedup < minimum:
        raise StageFailed(
            "timing",
            f"speedup {result.speedup:.3g}x is below --kcoral-min-speedup {minimum:g} "
            f"(baseline {result.t_baseline_us:.1f} us, candidate {result.t_candidate_us:.1f} us, {result.timer})",
            "timing",
        )


def verify_timed_outputs(ctx: ItemContext, verify: list[TimedOutput], ref: ReferenceData, processes: Processes) -> None:
    """The outputs of timed calls must be right too, and the inputs they write in place: no
    computing only while watched. A case with a checker of its own judges them (the reference's
    structure, which the candidate's matched in the correctness stage)."""
    if not verify:
        return
    shape, tol = ctx.spec.shape.params, ctx.tolerance
    if ctx.spec.case.checker:

        def ask(command: Check, phase: str) -> CheckReply:
            return case_call(ctx, processes, command, phase)

        found = checker.timed_problems(ask, shape, ctx.device, verify, ref.structure)
        problems = [f"timed call {n + 1}: {p}" for n, trial in enumerate(found) for p in trial]
    else:
        written_inputs = ref.written_inputs
        reply = case_call(ctx, processes, Reference(shape=shape, seeds=[v.seed for v in verify], device=ctx.device,
                                                    written_inputs=list(written_inputs)), "verify")
        names = correctness.written_input_names(written_inputs)
        problems = []
        for n, (entry, expected, expected_written) in enumerate(zip(verify, reply.payload.reference, reply.payload.written)):
            wrong = correctness.compare_outputs(entry.outputs, expected, tol)
            if not wrong and entry.outputs is not None:
                wrong = correctness.compare_outputs(entry.written, expected_written, tol, names)
            problems += [f"timed call {n + 1}: {p}" for p in wrong]
    if problems:
        raise StageFailed("timing", one_screen(["the outputs of timed calls are wrong (correct only while checked?)", *problems]), "verify",
                          disqualifies=True)


def timed_outputs_to_check(rounds: list[TimingStats], kept_outputs: list[list[T]], kept_rounds: list[int] | None,
                           rng: random.Random, count: int) -> list[T]:
    """``count`` of the candidate's kept timed outputs (``kept_outputs``: per
    round): one of its fastest round's among those that set its time (``kept_rounds``, from
    ``combine.undisturbed_pairs``; None: all), the rest drawn from all the others. A candidate
    that skips its work to be fast is fastest where it skipped, and that round is always checked."""
    timed = [r for r in (range(len(rounds)) if kept_rounds is None else kept_rounds) if kept_outputs[r]]
    if not timed:
        return []
    fastest = min(timed, key=lambda r: rounds[r].median_us)
    first = kept_outputs[fastest][rng.randrange(len(kept_outputs[fastest]))]
    others = [v for entries in kept_outputs for v in entries if v is not first]
    return [first, *rng.sample(others, min(len(others), count - 1))]


def implausible_stats(stats: TimingStats | dict[str, Any] | None, parent_wall_s: float) -> str | None:
    """Why reported timing statistics cannot be true, checked against the parent's own clock.

    Every timed call runs inside the ``time`` command, so the timed calls together cannot take longer
    than the parent saw the command take: at least half of the ``n`` samples are >= the median and
    every one is >= the minimum. Values must be finite, non-negative and ordered.
    """
    if isinstance(stats, TimingStats):
        stats = {"n": stats.n, "median_us": stats.median_us, "min_us": stats.min_us, "iqr_us": stats.iqr_us, "flags": stats.flags}
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
    if has(stats.get("flags") or (), Flag.CPU_TIME_ABOVE_WALL):
        wall_us *= os.cpu_count() or 1  # timed by CPU time (``timing._at_least_cpu_time``): each core adds its own
    lower_bound_us = max(n * min_us, (n + 1) // 2 * median_us)
    if lower_bound_us > wall_us:
        return (f"{n} samples with median {median_us:.3g} us and minimum {min_us:.3g} us need at least {lower_bound_us / 1e6:.3g} s, "
                f"but the whole timing command took {parent_wall_s:.3g} s by the parent's clock")
    return None
