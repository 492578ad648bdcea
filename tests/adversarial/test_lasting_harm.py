"""Same user, no confinement: attacks whose harm outlives their item. A candidate replaces the
lease's lock file with a directory, or turns the JSON report's path into one. The harness repairs
the first and saves the report beside the second; under Landlock (``confine.py``) neither write
happens at all."""

from __future__ import annotations

import json

import pytest

from pytest_kcoral import confine
from pytest_kcoral.report.json_artifact import SAVED_INFIX

CORRECTNESS = ("--kcoral-mode", "correctness")
UNCONFINED = ("--kcoral-confinement", "off")

# every lock file of the lease directory becomes a directory with a file in it
REPLACES_THE_LOCK_FILES = """
import glob, os

def run(a, b):
    for path in glob.glob(os.path.join(LEASES, "*.lock")):
        if not os.path.isfile(path):
            continue  # replaced at an earlier call
        os.unlink(path)
        os.mkdir(path)
        open(os.path.join(path, "owned"), "w").close()
    return a + b
"""

TURNS_THE_REPORT_INTO_A_DIRECTORY = """
import os

def run(a, b):
    for path in REPORTS:
        os.makedirs(path, exist_ok=True)
    return a + b
"""


def test_a_lock_file_replaced_by_a_directory_is_moved_aside_and_later_sessions_grade(make_case, run_kcoral, pytester):
    leases = pytester.path / "leases"
    make_case("cases/add", candidates={"attack": f"LEASES = {str(leases)!r}\n" + REPLACES_THE_LOCK_FILES})
    first = run_kcoral(*CORRECTNESS, *UNCONFINED, "--kcoral-lease-dir", str(leases), "-W", "default")
    # its second item took the lease all the same, and broke it again
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(["*LeaseRepaired: lock file *leases/*.lock was a directory, not a file (a candidate of this user"
                                " may have replaced it): moved aside to *leases/*.lock.broken-*"])
    assert [p for p in leases.glob("*.lock") if p.is_dir()], "the attack did not replace the lock file"
    # the next session, on the same lease directory: every item grades
    make_case("cases/add", candidates={"attack": "def run(a, b):\n    return a + b\n", "later": "def run(a, b):\n    return a + b\n"})
    second = run_kcoral(*CORRECTNESS, "--kcoral-lease-dir", str(leases), "-W", "default")
    second.assert_outcomes(passed=4)
    assert all(p.is_file() for p in leases.glob("*.lock"))
    assert len(list(leases.glob("*.lock.broken-*"))) == 2  # kept for whoever looks into it


def test_a_report_path_turned_into_a_directory_keeps_the_report_beside_it(make_case, run_kcoral, pytester):
    report, page = pytester.path / "out.json", pytester.path / "out.html"
    make_case("cases/add", candidates={"attack": f"REPORTS = {[str(report), str(page)]!r}\n" + TURNS_THE_REPORT_INTO_A_DIRECTORY})
    result = run_kcoral(*CORRECTNESS, *UNCONFINED, "-m", "seen", "--kcoral-json", str(report), "--kcoral-html", str(page))
    result.assert_outcomes(passed=1, deselected=1)
    assert report.is_dir() and page.is_dir()
    saved, saved_page = pytester.path / f"out.json{SAVED_INFIX}.json", pytester.path / f"out.html{SAVED_INFIX}.html"
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR  # not where CI looks for it: the run must not pass
    result.stderr.fnmatch_lines([f"pytest-kcoral: cannot write {report}: * (it is a directory now); the report was saved to {saved} instead",
                                 f"pytest-kcoral: cannot write {page}: * (it is a directory now); the report was saved to {saved_page} instead"])
    result.stdout.fnmatch_lines([f"REPORT NOT WHERE ASKED: cannot write {report}: *; the report was saved to {saved} instead",
                                 f"REPORT NOT WHERE ASKED: cannot write {page}: *; the report was saved to {saved_page} instead",
                                 f"results written to {saved}", f"report page written to {saved_page}"])
    (item,) = json.loads(saved.read_text())["items"]
    assert item["outcome"] == "passed"
    assert saved_page.read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.skipif(not confine.landlock_abi()[0], reason=f"no Landlock here: {confine.landlock_abi()[1]}")
def test_under_confinement_neither_path_can_be_touched(make_case, run_kcoral, pytester):
    leases, report = pytester.path / "leases", pytester.path / "out.json"
    make_case("cases/add", candidates={"lock": f"LEASES = {str(leases)!r}\n" + REPLACES_THE_LOCK_FILES,
                                       "report": f"REPORTS = {[str(report)]!r}\n" + TURNS_THE_REPORT_INTO_A_DIRECTORY})
    result = run_kcoral(*CORRECTNESS, "-m", "seen", "--kcoral-lease-dir", str(leases), "--kcoral-json", str(report))
    result.assert_outcomes(failed=2, deselected=2)
    result.stdout.fnmatch_lines([f"kcoral correctness failed: PermissionError: [[]Errno 13[]] Permission denied: '{leases}/*.lock'"])
    result.stdout.fnmatch_lines([f"kcoral correctness failed: PermissionError: [[]Errno 13[]] Permission denied: '{report}'"])
    assert report.is_file() and all(p.is_file() for p in leases.glob("*.lock"))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
