"""``--kcoral-compare OLD.json [--kcoral-compare-fail 5%]``: speedups against a saved run.

For every (case, candidate) pair present in both runs the credited mean seen speedup (see
``CandidateScore.scored_speedup``) is compared; a pair slower than the saved run by more than the
threshold is a regression, which the session turns into a non-zero exit status.

A comparison is only as good as its two runs are alike, so it says where they are not:

- a pair whose seen items were timed by other methods in the two runs (CUPTI in one, CUDA events
  in the other, after a fallback) is *not comparable*: the two timers can read one kernel far
  apart (docs/performance.md, "The fallback to CUDA events was silent"). Its change is shown,
  never counted as a regression;
- a pair whose mean carries ``~`` in either run (``scoring.host_set``: the host's speed sets part
  of it) is marked: such means move between two identical runs on one host (docs/performance.md,
  "Drift: what moves is the same between two identical runs"), so a regression there wants a
  rerun before it is believed. It still counts;
- runs on different GPU models are named, since speedups move with the GPU;
- a pair slower by more than the threshold whose two runs' intervals overlap
  (``CandidateScore.mean_speedup_seen_range``) is *within the noise*: the change may be the
  timing's alone, so it is shown and never counted. A saved run without intervals (written
  before they existed) gates as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_kcoral.report import HOST_SET_MARK, fmt_speedup, pair_name
from pytest_kcoral.scoring import CandidateScore

SCHEMA_PREFIX = "pytest-kcoral/"
NAMED_PAIRS = 5  # pairs a caveat names before it counts the rest


class CompareError(Exception):
    """The saved run cannot be used; the message names the file and the problem."""


def parse_threshold(text: str | float) -> float:
    """``"5%"`` or ``"5"`` -> 5.0 (percent); a negative or non-numeric value is a ValueError."""
    raw = str(text).strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"--kcoral-compare-fail expects a percentage such as 5% or 5, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"--kcoral-compare-fail must be a non-negative percentage, got {raw!r}")
    return value


@dataclass
class SavedRun:
    """What a comparison needs of a ``--kcoral-json`` file, per (case, candidate) pair."""

    speedups: dict[tuple[str, str], float | None]  # credited mean seen speedup
    host_set: set[tuple[str, str]] = field(default_factory=set)  # pairs whose seen mean carried ~
    timed_by: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # methods of the seen speedups
    gpus: tuple[str, ...] = ()  # GPU models of the saved run's host
    partial: bool = False  # the saved run was interrupted: its pairs may rest on fewer items
    ranges: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # seen means' ranges, where saved


def pair_methods(items: Iterable[tuple[str, str, str, str | None, float | None]]) -> dict[tuple[str, str], tuple[str, ...]]:
    """(case, candidate) -> the timing methods behind its seen speedups, from (case, candidate,
    split, timer, speedup) per item."""
    methods: dict[tuple[str, str], set[str]] = {}
    for case, candidate, split, timer, speedup in items:
        if split == "seen" and speedup is not None and timer:
            methods.setdefault((case, candidate), set()).add(timer)
    return {key: tuple(sorted(found)) for key, found in methods.items()}


def gpu_models(environment: dict[str, Any] | None) -> tuple[str, ...]:
    """The GPU models of an artifact's ``environment`` (empty on a CPU)."""
    gpus = (environment or {}).get("gpus") or []
    return tuple(sorted({str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")}))


def load_saved_run(path: str | Path) -> SavedRun:
    """The pairs' credited mean seen speedups, ``~`` marks and timing methods, from a
    ``--kcoral-json`` file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CompareError(f"--kcoral-compare: {path}: no such file") from None
    except OSError as exc:
        raise CompareError(f"--kcoral-compare: {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(f"--kcoral-compare: {path}: not valid JSON ({exc})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise CompareError(
            f"--kcoral-compare: {path}: not a pytest-kcoral --kcoral-json file (schema {schema!r})")
    candidates = doc.get("candidates")
    if not isinstance(candidates, list):
        raise CompareError(f"--kcoral-compare: {path}: malformed, 'candidates' is not a list")
    saved = SavedRun(speedups={})
    for i, c in enumerate(candidates):
        try:
            key = (str(c["case"]), str(c["candidate"]))
            value = c.get("scored_speedup", c.get("mean_speedup_seen"))
            saved.speedups[key] = float(value) if value is not None else None
            if c.get("host_set_seen"):  # absent from files written before the mark existed
                saved.host_set.add(key)
            band = c.get("mean_speedup_seen_range")  # absent from files written before intervals existed
            if isinstance(band, list) and len(band) == 2 and all(isinstance(v, (int, float)) for v in band):
                saved.ranges[key] = (float(band[0]), float(band[1]))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CompareError(f"--kcoral-compare: {path}: malformed entry candidates[{i}]") from None
    items = doc.get("items")
    if isinstance(items, list):
        saved.timed_by = pair_methods(
            (str(i.get("case")), str(i.get("candidate")), str(i.get("split")), i.get("timer"), i.get("speedup"))
            for i in items if isinstance(i, dict))
    saved.gpus = gpu_models(doc.get("environment") if isinstance(doc.get("environment"), dict) else None)
    saved.partial = doc.get("partial") is True
    return saved


@dataclass
class CompareRow:
    case: str
    candidate: str
    old_speedup: float | None
    new_speedup: float | None
    change_pct: float | None  # (new - old) / old * 100; negative: slower than the saved run
    regressed: bool
    host_set: bool = False  # the pair's seen mean carries ~ in either run
    old_timed_by: tuple[str, ...] = ()  # timing methods behind each run's seen speedups
    new_timed_by: tuple[str, ...] = ()
    old_range: tuple[float, float] | None = None  # each run's ``mean_speedup_seen_range``, where known
    new_range: tuple[float, float] | None = None
    within_noise: bool = False  # slower beyond the threshold, but the two ranges overlap: not counted

    @property
    def ranges_overlap(self) -> bool:
        """Both runs' ranges are known and share a speedup: the change may be the timing's alone."""
        return (self.old_range is not None and self.new_range is not None
                and self.new_range[1] >= self.old_range[0] and self.old_range[1] >= self.new_range[0])

    @property
    def comparable(self) -> bool:
        """Both runs timed the pair's seen items the same way (unknown counts as the same)."""
        return not (self.old_timed_by and self.new_timed_by) or self.old_timed_by == self.new_timed_by


@dataclass
class CompareResult:
    path: str
    threshold_pct: float | None  # None: report only, never fail
    rows: list[CompareRow] = field(default_factory=list)  # pairs in both runs
    only_old: list[tuple[str, str]] = field(default_factory=list)
    only_new: list[tuple[str, str]] = field(default_factory=list)
    old_gpus: tuple[str, ...] = ()
    new_gpus: tuple[str, ...] = ()
    old_partial: bool = False

    @property
    def regressions(self) -> list[CompareRow]:
        return [r for r in self.rows if r.regressed]

    @property
    def nothing_matched(self) -> bool:
        """Both runs have pairs and none is in both: most often the case ids differ (they are the
        case folders' paths from pytest's rootdir, which follows the working directory)."""
        return not self.rows and bool(self.only_old) and bool(self.only_new)

    @property
    def gate_failed(self) -> bool:
        """The session fails: a pair regressed, or a gate (``--kcoral-compare-fail``) compared
        nothing at all, which must not pass for 'no regression'."""
        return bool(self.regressions) or (self.threshold_pct is not None and self.nothing_matched)

    @property
    def within_noise(self) -> list[CompareRow]:
        """Rows slower than the threshold allows whose two runs' intervals overlap: not counted."""
        return [r for r in self.rows if r.within_noise]

    @property
    def not_comparable(self) -> list[CompareRow]:
        return [r for r in self.rows if not r.comparable]

    @property
    def other_gpus(self) -> bool:
        """The two runs ran on different GPU models (both known)."""
        return bool(self.old_gpus and self.new_gpus) and self.old_gpus != self.new_gpus

    @property
    def compared(self) -> list[CompareRow]:
        """Rows with a change that could count: a speedup on both sides, timed alike."""
        return [r for r in self.rows if r.change_pct is not None and r.comparable]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "threshold_pct": self.threshold_pct,
            "rows": [_row_dict(r) for r in self.rows],
            "regressions": [_row_dict(r) for r in self.regressions],
            "not_comparable": [_row_dict(r) for r in self.not_comparable],
            "within_noise": [_row_dict(r) for r in self.within_noise],
            "only_old": [list(k) for k in self.only_old],
            "only_new": [list(k) for k in self.only_new],
            "old_gpus": list(self.old_gpus),
            "new_gpus": list(self.new_gpus),
            "old_partial": self.old_partial,
            "gate_failed": self.gate_failed,
        }


def _row_dict(row: CompareRow) -> dict[str, Any]:
    d = asdict(row)
    d["old_timed_by"], d["new_timed_by"] = list(row.old_timed_by), list(row.new_timed_by)
    d["old_range"] = list(row.old_range) if row.old_range is not None else None
    d["new_range"] = list(row.new_range) if row.new_range is not None else None
    d["comparable"] = row.comparable
    return d


def compare_runs(
    saved: SavedRun,
    candidates: Sequence[CandidateScore],
    threshold_pct: float | None,
    path: str | Path = "",
    *,
    timed_by: dict[tuple[str, str], tuple[str, ...]] | None = None,
    gpus: tuple[str, ...] = (),
) -> CompareResult:
    """Compare this run's pairs with a saved run's. ``timed_by`` (``pair_methods`` of this run's
    items) and ``gpus`` (``gpu_models`` of this host) say how alike the runs are. Pairs without a
    speedup on either side are listed with ``change_pct`` None, and pairs timed by other methods
    in the two runs are not comparable: neither ever counts as a regression."""
    result = CompareResult(path=str(path), threshold_pct=threshold_pct, old_gpus=saved.gpus, new_gpus=gpus, old_partial=saved.partial)
    timed_by = timed_by or {}
    new = {c.key: c for c in candidates}
    for key in sorted(set(saved.speedups) & set(new)):
        old_s, new_s = saved.speedups[key], new[key].scored_speedup
        change = None
        if old_s is not None and new_s is not None and old_s > 0:
            change = (new_s - old_s) / old_s * 100.0
        row = CompareRow(key[0], key[1], old_s, new_s, change, regressed=False,
                         host_set=key in saved.host_set or bool(new[key].host_set_seen),
                         old_timed_by=saved.timed_by.get(key, ()), new_timed_by=timed_by.get(key, ()),
                         old_range=saved.ranges.get(key), new_range=_range(new[key].mean_speedup_seen_range))
        beyond = change is not None and threshold_pct is not None and -change > threshold_pct and row.comparable
        row.within_noise = beyond and row.ranges_overlap
        row.regressed = beyond and not row.within_noise
        result.rows.append(row)
    result.only_old = sorted(set(saved.speedups) - set(new))
    result.only_new = sorted(set(new) - set(saved.speedups))
    return result


def _range(band: Sequence[float] | None) -> tuple[float, float] | None:
    return (float(band[0]), float(band[1])) if band else None


def fmt_range(band: Sequence[float] | None) -> str:
    """``1.80-2.20x``, or ``?`` when the run has no interval there."""
    return f"{fmt_speedup(band[0])[:-1]}-{fmt_speedup(band[1])}" if band else "?"


def fmt_change(row: CompareRow) -> str:
    """``2.00x -> 1.80x (-10.0%)``, each speedup marked ``~`` when the host sets part of it."""
    mark = HOST_SET_MARK if row.host_set else ""
    old = fmt_speedup(row.old_speedup) + (mark if row.old_speedup is not None else "")
    new = fmt_speedup(row.new_speedup) + (mark if row.new_speedup is not None else "")
    change = f" ({row.change_pct:+.1f}%)" if row.change_pct is not None else ""
    return f"{old} -> {new}{change}"


def largest_changes(result: CompareResult, limit: int = NAMED_PAIRS * 2) -> list[CompareRow]:
    """The compared pairs that moved most, either way: what a report-only comparison shows."""
    return sorted(result.compared, key=lambda r: -abs(r.change_pct or 0.0))[:limit]


def _named(labels: Sequence[str]) -> str:
    """The first ``NAMED_PAIRS`` labels, and how many more: a caveat about every pair names a few."""
    more = f"; and {len(labels) - NAMED_PAIRS} more" if len(labels) > NAMED_PAIRS else ""
    return "; ".join(labels[:NAMED_PAIRS]) + more


def caveats(result: CompareResult) -> list[str]:
    """What makes the two runs less alike than a comparison assumes, one line each."""
    lines = []
    if result.nothing_matched:
        lines.append(f"NOTHING COMPARED: no pair of this run is in the saved run ({len(result.only_old)} there, e.g."
                     f" {pair_name(*result.only_old[0])}; {len(result.only_new)} here, e.g. {pair_name(*result.only_new[0])})."
                     " Case ids are the case folders' paths from pytest's rootdir: run from where the saved run ran,"
                     " or pass the same --rootdir")
    else:
        for pairs, where in ((result.only_old, "the saved run"), (result.only_new, "this run")):
            if pairs:
                lines.append(f"{len(pairs)} pair{'s' if len(pairs) != 1 else ''} only in {where}:"
                             f" {_named([pair_name(*p) for p in pairs])}")
    if result.old_partial:
        lines.append("the saved run was interrupted (partial): its speedups may rest on fewer items than this run's")
    if result.other_gpus:
        lines.append(f"the saved run ran on {', '.join(result.old_gpus)}, this one on {', '.join(result.new_gpus)}:"
                     " speedups move with the GPU")
    rows = result.not_comparable
    if rows:
        # after a fallback every pair may differ: name a few, count the rest
        named = [f"{pair_name(r.case, r.candidate)} ({'+'.join(r.old_timed_by)} then, {'+'.join(r.new_timed_by)} now)" for r in rows]
        lines.append(f"NOT COMPARED {len(rows)} pair{'s' if len(rows) != 1 else ''},"
                     f" timed by other methods in the two runs: {_named(named)}")
    rows = result.within_noise
    if rows:
        named = [f"{pair_name(r.case, r.candidate)} {fmt_change(r)}, {fmt_range(r.old_range)} then, {fmt_range(r.new_range)} now"
                 for r in rows]
        lines.append(f"WITHIN NOISE {len(rows)} pair{'s' if len(rows) != 1 else ''} slower by more than the threshold,"
                     f" not counted: the two runs' intervals overlap: {_named(named)}")
    if any(r.host_set for r in result.regressions):
        lines.append(f"{HOST_SET_MARK} the host's speed sets part of these speedups: rerun before believing"
                     " a regression there")
    return lines
