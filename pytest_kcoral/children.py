"""Run step, on this host: the children an item's stages use, started, kept and closed.

- A *candidate child* per candidate, kept between its passed items (``KeptCandidates``).
- A *trusted child* per case: it makes inputs and runs the reference, never a candidate.
- A *baseline child* per case: it times the baseline the way a candidate's child times the
  candidate, so both sides are timed in processes with the same history.
- For an item timed in several pairs of processes, each further pair's candidate child and
  baseline child, kept by pair in the same way.

Every child that imports the case starts only from the case's files as collected
(``require_case_as_collected``). ``LocalProcesses`` hands them to the stages (``transport.Processes``).
``case_spec`` and ``child_env`` say what a child starts with, here or in a KCoral worker.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from pytest_kcoral import confine, isolation
from pytest_kcoral.cases import Case, changed_case_files
from pytest_kcoral.child import BASELINE, CANDIDATE, TRUSTED
from pytest_kcoral.context import Budget, ItemContext, ItemSpec, StageFailed, derive_seed
from pytest_kcoral.failures import candidate_call, describe_child_failure, needs_cuda
from pytest_kcoral.isolation import Child, ChildFailure
from pytest_kcoral.kept_children import MAX_FURTHER_BASELINES, CaseChildren, KeptCandidates
from pytest_kcoral.messages import LoadBaseline, LoadCandidate
from pytest_kcoral.options import Settings
from pytest_kcoral.results import CASE_FAILED_PREFIX
from pytest_kcoral.transport import Transport

# Fresh processes whose import of a candidate timed out before its other shapes fail at once
# (``LocalChildren.import_hung``).
IMPORT_HANGS = 2


def case_spec(case: Case, settings: Settings, device_kind: str, cpu_threads: int | None) -> dict[str, Any]:
    """What a child needs to import the case (``case_runtime.CaseRuntime``)."""
    return {
        "format": case.format,
        "source": str(case.source),
        "baseline_file": str(case.baseline_file) if case.baseline_file else None,
        "device": "cpu",  # until the lease names the device
        "device_kind": device_kind,
        "init_seed": derive_seed(settings.seed, case.case_id, "init"),
        "cpu_threads": cpu_threads,
        "helper_files": {name: str(path) for name, path in case.helper_files.items()},
    }


def child_env(settings: Settings, device_kind: str, sandbox: Any) -> dict[str, str]:
    """The environment every child (and the template) starts with."""
    # torch.compile compiles in this process rather than in a pool of workers that would outlive
    # the call (and count as processes left behind). On a CPU, Triton kernels run through its
    # interpreter.
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
    if device_kind == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env.update(confine.child_env(settings.confinement, sandbox, remote=settings.url is not None))
    return env


def load_candidate(spec: ItemSpec) -> LoadCandidate:
    """The command that loads an item's candidate in its child (or builds a kept one for the shape)."""
    return LoadCandidate(path=str(spec.candidate.path), shape=spec.shape.params)


def require_case_as_collected(case: Case, stage: str, phase: str) -> None:
    """Before a child imports the case: its files as they were at collection, or the case's
    failure. Without ``--kcoral-sandbox`` a candidate can write into the case tree; a child
    started later (the next item's, a trusted child restarted) would run what it wrote."""
    changed = changed_case_files(case)
    if changed:
        raise StageFailed(stage, CASE_FAILED_PREFIX + f"its files changed after collection ({', '.join(changed)}): a candidate may have"
                          " written them; --kcoral-sandbox keeps the case tree read-only", phase, case_failed=True)


class LocalChildren:
    """The session's children on this host, and the pools that keep them between items."""

    def __init__(self, settings: Settings, device_kind: str, sandbox: Any = None, cpu_threads: int | None = None) -> None:
        self.settings = settings
        self.device_kind = device_kind
        self.sandbox = sandbox  # sandbox.Sandbox under --kcoral-sandbox: children run inside it
        self.cpu_threads = cpu_threads
        self.env = child_env(settings, device_kind, sandbox)
        self.candidates = KeptCandidates()
        self.trusted_children = CaseChildren()
        self.baseline_children = CaseChildren()
        # further pairs' children, by pair (``further_candidate``, ``further_baseline``)
        self.further_candidates = KeptCandidates()
        self.further_baselines = CaseChildren(MAX_FURTHER_BASELINES)
        # a case's trusted child that failed to start beside the first item's other children
        # (``start_case_children``), raised where the item first needs it
        self._trusted_failures: dict[Hashable, BaseException] = {}
        # candidates whose import ran out of the item's time in a fresh process, by
        # ``candidate_key``: each item where it did, and the last message (``import_hung``)
        self._import_hangs: dict[Hashable, tuple[list[str], str]] = {}

    def case_spec(self, case: Case) -> dict[str, Any]:
        return case_spec(case, self.settings, self.device_kind, self.cpu_threads)

    def candidate(self, ctx: ItemContext, stack: contextlib.ExitStack, reuse: bool = False) -> Child:
        """The candidate's child, holding the case; closed when ``stack`` unwinds unless it was kept
        meanwhile (``keep_or_close``). With ``reuse``, the child the candidate's last passed item of
        this case left, which holds the candidate already. Otherwise a fresh one, in which nothing
        of the candidate has run yet (``load_candidate`` comes next): a failure here is the case's
        (one that crashes or hangs at import in a child only), and the message says so."""
        child = self._candidate_child(ctx, self.candidates, candidate_key(ctx.spec) if reuse else None)
        stack.callback(self._close_unless_kept, child)
        return child

    def further_candidate(self, ctx: ItemContext, index: int) -> Child:
        """The candidate's child for the item's further pair of processes ``index`` (1, 2, ...):
        the one that pair used in the candidate's last passed item of the case, else a fresh one.
        The caller loads the candidate, and hands the child to ``keep_or_close_further`` when the
        item is over."""
        return self._candidate_child(ctx, self.further_candidates, (*candidate_key(ctx.spec), index))

    def _candidate_child(self, ctx: ItemContext, kept: KeptCandidates, key: Hashable | None) -> Child:
        """The child ``kept`` holds under ``key`` (None: none is reused), or a fresh one."""
        spec = ctx.spec
        child = kept.take(key) if key is not None else None
        if child is None:
            require_case_as_collected(spec.case, "compile", "startup")
            try:
                child = Child(CANDIDATE, self.case_spec(spec.case), self.env, ctx.budget.deadline, spec.candidate.name, self.sandbox,
                              live_output=self.settings.live_output)
            except ChildFailure as failure:
                raise needs_cuda(ctx, failure) or StageFailed("compile", CASE_FAILED_PREFIX + describe_child_failure(failure), failure.phase,
                                                              case_failed=True) from None
        ctx.budget.hold(child)
        child.items_served += 1
        return child

    def note_import_hang(self, spec: ItemSpec, message: str) -> None:
        """The candidate's import, in a fresh process, ran out of the item's time. After
        ``IMPORT_HANGS`` such items its later ones fail at once (``import_hung``), so a candidate
        that hangs at import costs its other shapes no further --kcoral-timeout each. One is
        not enough: a build cut off at the timeout (``load_inline``) resumes in the next process."""
        items, _ = self._import_hangs.get(candidate_key(spec), ([], ""))
        self._import_hangs[candidate_key(spec)] = ([*items, spec.nodeid], message)

    def import_hung(self, spec: ItemSpec) -> StageFailed | None:
        """The compile failure of a candidate whose import timed out in ``IMPORT_HANGS`` earlier items, or None."""
        items, message = self._import_hangs.get(candidate_key(spec), ([], ""))
        if len(items) < IMPORT_HANGS:
            return None
        return StageFailed("compile", f"not imported again: its import timed out in {' and '.join(items)} (--kcoral-timeout"
                           f" {self.settings.timeout_s:g} s), so its other shapes are not tried in this session\n{message}", "import")

    def keep_or_close(self, spec: ItemSpec, child: Child, passed: bool) -> None:
        """At the end of an item, before the device is given back: a child whose item passed is
        paused and kept for the candidate's next item; any other is closed, so nothing it left
        running overlaps the next holder's measurements."""
        key = candidate_key(spec)
        if passed and child.process.exitcode is None:
            self.candidates.keep(key, child)
        else:
            child.close()
            # and the candidate's further pairs' children: after a failure, all its next item's processes are fresh
            self.further_candidates.close_where(lambda kept: isinstance(kept, tuple) and kept[:len(key)] == key)

    def keep_or_close_further(self, spec: ItemSpec, index: int, child: Child, passed: bool) -> None:
        """``keep_or_close`` for a further pair's candidate child."""
        if passed and child.process.exitcode is None:
            self.further_candidates.keep((*candidate_key(spec), index), child)
        else:
            child.close()

    def _close_unless_kept(self, child: Child) -> None:
        if not self.candidates.holds(child):
            child.close()

    def baseline(self, ctx: ItemContext) -> Child | StageFailed:
        """The case's baseline child: it holds the baseline in the candidate's place
        (``load_baseline``) and gets, per item, the correctness stage's ``run`` the candidate got,
        then the same ``time`` commands. Or the case's failure, raised when timing starts (the
        candidate's compile and correctness come first).

        Not the trusted child: the same code timed there and in a fresh child that went the
        candidate's way read apart (docs/performance.md, "The short-kernel lean was the trusted
        child's"). Kept across the case's items, as the trusted child is, so a baseline that
        compiles (``torch.compile``, Triton) compiles once per worker, not under the lease of every
        item. Started before the first item's candidate code runs, and only from the case's files
        as collected, so a candidate that rewrites them (no ``--kcoral-sandbox``) cannot reach the
        baseline it is timed against."""
        case = ctx.spec.case
        return self._kept_baseline(ctx, self.baseline_children, (case.case_id, case.content_hash))

    def further_baseline(self, ctx: ItemContext, index: int) -> Child | StageFailed:
        """The case's baseline child for an item's further pair of processes ``index`` (1, 2,
        ...), kept across the case's items as ``baseline`` keeps the first pair's; or the case's
        failure to start one. Its timeout counts from now, as a fresh one's (``fresh_baseline``)."""
        case = ctx.spec.case
        child = self._kept_baseline(ctx, self.further_baselines, (case.case_id, case.content_hash, index))
        if isinstance(child, Child):
            child.deadline = time.monotonic() + self.settings.timeout_s
        return child

    def _kept_baseline(self, ctx: ItemContext, kept: CaseChildren, key: Hashable) -> Child | StageFailed:
        """The baseline child ``kept`` holds under ``key``, else a fresh one, kept there; or the
        case's failure to start one."""
        child = kept.take(key)
        if child is None:
            fresh = self.fresh_baseline(ctx)
            if isinstance(fresh, StageFailed):
                return fresh
            child = fresh
        return kept.keep(key, child)

    def fresh_baseline(self, ctx: ItemContext) -> Child | StageFailed:
        """A new baseline child holding the baseline (``baseline`` and ``further_baseline`` keep
        them). One started after candidate code ran is as safe as the first: it imports the case
        only as collected, and compiles its kernels in a directory of its own
        (``child._compile_without_shared_caches``)."""
        case = ctx.spec.case
        child = None
        try:
            require_case_as_collected(case, "timing", "baseline")
            # a budget of its own, as the case's work has in ``pipeline.LocalExecutor._record_baseline_only``
            child = Child(BASELINE, self.case_spec(case), self.env, time.monotonic() + self.settings.timeout_s,
                          f"baseline:{case.case_id}", self.sandbox)
            child.call(LoadBaseline(), "baseline")
            return child
        except StageFailed as failure:
            return failure
        except ChildFailure as failure:
            if child is not None:
                child.close()
            skipped = needs_cuda(ctx, failure)
            if skipped is not None:
                raise skipped from None
            return StageFailed("timing", CASE_FAILED_PREFIX + describe_child_failure(failure), failure.phase, case_failed=True)

    def start_case_children(self, ctx: ItemContext) -> CaseChildrenStart:
        """The case's trusted child and, for a timed item, its baseline child, each started in a
        thread of its own where none is kept, beside the candidate's child that this thread starts
        next: on a case's first item the three start-ups (an interpreter each, a case import)
        overlap. Ask for the baseline (``CaseChildrenStart.baseline``) before any candidate code of
        the item runs, so the two import the case before a candidate could rewrite it. A trusted
        child that fails to start fails the item where the item first needs it (``trusted``), as
        one started there would."""
        case = ctx.spec.case
        key = (case.case_id, case.content_hash)

        def baseline() -> Child | StageFailed | None:
            return self.baseline(ctx) if ctx.timed else None

        if self.trusted_children.peek(key) is not None:
            return CaseChildrenStart([], baseline)  # a later item of the case: its children are kept

        def start_trusted() -> None:
            try:
                self.trusted(case, ctx.budget)
            except (ChildFailure, StageFailed) as failure:
                self._trusted_failures[key] = failure

        self._trusted_failures.pop(key, None)  # an earlier item's, never asked for (that item failed first): this start decides
        # started here, in the main thread, if it is not running: the template dies with this
        # process only when the main thread forked it (``isolation.ensure_template``)
        isolation.ensure_template(self.env, self.sandbox)
        jobs: list[Callable[[], Any]] = [start_trusted]
        if ctx.timed and self.baseline_children.peek(key) is None:
            jobs.append(baseline)
        pool = concurrent.futures.ThreadPoolExecutor(len(jobs), thread_name_prefix="kcoral-case-child")
        started = [pool.submit(job) for job in jobs]
        pool.shutdown(wait=False)
        return CaseChildrenStart(started, baseline)

    def trusted(self, case: Case, budget: Budget) -> Child:
        """The case's trusted child, kept across items: it only ever imports the case."""
        key = (case.case_id, case.content_hash)
        failure = self._trusted_failures.pop(key, None)
        if failure is not None:
            raise failure
        child = self.trusted_children.take(key)
        if child is None:
            require_case_as_collected(case, "correctness", "reference")
            child = Child(TRUSTED, self.case_spec(case), self.env, budget.deadline, f"reference:{case.case_id}", self.sandbox)
        budget.hold(child)
        return self.trusted_children.keep(key, child)

    def kept_trusted(self, case: Case) -> Child | None:
        """The case's trusted child as kept, none started: the one that fed an item's side."""
        return self.trusted_children.peek((case.case_id, case.content_hash))

    def forget(self, child: Transport) -> None:
        """Never reuse a kept child that failed: it may be dead, hung or in a bad state."""
        self.trusted_children.forget(child)
        self.baseline_children.forget(child)
        self.further_baselines.forget(child)
        child.close()

    def resume_kept(self) -> None:
        """SIGCONT to the kept trusted and baseline children (``CaseChildren.resume``)."""
        self.trusted_children.resume()
        self.baseline_children.resume()
        self.further_baselines.resume()

    def close(self) -> None:
        """End every child (the session is over), and whatever any child left running outside its
        tree (``isolation.sweep_session_processes``)."""
        self.candidates.close()
        self.further_candidates.close()
        self.trusted_children.close()
        self.baseline_children.close()
        self.further_baselines.close()
        isolation.sweep_session_processes()


class CaseChildrenStart:
    """A case's children starting beside an item's candidate child (``LocalChildren.start_case_children``)."""

    def __init__(self, started: list[concurrent.futures.Future[Any]], baseline: Callable[[], Child | StageFailed | None]) -> None:
        self._started = started  # the trusted child's start, then the baseline's when it started too
        self._baseline = baseline

    def baseline(self) -> Child | StageFailed | None:
        """The case's baseline child (``LocalChildren.baseline``; None for an untimed item), once
        every start-up under way is over. Raises what the baseline's start raised (no CUDA: skipped)."""
        answers = [future.result() for future in self._started]
        return answers[1] if len(answers) == 2 else self._baseline()

    def settle(self) -> None:
        """Wait for the start-ups under way and start nothing more: the item failed first. Their
        children are kept for the case's next item; a failure waits for whoever asks next."""
        concurrent.futures.wait(self._started)


class LocalProcesses:
    """``transport.Processes`` for one item on this host."""

    def __init__(self, children: LocalChildren, ctx: ItemContext) -> None:
        self.children = children
        self.ctx = ctx
        self.further: list[tuple[int, Child]] = []  # further pairs' candidate children, until ``settle_further``

    def trusted(self) -> Transport:
        return self.children.trusted(self.ctx.spec.case, self.ctx.budget)

    def kept_trusted(self) -> Transport | None:
        return self.children.kept_trusted(self.ctx.spec.case)

    def forget(self, process: Transport) -> None:
        self.children.forget(process)

    @contextlib.contextmanager
    def further_candidate(self, index: int) -> Iterator[Transport]:
        candidate = self.children.further_candidate(self.ctx, index)
        self.further.append((index, candidate))  # kept or closed once the item is over (``settle_further``)
        candidate_call(self.ctx, candidate, load_candidate(self.ctx.spec), "import", "compile")
        yield candidate

    @contextlib.contextmanager
    def further_baseline(self, index: int) -> Iterator[Transport]:
        baseline = self.children.further_baseline(self.ctx, index)
        if isinstance(baseline, StageFailed):
            raise baseline
        yield baseline  # kept for the case's next item unless it failed (``forget``)

    def settle_further(self, passed: bool) -> None:
        """The item is over: its further pairs' candidate children are kept if it ``passed``
        (``LocalChildren.keep_or_close_further``), else closed."""
        further, self.further = self.further, []
        for index, child in further:
            self.children.keep_or_close_further(self.ctx.spec, index, child, passed)


def candidate_key(spec: ItemSpec) -> tuple[str, str, str]:
    """Which kept child an item may reuse: one of the same case (as collected) and candidate file."""
    return spec.case.case_id, spec.case.content_hash, str(spec.candidate.path)
