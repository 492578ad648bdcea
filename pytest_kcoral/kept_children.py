"""Run step: children kept between items.

- ``KeptCandidates``: a candidate's child, kept after an item that passed, paused while other
  items run, and reused by the candidate's next item of the case. A fresh child per item cost each
  item a process start, a CUDA context and the candidate's own warm-up (Triton's JIT,
  ``torch.compile``) again; now it compiles each shape once. Kept children are stopped (SIGSTOP on
  their process group, and on what they detached below them) while kept: nothing a candidate left behind can run while another item
  holds the device. A child whose item failed in any way is never kept.
- ``CaseChildren``: a case's trusted children, or its baseline children, one per case, kept
  across its items: they never run a candidate, and reusing them saves a process start, a case
  import and, on a GPU, a CUDA context per item.
- An item timed in several pairs of processes (``stage_timing.process_pairs_for``) keeps its
  further pairs the same way, by pair: the candidate's further children in a ``KeptCandidates`` of
  their own, the baseline's in a ``CaseChildren`` of their own. Starting two pairs cost a host-set
  item about 1.8 s on an H100, more than its rounds (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import OrderedDict
from collections.abc import Callable, Hashable

from pytest_kcoral.isolation import Child

# Paused candidate children per pytest process: items go shape by shape, so a case's candidates
# take turns; beyond this many, the least recently used one is closed.
MAX_KEPT_CANDIDATES = 8


class KeptCandidates:
    def __init__(self, limit: int = MAX_KEPT_CANDIDATES) -> None:
        self.limit = limit
        self._kept: OrderedDict[Hashable, Child] = OrderedDict()

    def take(self, key: Hashable) -> Child | None:
        """The child kept under ``key``, running again; None when there is none, or it died."""
        child = self._kept.pop(key, None)
        if child is None:
            return None
        if not child.resume():
            child.close()
            return None
        return child

    def keep(self, key: Hashable, child: Child) -> None:
        """Pause ``child`` and keep it for ``key``'s next item."""
        child.pause()
        old = self._kept.pop(key, None)
        if old is not None and old is not child:
            old.close()
        self._kept[key] = child
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)[1].close()

    def close_where(self, belongs: Callable[[Hashable], bool]) -> None:
        """Close the kept children whose keys ``belongs`` picks."""
        for key in [key for key in self._kept if belongs(key)]:
            self._kept.pop(key).close()

    def holds(self, child: Child) -> bool:
        return any(kept is child for kept in self._kept.values())

    def close(self) -> None:
        while self._kept:
            self._kept.popitem()[1].close()


# Trusted children, and baseline children, kept alive per worker (one per case each, least
# recently used closed first).
MAX_CASE_CHILDREN = 4

# Further pairs' baseline children, one per case and pair: a case's items take turns with the
# case's other candidates, not with other cases, so two cases' worth is enough.
MAX_FURTHER_BASELINES = 4

CaseKey = Hashable  # (case id, content hash): a case as collected; with a pair's index for further pairs


class CaseChildren:
    """One child per case, the most recently used last; beyond ``limit``, the least recently used
    is closed."""

    def __init__(self, limit: int = MAX_CASE_CHILDREN) -> None:
        self.limit = limit
        self._kept: OrderedDict[CaseKey, Child] = OrderedDict()

    def take(self, key: CaseKey) -> Child | None:
        """The case's child, still alive, or None; give it back with ``keep``."""
        child = self._kept.pop(key, None)
        if child is not None and child.process.exitcode is not None:
            child.close()  # died while kept: its directory goes
            return None
        return child

    def peek(self, key: CaseKey) -> Child | None:
        """The case's child as kept (alive or not), left in place."""
        return self._kept.get(key)

    def keep(self, key: CaseKey, child: Child) -> Child:
        """``child`` as the most recently used one."""
        self._kept[key] = child
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)[1].close()
        return child

    def forget(self, child: object) -> None:
        """Never reuse ``child``: it failed, and may be dead, hung or in a bad state."""
        for key, kept in list(self._kept.items()):
            if kept is child:
                del self._kept[key]

    def resume(self) -> None:
        """SIGCONT to every kept child. A candidate runs as the same user as they do, and can stop
        them (SIGSTOP); once its process is gone, a child it left stopped would hang the next item
        of its case, and that item would read as the case's failure."""
        for child in self._kept.values():
            if child.process.exitcode is None and child.process.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(child.process.pid, signal.SIGCONT)

    def close(self) -> None:
        while self._kept:
            self._kept.popitem()[1].close()
