"""Reports: the JSON artifact, the step summary, the comparison with a saved run, the terminal
table, and the controller-side session end to end (serial and under xdist)."""

from __future__ import annotations

import datetime
import json
import os
import re
import textwrap
from pathlib import Path

import pytest
from _pytest.pytester import LineMatcher

from pytest_kcoral import scoring
from pytest_kcoral.options import Settings
from pytest_kcoral.report import compare, json_artifact, shorten_middle, step_summary, terminal
from pytest_kcoral.results import ItemResult

TOP_LEVEL_KEYS = {
    "schema", "partial", "created", "config", "environment", "seed", "seed_is_secret", "items",
    "candidates", "cases", "suite", "leaderboard", "weak_cases", "failed_cases", "skipped_candidates", "known_answers",
    "timers",
    "collection_errors", "lease_history", "compare",
}


def item(case="cases/vector_add", candidate="triton_v1", split="seen", shape_id="n=4096", *,
         speedup=None, correct=True, baseline_correct=None, team=None, tier=1, weak=None) -> ItemResult:
    return ItemResult(
        nodeid=f"{case}::{candidate}[{split}-{shape_id}]", case=case, candidate=candidate,
        split=split, shape={"n": 1}, shape_id=shape_id, tier=tier, team=team,
        stage="done" if correct else "correctness", outcome="passed" if correct else "failed",
        compiled=True, correct=correct, baseline_correct=baseline_correct, speedup=speedup,
        timer="wall" if speedup else None, weak_reference=weak,
    )


def fixed_items() -> list[ItemResult]:
    return [
        item(shape_id="n=4096", speedup=2.0),
        item(shape_id="n=1M", speedup=1.0),
        item(split="unseen", shape_id="n=3", speedup=1.2, baseline_correct=True),
        item(candidate="triton_v2", shape_id="n=4096", speedup=0.5),
        item(candidate="triton_v2", shape_id="n=1M", correct=False),
        item(candidate="triton_v2", split="unseen", shape_id="n=3", correct=False, baseline_correct=True),
        item(case="cases/softmax", candidate="naive", speedup=3.0, tier=2, weak=True),
    ]


def settings(tmp_path: Path, *, seed: int = 1234, secret: bool = True) -> Settings:
    return Settings(
        mode="full", submissions=(), trials=3, timeout_s=300.0, min_speedup=None,
        tolerance="elementwise", timer=None, seed=seed, seed_is_secret=secret, devices=None,
        lease_dir=None, lease_timeout_s=None, json_path=tmp_path / "out.json", url=None,
        sandbox=False, artifacts=None, timing_budget_s=None,
    )


# -- JSON artifact -----------------------------------------------------------------------------


def test_document_schema(tmp_path):
    items = fixed_items()
    doc = json_artifact.build_document(
        items, scoring.score(items), settings=settings(tmp_path), environment={"host": "h"},
        partial=True, collection_errors=[{"nodeid": "cases/bad", "message": "SEEN is empty"}],
        lease_history=[{"device": "cpu", "wait_ms": 1.0}],
        created=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
    )
    assert set(doc) == TOP_LEVEL_KEYS
    assert doc["schema"] == "pytest-kcoral/1"
    assert doc["partial"] is True
    assert doc["created"] == "2026-01-02T03:04:05+00:00"
    assert doc["seed"] == 1234 and doc["seed_is_secret"] is True
    assert "seed" not in doc["config"] and doc["config"]["json_path"] == str(tmp_path / "out.json")
    assert [it["nodeid"] for it in doc["items"]] == sorted(it.nodeid for it in items)
    assert [(c["case"], c["candidate"]) for c in doc["candidates"]] == [
        ("cases/softmax", "naive"), ("cases/vector_add", "triton_v1"), ("cases/vector_add", "triton_v2")]
    assert doc["candidates"][1]["scored_speedup"] == pytest.approx(1.5)
    assert doc["suite"]["quadrants"] == {"both_pass": 1, "candidate_regressed": 1, "both_fail": 0,
                                         "candidate_improved": 0, "left_out": 0, "left_out_case_failed": 0}
    assert doc["leaderboard"][0]["team"] is None
    assert doc["weak_cases"] == [{"case": "cases/softmax", "shapes": ["n=4096"]}]
    assert doc["collection_errors"][0]["nodeid"] == "cases/bad"
    assert doc["lease_history"] == [{"device": "cpu", "wait_ms": 1.0}]
    assert doc["compare"] is None
    json.dumps(doc, allow_nan=False)


def test_document_of_nothing_is_valid_json():
    doc = json_artifact.build_document([], scoring.score([]))
    assert set(doc) == TOP_LEVEL_KEYS and doc["partial"] is False and doc["items"] == []
    json.dumps(doc, allow_nan=False)


def test_non_finite_numbers_become_null():
    odd = item(speedup=float("inf"))
    doc = json_artifact.build_document([odd], scoring.score([odd]))
    assert doc["items"][0]["speedup"] is None


def test_write_atomically_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "results.json"
    json_artifact.write_atomically(path, {"v": 1})
    json_artifact.write_atomically(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}
    assert os.listdir(path.parent) == ["results.json"]  # no temporary file left behind


def test_write_atomically_keeps_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    json_artifact.write_atomically(path, {"v": 1})

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json_artifact.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        json_artifact.write_atomically(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["results.json"]


# -- environment -----------------------------------------------------------------------------


def test_parse_nvidia_smi_output():
    from pytest_kcoral import environment

    csv = ("NVIDIA H200, GPU-1234, 570.86.15, 1980 MHz, 1980 MHz, 2619 MHz\n"
           "NVIDIA H200, GPU-5678, 570.86.15, 345 MHz, 1980 MHz, 2619 MHz\n")
    gpus = environment.parse_gpu_query(csv)
    assert gpus[1] == {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-5678",
                       "driver_version": "570.86.15", "clock_sm_mhz": 345.0,
                       "clock_max_sm_mhz": 1980.0, "clock_mem_mhz": 2619.0}
    banner = "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8     |"
    assert environment.parse_cuda_version(banner) == "12.8"
    assert environment.parse_cuda_version("no banner") is None


def test_environment_does_not_import_torch(pytester: pytest.Pytester):
    # a fresh interpreter: this one may have torch loaded already
    result = pytester.runpython_c(
        "import sys, json; from pytest_kcoral.environment import collect_environment; "
        "env = collect_environment(); json.dumps(env); "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "print('host', env['host'], 'packages', sorted(env['packages']))")
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(["host * packages *'pytest-kcoral'*"])


# -- step summary -----------------------------------------------------------------------------


def test_step_summary_is_appended(tmp_path):
    path = tmp_path / "summary.md"
    path.write_text("# earlier step\n")
    items = fixed_items()
    markdown = step_summary.render_markdown(scoring.score(items), partial=True)
    step_summary.append_step_summary(path, markdown)
    text = path.read_text()
    assert text.startswith("# earlier step\n## pytest-kcoral")
    lines = text.splitlines()
    LineMatcher(lines).fnmatch_lines([
        "*Partial run*",
        "| case | candidate | compiled | seen correct | seen speedup | unseen correct*",
        "| `cases/vector_add` | `triton_v1` | yes | yes | 1.50x | 1/1 | 1.20x | 20% | 270.0 | 65.0 |",
        "| `cases/vector_add` | `triton_v2` | yes | no | 0.50x | 0/1 | - | - | 20.0 | 0.0 |",
        "*weak case* `cases/softmax`*",
        "| 1 | (bundled) | 185.0 | 2/2 | 2.25x |",
    ])


# -- compare ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [("5%", 5.0), ("5", 5.0), (" 2.5 % ", 2.5), ("0", 0.0)])
def test_parse_threshold(text, expected):
    assert compare.parse_threshold(text) == expected


@pytest.mark.parametrize("text", ["five", "-5%", "%", "nan"])
def test_parse_threshold_rejects(text):
    with pytest.raises(ValueError, match="kcoral-compare-fail"):
        compare.parse_threshold(text)


def _save(tmp_path, name, items):
    path = tmp_path / name
    json_artifact.write_atomically(path, json_artifact.build_document(items, scoring.score(items)))
    return path


def test_compare_detects_regressions(tmp_path):
    old_items = [
        item(candidate="fast", speedup=2.0),
        item(candidate="steady", speedup=1.0),
        item(candidate="gone", speedup=1.0),
    ]
    new_items = [
        item(candidate="fast", speedup=1.8),  # -10%
        item(candidate="steady", speedup=0.96),  # -4%
        item(candidate="new", speedup=1.0),
    ]
    old_path = _save(tmp_path, "old.json", old_items)
    saved = compare.load_saved_run(old_path)
    assert saved.speedups == {("cases/vector_add", "fast"): 2.0, ("cases/vector_add", "gone"): 1.0,
                              ("cases/vector_add", "steady"): 1.0}
    assert saved.timed_by[("cases/vector_add", "fast")] == ("wall",) and not saved.host_set
    result = compare.compare_runs(saved, scoring.score(new_items).candidates, 5.0, old_path)
    assert [(r.candidate, r.regressed) for r in result.rows] == [("fast", True), ("steady", False)]
    assert result.rows[0].change_pct == pytest.approx(-10.0)
    assert [r.candidate for r in result.regressions] == ["fast"]
    assert result.only_old == [("cases/vector_add", "gone")]
    assert result.only_new == [("cases/vector_add", "new")]
    # a looser threshold forgives it; no threshold only reports
    assert not compare.compare_runs(saved, scoring.score(new_items).candidates, 15.0).regressions
    assert not compare.compare_runs(saved, scoring.score(new_items).candidates, None).regressions
    # regressions land in the JSON document
    new_scores = scoring.score(new_items)
    doc = json_artifact.build_document(new_items, new_scores, compare=result)
    assert doc["compare"]["regressions"][0]["candidate"] == "fast"
    assert doc["compare"]["threshold_pct"] == 5.0


def _with_ci(it: ItemResult, low: float, high: float) -> ItemResult:
    it.speedup_ci, it.speedup_ci_level = [low, high], 0.95
    return it


def test_compare_never_fails_a_change_inside_both_runs_intervals(tmp_path):
    old_path = _save(tmp_path, "old.json", [
        _with_ci(item(candidate="noisy", speedup=2.0), 1.7, 2.3),
        _with_ci(item(candidate="sure", speedup=2.0), 1.98, 2.02),
        _with_ci(item(candidate="sure", shape_id="n=8", speedup=2.0), 1.96, 2.04),
    ])
    new_items = [
        _with_ci(item(candidate="noisy", speedup=1.8), 1.6, 2.0),  # -10%, and 1.6-2.0 overlaps 1.7-2.3
        _with_ci(item(candidate="sure", speedup=1.8), 1.78, 1.82),  # -10%, the ranges apart
        _with_ci(item(candidate="sure", shape_id="n=8", speedup=1.8), 1.79, 1.81),
    ]
    saved = compare.load_saved_run(old_path)
    assert saved.ranges[("cases/vector_add", "sure")] == pytest.approx((1.97, 2.03))  # the mean of its items' bounds
    result = compare.compare_runs(saved, scoring.score(new_items).candidates, 5.0, old_path)
    assert [(r.candidate, r.regressed, r.within_noise) for r in result.rows] == [("noisy", False, True), ("sure", True, False)]
    assert not result.rows[1].ranges_overlap
    (line,) = [c for c in compare.caveats(result) if c.startswith("WITHIN NOISE")]
    assert line == ("WITHIN NOISE 1 pair slower by more than the threshold, not counted: the two runs' intervals overlap:"
                    " cases/vector_add::noisy 2.00x -> 1.80x (-10.0%), 1.70-2.30x then, 1.60-2.00x now")
    LineMatcher(terminal.compare_lines(result)).fnmatch_lines([
        "compared with *old.json (fail below -5%): 2 pairs, 1 regressed", "  REGRESSION cases/vector_add::sure: *", "  WITHIN NOISE 1 pair*"])
    assert "WITHIN NOISE 1 pair" in step_summary.render_markdown(scoring.score(new_items), compare=result)
    doc = json_artifact.build_document(new_items, scoring.score(new_items), compare=result)
    assert [r["candidate"] for r in doc["compare"]["within_noise"]] == ["noisy"]
    assert doc["compare"]["rows"][0]["old_range"] == [1.7, 2.3] and doc["compare"]["rows"][0]["new_range"] == [1.6, 2.0]
    # a saved run written before intervals existed gates as before
    old = json.loads(old_path.read_text())
    for c in old["candidates"]:
        del c["mean_speedup_seen_range"]
    for i in old["items"]:
        del i["speedup_ci"], i["speedup_ci_level"]
    old_path.write_text(json.dumps(old))
    before = compare.compare_runs(compare.load_saved_run(old_path), scoring.score(new_items).candidates, 5.0, old_path)
    assert [(r.candidate, r.regressed, r.within_noise) for r in before.rows] == [("noisy", True, False), ("sure", True, False)]


def test_compare_never_gates_on_pairs_timed_differently(tmp_path):
    # the saved run fell back to CUDA events, this one had CUPTI: a 2.00x -> 1.00x "regression"
    # there is the timer's, not the kernel's
    old_path = _save(tmp_path, "old.json", [item(candidate="a", speedup=2.0), item(candidate="b", speedup=2.0)])
    doc = json.loads(old_path.read_text())
    for i in doc["items"]:
        i["timer"] = "events" if i["candidate"] == "a" else "cupti"
    doc["environment"]["gpus"] = [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]
    old_path.write_text(json.dumps(doc))
    new_items = [item(candidate="a", speedup=1.0), item(candidate="b", speedup=1.0)]
    for it in new_items:
        it.timer = "cupti"
    saved = compare.load_saved_run(old_path)
    assert saved.gpus == ("NVIDIA H100 80GB HBM3",)
    timed_by = compare.pair_methods((i.case, i.candidate, i.split, i.timer, i.speedup) for i in new_items)
    result = compare.compare_runs(saved, scoring.score(new_items).candidates, 5.0, old_path,
                                  timed_by=timed_by, gpus=("NVIDIA H200",))
    a, b = result.rows
    assert (a.comparable, a.regressed, a.change_pct) == (False, False, pytest.approx(-50.0))
    assert (b.comparable, b.regressed) == (True, True)
    assert result.other_gpus
    lines = terminal.compare_lines(result)
    LineMatcher(lines).fnmatch_lines([
        "compared with *old.json (fail below -5%): 1 pair, 1 regressed",
        "  REGRESSION cases/vector_add::b: 2.00x -> 1.00x (-50.0%)",
        "  the saved run ran on NVIDIA H100 80GB HBM3, this one on NVIDIA H200: speedups move with the GPU",
        "  NOT COMPARED 1 pair, timed by other methods in the two runs: cases/vector_add::a (events then, cupti now)",
    ])
    assert compare.compare_runs(saved, scoring.score(new_items).candidates, 5.0, gpus=("NVIDIA H100 80GB HBM3",)).other_gpus is False
    d = result.to_dict()
    assert [r["candidate"] for r in d["not_comparable"]] == ["a"] and d["rows"][0]["old_timed_by"] == ["events"]


def test_a_fallback_on_every_pair_names_a_few_and_counts_the_rest(tmp_path):
    names = [f"c{i}" for i in range(7)]
    old_path = _save(tmp_path, "old.json", [item(candidate=n, speedup=1.0) for n in names])
    saved = compare.load_saved_run(old_path)  # timed by wall in the saved run
    new_items = [item(candidate=n, speedup=1.0) for n in names]
    timed_by = {(i.case, i.candidate): ("events",) for i in new_items}
    result = compare.compare_runs(saved, scoring.score(new_items).candidates, 5.0, timed_by=timed_by)
    (line,) = compare.caveats(result)
    assert line.startswith("NOT COMPARED 7 pairs, timed by other methods in the two runs: cases/vector_add::c0 (wall then, events now);")
    assert line.endswith("cases/vector_add::c4 (wall then, events now); and 2 more")
    assert not result.compared and not result.regressions


def test_compare_marks_regressions_the_host_sets(tmp_path):
    old_path = _save(tmp_path, "old.json", [item(candidate="a", speedup=2.0)])
    doc = json.loads(old_path.read_text())
    doc["candidates"][0]["host_set_seen"] = 1  # the saved run's mean carried ~
    old_path.write_text(json.dumps(doc))
    result = compare.compare_runs(compare.load_saved_run(old_path), scoring.score([item(candidate="a", speedup=1.5)]).candidates, 5.0)
    (row,) = result.regressions
    assert row.host_set and compare.fmt_change(row) == "2.00x~ -> 1.50x~ (-25.0%)"
    assert compare.caveats(result) == [
        "~ the host's speed sets part of these speedups: rerun before believing a regression there"]
    markdown = step_summary.render_markdown(scoring.score([item(candidate="a", speedup=1.5)]), compare=result)
    assert "- `cases/vector_add::a` 2.00x\\~ -> 1.50x\\~ (-25.0%)" in markdown
    assert "- \\~ the host's speed sets part of these speedups" in markdown


def test_a_gate_that_compared_nothing_fails_and_says_why(tmp_path):
    # the saved run ran from another directory: every case id differs, and the gate once passed
    # with "0 pairs, 0 regressed" while the kernel had gone 15x slower
    old_path = _save(tmp_path, "old.json", [item(case="audit/cases/add", candidate="a", speedup=1.25)])
    new = scoring.score([item(case="cases/add", candidate="a", speedup=0.08)]).candidates
    result = compare.compare_runs(compare.load_saved_run(old_path), new, 5.0, old_path)
    assert result.nothing_matched and result.gate_failed and not result.regressions
    LineMatcher(terminal.compare_lines(result)).fnmatch_lines([
        "compared with *old.json (fail below -5%): 0 pairs, 0 regressed",
        "  NOTHING COMPARED: no pair of this run is in the saved run (1 there, e.g. audit/cases/add::a; 1 here,"
        " e.g. cases/add::a). Case ids are the case folders' paths from pytest's rootdir*",
    ])
    assert result.to_dict()["gate_failed"] is True
    assert "NOTHING COMPARED" in step_summary.render_markdown(scoring.score([item(case="cases/add", candidate="a")]), compare=result)
    # report only, nothing fails
    assert not compare.compare_runs(compare.load_saved_run(old_path), new, None).gate_failed


def test_report_only_compare_shows_what_moved_and_names_unmatched_pairs(tmp_path):
    old_path = _save(tmp_path, "old.json", [item(candidate="eps", speedup=1.25), item(candidate="same", speedup=1.0),
                                             item(candidate="gone", speedup=1.0)])
    doc = json.loads(old_path.read_text())
    doc["partial"] = True
    old_path.write_text(json.dumps(doc))
    new_items = [item(candidate="eps", speedup=0.08), item(candidate="same", speedup=1.01)]
    result = compare.compare_runs(compare.load_saved_run(old_path), scoring.score(new_items).candidates, None, old_path)
    assert not result.gate_failed
    LineMatcher(terminal.compare_lines(result)).fnmatch_lines([
        "compared with *old.json (report only): 2 pairs, 0 regressed",
        "  cases/vector_add::eps: 1.25x -> 0.08x (-93.6%)",
        "  cases/vector_add::same: 1.00x -> 1.01x (+1.0%)",
        "  1 pair only in the saved run: cases/vector_add::gone",
        "  the saved run was interrupted (partial)*",
    ])
    markdown = step_summary.render_markdown(scoring.score(new_items), compare=result)
    assert "**2 pair(s) compared** (report only)" in markdown and "- `cases/vector_add::eps` 1.25x -> 0.08x (-93.6%)" in markdown


def test_compare_skips_pairs_without_speedup(tmp_path):
    old_path = _save(tmp_path, "old.json", [item(candidate="a", speedup=2.0)])
    new = scoring.score([item(candidate="a", correct=False)]).candidates
    result = compare.compare_runs(compare.load_saved_run(old_path), new, 5.0)
    assert result.rows[0].change_pct is None and not result.regressions


def test_compare_missing_or_malformed_file(tmp_path):
    with pytest.raises(compare.CompareError, match=r"nope\.json: no such file"):
        compare.load_saved_run(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(compare.CompareError, match=r"bad\.json: not valid JSON"):
        compare.load_saved_run(bad)
    other = tmp_path / "other.json"
    other.write_text('{"benchmarks": []}')
    with pytest.raises(compare.CompareError, match=r"other\.json: not a pytest-kcoral"):
        compare.load_saved_run(other)
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "pytest-kcoral/1", "candidates": [{"case": "x"}]}')
    with pytest.raises(compare.CompareError, match=r"broken\.json: malformed entry candidates\[0\]"):
        compare.load_saved_run(broken)


# -- terminal ---------------------------------------------------------------------------------


def test_terminal_lines():
    scores = scoring.score(fixed_items())
    lines = terminal.summary_lines(scores, seed=99, seed_is_secret=False)
    assert max(len(line) for line in lines) <= 100
    LineMatcher(lines).fnmatch_lines([
        "case::candidate * comp seen  seen x unseen  unsn x   gap    AKA  bench",
        "cases/softmax::naive * yes  yes   3.00x      -       -     -  420.0   80.0",
        "cases/vector_add::triton_v1 * yes  yes   1.50x    1/1   1.20x   20%  270.0   65.0",
        "cases/vector_add::triton_v2 * yes   no   0.50x    0/1       -     -   20.0    0.0",
        *terminal.LEGEND,
        "",
        "pairs 3  compiled 100%  correct on every seen shape 67%",
        "fast_0 67% fast_1 67% fast_1.5 33% fast_2 33%",
        "speedup mean 2.25x  geomean 2.12x  mean gap 20%",
        "unseen P(candidate ok | baseline ok) 50%: both pass 1, regressed 1, both fail 0, improved 0",
        "bench-lite total (tier-weighted) 185.0",
        "leaderboard (best attempt per case):",
        "   1. (bundled) * 185.0  correct 2/2  mean 2.25x",
        "WEAK case cases/softmax: zeros or a constant match the reference on n=4096",
        "seed 99",
    ])


def test_the_legend_under_the_table_explains_every_column():
    lines = terminal.summary_lines(scoring.score(fixed_items()))
    table_end = lines.index("cases/vector_add::triton_v2" + lines[3][len("cases/vector_add::triton_v2"):])
    legend = lines[table_end + 1: table_end + 1 + len(terminal.LEGEND)]
    assert legend == list(terminal.LEGEND) and max(len(line) for line in legend) <= 100
    text = " ".join(legend)
    for header, _ in terminal.COLUMNS:
        assert f"{header}:" in text or f"{header}," in text, f"the legend does not explain {header!r}"
    assert "above 0 is bad" in text  # which sign of the gap is bad
    assert any(line.startswith("pairs 3  compiled 100%  correct on every seen shape 67%") for line in lines)
    assert not any(line in terminal.LEGEND for line in terminal.summary_lines(scoring.score([])))  # no table, no legend


@pytest.mark.parametrize(("name", "width", "shortened"), [
    ("cases/add::good", 40, "cases/add::good"),
    # the case gives way first: the candidate tells a case's rows apart
    ("kernelbench/level1/19_ReLU_with_a_long_name::team-a/attempt3", 40, "kernelbenc..._long_name::team-a/attempt3"),
    # a candidate too long to keep whole: both ends of the whole name
    ("cases/add::a_candidate_name_far_longer_than_the_column_holds", 40, "cases/add::a_candid...n_the_column_holds"),
    ("subs/a-team-with-a-very-long-name-indeed", 30, "subs/a-team-wi...g-name-indeed"),
])
def test_long_names_are_shortened_in_the_middle(name, width, shortened):
    assert shorten_middle(name, width) == shortened
    assert len(shorten_middle(name, width)) == min(len(name), width)


def test_the_table_keeps_a_long_cases_candidate_whole():
    long_case = "kernelbench/level1/19_ReLU_with_a_long_problem_name"
    lines = terminal.table_lines(scoring.score([item(case=long_case, candidate="team-a/attempt3")]))
    assert lines[1].startswith("kernelbenc...oblem_name::team-a/attempt3 ")


def test_the_leaderboard_names_the_bundled_candidates_folder():
    def at(case: str, folder: str) -> ItemResult:
        it = item(case=case, speedup=1.0)
        it.candidate_file = f"{folder}/triton_v1.py"
        return it

    one = scoring.score([at("cases/add", "cases/add/candidates")])
    assert one.leaderboard[0].folder == "cases/add/candidates"
    LineMatcher(terminal.summary_lines(one)).fnmatch_lines(["   1. cases/add/candidates/ * correct 1/1  mean 1.00x"])
    two = scoring.score([at("cases/add", "cases/add/candidates"), at("cases/mul", "cases/mul/candidates")])
    LineMatcher(terminal.summary_lines(two)).fnmatch_lines(["   1. cases/[*]/candidates/ * correct 2/2  mean 1.00x"])
    assert "| 1 | `cases/*/candidates/` |" in step_summary.render_markdown(two)
    assert scoring.folder_pattern(["cases/add/candidates", "cases/bench_add"]) == "cases/**"
    mixed = scoring.score([at("cases/add", "cases/add/candidates"), at("cases/relu", "cases/relu")])
    LineMatcher(terminal.summary_lines(mixed)).fnmatch_lines(["   1. cases/[*][*] * correct 2/2  mean 1.00x"])
    assert scoring.folder_pattern(["cases/add/candidates", None]) is None  # from a saved run without the field


NO_CUPTI = "cupti-python is not usable (ModuleNotFoundError: No module named 'cupti'); install it with `pip install pytest-kcoral[gpu]`"


def _timed(candidate: str, method: str, *fallback: str) -> ItemResult:
    it = item(candidate=candidate, speedup=1.0)
    it.timer = method
    flags = [f"fallback_to_events: {reason}" for reason in fallback]
    it.baseline_timing = {"method": method, "flags": ["l2_flush=read:120MiB", *flags]}
    it.candidate_timing = {"method": method, "flags": list(flags)}
    return it


def test_a_fallback_from_cupti_is_named_in_every_report(tmp_path):
    items = [_timed("a", "cupti"), _timed("b", "events", NO_CUPTI), _timed("c", "events", NO_CUPTI),
             _timed("d", "events", "CUPTI is in use: a torch profiler is running")]
    scores = scoring.score(items)
    assert scores.timers.methods == {"cupti": 1, "events": 3}
    assert scores.timers.fallbacks == {NO_CUPTI: 2, "CUPTI is in use: a torch profiler is running": 1}
    LineMatcher(terminal.summary_lines(scores)).fnmatch_lines([
        "timed by cupti 1, events 3",
        "TIMER FALLBACK on 2 items: CUDA events, not CUPTI (short kernels read their launch overhead):"
        " cupti-python is not usable (ModuleNotFoundError: No module named 'cupti'); install it with*",
        "TIMER FALLBACK on 1 item: *: CUPTI is in use: a torch profiler is running",
    ])
    LineMatcher(step_summary.render_markdown(scores).splitlines()).fnmatch_lines([
        "- timed by cupti 1, events 3", "- **timer fallback** on 2 item(s): *cupti-python is not usable*"])
    doc = json_artifact.build_document(items, scores, settings=settings(tmp_path))
    assert doc["timers"] == {"methods": {"cupti": 1, "events": 3}, "fallbacks": scores.timers.fallbacks}
    # no fallback, no warning; nothing timed (correctness mode), no timer line
    assert not any("FALLBACK" in line for line in terminal.summary_lines(scoring.score(items[:1])))
    assert not any(line.startswith("timed by") for line in terminal.summary_lines(scoring.score([item(candidate="x")])))


def test_speedups_the_host_sets_are_marked(tmp_path):
    launch_bound = "launch_bound: the GPU was busy 7.1 us of a 48.3 us span; the rest is launch gaps"
    plain, gaps, by_host = item(shape_id="a", speedup=2.0), item(shape_id="b", speedup=1.0), item(candidate="y", speedup=3.0)
    plain.candidate_timing = {"method": "cupti", "flags": ["l2_flush=read:120MiB"]}
    gaps.baseline_timing = {"method": "cupti", "flags": [launch_bound]}
    by_host.candidate_timing = {"method": "cupti", "host_bound": True, "flags": []}
    assert [scoring.host_set(it) for it in (plain, gaps, by_host)] == [False, True, True]
    # two kernels with 20 us of host work between them in an 84 us span; one kernel, 1% idle
    two_kernels, one_kernel = item(speedup=1.0), item(speedup=1.0)
    two_kernels.candidate_timing = {"method": "cupti", "median_us": 84.0, "busy_us": 64.0, "flags": []}
    one_kernel.candidate_timing = {"method": "cupti", "median_us": 84.0, "busy_us": 83.2, "flags": []}
    assert [scoring.host_set(two_kernels), scoring.host_set(one_kernel)] == [True, False]
    scores = scoring.score([plain, gaps, by_host, item(candidate="z", speedup=1.2)])
    assert {c.candidate: c.host_set_seen for c in scores.candidates} == {"triton_v1": 1, "y": 1, "z": 0}
    LineMatcher(terminal.summary_lines(scores)).fnmatch_lines([
        "cases/vector_add::triton_v1 * yes  yes  1.50x~ *",
        "cases/vector_add::y * yes  yes  3.00x~ *",
        "cases/vector_add::z * yes  yes   1.20x *",
        "~ the host's speed sets part of this mean: the GPU idled between launches for 5%+ of a span",
    ])
    assert max(len(line) for line in terminal.summary_lines(scores)) <= 100
    markdown = step_summary.render_markdown(scores).splitlines()
    LineMatcher(markdown).fnmatch_lines(["| `cases/vector_add` | `triton_v1` | yes | yes | 1.50x\\~ |*", "\\~ the host's speed sets part of this mean*"])
    doc = json_artifact.build_document([plain, gaps, item(candidate="untimed")], scores, settings=settings(tmp_path))
    assert [i.get("host_set") for i in doc["items"]] == [False, True, None]  # only beside a speedup
    # no host-set item, no mark and no note
    assert not any("~" in line for line in terminal.summary_lines(scoring.score([plain])))


def test_terminal_never_prints_a_secret_seed():
    lines = terminal.summary_lines(scoring.score(fixed_items()), seed=987654321, seed_is_secret=True)
    assert not any("987654321" in line or line.startswith("seed") for line in lines)


def test_terminal_pass_at_k_partial_and_regressions():
    items = [item(candidate=f"team-a/{i}", team="team-a", correct=i == 1, speedup=1.0 if i == 1 else None)
             for i in (1, 2)]
    scores = scoring.score(items)
    result = compare.CompareResult(path="old.json", threshold_pct=5.0, rows=[
        compare.CompareRow("cases/vector_add", "team-a/1", 1.25, 1.0, -20.0, True)])
    lines = terminal.summary_lines(scores, partial=True, compare=result,
                                   collection_errors=[{"nodeid": "cases/bad", "message": "x\nSEEN is empty"}])
    LineMatcher(lines).fnmatch_lines([
        "PARTIAL: *",
        "pass@k @1 0.50  @2 1.00",
        "   1. team-a * 60.0  correct 1/1  mean 1.00x",
        "collection error cases/bad: SEEN is empty",
        "compared with old.json (fail below -5%): 1 pair, 1 regressed",
        "  REGRESSION cases/vector_add::team-a/1: 1.25x -> 1.00x (-20.0%)",
    ])


# -- the session, end to end --------------------------------------------------------------------

FAKE_PIPELINE = textwrap.dedent("""
    import pytest
    from pytest_kcoral.stash import session_key

    @pytest.hookimpl(trylast=True)
    def pytest_configure(config):
        # the plugin registered the session already
        config.stash[session_key].lease_history.append({"device": "cpu", "event": "demo"})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(item, call):
        report = yield
        if call.when == "call":
            p = item.callspec.params
            report.kcoral_result = {
                "nodeid": item.nodeid, "case": p["case"], "candidate": p["candidate"],
                "split": p["split"], "shape": {}, "shape_id": p["shape_id"],
                "stage": "done" if p["correct"] else "correctness",
                "outcome": report.outcome, "compiled": True, "correct": p["correct"],
                "baseline_correct": True, "speedup": p["speedup"], "timer": "wall",
                "weak_reference": p["shape_id"] == "weak",
            }
        return report
""")

FAKE_CASES = textwrap.dedent("""
    import pytest

    ITEMS = [
        ("cases/a", "v1", "seen", "n=1", 2.0, True),
        ("cases/a", "v1", "seen", "n=2", 1.0, True),
        ("cases/a", "v1", "unseen", "n=3", 1.2, True),
        ("cases/a", "v2", "seen", "n=1", 0.5, True),
        ("cases/a", "v2", "seen", "n=2", None, False),
        ("cases/a", "v2", "unseen", "n=3", None, False),
        ("cases/b", "w", "seen", "weak", 3.0, True),
        ("cases/b", "w", "seen", "n=8", 3.0, True),
    ]

    @pytest.mark.parametrize("case,candidate,split,shape_id,speedup,correct", ITEMS)
    def test_item(case, candidate, split, shape_id, speedup, correct):
        assert correct, "wrong output"
""")


@pytest.fixture
def fake_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(FAKE_PIPELINE)
    pytester.makepyfile(test_fake=FAKE_CASES)
    pytester.makefile(".py", broken="def oops(:\n")
    return pytester


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "kcoral", "test_fake.py", "broken.py",
                              "--continue-on-collection-errors", *args)


def test_session_summary_and_json(fake_suite: pytest.Pytester, monkeypatch):
    summary = fake_suite.path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = _run(fake_suite, "--kcoral-json", "out.json", "--kcoral-seed", "4242")
    result.assert_outcomes(passed=6, failed=2, errors=1)
    result.stdout.fnmatch_lines([
        "*= kcoral summary =*",
        "case::candidate*",
        "cases/a::v1 * yes  yes   1.50x    1/1   1.20x   20%  270.0   65.0",
        "cases/a::v2 * yes   no   0.50x    0/1       -     -   20.0    0.0",
        "cases/b::w * yes  yes   3.00x      -       -     -  420.0   80.0",
        "WEAK case cases/b: *weak",
        "collection error broken.py: *",
        "seed 4242",
        "results written to *out.json",
    ])
    doc = json.loads((fake_suite.path / "out.json").read_text())
    assert set(doc) == TOP_LEVEL_KEYS
    assert doc["partial"] is False and doc["seed"] == 4242 and doc["seed_is_secret"] is False
    assert len(doc["items"]) == 8
    assert [e["nodeid"] for e in doc["collection_errors"]] == ["broken.py"]
    assert "SyntaxError" in doc["collection_errors"][0]["message"]
    assert doc["lease_history"] == [{"device": "cpu", "event": "demo"}]
    assert "| `cases/a` | `v1` | yes | yes | 1.50x |" in summary.read_text()


def test_session_secret_seed_stays_out_of_the_terminal(fake_suite: pytest.Pytester):
    result = _run(fake_suite, "--kcoral-json", "out.json")
    seed = json.loads((fake_suite.path / "out.json").read_text())["seed"]
    assert isinstance(seed, int)
    assert str(seed) not in result.stdout.str() + result.stderr.str()


def test_session_under_xdist_matches_serial_run(fake_suite: pytest.Pytester):
    pytest.importorskip("xdist")
    serial = _run(fake_suite, "--kcoral-json", "serial.json", "--kcoral-seed", "7")
    parallel = _run(fake_suite, "--kcoral-json", "xdist.json", "--kcoral-seed", "7", "-n", "2",
                    "-p", "no:benchmark")
    parallel.stdout.fnmatch_lines(["*created: 2/2 workers*", "*= kcoral summary =*"])
    assert parallel.ret == serial.ret == pytest.ExitCode.TESTS_FAILED
    a = json.loads((fake_suite.path / "serial.json").read_text())
    b = json.loads((fake_suite.path / "xdist.json").read_text())
    for key in ("items", "candidates", "cases", "suite", "leaderboard", "weak_cases", "seed",
                "collection_errors"):
        assert a[key] == b[key], key
    assert len(b["items"]) == 8


def test_session_interrupted_writes_partial_json(pytester: pytest.Pytester):
    pytester.makeconftest(FAKE_PIPELINE)
    pytester.makepyfile(test_fake=FAKE_CASES + textwrap.dedent("""
        def test_zz_interrupt():
            raise KeyboardInterrupt
    """))
    result = pytester.runpytest("-p", "kcoral", "--kcoral-json", "out.json", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    doc = json.loads((pytester.path / "out.json").read_text())
    assert doc["partial"] is True and len(doc["items"]) == 8
    result.stdout.fnmatch_lines(["PARTIAL: *"])


def test_session_exitfirst_is_partial(fake_suite: pytest.Pytester):
    _run(fake_suite, "--kcoral-json", "out.json", "-x")
    doc = json.loads((fake_suite.path / "out.json").read_text())
    assert doc["partial"] is True


def test_session_compare_fails_on_regression(fake_suite: pytest.Pytester):
    old = fake_suite.path / "old.json"
    _run(fake_suite, "--kcoral-json", str(old), "-k", "not v2")
    doc = json.loads(old.read_text())
    for c in doc["candidates"]:
        if c["candidate"] == "v1":
            c["scored_speedup"] = 2.0  # the saved run was faster: 1.5x now is -25%
    for i in doc["items"]:
        if i["candidate"] == "w":
            i["timer"] = "events"  # the saved run timed w otherwise: not comparable
    old.write_text(json.dumps(doc))
    result = fake_suite.runpytest("-p", "kcoral", "test_fake.py", "-k", "not v2",
                                  "--kcoral-compare", str(old), "--kcoral-compare-fail", "5%",
                                  "--kcoral-json", "new.json", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=5)
    import xml.etree.ElementTree as ET

    suite = ET.parse(fake_suite.path / "junit.xml").getroot().find("testsuite")
    assert {p.get("name"): p.get("value") for p in suite.iter("property")}["kcoral_compare_regressions"] == "1"
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "compared with *old.json (fail below -5%): 1 pair, 1 regressed",
        "  REGRESSION cases/a::v1: 2.00x -> 1.50x (-25.0%)",
        "  NOT COMPARED 1 pair, timed by other methods in the two runs: cases/b::w (events then, wall now)",
    ])
    new = json.loads((fake_suite.path / "new.json").read_text())
    assert [r["candidate"] for r in new["compare"]["regressions"]] == ["v1"]
    assert [(r["candidate"], r["comparable"]) for r in new["compare"]["rows"]] == [("v1", True), ("w", False)]
    # within the threshold: passes
    ok = fake_suite.runpytest("-p", "kcoral", "test_fake.py", "-k", "not v2",
                              "--kcoral-compare", str(old), "--kcoral-compare-fail", "30")
    assert ok.ret == pytest.ExitCode.OK
    # saved from another directory: no case id matches, and the gate fails instead of passing
    for c in doc["candidates"]:
        c["case"] = "elsewhere/" + c["case"]
    old.write_text(json.dumps(doc))
    moved = fake_suite.runpytest("-p", "kcoral", "test_fake.py", "-k", "not v2",
                                 "--kcoral-compare", str(old), "--kcoral-compare-fail", "30")
    assert moved.ret == pytest.ExitCode.TESTS_FAILED
    moved.stdout.fnmatch_lines(["  NOTHING COMPARED: no pair of this run is in the saved run*"])


def test_session_compare_names_a_missing_file(fake_suite: pytest.Pytester):
    result = fake_suite.runpytest("-p", "kcoral", "test_fake.py",
                                  "--kcoral-compare", "missing.json", "--kcoral-compare-fail", "5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kcoral-compare: missing.json: no such file*"])


def test_cases_that_failed_by_themselves_are_named_in_every_report():
    broken = [item(case="cases/c", candidate=name, split=split, shape_id=shape, correct=False)
              for name in ("x", "y") for split, shape in (("unseen", "n=9"), ("seen", "n=8"))]
    for it in broken:
        it.case_failed = True
        it.message = f"the case itself failed (not the candidate): RuntimeError: boom | {it.candidate}\nmore"
    items = fixed_items() + broken
    scores = scoring.score(items)
    (failed,) = scores.failed_cases
    assert failed.case == "cases/c" and failed.shapes == ["seen n=8", "unseen n=9"]
    assert failed.reason.startswith("RuntimeError: boom | ")
    LineMatcher(terminal.summary_lines(scores)).fnmatch_lines(
        ["CASE FAILED cases/c on seen n=8, unseen n=9, every candidate failing there: RuntimeError: boom | ?"])
    assert "- **case failed** `cases/c` on seen n=8, unseen n=9, every candidate failing there: RuntimeError: boom \\| " \
        in step_summary.render_markdown(scores)
    # still failures: the pairs are not correct and earn only the compile credit
    assert {c.candidate: (c.correct_seen, c.aka_score) for c in scores.candidates if c.case == "cases/c"} == {
        "x": (False, 20.0), "y": (False, 20.0)}
    assert not scoring.score(fixed_items()).failed_cases


def test_a_case_that_failed_two_ways_names_each_reason_with_its_shapes():
    def broken(split, shape, why):
        it = item(case="cases/c", candidate="x", split=split, shape_id=shape, correct=False)
        it.case_failed, it.message = True, f"the case itself failed (not the candidate): {why}\nmore"
        return it

    scores = scoring.score([broken("unseen", "n=9", "MemoryError: too big"), broken("seen", "n=8", "ValueError: bad shape"),
                            broken("unseen", "n=10", "MemoryError: too big")])
    (failed,) = scores.failed_cases
    assert failed.shapes == ["seen n=8", "unseen n=10", "unseen n=9"] and failed.reason == "ValueError: bad shape"
    assert failed.other_reasons == [{"reason": "MemoryError: too big", "shapes": ["unseen n=10", "unseen n=9"]}]
    LineMatcher(terminal.summary_lines(scores)).fnmatch_lines([
        "CASE FAILED cases/c on seen n=8, unseen n=10, unseen n=9, every candidate failing there: ValueError: bad shape",
        "  on unseen n=10, unseen n=9: MemoryError: too big"])
    assert "  - on unseen n=10, unseen n=9: MemoryError: too big" in step_summary.render_markdown(scores)


def test_a_wrong_baseline_is_named_in_every_report():
    # speedups against a baseline that disagrees with the reference read as fine in the summary
    wrong = [item(case="cases/w", candidate=name, split=split, shape_id=shape, speedup=2.0, baseline_correct=False)
             for name in ("x", "y") for split, shape in (("unseen", "n=9"), ("seen", "n=8"), ("seen", "n=7"), ("seen", "n=6"))]
    raised = item(case="cases/w", split="seen", shape_id="n=5", correct=False, baseline_correct=False)
    raised.case_failed = True  # said by its CASE FAILED line, with the reason
    raised.message = "the case itself failed (not the candidate): ValueError: no baseline"
    scores = scoring.score(fixed_items() + wrong + [raised])
    (w,) = scores.wrong_baselines
    assert w.case == "cases/w" and w.shapes == ["seen n=6", "seen n=7", "seen n=8", "unseen n=9"]
    line = ("WRONG BASELINE cases/w on seen n=6, seen n=7, seen n=8 and 1 more: its baseline disagrees with the reference;"
            " speedups there compare against wrong code")
    lines = terminal.summary_lines(scores)
    assert line in lines and any(x.startswith("CASE FAILED cases/w on seen n=5,") for x in lines)
    assert ("- **wrong baseline** `cases/w` on seen n=6, seen n=7, seen n=8 and 1 more: its baseline disagrees with the"
            " reference; speedups there compare against wrong code") in step_summary.render_markdown(scores).splitlines()
    # only two shapes: both named, nothing counted; a baseline checked right, or not checked, no line
    LineMatcher(terminal.summary_lines(scoring.score(wrong[:2]))).fnmatch_lines(
        ["WRONG BASELINE cases/w on seen n=8, unseen n=9: its baseline disagrees*"])
    assert not scoring.score(fixed_items()).wrong_baselines
    assert not any("WRONG BASELINE" in x for x in terminal.summary_lines(scoring.score(fixed_items())))


def test_an_unwritable_json_path_is_said_and_fails_the_session(fake_suite: pytest.Pytester):
    (fake_suite.path / "a_file").write_text("not a folder")
    result = fake_suite.runpytest("-p", "kcoral", "test_fake.py", "-k", "not v2", "--kcoral-json", "a_file/out.json")
    result.assert_outcomes(passed=5, deselected=3)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR  # every item passed, but a missing artifact must not pass CI
    result.stderr.re_match_lines([r"^pytest-kcoral: cannot write a_file/out.json: .*; the report was saved to (.*) instead$"])
    saved = re.search(r"the report was saved to (.*) instead", result.stderr.str()).group(1)
    try:
        assert len(json.loads(Path(saved).read_text())["items"]) == 5
    finally:
        os.unlink(saved)


def test_junit_item_figures_keep_six_significant_digits():
    from pytest_kcoral.items import junit_properties

    # interpreted Triton on a CPU reads speedups far below 0.01x: four decimals wrote 0.0007
    props = dict(junit_properties(item(speedup=0.000742123)))
    assert props["kcoral_speedup"] == 0.000742123


def test_a_run_without_seen_shapes_says_its_pairs_were_not_judged():
    # -m unseen, --lf or -k can leave a pair no seen item: "seen no" then means "not run", not "wrong"
    scores = scoring.score([item(split="unseen", shape_id="n=3", speedup=1.2), item(candidate="b", speedup=1.0)])
    note = "NO SEEN SHAPE ran for 1 of 2 pair(s) (-m, -k or --lf): they count as not correct (no correctness points, bench-lite 0) until their seen shapes run"
    assert note in terminal.summary_lines(scores)
    assert f"- **{note}**" in step_summary.render_markdown(scores).splitlines()
    assert not any("NO SEEN SHAPE" in line for line in terminal.summary_lines(scoring.score(fixed_items())))


def test_a_real_cpu_run_names_the_candidates_folder_and_marks_nothing_host_set(make_case, run_kcoral, pytester):
    # on a CPU every time is the host's, on both sides alike: no ~ (README says so too)
    make_case("cases/add")
    make_case("cases/mul")
    result = run_kcoral("-m", "seen", "--kcoral-json", "out.json", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(["   1. cases/[*]/candidates/ * correct 2/2  mean *x"])
    doc = json.loads((pytester.path / "out.json").read_text())
    assert [i["candidate_file"] for i in doc["items"]] == ["cases/add/candidates/good.py", "cases/mul/candidates/good.py"]
    assert [i["host_set"] for i in doc["items"]] == [False, False] and all(i["timer"] == "wall" for i in doc["items"])
    assert doc["leaderboard"][0]["folder"] == "cases/*/candidates"
    assert "~" not in "\n".join(line for line in result.stdout.lines if line.startswith("cases/"))
    assert 'name="kcoral_host_set" value="False"' in (pytester.path / "junit.xml").read_text()


def test_reports_say_what_did_not_run_rather_than_what_failed():
    """An untimed session has no bench-lite score in the JSON (null, as its fast_p), a pair with no
    seen shape run shows '-' for seen, and a skipped candidate is named in the step summary and the
    HTML report as in the terminal."""
    from pytest_kcoral.report import html

    unseen_only = item(split="unseen", shape_id="n=3", baseline_correct=True)
    skipped = item(candidate="needs_cuda")
    skipped.outcome, skipped.stage, skipped.message = "skipped", "compile", "the candidate's process (ext.py) needs CUDA"
    items = [item(team="a"), item(candidate="v2", team="b", correct=False), item(case="cases/b", candidate="u"), skipped]
    items[-2].split, items[-2].shape_id = unseen_only.split, unseen_only.shape_id
    scores = scoring.score(items)
    doc = json_artifact.build_document(items, scores)
    assert doc["suite"]["timed"] is False and doc["suite"]["bench_lite_total"] is None
    assert {(c["bench_lite"], c["bench_lite_weighted"]) for c in doc["candidates"]} == {(None, None)}
    assert [e["bench_lite_total"] for e in doc["leaderboard"]] == [None] * len(doc["leaderboard"])

    rows = {line.split()[0]: line.split() for line in terminal.table_lines(scores)[1:] if "::" in line}
    assert rows["cases/b::u"][2] == "-" and rows["cases/vector_add::triton_v1"][2] == "yes", rows
    markdown = step_summary.render_markdown(scores)
    assert "| `cases/b` | `u` | yes | - |" in markdown
    assert "- **skipped** `cases/vector_add::needs_cuda`: all 1 item(s), not scored: the candidate's process (ext.py) needs CUDA" in markdown
    page = html.render(doc)
    skipped_at = page.index("Skipped, not scored: cases/vector_add::needs_cuda, all 1 item(s)")
    assert page.index("<h2>Failures</h2>") < page.index("<h2>Skipped candidates</h2>") < skipped_at  # not listed as a failure

    timed = scoring.score([item(speedup=0.5)])
    assert json_artifact.build_document([], timed)["suite"]["bench_lite_total"] == pytest.approx(30.0)


def test_the_timings_header_says_which_items_it_lists():
    from pytest_kcoral.report.timings import LISTED, timing_lines

    def timed(i, noisy):
        it = item(shape_id=f"n={i}", speedup=1.0)
        it.t_baseline_us = it.t_candidate_us = 1.0
        it.noisy = noisy
        return it

    many = [timed(i, noisy=i < 3) for i in range(LISTED + 5)]
    assert timing_lines(many)[0].endswith("3 of 25 noisy, only the 3 noisy listed:")
    assert timing_lines([timed(i, noisy=True) for i in range(LISTED + 5)])[0].endswith(f"only the first {LISTED} noisy listed:")
    quiet = timing_lines([timed(i, noisy=False) for i in range(LISTED + 5)])
    assert quiet[0].endswith("0 of 25 noisy, none listed:") and len(quiet) == 2
    assert "listed" not in timing_lines(many[:3])[0]
