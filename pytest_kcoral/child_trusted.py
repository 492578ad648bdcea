"""The trusted child's commands: the case's inputs and reference, the baseline's check against it,
the case's own checker, and the case's cost. Run in a child that only ever imports the case,
never a candidate (``child._Runner`` serves them in the trusted role).

torch is imported inside the functions, as in ``child_outputs``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_kcoral import checker, correctness, host_memory, physical_floor, speed_of_light
from pytest_kcoral.case_runtime import CaseRuntime
from pytest_kcoral.child_outputs import (
    aliases,
    check_inplace_indices,
    clone_values,
    flatten_outputs,
    leaves,
    release_cached_memory,
    require_plain_outputs,
    to_cpu,
)
from pytest_kcoral.messages import Check, CheckReply, Cost, CostReply, Reference, ReferenceReply, ReferenceResults

UNSTEADY_SHOWN = 3  # lines of how a second call of the reference disagreed
KEPT_SHAPES = 2  # the trials kept on the device for feeds (``KeptTrials``): the item's shape, and the one before
KEPT_SHARE = 1 / 8  # of the device's memory, the most one shape's kept trials take (``Trials``)


@dataclass(frozen=True)
class Trial:
    """One correctness trial as the trusted child made it: the inputs (never run on), the
    reference's outputs and the INPLACE inputs it wrote."""

    inputs: tuple
    reference: tuple
    written: tuple
    structure: Any  # the reference's outputs' (``flatten_outputs``)


class Trials:
    """One shape's correctness trials, to feed a candidate's and the baseline's child
    (``child_feeder``). Kept on the device while they take at most ``KEPT_SHARE`` of it; larger
    ones are made again, one trial at a time, from their seeds: two copies of a KernelBench
    problem's trials at its own size (the kept ones and the fed process's) fill an 80 GB GPU."""

    def __init__(self, seeds: list[int], kept: list[Trial] | None = None, remake: Callable[[int], Trial] | None = None) -> None:
        self.seeds, self._kept, self._remake = seeds, kept, remake
        self._last: tuple[int, Trial] | None = None  # the trial remade last: asked for again while it is fed

    def __len__(self) -> int:
        return len(self.seeds)

    @property
    def remade(self) -> bool:
        return self._kept is None

    def trial(self, t: int) -> Trial:
        if self._kept is not None:
            return self._kept[t]
        assert self._remake is not None
        if self._last is None or self._last[0] != t:
            self._last = None  # the last one's tensors go before the next one's are made
            self._last = (t, self._remake(t))
        return self._last[1]

    def let_go(self) -> None:
        """A feed is over: the trial remade last goes (kept trials stay for the next feed)."""
        self._last = None


def keeps_on_device(trial_bytes: int, trials: int, device: str) -> bool:
    """Whether ``trials`` trials of ``trial_bytes`` each are kept on ``device`` (``Trials``)."""
    if not device.startswith("cuda"):
        return True  # host memory, checked before the trials are made (``host_memory.check``)
    import torch

    return trial_bytes * trials <= KEPT_SHARE * torch.cuda.get_device_properties(torch.device(device)).total_memory


class KeptTrials:
    """The trials ``reference`` kept (``Reference.keep``), by shape, seeds and device, the latest few."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, Trials] = OrderedDict()

    @staticmethod
    def key(shape: dict[str, Any], seeds: list[int], device: str) -> str:
        return json.dumps([shape, seeds, device], sort_keys=True)

    def put(self, key: str, trials: Trials) -> None:
        self._kept[key] = trials
        self._kept.move_to_end(key)
        while len(self._kept) > KEPT_SHAPES:
            self._kept.popitem(last=False)

    def get(self, key: str) -> Trials | None:
        return self._kept.get(key)


def make_trials(case: CaseRuntime, shape: dict[str, Any], seeds: list[int], written_inputs: list[int]) -> Trials:
    """The trials ``reference`` made for ``seeds``, made again one at a time as they are fed (a
    trusted child started since, or trials too large to keep): the inputs are seeded, and the
    reference answers alike, or its case failed as unsteady."""
    def remake(t: int) -> Trial:
        args = case.make_inputs(shape, seeds[t])
        ref_args = clone_values(args)
        ref, structure = flatten_outputs(case.reference(shape, ref_args))
        return Trial(args, ref, tuple(ref_args[j] for j in written_inputs), structure)

    return Trials(seeds, remake=remake)


def reference(case: CaseRuntime, command: Reference, kept: KeptTrials | None = None) -> ReferenceReply:
    """Inputs and the reference's outputs for each seed. With a ``tolerance`` also the verdicts
    that need nothing from a candidate, reached here on the device so the tensors they read never
    cross the wire: the baseline's problems against the reference (with ``baseline``), whether
    the reference is weak, and whether it is unsteady (a second call on the first input set
    disagrees with the first call). For the INPLACE inputs the reference writes, their values
    after its call (``written``)."""
    shape = command.shape
    spec = command.tolerance
    tol = correctness.Tolerance(spec.atol, spec.rtol, spec.strict) if spec is not None else None
    inplace = set(command.inplace)
    # the inputs whose values after the call are kept: those asked for (the timed calls' check
    # compares what the correctness stage found written), else every INPLACE one
    kept_inputs = command.written_inputs if command.written_inputs is not None else sorted(inplace)
    inputs, refs, baseline_problems, weak, structure, unsteady = [], [], [], False, 0, []
    baseline_raised = False
    output_aliases: set[tuple[int, int]] = set()
    after_calls, written = [], set()
    returns_nothing = True
    input_bytes, output_bytes, after_bytes = _trial_sizes((), (), (), [])
    # kept where they are for a feed, else to the host now: the next trial's tensors take their place
    here = (lambda values: values) if command.keep else to_cpu
    remade = False  # kept for a feed, but too large to keep: let go, and made again as they are fed
    for t, seed in enumerate(command.seeds):
        args = case.make_inputs(shape, seed)
        check_inplace_indices(inplace, args)
        ref_args = clone_values(args)
        ref, structure = flatten_outputs(case.reference(shape, ref_args))
        require_plain_outputs(ref, "reference")
        if t == 0:
            input_bytes, output_bytes, after_bytes = _trial_sizes(args, ref, ref_args, kept_inputs)
            if command.keep and not keeps_on_device(sum(input_bytes) + sum(output_bytes) + sum(after_bytes.values()), len(command.seeds),
                                                    command.device):
                remade, here = True, _let_go
        # before the other trials take their share; kept on a GPU, nothing crosses to the host
        if t == 0 and command.check_host_memory and not (command.keep and command.device.startswith("cuda")):
            on_cpu = command.device == "cpu"
            trial_bytes = host_memory.tensor_bytes(args) + host_memory.tensor_bytes(ref)
            held_bytes = trial_bytes + host_memory.tensor_bytes(ref_args) if on_cpu else 0
            host_memory.check(trial_bytes, len(command.seeds), timed_on_cpu=command.timed and on_cpu, held_bytes=held_bytes)
        returns_nothing = returns_nothing and all(v is None for v in ref)
        # an output the reference returns as one of its inputs (``return a.add_(b)``, a no-op
        # ``x.to(x.dtype)``, GPU MODE's ``c[...] = a @ b; return c``): a candidate may too
        output_aliases.update(aliases(ref, ref_args))
        # an INPLACE input the reference writes is a result (``x.add_(y)``), not scratch
        wrote = [j for j, _ in correctness.changed_inputs(args, ref_args) if j in inplace]
        written.update(wrote)
        after_calls.append(dict(zip(kept_inputs, here(tuple(ref_args[j] for j in kept_inputs)))))
        if tol is not None:
            if t == 0:  # no candidate can match a reference that answers one input two ways
                unsteady = correctness.compare_outputs(leaves(case.reference(shape, clone_values(args))), ref, tol)
            weak = weak or correctness.is_weak_reference(ref, tol)
            if command.baseline:
                problems, raised = baseline_problems_on(case, shape, args, ref, tuple(ref_args[j] for j in wrote), wrote, inplace, tol)
                baseline_problems += [f"trial {t + 1}: {p}" for p in problems]
                baseline_raised = baseline_raised or raised
        refs.append(here(ref))
        inputs.append(here(args))
        del args, ref_args, ref  # a remade trial's tensors go before the next trial's are made
    # in every trial, once one trial wrote it
    written_inputs = command.written_inputs if command.written_inputs is not None else sorted(written)
    written_values = [tuple(after[j] for j in written_inputs) for after in after_calls]
    results = ReferenceResults(inputs=inputs, reference=refs, written=written_values)
    if command.keep:
        if kept is not None:
            key = KeptTrials.key(command.shape, command.seeds, command.device)
            if remade:
                kept.put(key, make_trials(case, shape, command.seeds, written_inputs))
            else:
                kept.put(key, Trials(command.seeds, kept=[Trial(*trial, structure) for trial in zip(inputs, refs, written_values)]))
        results = ReferenceResults(inputs=[], reference=[], written=[])
    release_cached_memory(command.device)  # the clones and second calls above: the item's other processes need the room
    return ReferenceReply(
        baseline_problems=baseline_problems, baseline_raised=baseline_raised, weak=weak, structure=structure,
        unsteady=unsteady[:UNSTEADY_SHOWN], written_inputs=written_inputs, output_aliases=[list(p) for p in sorted(output_aliases)],
        payload=results, input_bytes=input_bytes, output_bytes=output_bytes,
        written_bytes=sum(after_bytes.get(j, 0) for j in written_inputs), returns_nothing=returns_nothing,
    )


def _trial_sizes(args: tuple, ref: tuple, ref_args: tuple, kept_inputs: list[int]) -> tuple[list[int], list[int], dict[int, int]]:
    """One trial's sizes, for what the pytest process decides without the tensors: per input, per
    output, and per kept input after the call."""
    return ([host_memory.tensor_bytes((a,)) for a in args], [host_memory.tensor_bytes((r,)) for r in ref],
            {j: host_memory.tensor_bytes((ref_args[j],)) for j in kept_inputs})


def _let_go(values: tuple) -> tuple:
    return (None,) * len(values)


def baseline_problems_on(case: CaseRuntime, shape: dict[str, Any], args: tuple, ref: tuple, ref_written: tuple, wrote: list[int],
                         inplace: set[int], tol: correctness.Tolerance) -> tuple[list[str], bool]:
    """The baseline against the reference, as a candidate is held to it: its outputs, the
    INPLACE inputs the reference wrote (``wrote``, as ``ref_written``), and no input outside
    ``inplace`` changed. The problems, and whether the baseline raised (or exited) instead of
    answering: such a baseline cannot be timed on the shape either."""
    base_args = clone_values(args)
    try:
        base = leaves(case.baseline(shape, base_args))
    except SystemExit as exc:  # would read as the reference's failure: the command's phase is 'reference'
        return [f"the baseline called sys.exit({exc.code!r})"], True
    except Exception as exc:  # a failing baseline is a finding, not a harness error
        return [f"{type(exc).__name__}: {exc}"[:500]], True
    problems = correctness.compare_outputs(base, ref, tol)
    problems += correctness.compare_outputs(tuple(base_args[j] for j in wrote), ref_written, tol, correctness.written_input_names(wrote))
    problems += correctness.describe_changed_inputs(correctness.changed_inputs(args, base_args), sorted(inplace))
    return problems, False


def check(case: CaseRuntime, command: Check) -> CheckReply:
    """The case's own verdict on a candidate's outputs, per seed (GPU MODE's
    ``check_implementation``): see ``checker.py``."""
    return CheckReply(verdicts=checker.check_outputs(case, command))


def cost(case: CaseRuntime, command: Cost, device: str) -> CostReply:
    """The case's cost at the shape and the physical floor its bytes allow (a bandwidth
    measurement on the device, so under the lease)."""
    try:
        found = speed_of_light.valid_cost(case.cost(command.shape))
    except Exception:  # noqa: BLE001 - said at collection (cases._check_cost); timed without it
        found = None
    if found and found.get("bytes"):
        return CostReply(cost=found, floor=physical_floor.measure(found["bytes"], device))
    return CostReply(cost=found)
