"""Score step, beyond the scores: what a session found about its cases and its timing.

Cases whose reference is weak, cases that failed by themselves, baselines that disagree with
their reference, how the items were timed (and why any fell back from CUPTI), and whether the
candidates with a known answer came out as expected. The summary, the JSON and the step summary
report them (``report/``); ``scoring.score`` gathers them with the scores.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_kcoral.results import CASE_FAILED_PREFIX, ItemResult
from pytest_kcoral.timing_flags import Flag, notes


@dataclass
class WeakCase:
    case: str
    shapes: list[str]  # shape_ids whose reference zeros or a constant would match

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SkippedCandidate:
    """A candidate every item of which skipped (code that needs CUDA on a machine without one, a
    ``gpu_only`` shape): the scores leave it out, so the summary names it."""

    case: str
    candidate: str
    items: int
    reason: str  # the first item's reason

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TimerUse:
    """How the session's items were timed. A GPU timed by CUDA events instead of CUPTI reads a
    small kernel's launch overhead as kernel time: the summary names the reason (most often
    cupti-python not installed), so such speedups are not taken for CUPTI's."""

    methods: dict[str, int]  # candidate timing method -> items
    fallbacks: dict[str, int]  # why CUPTI was not used -> items that fell back to events

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FailedCase:
    """A case that failed by itself on some shapes: every candidate fails there alike."""

    case: str
    shapes: list[str]  # "seen n=8", "unseen n=9"
    reason: str  # the first shape's failure's first line (seen shapes first)
    # a case can fail one way on some shapes and another way on others: each other reason, with
    # the shapes it was the reason on, [{"reason", "shapes"}]
    other_reasons: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WrongBaseline:
    """A case whose baseline disagrees with its reference on some shapes (``baseline_correct``
    false): it is timed all the same, so the speedups there compare against code that computes
    something else, and seen ones still earn their credit."""

    case: str
    shapes: list[str]  # "seen n=8", "unseen n=9"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class KnownAnswers:
    """Candidates whose answer is known (``wrong/``, ``correct/``) and whether they came out so:
    a known-wrong one must fail somewhere (a wrong solution may be right on some shapes), a
    known-correct one everywhere. ``unexpected`` lists the others: a known-wrong candidate that
    passed every item (pytest's XPASS(strict), which fails the session) or a known-correct one
    that failed an item. ``undecided`` lists known-wrong candidates that passed every item run
    while some of their items did not run (-k, -m, a node id): the shape it fails may be among them."""

    expected_fail: int = 0
    failed_as_expected: int = 0
    expected_pass: int = 0
    passed_as_expected: int = 0
    # {"case", "candidate", "expected", "items", "failed_items"}
    unexpected: list[dict[str, Any]] = field(default_factory=list)
    # {"case", "candidate", "items", "shapes"}: known-wrong, passed the items run, not all run
    undecided: list[dict[str, Any]] = field(default_factory=list)

    @property
    def unexpected_passes(self) -> list[dict[str, Any]]:
        return [u for u in self.unexpected if u["expected"] == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def graded(items: Iterable[ItemResult]) -> list[ItemResult]:
    """The items that count: everything but skips, and items the grading service (``--kcoral-url``)
    stopped answering for, which were never graded."""
    return [it for it in items if it.outcome != "skipped" and not it.extra.service_unavailable]


def weak_cases(items: Iterable[ItemResult]) -> list[WeakCase]:
    """Cases whose reference output zeros or a constant would match on some shape."""
    shapes: dict[str, set[str]] = defaultdict(set)
    for it in graded(items):
        if it.weak_reference is True:
            shapes[it.case].add(it.shape_id)
    return [WeakCase(case, sorted(s)) for case, s in sorted(shapes.items())]


def failed_cases(items: Iterable[ItemResult]) -> list[FailedCase]:
    """Cases that failed by themselves (``ItemResult.case_failed``), with their shapes and each
    shape's reason (its first item's), the prefix that says whose failure it is left out. Shapes
    that failed for the same reason are named together."""
    by_case: dict[str, list[ItemResult]] = defaultdict(list)
    for it in graded(items):
        if it.case_failed:
            by_case[it.case].append(it)
    out = []
    for case, its in sorted(by_case.items()):
        first_per_shape: dict[tuple[bool, str], ItemResult] = {}
        for it in its:
            first_per_shape.setdefault((it.split != "seen", it.shape_id), it)
        by_reason: dict[str, list[ItemResult]] = defaultdict(list)
        for key in sorted(first_per_shape):
            it = first_per_shape[key]
            by_reason[(it.message or "").split("\n", 1)[0].removeprefix(CASE_FAILED_PREFIX)].append(it)
        (reason, _), *others = by_reason.items()
        out.append(FailedCase(case, _split_shapes(its), reason, [{"reason": r, "shapes": _split_shapes(s)} for r, s in others]))
    return out


def by_pair(items: Iterable[ItemResult]) -> dict[tuple[str, str], list[ItemResult]]:
    """The items of each (case, candidate) pair, the pairs in order."""
    groups: dict[tuple[str, str], list[ItemResult]] = defaultdict(list)
    for it in items:
        groups[(it.case, it.candidate)].append(it)
    return dict(sorted(groups.items()))


def skipped_candidates(items: Iterable[ItemResult]) -> list[SkippedCandidate]:
    """The (case, candidate) pairs whose items all skipped, by case and candidate."""
    return [SkippedCandidate(case, candidate, len(its), (its[0].message or "skipped").split("\n", 1)[0])
            for (case, candidate), its in by_pair(items).items() if all(it.outcome == "skipped" for it in its)]


def _split_shapes(items: Iterable[ItemResult]) -> list[str]:
    """``seen n=8``, ``unseen n=9``: each shape once, seen shapes first."""
    shapes = sorted({(it.split != "seen", it.shape_id) for it in items})
    return [f"{'unseen' if unseen else 'seen'} {shape}" for unseen, shape in shapes]


def wrong_baselines(items: Iterable[ItemResult]) -> list[WrongBaseline]:
    """Cases whose baseline disagrees with the reference (``baseline_correct`` false), with those
    shapes. Items of a case that failed by itself there are left out: ``failed_cases`` names them
    with the reason, and they have no speedup to warn about."""
    by_case: dict[str, list[ItemResult]] = defaultdict(list)
    for it in graded(items):
        if it.baseline_correct is False and not it.case_failed:
            by_case[it.case].append(it)
    return [WrongBaseline(case, _split_shapes(its)) for case, its in sorted(by_case.items())]


def timer_use(items: Iterable[ItemResult]) -> TimerUse:
    """Items per timing method, and the reasons for any fallback from CUPTI to events."""
    methods: Counter[str] = Counter()
    fallbacks: Counter[str] = Counter()
    for it in items:
        if it.timer:
            methods[it.timer] += 1
        sides = (it.baseline_timing or {}, it.candidate_timing or {})
        reasons = {reason for side in sides for reason in notes(side.get("flags", []), Flag.FALLBACK_TO_EVENTS)}
        for reason in reasons:
            fallbacks[reason] += 1
    return TimerUse(dict(sorted(methods.items())), dict(fallbacks.most_common()))


def known_answers(items: Iterable[ItemResult]) -> KnownAnswers:
    """Whether each candidate with a known answer came out as expected (``KnownAnswers``). Items
    where the case failed by itself say nothing about a known-wrong candidate."""
    groups: dict[tuple[str, str], list[ItemResult]] = defaultdict(list)
    ran: dict[tuple[str, str], int] = defaultdict(int)  # skipped items too: they were selected
    items = list(items)
    for it in items:
        ran[(it.case, it.candidate)] += 1
    for it in graded(items):
        if it.expected in ("fail", "pass"):
            groups[(it.case, it.candidate)].append(it)
    answers = KnownAnswers()
    for (case, candidate), its in sorted(groups.items()):
        expected = its[0].expected
        failed = [it for it in its if it.outcome == "failed"]
        row = {"case": case, "candidate": candidate, "expected": expected, "items": len(its), "failed_items": len(failed)}
        if expected == "fail":
            own = [it for it in failed if not it.case_failed]
            if len(own) < len(failed) and not own:
                continue  # only its case failed: nothing said about the candidate
            shapes = its[0].candidate_shapes
            if not own and shapes is not None and ran[(case, candidate)] < shapes:
                answers.undecided.append({"case": case, "candidate": candidate, "items": len(its), "shapes": shapes})
                continue
            answers.expected_fail += 1
            if own:
                answers.failed_as_expected += 1
            else:
                answers.unexpected.append(row)
        else:
            answers.expected_pass += 1
            if failed:
                answers.unexpected.append(row)
            else:
                answers.passed_as_expected += 1
    return answers
