"""Run step, the transport: a process you send a command to and get a reply from.

Two kinds implement it:

- ``isolation.Child``: a child forked on this host, asked over a pipe, one command at a time;
- ``remote.ReplayedChild`` and ``remote.RemoteTrusted``: KCoral programs, whose replies come
  back when the program is done and are handed out in the order the stages ask for them.

The stages (``stage_reference``, ``stage_correctness``, ``stage_timing``) see only this protocol,
and get their processes from the executor's ``Processes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from pytest_kcoral.messages import Command, R


class Transport(Protocol):
    """Sends a command (``messages.py``) and returns the reply, or raises
    ``isolation.ChildFailure`` with the phase it was in when the process failed or lied."""

    # the wall time of the last command, by this process's clock: timed calls cannot take longer
    last_call_s: float

    def call(self, command: Command[R], phase: str, reply_limit_bytes: int | None = None, fds: Sequence[int] = ()) -> R:
        """``reply_limit_bytes``: the most tensor bytes the reply may carry (an untrusted child's);
        ``fds``: file descriptors the command hands over (a feed's socket: local children only)."""
        ...

    def close(self) -> None: ...


class Processes(Protocol):
    """Where an item's stages get the processes the candidate does not run in."""

    def trusted(self) -> Transport:
        """The case's trusted process: it makes inputs and runs the reference, never a candidate."""
        ...

    def kept_trusted(self) -> Transport | None:
        """The trusted process as kept, none started (None where there is none to keep)."""
        ...

    def forget(self, process: Transport) -> None:
        """A case process that failed: never reuse it."""

    def further_candidate(self, index: int) -> AbstractContextManager[Transport]:
        """A process holding the candidate (loaded, not yet run) for the item's further pair of
        processes ``index`` (1, 2, ...: ``Plan.max_process_pairs``): never the item's first
        candidate process. Raises ``context.StageFailed`` as the compile stage would."""
        ...

    def further_baseline(self, index: int) -> AbstractContextManager[Transport]:
        """A process holding the baseline, the other half of that pair, never the first pair's.
        Raises ``context.StageFailed``: the case's failure."""
        ...
