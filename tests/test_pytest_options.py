"""pytest's own options on graded items: ``--lf``, ``--ff``, ``--sw`` keep finding an item by the
id a previous session saved, serially and under xdist."""

from __future__ import annotations

import pytest

GOOD = "def run(a, b):\n    return a + b\n"
WRONG = "def run(a, b):\n    return a - b\n"


@pytest.fixture
def run_cached(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run pytest-kcoral in process with pytest's cache on (``run_kcoral`` turns it off)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest("-p", "kcoral", "--kcoral-mode", "correctness", "cases", *args)

    return run


def test_last_failed_reruns_only_the_items_that_failed(make_case, run_cached):
    make_case("cases/add", candidates={"good": GOOD, "wrong": WRONG})
    run_cached().assert_outcomes(passed=2, failed=2)
    again = run_cached("--lf", "-v")
    again.assert_outcomes(failed=2, deselected=2)
    again.stdout.fnmatch_lines(["*run-last-failure: rerun previous 2 failures*"])
    assert "cases/add::good" not in again.stdout.str()


def test_last_failed_under_xdist_reruns_only_the_items_that_failed(make_case, run_cached):
    pytest.importorskip("xdist")
    make_case("cases/add", candidates={"good": GOOD, "wrong": WRONG})
    run_cached("-n", "2").assert_outcomes(passed=2, failed=2)
    again = run_cached("--lf", "-n", "2", "-v")
    again.assert_outcomes(failed=2)  # (xdist does not report workers' deselections)
    assert "cases/add::good" not in again.stdout.str()


def test_failed_first_runs_the_failures_before_the_rest(make_case, run_cached):
    make_case("cases/add", candidates={"good": GOOD, "wrong": WRONG})
    run_cached().assert_outcomes(passed=2, failed=2)
    again = run_cached("--ff", "-v")
    again.assert_outcomes(passed=2, failed=2)
    again.stdout.fnmatch_lines(["*run-last-failure: rerun previous 2 failures first*"])
    again.stdout.fnmatch_lines([
        "*cases/add::wrong[[]seen-n=256[]] FAILED*",
        "*cases/add::wrong[[]unseen-n=257[]] FAILED*",
        "*cases/add::good[[]seen-n=256[]] PASSED*",
        "*cases/add::good[[]unseen-n=257[]] PASSED*",
    ])


def test_stepwise_stops_at_the_first_failure_and_resumes_there(pytester, make_case, run_cached):
    case = make_case("cases/add", candidates={"good": GOOD, "wrong": WRONG})
    first = run_cached("--sw", "-v")  # items go shape by shape: good, then wrong, on n=256
    first.assert_outcomes(passed=1, failed=1)
    first.stdout.fnmatch_lines(["*Interrupted: Test failed, continuing from this test next run*"])
    (case / "candidates" / "wrong.py").write_text(GOOD)  # the candidate is fixed
    again = run_cached("--sw", "-v")
    again.stdout.fnmatch_lines(["*stepwise: skipping 1 already passed items*"])
    again.assert_outcomes(passed=3, deselected=1)
    assert "cases/add::good[seen-n=256]" not in again.stdout.str()
