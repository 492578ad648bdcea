"""Reports of a session's scores: the terminal table, the JSON artifact, the GitHub step summary
and the comparison with a saved run. Each module reads ``pytest_kcoral.scoring.Scores``; the
number formats they share live here."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kcoral.scoring import CandidateScore, KnownAnswers, SuiteScore


def fmt_speedup(value: float | None) -> str:
    if value is None:
        return "-"
    # interpreter runs on a CPU give speedups far below 0.01x: keep two significant digits there
    return f"{value:.2f}x" if value >= 0.01 else f"{value:.2g}x"


def junit_figure(value: float) -> float:
    """A figure for a JUnit property, to six significant digits: a fixed number of decimals wrote
    a 0.000742x speedup (interpreted Triton) as 0.0007, and 1e-6 TFLOP/s as 0.0."""
    return float(f"{value:.6g}")


def collection_error_line(error: dict) -> str:
    """The line of a collection error that says what is wrong: its last non-empty one."""
    lines = [line.strip() for line in str(error.get("message") or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def no_seen_note(candidates: Sequence[CandidateScore]) -> str | None:
    """A pair is correct only on seen shapes that ran: said when some pair had none in this run
    (``-m unseen``, ``--lf``, ``-k``), where its "seen no" means "not graded", not "wrong"."""
    n = sum(1 for c in candidates if c.seen_items == 0)
    if not n:
        return None
    return (f"NO SEEN SHAPE ran for {n} of {len(candidates)} pair(s) (-m, -k or --lf): they count as not correct"
            " (no correctness points, bench-lite 0) until their seen shapes run")


SHAPES_NAMED = 3  # a line about a case names this many of its shapes and counts the rest


def fmt_shapes(shapes: Sequence[str]) -> str:
    """``seen n=8, seen n=9, unseen n=10 and 2 more``: a few shapes named, the rest counted."""
    more = f" and {len(shapes) - SHAPES_NAMED} more" if len(shapes) > SHAPES_NAMED else ""
    return ", ".join(shapes[:SHAPES_NAMED]) + more


WRONG_BASELINE_WHY = "its baseline disagrees with the reference; speedups there compare against wrong code"


NOTHING_TIMED_NOTE = "(nothing timed: --kcoral-mode correctness measures no speed)"


def nothing_timed(suite: SuiteScore) -> bool:
    """Pairs, but no fast_p at all: correct pairs and not one item timed (``score_suite``), where
    "fast_0 0%" would read as "none of them is correct"."""
    return bool(suite.pairs) and all(v is None for v in suite.fast_p.values())


def fmt_speed_score(value: float | None, timed: bool) -> str:
    """A score that only speed earns (bench-lite): '-' when the run timed nothing, where 0.0
    would read as measured and lost (``SuiteScore.timed``)."""
    return fmt_score(value) if timed else "-"


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


def fmt_pass_at_k(s: SuiteScore) -> list[str]:
    """``@k p`` per k; where fewer (team, case) groups made k attempts than made one, how many:
    ``@4 1.00 (1 of 3 groups)``, so a mean over fewer groups does not read as pass@k falling."""
    groups = s.pass_at_k_groups or {}
    everyone = groups.get("1")
    return [f"@{k} {v:.2f}" + (f" ({groups[k]} of {everyone} groups)" if everyone and groups.get(k, everyone) < everyone else "")
            for k, v in (s.pass_at_k or {}).items()]


def fmt_pct(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}%"


def fmt_score(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def fmt_bool(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def fmt_skipped(items: int, reason: str) -> str:
    """Why a skipped candidate has no score (``findings.SkippedCandidate``)."""
    return f"all {items} item(s), not scored: {reason}"


def fmt_seen_correct(correct_seen: bool | None, seen_items: int) -> str:
    """``yes``/``no``; ``-`` when no seen shape ran (``-m unseen``), where ``no`` would read as wrong."""
    return fmt_bool(correct_seen) if seen_items else "-"


def fmt_unseen(correct_unseen: dict[str, bool]) -> str:
    """``k/n`` unseen shapes correct; ``-`` when the case has no unseen shapes."""
    if not correct_unseen:
        return "-"
    return f"{sum(correct_unseen.values())}/{len(correct_unseen)}"


def pair_name(case: str, candidate: str) -> str:
    return f"{case}::{candidate}"


def shorten_middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` in its middle. A ``case::candidate`` name loses the middle of its
    case first, so the candidate, which tells a case's rows apart, stays whole while it fits."""
    if len(text) <= width:
        return text
    case, sep, candidate = text.rpartition("::")
    room = width - len(sep) - len(candidate)
    if sep and room >= 9:  # a few letters of the case on either side of the cut
        return _cut_middle(case, room) + sep + candidate
    return _cut_middle(text, width)


def _cut_middle(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    kept = width - 3
    return text[: (kept + 1) // 2] + "..." + text[len(text) - kept // 2:]


def leaderboard_name(team: str | None, folder: str | None) -> str:
    """A leaderboard entry's name: its team's; for the bundled candidates (team None), their
    folder, as a pattern when they lie in several (``cases/*/candidates/``, or ``cases/**`` at
    several depths)."""
    if team is not None:
        return team
    if not folder:
        return "(bundled)"
    return folder if folder.endswith("**") else f"{folder}/"


def fmt_bandwidth(gbps: float | None) -> str:
    if not gbps:
        return "-"
    if gbps >= 1000:
        return f"{gbps / 1000:.3g} TB/s"
    return f"{gbps:.3g} GB/s" if gbps >= 1 else f"{gbps * 1000:.3g} MB/s"


def fmt_flops(tflops: float | None) -> str:
    if not tflops:
        return "-"
    return f"{tflops:.3g} TFLOP/s" if tflops >= 1 else f"{tflops * 1000:.3g} GFLOP/s"


def fmt_rates(sol: dict, side: str = "candidate") -> str:
    """One side's achieved rates from a speed-of-light dict: ``3.12 TB/s, 0.26 TFLOP/s``."""
    parts = []
    if sol.get(f"{side}_gbps"):
        parts.append(fmt_bandwidth(sol[f"{side}_gbps"]))
    if sol.get(f"{side}_tflops"):
        parts.append(fmt_flops(sol[f"{side}_tflops"]))
    return ", ".join(parts) or "-"


def fmt_of_peak(sol: dict) -> str:
    """``65% of 4.8 TB/s`` (the spec sheet's DRAM bandwidth), or ``-`` without a known peak."""
    if sol.get("candidate_of_peak") is None:
        return "-"
    return f"{sol['candidate_of_peak'] * 100:.0f}% of {fmt_bandwidth(sol.get('peak_gbps'))}"


SPEED_OF_LIGHT_TITLE = "speed of light (medians on each pair's largest correct seen shape, from the case's cost(shape)):"


def speed_of_light_lines(candidates: Sequence[CandidateScore]) -> list[str]:
    """One line per pair whose case declares ``cost``: its rates, the share of the peak, the baseline's."""
    rated = [c for c in candidates if c.speed_of_light]
    if not rated:
        return []
    lines = [SPEED_OF_LIGHT_TITLE]
    for c in rated:
        sol = c.speed_of_light or {}
        peak = f" = {fmt_of_peak(sol)}" if sol.get("candidate_of_peak") is not None else ""
        lines.append(f"  {pair_name(c.case, c.candidate)} [{sol['shape_id']}]: {fmt_rates(sol)}{peak} (baseline {fmt_rates(sol, 'baseline')})")
    return lines


def known_answer_lines(answers: KnownAnswers) -> list[str]:
    """The known answers (``scoring.KnownAnswers``): one line of counts, then a line per
    surprise, starting ``UNEXPECTED`` (the terminal shows those in red)."""
    if not answers.expected_fail and not answers.expected_pass and not answers.undecided:
        return []
    lines = [f"known answers: {answers.failed_as_expected} of {answers.expected_fail} wrong failed as expected,"
             f" {answers.passed_as_expected} of {answers.expected_pass} correct passed; {len(answers.unexpected)} unexpected"]
    for u in answers.unexpected:
        name = pair_name(u["case"], u["candidate"])
        if u["expected"] == "fail":
            lines.append(f"UNEXPECTED PASS {name}: passed all {u['items']} item(s), expected to fail (XPASS(strict));"
                         " known-wrong candidates are left out of the scores")
        else:
            lines.append(f"UNEXPECTED FAILURE {name}: failed {u['failed_items']} of {u['items']} item(s), expected to pass")
    for u in answers.undecided:
        lines.append(f"known-wrong {pair_name(u['case'], u['candidate'])}: passed the {u['items']} item(s) run of its {u['shapes']};"
                     " not judged (run all its shapes to see it fail)")
    return lines
