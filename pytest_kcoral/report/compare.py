"""``--kcoral-compare OLD.json [--kcoral-compare-fail 5%]``: speedups against a saved run.

For every (case, candidate) pair present in both runs the credited mean seen speedup (see
``CandidateScore.scored_speedup``) is compared; a pair slower than the saved run by more than the
threshold is a regression, which the session turns into a non-zero exit status.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pytest_kcoral.scoring import CandidateScore

SCHEMA_PREFIX = "pytest-kcoral/"


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


def load_saved_run(path: str | Path) -> dict[tuple[str, str], float | None]:
    """(case, candidate) -> credited mean seen speedup, from a ``--kcoral-json`` file."""
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
    saved: dict[tuple[str, str], float | None] = {}
    for i, c in enumerate(candidates):
        try:
            key = (str(c["case"]), str(c["candidate"]))
            value = c.get("scored_speedup", c.get("mean_speedup_seen"))
            saved[key] = float(value) if value is not None else None
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CompareError(f"--kcoral-compare: {path}: malformed entry candidates[{i}]") from None
    return saved


@dataclass
class CompareRow:
    case: str
    candidate: str
    old_speedup: float | None
    new_speedup: float | None
    change_pct: float | None  # (new - old) / old * 100; negative: slower than the saved run
    regressed: bool


@dataclass
class CompareResult:
    path: str
    threshold_pct: float | None  # None: report only, never fail
    rows: list[CompareRow] = field(default_factory=list)  # pairs in both runs
    only_old: list[tuple[str, str]] = field(default_factory=list)
    only_new: list[tuple[str, str]] = field(default_factory=list)

    @property
    def regressions(self) -> list[CompareRow]:
        return [r for r in self.rows if r.regressed]

    @property
    def compared(self) -> list[CompareRow]:
        return [r for r in self.rows if r.change_pct is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "threshold_pct": self.threshold_pct,
            "rows": [asdict(r) for r in self.rows],
            "regressions": [asdict(r) for r in self.regressions],
            "only_old": [list(k) for k in self.only_old],
            "only_new": [list(k) for k in self.only_new],
        }


def compare_runs(
    saved: dict[tuple[str, str], float | None],
    candidates: Sequence[CandidateScore],
    threshold_pct: float | None,
    path: str | Path = "",
) -> CompareResult:
    """Compare this run's pairs with a saved run's; pairs without a speedup on either side are
    listed with ``change_pct`` None and never count as regressions."""
    result = CompareResult(path=str(path), threshold_pct=threshold_pct)
    new = {c.key: c.scored_speedup for c in candidates}
    for key in sorted(set(saved) & set(new)):
        old_s, new_s = saved[key], new[key]
        change = None
        if old_s is not None and new_s is not None and old_s > 0:
            change = (new_s - old_s) / old_s * 100.0
        regressed = change is not None and threshold_pct is not None and -change > threshold_pct
        result.rows.append(CompareRow(key[0], key[1], old_s, new_s, change, regressed))
    result.only_old = sorted(set(saved) - set(new))
    result.only_new = sorted(set(new) - set(saved))
    return result
