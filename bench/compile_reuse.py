"""A ``torch.compile`` candidate over five shapes: how many processes, how many compilations.

A candidate's child is kept across its items (``kept_children.py``), so a ``torch.compile``
candidate should compile once per shape in one process, not once per item in a process of its
own. This grades such a candidate over five seen shapes in full mode, with Inductor's caches off
(a cached graph would hide the cost), and prints per item: the candidate's first process, the
graphs it had compiled by then (a counting backend in front of Inductor), and the item's phases.
Then, per candidate process (a host-set item is timed in further pairs of processes, each with a
candidate process of its own): the shapes it compiled and the graphs it compiled in all.

Every candidate process appends one line per shape to a log in the bench's own directory, so the
session runs with ``--kcoral-confinement off`` (a confined candidate may write only its own
directories); confinement does not change what is compiled.

Run: ``python bench/compile_reuse.py`` (a GPU, or the CPU).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = [1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14]

CASE = f"""
import torch
SEEN = [{{"n": n}} for n in {SIZES}]
UNSEEN = []

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    return a * b + a
"""

# prints once per shape, on its first call in a process (the correctness stage's), and logs it
CANDIDATE = """
import os, sys, torch

LOG = __LOG__

_graphs = [0]

def _counting(gm, example_inputs):
    _graphs[0] += 1
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs)

_fused = torch.compile(lambda a, b: a * b + a, backend=_counting)
_shapes = set()

def run(a, b):
    out = _fused(a, b)
    if tuple(a.shape) not in _shapes:
        _shapes.add(tuple(a.shape))
        line = f"COMPILED pid={os.getpid()} graphs={_graphs[0]} n={a.shape[0]}"
        print(line, file=sys.stderr, flush=True)
        with open(LOG, "a") as log:
            log.write(line + "\\n")
    return out
"""


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="kcoral-compile-"))
    case = work / "cases" / "fused"
    (case / "candidates").mkdir(parents=True)
    (case / "case.py").write_text(CASE)
    log = work / "compiled.log"
    (case / "candidates" / "compiled.py").write_text(CANDIDATE.replace("__LOG__", repr(str(log))))
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    cmd = [sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", "cases", "--kcoral-json", "out.json",
           "-p", "no:randomly", "--kcoral-confinement", "off"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    doc = json.loads((work / "out.json").read_text())
    print(f"{'item':34s} {'outcome':8s} {'pid':>8s} {'graphs':>6s} {'compile ms':>10s} {'correctness ms':>14s} {'timing ms':>9s} {'item s':>6s}")
    pids, graphs = set(), 0
    for item in doc["items"]:
        text = ((item.get("output_tail") or {}).get("stderr") or {}).get("text", "")
        seen = dict(part.split("=") for line in text.splitlines() if line.startswith("COMPILED ") for part in line.split()[1:])
        pids.add(seen.get("pid"))
        graphs = max(graphs, int(seen.get("graphs", 0)))
        phases = item.get("phases_ms") or {}
        print(f"{item['nodeid'].split('::')[1]:34s} {item['outcome']:8s} {seen.get('pid', '-'):>8s} {seen.get('graphs', '-'):>6s}"
              f" {phases.get('compile', 0):10.0f} {phases.get('correctness', 0):14.0f} {phases.get('timing', 0):9.0f} {item['duration_s']:6.2f}")
    durations = [item["duration_s"] for item in doc["items"]]
    print(f"\n{len(doc['items'])} items in {len(pids - {None})} candidate process(es); {graphs} graph(s) compiled;"
          f" item wall mean {statistics.mean(durations):.2f} s, median {statistics.median(durations):.2f} s; pytest exit {proc.returncode}")
    print_processes(log)


def print_processes(log: Path) -> None:
    """Per candidate process, from the log: the shapes it compiled, and its graphs in all."""
    by_pid: dict[str, list[dict[str, str]]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        fields = dict(part.split("=") for part in line.split()[1:])
        by_pid.setdefault(fields["pid"], []).append(fields)
    print(f"\n{len(by_pid)} candidate process(es) in all:")
    for pid, lines in by_pid.items():
        shapes = [int(f["n"]) for f in lines]
        repeated = len(shapes) - len(set(shapes))
        print(f"  pid {pid}: {len(set(shapes))} shape(s) {sorted(set(shapes))}, {max(int(f['graphs']) for f in lines)} graph(s)"
              + (f", {repeated} shape(s) compiled twice" if repeated else ""))


if __name__ == "__main__":
    main()
