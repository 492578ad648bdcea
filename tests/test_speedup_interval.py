"""The speedup's confidence interval and the noisy mark (``pytest_kcoral.speedup_interval``)."""

from __future__ import annotations

import json
import math
import random

import pytest

from pytest_kcoral import combine
from pytest_kcoral import speedup_interval as si
from pytest_kcoral.results import ItemResult, TimingStats


def binomial_coverage(n: int, k: int) -> float:
    """P(X(k) <= median <= X(n+1-k)) for n draws of a continuous distribution."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n


@pytest.mark.parametrize("n", [6, 7, 8, 16, 31, 32, 64, 160])
def test_ranks_are_the_narrowest_that_reach_the_level(n):
    k, upper = si.order_statistic_ranks(n)
    assert upper == n + 1 - k
    assert binomial_coverage(n, k) >= 0.95
    assert k == (n + 1) // 2 or binomial_coverage(n, k + 1) < 0.95  # one rank further in misses the level


def test_too_few_ratios_have_no_interval():
    assert si.order_statistic_ranks(5) is None  # min and max of 5 cover the median 93.75% of the time
    assert si.speedup_interval([1.0, 1.1, 0.9, 1.05, 0.95]) is None
    assert si.speedup_interval([]) is None
    assert si.order_statistic_minimum() == 6
    assert si.speedup_interval([1.0] * 5, level=0.9) is not None  # 93.75% >= 90%


def test_eight_rounds_give_the_range_and_32_rounds_the_ranks_of_the_binomial():
    ratios = [1.0 + i / 100 for i in range(8)]
    random.Random(1).shuffle(ratios)
    assert si.speedup_interval(ratios) == (1.0, 1.07)  # k=2 covers 93%: only the extremes reach 95%
    ratios32 = [1.0 + i / 100 for i in range(32)]
    random.Random(2).shuffle(ratios32)
    low, high = si.speedup_interval(ratios32)
    assert (low, high) == (1.09, 1.22)  # ranks 10 and 23
    assert low <= combine.median_ratio(ratios32) <= high


def test_interval_always_contains_the_paired_median():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(6, 40)
        ratios = [rng.lognormvariate(0, 0.2) for _ in range(n)]
        low, high = si.speedup_interval(ratios)
        assert low <= combine.median_ratio(ratios) <= high


def test_interval_covers_the_true_median_at_least_at_its_level():
    # 2000 simulated items whose round ratios scatter around a true speedup of 1.3
    rng = random.Random(11)
    hits = 0
    for _ in range(2000):
        ratios = [1.3 * rng.lognormvariate(0, 0.05) for _ in range(8)]
        low, high = si.speedup_interval(ratios)
        hits += low <= 1.3 <= high
    assert hits / 2000 >= 0.97  # eight draws: min..max, 99.2% nominal


def test_bad_bounds_give_no_interval():
    assert si.speedup_interval([math.inf] * 8) is None  # a candidate that read 0 us every round
    assert si.speedup_interval([1.0] * 7 + [math.inf]) is None


def test_several_processes_widen_the_interval_by_their_spread():
    rng = random.Random(3)
    tight = [[1.0 * rng.lognormvariate(0, 0.002) for _ in range(32)] for _ in range(5)]
    one_pair = si.speedup_interval(tight[2])
    # five processes at levels 10% apart: the interval spans the processes, not one's rounds
    spread = [[level * r for r in rounds] for level, rounds in zip((0.9, 0.95, 1.0, 1.05, 1.1), tight)]
    low, high = si.processes_interval(spread)
    assert low < 0.97 and high > 1.03
    assert one_pair[1] - one_pair[0] < 0.01
    point = sorted(combine.median_ratio(r) for r in spread)[2]
    assert low <= point <= high
    assert si.processes_interval(spread) == (low, high)  # a fixed seed: the same figures every time
    assert si.processes_interval([tight[0]]) == si.speedup_interval(tight[0])
    assert si.processes_interval([tight[0], []]) is None


def _rounds(medians):
    return [TimingStats(method="cupti", median_us=m, n=3, samples_us=[m * 0.99, m, m * 1.01]) for m in medians]


def test_item_interval_is_scaled_as_the_charged_speedup():
    pair = combine.ProcessPair(_rounds([20.0] * 8), _rounds([10.0, 10.1, 9.9, 10.2, 9.8, 10.0, 10.05, 9.95]))
    base, cand = pair.side_stats("baseline"), pair.side_stats("candidate")
    speedup = combine.item_speedup([pair], base, cand)
    low, high = si.item_interval([pair], cand, speedup)
    assert low <= speedup <= high
    assert (low, high) == pytest.approx((20 / 10.2, 20 / 9.8))
    uncharged_us = cand.median_us
    cand.median_us += 10.0  # charged: about half the speed
    cand.charged_us = 10.0
    charged = combine.item_speedup([pair], base, cand)
    scale = uncharged_us / cand.median_us
    assert charged == pytest.approx(speedup * scale)
    assert si.item_interval([pair], cand, charged) == pytest.approx((low * scale, high * scale))
    assert si.item_interval([pair], cand, None) is None


def _item(speedup, ci=None, timer="cupti", **timing) -> ItemResult:
    side = dict(dict(method=timer, median_us=10.0, flags=[], rounds=8), **timing)
    return ItemResult(nodeid="c::v[seen-n=1]", case="c", candidate="v", split="seen", shape={}, shape_id="n=1",
                      speedup=speedup, speedup_ci=ci, timer=timer, baseline_timing=dict(side), candidate_timing=dict(side))


def test_noisy_when_the_interval_is_wide_with_the_reasons_in_one_line():
    assert si.judge_noise(_item(1.0, [0.99, 1.01])) == (False, None)
    noisy, reason = si.judge_noise(_item(1.0, [0.8, 1.3], timer="wall", rounds_dropped=3,
                                         flags=["rse_target_missed: 0.01 >= 0.005 after 9 samples in 5 rounds"]),
                                   interpreted_triton=True)
    assert noisy and "\n" not in reason
    assert reason.startswith("wall-clock timing; ")
    for cause in ("wall-clock timing", "interpreter", "3/8 round pairs dropped", "rse target missed (baseline, candidate)"):
        assert cause in reason
    assert si.judge_noise(_item(1.0, None), rounds=1) == (
        True, "no interval from 1 round pair (6 needed): the round pairs' ratios spread (the host's speed varied)")
    assert si.judge_noise(_item(None)) == (False, None)


def test_fmt_interval():
    assert si.fmt_interval([1.2, 1.22], 1.21) == "±0.8%"
    assert si.fmt_interval([0.5, 1.5], 1.0) == "(0.50-1.50x)"
    assert si.fmt_interval([0.0004, 0.002], 0.0009) == "(0.0004-0.002x)"
    assert si.fmt_interval(None, 1.0) == "±?"
    assert si.fmt_interval(None, None) == ""


def test_uses_triton_reads_the_source_as_text(tmp_path):
    (tmp_path / "k.py").write_text("import torch\nimport triton.language as tl\n")
    (tmp_path / "t.py").write_text("import torch\n# triton would be faster\n")
    assert si.uses_triton(tmp_path / "k.py") and not si.uses_triton(tmp_path / "t.py")
    assert not si.uses_triton(tmp_path / "missing.py") and not si.uses_triton(None)


# -- end to end, on real child processes -----------------------------------------------------------

# slow for 10 ms, fast for the next 10 ms, ...: its rounds, a few ms each, read either speed, so the
# ratios of its rounds to the baseline's spread far beyond 5% whatever the machine's load
PHASED = """
import time
def run(a, b):
    if int(time.monotonic() * 100) % 2:
        end = time.perf_counter() + 200e-6
        while time.perf_counter() < end:
            pass
    return a + b
"""


def test_every_speedup_carries_its_interval_and_a_wavering_one_is_noisy(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"good": "def run(a, b):\n    return a + b\n", "phased": PHASED})
    result = run_kcoral("--kcoral-json", "out.json", "--junitxml", "junit.xml", "-m", "seen")
    result.assert_outcomes(passed=2, deselected=2)
    items = {it["candidate"]: it for it in json.loads((pytester.path / "out.json").read_text())["items"]}
    for it in items.values():
        low, high = it["speedup_ci"]
        assert low <= it["speedup"] <= high
        assert it["speedup_ci_level"] == 0.95
        side = it["candidate_timing"]
        assert len(side["quantiles_us"]) == min(65, side["n"])  # every sample, up to 65 quantiles
        assert side["quantiles_us"] == sorted(side["quantiles_us"]) and side["quantiles_us"][0] == pytest.approx(side["min_us"], rel=1e-3)
    phased = items["phased"]
    assert phased["noisy"] is True
    assert phased["noisy_reason"].startswith("wall-clock timing"), phased["noisy_reason"]
    assert si.relative_half_width(phased["speedup_ci"], phased["speedup"]) > si.NOISY_HALF_WIDTH
    # the terminal shows both medians and the interval, and marks the noisy item with its reason
    result.stdout.fnmatch_lines([
        "timings (median, baseline -> candidate; speedup with its 95% interval): * of 2 noisy:",
        "  cases/add::phased?seen-n=256?  * us -> * us  *x (*-*x)  NOISY",  # ? for [ and ], which fnmatch reads as a set
        "      wall-clock timing*",
    ])
    import xml.etree.ElementTree as ET

    case = next(c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase") if "phased" in c.get("name"))
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert float(props["kcoral_speedup_ci_low"]) <= float(props["kcoral_speedup"]) <= float(props["kcoral_speedup_ci_high"])
    assert props["kcoral_noisy"].startswith("wall-clock timing")
