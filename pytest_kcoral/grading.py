"""Run step: one item graded. Its stages run over an item context (``context.ItemContext``), and
how they ended becomes its record (``results.ItemResult``), the same way for every executor.

A stage that fails ends the item there (``StageFailed``); a grading service that stops answering
leaves it ungraded (``ServiceUnavailable``); code that needs CUDA on a machine without one skips
it (``ItemSkipped``). Anything else is the harness's failure, and still a failed item: an item
without a result would be missing from the JSON and every score, and a candidate that could
provoke one would hide its failing shapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from pytest_kcoral import static_report
from pytest_kcoral.context import Budget, ItemContext, ItemSkipped, ItemSpec, Plan, ServiceUnavailable, StageFailed
from pytest_kcoral.options import Settings
from pytest_kcoral.results import ItemResult


def new_result(spec: ItemSpec) -> ItemResult:
    """The item's record before any stage ran."""
    case, candidate, shape = spec.case, spec.candidate, spec.shape
    return ItemResult(
        nodeid=spec.nodeid,
        case=case.case_id,
        candidate=candidate.name,
        split=shape.split,
        shape=dict(shape.params),
        shape_id=shape.shape_id,
        tier=case.tier,
        team=candidate.team,
        attempt=candidate.attempt,
        expected=candidate.expected,
        candidate_shapes=len(case.shapes),
    )


def grade(spec: ItemSpec, result: ItemResult, settings: Settings, plan: Plan, device_kind: str,
          run_stages: Callable[[ItemContext], None]) -> None:
    """Run ``run_stages`` over the item's context and record how it ended in ``result``."""
    started = time.monotonic()
    result.suspicious = static_report.scan_file(spec.candidate.path)
    try:
        if spec.shape.gpu_only and device_kind == "cpu":
            raise ItemSkipped("shape is marked gpu_only and no GPU is visible")
        run_stages(ItemContext(spec, settings, plan, device_kind, Budget(settings.timeout_s), result))
        result.stage = "done"
        result.outcome = "passed"
    except StageFailed as failure:
        result.stage = failure.stage
        result.phase = failure.phase
        result.outcome = "failed"
        result.message = failure.message
        result.case_failed = failure.case_failed
        if failure.case_failed:  # found after timing (the case's files changed): a speedup against a failed case means nothing
            result.speedup = result.speedup_ci = None
        if failure.stage == "compile":  # also a compiler error at the first call (Triton, cpp_extension)
            result.compiled = False
        if failure.stage == "correctness" or failure.disqualifies:
            result.correct = False
    except ServiceUnavailable as outage:
        # failed, so the run cannot pass, but kept out of the scores: nothing was graded
        result.stage = outage.stage
        result.outcome = "failed"
        result.message = outage.message
        result.extra.service_unavailable = True
    except ItemSkipped as skip:
        result.outcome = "skipped"
        result.message = str(skip)
    except Exception as exc:  # noqa: BLE001 - a harness error (or one a child provoked): failed, never lost
        fail_after_the_stages(result, settings, f"the harness failed on this item: {type(exc).__name__}: {exc}"[:2000], "harness_error")
    finally:
        result.duration_s = time.monotonic() - started


def fail_after_the_stages(result: ItemResult, settings: Settings, why: str, marker: Literal["harness_error", "template_killed"]) -> None:
    """Fail an item for what went wrong around its stages (``extra``'s ``marker`` says what): at the
    stage it had reached, and not correct once it compiled, so that nothing a candidate can
    provoke earns a grade. A failure the stages had found already stays in the message."""
    if result.outcome != "failed":
        timed = result.correct and settings.mode != "correctness"
        result.stage = "timing" if timed else ("correctness" if result.compiled else "compile")
    elif result.message:
        why = f"{why}\n(before that: {result.message.splitlines()[0]})"
    result.outcome = "failed"
    result.correct = False if result.compiled else None
    result.message = why
    setattr(result.extra, marker, True)
