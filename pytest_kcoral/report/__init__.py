"""Reports of a session's scores: the terminal table, the JSON artifact, the GitHub step summary
and the comparison with a saved run. Each module reads ``pytest_kcoral.scoring.Scores``; the
number formats they share live here."""

from __future__ import annotations

from typing import Sequence

from pytest_kcoral.scoring import CandidateScore


def fmt_speedup(value: float | None) -> str:
    if value is None:
        return "-"
    # interpreter runs on a CPU give speedups far below 0.01x: keep two significant digits there
    return f"{value:.2f}x" if value >= 0.01 else f"{value:.2g}x"


HOST_SET_MARK = "~"
# fits the 100-column terminal table
HOST_SET_NOTE = "~ the host's speed sets part of this mean: the GPU idled between launches for 5%+ of a span"


def fmt_mean_speedup(value: float | None, host_set_items: int) -> str:
    """A mean speedup, marked when the host's speed sets part of it."""
    text = fmt_speedup(value)
    return text + HOST_SET_MARK if value is not None and host_set_items else text


def host_set_note(candidates: Sequence[CandidateScore]) -> str | None:
    """The note that explains the ``~`` mark, when some pair's mean carries it."""
    return HOST_SET_NOTE if any(c.host_set_seen or c.host_set_unseen for c in candidates) else None


def fmt_methods(methods: dict[str, int]) -> str:
    """Items per timing method, ``cupti 49, events 2`` (empty when nothing was timed)."""
    return ", ".join(f"{method} {n}" for method, n in methods.items())


def fmt_pct(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}%"


def fmt_score(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def fmt_bool(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def fmt_unseen(correct_unseen: dict[str, bool]) -> str:
    """``k/n`` unseen shapes correct; ``-`` when the case has no unseen shapes."""
    if not correct_unseen:
        return "-"
    return f"{sum(correct_unseen.values())}/{len(correct_unseen)}"


def pair_name(case: str, candidate: str) -> str:
    return f"{case}::{candidate}"
