"""Scores computed from the graded items: per (case, candidate) pair, per suite, per team.

Pure functions over a list of ``ItemResult`` (section 6 of the spec); no pytest, no torch, so
reports, the JSON artifact and ``--kcoral-compare`` all read the same numbers.

Rules that hold everywhere:

- skipped items (``outcome == "skipped"``, e.g. ``gpu_only`` shapes on a CPU) are ignored, and a
  pair whose items were all skipped is left out;
- a pair is *correct* when it has at least one seen item and every seen item is correct;
- speed credit (AgentKernelArena, bench-lite, fast_p, suite speedups, leaderboard) needs a
  speedup on every seen item: a speedup is only computed between like timing methods, and a
  candidate must not earn credit by getting its slow shapes timed differently;
- known-wrong candidates (under a ``wrong/`` folder: ``expected == "fail"``) are a check of the
  case, not entries: they are scored per pair, and left out of the suite, the quadrants, pass@k
  and the leaderboard; ``known_answers`` says whether each known answer came out as expected.
"""

from __future__ import annotations

import math
import posixpath
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_kcoral.combine import host_set_side
from pytest_kcoral.findings import (
    FailedCase,
    KnownAnswers,
    SkippedCandidate,
    TimerUse,
    WeakCase,
    WrongBaseline,
    by_pair,
    failed_cases,
    graded,
    known_answers,
    skipped_candidates,
    timer_use,
    weak_cases,
    wrong_baselines,
)
from pytest_kcoral.results import ItemResult
from pytest_kcoral.speed_of_light import largest_shape
from pytest_kcoral.speedup_interval import mean_of_intervals

TIER_WEIGHTS = {1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5, 5: 3.0}
FAST_P_THRESHOLDS = (0.0, 1.0, 1.5, 2.0)


# -- formulas ---------------------------------------------------------------------------------


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean; None for no values or a non-positive one (speedups are always positive)."""
    if not values or any(v <= 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def tier_weight(tier: int) -> float:
    return TIER_WEIGHTS.get(tier, 1.0)


def aka_score(compiled: bool, correct: bool, speedup: float | None) -> float:
    """AgentKernelArena: 0 not compiled; 20 compiled; +100 correct; +100 x speedup when correct
    and timed alike (``speedup`` is None when any seen item lacks a like-for-like speedup)."""
    if not compiled:
        return 0.0
    score = 20.0
    if correct:
        score += 100.0
        if speedup is not None:
            score += 100.0 * speedup
    return score


def bench_lite_score(correct: bool, speedup: float | None) -> float:
    """0 if incorrect or without a comparable speedup; 60*s below 1x; 60..100 from 1x to 5x."""
    if not correct or speedup is None:
        return 0.0
    if speedup < 1.0:
        return 60.0 * speedup
    return 60.0 + min(speedup - 1.0, 4.0) / 4.0 * 40.0


def generalization_gap(mean_seen: float | None, mean_unseen: float | None) -> float | None:
    """``(mean_seen - mean_unseen) / mean_seen``: positive when unseen shapes run slower."""
    if mean_seen is None or mean_unseen is None or mean_seen == 0:
        return None
    return (mean_seen - mean_unseen) / mean_seen


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Unbiased pass@k, ``1 - C(n-c, k) / C(n, k)``, from n attempts of which c are correct.

    None when fewer than k attempts were made.
    """
    if k < 1 or n < k:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# -- records ----------------------------------------------------------------------------------


@dataclass
class CandidateScore:
    """One (case, candidate) pair."""

    case: str
    candidate: str
    team: str | None
    attempt: str | None
    tier: int
    compiled: bool
    correct_seen: bool  # correct on every seen shape (and at least one seen shape ran)
    seen_items: int
    seen_correct_items: int
    correct_unseen: dict[str, bool]  # shape_id -> correct
    mean_speedup_seen: float | None  # over seen items with a speedup
    geomean_speedup_seen: float | None
    mean_speedup_unseen: float | None  # over unseen items where baseline and candidate are correct
    geomean_speedup_unseen: float | None
    timed_alike: bool  # every seen item has a speedup (both timed by one method)
    aka_score: float
    bench_lite: float
    bench_lite_weighted: float
    generalization_gap: float | None
    failed_stages: dict[str, int] = field(default_factory=dict)  # stage -> failed items
    # items behind each mean speedup whose baseline or candidate was launch- or host-bound: the
    # host's speed sets part of those speedups (``host_set``)
    host_set_seen: int = 0
    host_set_unseen: int = 0
    # the mean of the intervals' bounds of the items behind each mean speedup, None when one has
    # no interval: where the mean lies if every item's speedup lies in its interval, not an
    # interval at a level (``speedup_interval.mean_of_intervals``)
    mean_speedup_seen_range: list[float] | None = None
    mean_speedup_unseen_range: list[float] | None = None
    # items behind each mean speedup marked noisy (``ItemResult.noisy``)
    noisy_seen: int = 0
    noisy_unseen: int = 0
    # achieved rates on the largest correct seen shape, when the case declares cost(shape)
    # (``speed_of_light.largest_shape``)
    speed_of_light: dict[str, Any] | None = None
    expected: str | None = None  # a known answer: "fail" (wrong/), "pass" (correct/), or None
    folder: str | None = None  # the folder of the candidate's file (``ItemResult.candidate_file``)

    @property
    def key(self) -> tuple[str, str]:
        return (self.case, self.candidate)

    @property
    def scored_speedup(self) -> float | None:
        """The speedup that earns credit: the seen mean, only when correct and timed alike."""
        if self.correct_seen and self.timed_alike:
            return self.mean_speedup_seen
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["scored_speedup"] = self.scored_speedup
        return d


@dataclass
class Quadrants:
    """Unseen items with a known baseline verdict, by (baseline, candidate) correctness."""

    both_pass: int = 0
    candidate_regressed: int = 0  # baseline correct, candidate wrong
    both_fail: int = 0
    candidate_improved: int = 0  # baseline wrong, candidate correct
    # unseen items with no baseline verdict (``baseline_correct`` None), left out; counted so the
    # summary can say how much of the suite the figure covers. Most have the case's reference for a
    # baseline (correct by definition); the others' case failed there before its baseline was checked
    left_out: int = 0
    left_out_case_failed: int = 0  # of ``left_out``

    def note(self) -> str:
        """What the figure leaves out, and why, for the summary's quadrants line ('' when nothing)."""
        if not self.left_out:
            return ""
        reasons = {"their baseline is their case's reference": self.left_out - self.left_out_case_failed,
                   "their case failed there": self.left_out_case_failed}
        given = [(why, n) for why, n in reasons.items() if n]
        if len(given) == 1:
            return f"; {self.left_out} unseen item(s) left out: {given[0][0]}"
        return f"; {self.left_out} unseen item(s) left out: " + ", ".join(f"{n} as {why}" for why, n in given)

    @property
    def conditional_correctness(self) -> float | None:
        """P(candidate correct | baseline correct)."""
        baseline_ok = self.both_pass + self.candidate_regressed
        return self.both_pass / baseline_ok if baseline_ok else None


@dataclass
class SuiteScore:
    pairs: int
    compile_rate: float | None
    correctness_rate: float | None
    fast_p: dict[str, float | None]  # "0", "1", "1.5", "2" -> share of all pairs
    mean_speedup: float | None  # over correct pairs with a scored speedup
    geomean_speedup: float | None
    mean_generalization_gap: float | None  # over correct pairs with a gap
    conditional_correctness: float | None
    quadrants: Quadrants
    pass_at_k: dict[str, float] | None  # "1", "2", ... -> mean over (team, case); None: one attempt
    pass_at_k_by_team_case: list[dict[str, Any]]
    bench_lite_total: float  # weighted, summed over every pair
    # "1", "2", ... -> how many (team, case) groups made k attempts or more: the groups each mean covers
    pass_at_k_groups: dict[str, int] | None = None
    # some item was timed: False in --kcoral-mode correctness, where speed is not measured at all
    timed: bool = True

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["quadrants"] = asdict(self.quadrants)
        return d


@dataclass
class LeaderboardEntry:
    rank: int
    team: str | None  # None: the bundled candidates
    bench_lite_total: float  # weighted; best attempt per case
    cases: int
    cases_correct: int
    mean_speedup: float | None  # over the counted correct attempts with a scored speedup
    best: dict[str, str]  # case -> candidate counted
    # the folder of the counted candidates' files, ``*`` where they differ (``folder_pattern``)
    folder: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CaseSummary:
    case: str
    tier: int
    seen_shapes: list[str]
    unseen_shapes: list[str]
    candidates: int
    candidates_correct: int
    baseline_failed_shapes: list[str]
    weak_shapes: list[str]
    case_failed_shapes: list[str] = field(default_factory=list)  # shapes on which the case itself failed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Scores:
    """Everything the reports need."""

    candidates: list[CandidateScore]
    suite: SuiteScore
    leaderboard: list[LeaderboardEntry]
    weak_cases: list[WeakCase]
    cases: list[CaseSummary]
    timers: TimerUse
    failed_cases: list[FailedCase] = field(default_factory=list)
    wrong_baselines: list[WrongBaseline] = field(default_factory=list)
    timed_items: list[ItemResult] = field(default_factory=list)  # items timed, by nodeid: their times and intervals
    known_answers: KnownAnswers = field(default_factory=KnownAnswers)
    skipped_candidates: list[SkippedCandidate] = field(default_factory=list)


# -- computation ------------------------------------------------------------------------------


def _baseline_ok(item: ItemResult) -> bool:
    # None means the pipeline did not check the baseline separately (it is the reference itself).
    return item.baseline_correct is not False


def host_set(item: ItemResult) -> bool:
    """Whether the host's speed sets part of the item's speedup: on its baseline's or its
    candidate's side (``combine.host_set_side``)."""
    return any(host_set_side(side) for side in (item.baseline_timing or {}, item.candidate_timing or {}))


def score_candidate(items: Sequence[ItemResult]) -> CandidateScore | None:
    """Score the items of one (case, candidate) pair; None when all of them were skipped."""
    items = graded(items)
    if not items:
        return None
    first = items[0]
    seen = [it for it in items if it.split == "seen"]
    unseen = [it for it in items if it.split == "unseen"]
    # over the seen shapes, as correctness is: a compiler error on a private unseen shape (a
    # Triton static_assert) shows in the unseen column, and never makes a pair read compiled
    # 'no' and correct 'yes' (all items when none of the seen shapes ran: -m unseen)
    compiled = all(it.compiled for it in (seen or items))
    correct_seen = bool(seen) and all(it.correct is True for it in seen)

    seen_timed = [it for it in seen if it.correct is True and it.speedup is not None]
    seen_speedups = [it.speedup for it in seen_timed if it.speedup is not None]
    timed_alike = bool(seen) and all(it.speedup is not None for it in seen)
    unseen_timed = [it for it in unseen if it.correct is True and _baseline_ok(it) and it.speedup is not None]
    unseen_speedups = [it.speedup for it in unseen_timed if it.speedup is not None]
    mean_seen = mean(seen_speedups)
    mean_unseen = mean(unseen_speedups)
    credited = mean_seen if (correct_seen and timed_alike) else None
    bench_lite = bench_lite_score(correct_seen, credited)
    failed_stages: dict[str, int] = defaultdict(int)
    for it in items:
        if it.outcome == "failed":
            failed_stages[it.stage] += 1
    return CandidateScore(
        case=first.case,
        candidate=first.candidate,
        team=first.team,
        attempt=first.attempt,
        tier=first.tier,
        compiled=compiled,
        correct_seen=correct_seen,
        seen_items=len(seen),
        seen_correct_items=sum(1 for it in seen if it.correct is True),
        correct_unseen={it.shape_id: it.correct is True for it in unseen},
        mean_speedup_seen=mean_seen,
        geomean_speedup_seen=geomean(seen_speedups),
        mean_speedup_unseen=mean_unseen,
        geomean_speedup_unseen=geomean(unseen_speedups),
        timed_alike=timed_alike,
        aka_score=aka_score(compiled, correct_seen, credited),
        bench_lite=bench_lite,
        bench_lite_weighted=bench_lite * tier_weight(first.tier),
        generalization_gap=generalization_gap(mean_seen, mean_unseen),
        failed_stages=dict(failed_stages),
        host_set_seen=sum(1 for it in seen_timed if host_set(it)),
        host_set_unseen=sum(1 for it in unseen_timed if host_set(it)),
        mean_speedup_seen_range=mean_of_intervals([it.speedup_ci for it in seen_timed]),
        mean_speedup_unseen_range=mean_of_intervals([it.speedup_ci for it in unseen_timed]),
        noisy_seen=sum(1 for it in seen_timed if it.noisy),
        noisy_unseen=sum(1 for it in unseen_timed if it.noisy),
        speed_of_light=largest_shape(items),
        expected=first.expected,
        folder=posixpath.dirname(first.candidate_file) if first.candidate_file else None,
    )


def score_candidates(items: Iterable[ItemResult]) -> list[CandidateScore]:
    """One score per (case, candidate) pair, sorted by case then candidate."""
    scores = [score_candidate(its) for its in by_pair(items).values()]
    return [s for s in scores if s is not None]


def unseen_quadrants(items: Iterable[ItemResult]) -> Quadrants:
    """Unseen items whose baseline was checked, sorted into the four quadrants (and the others counted)."""
    q = Quadrants()
    for it in graded(items):
        if it.split != "unseen":
            continue
        if it.baseline_correct is None:
            q.left_out += 1
            q.left_out_case_failed += it.case_failed
            continue
        # A candidate that failed to compile is wrong on that shape too.
        candidate_ok = it.correct is True
        if it.baseline_correct and candidate_ok:
            q.both_pass += 1
        elif it.baseline_correct:
            q.candidate_regressed += 1
        elif candidate_ok:
            q.candidate_improved += 1
        else:
            q.both_fail += 1
    return q


def pass_at_k_table(candidates: Sequence[CandidateScore]) -> tuple[dict[str, float] | None, list[dict[str, Any]], dict[str, int] | None]:
    """pass@k averaged, per (team, case), and how many groups each average covers, for k = 1 ..
    the most attempts any team made.

    Only submissions (team not None) count; None when no team made several attempts of a case.
    The average for k covers the (team, case) groups with at least k attempts, so with groups of
    unequal attempts it can fall as k grows: the counts say over how many groups.
    """
    groups: dict[tuple[str, str], list[CandidateScore]] = defaultdict(list)
    for c in candidates:
        if c.team is not None:
            groups[(c.team, c.case)].append(c)
    if not groups or max(len(g) for g in groups.values()) < 2:
        return None, [], None
    max_n = max(len(g) for g in groups.values())
    rows = []
    per_k: dict[int, list[float]] = defaultdict(list)
    for (team, case), group in sorted(groups.items()):
        n = len(group)
        correct = sum(1 for s in group if s.correct_seen)
        values = {}
        for k in range(1, max_n + 1):
            p = pass_at_k(n, correct, k)
            if p is not None:
                values[str(k)] = p
                per_k[k].append(p)
        rows.append({"team": team, "case": case, "n": n, "c": correct, "pass_at_k": values})
    averaged = {str(k): sum(v) / len(v) for k, v in sorted(per_k.items())}
    return averaged, rows, {str(k): len(v) for k, v in sorted(per_k.items())}


def score_suite(candidates: Sequence[CandidateScore], items: Iterable[ItemResult]) -> SuiteScore:
    items = list(items)
    n = len(candidates)
    correct = [c for c in candidates if c.correct_seen]
    speedups = [c.scored_speedup for c in correct if c.scored_speedup is not None]
    # A gap says how a working kernel generalizes; an incorrect pair's speedups earn nothing.
    gaps = [c.generalization_gap for c in correct if c.generalization_gap is not None]
    # correct pairs and not one item timed: the run measured no speed (correctness mode), and
    # "fast_0 0%" would read as "none of them is correct"
    timed = any(it.t_candidate_us is not None or it.speedup is not None or it.stage == "timing" for it in items)
    fast_p = {
        f"{p:g}": (sum(1 for s in speedups if s > p) / n if n and (timed or not correct) else None) for p in FAST_P_THRESHOLDS
    }
    quadrants = unseen_quadrants(items)
    averaged, rows, groups = pass_at_k_table(candidates)
    return SuiteScore(
        pairs=n,
        compile_rate=sum(1 for c in candidates if c.compiled) / n if n else None,
        correctness_rate=len(correct) / n if n else None,
        fast_p=fast_p,
        mean_speedup=mean(speedups),
        geomean_speedup=geomean(speedups),
        mean_generalization_gap=mean(gaps),
        conditional_correctness=quadrants.conditional_correctness,
        quadrants=quadrants,
        pass_at_k=averaged,
        pass_at_k_by_team_case=rows,
        pass_at_k_groups=groups,
        bench_lite_total=sum(c.bench_lite_weighted for c in candidates),
        timed=timed,
    )


def _attempt_rank(c: CandidateScore) -> tuple:
    """A team's better attempt at a case ranks higher: by bench-lite, then correct on every seen
    shape, then on more unseen shapes (untimed attempts tie on the first two), then by speedup."""
    return (c.bench_lite_weighted, c.correct_seen, sum(c.correct_unseen.values()), c.scored_speedup or 0.0, c.compiled)


def leaderboard(candidates: Sequence[CandidateScore]) -> list[LeaderboardEntry]:
    """Teams ranked by weighted bench-lite total, counting each team's best attempt per case.

    The bundled candidates form the team None; several bundled candidates of one case count as
    attempts of it. Ties share a rank (1, 2, 2, 4).
    """
    best: dict[str | None, dict[str, CandidateScore]] = defaultdict(dict)
    for c in candidates:
        held = best[c.team].get(c.case)
        if held is None or _attempt_rank(c) > _attempt_rank(held):
            best[c.team][c.case] = c
    entries = []
    for team, per_case in best.items():
        counted = list(per_case.values())
        speedups = [c.scored_speedup for c in counted if c.scored_speedup is not None]
        entries.append(LeaderboardEntry(
            rank=0,
            team=team,
            bench_lite_total=sum(c.bench_lite_weighted for c in counted),
            cases=len(counted),
            cases_correct=sum(1 for c in counted if c.correct_seen),
            mean_speedup=mean(speedups),
            best={case: c.candidate for case, c in sorted(per_case.items())},
            folder=folder_pattern([c.folder for c in counted]),
        ))

    def order(e: LeaderboardEntry) -> tuple:
        return (-e.bench_lite_total, -e.cases_correct, -(e.mean_speedup or 0.0))

    entries.sort(key=lambda e: (order(e), e.team is None, e.team or ""))
    for i, e in enumerate(entries):
        e.rank = entries[i - 1].rank if i and order(entries[i - 1]) == order(e) else i + 1
    return entries


def folder_pattern(folders: Sequence[str | None]) -> str | None:
    """One name for several folders: ``cases/*/candidates`` for ``cases/add/candidates`` and
    ``cases/mul/candidates``; their common part and ``**`` when their depths differ. None when
    some folder is not known."""
    known = sorted({f for f in folders if f is not None})
    if not folders or len(known) < len(set(folders)):
        return None
    parts = [f.split("/") for f in known]
    if len({len(p) for p in parts}) == 1:
        return "/".join(names[0] if len(set(names)) == 1 else "*" for names in zip(*parts))
    common = posixpath.commonpath(known)
    return posixpath.join(common, "**") if common else "**"


def case_summaries(candidates: Sequence[CandidateScore], items: Iterable[ItemResult]) -> list[CaseSummary]:
    items = graded(items)
    by_case: dict[str, list[ItemResult]] = defaultdict(list)
    for it in items:
        by_case[it.case].append(it)
    weak = {w.case: w.shapes for w in weak_cases(items)}
    out = []
    for case, its in sorted(by_case.items()):
        pairs = [c for c in candidates if c.case == case]
        out.append(CaseSummary(
            case=case,
            tier=its[0].tier,
            seen_shapes=sorted({it.shape_id for it in its if it.split == "seen"}),
            unseen_shapes=sorted({it.shape_id for it in its if it.split == "unseen"}),
            candidates=len(pairs),
            candidates_correct=sum(1 for c in pairs if c.correct_seen),
            baseline_failed_shapes=sorted({it.shape_id for it in its if it.baseline_correct is False}),
            weak_shapes=weak.get(case, []),
            case_failed_shapes=sorted({it.shape_id for it in its if it.case_failed}),
        ))
    return out


def score(items: Sequence[ItemResult]) -> Scores:
    """All scores of one session. Known-wrong candidates are scored per pair and left out of
    everything summed over pairs (the suite, pass@k, the leaderboard, the case summaries)."""
    candidates = score_candidates(items)
    entries = [c for c in candidates if c.expected != "fail"]
    entry_items = [it for it in items if it.expected != "fail"]
    return Scores(
        candidates=candidates,
        suite=score_suite(entries, entry_items),
        leaderboard=leaderboard(entries),
        weak_cases=weak_cases(items),
        cases=case_summaries(entries, entry_items),
        timers=timer_use(items),
        failed_cases=failed_cases(items),
        wrong_baselines=wrong_baselines(items),
        timed_items=sorted((it for it in graded(items) if it.speedup is not None or it.t_candidate_us is not None), key=lambda it: it.nodeid),
        known_answers=known_answers(items),
        skipped_candidates=skipped_candidates(items),
    )
