"""Run step, the shared ground: what an item's stages work on and how they end.

- ``ItemSpec``: which item (case, candidate, shape).
- ``Budget``: the item's own time. It owns the deadline, and moves it by the time the item spent
  waiting (for a device, a worker, a diagnostic tool), so no stage extends a float by hand.
- ``Plan``: how an executor runs the stages. Local children and KCoral programs differ by plan
  and transport (``transport.py``), never by overriding each other's methods.
- ``ItemContext``: one item's spec, settings, plan, budget, tolerance, device and record, handed
  to every stage function (``stage_reference``, ``stage_correctness``, ``stage_timing``).
- How a stage ends: ``StageFailed``, ``ItemSkipped``, ``ServiceUnavailable``.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_kcoral.candidates import Candidate
from pytest_kcoral.cases import Case, Shape
from pytest_kcoral.correctness import Tolerance
from pytest_kcoral.options import Settings
from pytest_kcoral.results import ItemResult


@dataclass(frozen=True)
class ItemSpec:
    nodeid: str
    case: Case
    candidate: Candidate
    shape: Shape


class Executor(Protocol):
    """Grades items: ``pipeline.LocalExecutor`` here, ``remote.RemoteExecutor`` on a KCoral service."""

    def start_template(self) -> None:
        """Start what children are forked from, early (a no-op where there is none)."""

    def run(self, spec: ItemSpec) -> ItemResult: ...

    def close(self) -> None: ...


# ``factory(label)`` holds a device for a ``with`` block; the lease it yields has ``device_name``,
# ``wait_ms`` and, once released, ``held_ms`` (``pytest_kcoral.lease.Lease``).
LeaseFactory = Callable[[str], contextlib.AbstractContextManager[Any]]


class Deadlined(Protocol):
    """A process whose commands must answer by a deadline (``isolation.Child``)."""

    deadline: float


class Budget:
    """The item's own time (``--kcoral-timeout``): a deadline that moves by the waits it does not
    count, and the processes it holds to that deadline."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self._held: list[Deadlined] = []

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def extend(self, seconds: float) -> None:
        """Move the deadline by ``seconds`` the item spent waiting, for every process it holds."""
        self.deadline += seconds
        for process in self._held:
            process.deadline = self.deadline

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The body's time does not count against the item (the case's work, a tool's own run)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.extend(time.monotonic() - started)

    def hold(self, process: Deadlined) -> None:
        """``process`` answers by this deadline, wherever it moves."""
        process.deadline = self.deadline
        if not any(p is process for p in self._held):
            self._held.append(process)


@dataclass(frozen=True)
class Plan:
    """What differs between running the stages in local children and in KCoral programs."""

    # timing rounds a side; None: by the device and the item's size (``stage_timing.timing_rounds``)
    rounds: int | None = None
    # the candidate's round goes first in every pair; False: the first side alternates (``stage_timing``)
    candidate_first: bool = False
    # at most this many pairs of processes; None: as ``--kcoral-process-pairs`` says
    max_process_pairs: int | None = None
    # the timing core of the leased device is used (a core of this host means nothing on a server)
    pin_timing_core: bool = True
    # a crash or a timeout is the stage of the phase it happened in: replies are replayed after the
    # whole program ran, so the call that sees it may belong to an earlier stage
    stage_by_phase: bool = False
    # the trusted child feeds each timed call's inputs and judges its outputs (``feed.py``): the
    # processes share this host's memory; False: each side makes its own and keeps a few outputs
    fed: bool = True


LOCAL = Plan()
# one pair of programs, the candidate's first: a program's commands are fixed before it is sent,
# the candidate's runs whole before the baseline's is sent, and further pairs would be further
# programs (not done); two programs share no memory, so no feed
REMOTE = Plan(rounds=1, candidate_first=True, max_process_pairs=1, pin_timing_core=False, stage_by_phase=True, fed=False)


@dataclass
class ItemContext:
    """What every stage of one item works on."""

    spec: ItemSpec
    settings: Settings
    plan: Plan
    device_kind: str  # "cpu" or "cuda": decides timing budgets and what skips on a CPU
    budget: Budget
    result: ItemResult
    device: str = "cpu"  # the leased device, once the lease names it
    tolerance: Tolerance = field(init=False)

    def __post_init__(self) -> None:
        case = self.spec.case
        self.tolerance = Tolerance(case.atol, case.rtol, strict=self.settings.tolerance == "strict")

    def seed(self, *parts: Any) -> int:
        """A per-purpose seed from the session seed (``derive_seed``)."""
        return derive_seed(self.settings.seed, *parts)

    @property
    def timed(self) -> bool:
        """Whether items are timed at all (not ``--kcoral-mode correctness``)."""
        return self.settings.mode != "correctness"


def derive_seed(session_seed: int, *parts: Any) -> int:
    """A per-purpose seed from the session seed; without the session seed it cannot be predicted."""
    digest = hashlib.sha256(repr((session_seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 62) - 1)


@contextlib.contextmanager
def timed_phase(result: ItemResult, name: str) -> Iterator[None]:
    """Add the body's wall time to ``result.phases_ms[name]`` (also when it fails)."""
    started = time.monotonic()
    try:
        yield
    finally:
        result.phases_ms[name] = result.phases_ms.get(name, 0.0) + (time.monotonic() - started) * 1e3


class StageFailed(Exception):
    """Ends an item: the stage, the phase and one screen of why. ``case_failed``: the case itself
    failed (its import, inputs, reference or baseline, in a process without the candidate).
    ``disqualifies``: a failure after the correctness stage that takes back its verdict (the
    candidate raised, crashed or exited while timed, forged its results, or computed wrong ones
    once timed); being slow, or running out of time, does not."""

    def __init__(self, stage: str, message: str, phase: str | None = None, *, case_failed: bool = False,
                 disqualifies: bool = False) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.phase = phase
        self.case_failed = case_failed
        self.disqualifies = disqualifies


class ItemSkipped(Exception):
    pass


class ServiceUnavailable(Exception):
    """The grading service (``--kcoral-url``) stopped answering: the item was never graded, and
    neither the candidate nor the case is to blame. The session stops (``items.KernelItem``)."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
