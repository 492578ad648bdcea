"""The trusted child's verdicts on what a fed child's calls returned (``child_feeder``'s judges):

- ``TimedCalls``: each timed call gets fresh inputs from a seed drawn here. Its outputs' kinds,
  dtypes and shapes are judged every time, their values on a share of the calls (``Pricing``)
  drawn after the call, so no call can know whether it will be checked. A checked call's outputs
  and inputs are copied here in its turn, and judged with the round's other checks at its end,
  all in one pass (``correctness.mismatch_tally``): a turn holds copies, not the reference's
  call and the comparison, and a check adds no wait for the device.
- ``TrialCalls``: the correctness trials, on the inputs the reference was computed on (kept
  here, or made again from their seeds when too large to keep: ``child_trusted.Trials``). Each
  is judged in full, as the correctness stage judges: the structure, the values (or the case's
  own checker), the INPLACE results, every other input unchanged, and what the trials tell
  together (outputs that ignore their inputs, a constant).

Both judge by the rules of ``correctness.py``; only the verdict and a few numbers go back to the
pytest process.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_kcoral import checker, correctness
from pytest_kcoral.case_runtime import CaseRuntime
from pytest_kcoral.child_feeder import ONE_SET_BYTES, timed_sets
from pytest_kcoral.child_outputs import clone_values, flatten_outputs, leaves, require_plain_outputs, synchronize
from pytest_kcoral.child_trusted import Trials
from pytest_kcoral.feed import FeedError, Outcome
from pytest_kcoral.messages import FeedPeer, FeedReportReply, FeedRound
from pytest_kcoral.timing.placement import tensor_bytes

# Which timed calls have their values checked (their kinds, dtypes and shapes are, every one): all
# of them while a check (the reference and the comparison) takes at most CHECK_FREE_S; past that,
# as many as keep the checks to CHECK_TURN_SHARE of a baseline call's turn, and never fewer than
# MIN_CHECK_SHARE. Both sides of an item get the same share (``Pricing``), so neither's time
# outside its windows grows by the other's checks. A candidate must skip its work on half its
# calls or more to move a median, so even the floor catches it within a few dozen calls.
CHECK_FREE_S = 50e-6
CHECK_TURN_SHARE = 0.5
MIN_CHECK_SHARE = 0.05
_COSTS_KEPT = 15  # the latest checks' costs, whose median prices the next ones
# A check's cost, waited for on the device: the first few checks of a feed, then one in so many
_PRICED_FIRST = 4
_PRICE_EVERY = 32
PROBLEMS_KEPT = 5
# The copies of checked calls a round holds for its end's checks; past this they are judged at
# once, and a call whose copies alone take more is judged in its turn.
DEFERRED_BYTES = 64 << 20

Outputs = Callable[[], tuple[list[Any], list[str]]]  # a call's outputs read from the slot, or why they cannot be


class Pricing:
    """How often an item's timed calls are checked, shared by the feeds of its two sides
    (``CHECK_FREE_S``): from what checks cost, and how long the baseline's calls take."""

    def __init__(self) -> None:
        self.costs_s: list[float] = []
        self.baseline_turns_us: list[float] = []
        self.share = 1.0

    def add_cost(self, took_s: float) -> None:
        self.costs_s = [*self.costs_s[-(_COSTS_KEPT - 1):], took_s]
        cost_s = statistics.median(self.costs_s)
        if cost_s <= CHECK_FREE_S or not self.baseline_turns_us:
            self.share = 1.0
            return
        turn_s = statistics.median(self.baseline_turns_us) / 1e6
        self.share = min(1.0, max(MIN_CHECK_SHARE, CHECK_TURN_SHARE * turn_s / cost_s))

    def add_baseline_turns(self, turns_us: list[float]) -> None:
        self.baseline_turns_us = turns_us[-256:]


@dataclass
class _Deferred:
    """A checked call, judged with the round's others: the inputs as made (this process's own),
    and copies of its outputs and of its inputs as the call left them."""

    call: int
    made: tuple
    outputs: list[Any]
    after: tuple  # None for an input nothing reads after the call
    nbytes: int
    copy_s: float = 0.0  # what the copies took in the call's turn: part of the check's cost


@dataclass
class _Round:
    calls: int = 0
    checked: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # (timed call, problem)
    # checks counted on the device and not read yet: (timed call, messages, counts), read once a round
    tallies: list[tuple[int, list[str], Any]] = field(default_factory=list)
    deferred: list[_Deferred] = field(default_factory=list)  # checked calls not judged yet (``TimedCalls._flush``)
    deferred_bytes: int = 0
    turns_us: list[float] = field(default_factory=list)

    def read_tallies(self) -> None:
        """The round's counted checks, read with one wait for the device: a message for each count that is not zero."""
        if not self.tallies:
            return
        import torch

        values = torch.cat([counts.reshape(-1) for _, _, counts in self.tallies]).tolist()
        at = 0
        for call, labels, _ in self.tallies:
            self.problems += [(call, label.format(n)) for label, n in zip(labels, values[at:at + len(labels)]) if n]
            at += len(labels)
        self.tallies = []

    def report(self, closed: str = "") -> FeedRound:
        self.read_tallies()
        median = statistics.median(self.turns_us) if self.turns_us else None
        problems = [f"timed call {call}: {p}" for call, p in sorted(self.problems, key=lambda entry: entry[0])]
        return FeedRound(calls=self.calls, checked=self.checked, problems=problems[:PROBLEMS_KEPT], turn_median_us=median, closed=closed)


class TimedCalls:
    """Feeds and judges a side's timed calls, round by round (see the module's docstring)."""

    def __init__(self, case: CaseRuntime, config: FeedPeer, rng: Any, pricing: Pricing) -> None:
        self.case, self.config, self.rng, self.pricing = case, config, rng, pricing
        self.tol = correctness.Tolerance(config.tolerance.atol, config.tolerance.rtol, config.tolerance.strict)
        self.structure: Any = None
        self.expected: list[tuple[str, list[int]] | None] = []  # the reference's outputs: dtype and shape, None for a value
        self.rounds: list[_Round] = []
        self.current = _Round()

    def layout_inputs(self, wanted: int) -> tuple[list[tuple], tuple, bool]:
        """One input set made here tells each input's kind, dtype, shape and strides; the
        reference's outputs on it, the slot's and what every call must return."""
        shape = self.config.shape
        args = self.case.make_inputs(shape, self.rng.getrandbits(62))
        outputs, self.structure = flatten_outputs(self.case.reference(shape, clone_values(args)))
        require_plain_outputs(outputs, "reference")
        self.expected = [(str(o.dtype).removeprefix("torch."), list(o.shape)) if hasattr(o, "dtype") else None for o in outputs]
        n_sets, pads = timed_sets(tensor_bytes(args), self.config.device, wanted)
        return [args] * n_sets, outputs, pads

    def prefill(self, k: int) -> tuple:
        return self.inputs_for(k)

    def inputs_for(self, k: int) -> tuple:
        return self.case.make_inputs(self.config.shape, self.rng.getrandbits(62))

    def turn(self, us: float) -> None:
        self.current.turns_us.append(us)

    def end(self) -> None:
        self._flush()
        self.current.read_tallies()
        if self.config.peer == "baseline":
            self.pricing.add_baseline_turns(self.current.turns_us)
        self.rounds.append(self.current)
        self.current = _Round()

    def report(self, closed: str, error: str) -> FeedReportReply:
        rounds = [r.report() for r in self.rounds]
        if self.current.calls or closed:
            self._flush()
            rounds.append(self.current.report(closed))
            self.current = _Round()
        self.rounds = []
        return FeedReportReply(rounds=rounds, error=error)

    def let_go(self) -> None:
        pass

    def judge(self, outcome: Outcome, k: int, made: tuple, after: tuple, outputs: Outputs) -> None:
        """One timed call: counted, its kinds checked, and with the item's share (drawn now) its values."""
        call = self.current.calls = self.current.calls + 1
        problems = list(outcome.problems)
        if outcome.set_index != k:
            problems.append(f"its child says it called input set {outcome.set_index}, the set made for it was {k}")
        if not problems:
            problems = self._kinds(outcome)
        if not problems and self.rng.random() < self.pricing.share:
            self.current.checked += 1
            problems = self._values(call, made, after, outputs)
        self.current.problems += [(call, p) for p in problems]

    def _kinds(self, outcome: Outcome) -> list[str]:
        """A call's outputs, by what its child says of them: the reference's structure, and each a
        tensor of the reference's dtype and shape (or a plain value where it returns one). A case's
        own checker may take other dtypes and shapes: then only tensors against values."""
        problems = correctness.compare_structure(outcome.structure, self.structure)
        if problems:
            return problems
        if len(outcome.leaves) != len(self.expected):
            return [f"returned {len(outcome.leaves)} output(s), the reference returns {len(self.expected)}"]
        for i, (leaf, expected) in enumerate(zip(outcome.leaves, self.expected)):
            if (leaf[0] == "value") != (expected is None):
                problems.append(f"output {i} is {'a plain value' if leaf[0] == 'value' else 'a tensor'}, the reference returns"
                                f" {'a plain value' if expected is None else 'a tensor'}")
            elif expected is not None and not self.config.checker and (leaf[1], list(leaf[2])) != expected:
                problems.append(f"output {i} is a {leaf[1]} tensor of shape {tuple(leaf[2])}, the reference's a {expected[0]} of shape"
                                f" {tuple(expected[1])}")
        return problems

    def _values(self, call: int, made: tuple, after: tuple, outputs: Outputs) -> list[str]:
        """A call's values, as the correctness stage judges them. Where they can be counted on
        the device, copies are kept for the round's end (``_flush``); the rest is decided now."""
        values, problems = outputs()
        if problems:
            return problems
        config = self.config
        if config.device.startswith("cuda") and not config.checker and self._countable():  # on a CPU a check now costs as much
            reads = self._inputs_read(len(after))
            nbytes = sum(t.numel() * t.element_size() for t in (*values, *(after[j] for j in reads)) if hasattr(t, "element_size"))
            if nbytes <= DEFERRED_BYTES:
                if self.current.deferred_bytes + nbytes > DEFERRED_BYTES:
                    self._flush()
                started = time.perf_counter()
                kept = self._copies(call, made, after, values, reads, nbytes)
                kept.copy_s = time.perf_counter() - started
                self.current.deferred.append(kept)
                self.current.deferred_bytes += nbytes
                return []
        priced = len(self.pricing.costs_s) < _PRICED_FIRST or self.current.checked % _PRICE_EVERY == 0
        if priced:
            synchronize(config.device)
        started = time.perf_counter()
        if config.checker:
            problems = case_checker_verdict(self.case, made, self.structure, values)
            problems += correctness.describe_changed_inputs(correctness.changed_inputs(made, after), config.may_write)
        else:
            problems = self._judge_now(call, made, after, values)
        if priced:
            synchronize(config.device)
            self.pricing.add_cost(time.perf_counter() - started)
        return problems

    def _countable(self) -> bool:
        """Whether the reference's outputs are all tensors of kinds one pass can judge (``correctness.mismatch_tally``)."""
        return not self.tol.strict and bool(self.expected) and all(e is not None and not e[0].startswith("complex") for e in self.expected)

    def _inputs_read(self, n_inputs: int) -> set[int]:
        """The inputs a call's check reads: those the reference writes, and those that must stay unchanged."""
        return set(self.config.written_inputs) | {j for j in range(n_inputs) if j not in self.config.may_write}

    @staticmethod
    def _copies(call: int, made: tuple, after: tuple, values: list[Any], reads: set[int], nbytes: int) -> _Deferred:
        """The call's outputs and the inputs its check reads, copied out of its child's memory."""
        kept = tuple(a.clone() if j in reads and hasattr(a, "clone") else None for j, a in enumerate(after))
        return _Deferred(call, made, [v.clone() for v in values], kept, nbytes)

    def _expected(self, made: tuple) -> tuple[tuple, tuple]:
        """The judge's outputs on a copy of ``made`` (the reference's, or the baseline's for the
        weak-reference test), and that copy as the judge left it."""
        ref_args = clone_values(made)
        judge = self.case.baseline if self.config.against == "baseline" else self.case.reference
        return tuple(leaves(judge(self.config.shape, ref_args))), ref_args

    def _judge_now(self, call: int, made: tuple, after: tuple, values: list[Any]) -> list[str]:
        """One call's values, counted on the device where one pass can, else decided in full now."""
        expected, ref_args = self._expected(made)
        written = self.config.written_inputs
        names = [f"output {i}" for i in range(len(values))] + correctness.written_input_names(written)
        tally = correctness.mismatch_tally([(*values, *(after[j] for j in written))], [(*expected, *(ref_args[j] for j in written))],
                                           self.tol, names, [made], [after], self.config.may_write)
        if tally is None:  # kinds that differ, or rules of more than one pass: decided now, in full
            return values_and_inputs(values, expected, tuple(after[j] for j in written), tuple(ref_args[j] for j in written),
                                     written, made, after, self.config.may_write, self.tol)
        if tally[1] is not None:
            self.current.tallies.append((call, tally[0], tally[1][0]))
        return []

    def _flush(self) -> None:
        """The round's kept checks, judged in one pass and counted on the device (read with the
        round's tallies); priced per check, as the checks in a turn are, their copies included."""
        deferred, self.current.deferred, self.current.deferred_bytes = self.current.deferred, [], 0
        if not deferred:
            return
        config = self.config
        synchronize(config.device)
        started = time.perf_counter()
        written = config.written_inputs
        expected, ref_written = [], []
        for d in deferred:
            outputs, ref_args = self._expected(d.made)
            expected.append((*outputs, *(ref_args[j] for j in written)))
            ref_written.append(ref_args)
        names = [f"output {i}" for i in range(len(deferred[0].outputs))] + correctness.written_input_names(written)
        tally = correctness.mismatch_tally([(*d.outputs, *(d.after[j] for j in written)) for d in deferred], expected, self.tol, names,
                                           [d.made for d in deferred], [d.after for d in deferred], config.may_write)
        if tally is None:  # a call whose kinds differ from the others': each decided in full
            for d, ref_args, exp in zip(deferred, ref_written, expected):
                problems = values_and_inputs(d.outputs, exp[:len(d.outputs)], tuple(d.after[j] for j in written), tuple(ref_args[j] for j in written),
                                             written, d.made, d.after, config.may_write, self.tol)
                self.current.problems += [(d.call, p) for p in problems]
        elif tally[1] is not None:
            self.current.tallies += [(d.call, tally[0], tally[1][r]) for r, d in enumerate(deferred)]
        synchronize(config.device)
        cost_s = (time.perf_counter() - started) / len(deferred) + statistics.median(d.copy_s for d in deferred)
        for _ in range(min(len(deferred), _COSTS_KEPT)):
            self.pricing.add_cost(cost_s)


class TrialCalls:
    """Feeds and judges a side's correctness trials, each on the inputs the reference had: the
    n-th call gets the n-th trial, written into the set it names, so no call picks its trial. Its
    child gets a set per trial, or one that takes them in turn when a set is large (as for timed
    calls: ``ONE_SET_BYTES``)."""

    def __init__(self, case: CaseRuntime, config: FeedPeer, rng: Any, trials: Trials) -> None:
        self.case, self.config, self.rng, self.trials = case, config, rng, trials
        self.tol = correctness.Tolerance(config.tolerance.atol, config.tolerance.rtol, config.tolerance.strict)
        n = len(trials)
        self.problems: list[list[str]] = [[] for _ in range(n)]
        self.run: set[int] = set()  # the trials its child called
        self.next_trial = 0  # the trial the next call gets
        self.in_flight: int | None = None  # the trial written for the call in flight
        self.trials_together = correctness.TrialsTogether()
        self.together: dict[str, Any] = {}

    def layout_inputs(self, wanted: int) -> tuple[list[tuple], tuple, bool]:
        first = self.trials.trial(0)
        n_sets = 1 if tensor_bytes(first.inputs) > ONE_SET_BYTES else len(self.trials)
        return [first.inputs] * n_sets, first.reference, False

    def prefill(self, k: int) -> tuple:
        return self.trials.trial(k).inputs

    def inputs_for(self, k: int) -> tuple:
        t = self.next_trial
        if t >= len(self.trials):
            raise FeedError(f"a call past the {len(self.trials)} trials")
        self.next_trial, self.in_flight = t + 1, t
        return self.trials.trial(t).inputs

    def turn(self, us: float) -> None:
        pass

    def judge(self, outcome: Outcome, k: int, made: tuple, after: tuple, outputs: Outputs) -> None:
        """The trial in flight, in full. A trial whose child found something (a lazy object, an
        alias) is left to those findings, which the child's own reply carries."""
        t, self.in_flight = self.in_flight, None
        assert t is not None  # a call's outcome comes after its inputs (``Feeder._judge``)
        self.run.add(t)
        if outcome.problems:
            return
        trial = self.trials.trial(t)
        problems = correctness.compare_structure(outcome.structure, trial.structure)
        if not problems:
            values, problems = outputs()
            if not problems:
                written = self.config.written_inputs
                after_written = tuple(after[j] for j in written)
                if self.config.checker:
                    problems = checker.unwritten_elements(values, trial.reference)
                    problems += case_checker_verdict(self.case, made, outcome.structure, values)
                    problems += correctness.describe_changed_inputs(correctness.changed_inputs(made, after), self._may_write(outcome))
                else:
                    problems = values_and_inputs(values, trial.reference, after_written, trial.written, written, made,
                                                 after, self._may_write(outcome), self.tol)
                self.trials_together.add(t, values, trial.reference)
        self.problems[t] += problems

    def _may_write(self, outcome: Outcome) -> list[int]:
        """``stage_correctness.may_write`` for one trial: INPLACE's inputs, and where a case's data
        carries output buffers, the inputs the call returned as outputs."""
        returned = [j for _, j in outcome.aliases] if self.config.aliases_may_write else []
        return sorted({*self.config.inplace, *returned})

    def end(self) -> None:
        together = self.trials_together
        self.together = {"same_kinds": together.same_kinds, "ignores_inputs": together.ignores_inputs, "constant": together.constant or ""}

    def report(self, closed: str, error: str) -> FeedReportReply:
        rounds = [FeedRound(calls=0, checked=0, problems=[], turn_median_us=None, closed=closed)] if closed else []
        problems = [found if k in self.run else ["its child never called it (results forged?)"] for k, found in enumerate(self.problems)]
        return FeedReportReply(rounds=rounds, error=error, trials=problems, **self.together)

    def let_go(self) -> None:
        self.trials.let_go()
        self.trials_together.first = None


def values_and_inputs(values: Any, expected: Any, written: tuple, expected_written: tuple, written_inputs: list[int], made: tuple,
                      after: tuple, may_write: list[int], tol: correctness.Tolerance) -> list[str]:
    """A call's outputs and INPLACE results against the expected ones, and every other input
    unchanged, in full (``correctness.compare_outputs``, ``changed_inputs``)."""
    problems = correctness.compare_outputs(values, expected, tol)
    if not problems and written_inputs:
        problems = correctness.compare_outputs(written, expected_written, tol, correctness.written_input_names(written_inputs))
    return problems + correctness.describe_changed_inputs(correctness.changed_inputs(made, after), may_write)


def case_checker_verdict(case: CaseRuntime, made: tuple, structure: Any, values: list[Any]) -> list[str]:
    """The case's own checker on a call's outputs, rebuilt in the structure they came in (a
    checker that raises on an output rejects it)."""
    try:
        return checker.problems_of(case.check(clone_values(made), checker.rebuild(structure, list(values))))
    except Exception as exc:  # noqa: BLE001 - the problem author's code, judging an output
        return [f"the problem's check_implementation raised {type(exc).__name__} on this output: {exc}"[:checker.MESSAGE_LIMIT_CHARS]]
