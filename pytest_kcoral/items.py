"""Collect step, part three: pytest nodes. A case folder (or a KernelBench problem file among
others) is a collector; each (candidate, shape) is an item whose ``runtest`` hands the work to the
session's executor."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from _pytest._code.code import TerminalRepr

from pytest_kcoral import captured_output
from pytest_kcoral.candidates import Candidate, bundled_folder, find_candidates
from pytest_kcoral.cases import KCORAL_BENCH, Case, CaseError, Shape, load_case, load_problem_file
from pytest_kcoral.executors import get_executor
from pytest_kcoral.pipeline import ItemSpec
from pytest_kcoral.report import junit_figure
from pytest_kcoral.results import ItemResult
from pytest_kcoral.scoring import host_set
from pytest_kcoral.stash import get_settings, result_key, submissions_matched_key


class KernelFailure(Exception):
    """Raised by an item whose stage failed; carries the result for the report."""

    def __init__(self, result: ItemResult) -> None:
        super().__init__(result.message)
        self.result = result


class CandidateFailure(KernelFailure):
    """A failure that is the candidate's own: not its case's, nor a grading service's. Only this
    one is what a known-wrong candidate is expected to give (``xfail(raises=...)``)."""


KNOWN_WRONG_REASON = "known answer: a wrong candidate, expected to fail"


def _case_items(collector: pytest.Collector, load: Callable[[], Case]) -> tuple[Case, list[pytest.Item]]:
    """The items of the case ``load`` reads: every candidate times every shape, shape by shape."""
    config = collector.config
    settings = get_settings(config)
    try:
        case = load()
        candidates = find_candidates(case, settings.submissions)
    except CaseError as exc:
        # one broken case must not stop the others from running
        config.option.continue_on_collection_errors = True
        raise collector.CollectError(str(exc)) from None
    taken = config.stash.setdefault(submissions_matched_key, {})
    for c in candidates:
        if c.team is not None:
            taken.setdefault(c.path, set()).add(case.case_id)
    if not candidates and not settings.submissions:
        # a first case without its candidates/ folder would otherwise grade nothing in silence
        # (with --kcoral-submissions, a case nobody submitted for is expected)
        warnings.warn_explicit(pytest.PytestWarning(_no_candidates(case)), None, filename=str(case.source), lineno=1)
    for lineno, message in case.ignored_config:  # a bench folder's: said at its bench.json
        warnings.warn_explicit(pytest.PytestWarning(message), None, filename=str(case.folder / "bench.json"), lineno=lineno)
    for problem in case.cost_problems:
        # optional figures: the case still grades, without them on that shape
        message = f"{case.case_id}: {problem}; that shape gets no speed-of-light figures or physical floor"
        warnings.warn_explicit(pytest.PytestWarning(message), None, filename=str(case.source), lineno=1)
    # shape by shape: a shape's items sit next to each other, so xdist, which hands out
    # consecutive items in chunks, tends to give them to one worker, and that worker's
    # reference data for the shape (computed under the lease) serves all of them
    names = [(f"{candidate.name}[{shape.split}-{shape.shape_id}]", candidate, shape) for shape in case.shapes for candidate in candidates]
    items: list[pytest.Item] = [
        KernelItem.from_parent(collector, name=name, nodeid=item_nodeid(collector.nodeid, name), case=case, candidate=candidate, shape=shape)
        for name, candidate, shape in names]
    return case, items


def item_nodeid(parent_nodeid: str, name: str) -> str:
    """An item's node id, given as a string so that pytest parses it as it parses the ids it saved.

    pytest 9.2 compares structured ids (``_pytest.nodeid.NodeId``: path, names, params). Left to
    itself it would build ``add::good[seen-n=4]`` as the name ``good[seen-n=4]`` with no params,
    while ``--lf``, ``--ff``, ``--nf`` and ``--sw`` parse the saved string into the name ``good``
    and the params ``seen-n=4``: the two never compare equal, and ``--lf`` reran every item.
    A string parses the same way on both sides; older pytest keeps strings as they are."""
    return f"{parent_nodeid}::{name}"


def _no_candidates(case: Case) -> str:
    if case.standalone:
        level = f"level_{case.level}" if case.level is not None else "level_<L> (its folder is named level<L>)"
        return (f"{case.case_id}: no candidates to grade (a KernelBench problem's are --kcoral-submissions RUN_DIR files named"
                f" {level}_problem_{case.problem_id}_sample_<k>_kernel.py, or <team>/{case.name}.py)")
    folder = bundled_folder(case)
    shown = case.case_id if folder == case.folder else f"{case.case_id}/{folder.name}"
    return f"{case.case_id}: no candidates to grade (no .py files in {shown}/)"


class CaseDirectory(pytest.Directory):
    """A case folder: its items are every candidate times every shape."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        case, items = _case_items(self, lambda: load_case(self.path, self.config.rootpath))
        yield from items
        yield from self._collect_the_rest(case)

    def _collect_the_rest(self, case: Case) -> Iterable[pytest.Item | pytest.Collector]:
        """What else the folder holds, collected as pytest would (a maintainer's ``test_*.py``
        beside ``case.py``, a case in a subfolder): not the candidates, which are untrusted and
        never imported here. A KCoral bench folder's own ``.py`` files are all candidates."""
        ihook = self.ihook
        candidates_folder = bundled_folder(case)
        for entry in sorted(self.path.iterdir()):
            if entry.name.startswith((".", "__")) or entry == candidates_folder:
                continue
            if ihook.pytest_ignore_collect(collection_path=entry, config=self.config):
                continue
            if entry.is_dir():
                collector = ihook.pytest_collect_directory(path=entry, parent=self)
                if collector is not None:
                    yield collector
            elif entry.is_file() and not (case.format == KCORAL_BENCH and entry.suffix == ".py"):
                yield from ihook.pytest_collect_file(file_path=entry, parent=self)


class KernelBenchProblem(pytest.File):
    """A KernelBench problem file among others in a level folder (``level1/19_ReLU.py``): a case
    by itself, whose candidates are submissions (KernelBench's run files)."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        _, items = _case_items(self, lambda: load_problem_file(self.path, self.config.rootpath))
        return items


class KernelItem(pytest.Item):
    def __init__(self, *, case: Case, candidate: Candidate, shape: Shape, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.candidate = candidate
        self.shape = shape
        self.add_marker("kcoral")
        self.add_marker(shape.split)
        self.add_marker(f"tier{case.tier}")
        if candidate.expected == "fail":
            # a failing item is expected: xfailed. Passing items show as xpassed; a known-wrong
            # candidate that passes every item fails the session (``known_answers``), since a
            # wrong solution may well be right on some shapes. A case's failure stays a failure.
            self.add_marker(pytest.mark.xfail(reason=KNOWN_WRONG_REASON, raises=CandidateFailure, strict=False))

    def runtest(self) -> None:
        result = get_executor(self.config).run(ItemSpec(self.nodeid, self.case, self.candidate, self.shape))
        self.stash[result_key] = result
        result.candidate_file = _relative_to(self.candidate.path, self.config.rootpath)
        settings = get_settings(self.config)
        if not settings.live_output or settings.url:  # with -s a local run has shown it already
            for stream, text in captured_output.sections(result.output_tail):
                self.add_report_section("call", stream, text)  # pytest's "Captured stdout call"
        for name, value in junit_properties(result):
            self.user_properties.append((name, value))
        if result.outcome == "skipped":
            pytest.skip(result.message or "skipped")
        if result.extra.service_unavailable:
            # every later item would wait for it too: stop, and the artifact says partial
            self.session.shouldstop = f"stopped: {(result.message or '').splitlines()[0]}"
        if result.outcome != "passed":
            if result.case_failed or result.extra.service_unavailable:
                raise KernelFailure(result)
            raise CandidateFailure(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, KernelFailure):
            r = excinfo.value.result
            where = f" in phase '{r.phase}'" if r.phase and r.phase != r.stage else ""
            first, _, rest = (r.message or "").partition("\n")
            if r.extra.service_unavailable:  # nothing was graded: no stage failed
                return f"kcoral could not grade this item: {first}\ncandidate: {self.candidate.path}"
            # the first line is what pytest's short summary shows: make it the reason
            return f"kcoral {r.stage} failed{where}: {first}\n{rest}\ncandidate: {self.candidate.path}".replace("\n\n\n", "\n\n")
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.candidate.path, None, self.nodeid  # a failure's header: the id that selects the item


def _relative_to(path: Path, root: Path) -> str:
    """``path`` as a POSIX string, relative to ``root`` when it lies inside it."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def junit_properties(result: ItemResult) -> list[tuple[str, Any]]:
    """Per-item properties for the JUnit XML (they travel with the report under xdist)."""
    props: list[tuple[str, Any]] = [("kcoral_stage", result.stage)]
    for name in ("speedup", "t_baseline_us", "t_candidate_us", "timer", "device", "lease_wait_ms", "lease_held_ms"):
        value = getattr(result, name)
        if value is not None:
            props.append((f"kcoral_{name}", junit_figure(value) if isinstance(value, float) else value))
    if result.speedup is not None:
        props.append(("kcoral_host_set", host_set(result)))  # the summary's ~: the host sets part of it
    if result.speedup_ci:
        props.append(("kcoral_speedup_ci_low", junit_figure(result.speedup_ci[0])))
        props.append(("kcoral_speedup_ci_high", junit_figure(result.speedup_ci[1])))
    if result.noisy:
        props.append(("kcoral_noisy", result.noisy_reason or "noisy"))
    for key in ("candidate_tflops", "candidate_gbps", "candidate_of_peak"):
        value = (result.speed_of_light or {}).get(key)
        if value is not None:
            props.append((f"kcoral_{key}", junit_figure(value)))
    if result.baseline_correct is not None:
        props.append(("kcoral_baseline_correct", result.baseline_correct))
    if result.case_failed:
        props.append(("kcoral_case_failed", True))  # the case's failure, not the candidate's
    if result.suspicious:
        props.append(("kcoral_suspicious", "; ".join(result.suspicious)))
    diagnostics = result.extra.diagnostics or {}
    if "ncu" in diagnostics:
        ncu = diagnostics["ncu"]
        props.append(("kcoral_ncu_report", ncu["report"] or f"none: {ncu.get('error', '')[:200]}"))
    if "sanitizer" in diagnostics:
        check = diagnostics["sanitizer"]
        props.append(("kcoral_sanitizer", f"{check['tool']}: {check['errors']} error(s), log {check['log']}"))
    return props
