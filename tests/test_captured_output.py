"""What a candidate prints: in its failure report as pytest shows a test's output, live with
``-s``, and bounded in the JSON (``output_tail``), however much it prints."""

from __future__ import annotations

import json

from pytest_kcoral.captured_output import LIVE_LIMIT_BYTES, TAIL_BYTES, TAIL_LINES

CHATTY_WRONG = """
import sys
print("loading the chatty kernel")
def run(a, b):
    print("stdout from the candidate, n =", a.numel())
    print("stderr from the candidate", file=sys.stderr)
    return a - b
"""
CHATTY_GOOD = "def run(a, b):\n    print('good candidate says hi')\n    return a + b\n"
QUIET_GOOD = "def run(a, b):\n    return a + b\n"


def test_a_failing_candidates_output_is_in_its_report(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"chatty": CHATTY_WRONG, "good": CHATTY_GOOD, "quiet": QUIET_GOOD})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=2, failed=1, deselected=3)
    result.stdout.fnmatch_lines([
        "*_ cases/add::chatty[[]seen-n=256[]] _*",
        "kcoral correctness failed: trial 1 of 3: output 0:*",
        "*- Captured stdout call -*",
        "loading the chatty kernel",
        "stdout from the candidate, n = 256",
        "stdout from the candidate, n = 256",
        "*- Captured stderr call -*",
        "stderr from the candidate",
    ])
    out = result.stdout.str()
    assert "good candidate says hi" not in out  # a passing item's output stays out of the report, as pytest does
    items = {i["candidate"]: i for i in json.loads((pytester.path / "out.json").read_text())["items"]}
    assert items["chatty"]["output_tail"]["stdout"] == {
        "text": "loading the chatty kernel\n" + "stdout from the candidate, n = 256\n" * 3, "bytes": 26 + 35 * 3, "lines": 4}
    assert items["chatty"]["output_tail"]["stderr"]["text"] == "stderr from the candidate\n" * 3
    assert items["good"]["output_tail"]["stdout"]["text"].count("good candidate says hi") == 3
    assert items["good"]["output_tail"]["stderr"] == {"text": "", "bytes": 0, "lines": 0}
    assert items["quiet"]["output_tail"] is None
    # -rP shows a passing item's, as it shows a passing test's
    run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "-k", "good", "-rP").stdout.fnmatch_lines(
        ["*- Captured stdout call -*", "good candidate says hi"])


def test_with_s_the_output_goes_to_the_terminal_while_the_item_runs(make_case, run_kcoral):
    make_case("cases/add", candidates={"chatty": CHATTY_WRONG})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "-s", "-v")
    result.assert_outcomes(failed=1, deselected=1)
    out = result.stdout.str()
    # -v prints the item's id before it runs and its outcome after: the output comes in between
    started = out.index("cases/add::chatty[seen-n=256]")
    printed = out.index("stdout from the candidate, n = 256", started)
    assert out.index("loading the chatty kernel", started) < printed < out.index("FAILED", started)
    assert "stderr from the candidate" in result.stderr.str()
    assert "Captured stdout call" not in out  # shown once, live


def test_a_flood_is_cut_to_its_last_lines_everywhere(make_case, run_kcoral, pytester):
    flood = ("import sys\nfor i in range(300000):\n    print('spam line', i)\n"
             "print('x' * 100000, file=sys.stderr)\n"  # one line longer than the tail
             "def run(a, b):\n    print('the last word')\n    return a - b\n")
    make_case("cases/add", candidates={"flood": flood})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "--kcoral-json", "out.json", "--kcoral-trials", "1")
    result.assert_outcomes(failed=1, deselected=1)
    lines = 300001
    result.stdout.fnmatch_lines([
        "*- Captured stdout call -*",
        f"[[]kcoral: the first {lines - TAIL_LINES} of {lines} lines (* MiB) are cut; the last {TAIL_LINES} follow[]]",
        f"spam line {300000 - TAIL_LINES + 1}",
    ])
    result.stdout.fnmatch_lines(["spam line 299999", "the last word", "*- Captured stderr call -*", "[[]kcoral: the first 0 of 1 lines*"])
    assert "spam line 0\n" not in result.stdout.str()
    assert len(result.stdout.str()) < 100_000
    tail = json.loads((pytester.path / "out.json").read_text())["items"][0]["output_tail"]
    assert tail["stdout"]["lines"] == lines and tail["stdout"]["bytes"] > 3_000_000
    assert len(tail["stdout"]["text"].splitlines()) == TAIL_LINES and tail["stdout"]["text"].endswith("the last word\n")
    assert tail["stderr"]["bytes"] == 100_001 and len(tail["stderr"]["text"]) <= TAIL_BYTES


def test_with_s_a_flood_stops_at_the_live_limit(make_case, run_kcoral):
    flood = "for i in range(300000):\n    print('spam line', i)\ndef run(a, b):\n    return a + b\n"
    make_case("cases/add", candidates={"flood": flood})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "-s")
    result.assert_outcomes(passed=1, deselected=1)
    out = result.stdout.str()
    assert "spam line 0\n" in out and "spam line 299999" not in out
    assert LIVE_LIMIT_BYTES < len(out) < LIVE_LIMIT_BYTES + 20_000
    assert "[kcoral: candidate flood printed over 1.0 MiB to stdout; the rest is not shown]" in out


def test_with_s_under_xdist_the_report_shows_it(make_case, run_kcoral):
    # an xdist worker's output reaches no terminal: live output there would be lost
    make_case("cases/add", candidates={"chatty": CHATTY_WRONG})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "-s", "-n", "2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*- Captured stdout call -*", "loading the chatty kernel"])


def test_a_process_kept_across_items_gives_each_item_its_own_output(make_case, run_kcoral, pytester):
    # a passing candidate's process serves its next item of the case: each item holds what it printed
    counting = "print('imported')\ndef run(a, b):\n    print('n =', a.numel())\n    return a + b\n"
    make_case("cases/add", candidates={"counting": counting})
    run_kcoral("--kcoral-mode", "correctness", "--kcoral-json", "out.json").assert_outcomes(passed=2)
    items = {i["shape_id"]: i for i in json.loads((pytester.path / "out.json").read_text())["items"]}
    assert items["n=256"]["extra"]["candidate_process"]["pid"] == items["n=257"]["extra"]["candidate_process"]["pid"]
    assert items["n=256"]["output_tail"]["stdout"]["text"] == "imported\n" + "n = 256\n" * 3
    assert items["n=257"]["output_tail"]["stdout"]["text"] == "n = 257\n" * 3


def test_the_harness_flushes_its_own_streams_never_a_candidates(make_case, run_kcoral):
    # a flush() of the candidate's would run its code after each command's audit; this one hangs
    hangs_on_flush = ("import sys, time\n"
                      "class Stream:\n    def write(self, text):\n        return len(text)\n"
                      "    def flush(self):\n        time.sleep(1000)\n"
                      "sys.stdout = Stream()\n"
                      "def run(a, b):\n    print('swallowed')\n    return a + b\n")
    make_case("cases/add", candidates={"hangs_on_flush": hangs_on_flush})
    run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "--kcoral-timeout", "60").assert_outcomes(passed=1, deselected=1)
