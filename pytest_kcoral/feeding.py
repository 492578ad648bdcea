"""Run step, the pytest process's side of the feed (``feed.py``): a trusted child set to feed a
side's process (the candidate's or the baseline's) for one stage of an item, and its report read.

- ``attach_feed``: a socket pair for the stage; one end to the trusted child (``feed_peer``, with
  what it needs to judge the side's outputs as the correctness stage does), the other to the side
  (``attach_feed``).
- ``feed_report``: the trusted child's account once the side is done (its feed then closed); the
  case's failure where the case's own code failed while feeding.

Only for processes of this host (``context.Plan.fed``): two KCoral programs share no memory.
"""

from __future__ import annotations

from typing import Literal

from pytest_kcoral import feed, isolation
from pytest_kcoral.context import ItemContext, StageFailed
from pytest_kcoral.failures import candidate_call, case_call
from pytest_kcoral.isolation import Child
from pytest_kcoral.messages import AttachFeed, FeedPeer, FeedReport, FeedReportReply, ToleranceSpec
from pytest_kcoral.results import CASE_FAILED_PREFIX
from pytest_kcoral.stage_reference import ReferenceData
from pytest_kcoral.transport import Processes, Transport


def feed_command(ctx: ItemContext, ref: ReferenceData, peer: str, trials: bool) -> FeedPeer:
    """What the trusted child needs to feed ``peer`` for the item: with ``trials``, the correctness
    trials (judged against the reference); else the timed calls (the baseline's judged against
    the baseline itself: one that disagrees with the reference is timed all the same)."""
    case, tol = ctx.spec.case, ctx.tolerance
    may_write = set(case.inplace)
    if case.output_buffers_in_inputs:  # GPU MODE's data carries the output buffer the reference returns
        may_write.update(j for _, j in ref.output_aliases)
    against: Literal["reference", "baseline"] = "baseline" if peer == "baseline" and not trials else "reference"
    return FeedPeer(peer=peer, shape=ctx.spec.shape.params, device=ctx.device, tolerance=ToleranceSpec(atol=tol.atol, rtol=tol.rtol, strict=tol.strict),
                    inplace=list(case.inplace), written_inputs=list(ref.written_inputs), may_write=sorted(may_write),
                    checker=bool(case.checker), against=against, trials=list(ref.seeds) if trials else [],
                    aliases_may_write=case.output_buffers_in_inputs)


def attach_feed(ctx: ItemContext, processes: Processes, ref: ReferenceData, peer: str, side: Transport, stage: str,
                trials: bool = False) -> None:
    """The trusted child to feed ``side`` (``peer``: "candidate" or "baseline") for ``stage``.
    The candidate's process failing is its failure in ``stage``; the others', the case's."""
    trusted_end, side_end = feed.socket_pair()
    with trusted_end, side_end:
        case_call(ctx, processes, feed_command(ctx, ref, peer, trials), "feed" if stage == "timing" else "reference",
                  fds=[trusted_end.fileno()])
        if peer == "candidate":
            candidate_call(ctx, side, AttachFeed(), stage, stage, fds=[side_end.fileno()])
        else:
            case_call(ctx, processes, AttachFeed(), "baseline", side, fds=[side_end.fileno()])


# The trusted child's time for its account after a fed side failed, which may have used up the
# item's: a side that hung must not make the case's process time out in its place.
REPORT_AFTER_FAILURE_S = 10.0


def feed_report(ctx: ItemContext, processes: Processes, peer: str, stage: str, after_failure: bool = False) -> FeedReportReply:
    """The trusted child's account of feeding ``peer``, its feed then closed; the case's failure
    when its own code failed while feeding (its make_inputs, its reference). ``after_failure``:
    asked because the side failed, with time of its own (``REPORT_AFTER_FAILURE_S``)."""
    if after_failure:
        trusted = processes.kept_trusted()
        if not isinstance(trusted, Child):
            return FeedReportReply(rounds=[])  # none left to ask: the side's own failure stands
        if peer == "candidate" and trusted.stopped_by_another():
            # nothing of the harness stops it mid-item: the candidate's code did, and its feed starved
            raise StageFailed(stage, "the candidate's process stopped the case's trusted child (SIGSTOP) while it fed the"
                              " candidate's calls", "correctness" if stage == "correctness" else "timing", disqualifies=stage == "timing")
        if trusted.process.exitcode is not None and not isolation.template_alive():
            return FeedReportReply(rounds=[])  # gone with the template a candidate killed: the item says so (``pipeline``)
        ctx.budget.extend(max(0.0, REPORT_AFTER_FAILURE_S - ctx.budget.remaining_s()))
    reply = case_call(ctx, processes, FeedReport(peer=peer, final=True), "feed" if stage == "timing" else "reference")
    if reply.error:
        what = "timed calls" if stage == "timing" else "correctness trials"
        raise StageFailed(stage, CASE_FAILED_PREFIX + f"while feeding the {peer}'s {what}: {reply.error}",
                          "feed" if stage == "timing" else "reference", case_failed=True)
    return reply
