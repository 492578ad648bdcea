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
import hmac
import os
import warnings
from multiprocessing import spawn

from pytest_kcoral import leftovers

PR_SET_THP_DISABLE = 41  # prctl(2)


def without_transparent_huge_pages() -> bool:
    """No THP for this process and its future children (Linux); False where that cannot be set."""
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def only_with_the_key(key: bytes) -> None:
    """Serve a launch only when it starts with the session's key (``isolation._connect_with_the_key``):
    any process of the user can reach the template's socket (``/proc/net/unix`` names it), and a
    confined child would otherwise have the template fork an unconfined process that unpickles
    what the child sent. Runs in the template's fork, before anything sent is unpickled."""
    serve = spawn._main

    def _main(fd: int, parent_sentinel: int) -> int:
        sent = b""
        while len(sent) < len(key) and (chunk := os.read(fd, len(key) - len(sent))):
            sent += chunk
        if not hmac.compare_digest(sent, key):
            os._exit(1)
        return serve(fd, parent_sentinel)

    spawn._main = _main


warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
_key_file = os.environ.pop("KCORAL_TEMPLATE_KEY_FILE", None)  # isolation.TEMPLATE_KEY_ENV
if _key_file:
    with open(_key_file, "rb") as _f:  # read and removed before any child exists
        only_with_the_key(_f.read())
    os.unlink(_key_file)
leftovers.become_subreaper()
if os.environ.pop(leftovers.TEMPLATE_DIES_WITH_PARENT_ENV, None) == "1":
    leftovers.die_with_parent()
without_transparent_huge_pages()
