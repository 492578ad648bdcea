"""Scores against hand-computed values (section 6 of the spec)."""

from __future__ import annotations

import math

import pytest

from pytest_kcoral import scoring
from pytest_kcoral.report import fmt_pass_at_k
from pytest_kcoral.results import ItemResult


def item(case="cases/a", candidate="v1", split="seen", shape_id="n=1", *, speedup=None,
         correct=True, compiled=True, baseline_correct=None, outcome=None, tier=1, team=None,
         attempt=None, weak=None, stage=None) -> ItemResult:
    if outcome is None:
        outcome = "passed" if correct else "failed"
    if stage is None:
        stage = "done" if correct else ("correctness" if compiled else "compile")
    return ItemResult(
        nodeid=f"{case}::{candidate}[{split}-{shape_id}]", case=case, candidate=candidate,
        split=split, shape={}, shape_id=shape_id, tier=tier, team=team, attempt=attempt,
        stage=stage, outcome=outcome, compiled=compiled, correct=correct if compiled else None,
        baseline_correct=baseline_correct, speedup=speedup, weak_reference=weak,
    )


# -- formulas ----------------------------------------------------------------------------------


def test_mean_and_geomean():
    assert scoring.mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
    assert scoring.geomean([1.0, 2.0, 4.0]) == pytest.approx(2.0)
    assert scoring.geomean([0.5, 2.0]) == pytest.approx(1.0)
    assert scoring.mean([]) is None
    assert scoring.geomean([]) is None
    assert scoring.geomean([0.0, 1.0]) is None


@pytest.mark.parametrize(("compiled", "correct", "speedup", "expected"), [
    (False, False, None, 0.0),
    (False, True, 2.0, 0.0),  # cannot be correct without compiling: still 0
    (True, False, None, 20.0),
    (True, False, 3.0, 20.0),  # no speed credit when incorrect
    (True, True, None, 120.0),  # correct, timed by different methods
    (True, True, 1.5, 270.0),  # 20 + 100 + 150
    (True, True, 0.5, 170.0),
])
def test_aka_score(compiled, correct, speedup, expected):
    assert scoring.aka_score(compiled, correct, speedup) == pytest.approx(expected)


@pytest.mark.parametrize(("correct", "speedup", "expected"), [
    (False, 3.0, 0.0),
    (True, None, 0.0),
    (True, 0.5, 30.0),  # 60 * 0.5
    (True, 0.99, 59.4),
    (True, 1.0, 60.0),
    (True, 2.0, 70.0),  # 60 + 1/4*40
    (True, 3.0, 80.0),
    (True, 5.0, 100.0),
    (True, 9.0, 100.0),  # capped at 5x
])
def test_bench_lite_score(correct, speedup, expected):
    assert scoring.bench_lite_score(correct, speedup) == pytest.approx(expected)


def test_tier_weights():
    assert [scoring.tier_weight(t) for t in range(1, 6)] == [1.0, 1.5, 2.0, 2.5, 3.0]


def test_generalization_gap():
    assert scoring.generalization_gap(2.0, 1.5) == pytest.approx(0.25)
    assert scoring.generalization_gap(2.0, 3.0) == pytest.approx(-0.5)
    assert scoring.generalization_gap(2.0, None) is None
    assert scoring.generalization_gap(None, 1.0) is None


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (1, 1, 1, 1.0),
    (1, 0, 1, 0.0),
    (4, 1, 1, 0.25),  # 1 - C(3,1)/C(4,1) = 1 - 3/4
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (4, 2, 3, 1.0),  # n - c < k
    (3, 0, 2, 0.0),
    (2, 1, 3, None),  # fewer attempts than k
])
def test_pass_at_k(n, c, k, expected):
    got = scoring.pass_at_k(n, c, k)
    assert got == (pytest.approx(expected) if expected is not None else None)


# -- one pair -------------------------------------------------------------------------------------


def test_candidate_score_full():
    items = [
        item(shape_id="n=1", speedup=1.0),
        item(shape_id="n=2", speedup=3.0),
        item(split="unseen", shape_id="n=3", speedup=2.0, baseline_correct=True),
        item(split="unseen", shape_id="n=4", speedup=0.5, baseline_correct=True),
        # baseline wrong on this unseen shape: its speedup is left out
        item(split="unseen", shape_id="n=5", speedup=9.0, baseline_correct=False),
        item(split="unseen", shape_id="n=6", correct=False, baseline_correct=True),
    ]
    (s,) = scoring.score_candidates(items)
    assert (s.case, s.candidate, s.tier) == ("cases/a", "v1", 1)
    assert s.compiled and s.correct_seen and s.timed_alike
    assert (s.seen_items, s.seen_correct_items) == (2, 2)
    assert s.correct_unseen == {"n=3": True, "n=4": True, "n=5": True, "n=6": False}
    assert s.mean_speedup_seen == pytest.approx(2.0)
    assert s.geomean_speedup_seen == pytest.approx(math.sqrt(3.0))
    assert s.mean_speedup_unseen == pytest.approx(1.25)
    assert s.geomean_speedup_unseen == pytest.approx(1.0)
    assert s.generalization_gap == pytest.approx((2.0 - 1.25) / 2.0)
    assert s.aka_score == pytest.approx(320.0)  # 20 + 100 + 100*2
    assert s.bench_lite == pytest.approx(70.0)
    assert s.bench_lite_weighted == pytest.approx(70.0)
    assert s.scored_speedup == pytest.approx(2.0)
    assert s.failed_stages == {"correctness": 1}


def test_candidate_tier_weighting():
    (s,) = scoring.score_candidates([item(speedup=5.0, tier=3)])
    assert s.bench_lite == pytest.approx(100.0)
    assert s.bench_lite_weighted == pytest.approx(200.0)


def test_candidate_no_unseen_shapes():
    (s,) = scoring.score_candidates([item(speedup=2.0), item(shape_id="n=2", speedup=2.0)])
    assert s.correct_unseen == {}
    assert s.mean_speedup_unseen is None and s.geomean_speedup_unseen is None
    assert s.generalization_gap is None


def test_candidate_incorrect_on_one_seen_shape():
    (s,) = scoring.score_candidates([item(speedup=4.0), item(shape_id="n=2", correct=False)])
    assert s.compiled and not s.correct_seen
    assert s.mean_speedup_seen == pytest.approx(4.0)  # shown, but earns nothing
    assert s.scored_speedup is None
    assert s.aka_score == pytest.approx(20.0)
    assert s.bench_lite == 0.0 and s.bench_lite_weighted == 0.0


def test_candidate_not_compiled():
    (s,) = scoring.score_candidates([item(compiled=False, correct=False),
                                     item(shape_id="n=2", compiled=False, correct=False)])
    assert not s.compiled and not s.correct_seen
    assert s.aka_score == 0.0 and s.bench_lite == 0.0
    assert s.failed_stages == {"compile": 2}


def test_a_compiler_error_on_an_unseen_shape_leaves_the_pair_compiled():
    # a Triton static_assert that fails only at a private unseen shape: the pair compiled and is
    # correct on every seen shape, so AgentKernelArena's compile credit stays (it read 0 before,
    # with the suite's compile rate below its correctness rate); the unseen column shows the miss
    (s,) = scoring.score_candidates([item(speedup=1.5), item(split="unseen", shape_id="n=3", compiled=False, correct=False)])
    assert s.compiled and s.correct_seen and s.correct_unseen == {"n=3": False}
    assert s.aka_score == pytest.approx(270.0)
    # with no seen shape run (-m unseen), the unseen items decide
    (s,) = scoring.score_candidates([item(split="unseen", shape_id="n=3", compiled=False, correct=False)])
    assert not s.compiled


def test_the_quadrants_say_why_they_left_items_out():
    # an unseen item whose case failed before its baseline was checked read as "their baseline is
    # their case's reference", also in a case that has a baseline of its own
    failed = item(split="unseen", shape_id="n=3", correct=False)
    failed.case_failed = True
    reference_is_baseline = item(split="unseen", shape_id="n=5")
    q = scoring.unseen_quadrants([failed])
    assert (q.left_out, q.left_out_case_failed) == (1, 1)
    assert q.note() == "; 1 unseen item(s) left out: their case failed there"
    q = scoring.unseen_quadrants([failed, reference_is_baseline])
    assert q.note() == ("; 2 unseen item(s) left out: 1 as their baseline is their case's reference,"
                        " 1 as their case failed there")
    assert scoring.unseen_quadrants([reference_is_baseline]).note() == "; 1 unseen item(s) left out: their baseline is their case's reference"


def test_candidate_timed_by_different_methods_earns_no_speed_credit():
    # n=2 has no speedup (candidate timed by the host clock, baseline by CUPTI)
    (s,) = scoring.score_candidates([item(speedup=3.0), item(shape_id="n=2", speedup=None)])
    assert s.correct_seen and not s.timed_alike
    assert s.mean_speedup_seen == pytest.approx(3.0)
    assert s.scored_speedup is None
    assert s.aka_score == pytest.approx(120.0)
    assert s.bench_lite == 0.0


def test_skipped_items_are_ignored_and_all_skipped_pairs_excluded():
    items = [
        item(speedup=2.0),
        item(shape_id="big", outcome="skipped", correct=False, compiled=False),  # gpu_only on a CPU
        item(candidate="v2", outcome="skipped", correct=False, compiled=False),
        item(candidate="v2", shape_id="big", outcome="skipped", correct=False, compiled=False),
    ]
    scores = scoring.score(items)
    assert [c.candidate for c in scores.candidates] == ["v1"]
    (s,) = scores.candidates
    assert s.compiled and s.correct_seen and s.seen_items == 1
    assert scores.suite.pairs == 1 and scores.suite.compile_rate == 1.0


def test_only_unseen_items_is_not_correct():
    (s,) = scoring.score_candidates([item(split="unseen", speedup=2.0, baseline_correct=True)])
    assert not s.correct_seen and s.seen_items == 0
    assert s.aka_score == pytest.approx(20.0)
    assert s.mean_speedup_unseen == pytest.approx(2.0)
    assert s.generalization_gap is None


# -- suite ------------------------------------------------------------------------------------------


def suite_items():
    return [
        # v1: correct, 2.0x and 1.0x -> mean 1.5; bench-lite 65
        item(candidate="v1", shape_id="n=1", speedup=2.0),
        item(candidate="v1", shape_id="n=2", speedup=1.0),
        item(candidate="v1", split="unseen", shape_id="n=3", speedup=1.2, baseline_correct=True),
        # v2: correct, 0.5x; bench-lite 30; regressed on an unseen shape
        item(candidate="v2", shape_id="n=1", speedup=0.5),
        item(candidate="v2", shape_id="n=2", speedup=0.5),
        item(candidate="v2", split="unseen", shape_id="n=3", correct=False, baseline_correct=True),
        # v3: compiled, wrong
        item(candidate="v3", shape_id="n=1", correct=False),
        item(candidate="v3", shape_id="n=2", speedup=4.0),
        item(candidate="v3", split="unseen", shape_id="n=3", speedup=1.0, baseline_correct=False),
        # v4: does not compile
        item(candidate="v4", shape_id="n=1", compiled=False, correct=False),
        item(candidate="v4", shape_id="n=2", compiled=False, correct=False),
        item(candidate="v4", split="unseen", shape_id="n=3", compiled=False, correct=False,
             baseline_correct=False),
        # another case, tier 2: w1 correct at 3.0x -> bench-lite 80, weighted 120
        item(case="cases/b", candidate="w1", speedup=3.0, tier=2),
    ]


def test_suite_scores():
    scores = scoring.score(suite_items())
    suite = scores.suite
    assert suite.pairs == 5
    assert suite.compile_rate == pytest.approx(4 / 5)
    assert suite.correctness_rate == pytest.approx(3 / 5)
    # correct pairs' speedups: 1.5, 0.5, 3.0
    assert suite.fast_p == pytest.approx({"0": 3 / 5, "1": 2 / 5, "1.5": 1 / 5, "2": 1 / 5})
    assert suite.mean_speedup == pytest.approx(5.0 / 3)
    assert suite.geomean_speedup == pytest.approx((1.5 * 0.5 * 3.0) ** (1 / 3))
    # gaps: v1 (1.5-1.2)/1.5 = 0.2; v2 has no unseen speedup; v3's unseen baseline failed
    assert suite.mean_generalization_gap == pytest.approx(0.2)
    q = suite.quadrants
    assert (q.both_pass, q.candidate_regressed, q.both_fail, q.candidate_improved) == (1, 1, 1, 1)
    assert suite.conditional_correctness == pytest.approx(0.5)
    assert suite.pass_at_k is None and suite.pass_at_k_by_team_case == []  # one attempt each
    assert suite.bench_lite_total == pytest.approx(65 + 30 + 0 + 0 + 120)


def test_suite_gap_counts_correct_pairs_only():
    items = [
        item(candidate="v1", speedup=2.0),
        item(candidate="v1", split="unseen", shape_id="u", speedup=1.0, baseline_correct=True),
        item(candidate="v2", speedup=4.0),
        item(candidate="v2", shape_id="n=2", correct=False),
        item(candidate="v2", split="unseen", shape_id="u", speedup=1.0, baseline_correct=True),
    ]
    scores = scoring.score(items)
    assert [c.generalization_gap for c in scores.candidates] == pytest.approx([0.5, 0.75])
    assert scores.suite.mean_generalization_gap == pytest.approx(0.5)


def test_suite_nothing_correct():
    suite = scoring.score([item(correct=False), item(candidate="v2", compiled=False, correct=False)]).suite
    assert suite.pairs == 2
    assert suite.compile_rate == pytest.approx(0.5)
    assert suite.correctness_rate == 0.0
    assert suite.fast_p == {"0": 0.0, "1": 0.0, "1.5": 0.0, "2": 0.0}
    assert suite.mean_speedup is None and suite.geomean_speedup is None
    assert suite.mean_generalization_gap is None
    assert suite.conditional_correctness is None
    assert suite.bench_lite_total == 0.0


def test_suite_baseline_fails_on_every_unseen_shape():
    items = [item(speedup=2.0),
             item(split="unseen", shape_id="u1", speedup=5.0, baseline_correct=False),
             item(split="unseen", shape_id="u2", correct=False, baseline_correct=False)]
    scores = scoring.score(items)
    (s,) = scores.candidates
    assert s.mean_speedup_unseen is None and s.generalization_gap is None
    q = scores.suite.quadrants
    assert (q.both_pass, q.candidate_regressed, q.both_fail, q.candidate_improved) == (0, 0, 1, 1)
    assert scores.suite.conditional_correctness is None  # undefined: no baseline passed
    assert scores.cases[0].baseline_failed_shapes == ["u1", "u2"]


def test_empty_input():
    scores = scoring.score([])
    assert scores.candidates == [] and scores.leaderboard == [] and scores.weak_cases == []
    assert scores.cases == []
    suite = scores.suite
    assert suite.pairs == 0
    assert suite.compile_rate is None and suite.correctness_rate is None
    assert suite.fast_p == {"0": None, "1": None, "1.5": None, "2": None}
    assert suite.bench_lite_total == 0.0 and suite.pass_at_k is None
    assert suite.to_dict()["quadrants"]["both_pass"] == 0


def test_pass_at_k_over_attempts():
    def sub(team, case, attempt, ok):
        return item(case=case, candidate=f"{team}/{attempt}", team=team, attempt=attempt,
                    correct=ok, speedup=1.0 if ok else None)

    items = [
        # team-a, case a: 4 attempts, 1 correct; case b: 2 attempts, 2 correct
        sub("team-a", "cases/a", "1", True), sub("team-a", "cases/a", "2", False),
        sub("team-a", "cases/a", "3", False), sub("team-a", "cases/a", "4", False),
        sub("team-a", "cases/b", "1", True), sub("team-a", "cases/b", "2", True),
        # team-b, case a: one attempt, wrong
        sub("team-b", "cases/a", "1", False),
        item(candidate="bundled", speedup=1.0),  # team None: not part of pass@k
    ]
    suite = scoring.score(items).suite
    rows = {(r["team"], r["case"]): r for r in suite.pass_at_k_by_team_case}
    assert set(rows) == {("team-a", "cases/a"), ("team-a", "cases/b"), ("team-b", "cases/a")}
    assert rows[("team-a", "cases/a")]["n"] == 4 and rows[("team-a", "cases/a")]["c"] == 1
    assert rows[("team-a", "cases/a")]["pass_at_k"] == pytest.approx(
        {"1": 0.25, "2": 0.5, "3": 0.75, "4": 1.0})
    assert rows[("team-a", "cases/b")]["pass_at_k"] == pytest.approx({"1": 1.0, "2": 1.0})
    assert rows[("team-b", "cases/a")]["pass_at_k"] == pytest.approx({"1": 0.0})
    # k=1 averages three groups, k=2 two, k=3 and 4 one
    assert suite.pass_at_k == pytest.approx({"1": (0.25 + 1 + 0) / 3, "2": 0.75, "3": 0.75, "4": 1.0})
    assert suite.pass_at_k_groups == {"1": 3, "2": 2, "3": 1, "4": 1}
    # where a mean covers fewer groups than pass@1's, the summary says how many
    assert fmt_pass_at_k(suite) == ["@1 0.42", "@2 0.75 (2 of 3 groups)", "@3 0.75 (1 of 3 groups)", "@4 1.00 (1 of 3 groups)"]


def test_leaderboard_ranks_teams_by_best_attempt():
    items = [
        # team-a: attempts 1.0x and 5.0x on case a -> best 100; case b 2.0x tier 2 -> 70*1.5 = 105
        item(candidate="team-a/1", team="team-a", attempt="1", speedup=1.0),
        item(candidate="team-a/2", team="team-a", attempt="2", speedup=5.0),
        item(case="cases/b", candidate="team-a/1", team="team-a", attempt="1", speedup=2.0, tier=2),
        # team-b: 3.0x on case a -> 80; wrong on case b
        item(candidate="team-b", team="team-b", speedup=3.0),
        item(case="cases/b", candidate="team-b", team="team-b", correct=False, tier=2),
        # bundled: 3.0x on a -> 80; nothing on b
        item(candidate="triton_v1", speedup=3.0),
        item(candidate="triton_v0", correct=False),
    ]
    board = scoring.score(items).leaderboard
    assert [(e.rank, e.team) for e in board] == [(1, "team-a"), (2, "team-b"), (2, None)]
    a, b, bundled = board
    assert a.bench_lite_total == pytest.approx(205.0)
    assert (a.cases, a.cases_correct) == (2, 2)
    assert a.mean_speedup == pytest.approx(3.5)
    assert a.best == {"cases/a": "team-a/2", "cases/b": "team-a/1"}
    assert b.bench_lite_total == pytest.approx(80.0) and (b.cases, b.cases_correct) == (2, 1)
    assert bundled.bench_lite_total == pytest.approx(80.0) and (bundled.cases, bundled.cases_correct) == (1, 1)
    assert bundled.best == {"cases/a": "triton_v1"}


def test_the_best_attempt_of_equal_scores_is_the_one_correct_on_more_unseen_shapes():
    # untimed (--kcoral-mode correctness): both attempts score alike on the seen shapes
    items = [
        item(candidate="a_drops_odd"),
        item(candidate="a_drops_odd", split="unseen", shape_id="n=7", correct=False, baseline_correct=True),
        item(candidate="b_sums"),
        item(candidate="b_sums", split="unseen", shape_id="n=7", baseline_correct=True),
    ]
    (entry,) = scoring.score(items).leaderboard
    assert entry.best == {"cases/a": "b_sums"}


def test_weak_cases_and_case_summaries():
    items = [
        item(shape_id="n=1", speedup=1.0, weak=True),
        item(shape_id="n=2", speedup=1.0, weak=False),
        item(candidate="v2", shape_id="n=1", weak=True, correct=False),
        item(split="unseen", shape_id="n=9", speedup=1.0, baseline_correct=True, weak=True),
        item(case="cases/b", speedup=1.0, weak=None),
        item(case="cases/c", shape_id="big", outcome="skipped", weak=True),  # skipped: not counted
    ]
    scores = scoring.score(items)
    assert [w.to_dict() for w in scores.weak_cases] == [{"case": "cases/a", "shapes": ["n=1", "n=9"]}]
    a, b = scores.cases
    assert a.case == "cases/a" and a.seen_shapes == ["n=1", "n=2"] and a.unseen_shapes == ["n=9"]
    assert (a.candidates, a.candidates_correct) == (2, 1)
    assert a.weak_shapes == ["n=1", "n=9"]
    assert b.case == "cases/b" and b.weak_shapes == []


def test_to_dict_is_json_ready():
    import json

    scores = scoring.score(suite_items())
    json.dumps([c.to_dict() for c in scores.candidates])
    json.dumps(scores.suite.to_dict())
    json.dumps([e.to_dict() for e in scores.leaderboard])


def test_correct_pairs_without_any_timing_have_no_fast_p():
    # --kcoral-mode correctness: "fast_0 0%" would read as "none of them is correct"
    suite = scoring.score([item(), item(candidate="v2")]).suite
    assert suite.correctness_rate == 1.0 and not suite.timed
    assert suite.fast_p == {"0": None, "1": None, "1.5": None, "2": None}
    from pytest_kcoral.report.terminal import suite_lines

    assert "fast_0 - fast_1 - fast_1.5 - fast_2 -  (nothing timed: --kcoral-mode correctness measures no speed)" in suite_lines(scoring.score([item()]))
    timed = scoring.score([item(speedup=2.0), item(candidate="v2")]).suite
    assert timed.timed and timed.fast_p["1"] == pytest.approx(0.5)


def test_an_untimed_run_shows_no_bench_lite_score():
    """bench-lite is earned by speed alone: in a run that timed nothing, 0.0 for a correct pair
    (and a leaderboard of zeros) read as measured and lost. The reports show '-' there."""
    from pytest_kcoral.report.step_summary import render_markdown
    from pytest_kcoral.report.terminal import suite_lines, table_lines

    untimed = scoring.score([item(team="a"), item(candidate="v2", team="b", correct=False)])
    row = table_lines(untimed)[1]
    assert row.split()[-1] == "-", row  # the bench column
    lines = suite_lines(untimed)
    assert "bench-lite total (tier-weighted) -" in lines
    assert [line.split()[2] for line in lines if line.lstrip()[:2] in ("1.", "2.")] == ["-", "-"]  # leaderboard
    markdown = render_markdown(untimed)
    assert "(nothing timed: --kcoral-mode correctness measures no speed)" in markdown
    assert "- bench-lite total (tier-weighted) -" in markdown
    # timed: the figures are shown, 0.0 included
    timed = scoring.score([item(speedup=0.5, team="a"), item(candidate="v2", team="b", correct=False)])
    assert "bench-lite total (tier-weighted) 30.0" in suite_lines(timed)
    assert table_lines(timed)[2].split()[-1] == "0.0"


def test_a_pairs_means_carry_the_range_of_their_items_intervals_and_count_the_noisy():
    def timed(shape_id, split, speedup, ci, noisy=False, **kw):
        it = item(split=split, shape_id=shape_id, speedup=speedup, **kw)
        it.speedup_ci, it.noisy = ci, noisy
        return it

    (pair,) = scoring.score_candidates([
        timed("n=1", "seen", 2.0, [1.8, 2.2]),
        timed("n=2", "seen", 1.0, [0.9, 1.3], noisy=True),
        timed("n=3", "unseen", 1.5, [1.4, 1.6], baseline_correct=True),
        timed("n=4", "unseen", 1.2, None, noisy=True, baseline_correct=True),  # too few rounds for an interval
        timed("n=5", "unseen", 9.0, [8.0, 10.0], noisy=True, baseline_correct=False),  # not behind the unseen mean
    ])
    assert pair.mean_speedup_seen == pytest.approx(1.5)
    assert pair.mean_speedup_seen_range == pytest.approx([1.35, 1.75])
    assert pair.mean_speedup_unseen_range is None  # one item behind the mean has no interval
    assert (pair.noisy_seen, pair.noisy_unseen) == (1, 1)


# -- known answers (wrong/, correct/) ------------------------------------------------------------


def _known(candidate, expected, *outcomes, case_failed=()):
    found = []
    for n, ok in enumerate(outcomes):
        it = item(candidate=candidate, shape_id=f"n={n}", correct=ok, speedup=2.0 if ok else None)
        it.expected = expected
        it.case_failed = n in case_failed
        found.append(it)
    return found


def test_known_wrong_candidates_fail_somewhere_and_stay_out_of_the_suite_and_leaderboard():
    items = (_known("good", None, True, True) + _known("wrong/partial", "fail", True, False)
             + _known("wrong/planted", "fail", True, True) + _known("correct/ref", "pass", True, False))
    scores = scoring.score(items)
    answers = scores.known_answers
    assert (answers.expected_fail, answers.failed_as_expected) == (2, 1)  # wrong on one shape is wrong
    assert (answers.expected_pass, answers.passed_as_expected) == (1, 0)
    assert [(u["candidate"], u["expected"], u["failed_items"]) for u in answers.unexpected] == [
        ("correct/ref", "pass", 1), ("wrong/planted", "fail", 0)]
    assert [u["candidate"] for u in answers.unexpected_passes] == ["wrong/planted"]
    # every pair has a row; the suite and the leaderboard count the entries only
    assert {c.candidate for c in scores.candidates} == {"good", "wrong/partial", "wrong/planted", "correct/ref"}
    assert scores.suite.pairs == 2 and scores.suite.correctness_rate == 0.5
    assert scores.leaderboard[0].best == {"cases/a": "good"}


def test_a_known_wrong_candidate_with_shapes_left_unrun_is_undecided():
    few = _known("wrong/x", "fail", True, True)
    for it in few:
        it.candidate_shapes = 3
    answers = scoring.known_answers(few)
    assert answers.expected_fail == 0 and not answers.unexpected
    assert answers.undecided == [{"case": "cases/a", "candidate": "wrong/x", "items": 2, "shapes": 3}]
    for it in few:
        it.candidate_shapes = 2
    assert [u["candidate"] for u in scoring.known_answers(few).unexpected_passes] == ["wrong/x"]


def test_a_known_wrong_candidate_whose_case_failed_is_not_judged():
    answers = scoring.known_answers(_known("wrong/x", "fail", False, False, case_failed=(0, 1)))
    assert answers.expected_fail == 0 and not answers.unexpected
