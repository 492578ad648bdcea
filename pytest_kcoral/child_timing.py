"""The ``time`` command in a candidate's (or the baseline's) child: one timing round of the loaded
callable over input sets the child keeps across an item's rounds, refreshed before every call.

Two kinds of sets:

- ``FedSets`` (on this host): the case's trusted child writes each timed call's fresh inputs into
  them and judges each call's outputs, which this child copies to a slot the trusted child reads
  (``feed.py``). Nothing here makes or checks data: this child only calls the candidate.
- ``OwnSets`` (a KCoral program, which shares no memory with a trusted one): this child refreshes
  the sets itself from fresh seeds, and keeps a few timed outputs, picked at random, with their
  seeds, for the parent to check against the reference.

Either way a fresh set before every call means neither a pointer- nor a content-keyed cache can
answer a timed call.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_kcoral import timing
from pytest_kcoral.case_runtime import CaseRuntime
from pytest_kcoral.child_outputs import clone_outputs, clone_values, flatten_outputs, inspect_outputs, leaves, synchronize, to_cpu
from pytest_kcoral.feed import FeedChannel, FeedError, Layout, Outcome, TensorPlace
from pytest_kcoral.messages import Time, TimedOutput, TimedOutputs, TimeReply
from pytest_kcoral.shared_memory import Region, contiguous_strides
from pytest_kcoral.timing import guards, pinning, placement
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
class OwnSets:
    """The input sets an item's timing rounds rotate through, made in this child, with their seeds,
    the callables bound to them and where they lie. They live across the item's rounds (the parent
    sends one ``time`` command per round): a fresh set per round would hand a pointer-keyed cache
    fresh pointers, whose first use it answers correctly, in every round."""

    key: tuple[str, int, str]  # (shape, sets, device): a command for another makes new sets
    seeds: list[int]
    sets: list[tuple]
    fns: list[Callable[[], Any]]
    spread: placement.Placements


class FedSets:
    """Input sets in memory the case's trusted child writes (an item's timing rounds, or its
    correctness trials: ``child_run``), and the slot this child copies each call's outputs to
    (``feed.py``). The trusted child chose
    where each tensor lies (``feed.Layout``), placement pads included; this child allocates the
    regions, builds its tensors there, and only asks for a set's fresh values and reports what a
    call returned."""

    def __init__(self, channel: FeedChannel, shape: dict[str, Any], n_sets: int, device: str,
                 bind: Callable[[dict[str, Any], tuple], Callable[[], Any]]) -> None:
        import torch

        self.key = json.dumps(shape, sort_keys=True), n_sets, device  # as ``sets_key``
        self.channel = channel
        self.device = device
        channel.spin_on(device)
        layout = Layout.from_wire(self._ask({"op": "hello", "sets": n_sets})["layout"])
        self.regions = {kind: Region(nbytes, device if kind == "cuda" else "cpu") for kind, nbytes in layout.region_bytes.items()}
        host = self.regions.get("cpu")
        self._ask({"op": "map", "regions": {kind: r.info.to_wire() for kind, r in self.regions.items()}},
                  [host.fd] if host is not None and host.fd is not None else [])

        def view(place: TensorPlace) -> Any:
            return self.regions[place.region].view(place.offset, getattr(torch, place.dtype), place.shape, place.strides)

        self.sets = [tuple(view(p) if isinstance(p, TensorPlace) else p[1] for p in inputs) for inputs in layout.sets]
        self.slot = layout.slot
        self._slot_views: dict[tuple[int, Any, tuple[int, ...]], Any] = {}  # by output, dtype and shape
        self.fns = [bind(shape, args) for args in self.sets]
        # a small set's outputs stay alive until its next call, so they too rotate over addresses
        self.rotate_outputs = str(device).startswith("cuda") and len(self.sets) == placement.SMALL_SET_COUNT
        self._outputs: dict[int, Any] = {}
        self._outcome: Outcome | None = None

    def _ask(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        self.channel.send(message, fds or ())
        reply, received = self.channel.recv()
        for fd in received:  # the trusted child sends none
            os.close(fd)
        if not isinstance(reply, dict) or not reply.get("ok"):
            raise FeedError("the trusted child ended the feed: " + str(reply.get("error") if isinstance(reply, dict) else reply)[:2000])
        return reply

    def refresh(self, k: int) -> float:
        """Set ``k``'s fresh values, written by the trusted child once it has judged the last
        call (whose outputs the slot holds: copied and synchronized before it reads them). The
        microseconds spent waiting for its answer: the trusted child's work, not the call's."""
        synchronize(self.device)
        started = time.perf_counter()
        self._ask({"op": "call", "set": k, "prev": self._outcome.to_wire() if self._outcome is not None else None})
        self._outcome = None
        return (time.perf_counter() - started) * 1e6

    def keep(self, k: int, out: Any, problems: list[str], aliases: list[list[int]] | None = None) -> None:
        """A call's outputs, copied to the slot, and its outcome, reported with the next request.
        ``problems``: what ``inspect_outputs`` found (then nothing is copied); ``aliases``: the
        [output, input] pairs that share memory."""
        values, structure = flatten_outputs(out)
        reported: list[Any] = []
        if not problems:
            # a torch mode pushed by the candidate would run inside the copies below, outside the window
            guards.refuse_modes("after the candidate's call")
            for i, value in enumerate(values):
                if not hasattr(value, "dtype"):
                    reported.append(("value", value))
                    continue
                dtype_and_shape = (str(value.dtype).removeprefix("torch."), list(value.shape))
                target = self._slot_view(i, value)
                if target is None:
                    reported.append(("tensor", *dtype_and_shape))
                else:
                    target.copy_(value)
                    reported.append(("slot", *dtype_and_shape))
        self._outcome = Outcome(k, structure, reported, problems, aliases or [])
        if self.rotate_outputs:
            self._outputs[k] = out

    def _slot_view(self, i: int, value: Any) -> Any:
        """Output ``i``'s place in the slot as a contiguous tensor like ``value``, or None when it
        has no place there or no room for it."""
        key = (i, value.dtype, tuple(value.shape))
        view = self._slot_views.get(key)
        if view is None:
            place = self.slot[i] if i < len(self.slot) else None
            if place is None or value.numel() * value.element_size() > place.capacity:
                return None
            view = self._slot_views[key] = self.regions[place.region].view(place.offset, value.dtype, list(value.shape),
                                                                            contiguous_strides(list(value.shape)))
        return view

    def end_round(self) -> None:
        """After the round's last call: its outcome, and the outputs kept for rotation let go."""
        synchronize(self.device)
        self._ask({"op": "end", "prev": self._outcome.to_wire() if self._outcome is not None else None})
        self._outcome = None
        self._outputs.clear()

    def close(self) -> None:
        for region in self.regions.values():
            region.close()


def sets_key(command: Time, device: str) -> tuple[str, int, str]:
    """Which sets a ``time`` command needs: a command for another shape, count or device needs new ones."""
    return json.dumps(command.shape, sort_keys=True), command.n_sets, device


def new_own_sets(case: CaseRuntime, command: Time, device: str, rng: Draws,
                 bind: Callable[[dict[str, Any], tuple], Callable[[], Any]]) -> OwnSets:
    """``command.n_sets`` input sets for ``command``'s shape, placed apart, with their callables."""
    key = sets_key(command, device)
    spread = placement.Placements(device, rng)
    seeds = [rng.getrandbits(62) for _ in range(command.n_sets)]
    sets = spread.make_sets(lambda seed: case.make_inputs(command.shape, seed), seeds, lambda: rng.getrandbits(62))
    return OwnSets(key, seeds, sets, [bind(command.shape, args) for args in sets], spread)


def time_round(held: OwnSets | FedSets, case: CaseRuntime, command: Time, device: str, rng: Draws) -> TimeReply:
    """Time the held callables, each call on a set given fresh values just before it. Fed sets
    report every call's outputs to the trusted child; own sets keep ``command.verify`` timed
    outputs (a reservoir sample), sent unless ``send_kept`` is False (kept all the same: keeping
    allocates between timed calls, and a small kernel's time follows where its outputs land)."""
    seen_samples = 0
    fed = isinstance(held, FedSets)
    own = _OwnRound(held, case, command, rng) if isinstance(held, OwnSets) else None

    def on_output(k: int, out: Any) -> None:
        nonlocal seen_samples
        seen_samples += 1
        # every timed call's outputs, before anything touches them: a lazy object or a
        # subclass would do its work when the harness copies or checks it, outside the window
        problems = inspect_outputs(leaves(out), (), device)
        if isinstance(held, FedSets):
            held.keep(k, out, problems)
        if problems:
            raise TimedOutputRefused(f"timed call {seen_samples}: " + "; ".join(problems))
        if own is not None:
            own.keep(k, out, seen_samples)

    with pinning.pinned(command.cpu) as is_pinned:
        stats = timing.measure(
            lambda k: held.fns[k](),
            n_sets=len(held.fns),
            refresh=held.refresh if isinstance(held, FedSets) else own.refresh if own is not None else None,
            on_output=on_output,
            device=device,
            method=command.timer,
            budget_s=command.budget_s,
            warmup_s=command.warmup_s,
            min_samples=command.min_samples,
            budget_cap=timing.BUDGET_CAP,
        )
    if fed:
        held.end_round()  # type: ignore[union-attr]
    if is_pinned:
        stats.flags.append(flag(Flag.TIMING_CPU, command.cpu))
    if len(held.fns) != command.n_sets:
        stats.flags.append(flag(Flag.INPUT_SETS, len(held.fns), "small inputs, each set placed apart"))
    verify = own.sent(command, device) if own is not None else []
    return TimeReply(stats=stats, verify_seeds=[v.seed for v in verify], payload=TimedOutputs(verify=verify))


class _OwnRound:
    """One round over ``OwnSets``: the refresh from fresh seeds drawn here, and the reservoir of
    kept timed outputs."""

    def __init__(self, held: OwnSets, case: CaseRuntime, command: Time, rng: Draws) -> None:
        self.held, self.case, self.command, self.rng = held, case, command, rng
        self.kept: list[dict[str, Any]] = []

    def refresh(self, k: int) -> None:
        held = self.held
        held.seeds[k] = self.rng.getrandbits(62)
        fresh = self.case.make_inputs(self.command.shape, held.seeds[k])
        for dst, src in zip(held.sets[k], fresh):
            if hasattr(dst, "copy_"):
                dst.copy_(src)

    def keep(self, k: int, out: Any, seen_samples: int) -> None:
        held, keep, kept = self.held, self.command.verify, self.kept
        held.spread.keep_output(k, out)
        # reservoir sample of the timed calls: any one of them may be the one checked
        # a copy: a kernel that writes into one preallocated output overwrites it at the next call
        if len(kept) < keep or self.rng.random() < keep / seen_samples:
            entry = {"seed": held.seeds[k], "out": clone_outputs(out),
                     "written": clone_values(tuple(held.sets[k][j] for j in self.command.written_inputs))}
            if len(kept) < keep:
                kept.append(entry)
            else:
                kept[self.rng.randrange(keep)] = entry

    def sent(self, command: Time, device: str) -> list[TimedOutput]:
        self.held.spread.release_outputs()
        verify = []
        for entry in self.kept if command.send_kept else ():
            out_tuple = leaves(entry["out"])
            problems = inspect_outputs(out_tuple, (), device)
            verify.append(TimedOutput(seed=entry["seed"], outputs=None if problems else to_cpu(out_tuple),
                                      written=None if problems else to_cpu(entry["written"])))
        return verify
