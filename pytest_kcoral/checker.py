"""A case that judges outputs itself: GPU MODE's ``check_implementation(data, output)``.

The checker is the problem author's code, so it is trusted: it runs in the case's trusted child
(which runs the reference and never imports a candidate), on inputs made again there from each
trial's seed, and on the candidate's outputs as they came back to the pytest process. Its verdict
replaces the dtype and tolerance rules (``correctness.compare_outputs``); the harness's other
checks still run around it (``pipeline._check_correctness``), and outputs left unwritten (NaN
poison where the reference is finite) fail whatever the checker accepts.

The parent side asks (``trial_problems``, ``timed_problems``); the trusted child answers the
``check`` command (``check_outputs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pytest_kcoral.correctness import structure_leaves
from pytest_kcoral.messages import Check, CheckOutputs, CheckReply, TimedOutput

# A checker's message is shown on failure: GPU MODE's list the first mismatches, keep them whole
MESSAGE_LIMIT_CHARS = 1500


class TrustedCall(Protocol):
    """Sends a ``check`` command to the case's trusted child, in a phase, and returns its reply."""

    def __call__(self, command: Check, phase: str) -> CheckReply: ...


# -- the pytest process -------------------------------------------------------------------------


def trial_problems(call: TrustedCall, shape: dict[str, Any], device: str, seeds: Sequence[int], outputs: Sequence[Any],
                   structures: Sequence[Any], reference: Sequence[Any]) -> list[list[str]]:
    """Per correctness trial, what is wrong with the candidate's outputs: the checker's message,
    or elements left unwritten. Trials whose outputs did not come back (the child's findings say
    why) get none here."""
    asked = [t for t, out in enumerate(outputs) if out is not None]
    problems: list[list[str]] = [[] for _ in outputs]
    if not asked:
        return problems
    verdicts = _ask(call, "check", shape, device, [seeds[t] for t in asked], [outputs[t] for t in asked], [structures[t] for t in asked])
    for t, verdict in zip(asked, verdicts):
        problems[t] = unwritten_elements(outputs[t], reference[t]) + verdict
    return problems


def timed_problems(call: TrustedCall, shape: dict[str, Any], device: str, verify: Sequence[TimedOutput], structure: Any) -> list[list[str]]:
    """Per kept timed call, the checker's message on its outputs for its seed (``structure``:
    the reference's, which the correctness stage found the candidate's outputs shaped like)."""
    problems: list[list[str]] = [["no outputs came back"] if v.outputs is None else [] for v in verify]
    asked = [n for n, v in enumerate(verify) if v.outputs is not None]
    if asked:
        verdicts = _ask(call, "verify", shape, device, [verify[n].seed for n in asked], [verify[n].outputs for n in asked],
                        [structure] * len(asked))
        for n, verdict in zip(asked, verdicts):
            problems[n] = verdict
    return problems


def _ask(call: TrustedCall, phase: str, shape: dict[str, Any], device: str, seeds: list[int], outputs: list[Any],
         structures: list[Any]) -> list[list[str]]:
    reply = call(Check(shape=shape, device=device, seeds=seeds, structures=structures, payload=CheckOutputs(outputs=[list(o) for o in outputs])),
                 phase)
    if len(reply.verdicts) != len(seeds):
        raise RuntimeError(f"the trusted child answered the check with {str(reply.verdicts)[:200]}")
    return reply.verdicts


def unwritten_elements(outputs: Sequence[Any], reference: Sequence[Any]) -> list[str]:
    """Outputs NaN or infinite where the reference is finite, element for element where the two
    have one shape: memory the candidate never wrote reads back as the NaN poison, and a checker
    that looks at a sum or a sample would not see it."""
    import torch

    problems = []
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        if not (isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor)) or out.shape != ref.shape or out.numel() == 0:
            continue
        if not (out.is_floating_point() and (ref.is_floating_point() or ref.is_complex())):
            continue
        unwritten = ~torch.isfinite(out) & torch.isfinite(ref)
        if unwritten.any():
            problems.append(f"output {i}: {int(unwritten.sum())} of {out.numel()} elements are NaN/Inf where the reference is finite"
                            " (unwritten elements read back as NaN poison)")
    return problems


# -- the trusted child --------------------------------------------------------------------------


def check_outputs(case: Any, command: Check) -> list[list[str]]:
    """The ``check`` command: per seed, the case's inputs made again, the candidate's outputs
    rebuilt in the structure it returned them in, and the checker's verdict on them."""
    import torch  # here, not at the top: the pytest process imports this module too

    verdicts = []
    for seed, leaves, structure in zip(command.seeds, command.payload.outputs, command.structures):
        if structure_leaves(structure) != len(leaves):
            verdicts.append([f"returned {len(leaves)} output value(s), shaped unlike the reference's"])
            continue
        args = case.make_inputs(command.shape, seed)
        values = [v.to(case.device) if isinstance(v, torch.Tensor) else v for v in leaves]
        try:
            output = rebuild(structure, values)
            verdict = problems_of(case.check(args, output))
        except Exception as exc:  # noqa: BLE001 - a checker that raises on an output rejects it
            verdict = [f"the problem's check_implementation raised {type(exc).__name__} on this output: {exc}"[:MESSAGE_LIMIT_CHARS]]
        verdicts.append(verdict)
    return verdicts


def problems_of(verdict: Any) -> list[str]:
    """A checker's answer as problems: GPU MODE's return ``''`` (accepted) or a message, newer
    ones ``(passed, message)``; ``True``/``False`` and ``None`` (accepted) are read too."""
    if isinstance(verdict, tuple) and len(verdict) == 2 and isinstance(verdict[0], bool):
        passed, message = verdict
    elif isinstance(verdict, str):
        passed, message = not verdict, verdict
    elif isinstance(verdict, bool) or verdict is None:
        passed, message = verdict is not False, ""
    else:
        raise TypeError(f"check_implementation returned {type(verdict).__name__} {verdict!r:.80}: expected '' or a message,"
                        " or (passed, message)")
    if passed:
        return []
    text = str(message).strip() or "rejected, without a message"
    return ["check_implementation: " + text[:MESSAGE_LIMIT_CHARS]]


def rebuild(structure: Any, values: list[Any]) -> Any:
    """The inverse of ``child.flatten_outputs``: a lone value for ``0``, a tuple for a list, a
    dict for a dict, filled in order from ``values``."""
    remaining = iter(values)

    def build(node: Any) -> Any:
        if isinstance(node, list):
            return tuple(build(n) for n in node)
        if isinstance(node, dict):
            return {k: build(v) for k, v in node.items()}
        return next(remaining)

    return build(structure)
