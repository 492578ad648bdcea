"""Imported first by the template process (the forkserver every child is forked from), never elsewhere.

The template becomes a *subreaper*: a process a candidate detached (``setsid`` plus a double fork)
whose child then died is re-parented here instead of to init, where the parent finds and kills it
(``isolation._kill_orphans``). The forkserver reaps such strays with a warning meant for its own
children only; that warning is silenced.
"""

from __future__ import annotations

import warnings

from pytest_kcoral import leftovers

warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
leftovers.become_subreaper()
