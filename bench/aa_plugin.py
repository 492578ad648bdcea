"""A/A timing for ``bench/self_speedup.py --aa``: the candidate's side is timed by a second
baseline child. Loaded into the grading session with ``-p aa_plugin`` (bench/ on PYTHONPATH).

Each candidate child is started in the baseline's role and loads the case's baseline
(``load_baseline``) in place of the candidate file; everything else about it is the candidate's
way (its correctness run, its timed outputs sent back and checked, its place in each pair of
rounds). If identical code still reads slower on the candidate's side, the lean belongs to that
way; if not, to what differs between the two roles' children (the candidate file's import, the
compile caches the baseline's child turns off). A benchmark's instrument, never the grader's.
"""

from __future__ import annotations

from typing import Any

from pytest_kcoral import isolation
from pytest_kcoral.child import BASELINE, CANDIDATE
from pytest_kcoral.messages import LoadBaseline, LoadCandidate

_start = isolation.Child.__init__
_call = isolation.Child.call


def _start_as_baseline(self: isolation.Child, role: str, *args: Any, **kwargs: Any) -> None:
    _start(self, BASELINE if role == CANDIDATE else role, *args, **kwargs)


def _load_the_baseline(self: isolation.Child, command: Any, phase: str, *args: Any, **kwargs: Any) -> Any:
    if isinstance(command, LoadCandidate):
        command = LoadBaseline()
    return _call(self, command, phase, *args, **kwargs)


def pytest_configure(config: Any) -> None:
    isolation.Child.__init__ = _start_as_baseline  # type: ignore[method-assign]
    isolation.Child.call = _load_the_baseline  # type: ignore[method-assign]
