"""A Markdown table of the scores appended to ``$GITHUB_STEP_SUMMARY`` (GitHub Actions shows it on
the run's page). Never prints the seed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pytest_kcoral.report import (
    HOST_SET_MARK,
    NOTHING_TIMED_NOTE,
    WRONG_BASELINE_WHY,
    collection_error_line,
    fmt_bool,
    fmt_mean_speedup,
    fmt_methods,
    fmt_of_peak,
    fmt_pass_at_k,
    fmt_pct,
    fmt_rates,
    fmt_score,
    fmt_seen_correct,
    fmt_shapes,
    fmt_skipped,
    fmt_speed_score,
    fmt_speedup,
    fmt_unseen,
    host_set_note,
    known_answer_lines,
    leaderboard_name,
    no_seen_note,
    nothing_timed,
    pair_name,
)
from pytest_kcoral.report.compare import CompareResult, caveats, fmt_change, largest_changes
from pytest_kcoral.report.timings import timing_markdown
from pytest_kcoral.scoring import Scores

ENV_VAR = "GITHUB_STEP_SUMMARY"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _escape_mark(text: str) -> str:
    return text.replace(HOST_SET_MARK, "\\" + HOST_SET_MARK)  # a bare ~ can strike text through


def _marked(value: float | None, host_set_items: int) -> str:
    return _escape_mark(fmt_mean_speedup(value, host_set_items))


def render_markdown(scores: Scores, *, partial: bool = False, compare: CompareResult | None = None,
                    collection_errors: Sequence[dict] = ()) -> str:
    out = ["## pytest-kcoral", ""]
    if partial:
        out += ["> **Partial run**: the session was interrupted; scores cover the items that ran.", ""]
    if collection_errors:  # cases that were never graded: they appear nowhere in the table below
        out += [f"> **{len(collection_errors)} collection error(s)**: not graded, not in the scores.", ">"]
        out += [f"> - `{_cell(str(e.get('nodeid')))}`: {_cell(collection_error_line(e)[:300])}" for e in collection_errors]
        out += [""]
    out += _pairs_table(scores)
    out += timing_markdown(scores.timed_items)
    out += _suite_bullets(scores)
    out += _finding_bullets(scores)
    out += _leaderboard_table(scores)
    if compare is not None:
        out += _comparison(compare)
    return "\n".join(out) + "\n"


def _pairs_table(scores: Scores) -> list[str]:
    """One row per (case, candidate), the host-set note, and the speed-of-light table."""
    s = scores.suite
    out = [
        "| case | candidate | compiled | seen correct | seen speedup | unseen correct"
        " | unseen speedup | gap | AKA | bench-lite |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in scores.candidates:
        out.append("| " + " | ".join(_cell(x) for x in (
            f"`{c.case}`", f"`{c.candidate}`", fmt_bool(c.compiled), fmt_seen_correct(c.correct_seen, c.seen_items),
            _marked(c.mean_speedup_seen, c.host_set_seen), fmt_unseen(c.correct_unseen),
            _marked(c.mean_speedup_unseen, c.host_set_unseen), fmt_pct(c.generalization_gap),
            fmt_score(c.aka_score), fmt_speed_score(c.bench_lite, s.timed),
        )) + " |")
    note = host_set_note(scores.candidates)
    if note:
        out += ["", _escape_mark(note)]
    rated = [c for c in scores.candidates if c.speed_of_light]
    if rated:  # the cases that declare cost(shape): how far each kernel is from the hardware's peak
        out += ["", "Speed of light: medians on each pair's largest correct seen shape, from the case's `cost(shape)`.", "",
                "| case | candidate | shape | achieved | of peak bandwidth | baseline |", "|---|---|---|---:|---:|---:|"]
        for c in rated:
            sol = c.speed_of_light or {}
            out.append("| " + " | ".join(_cell(x) for x in (
                f"`{c.case}`", f"`{c.candidate}`", f"`{sol['shape_id']}`", fmt_rates(sol), fmt_of_peak(sol), fmt_rates(sol, "baseline"),
            )) + " |")
    return out


def _suite_bullets(scores: Scores) -> list[str]:
    """The suite's figures, one bullet each."""
    s = scores.suite
    q = s.quadrants
    fast = ", ".join(f"fast_{p} {fmt_pct(v)}" for p, v in s.fast_p.items())
    if nothing_timed(s):  # as the terminal says it
        fast += " " + NOTHING_TIMED_NOTE
    out = [
        "",
        f"- pairs {s.pairs}: compiled {fmt_pct(s.compile_rate)}, correct {fmt_pct(s.correctness_rate)}",
        f"- {fast}",
        f"- speedup mean {fmt_speedup(s.mean_speedup)}, geomean {fmt_speedup(s.geomean_speedup)},"
        f" mean generalization gap {fmt_pct(s.mean_generalization_gap)}",
        f"- unseen P(candidate correct | baseline correct) {fmt_pct(s.conditional_correctness)}"
        f" (both pass {q.both_pass}, regressed {q.candidate_regressed}, both fail {q.both_fail},"
        f" improved {q.candidate_improved}{q.note()})",
    ]
    if s.pass_at_k:
        out.append("- pass@k: " + ", ".join(fmt_pass_at_k(s)))
    out.append(f"- bench-lite total (tier-weighted) {fmt_speed_score(s.bench_lite_total, s.timed)}")
    return out


def _finding_bullets(scores: Scores) -> list[str]:
    """What the session found beside the scores (``findings.py``), in bold where it is wrong."""
    out = []
    note = no_seen_note(scores.candidates)
    if note:
        out.append(f"- **{_cell(note)}**")
    for w in scores.weak_cases:
        out.append(f"- **weak case** `{w.case}`: zeros or a constant match the reference on "
                   f"{', '.join(w.shapes)}")
    for f in scores.failed_cases:
        out.append(f"- **case failed** `{f.case}` on {', '.join(f.shapes)}, every candidate failing there:"
                   f" {_cell(f.reason)}")
        out += [f"  - on {', '.join(o['shapes'])}: {_cell(o['reason'])}" for o in f.other_reasons]
    for c in scores.skipped_candidates:
        out.append(f"- **skipped** `{pair_name(c.case, c.candidate)}`: {_cell(fmt_skipped(c.items, c.reason))}")
    for b in scores.wrong_baselines:
        out.append(f"- **wrong baseline** `{b.case}` on {fmt_shapes(b.shapes)}: {WRONG_BASELINE_WHY}")
    for line in known_answer_lines(scores.known_answers):
        out.append(f"- **{_cell(line)}**" if line.startswith("UNEXPECTED") else f"- {_cell(line)}")
    if scores.timers.methods:
        out.append("- timed by " + fmt_methods(scores.timers.methods))
    for reason, n in scores.timers.fallbacks.items():
        out.append(f"- **timer fallback** on {n} item(s): CUDA events, not CUPTI (short kernels read"
                   f" their launch overhead): {_cell(reason)}")
    return out


def _leaderboard_table(scores: Scores) -> list[str]:
    if not scores.leaderboard:
        return []
    out = ["", "| rank | team | bench-lite | correct | mean speedup |", "|---:|---|---:|---:|---:|"]
    for e in scores.leaderboard:
        # a folder in code: its * would start emphasis
        name = _cell(leaderboard_name(e.team, e.folder))
        team = f"`{name}`" if e.team is None and e.folder else name
        out.append(f"| {e.rank} | {team} | {fmt_speed_score(e.bench_lite_total, scores.suite.timed)} |"
                   f" {e.cases_correct}/{e.cases} | {fmt_speedup(e.mean_speedup)} |")
    return out


def _comparison(compare: CompareResult) -> list[str]:
    """The regressions against a saved run (or, report only, the largest changes) and the caveats."""
    shown = compare.regressions if compare.threshold_pct is not None else largest_changes(compare)
    if not (shown or caveats(compare)):
        return []
    head = (f"**{len(compare.regressions)} regression(s)**" if compare.threshold_pct is not None
            else f"**{len(compare.compared)} pair(s) compared** (report only)")
    out = ["", f"{head} against `{compare.path}`:", ""]
    out += [f"- `{r.case}::{r.candidate}` {_escape_mark(fmt_change(r))}" for r in shown]
    out += [f"- {_escape_mark(line)}" for line in caveats(compare)]
    return out


def append_step_summary(path: str | Path, markdown: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown)


def step_summary_path() -> str | None:
    return os.environ.get(ENV_VAR) or None
