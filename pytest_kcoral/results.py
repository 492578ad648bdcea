"""The record of one graded item: what the pipeline produces and what scoring and reports read.

An ``ItemResult`` travels from an xdist worker to the controller as a plain dict attached to the
test report (``report.kcoral_result``), so every field is JSON-serializable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, overload

# Stages in the order they run; ``done`` means every stage passed.
STAGES = ("compile", "correctness", "timing")
STAGE_DONE = "done"

# Timing methods, best first (section 5 of the spec).
TIMER_METHODS = ("cupti", "events", "wall")


@dataclass
class TimingStats:
    """What one timer measured for one callable (all times in microseconds)."""

    method: str  # "cupti" | "events" | "wall"; a host-bound call keeps its method and sets host_bound
    median_us: float
    iqr_us: float = 0.0
    min_us: float = 0.0
    n: int = 0
    rse: float = 0.0  # relative standard error of the median
    busy_us: float | None = None  # CUPTI: sum of activity durations inside the span
    records: int | None = None  # CUPTI: activity records per call
    host_median_us: float | None = None  # synchronized host wall clock per call
    outside_us: float | None = None  # host time per timed call outside its window (refresh, flush, output drop and check)
    charged_us: float = 0.0  # of that, beyond the baseline's and the slack: added to median_us and min_us (``combine.charge_outside_work``)
    host_bound: bool = False  # host time far above the GPU span: timed by the host clock
    same_work_every_call: bool | None = None  # every timed call launched the same set of kernels
    flags: list[str] = field(default_factory=list)
    rounds: int = 1  # timing rounds timed, interleaved with the other side's
    rounds_dropped: int = 0  # of those, left out with the other side's as a disturbed pair (``combine.undisturbed_pairs``)
    round_medians_us: list[float] | None = None  # each round's median, in time order
    processes: int = 1  # processes it was timed in, one per pair with the other side's (``combine.combine_processes``)
    process_medians_us: list[float] | None = None  # with several: each process's median, in time order
    samples_us: list[float] | None = None  # per timed call, in call order (dropped once merged)
    # once merged: the kept samples' quantiles at 0, 1/64, ..., 1 (four significant digits), for
    # the HTML report's distributions (``combine.sample_quantiles``)
    quantiles_us: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @overload
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimingStats: ...

    @overload
    @classmethod
    def from_dict(cls, data: None) -> None: ...

    @overload
    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TimingStats | None: ...

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TimingStats | None:
        if data is None:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class ItemExtra:
    """What an item's record adds beyond its scored fields: the JSON's ``extra``, where each key
    appears only once it is set (``docs/json-schema.md``)."""

    cpu_threads: int | None = None  # torch CPU threads of the pytest process and the children (``cpu_share``)
    candidate_process: dict[str, int] | None = None  # which process ran the candidate (``pid``), its how-manieth ``item``
    lease: dict[str, Any] | None = None  # the lease's absolute times (``lease.Lease.to_dict``), for the overlap audit
    baseline_problems: list[str] | None = None  # why the baseline is wrong here (``baseline_correct`` false)
    untimed: str | None = None  # why a correct item was not timed (``pipeline.untimed_reason``)
    physical_floor: dict[str, Any] | None = None  # the floor the case's cost allows (``physical_floor.measure``)
    physical_floor_ignored: str | None = None  # why the floor was not applied
    diagnostics: dict[str, dict[str, Any]] | None = None  # ``--kcoral-sanitizer``, ``--kcoral-ncu`` records by tool
    harness_error: bool | None = None  # the harness itself failed on the item
    template_killed: bool | None = None  # the process children are forked from died while the item ran
    service_unavailable: bool | None = None  # the ``--kcoral-url`` service stopped answering: not graded
    remote: dict[str, Any] | None = None  # the KCoral service and programs that ran the item
    # the timed calls the trusted child fed (``calls``) and, of them, those whose outputs it checked
    # (``checked``), per side (``stage_timing.judge_feeds``)
    timed_outputs: dict[str, dict[str, int]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ItemExtra:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# how an item's message begins when the case itself failed (``ItemResult.case_failed``)
CASE_FAILED_PREFIX = "the case itself failed (not the candidate): "


@dataclass
class ItemResult:
    """Outcome of one (case, candidate, shape) item."""

    nodeid: str
    case: str  # case id: the case folder relative to the rootdir, e.g. "cases/vector_add"
    candidate: str  # candidate name, e.g. "triton_v2" or "team-a/attempt1"
    split: str  # "seen" | "unseen"
    shape: dict[str, Any]
    shape_id: str  # e.g. "n=4096"
    tier: int = 1
    team: str | None = None  # submissions only
    attempt: str | None = None  # submissions with several attempts
    # a known answer: "fail" for a candidate under wrong/, "pass" under correct/, else None
    expected: str | None = None
    # the candidate's items in its case, one per shape, whether selected or not (-k, -m, an id)
    candidate_shapes: int | None = None
    # the candidate's file, relative to the rootdir when it lies inside it (``items.KernelItem``)
    candidate_file: str | None = None

    # How far it got: the stage that failed, or "done".
    stage: str = "compile"
    outcome: str = "failed"  # "passed" | "failed" | "skipped"
    compiled: bool = False
    correct: bool | None = None  # None: correctness not reached
    baseline_correct: bool | None = None  # the baseline checked against the reference on this shape
    message: str | None = None  # one screen saying why it failed or was skipped
    # the last lines the candidate's process printed, per stream (``captured_output.record``); None: nothing
    output_tail: dict[str, Any] | None = None
    phase: str | None = None  # phase inside the stage where a process died or timed out
    # the case itself failed here (its import, inputs, reference or baseline), not the candidate; the item
    # still fails: a candidate able to break its case must not escape a grade by doing so
    case_failed: bool = False

    t_baseline_us: float | None = None
    t_candidate_us: float | None = None
    # t_baseline / t_candidate, read pair by pair of rounds taken in turns (``combine.item_speedup``),
    # only between like timing methods
    speedup: float | None = None
    # its confidence interval [low, high] at ``speedup_ci_level`` (``speedup_interval.item_interval``);
    # None without a speedup or with too few timing rounds
    speedup_ci: list[float] | None = None
    speedup_ci_level: float | None = None
    noisy: bool = False  # the interval is wide, or missing beside a speedup (``speedup_interval.judge_noise``)
    noisy_reason: str | None = None  # one line: how wide, and what in the record made it so
    timer: str | None = None  # method of the candidate's timing
    baseline_timing: dict[str, Any] | None = None  # TimingStats.to_dict()
    candidate_timing: dict[str, Any] | None = None
    # achieved rates against the case's ``cost(shape)`` and the GPU's peak (``speed_of_light.report``)
    speed_of_light: dict[str, Any] | None = None

    device: str | None = None  # "cpu" or "cuda:<index into the visible devices>"
    lease_wait_ms: float | None = None
    lease_held_ms: float | None = None
    duration_s: float | None = None
    phases_ms: dict[str, float] = field(default_factory=dict)  # wall time per phase: where an item's time went

    weak_reference: bool | None = None  # zeros or a constant match the reference within tolerance
    suspicious: list[str] = field(default_factory=list)  # static report on the candidate source
    extra: ItemExtra = field(default_factory=ItemExtra)

    def to_dict(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), extra=self.extra.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ItemResult:
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        fields["extra"] = ItemExtra.from_dict(data.get("extra") or {})
        return cls(**fields)


def speedup_between(baseline: TimingStats | None, candidate: TimingStats | None) -> float | None:
    """``t_baseline / t_candidate`` when both were timed by the same method, else None."""
    if baseline is None or candidate is None:
        return None
    if baseline.method != candidate.method or candidate.median_us <= 0:
        return None
    return baseline.median_us / candidate.median_us
