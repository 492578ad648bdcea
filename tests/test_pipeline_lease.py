"""The pipeline under the host-wide lease: GPU stages never overlap on a device, a hung item
gives the device back when it times out, and separate sessions take turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

GOOD = "def run(a, b):\n    return a + b\n"
HANG = "import time\ndef run(a, b):\n    while True:\n        time.sleep(0.05)\n"


def _intervals(path):
    doc = json.loads(path.read_text())
    return sorted((h["t_acquired"], h["t_released"], h["label"]) for h in doc["lease_history"]), doc


def _assert_no_overlap(intervals):
    for (_a0, a1, la), (b0, _b1, lb) in zip(intervals, intervals[1:]):
        assert b0 >= a1, f"{lb} took the device at {b0} before {la} released it at {a1}"


def test_items_record_lease_times_and_never_overlap(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"a": GOOD, "b": GOOD, "c": GOOD})
    result = run_kcoral("-n", "2", "--kcoral-json", "out.json", "--kcoral-lease-dir", str(pytester.path / "leases"))
    result.assert_outcomes(passed=6)
    intervals, doc = _intervals(pytester.path / "out.json")
    assert len(intervals) == 6
    _assert_no_overlap(intervals)
    for item in doc["items"]:
        assert item["device"] == "cpu"
        assert item["lease_wait_ms"] >= 0 and item["lease_held_ms"] > 0


def test_hung_item_times_out_and_the_next_item_gets_the_device(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"a_hang": HANG, "b_good": GOOD})
    result = run_kcoral("-n", "2", "-m", "seen", "--kcoral-timeout", "6", "--kcoral-json", "out.json",
                        "--kcoral-lease-dir", str(pytester.path / "leases"))
    result.assert_outcomes(passed=1, failed=1)
    intervals, doc = _intervals(pytester.path / "out.json")
    _assert_no_overlap(intervals)
    by_label = {label: (t0, t1) for t0, t1, label in intervals}
    hang = by_label["cases/add::a_hang[seen-n=256]"]
    assert hang[1] - hang[0] < 15, "the timeout released the lease"


def test_lease_timeout_fails_the_item_with_a_clear_message(make_case, run_kcoral, pytester):
    from filelock import FileLock

    lease_dir = pytester.path / "leases"
    lease_dir.mkdir()
    make_case("cases/add", candidates={"good": GOOD})
    with FileLock(str(lease_dir / "cpu.lock")):  # another session holds the CPU device
        result = run_kcoral("-m", "seen", "--kcoral-lease-dir", str(lease_dir), "--kcoral-lease-timeout", "0.5")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed in phase 'lease': no device:*"])


def test_two_sessions_on_one_host_take_turns(make_case, pytester):
    make_case("cases/add", candidates={"a": GOOD, "b": GOOD})
    lease_dir = pytester.path / "leases"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", "cases",
           "--kcoral-timing-budget", "0.05", "--kcoral-lease-dir", str(lease_dir)]
    sessions = [subprocess.Popen([*cmd, "--kcoral-json", f"s{i}.json"], cwd=pytester.path, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    for proc in sessions:
        assert proc.wait(timeout=300) == 0
    intervals = sorted(_intervals(pytester.path / "s0.json")[0] + _intervals(pytester.path / "s1.json")[0])
    assert len(intervals) == 8
    _assert_no_overlap(intervals)
