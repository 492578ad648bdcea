"""Throughput: grade the bundled cases' self-speedup suite under several settings, side by side.

Each configuration grades every bundled case with a candidate identical to its baseline (as
``bench/self_speedup.py`` does), one configuration after the other in one run, and the table
says, per configuration: items per second, each item's wall time (mean and median of the JSON's
``duration_s``), the median of each phase, and the self-speedup precision (the share within
[0.98, 1.02] and the count outside [0.95, 1.05]).

    python bench/throughput.py --config new= --config fixed=--kcoral-precision=off
    python bench/throughput.py --config old@.oldtree= --config new=    # .oldtree: an older pytest_kcoral

``NAME=ARGS`` adds a configuration whose extra pytest arguments are ARGS (split as a shell would; a
``-k`` there replaces the suite's ``-k self``);
``NAME@DIR=ARGS`` grades it with the ``pytest_kcoral`` package found in DIR (put first on
``PYTHONPATH``), e.g. an older commit's, extracted by ``git archive OLD pytest_kcoral | tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _grade import ROOT, grade, graded_items
from self_speedup import write_submissions

PHASES = ("compile", "reference", "correctness", "timing", "verify", "fresh_processes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True, metavar="NAME[@DIR]=ARGS")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="grade each configuration this many times, in turns")
    parser.add_argument("pytest_args", nargs="*", default=[])
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kcoral-throughput-"))
    subs = out / "subs"
    if not subs.exists():
        write_submissions(ROOT / "cases", subs)
    configs = [_parse(text) for text in args.config]
    kinds: list[tuple[str, dict]] = []
    # each row as soon as its run ends: a run cut by a time limit leaves the rows before it
    print("| config | items | wall s | items/s | per item mean s | per item median s | "
          + " | ".join(f"{p} ms" for p in PHASES) + " | within 2% | outside 5% | failed |")
    print("|---" * (9 + len(PHASES)) + "|", flush=True)
    for turn in range(args.repeat):
        for name, tree, extra in configs:
            saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "PYTHONSAFEPATH")}
            if tree:
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(tree).resolve()), saved["PYTHONPATH"]]))
                # ``python -m pytest`` puts its working directory (this checkout) first on sys.path,
                # ahead of PYTHONPATH, unless told not to
                os.environ["PYTHONSAFEPATH"] = "1"
                _check_package_root(Path(tree).resolve())
            try:
                wall_s, doc = grade(["cases", "--kcoral-submissions", str(subs), "-k", "self", *extra, *args.pytest_args],
                                    out / f"{name}-{turn}.json", log=out / f"{name}-{turn}.log")
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
            print("| " + " | ".join(_row(f"{name} #{turn + 1}", wall_s, doc)) + " |", flush=True)
            kinds.append((f"{name} #{turn + 1}", doc))
    # where issue 28's per-item time goes: items timed in several pairs of processes, in one, and
    # each case's first item (which starts the case's processes)
    print("\n| config | several pairs: items, mean s | one pair: items, mean s, median s | cases' first items: sum s | later items: mean s |")
    print("|---|---|---|---|---|")
    for label, doc in kinds:
        print("| " + " | ".join([label, *_kinds(doc)]) + " |")
    print(f"\nJSON and logs: {out}")


def _check_package_root(tree: Path) -> None:
    """Stop unless a grading session started here would import ``pytest_kcoral`` from ``tree``."""
    found = subprocess.run([sys.executable, "-c", "import pytest_kcoral; print(pytest_kcoral.__file__)"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(found).is_relative_to(tree):
        raise SystemExit(f"a session would import pytest_kcoral from {found}, not from {tree}")


def _parse(text: str) -> tuple[str, str | None, list[str]]:
    head, _, extra = text.partition("=")
    name, _, tree = head.partition("@")
    return name, tree or None, shlex.split(extra)


def _kinds(doc: dict) -> list[str]:
    """The items' wall times by kind: several pairs of processes or one; a case's first item or a later one."""
    items = [i for i in graded_items(doc) if i["candidate"] == "self"]
    several = [i["duration_s"] for i in items if ((i.get("candidate_timing") or {}).get("processes") or 1) > 1]
    one = [i["duration_s"] for i in items if i.get("candidate_timing") and (i["candidate_timing"].get("processes") or 1) == 1]
    seen: set[str] = set()
    first, later = [], []
    for i in items:
        (later if i["case"] in seen else first).append(i["duration_s"])
        seen.add(i["case"])

    def mean(values: list[float]) -> str:
        return f"{statistics.mean(values):.2f}" if values else "-"

    return [f"{len(several)}, {mean(several)}", f"{len(one)}, {mean(one)}, {statistics.median(one):.2f}" if one else "0",
            f"{sum(first):.1f}", mean(later)]


def _row(label: str, wall_s: float, doc: dict) -> list[str]:
    items = [i for i in graded_items(doc) if i["candidate"] == "self"]
    durations = [i["duration_s"] for i in items]
    speedups = [i["speedup"] for i in items if i.get("speedup")]
    failed = sum(i["outcome"] != "passed" for i in items)
    phases = []
    for phase in PHASES:
        values = [i["phases_ms"][phase] for i in items if phase in (i.get("phases_ms") or {})]
        phases.append(f"{statistics.median(values):.0f}" if values else "-")
    within = sum(0.98 <= s <= 1.02 for s in speedups)
    outside = sum(not 0.95 <= s <= 1.05 for s in speedups)
    return [label, str(len(items)), f"{wall_s:.0f}", f"{len(items) / wall_s:.3f}",
            f"{statistics.mean(durations):.2f}" if durations else "-", f"{statistics.median(durations):.2f}" if durations else "-",
            *phases, f"{within}/{len(speedups)}", str(outside), str(failed)]


if __name__ == "__main__":
    main()
