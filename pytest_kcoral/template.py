"""Imported first by the template process (the forkserver every child is forked from), never elsewhere.

The template becomes a *subreaper*: a process a candidate detached (``setsid`` plus a double fork)
whose child then died is re-parented here instead of to init, where the parent finds and kills it
(``isolation._kill_orphans``). The forkserver reaps such strays with a warning meant for its own
children only; that warning is silenced.

It takes launches only from the pytest process that started it (``only_from``).

The template also turns transparent huge pages off, for itself and so for every child it forks
(the setting is inherited), before torch is imported. With THP on ("always" on the H200 host),
whether a process's hot host data landed on huge pages is a lottery of its own: two processes
forked from one template, running the same pure-Python loop, read up to 1.33x apart; without THP,
12 of 12 pairs were within 2% (``bench/launch_drift.py --probes``, docs/performance.md). The
baseline and the candidate are timed in two processes, so such a lottery passes for a speedup.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import warnings
from multiprocessing import reduction

from pytest_kcoral import leftovers

PR_SET_THP_DISABLE = 41  # prctl(2)


def without_transparent_huge_pages() -> bool:
    """No THP for this process and its future children (Linux); False where that cannot be set."""
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def only_from(client_pid: int) -> None:
    """Take launches from ``client_pid`` only (the pytest process that started the template), by
    the kernel's word on who connected (``SO_PEERCRED``). Any process of the user can reach the
    template's socket (``/proc/net/unix`` names it), and the process forked for a launch unpickles
    what was sent, outside every child's confinement. Another peer's connection is dropped before
    anything is read from it. The children inherit the check and skip it: a candidate's own
    multiprocessing passes descriptors between its processes."""
    receive = reduction.recvfds
    template_pid = os.getpid()

    def recvfds(sock: socket.socket, size: int) -> list[int]:
        if os.getpid() != template_pid:
            return receive(sock, size)
        peer_pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        if peer_pid != client_pid:
            # the forkserver's loop drops a connection that fails so and serves the next
            raise ConnectionAbortedError(errno.ECONNABORTED, f"a launch from pid {peer_pid}, not {client_pid}: refused")
        return receive(sock, size)

    reduction.recvfds = recvfds


warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
_client_pid = os.environ.pop("KCORAL_TEMPLATE_CLIENT_PID", None)  # isolation.TEMPLATE_CLIENT_ENV
if _client_pid:
    only_from(int(_client_pid))
leftovers.become_subreaper()
if os.environ.pop(leftovers.TEMPLATE_DIES_WITH_PARENT_ENV, None) == "1":
    leftovers.die_with_parent()
without_transparent_huge_pages()
