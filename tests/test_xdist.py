"""xdist: ``-n 2`` grades the same items with the same outcomes as a serial run, and the results
reach the controller, which alone writes the artifacts."""

from __future__ import annotations

import json

GOOD = "def run(a, b):\n    return a + b\n"
WRONG = "def run(a, b):\n    return a - b\n"
SEEN_ONLY = "def run(a, b):\n    out = a + b\n    if a.numel() % 2:\n        out[-1] = 0.0\n    return out\n"


def _outcomes(path):
    doc = json.loads(path.read_text())
    return {item["nodeid"]: (item["outcome"], item["stage"], item["correct"]) for item in doc["items"]}


def test_two_workers_match_a_serial_run(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"good": GOOD, "wrong": WRONG, "seen_only": SEEN_ONLY})
    make_case("cases/add2", candidates={"good": GOOD, "crash": "import os\ndef run(a, b):\n    os._exit(3)\n"})
    serial = run_kcoral("--kcoral-json", "serial.json", "--kcoral-seed", "7")
    parallel = run_kcoral("-n", "2", "--kcoral-json", "parallel.json", "--kcoral-seed", "7")
    expected = dict(passed=5, failed=5)
    serial.assert_outcomes(**expected)
    parallel.assert_outcomes(**expected)
    s, p = _outcomes(pytester.path / "serial.json"), _outcomes(pytester.path / "parallel.json")
    assert s == p and len(s) == 10
    assert s["cases/add::seen_only[seen-n=256]"] == ("passed", "done", True)
    assert s["cases/add::seen_only[unseen-n=257]"] == ("failed", "correctness", False)
    # the summary is written once, by the controller
    assert parallel.stdout.str().count("kcoral summary") == 1
