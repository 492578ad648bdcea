"""Shared by the benchmarks: run a grading session in a subprocess and read its JSON artifact."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def grade(args: list[str], json_path: Path, cwd: Path = ROOT, log: Path | None = None) -> tuple[float, dict[str, Any]]:
    """Run ``pytest -p kcoral ARGS --kcoral-json JSON``; return the wall time and the document."""
    cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", *args, "--kcoral-json", str(json_path)]
    started = time.perf_counter()
    with open(log or os.devnull, "w") as out:
        subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall_s = time.perf_counter() - started
    return wall_s, json.loads(json_path.read_text())


def graded_items(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in doc["items"] if item["outcome"] != "skipped"]


def host_set(item: dict[str, Any]) -> bool:
    """Whether the summary marks the item's speedup ``~`` (the host's speed sets part of it:
    ``scoring.host_set``), read from the item's JSON."""
    from pytest_kcoral.results import ItemResult
    from pytest_kcoral.scoring import host_set as scored_host_set

    return scored_host_set(ItemResult.from_dict(item))


def lease_overlaps(doc: dict[str, Any]) -> int:
    """Pairs of GPU-stage leases on one device that overlap in time (must be 0)."""
    by_device: dict[str, list[tuple[float, float]]] = {}
    for lease in doc.get("lease_history", []):
        by_device.setdefault(lease["lock_key"], []).append((lease["t_acquired"], lease["t_released"]))
    overlaps = 0
    for intervals in by_device.values():
        intervals.sort()
        overlaps += sum(1 for (_, end), (start, _) in zip(intervals, intervals[1:]) if start < end)
    return overlaps


def speedup_pairs(base: dict[str, dict[str, Any]], items: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(reference run's item, this run's item) for every item with a speedup in both runs;
    ``base`` maps node ids to the reference run's items."""
    return [(base[i["nodeid"]], i) for i in items
            if i.get("speedup") and i["nodeid"] in base and base[i["nodeid"]].get("speedup")]


def speedup_change(ref: dict[str, Any], item: dict[str, Any]) -> float:
    """The relative change of an item's speedup against the reference run's (+0.05: 5% higher)."""
    return item["speedup"] / ref["speedup"] - 1


def describe_changes(changes: list[float], sep: str = " | ") -> str:
    """Median relative change, the share within 2% and the largest change, as table cells (or one
    cell's parts)."""
    if not changes:
        return sep.join("-" * 3)
    within = sum(c <= 0.02 for c in changes) / len(changes)
    return sep.join([f"{statistics.median(changes) * 100:.2f}%", f"{within * 100:.0f}% of {len(changes)}", f"{max(changes) * 100:.1f}%"])
