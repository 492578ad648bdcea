"""The speed-of-light report: rates from a case's cost(shape), the share of the GPU's peak, and
where the summary, the JSON, the step summary and JUnit show them."""

from __future__ import annotations

import json
import math

import pytest

from pytest_kcoral import speed_of_light
from pytest_kcoral.results import ItemResult


@pytest.mark.parametrize("cost, usable", [
    ({"flops": 2e9, "bytes": 12}, {"flops": 2e9, "bytes": 12.0}),
    ({"flops": 10}, {"flops": 10.0}),
    ({"flops": -1, "bytes": math.nan}, None),
    ({"flops": True, "bytes": "12"}, None),
    ({"bytes": math.inf, "flops": 0}, None),
    ([1, 2], None),
    (None, None),
])
def test_only_finite_positive_counts_are_used(cost, usable):
    assert speed_of_light.valid_cost(cost) == usable


def test_rates_and_the_share_of_the_peak():
    sol = speed_of_light.report({"flops": 4e9, "bytes": 1e9}, 4.8e12, t_baseline_us=2000.0, t_candidate_us=1000.0)
    assert sol["candidate_gbps"] == pytest.approx(1000.0)  # 1 GB in 1 ms
    assert sol["candidate_tflops"] == pytest.approx(4.0)
    assert sol["baseline_gbps"] == pytest.approx(500.0)
    assert sol["peak_gbps"] == pytest.approx(4800.0)
    assert sol["candidate_of_peak"] == pytest.approx(1000 / 4800)
    assert sol["memory_bound_us"] == pytest.approx(1e9 / 4.8e12 * 1e6)


def test_no_peak_no_share_and_no_cost_no_report():
    sol = speed_of_light.report({"flops": 4e9}, None, None, 1000.0)
    assert sol["candidate_tflops"] == pytest.approx(4.0)
    assert sol["candidate_gbps"] is None and sol["candidate_of_peak"] is None and sol["baseline_tflops"] is None
    assert speed_of_light.report(None, 4.8e12, 1.0, 1.0) is None
    assert speed_of_light.report({"bytes": 1.0}, 4.8e12, 1.0, None) is None


def _item(shape_id: str, nbytes: float, split: str = "seen", correct: bool = True) -> ItemResult:
    return ItemResult(nodeid=f"c::k[{shape_id}]", case="c", candidate="k", split=split, shape={}, shape_id=shape_id,
                      correct=correct, speed_of_light={"bytes": nbytes, "flops": None, "candidate_gbps": nbytes})


def test_a_pair_is_reported_on_its_largest_correct_seen_shape():
    items = [_item("small", 10), _item("large", 1000), _item("wrong", 10_000, correct=False),
             _item("held_out", 100_000, split="unseen")]
    assert speed_of_light.largest_shape(items)["shape_id"] == "large"
    assert speed_of_light.largest_shape([_item("x", 5, correct=False)]) is None


CASE_WITH_COST = """
import torch
SEEN = [{"n": 1024}, {"n": 8192}]
UNSEEN = [{"n": 1000}]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a + b

def cost(shape):
    return {"flops": shape["n"], "bytes": 12 * shape["n"]}
"""


def test_a_case_with_a_cost_gets_rates_everywhere(make_case, run_kcoral, pytester, monkeypatch):
    summary = pytester.path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    make_case("cases/add", CASE_WITH_COST, {"add": "def run(a, b):\n    return a + b\n"})
    make_case("cases/plain", CASE_WITH_COST.replace("def cost", "def _no_cost"), {"add": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("--kcoral-json", "results.json", "--junitxml", "junit.xml", "--kcoral-timing-budget", "0.05")
    result.assert_outcomes(passed=6)
    doc = json.loads((pytester.path / "results.json").read_text())
    for item in doc["items"]:
        sol = item["speed_of_light"]
        if item["case"] == "cases/plain":
            assert sol is None
            continue
        n = item["shape"]["n"]
        assert sol["bytes"] == 12 * n and sol["flops"] == n
        assert sol["candidate_gbps"] == pytest.approx(12 * n / (item["t_candidate_us"] * 1e3))
        assert sol["peak_gbps"] is None and sol["candidate_of_peak"] is None  # no spec sheet for a CPU
    (pair,) = [c for c in doc["candidates"] if c["case"] == "cases/add"]
    assert pair["speed_of_light"]["shape_id"] == "n=8192"  # the largest seen shape, never an unseen one
    out = result.stdout.str()
    assert "speed of light (medians on each pair's largest correct seen shape" in out
    result.stdout.fnmatch_lines(["  cases/add::add ?n=8192?: * (baseline *)"])
    assert "cases/plain::add [" not in out
    assert "| `cases/add` | `add` | `n=8192` |" in summary.read_text()
    assert 'name="kcoral_candidate_gbps"' in (pytester.path / "junit.xml").read_text()


def test_a_cost_the_report_cannot_use_is_said_at_collection_and_the_case_still_grades(make_case, run_kcoral, pytester):
    broken = CASE_WITH_COST.replace('return {"flops": shape["n"], "bytes": 12 * shape["n"]}',
                                    'if shape["n"] == 1024:\n        return {"byte": 12 * shape["n"]}\n'
                                    '    if shape["n"] == 1000:\n        raise KeyError("m")\n'
                                    '    return {"flops": shape["n"], "bytes": 12 * shape["n"]}')
    make_case("cases/add", broken, {"add": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("--kcoral-json", "results.json", "--kcoral-timing-budget", "0.05")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "*case.py:1: PytestWarning: cases/add: cost(shape) for seen shape n=1024 returned unknown keys byte (known: flops, bytes);"
        " that shape gets no speed-of-light figures or physical floor*",
        "*cases/add: cost(shape) for unseen shape n=1000 raised KeyError: 'm'*",
    ])
    doc = json.loads((pytester.path / "results.json").read_text())
    by_shape = {item["shape_id"]: item["speed_of_light"] for item in doc["items"]}
    assert by_shape["n=1024"] is None and by_shape["n=1000"] is None
    assert by_shape["n=8192"]["bytes"] == 12 * 8192
