"""What the tamper check after every command costs (``tamper.Snapshot.changed``), with every
module of the package loaded, as in a grading child late in a session:

    python3 bench/tamper_cost.py [--tree DIR]    (DIR: the folder holding the pytest_kcoral to time)
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--checks", type=int, default=300)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.tree).resolve()))
    import torch  # noqa: F401 - its namespaces are watched

    import pytest_kcoral

    for module in pkgutil.walk_packages(pytest_kcoral.__path__, "pytest_kcoral."):
        try:
            importlib.import_module(module.name)
        except Exception:  # noqa: BLE001 - a module that needs what this machine lacks is simply not watched
            pass
    from pytest_kcoral import tamper

    snapshot = tamper.Snapshot.take()
    times = []
    for _ in range(args.checks):
        started = time.perf_counter()
        snapshot.changed()
        times.append((time.perf_counter() - started) * 1e6)
    watched = getattr(snapshot, "ids", None) or snapshot._objects  # ``ids`` in trees before 2026-12-07's
    print(f"{tamper.__file__}: {len(watched)} watched names, a check {statistics.median(times):.0f} us (median)")


if __name__ == "__main__":
    main()
