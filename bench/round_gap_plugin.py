"""Where a timing round's time goes, seen from the grading session: loaded with ``-p round_gap_plugin``
(bench/ on PYTHONPATH), it times every ``time`` command the parent sends, and at the session's end
prints, per role, the medians of

- ``wall``: the parent's clock around the command (send, the child's work, the reply);
- ``budget``: the round's sampling budget, which the child's loop runs for;
- ``loop``: the child's timed loop as its reply's figures give it (calls times the median time
  inside and outside a window); the rest of ``wall`` is the round's fixed cost (warm-up, CUPTI's
  start and stop, calibration, the final attribution, kept outputs, the audit, the pipes);
- ``between``: the parent's own time from the previous command's reply (any child's) to this one;
- ``calls``: timed calls a round.

A benchmark's instrument, never the grader's: nothing here changes what a round does.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from typing import Any

from pytest_kcoral import isolation
from pytest_kcoral.messages import Time

_call = isolation.Child.call
_rounds: dict[str, list[dict[str, float]]] = defaultdict(list)
_last_end = [math.nan]  # when the session's previous command's reply came, whichever child's


def _timed_call(self: isolation.Child, command: Any, phase: str, *args: Any, **kwargs: Any) -> Any:
    started = time.perf_counter()
    reply = _call(self, command, phase, *args, **kwargs)
    ended = time.perf_counter()
    previous, _last_end[0] = _last_end[0], ended
    if isinstance(command, Time):
        stats = reply.stats
        per_call_us = (stats.host_median_us or 0.0) + (stats.outside_us or 0.0)
        _rounds[self.role].append({
            "wall": (ended - started) * 1e3,
            "budget": command.budget_s * 1e3,
            "loop": stats.n * per_call_us / 1e3,
            "between": (started - previous) * 1e3,
            "calls": float(stats.n),
        })
    return reply


def pytest_configure(config: Any) -> None:
    isolation.Child.call = _timed_call  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line("round gap (ms, medians): role rounds wall budget loop between calls")
    for role, rounds in sorted(_rounds.items()):
        medians = {key: statistics.median([r[key] for r in rounds if not math.isnan(r[key])] or [math.nan]) for key in rounds[0]}
        terminalreporter.write_line(f"round gap: {role:10s} {len(rounds):5d} " + " ".join(f"{medians[k]:7.1f}" for k in
                                                                                        ("wall", "budget", "loop", "between", "calls")))
