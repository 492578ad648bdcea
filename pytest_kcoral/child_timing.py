"""The ``time`` command in a candidate's (or the baseline's) child: one timing round of the loaded
callable over input sets the child keeps across an item's rounds, refreshed before every call.

Each refresh draws a fresh seed, so neither a pointer- nor a content-keyed cache can answer a
timed call; a few timed calls, picked at random, are kept with their seeds so the parent can check
them against the reference.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_kcoral import timing
from pytest_kcoral.case_runtime import CaseRuntime
from pytest_kcoral.child_outputs import clone_outputs, clone_values, inspect_outputs, leaves, to_cpu
from pytest_kcoral.messages import Time, TimedOutput, TimedOutputs, TimeReply
from pytest_kcoral.timing import pinning, placement
from pytest_kcoral.timing.placement import RandomSource
from pytest_kcoral.timing_flags import Flag, flag


class TimedOutputRefused(Exception):
    """A timed call returned something other than plain dense tensors (or plain numbers) on the
    item's device: the item fails at timing, and is not correct."""


class Draws(RandomSource, Protocol):
    """The draws the timing round makes: ``getrandbits`` and ``random`` besides ``randrange``."""

    def getrandbits(self, bits: int) -> int: ...

    def random(self) -> float: ...


@dataclass
class TimingSets:
    """The input sets an item's timing rounds rotate through, with their seeds, the callables bound
    to them and where they lie. They live across the item's rounds (the parent sends one ``time``
    command per round): a fresh set per round would hand a pointer-keyed cache fresh pointers,
    whose first use it answers correctly, in every round."""

    key: tuple[str, int, str]  # (shape, sets, device): a command for another makes new sets
    seeds: list[int]
    sets: list[tuple]
    fns: list[Callable[[], Any]]
    spread: placement.Placements


def sets_key(command: Time, device: str) -> tuple[str, int, str]:
    """Which sets a ``time`` command needs: a command for another shape, count or device needs new ones."""
    return json.dumps(command.shape, sort_keys=True), command.n_sets, device


def new_timing_sets(case: CaseRuntime, command: Time, device: str, rng: Draws,
                    bind: Callable[[dict[str, Any], tuple], Callable[[], Any]]) -> TimingSets:
    """``command.n_sets`` input sets for ``command``'s shape, placed apart, with their callables."""
    key = sets_key(command, device)
    spread = placement.Placements(device, rng)
    seeds = [rng.getrandbits(62) for _ in range(command.n_sets)]
    sets = spread.make_sets(lambda seed: case.make_inputs(command.shape, seed), seeds, lambda: rng.getrandbits(62))
    return TimingSets(key, seeds, sets, [bind(command.shape, args) for args in sets], spread)


def time_round(held: TimingSets, case: CaseRuntime, command: Time, device: str, rng: Draws) -> TimeReply:
    """Time the held callables, refreshing each set's values before its call, and keep
    ``command.verify`` timed outputs (a reservoir sample). With ``send_kept`` False they are kept
    all the same (keeping allocates between timed calls, and a small kernel's time follows where
    its outputs land), then dropped unsent."""
    seeds, sets, fns, spread = held.seeds, held.sets, held.fns, held.spread
    kept: list[dict[str, Any]] = []
    keep = command.verify
    written_inputs = command.written_inputs
    seen_samples = 0

    def refresh(k: int) -> None:
        seeds[k] = rng.getrandbits(62)
        fresh = case.make_inputs(command.shape, seeds[k])
        for dst, src in zip(sets[k], fresh):
            if hasattr(dst, "copy_"):
                dst.copy_(src)

    def on_output(k: int, out: Any) -> None:
        nonlocal seen_samples
        seen_samples += 1
        # every timed call's outputs, before anything touches them: a lazy object or a
        # subclass would do its work when the harness copies or checks it, outside the window
        problems = inspect_outputs(leaves(out), (), device)
        if problems:
            raise TimedOutputRefused(f"timed call {seen_samples}: " + "; ".join(problems))
        spread.keep_output(k, out)
        # reservoir sample of the timed calls: any one of them may be the one checked
        # a copy: a kernel that writes into one preallocated output overwrites it at the next call
        if len(kept) < keep or rng.random() < keep / seen_samples:
            entry = {"seed": seeds[k], "out": clone_outputs(out), "written": clone_values(tuple(sets[k][j] for j in written_inputs))}
            if len(kept) < keep:
                kept.append(entry)
            else:
                kept[rng.randrange(keep)] = entry

    with pinning.pinned(command.cpu) as is_pinned:
        stats = timing.measure(
            lambda k: fns[k](),
            n_sets=len(sets),
            refresh=refresh,
            on_output=on_output,
            device=device,
            method=command.timer,
            budget_s=command.budget_s,
            warmup_s=command.warmup_s,
            min_samples=command.min_samples,
        )
    spread.release_outputs()
    if is_pinned:
        stats.flags.append(flag(Flag.TIMING_CPU, command.cpu))
    if len(sets) != command.n_sets:
        stats.flags.append(flag(Flag.INPUT_SETS, len(sets), "small inputs, each set placed apart"))
    verify = []
    for entry in kept if command.send_kept else ():
        out_tuple = leaves(entry["out"])
        problems = inspect_outputs(out_tuple, (), device)
        verify.append(TimedOutput(seed=entry["seed"], outputs=None if problems else to_cpu(out_tuple),
                                  written=None if problems else to_cpu(entry["written"])))
    return TimeReply(stats=stats, verify_seeds=[v.seed for v in verify], payload=TimedOutputs(verify=verify))
