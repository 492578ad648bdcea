"""``--kcoral-html PATH``: the session as one self-contained HTML page.

The page is rendered from the ``--kcoral-json`` document (``json_artifact.build_document``), so
it shows the same figures. Everything is inline: CSS, and charts as SVG drawn here. It loads
nothing (no script, no font, no image), and its Content-Security-Policy forbids all of that, so
it can be opened from a CI artifact offline.

Names and messages come from candidates, which are hostile: every text and attribute goes
through ``html.escape``, and nothing a candidate wrote becomes an element id.

Sections: the suite's scores, each pair's speedups with their intervals (seen and unseen side by
side), the outcome grid, the failures with their messages, every item, and each timed item's
timing distributions (baseline against candidate, from the quantiles its record keeps).

``python -m pytest_kcoral.report.html results.json report.html`` renders a saved document.
"""

from __future__ import annotations

import html
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pytest_kcoral.report import fmt_pct, fmt_score, fmt_seen_correct, fmt_speedup, leaderboard_name, pair_name
from pytest_kcoral.report.timings import fmt_us
from pytest_kcoral.speedup_interval import fmt_interval

# Bounds on the page's size for large suites: the points a distribution draws per side shrink
# as items grow, and past ``MAX_DISTRIBUTIONS`` items the rest are only in the JSON.
MAX_DISTRIBUTIONS = 2000
MESSAGE_CHARS = 4000  # of a failure's message; the JSON keeps it whole

COLORS = {"baseline": "#4e79a7", "candidate": "#f28e2b", "seen": "#4e79a7", "unseen": "#b07aa1"}
# outcome grid: a passed item, a skipped one, a failure by its stage, the case's own failure
OUTCOME_COLORS = {"passed": "#b7e1b0", "skipped": "#e3e3e3", "compile": "#e57373", "correctness": "#f4a3a3",
                  "timing": "#ffd08a", "case": "#c9b3e6"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 48px;color:#1d1d1f}
h1{font-size:22px;margin:20px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 4px}
.meta{color:#555}.banner{background:#fff3cd;border:1px solid #e0c36c;padding:8px 12px;margin:10px 0}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.grid td{text-align:center;font-size:12px;min-width:56px}
.noisy{color:#a15c00;font-weight:600}.bad{color:#b00020;font-weight:600}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:6px 8px;margin:4px 0;font-size:12px;max-height:320px;overflow:auto}
details{margin:4px 0}summary{cursor:pointer}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #ccc;font-size:12px}
svg{display:block;margin:4px 0}svg text{font:11px system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;fill:#333}
.dist{display:inline-block;vertical-align:top;margin:0 16px 8px 0}
"""


def esc(value: Any) -> str:
    """Text or an attribute value, escaped (quotes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


# -- scales and ticks ---------------------------------------------------------------------------


class LogScale:
    """Positions on a logarithmic axis from ``low`` to ``high`` (both > 0) over ``x0``..``x1``."""

    def __init__(self, low: float, high: float, x0: float, x1: float) -> None:
        if not high > low:  # one value: a decade around it
            low, high = low / math.sqrt(10), high * math.sqrt(10)
        self.low, self.high, self.x0, self.x1 = low, high, x0, x1
        self._span = math.log(high / low)

    def __call__(self, value: float) -> float:
        value = min(max(value, self.low), self.high)
        return self.x0 + (self.x1 - self.x0) * math.log(value / self.low) / self._span

    def ticks(self, most: int = 7) -> list[float]:
        """Round values inside the axis: 1, 2, 5 x 10^k over a wide range (only 10^k when those
        are too many), evenly stepped ones over a narrow range (less than 3x end to end)."""
        if self.high / self.low < 3:
            return _linear_ticks(self.low, self.high, most=5)
        for steps in ((1, 2, 5), (1,)):
            found = [m * 10.0 ** k for k in range(math.floor(math.log10(self.low)) - 1, math.ceil(math.log10(self.high)) + 1)
                     for m in steps if self.low <= m * 10.0 ** k <= self.high]
            if len(found) <= most:
                break
        if len(found) > most:
            found = found[:: math.ceil(len(found) / most)]
        return found


def _linear_ticks(low: float, high: float, most: int) -> list[float]:
    """Multiples of the smallest round step (1, 2, 2.5 or 5 x 10^k) that gives at most ``most``
    ticks between ``low`` and ``high``."""
    for k in range(math.floor(math.log10(high - low)) - 2, math.ceil(math.log10(high - low)) + 1):
        for m in (1, 2, 2.5, 5):
            step = m * 10.0 ** k
            first = math.ceil(low / step)
            ticks = [round(i * step, 12) for i in range(first, math.floor(high / step) + 1)]
            if 2 <= len(ticks) <= most:
                return ticks
    return [low, high]


def padded_scale(values: Iterable[float], x0: float, x1: float, include: Sequence[float] = ()) -> LogScale:
    """A log scale over the positive values (and ``include``), with a little room at both ends."""
    found = [v for v in list(values) + list(include) if v is not None and v > 0 and math.isfinite(v)]
    if not found:
        found = [1.0]
    low, high = min(found), max(found)
    pad = (high / low) ** 0.06 if high > low else 1.0
    return LogScale(low / pad, high * pad, x0, x1)


def _tick_label(value: float, unit: str = "") -> str:
    text = f"{value:.4g}" if value < 1000 else f"{value:,.0f}"  # 1,000 us, not 1e+03 us
    return text + unit


def _axis(scale: LogScale, y: float, unit: str = "", top: float | None = None) -> list[str]:
    """Tick marks and labels along ``y``; with ``top``, faint grid lines up to it."""
    out = [f'<line x1="{scale.x0:.1f}" y1="{y:.1f}" x2="{scale.x1:.1f}" y2="{y:.1f}" stroke="#999"/>']
    for t in scale.ticks():
        x = scale(t)
        if top is not None:
            out.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + 4:.1f}" stroke="#999"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 15:.1f}" text-anchor="middle">{esc(_tick_label(t, unit))}</text>')
    return out


def _svg(width: float, height: float, body: Sequence[str], css_class: str, label: str) -> str:
    return (f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}"'
            f' viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{esc(label)}">'
            f'<title>{esc(label)}</title>{"".join(body)}</svg>')


# -- speedup charts ------------------------------------------------------------------------------


def _interval_mark(scale: LogScale, y: float, value: float | None, band: Sequence[float] | None, color: str,
                   hollow: bool = False, tip: str = "") -> list[str]:
    """A speedup as a dot with its interval as a whisker; hollow when noisy."""
    out = []
    if band and _num(band[0]) and _num(band[1]):
        x0, x1 = scale(band[0]), scale(band[1])
        out.append(f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" stroke="{color}" stroke-width="2"/>')
        out += [f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x:.1f}" y2="{y + 4:.1f}" stroke="{color}" stroke-width="1.5"/>' for x in (x0, x1)]
    if value is not None and value > 0:
        fill = "#fff" if hollow else color
        out.append(f'<circle cx="{scale(value):.1f}" cy="{y:.1f}" r="4" fill="{fill}" stroke="{color}" stroke-width="1.5">'
                   f'<title>{esc(tip)}</title></circle>')
    return out


def _two_panels(rows: Sequence[tuple[str, list[dict | None]]], title: str, css_class: str, panels: Sequence[str] = ("seen", "unseen"),
                label_width: float = 300, cell_label_width: float = 0) -> str:
    """A chart of speedups in two panels side by side (seen, unseen), one row per label; a row's
    cell per panel is ``{"value", "band", "noisy", "tip", "note", "label"}`` or None (nothing
    there). A cell's own label (a shape) sits at its panel's left, in ``cell_label_width``."""
    panel_width, row_height, top = 300.0, 20.0, 22.0
    width = label_width + len(panels) * (cell_label_width + panel_width + 24)
    bottom = top + row_height * max(1, len(rows))
    body = []
    for p, name in enumerate(panels):
        x0 = label_width + p * (cell_label_width + panel_width + 24) + cell_label_width + 12
        cells = [row[1][p] for row in rows]
        scale = padded_scale([v for c in cells if c for v in [c.get("value"), *(c.get("band") or [])] if _num(v)], x0, x0 + panel_width, include=[1.0])
        body.append(f'<text x="{x0 + panel_width / 2:.1f}" y="14" text-anchor="middle" font-weight="600">{esc(name)}</text>')
        body += _axis(scale, bottom + 2, "x", top=top)
        one = scale(1.0)
        body.append(f'<line x1="{one:.1f}" y1="{top:.1f}" x2="{one:.1f}" y2="{bottom:.1f}" stroke="#888" stroke-dasharray="3,3"/>')
        for r, cell in enumerate(cells):
            y = top + row_height * (r + 0.5)
            if cell is None:
                continue
            if cell.get("label"):
                body.append(f'<text x="{x0 - 6:.1f}" y="{y + 4:.1f}" text-anchor="end">{esc(_shorten(cell["label"], 18))}'
                            f'<title>{esc(cell["label"])}</title></text>')
            if cell.get("value") is None:
                body.append(f'<text x="{x0 + 4:.1f}" y="{y + 4:.1f}" fill="#b00020">{esc(cell.get("note") or "-")}</text>')
                continue
            body += _interval_mark(scale, y, _num(cell["value"]), cell.get("band"), COLORS[name], bool(cell.get("noisy")), cell.get("tip", ""))
    for r, (label, _) in enumerate(rows):
        if label:
            y = top + row_height * (r + 0.5)
            body.append(f'<text x="{label_width - 6:.1f}" y="{y + 4:.1f}" text-anchor="end">{esc(_shorten(label, 46))}<title>{esc(label)}</title></text>')
    return _svg(width + 20, bottom + 26, body, css_class, title)  # room for the last tick's label


def _shorten(text: str, most: int) -> str:
    """Cut in the middle: a case's prefix and a candidate's name both tell rows apart."""
    if len(text) <= most:
        return text
    head = (most - 3) // 2
    return text[:head] + "..." + text[len(text) - (most - 3 - head):]


def _pair_cell(c: dict, split: str) -> dict | None:
    value = _num(c.get(f"mean_speedup_{split}"))
    has_shapes = c.get("seen_items") if split == "seen" else c.get("correct_unseen")
    if value is None:
        if not has_shapes:
            return {"value": None, "note": "no shapes"} if split == "seen" else None
        none_correct = not any((c.get("correct_unseen") or {}).values()) if split == "unseen" else not c.get("seen_correct_items")
        return {"value": None, "note": "none correct" if none_correct else "no speedup"}
    band = c.get(f"mean_speedup_{split}_range")
    noisy = c.get(f"noisy_{split}") or 0
    tip = f"{split} mean {fmt_speedup(value)}" + (f", items' intervals {fmt_speedup(band[0])} - {fmt_speedup(band[1])}" if band else "")
    return {"value": value, "band": band, "noisy": noisy, "tip": tip + (f"; {noisy} noisy item(s)" if noisy else "")}


def speedup_overview(doc: dict) -> str:
    """Every pair's mean speedup, seen and unseen side by side, with the range of its items' intervals."""
    rows = [(pair_name(c["case"], c["candidate"]), [_pair_cell(c, "seen"), _pair_cell(c, "unseen")]) for c in doc.get("candidates", [])]
    if not rows:
        return "<p>No pair was graded.</p>"
    return _two_panels(rows, "mean speedup per pair: seen and unseen shapes", "overview-chart")


def _item_cell(it: dict) -> dict:
    value = _num(it.get("speedup"))
    label = str(it.get("shape_id"))
    if value is None:
        note = f"failed: {it.get('stage')}" if it.get("outcome") == "failed" else ("skipped" if it.get("outcome") == "skipped" else "no speedup")
        return {"value": None, "note": note, "label": label}
    ci = it.get("speedup_ci")
    tip = f"{label}: {fmt_speedup(value)} {fmt_interval(ci, value)}"
    if it.get("noisy"):
        tip += f"; noisy: {it.get('noisy_reason')}"
    return {"value": value, "band": ci, "noisy": it.get("noisy"), "tip": tip, "label": label}


def pair_chart(c: dict, items: Sequence[dict]) -> str:
    """One pair's speedup per shape with its interval: seen shapes left, unseen right."""
    seen = [it for it in items if it.get("split") == "seen"]
    unseen = [it for it in items if it.get("split") == "unseen"]
    rows = [("", [_item_cell(side[r]) if r < len(side) else None for side in (seen, unseen)])
            for r in range(max(len(seen), len(unseen), 1))]
    return _two_panels(rows, f"speedup per shape of {pair_name(c['case'], c['candidate'])}", "pair-chart",
                       label_width=0, cell_label_width=110)


# -- timing distributions ---------------------------------------------------------------------------


def _thin(values: Sequence[float], most: int) -> list[float]:
    """At most ``most`` of the sorted quantiles, evenly spaced, first and last kept."""
    if len(values) <= most:
        return list(values)
    return [values[round(i * (len(values) - 1) / (most - 1))] for i in range(most)]


def points_per_side(items: int) -> int:
    """Quantiles drawn per side: fewer for a large suite, so the page stays a few MB at most."""
    return 65 if items <= 100 else 33 if items <= 400 else 17


def distribution_chart(it: dict, points: int) -> str:
    """Baseline against candidate: each side's kept samples as a histogram over a shared log axis
    (from the quantiles its record keeps; the round medians when it keeps none), its median marked."""
    sides = {}
    for side in ("baseline", "candidate"):
        timing = it.get(f"{side}_timing") or {}
        values = [v for v in (timing.get("quantiles_us") or timing.get("round_medians_us") or []) if _num(v) and v > 0]
        sides[side] = (_thin(sorted(values), points), _num(timing.get("median_us")))
    if not any(v for v, _ in sides.values()):
        return ""
    width, left, right, band = 440.0, 70.0, 405.0, 34.0
    scale = padded_scale([v for vals, m in sides.values() for v in [*vals, m] if v], left, right)
    bins = 30
    edges = [scale.low * (scale.high / scale.low) ** (i / bins) for i in range(bins + 1)]
    body = []
    for row, (side, (values, median)) in enumerate(sides.items()):
        base_y = 8 + (row + 1) * band
        body.append(f'<text x="{left - 6:.1f}" y="{base_y - 10:.1f}" text-anchor="end">{side}</text>')
        if values:
            counts = [0] * bins
            for v in values:
                counts[min(bins - 1, max(0, int(bins * math.log(v / scale.low) / math.log(scale.high / scale.low))))] += 1
            tallest = max(counts)
            for b, n in enumerate(counts):
                if n:
                    x0, x1 = scale(edges[b]), scale(edges[b + 1])
                    h = (band - 6) * n / tallest
                    body.append(f'<rect x="{x0:.1f}" y="{base_y - h:.1f}" width="{max(1.0, x1 - x0 - 0.5):.1f}" height="{h:.1f}"'
                                f' fill="{COLORS[side]}" fill-opacity="0.75"/>')
        if median:
            x = scale(median)
            body.append(f'<line x1="{x:.1f}" y1="{base_y - band + 4:.1f}" x2="{x:.1f}" y2="{base_y:.1f}" stroke="#111" stroke-width="1.5">'
                        f'<title>{side} median {esc(fmt_us(median))}</title></line>')
    body += _axis(scale, 8 + 2 * band + 2, " us")
    return _svg(width, 2 * band + 34, body, "dist-chart", f"timing distribution of {it.get('nodeid')}")


# -- tables ----------------------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], css_class: str = "") -> str:
    """Cells are HTML already (escaped by the caller)."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(rows_cell(c) for c in row) + "</tr>" for row in rows)
    cls = f' class="{css_class}"' if css_class else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def rows_cell(cell: str) -> str:
    return cell if cell.startswith("<td") else f"<td>{cell}</td>"


def _num_cell(text: str) -> str:
    return f'<td class="num">{text}</td>'


def suite_section(doc: dict) -> str:
    s = doc.get("suite") or {}
    q = s.get("quadrants") or {}
    fast = ", ".join(f"fast_{p} {fmt_pct(v)}" for p, v in (s.get("fast_p") or {}).items())
    rows = [
        ("pairs", esc(s.get("pairs"))),
        ("compiled", esc(fmt_pct(s.get("compile_rate")))),
        ("correct (seen shapes)", esc(fmt_pct(s.get("correctness_rate")))),
        ("fast_p (correct and faster than p)", esc(fast)),
        ("speedup mean / geomean", esc(f"{fmt_speedup(s.get('mean_speedup'))} / {fmt_speedup(s.get('geomean_speedup'))}")),
        ("mean generalization gap", esc(fmt_pct(s.get("mean_generalization_gap")))),
        ("unseen P(candidate ok | baseline ok)", esc(f"{fmt_pct(s.get('conditional_correctness'))} (both pass {q.get('both_pass', 0)},"
                                                     f" regressed {q.get('candidate_regressed', 0)}, both fail {q.get('both_fail', 0)},"
                                                     f" improved {q.get('candidate_improved', 0)})")),
        ("bench-lite total (tier-weighted)", esc(fmt_score(s.get("bench_lite_total")) if s.get("timed", True) else "-")),
    ]
    if s.get("pass_at_k"):
        rows.append(("pass@k", esc(", ".join(f"@{k} {v:.2f}" for k, v in s["pass_at_k"].items() if v is not None))))
    out = [_table(["figure", "value"], rows)]
    pairs = doc.get("candidates", [])
    if pairs:
        out.append("<h3>Pairs</h3>")
        out.append(_table(
            ["case::candidate", "compiled", "correct (seen)", "seen speedup", "unseen correct", "unseen speedup", "gap", "AKA", "bench-lite", "noisy items"],
            ([esc(pair_name(c["case"], c["candidate"])), esc(_yes(c.get("compiled"))), esc(fmt_seen_correct(c.get("correct_seen"), c.get("seen_items", 1))),
              _num_cell(esc(_mean_text(c, "seen"))), _num_cell(esc(_unseen_text(c))), _num_cell(esc(_mean_text(c, "unseen"))),
              _num_cell(esc(fmt_pct(c.get("generalization_gap")))), _num_cell(esc(fmt_score(c.get("aka_score")))),
              _num_cell(esc(fmt_score(c.get("bench_lite"))) if s.get("timed", True) else "-"),
              _num_cell(esc((c.get("noisy_seen") or 0) + (c.get("noisy_unseen") or 0)))] for c in pairs)))
    board = doc.get("leaderboard") or []
    if board:
        out.append("<h3>Leaderboard</h3>")
        out.append(_table(["rank", "team", "bench-lite", "correct", "mean speedup"],
                          ([_num_cell(esc(e.get("rank"))), esc(leaderboard_name(e.get("team"), e.get("folder"))),
                            _num_cell(esc(fmt_score(e.get("bench_lite_total")))), _num_cell(esc(f"{e.get('cases_correct')}/{e.get('cases')}")),
                            _num_cell(esc(fmt_speedup(e.get("mean_speedup"))))] for e in board)))
    return "\n".join(out)


def _yes(value: Any) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _mean_text(c: dict, split: str) -> str:
    value = _num(c.get(f"mean_speedup_{split}"))
    if value is None:
        return "-"
    band = c.get(f"mean_speedup_{split}_range")
    return fmt_speedup(value) + (f" ({fmt_speedup(band[0])[:-1]}-{fmt_speedup(band[1])})" if band else "")


def _unseen_text(c: dict) -> str:
    shapes = c.get("correct_unseen") or {}
    return f"{sum(1 for v in shapes.values() if v)}/{len(shapes)}" if shapes else "-"


def _outcome_key(it: dict) -> str:
    if it.get("outcome") in ("passed", "skipped"):
        return str(it["outcome"])
    if it.get("case_failed"):
        return "case"
    return str(it.get("stage")) if it.get("stage") in OUTCOME_COLORS else "correctness"


def _first_line(text: Any, limit: int = 300) -> str:
    line = str(text or "").strip().splitlines()[0] if str(text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def outcome_grid(items: Sequence[dict]) -> str:
    """Per case, a table of candidates by shapes (seen, then unseen), coloured by outcome; a
    failed cell names its stage, a passed one its speedup."""
    legend = "".join(f'<span style="background:{color}">{esc(name if name not in ("case",) else "case failed")}</span>'
                     for name, color in OUTCOME_COLORS.items())
    out = [f'<p class="legend">{legend}</p>']
    by_case: dict[str, list[dict]] = {}
    for it in items:
        by_case.setdefault(str(it.get("case")), []).append(it)
    for case, case_items in by_case.items():
        shapes = []
        for split in ("seen", "unseen"):
            for it in case_items:
                shape_key = (split, str(it.get("shape_id")))
                if it.get("split") == split and shape_key not in shapes:
                    shapes.append(shape_key)
        candidates = list(dict.fromkeys(str(it.get("candidate")) for it in case_items))
        cells = {(str(it.get("candidate")), (str(it.get("split")), str(it.get("shape_id")))): it for it in case_items}
        rows = []
        for cand in candidates:
            row = [esc(cand)]
            for shape in shapes:
                cell = cells.get((cand, shape))
                if cell is None:
                    row.append("<td></td>")
                    continue
                key = _outcome_key(cell)
                if key == "passed":
                    text = fmt_speedup(_num(cell.get("speedup"))) if _num(cell.get("speedup")) else "ok"
                    if cell.get("noisy"):
                        text += " ?"
                else:
                    text = {"skipped": "skip", "case": "case"}.get(key, key)
                tip = f"{cell.get('nodeid')}: {cell.get('outcome')}"
                if cell.get("message"):
                    tip += f" at {cell.get('stage')}: {_first_line(cell.get('message'))}"
                elif cell.get("noisy"):
                    tip += f"; noisy: {cell.get('noisy_reason')}"
                row.append(f'<td style="background:{OUTCOME_COLORS[key]}" title="{esc(tip)}">{esc(text)}</td>')
            rows.append(row)
        header = ["candidate"] + [f"{esc(split)}<br>{esc(shape)}" for split, shape in shapes]
        out.append(f"<h3>{esc(case)}</h3>")
        out.append(_table(header, rows, "grid"))
    out.append("<p class=\"meta\">A passed cell shows the speedup (? when noisy); hover a cell for its item and message.</p>")
    return "\n".join(out)


def skipped_section(doc: dict) -> str:
    """The candidates every item of which skipped: not failures, and not scored."""
    return "\n".join(f"<p>Skipped, not scored: {esc(pair_name(c.get('case'), c.get('candidate')))}, all {esc(c.get('items'))} item(s):"
                     f" {esc(c.get('reason'))}</p>" for c in doc.get("skipped_candidates") or [])


def failures_section(doc: dict, items: Sequence[dict]) -> str:
    out = []
    for f in doc.get("failed_cases") or []:
        out.append(f'<p class="bad">Case failed: {esc(f.get("case"))} on {esc(", ".join(f.get("shapes") or []))}: {esc(f.get("reason"))}</p>')
    for e in doc.get("collection_errors") or []:
        out.append(f"<details><summary class=\"bad\">Collection error: {esc(e.get('nodeid'))}</summary><pre>{esc(e.get('message'))}</pre></details>")
    failed = [it for it in items if it.get("outcome") == "failed"]
    if not failed and not out:
        return "<p>No failures.</p>"
    for it in failed:
        where = f"{it.get('stage')}" + (f", phase {it.get('phase')}" if it.get("phase") and it.get("phase") != it.get("stage") else "")
        message = str(it.get("message") or "")
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS] + f"\n... ({len(message) - MESSAGE_CHARS} more characters in the JSON)"
        out.append(f"<details class=\"failure\"><summary><b>{esc(it.get('nodeid'))}</b>: {esc(where)}:"
                   f" {esc(_first_line(message, 160))}</summary><pre>{esc(message)}</pre></details>")
    return "\n".join(out)


def items_section(items: Sequence[dict]) -> str:
    rows = []
    for it in items:
        speedup = _num(it.get("speedup"))
        ci = it.get("speedup_ci")
        noisy = f'<td class="noisy" title="{esc(it.get("noisy_reason"))}">noisy</td>' if it.get("noisy") else "<td></td>"
        rows.append([esc(it.get("nodeid")), esc(it.get("outcome")), esc(it.get("stage")),
                     _num_cell(esc(fmt_us(_num(it.get("t_baseline_us"))))), _num_cell(esc(fmt_us(_num(it.get("t_candidate_us"))))),
                     _num_cell(esc(fmt_speedup(speedup)) if speedup else "-"),
                     _num_cell(esc(f"{fmt_speedup(ci[0])[:-1]}-{fmt_speedup(ci[1])}") if ci else "-"),
                     esc(it.get("timer") or "-"), noisy])
    return _table(["item", "outcome", "stage", "baseline", "candidate", "speedup", "95% interval", "timer", ""], rows, "items")


def distributions_section(items: Sequence[dict]) -> str:
    timed = [it for it in items if it.get("baseline_timing") or it.get("candidate_timing")]
    if not timed:
        return "<p>No item was timed.</p>"
    points = points_per_side(len(timed))
    legend = "".join(f'<span style="background:{COLORS[s]};color:#fff">{s}</span>' for s in ("baseline", "candidate"))
    out = [f'<p class="legend">{legend} each side\'s samples over a log axis (µs); the black line is its median.</p>']
    by_case: dict[str, list[dict]] = {}
    for it in timed[:MAX_DISTRIBUTIONS]:
        by_case.setdefault(str(it.get("case")), []).append(it)
    for case, case_items in by_case.items():
        charts = []
        for it in case_items:
            chart = distribution_chart(it, points)
            if not chart:
                continue
            speedup = _num(it.get("speedup"))
            caption = (f"{it.get('candidate')} [{it.get('split')} {it.get('shape_id')}]: {fmt_us(_num(it.get('t_baseline_us')))} ->"
                       f" {fmt_us(_num(it.get('t_candidate_us')))}")
            if speedup:
                caption += f", {fmt_speedup(speedup)} {fmt_interval(it.get('speedup_ci'), speedup)}"
            noisy = f' <span class="noisy" title="{esc(it.get("noisy_reason"))}">noisy</span>' if it.get("noisy") else ""
            charts.append(f'<div class="dist"><div>{esc(caption)}{noisy}</div>{chart}</div>')
        out.append(f"<details open><summary><b>{esc(case)}</b> ({len(charts)} item(s))</summary>{''.join(charts)}</details>")
    if len(timed) > MAX_DISTRIBUTIONS:
        out.append(f"<p>{len(timed) - MAX_DISTRIBUTIONS} more timed item(s): their figures are in the JSON.</p>")
    return "\n".join(out)


def compare_section(doc: dict) -> str:
    cmp = doc.get("compare")
    if not cmp:
        return ""
    rows = [[esc(pair_name(r["case"], r["candidate"])), _num_cell(esc(fmt_speedup(r.get("old_speedup")))), _num_cell(esc(fmt_speedup(r.get("new_speedup")))),
             _num_cell(esc(f"{r['change_pct']:+.1f}%" if r.get("change_pct") is not None else "-")),
             esc("REGRESSION" if r.get("regressed") else "within noise" if r.get("within_noise") else "" if r.get("comparable", True) else "not comparable")]
            for r in cmp.get("rows", [])]
    threshold = cmp.get("threshold_pct")
    head = f"<h2>Compared with {esc(cmp.get('path'))}" + (f" (fail below -{threshold:g}%)" if threshold is not None else " (report only)") + "</h2>"
    return head + _table(["pair", "saved", "now", "change", ""], rows)


# -- the page --------------------------------------------------------------------------------------------


def render(doc: dict) -> str:
    """The whole page for a ``--kcoral-json`` document."""
    items = [it for it in doc.get("items") or [] if isinstance(it, dict)]
    env = doc.get("environment") or {}
    gpus = ", ".join(sorted({str(g.get("name")) for g in env.get("gpus") or [] if isinstance(g, dict)})) or "no GPU"
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {v}" for k, v in packages.items() if v)
    counts = {o: sum(1 for it in items if it.get("outcome") == o) for o in ("passed", "failed", "skipped")}
    by_pair: dict[tuple[str, str], list[dict]] = {}
    for it in items:
        by_pair.setdefault((str(it.get("case")), str(it.get("candidate"))), []).append(it)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # nothing may load or run: a page built from hostile names stays inert even if escaping failed
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>pytest-kcoral report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>pytest-kcoral report</h1>",
        f'<p class="meta">{esc(doc.get("created"))} on {esc(env.get("host") or "?")} ({esc(gpus)}); {esc(versions)}</p>',
        f'<p class="meta">{len(items)} item(s): {counts["passed"]} passed, {counts["failed"]} failed, {counts["skipped"]} skipped.'
        " Speedups are the baseline's time over the candidate's; each has a 95% interval from its paired timing rounds,"
        " and is marked noisy when that interval reaches more than 5% from it.</p>",
    ]
    if doc.get("partial"):
        parts.append('<p class="banner">Partial run: the session was interrupted; the scores cover the items that ran.</p>')
    parts += ["<h2>Suite</h2>", suite_section(doc)]
    parts += ["<h2>Speedup per pair</h2>",
              '<p class="meta">Dots are mean speedups (hollow: some item behind it is noisy); whiskers the mean of its items\''
              " 95% interval bounds, where the mean lies if every item's speedup lies in its interval. Dashed: 1x.</p>",
              speedup_overview(doc)]
    for c in doc.get("candidates", []):
        parts.append(f"<h3>{esc(pair_name(c['case'], c['candidate']))}</h3>")
        parts.append(pair_chart(c, by_pair.get((c["case"], c["candidate"]), [])))
    parts += ["<h2>Outcomes</h2>", outcome_grid(items)]
    parts += ["<h2>Failures</h2>", failures_section(doc, items)]
    skipped = skipped_section(doc)
    if skipped:
        parts += ["<h2>Skipped candidates</h2>", skipped]
    parts.append(compare_section(doc))
    parts += ["<h2>Timing distributions</h2>", distributions_section(items)]
    parts += ["<h2>Items</h2>", items_section(items)]
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def write_html(path: str | Path, doc: dict) -> Path:
    """Render ``doc`` and write it atomically, as the JSON is."""
    from pytest_kcoral.report.json_artifact import write_text_atomically

    return write_text_atomically(path, render(doc))


def main(argv: Sequence[str] | None = None) -> int:
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        sys.stderr.write("usage: python -m pytest_kcoral.report.html RESULTS.json REPORT.html\n")
        return 2
    try:
        doc = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # a wrong path or file: one line, not a traceback
        sys.stderr.write(f"{args[0]}: not a --kcoral-json document ({type(exc).__name__}: {exc})\n")
        return 2
    write_html(args[1], doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
