"""Imported first by the template process (the forkserver every child is forked from), never elsewhere.

The template becomes a *subreaper*: a process a candidate detached (``setsid`` plus a double fork)
whose child then died is re-parented here instead of to init, where the parent finds and kills it
(``isolation._kill_orphans``). The forkserver reaps such strays with a warning meant for its own
children only; that warning is silenced.

The template also turns transparent huge pages off, for itself and so for every child it forks
(the setting is inherited), before torch is imported. With THP on ("always" on the H200 host),
whether a process's hot host data landed on huge pages is a lottery of its own: two processes
forked from one template, running the same pure-Python loop, read up to 1.33x apart; without THP,
12 of 12 pairs were within 2% (``bench/launch_drift.py --probes``, docs/performance.md). The
baseline and the candidate are timed in two processes, so such a lottery passes for a speedup.
"""

from __future__ import annotations

import ctypes
import os
import warnings

from pytest_kcoral import leftovers

PR_SET_THP_DISABLE = 41  # prctl(2)


def without_transparent_huge_pages() -> bool:
    """No THP for this process and its future children (Linux); False where that cannot be set."""
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
leftovers.become_subreaper()
if os.environ.pop(leftovers.TEMPLATE_DIES_WITH_PARENT_ENV, None) == "1":
    leftovers.die_with_parent()
without_transparent_huge_pages()
