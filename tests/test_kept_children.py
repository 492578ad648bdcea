"""A candidate's child is kept across its items: one process per candidate and case, paused
between items, never reused after a failure."""

from __future__ import annotations

import json

THREE_SHAPES = """
import torch
SEEN = [{"n": 64}, {"n": 128}, {"n": 256}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b
"""

# Wrong on the middle shape only: its item fails, and the next item must not reuse its process.
WRONG_ON_128 = """
def run(a, b):
    return a - b if a.numel() == 128 else a + b
"""

# A module-level count of imports: kept across items only if the process is.
COUNTS_IMPORTS = """
import os
IMPORTED_IN = os.getpid()

def run(a, b):
    return a + b
"""


def _items(pytester):
    return {item["shape"]["n"]: item for item in json.loads((pytester.path / "out.json").read_text())["items"]}


def test_a_candidates_items_share_one_process(make_case, run_kcoral, pytester):
    make_case("cases/add", THREE_SHAPES, candidates={"good": COUNTS_IMPORTS, "other": "def run(a, b):\n    return b + a\n"})
    run_kcoral("--kcoral-json", "out.json").assert_outcomes(passed=6)
    doc = json.loads((pytester.path / "out.json").read_text())
    processes = {}
    for item in doc["items"]:
        processes.setdefault(item["candidate"], []).append(item["extra"]["candidate_process"])
    for candidate, seen in processes.items():
        assert len({p["pid"] for p in seen}) == 1, (candidate, seen)
        assert sorted(p["item"] for p in seen) == [1, 2, 3]
    # two candidates never share one
    assert processes["good"][0]["pid"] != processes["other"][0]["pid"]


def test_after_a_failed_item_the_candidate_starts_a_fresh_process(make_case, run_kcoral, pytester):
    make_case("cases/add", THREE_SHAPES, candidates={"wrong_on_128": WRONG_ON_128})
    run_kcoral("--kcoral-json", "out.json", "--kcoral-mode", "correctness").assert_outcomes(passed=2, failed=1)
    items = _items(pytester)
    assert items[64]["extra"]["candidate_process"]["item"] == 1
    assert items[128]["extra"]["candidate_process"]["pid"] == items[64]["extra"]["candidate_process"]["pid"]
    assert items[128]["outcome"] == "failed"
    assert items[256]["extra"]["candidate_process"]["item"] == 1
    assert items[256]["extra"]["candidate_process"]["pid"] != items[128]["extra"]["candidate_process"]["pid"]


FOUR_SHAPES_LOGGED = """
import os
import torch
SEEN = [{"n": 64}, {"n": 128}, {"n": 256}, {"n": 512}]
LOG = __LOG__

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def log(who, a):
    with open(LOG, "a") as f:
        f.write(f"{who} {a.numel()} {os.getpid()}\\n")

def reference(a, b):
    log("R", a)
    return a + b

def baseline(a, b):
    log("B", a)
    return a + b
"""

# Logs its process per shape; wrong on 256 only, in its first process.
LOGGED_WRONG_ON_256 = """
import os
def run(a, b):
    with open(__LOG__, "a") as f:
        f.write(f"C {a.numel()} {os.getpid()}\\n")
    return a - b if a.numel() == 256 else a + b
"""


def test_an_items_further_pairs_of_processes_are_kept_for_the_candidates_next_item(make_case, run_kcoral, pytester):
    """An item timed in several pairs of processes keeps each further pair's children for the
    case's next item timed so, as the first pair's are kept; after a failed item the candidate's
    further children are fresh too, while the baseline's stay."""
    log = pytester.path / "calls.log"
    make_case("cases/add", FOUR_SHAPES_LOGGED.replace("__LOG__", repr(str(log))),
              candidates={"logged": LOGGED_WRONG_ON_256.replace("__LOG__", repr(str(log)))})
    run_kcoral("--kcoral-json", "out.json", "--kcoral-process-pairs", "3", "--kcoral-confinement", "off").assert_outcomes(passed=3, failed=1)
    items = _items(pytester)
    assert items[256]["stage"] == "correctness"
    calls = [line.split() for line in log.read_text().splitlines()]
    trusted = {pid for who, _, pid in calls if who == "R"}  # it checks the baseline too
    seen: dict[tuple[str, int], list[int]] = {}  # (side, n): its processes, in the order they first ran it
    for who, n, pid in calls:
        if pid in trusted:
            continue
        pids = seen.setdefault((who, int(n)), [])
        if int(pid) not in pids:
            pids.append(int(pid))
    for n in (64, 128, 512):
        assert len(seen["C", n]) == len(seen["B", n]) == 3, (n, seen)
    # 128 took each of 64's processes again, pair by pair
    assert seen["C", 128] == seen["C", 64] and seen["B", 128] == seen["B", 64]
    # 256 failed in the candidate's first process: 512's candidate processes are all new, its baselines the same
    assert not set(seen["C", 512]) & set(seen["C", 128] + seen["C", 256])
    assert seen["B", 512] == seen["B", 64]
    assert all(items[n]["candidate_timing"]["processes"] == 3 for n in (64, 128, 512))


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_kept_child_is_stopped_until_it_is_taken_again(tmp_path):
    import time

    from pytest_kcoral.cases import NATIVE
    from pytest_kcoral.isolation import Child
    from pytest_kcoral.kept_children import KeptCandidates
    from pytest_kcoral.messages import Finish

    (tmp_path / "case.py").write_text(THREE_SHAPES)
    spec = {"format": NATIVE, "source": str(tmp_path / "case.py"), "baseline_file": None, "device": "cpu", "device_kind": "cpu",
            "init_seed": 0, "cpu_threads": 1}
    kept = KeptCandidates(limit=1)
    first = Child("candidate", spec, {}, time.monotonic() + 120, "first")
    second = Child("candidate", spec, {}, time.monotonic() + 120, "second")
    try:
        kept.keep("a", first)
        assert _state(first.process.pid) == "T"  # stopped before keep() returns
        assert kept.take("a") is first and _state(first.process.pid) != "T"
        first.call(Finish(), "finish")  # answers again once resumed
        kept.keep("a", first)
        kept.keep("b", second)  # beyond the limit: the least recently kept one is closed
        first.process.join(5)
        assert first.process.exitcode is not None
        assert kept.take("a") is None
    finally:
        kept.close()
        first.close()
        second.close()
    assert second.process.exitcode is not None
