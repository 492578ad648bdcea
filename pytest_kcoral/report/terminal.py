"""The terminal summary (controller only): one row per (case, candidate), then the suite.

``summary_lines`` is a pure function so tests can read the table without a terminal; it fits a
100-column terminal. The seed is printed only when the user chose it: a secret seed must not
reach logs a candidate's author can read.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pytest_kcoral.report import (
    NOTHING_TIMED_NOTE,
    WRONG_BASELINE_WHY,
    collection_error_line,
    fmt_bool,
    fmt_mean_speedup,
    fmt_methods,
    fmt_pass_at_k,
    fmt_pct,
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
    shorten_middle,
    speed_of_light_lines,
)
from pytest_kcoral.report.compare import CompareResult, caveats, fmt_change, largest_changes
from pytest_kcoral.report.timings import timing_lines
from pytest_kcoral.scoring import Scores, TimerUse

NAME_WIDTH = 40
COLUMNS = (  # header, width
    ("comp", 4), ("seen", 4), ("seen x", 7), ("unseen", 6), ("unsn x", 7), ("gap", 5),
    ("AKA", 6), ("bench", 6),  # bench-lite before the tier weight
)
# under the table: what each column holds (each line fits the 100-column terminal)
LEGEND = (
    "comp: compiled  seen: correct on every seen shape  unseen: correct unseen shapes/unseen shapes",
    "seen x, unsn x: mean speedup (baseline time / candidate time) over the correct seen, unseen shapes",
    "gap: (seen x - unsn x) / seen x; above 0 is bad: slower on unseen shapes than on seen ones",
    "AKA: AgentKernelArena score (20 compiled, +100 correct, +100 x seen x)",
    "bench: bench-lite score (60 x seen x below 1x, 100 at 5x), before the tier weight; -: not measured",
)


def _row(name: str, cells: Sequence[str]) -> str:
    parts = [f"{shorten_middle(name, NAME_WIDTH):<{NAME_WIDTH}}"]
    parts += [f"{cell:>{width}}" for cell, (_, width) in zip(cells, COLUMNS)]
    return " ".join(parts).rstrip()


def table_lines(scores: Scores) -> list[str]:
    lines = [_row("case::candidate", [h for h, _ in COLUMNS])]
    for c in scores.candidates:
        lines.append(_row(pair_name(c.case, c.candidate), [
            fmt_bool(c.compiled),
            fmt_seen_correct(c.correct_seen, c.seen_items),
            fmt_mean_speedup(c.mean_speedup_seen, c.host_set_seen),
            fmt_unseen(c.correct_unseen),
            fmt_mean_speedup(c.mean_speedup_unseen, c.host_set_unseen),
            fmt_pct(c.generalization_gap),
            fmt_score(c.aka_score),
            fmt_speed_score(c.bench_lite, scores.suite.timed),
        ]))
    note = host_set_note(scores.candidates)
    if note:
        lines.append(note)
    if scores.candidates:
        lines += LEGEND
    return lines


def suite_lines(scores: Scores) -> list[str]:
    s = scores.suite
    q = s.quadrants
    fast = " ".join(f"fast_{p} {fmt_pct(v)}" for p, v in s.fast_p.items())
    lines = [
        f"pairs {s.pairs}  compiled {fmt_pct(s.compile_rate)}  correct on every seen shape {fmt_pct(s.correctness_rate)}",
        fast + "  " + NOTHING_TIMED_NOTE if nothing_timed(s) else fast,
        f"speedup mean {fmt_speedup(s.mean_speedup)}  geomean {fmt_speedup(s.geomean_speedup)}"
        f"  mean gap {fmt_pct(s.mean_generalization_gap)}",
        f"unseen P(candidate ok | baseline ok) {fmt_pct(s.conditional_correctness)}:"
        f" both pass {q.both_pass}, regressed {q.candidate_regressed},"
        f" both fail {q.both_fail}, improved {q.candidate_improved}{q.note()}",
    ]
    if s.pass_at_k:
        lines.append("pass@k " + "  ".join(fmt_pass_at_k(s)))
    lines.append(f"bench-lite total (tier-weighted) {fmt_speed_score(s.bench_lite_total, s.timed)}")
    note = no_seen_note(scores.candidates)
    if note:
        lines.append(note)
    if scores.leaderboard:
        lines.append("leaderboard (best attempt per case):")
        for e in scores.leaderboard:
            lines.append(
                f"  {e.rank:>2}. {shorten_middle(leaderboard_name(e.team, e.folder), 30):<30} {fmt_speed_score(e.bench_lite_total, s.timed):>8}"
                f"  correct {e.cases_correct}/{e.cases}  mean {fmt_speedup(e.mean_speedup)}")
    for w in scores.weak_cases:
        lines.append(f"WEAK case {w.case}: zeros or a constant match the reference on "
                     f"{', '.join(w.shapes)}")
    for f in scores.failed_cases:
        lines.append(f"CASE FAILED {f.case} on {', '.join(f.shapes)}, every candidate failing there: {f.reason}")
        lines += [f"  on {', '.join(o['shapes'])}: {o['reason']}" for o in f.other_reasons]
    for c in scores.skipped_candidates:
        lines.append(f"SKIPPED {pair_name(c.case, c.candidate)}: {fmt_skipped(c.items, c.reason)}")
    for b in scores.wrong_baselines:
        lines.append(f"WRONG BASELINE {b.case} on {fmt_shapes(b.shapes)}: {WRONG_BASELINE_WHY}")
    lines += known_answer_lines(scores.known_answers)
    lines += timer_lines(scores.timers)
    return lines


def timer_lines(timers: TimerUse) -> list[str]:
    """Which timer timed the items, and why any GPU item was not timed by CUPTI."""
    if not timers.methods:
        return []
    lines = ["timed by " + fmt_methods(timers.methods)]
    for reason, n in timers.fallbacks.items():
        lines.append(f"TIMER FALLBACK on {n} item{'s' if n != 1 else ''}: CUDA events, not CUPTI"
                     f" (short kernels read their launch overhead): {reason}")
    return lines


def compare_lines(result: CompareResult) -> list[str]:
    threshold = f"fail below -{result.threshold_pct:g}%" if result.threshold_pct is not None else "report only"
    n = len(result.compared)
    lines = [f"compared with {result.path} ({threshold}): {n} pair{'s' if n != 1 else ''},"
             f" {len(result.regressions)} regressed"]
    lines += [f"  REGRESSION {pair_name(r.case, r.candidate)}: {fmt_change(r)}" for r in result.regressions]
    if result.threshold_pct is None:  # report only: what moved, since nothing can fail
        shown = largest_changes(result)
        lines += [f"  {pair_name(r.case, r.candidate)}: {fmt_change(r)}" for r in shown]
        if len(result.compared) > len(shown):
            lines.append(f"  ... {len(result.compared) - len(shown)} more in the JSON (compare.rows)")
    return lines + [f"  {line}" for line in caveats(result)]


def summary_lines(
    scores: Scores,
    *,
    seed: int | None = None,
    seed_is_secret: bool = True,
    partial: bool = False,
    compare: CompareResult | None = None,
    collection_errors: Sequence[dict] = (),
    json_path: str | None = None,
    html_path: str | None = None,
    notes: Sequence[str] = (),
) -> list[str]:
    """Every line of the summary below its title."""
    lines: list[str] = []
    if partial:
        lines.append("PARTIAL: the session was interrupted; scores cover the items that ran")
    lines += table_lines(scores)
    lines += speed_of_light_lines(scores.candidates)
    lines += timing_lines(scores.timed_items)
    lines.append("")
    lines += suite_lines(scores)
    for err in collection_errors:
        lines.append(f"collection error {err.get('nodeid')}: {collection_error_line(err)}")
    if compare is not None:
        lines += compare_lines(compare)
    if seed is not None and not seed_is_secret:
        lines.append(f"seed {seed}")
    lines += notes
    if json_path:
        lines.append(f"results written to {json_path}")
    if html_path:
        lines.append(f"report page written to {html_path}")
    return lines


# The summary's lines that say something is wrong, by how they begin: written in red.
RED_LINES = ("REGRESSION", "WEAK", "PARTIAL", "collection error", "TIMER FALLBACK", "NOT COMPARED", "NOTHING COMPARED", "CASE FAILED",
             "NO SEEN SHAPE", "WRONG BASELINE", "UNEXPECTED", "NOT CONFINED", "REPORT")


def write_summary(terminalreporter: pytest.TerminalReporter, lines: Sequence[str]) -> None:
    terminalreporter.write_sep("=", "kcoral summary")
    for line in lines:
        red = line.lstrip().startswith(RED_LINES)
        terminalreporter.write_line(line, red=red)
