"""The ``run`` command in a candidate's (or the baseline's) child: the correctness trials, one call
per trial's inputs, each after poisoning the memory its outputs will reuse.

- Fed (on this host, ``Run.fed``): the case's trusted child writes each trial's inputs, the very
  ones its reference ran on, into this child's memory just before the call, and judges the
  outputs this child copies to the slot (``child_timing.FedSets``: a set per trial, or one taking
  them in turn when large). The reply carries no tensors.
- Not fed (a KCoral program): the inputs come in the command; the call gets device copies, and
  the outputs, and the INPLACE inputs written, go back to the parent, which judges them.

Either way this child reports what only the live objects tell: outputs that are no plain dense
tensors on the device (``inspect_outputs``), which outputs share memory with inputs, and the
outputs' structure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_kcoral import correctness
from pytest_kcoral.child_outputs import aliases, clone_values, flatten_outputs, inspect_outputs, poison, synchronize, to_cpu
from pytest_kcoral.child_timing import FedSets
from pytest_kcoral.feed import FeedChannel
from pytest_kcoral.messages import Run, RunReply, RunResults
from pytest_kcoral.timing import guards


def run_trials(command: Run, bind: Callable[[dict[str, Any], tuple], Callable[[], Any]], device: str, parameters_differ: bool | None,
               feed: FeedChannel | None) -> RunReply:
    """Every trial of ``command`` once; ``bind(shape, args)`` makes the call (the candidate's, or the baseline's)."""
    import torch

    shape = command.shape
    allowed_aliases = {(int(i), int(j)) for i, j in command.allowed_aliases}
    outputs: list[Any] = []
    written: list[Any] = []
    inputs_changed: list[list[list[int | None]]] = []
    findings: list[list[str]] = []
    structures: list[Any] = []
    output_aliases: list[list[list[int]]] = []
    fed: FedSets | None = None
    trials: list[Any] = command.payload.inputs
    if command.fed:
        if feed is None:
            raise RuntimeError("a fed run command before attach_feed")
        fed = FedSets(feed, shape, 1, device, bind)  # the trusted child's layout says how many sets
        trials = [None] * command.trials
    for t, sent in enumerate(trials):
        if fed is not None:
            k = t % len(fed.sets)
            fed.refresh(k)  # the trusted child writes the trial's inputs now
            args = fed.sets[k]
            fn = fed.fns[k]
        else:
            # the call gets copies on the device; ``before`` keeps the inputs as sent, to find what it
            # wrote: a copy made on the device, not a second transfer from the host
            args = tuple(a.to(device, copy=True) if isinstance(a, torch.Tensor) else a for a in sent)
            before = clone_values(args)
            fn = bind(shape, args)
        poison(command.poison_bytes, device)
        with guards.gc_disabled():  # as in the timing loop: gc's state cannot tell checked calls from timed ones
            out = fn()
            synchronize(device)
        # flattened once: a container of the candidate's could yield other values a second time
        out_tuple, structure = flatten_outputs(out)
        problems = inspect_outputs(out_tuple, args, device, allowed_aliases)
        # which outputs are inputs: a GPU MODE kernel may write the output buffer its data carries
        # (only for plain dense outputs: a sparse one, say, has no storage to compare)
        shared = [list(pair) for pair in sorted(aliases(out_tuple, args))] if not problems else []
        structures.append(structure)
        findings.append(problems)
        output_aliases.append(shared)
        if fed is not None:
            fed.keep(k, out, problems, shared)
            outputs.append(None)
            written.append(None)
            inputs_changed.append([])
        else:
            outputs.append(to_cpu(out_tuple) if not problems else None)
            written.append(to_cpu(tuple(args[j] for j in command.written_inputs)) if not problems else None)
            inputs_changed.append(correctness.changed_inputs(before, args))
    if fed is not None:
        fed.end_round()  # the last trial judged before the reply
        fed.close()
    return RunReply(findings=findings, inputs_changed=inputs_changed, structures=structures, output_aliases=output_aliases,
                    parameters_differ=parameters_differ, payload=RunResults(outputs=outputs, written=written))
