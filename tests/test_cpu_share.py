"""Each process of a session gets a fair share of the host's cores for torch's CPU pool."""

from __future__ import annotations

import json
import os

import pytest

from pytest_kcoral import cpu_share


def test_the_cores_are_divided_among_the_processes_that_run_at_once():
    assert cpu_share.threads_per_process(30, 2) == 15
    assert cpu_share.threads_per_process(30, 8) == 3
    assert cpu_share.threads_per_process(2, 4) == 1  # never none
    assert cpu_share.threads_per_process(8, 0) == 8


# the worker's own torch pool, read after each item by a conftest in the graded folder
POOL_SPY = """
import json, os, torch

def pytest_runtest_teardown(item):
    with open(os.path.join(str(item.config.rootpath), "pools.jsonl"), "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "threads": torch.get_num_threads()}) + "\\n")
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_each_worker_limits_its_torch_pool_to_its_share(make_case, run_kcoral, pytester, workers):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    expected = max(1, cores // (cpu_share.POOLS_PER_WORKER * workers))
    make_case("cases/add")
    pytester.makeconftest(POOL_SPY)
    args = ["-n", str(workers)] if workers > 1 else []
    run_kcoral(*args, "-m", "seen", "--kcoral-json", "out.json").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["extra"]["cpu_threads"] == expected
    pools = [json.loads(line) for line in (pytester.path / "pools.jsonl").read_text().splitlines()]
    assert pools and all(p["threads"] == expected for p in pools), (pools, expected)
    if workers > 1:
        assert all(p["pid"] != os.getpid() for p in pools), "graded in an xdist worker"


def test_cpu_threads_option_sets_every_pool(make_case, run_kcoral, pytester):
    make_case("cases/add")
    pytester.makeconftest(POOL_SPY)
    run_kcoral("-m", "seen", "--kcoral-cpu-threads", "3", "--kcoral-json", "out.json").assert_outcomes(passed=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    assert item["extra"]["cpu_threads"] == 3
    pools = [json.loads(line) for line in (pytester.path / "pools.jsonl").read_text().splitlines()]
    assert pools and all(p["threads"] == 3 for p in pools), pools


def test_cpu_threads_option_must_be_positive(make_case, run_kcoral):
    make_case("cases/add")
    result = run_kcoral("--kcoral-cpu-threads", "0")
    assert "--kcoral-cpu-threads must be at least 1, not 0" in result.stderr.str()
