"""Run step: a candidate's child kept between its items, paused while other items run.

A fresh child per item cost each item a process start, a CUDA context and the candidate's own
warm-up (Triton's JIT, ``torch.compile``) again. A candidate's child is kept after an item that
passed and reused by the candidate's next item of the case, so it compiles each shape once.

Kept children are stopped (SIGSTOP on their process group) while kept: nothing a candidate left
behind can run while another item holds the device. A child whose item failed in any way is
never kept; the next item of that candidate starts a fresh one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

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

    def holds(self, child: Child) -> bool:
        return any(kept is child for kept in self._kept.values())

    def close(self) -> None:
        while self._kept:
            self._kept.popitem()[1].close()
