"""xdist scheduling: a shape's items go to one worker.

An item's GPU stages start with the reference data for its (case, shape): inputs and reference
outputs computed by the case's trusted child under the lease, then kept in the worker's memory for
the shape's other candidates. xdist's default ``load`` scheduling spreads a shape's items over the
workers, so every worker computes the same reference again (on a two-GPU H200 host, the summed
reference time doubled from one worker to two: docs/performance.md). Under ``load`` (what ``-n``
implies) the controller hands out each case's shapes as whole units instead; other tests in the
session stay one unit per test, as under ``load``. Any other ``--dist`` mode is left alone.

Item data never leaves the worker: sharing it through files would hand it to same-uid candidates.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from pytest_kcoral.cases import is_kernelbench_problem_file


def shape_scope(nodeid: str, rootpath: Path) -> str:
    """``cases/x::cand[seen-n=4]`` -> ``cases/x::[seen-n=4]`` for the items of a case folder or
    of a KernelBench problem file (``level1/19_ReLU.py``); any other node id is its own unit."""
    path, sep, rest = nodeid.partition("::")
    name, bracket, params = rest.partition("[")
    if sep and bracket and name and "::" not in rest and ((rootpath / path).is_dir() or _problem_file(rootpath / path)):
        return f"{path}::[{params}"
    return nodeid


@functools.lru_cache(maxsize=4096)
def _problem_file(path: Path) -> bool:
    return path.suffix == ".py" and is_kernelbench_problem_file(path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ShapeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return shape_scope(nodeid, config.rootpath)

    return ShapeScheduling(config, log)
