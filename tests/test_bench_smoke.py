"""The benchmarks that measure issues 4 and 7 are run on a GPU host; here each runs once on the
CPU, on one small case (``vector_add``: 2 seen shapes on a CPU), so a change to the grader's JSON
or to the code they share cannot break them unnoticed before the next GPU session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench(script: str, *args: str) -> str:
    # on the CPU also on a GPU host, so the counts below hold everywhere
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_scaling_bench_reports_each_run_and_no_lease_overlap(tmp_path):
    out = _bench("scaling.py", "--workers", "1,2", "--budget", "0.02", "--out", str(tmp_path), "--", "cases/vector_add", "-m", "seen")
    rows = [line.split("|") for line in out.splitlines() if re.match(r"\| [12] \| [12] \| 6 \|", line)]
    assert len(rows) == 2, out  # one row per run, each of the 6 seen items graded
    assert [row[-4].strip() for row in rows] == ["0", "0"], "lease overlaps"
    assert [row[-2].strip() for row in rows] == ["wall 6", "wall 6"], "timed by"
    assert "TIMER FALLBACK" not in out
    assert rows[0][6].strip() == "1.00x" and rows[1][6].strip().endswith("x")  # items/s against the first run
    # each run's lease window against the first's, and each device's idle time in it
    assert re.search(r"^\| 1 \| 1 \| .* \| 1\.00x \|$", out, re.M), out
    assert re.search(r"^\| 1 \| cpu \| 6 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", out, re.M), out
    # the saved artifacts compared offline: the wall clock is a CPU's own timer, so nothing is marked ~
    compared = _bench("compare_runs.py", str(tmp_path / "scaling_0_n1.json"), str(tmp_path / "scaling_1_n2.json"))
    assert re.search(r"^\| all \| [\d.]+% \| \d+% of 6 \| [\d.]+% \|$", compared, re.M), compared
    assert re.search(r"^\| unmarked \(not ~\) \| [\d.]+% \| \d+% of 6 \|", compared, re.M), compared
    assert "| marked ~ | - | - | - |" in compared


def test_self_speedup_bench_grades_the_baseline_against_itself(tmp_path):
    out = _bench("self_speedup.py", "--budget", "0.02", "--out", str(tmp_path), "--", "-m", "seen", "-k", "self and vector_add")
    assert re.search(r"^2 items graded in \d+ s; 2 speedups; failed: none$", out, re.M), out
    # the two small items' row, by their baseline's time: on a loaded CPU a fed call of a few
    # microseconds can read over 20 us (docs/performance.md, "small CPU calls are slower after a wait")
    assert re.search(r"^\| baseline (<|>=) 20 us \|", out, re.M), out


def test_the_aa_instrument_times_the_candidates_side_with_the_baseline(tmp_path):
    """``self_speedup.py --aa`` (``bench/aa_plugin.py``): the candidate's child loads the case's
    baseline, never the candidate file, so a candidate that cannot even be imported passes."""
    subs = tmp_path / "subs" / "broken"
    subs.mkdir(parents=True)
    (subs / "vector_add.py").write_text("raise SystemExit('imported under A/A')\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", "cases/vector_add", "-m", "seen",
               "-k", "broken", "--kcoral-submissions", str(tmp_path / "subs"), "--kcoral-timing-budget", "0.02"]
    with_plugin = subprocess.run([*command, "-p", "aa_plugin"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert with_plugin.returncode == 0 and re.search(r"^2 passed", with_plugin.stdout, re.M), with_plugin.stdout[-2000:]
    without = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert without.returncode == 1 and "kcoral compile failed in phase 'import'" in without.stdout, without.stdout[-2000:]


def test_startup_bench_breaks_down_a_session_on_the_cpu():
    out = _bench("startup.py", "--repeats", "1")
    assert re.search(r"^\| fresh interpreter: import torch \| [\d.]+ \|$", out, re.M), out
    # wall, first lease, first compile, later compiles, tail: all measured on the CPU's 9 items
    assert re.search(r"^\| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", out, re.M), out
    assert "(9 items)" in out
    assert "no CUDA device: the child's GPU start-up parts are not measured" in out


def test_round_probe_reads_rounds_in_a_plain_process_and_in_grading_children():
    out = _bench("round_probe.py")
    variants = [line for line in out.splitlines() if re.match(r"\s+\S.*\s+[\d.]+ calls a round, ", line)]
    assert len(variants) == 15, out  # five variants, in this process and in two grading children
    parts = [line for line in out.splitlines() if "round parts: wall" in line]
    assert len(parts) == 3 and "audit - (not in a grading child)" in parts[0], out
    assert all(re.search(r"audit +[\d.]+ ms", line) for line in parts[1:]), out  # the children's runner found and audited
    assert "a grading child (confinement off):" in out and "no figures" not in out, out


def test_replay_stopping_replays_both_interval_rules_on_a_grading_json(tmp_path):
    """``bench/replay_stopping.py`` on a grading JSON's rounds: a one-pair item whose rounds agree
    within 0.1% stops at the fewest rounds under either rule; one whose rounds spread 3% runs on
    under the median's distribution-free interval longer than under the mean's t-interval."""
    import json

    steady = [1.0 + 0.001 * (-1) ** k for k in range(64)]
    spread = [1.0 + 0.03 * ((k * 7919) % 13 - 6) / 6 for k in range(64)]
    items = [{"speedup": 1.0, "baseline_timing": {"round_medians_us": ratios}, "candidate_timing": {"round_medians_us": [1.0] * 64, "flags": []}}
             for ratios in (steady, spread)]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"items": items}))
    out = _bench("replay_stopping.py", "--interval", "median,mean", "--precision", "1%", "--cap", "32", str(path))
    rows = {row.split("|")[1].strip(): int(row.split("|")[6]) for row in out.splitlines() if re.match(r"\| (median|mean) \| 1% \|", row)}
    assert set(rows) == {"median", "mean"}, out
    assert 6 + 6 <= rows["mean"] < rows["median"] <= 6 + 32, out  # the steady item stops at 6 under both
