"""Run step, the reference: what the case's trusted process computes for a (case, shape) before any
candidate is judged, kept per session in ``ReferenceCache``.

The trusted process makes ``--kcoral-trials`` input sets from seeds derived from the secret
session seed, runs the reference on them, and decides what needs no candidate on the device (is
the baseline right, is the reference weak or unsteady), so those tensors never cross the wire.
The cache also holds the case's cost and physical floor at the shape, measured once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pytest_kcoral.cases import KERNELBENCH
from pytest_kcoral.context import ItemContext, ItemSpec, StageFailed
from pytest_kcoral.failures import case_call
from pytest_kcoral.host_memory import HOST_MEMORY_SHORT, tensor_bytes, total_bytes
from pytest_kcoral.messages import Cost, Reference, Run, RunInputs, ToleranceSpec
from pytest_kcoral.results import CASE_FAILED_PREFIX, ItemResult
from pytest_kcoral.transport import Processes

BASELINE_PROBLEMS_KEPT = 5  # lines of why a baseline is wrong, per item in the JSON


@dataclass
class ReferenceData:
    """What the trusted child computed for one (case, shape, seed, device): shared by candidates."""

    inputs: list[Any]
    reference: list[Any]
    baseline_correct: bool | None  # None: the baseline is the reference, nothing to check
    baseline_problems: list[str] = field(default_factory=list)
    baseline_raised: bool = False  # the baseline raised (or exited) on some trial: it cannot be timed here
    weak: bool = False
    structure: Any = None  # the reference's containers (``child_outputs.flatten_outputs``); None: not known
    # INPLACE inputs the reference writes, and their values after its call, per trial: results a
    # candidate must leave the same (``x.add_(y)``), compared as outputs are
    written_inputs: tuple[int, ...] = ()
    written: list[Any] = field(default_factory=list)
    # (output, input) pairs where the reference returns one of its inputs (``return a.add_(b)``):
    # a candidate's output may share memory with that input too
    output_aliases: tuple[tuple[int, int], ...] = ()
    seeds: list[int] = field(default_factory=list)  # each trial's: a case's checker makes its inputs again
    # one trial's sizes: each input's and output's tensor bytes (0 for a plain value), the written
    # INPLACE inputs' together; all the pytest process knows of the tensors once they are kept
    input_bytes: list[int] = field(default_factory=list)
    output_bytes: list[int] = field(default_factory=list)
    written_bytes: int = 0
    # the trusted child holds the trials on the device, for feeds (``context.Plan.fed``); then
    # ``inputs``, ``reference`` and ``written`` are empty
    kept: bool = False

    def record_into(self, result: ItemResult) -> None:
        """What the reference's side found, known before the candidate runs, into the item."""
        result.baseline_correct = self.baseline_correct
        result.weak_reference = self.weak
        if self.baseline_problems:  # why the baseline is wrong here (``baseline_correct`` false)
            result.extra.baseline_problems = self.baseline_problems[:BASELINE_PROBLEMS_KEPT]


# The physical floor (``physical_floor.measure``) and the case's cost at a shape, either None.
FloorAndCost = tuple[dict[str, Any] | None, dict[str, float] | None]


# The share of the host's memory the references kept for later items may take; beyond it the least
# recently used goes, and is computed again if an item needs it. A session of large problems would
# otherwise hold every reference it made, and leave later items no memory (``host_memory``).
REFERENCE_CACHE_SHARE = 1 / 8
REFERENCE_CACHE_BYTES_UNKNOWN_HOST = 4 << 30  # where the host's memory is not known


class ReferenceCache:
    """The reference data and the cost of each (case, shape) on each device, computed once per
    session, for every candidate of the case, while they fit in ``REFERENCE_CACHE_SHARE`` of the
    host's memory (the latest always kept)."""

    def __init__(self) -> None:
        self._references: OrderedDict[tuple[Any, ...], tuple[ReferenceData, int]] = OrderedDict()  # with its bytes
        total = total_bytes()
        self.max_bytes = int(total * REFERENCE_CACHE_SHARE) if total is not None else REFERENCE_CACHE_BYTES_UNKNOWN_HOST
        self._too_large: dict[tuple[Any, ...], StageFailed] = {}  # shapes refused for the host's memory
        self._costs: dict[tuple[Any, ...], FloorAndCost] = {}

    def reference(self, ctx: ItemContext, processes: Processes) -> ReferenceData:
        """The item's reference data, from the trusted process the first time."""
        case, shape, settings = ctx.spec.case, ctx.spec.shape, ctx.settings
        # the case's id too: a KernelBench model's weights come from an init seed derived from it, so
        # two folders holding the same files have different references
        key = (case.case_id, case.content_hash, shape.split, shape.shape_id, settings.seed, ctx.device, settings.trials)
        cached = self._references.get(key)
        if cached is not None:
            self._references.move_to_end(key)
            return cached[0]
        refused = self._too_large.get(key)
        if refused is not None:  # a fresh exception: one raised again would keep every item's traceback
            raise StageFailed(refused.stage, refused.message, refused.phase, case_failed=True)
        try:
            data = compute_reference(ctx, processes)
        except StageFailed as failure:
            # the next candidates at the shape would make a full trial again, only to be refused
            if failure.case_failed and HOST_MEMORY_SHORT in failure.message:
                self._too_large[key] = failure
            raise
        self._references[key] = data, reference_bytes(data)
        while len(self._references) > 1 and sum(nbytes for _, nbytes in self._references.values()) > self.max_bytes:
            self._references.popitem(last=False)
        return data

    def floor_and_cost(self, ctx: ItemContext, processes: Processes) -> FloorAndCost:
        """The physical floor (a bandwidth measurement, under the lease) and the case's cost at
        the shape, from the trusted process; once per case, shape and device, not per candidate."""
        case, shape = ctx.spec.case, ctx.spec.shape
        key = (case.case_id, case.content_hash, shape.split, shape.shape_id, ctx.device)
        if key not in self._costs:
            reply = case_call(ctx, processes, Cost(shape=shape.params, device=ctx.device), "cost")
            self._costs[key] = (reply.floor, reply.cost)
        return self._costs[key]


def compute_reference(ctx: ItemContext, processes: Processes) -> ReferenceData:
    """Ask the trusted process for the item's reference data; the case's failure when the reference
    answers one input two ways, or gives nothing to compare."""
    case, shape, tol = ctx.spec.case, ctx.spec.shape, ctx.tolerance
    seeds = [ctx.seed(case.case_id, shape.split, shape.shape_id, t) for t in range(ctx.settings.trials)]
    # a KernelBench baseline is the reference module itself: nothing to check
    check_baseline = case.has_baseline and case.format != KERNELBENCH
    reply = case_call(ctx, processes, Reference(
        shape=shape.params, seeds=seeds, device=ctx.device, baseline=check_baseline,
        tolerance=ToleranceSpec(atol=tol.atol, rtol=tol.rtol, strict=tol.strict), inplace=list(case.inplace),
        check_host_memory=True, timed=ctx.timed, keep=ctx.plan.fed,
    ), "reference")
    if reply.unsteady:
        raise StageFailed("correctness", CASE_FAILED_PREFIX + "its reference is not deterministic: a second call on"
                          " the same inputs gave " + "; ".join(reply.unsteady), "reference", case_failed=True)
    data = ReferenceData(
        inputs=reply.payload.inputs,
        reference=reply.payload.reference,
        # None where the baseline is the reference: such shapes stay out of the quadrants
        baseline_correct=not reply.baseline_problems if check_baseline else None,
        baseline_problems=reply.baseline_problems,
        baseline_raised=reply.baseline_raised,
        weak=reply.weak,
        structure=reply.structure,
        written_inputs=tuple(reply.written_inputs),
        written=reply.payload.written,
        output_aliases=tuple((i, j) for i, j in reply.output_aliases),
        seeds=seeds,
        input_bytes=reply.input_bytes,
        output_bytes=reply.output_bytes,
        written_bytes=reply.written_bytes,
        kept=ctx.plan.fed,
    )
    if not data.written_inputs and reply.returns_nothing:
        raise StageFailed("correctness", CASE_FAILED_PREFIX + "its reference returns nothing and writes none of its INPLACE"
                          f" inputs ({list(case.inplace) or 'none listed'}): nothing to compare a candidate against", "reference",
                          case_failed=True)
    return data


def untimed_reason(spec: ItemSpec, ref: ReferenceData) -> str | None:
    """Why a correct item is not timed, or None. A baseline that raises on an unseen shape is the
    quadrants' 'candidate improved' (a kernel-to-kernel task's original kernel that handles some
    shapes only), not a broken case, and there is nothing to time the candidate against. On a seen
    shape it stays the case's failure: no pair of the case could earn its scored speedup."""
    if ref.baseline_raised and spec.shape.split == "unseen":
        return "the baseline raises on this unseen shape, so there is nothing to time the candidate against: " + ref.baseline_problems[0]
    return None


def correctness_run(ctx: ItemContext, ref: ReferenceData) -> Run:
    """The correctness stage's ``run`` command: the candidate's process gets it, and the baseline's
    process the same before it is timed. With the trials kept by the trusted child, the trusted
    child feeds them (``feeding.attach_feed``), and the command carries none."""
    poison = [nbytes for nbytes in ref.output_bytes if nbytes]
    aliases = ref.output_aliases
    if ctx.spec.case.output_buffers_in_inputs:  # any output may be an input: ``stage_correctness.may_write`` judges the writes
        aliases = tuple((i, j) for i in range(len(ref.output_bytes)) for j in range(len(ref.input_bytes)))
    return Run(shape=ctx.spec.shape.params, device=ctx.device, poison_bytes=poison, written_inputs=list(ref.written_inputs),
               allowed_aliases=[list(pair) for pair in aliases], payload=RunInputs(inputs=[] if ref.kept else ref.inputs), fed=ref.kept,
               trials=len(ref.seeds))


def reply_limit(ref: ReferenceData, results: int) -> int:
    """The most tensor bytes a candidate's reply carrying ``results`` results (outputs and in-place
    results, each the size of the reference's) may hold: four times that, and 64 MiB over, so a
    wrong dtype or shape still reads as such; more is a child flooding this process's memory."""
    return 4 * results * result_bytes(ref) + (64 << 20)


def result_bytes(ref: ReferenceData) -> int:
    """Tensor bytes of one result: the reference's outputs and in-place results for one input."""
    return sum(ref.output_bytes) + ref.written_bytes


def item_bytes(ref: ReferenceData) -> int:
    """What one input set and its results (outputs and in-place results) take."""
    return sum(ref.input_bytes) + result_bytes(ref)


def trial_inputs(ctx: ItemContext, ref: ReferenceData, processes: Processes, phase: str) -> list[Any]:
    """Every trial's inputs on the host (for a tool that runs the candidate on them: ``diagnostics``):
    asked of the trusted child again when it keeps them."""
    if not ref.kept:
        return ref.inputs
    shape = ctx.spec.shape
    reply = case_call(ctx, processes, Reference(shape=shape.params, seeds=ref.seeds, device=ctx.device,
                                                written_inputs=list(ref.written_inputs)), phase)
    return reply.payload.inputs


def reference_bytes(ref: ReferenceData) -> int:
    """What ``ref`` holds: every trial's inputs, reference results and in-place results."""
    return sum(tensor_bytes(values) for values in (*ref.inputs, *ref.reference, *ref.written))

