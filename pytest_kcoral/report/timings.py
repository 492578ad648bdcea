"""Each timed item's absolute times and its speedup's interval, for the terminal and the step
summary: the pair table shows means, and a mean hides how sure each speedup is.

A long suite lists its noisy items only (``speedup_interval.judge_noise``), up to ``LISTED``; the
JSON and the HTML report hold every item.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kcoral.report import fmt_speedup
from pytest_kcoral.results import ItemResult
from pytest_kcoral.speedup_interval import CI_LEVEL, fmt_interval

LISTED = 20  # items listed in the terminal before only the noisy ones are
LISTED_MARKDOWN = 200  # rows of the step summary's table


def fmt_us(value: float | None) -> str:
    """A median in microseconds: three significant digits below 100 us, whole ones above."""
    if value is None:
        return "-"
    return f"{value:.3g} us" if value < 100 else f"{value:.0f} us"


def fmt_speedup_ci(item: ItemResult) -> str:
    """``1.21x ±0.8%``: the speedup and how far its interval reaches (``±?`` without one)."""
    if item.speedup is None:
        return "-"
    return f"{fmt_speedup(item.speedup)} {fmt_interval(item.speedup_ci, item.speedup)}"


def listed(items: Sequence[ItemResult], limit: int) -> tuple[list[ItemResult], str | None]:
    """The items to list, and a note on those left out: every item when they fit, else the
    noisy ones first (up to ``limit``)."""
    if len(items) <= limit:
        return list(items), None
    noisy = [it for it in items if it.noisy]
    shown = noisy[:limit]
    return shown, (f"{len(items) - len(shown)} more timed item(s) ({len(noisy) - len(shown)} of them noisy)"
                   " in the JSON and the HTML report")


def timing_lines(items: Sequence[ItemResult]) -> list[str]:
    """The terminal's lines: a title, then per item its medians and speedup, and under a noisy
    item why it is noisy."""
    if not items:
        return []
    shown, rest = listed(items, LISTED)
    noisy = sum(1 for it in items if it.noisy)
    title = f"timings (median, baseline -> candidate; speedup with its {CI_LEVEL:.0%} interval): {noisy} of {len(items)} noisy"
    if len(shown) < len(items):
        first = "first " if len(shown) < noisy else ""
        title += f", only the {first}{len(shown)} noisy listed" if shown else ", none listed"
    lines = [title + ":"]
    for it in shown:
        mark = "  NOISY" if it.noisy else ""
        lines.append(f"  {it.nodeid}  {fmt_us(it.t_baseline_us)} -> {fmt_us(it.t_candidate_us)}  {fmt_speedup_ci(it)}{mark}")
        if it.noisy and it.noisy_reason:
            lines.append(f"      {it.noisy_reason}")
    if rest:
        lines.append(f"  ... {rest}")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def timing_markdown(items: Sequence[ItemResult]) -> list[str]:
    """The step summary's table, folded (``<details>``): every item up to ``LISTED_MARKDOWN``."""
    if not items:
        return []
    shown, rest = listed(items, LISTED_MARKDOWN)
    noisy = sum(1 for it in items if it.noisy)
    out = ["", f"<details><summary>Timings: {len(items)} item(s), {noisy} noisy</summary>", "",
           f"| item | baseline | candidate | speedup | {CI_LEVEL:.0%} interval | noisy |", "|---|---:|---:|---:|---:|---|"]
    for it in shown:
        ci = f"{fmt_speedup(it.speedup_ci[0])} - {fmt_speedup(it.speedup_ci[1])}" if it.speedup_ci else "-"
        out.append("| " + " | ".join(_cell(x) for x in (
            f"`{it.nodeid}`", fmt_us(it.t_baseline_us), fmt_us(it.t_candidate_us), fmt_speedup(it.speedup), ci,
            (it.noisy_reason or "yes") if it.noisy else "",
        )) + " |")
    if rest:
        out += ["", rest]
    return out + ["", "</details>"]
