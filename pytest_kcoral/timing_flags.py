"""The flags of a timing record (``TimingStats.flags``): what a timer or a rule noticed about one
side's timing, kept in the JSON as text.

A flag reads ``kind``, ``kind=value``, ``kind: note`` or ``kind=value: note``. It is made with
``flag`` and read with ``kind_of``, ``has`` and ``notes``, so no code splits the text by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Flag(str, enum.Enum):
    """Every kind of flag, with where it is raised."""

    # the timing loop in a child (``timing/``)
    L2_FLUSH = "l2_flush"  # how L2 was flushed before each call
    PERSISTING_L2_RESET = "persisting_l2_reset"
    PERSISTING_L2_RESET_UNAVAILABLE = "persisting_l2_reset_unavailable"
    FALLBACK_TO_EVENTS = "fallback_to_events"  # CUPTI could not be used
    RSE_TARGET_MISSED = "rse_target_missed"  # the budget ran out before the median settled
    HOST_BOUND = "host_bound"  # timed by the host clock
    LAUNCH_BOUND = "launch_bound"  # the GPU was idle most of the span
    WORK_DIFFERS_BETWEEN_CALLS = "work_differs_between_calls"
    NO_GPU_WORK_AFTER_FIRST_CALL = "no_gpu_work_after_first_call"
    CPU_TIME_ABOVE_WALL = "cpu_time_above_wall"  # timed by CPU time: more than one core worked
    EVENTS_SYNC_BIAS_SUBTRACTED_US = "events_sync_bias_subtracted_us"
    EVENTS_STREAM_BIAS_SUBTRACTED_US = "events_stream_bias_subtracted_us"
    EVENTS_SPANS_US = "events_spans_us"
    EVENTS_SIDE_WORK = "events_side_work"
    # the ``time`` command in a child (``child_timing``)
    TIMING_CPU = "timing_cpu"
    INPUT_SETS = "input_sets"
    # combining rounds and processes in the pytest process (``combine``, ``pipeline``)
    OUTSIDE_WINDOW_EXCESS_US = "outside_window_excess_us"
    ROUNDS_DROPPED = "rounds_dropped"
    MEDIAN_PAIR = "median_pair"
    FIRST_IN_TURNS = "first_in_turns"
    PRECISION_TARGET = "precision_target"


def flag(kind: Flag, value: object = None, note: str | None = None) -> str:
    """A flag's text: ``kind``, then ``=value`` when there is one, then ``: note``."""
    text = kind.value if value is None else f"{kind.value}={value}"
    return text if note is None else f"{text}: {note}"


def kind_of(text: str) -> str:
    """The kind a flag's text begins with (a ``Flag``'s value, or an unknown kind's)."""
    return text.split("=", 1)[0].split(":", 1)[0]


def has(flags: Iterable[str], *kinds: Flag) -> bool:
    """Whether any flag is of one of ``kinds``."""
    wanted = {k.value for k in kinds}
    return any(kind_of(str(f)) in wanted for f in flags)


def notes(flags: Iterable[str], kind: Flag) -> list[str]:
    """What the flags of ``kind`` say after their ``: ``, in order."""
    return [str(f).partition(": ")[2] for f in flags if kind_of(str(f)) == kind.value]
