"""The controller side of a session: gather every item's result, score them, and write the
terminal summary, the JSON artifact, the GitHub step summary and the comparison with a saved run.

The main plugin registers ``KcoralSession`` on the controller (or on a plain run). Results arrive
as ``report.kcoral_result`` dicts on test reports; pytest-xdist carries extra report attributes
from workers to the controller, so this class sees every item once, wherever it ran. On an xdist
worker it stays inert: the summary and artifacts are written once, on the controller.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from pytest_kcoral import confine, scoring
from pytest_kcoral.environment import collect_environment
from pytest_kcoral.options import Settings
from pytest_kcoral.report import compare as compare_mod
from pytest_kcoral.report import fmt_methods, html, json_artifact, junit_figure, step_summary, terminal
from pytest_kcoral.results import ItemResult
from pytest_kcoral.stash import session_key, settings_or_none

COLLECTION_ERROR_LINES = 20


def _shorten(text: str, limit: int = COLLECTION_ERROR_LINES) -> str:
    """The head and the tail of a long error: the file is named first, the error last."""
    lines = text.rstrip().splitlines()
    if len(lines) <= limit:
        return "\n".join(lines)
    head = 5
    return "\n".join(lines[:head] + ["..."] + lines[-(limit - head - 1):])


class KcoralSession:
    """Per-run state of the summary; others may append lease events to ``lease_history``."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.is_worker = hasattr(config, "workerinput")
        self.results: dict[str, ItemResult] = {}  # nodeid -> last result reported for it
        self.collection_errors: list[dict[str, Any]] = []
        self.lease_history: list[dict[str, Any]] = []
        self.interrupted = False
        self.scores: scoring.Scores | None = None
        self.compare_result: compare_mod.CompareResult | None = None
        self.partial = False
        self.json_written: str | None = None
        self.html_written: str | None = None
        self.report_problems: list[str] = []  # reports written elsewhere, or nowhere: why, and where
        self._saved_run: compare_mod.SavedRun | None = None
        self._compare_path = config.getoption("kcoral_compare", None)
        self._compare_threshold: float | None = None
        config.stash[session_key] = self
        if self.is_worker:
            return
        threshold = config.getoption("kcoral_compare_fail", None)
        if threshold is not None and not self._compare_path:
            raise pytest.UsageError("--kcoral-compare-fail needs --kcoral-compare OLD.json")
        if threshold is not None:
            try:
                self._compare_threshold = compare_mod.parse_threshold(threshold)
            except ValueError as exc:
                raise pytest.UsageError(str(exc)) from None
        if self._compare_path:
            # Read the saved run now: a wrong path should fail in a second, not after the suite.
            try:
                self._saved_run = compare_mod.load_saved_run(self._compare_path)
            except compare_mod.CompareError as exc:
                raise pytest.UsageError(str(exc)) from None

    @property
    def settings(self) -> Settings | None:
        return settings_or_none(self.config)

    def confinement(self) -> str:
        """What confines the children's writes (``confine.session_status``)."""
        settings = self.settings
        if settings is None:
            return "unknown"
        return confine.session_status(settings.confinement, remote=settings.url is not None)

    @property
    def items(self) -> list[ItemResult]:
        return [self.results[k] for k in sorted(self.results)]

    # -- gathering -----------------------------------------------------------------------------

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, "kcoral_result", None)
        if self.is_worker or not isinstance(data, dict):
            return
        result = ItemResult.from_dict(data)
        self.results[result.nodeid or report.nodeid] = result
        lease = result.extra.lease
        if lease:  # taken on whichever worker ran the item; audited here, on the controller
            self.lease_history.append(lease)

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if self.is_worker or not report.failed:
            return
        if any(e["nodeid"] == report.nodeid for e in self.collection_errors):
            return
        self.collection_errors.append({"nodeid": report.nodeid, "message": _shorten(report.longreprtext)})

    @pytest.hookimpl
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.interrupted = True

    # -- reporting -----------------------------------------------------------------------------

    def build_scores(self) -> scoring.Scores:
        self.scores = scoring.score(self.items)
        return self.scores

    # tryfirst: the suite figures must reach the JUnit writer before its own sessionfinish writes
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        if self.is_worker:
            return
        self.partial = bool(
            self.interrupted
            or exitstatus == pytest.ExitCode.INTERRUPTED
            or session.shouldstop
            or session.shouldfail
        )
        scores = self.build_scores()
        settings = self.settings
        wants_json = settings is not None and settings.json_path is not None
        wants_html = settings is not None and settings.html_path is not None
        # nvidia-smi runs behind it: only when the JSON, the HTML page or the comparison needs it
        environment = collect_environment() if wants_json or wants_html or self._saved_run is not None else None
        if environment is not None:
            environment["confinement"] = self.confinement()
        if self._saved_run is not None:
            self.compare_result = compare_mod.compare_runs(
                self._saved_run, scores.candidates, self._compare_threshold, self._compare_path,
                timed_by=compare_mod.pair_methods((i.case, i.candidate, i.split, i.timer, i.speedup) for i in self.items),
                gpus=compare_mod.gpu_models(environment))
        _add_junit_suite_properties(session.config, scores.suite, scores.timers, len(self.collection_errors), self.compare_result)
        if settings is not None and (wants_json or wants_html):
            doc = json_artifact.build_document(
                self.items, scores,
                settings=settings,
                environment=environment,
                partial=self.partial,
                collection_errors=self.collection_errors,
                lease_history=self.lease_history,
                compare=self.compare_result,
            )
            # the page is drawn from the document the JSON holds, so the two always agree
            writers = [(settings.json_path, json_artifact.write_atomically, "json_written"), (settings.html_path, html.write_html, "html_written")]
            for path, write, written in writers:
                if path is None:
                    continue
                place, problem = json_artifact.write_or_save_elsewhere(path, doc, write)
                setattr(self, written, str(place) if place is not None else None)
                if problem:
                    self.report_problems.append(problem)
                    # on a line of its own: the progress line may still be open on stdout
                    sys.stderr.write(f"\npytest-kcoral: {problem}\n")
                    if session.exitstatus == pytest.ExitCode.OK:  # not where it was asked for: CI must notice
                        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        summary_file = step_summary.step_summary_path()
        if summary_file:
            try:
                step_summary.append_step_summary(
                    summary_file,
                    step_summary.render_markdown(scores, partial=self.partial, compare=self.compare_result,
                                                 collection_errors=self.collection_errors))
            except OSError as exc:
                sys.stderr.write(f"\npytest-kcoral: cannot append to ${step_summary.ENV_VAR} {summary_file}: {exc}\n")
        if self.compare_result is not None and self.compare_result.gate_failed:
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if scores.known_answers.unexpected_passes and session.exitstatus == pytest.ExitCode.OK:
            # a known-wrong candidate that passed everything: the case cannot tell it apart (XPASS(strict))
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.is_worker:
            return
        scores = self.scores if self.scores is not None else self.build_scores()
        if not scores.candidates and not self.collection_errors:
            return
        settings = self.settings
        lines = terminal.summary_lines(
            scores,
            seed=settings.seed if settings is not None else None,
            seed_is_secret=settings.seed_is_secret if settings is not None else True,
            partial=self.partial,
            compare=self.compare_result,
            collection_errors=self.collection_errors,
            json_path=self.json_written,
            html_path=self.html_written,
            notes=confinement_notes(self.confinement()) + [f"REPORT NOT WHERE ASKED: {p}" for p in self.report_problems],
        )
        terminal.write_summary(terminalreporter, lines)


def confinement_notes(status: str) -> list[str]:
    """The summary's word on confinement: a line only when the children were not confined."""
    if confine.is_confined(status) or status.startswith("remote"):
        return []
    return [f"NOT CONFINED: children could write outside their own directories ({status}); see docs/security.md"]


def _add_junit_suite_properties(config: pytest.Config, suite: scoring.SuiteScore, timers: scoring.TimerUse,
                                collection_errors: int = 0, compare: compare_mod.CompareResult | None = None) -> None:
    """Suite-level figures as ``<testsuite>`` properties of ``--junitxml``, when it is on.

    pytest's public way (the ``record_testsuite_property`` fixture) runs before the items do, so
    the figures go straight to the JUnit writer that pytest keeps on the config.
    """
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None or (suite.pairs == 0 and not collection_errors):
        return
    figures: dict[str, Any] = {
        "kcoral_pairs": suite.pairs,
        "kcoral_compile_rate": suite.compile_rate,
        "kcoral_correctness_rate": suite.correctness_rate,
        "kcoral_mean_speedup": suite.mean_speedup,
        "kcoral_geomean_speedup": suite.geomean_speedup,
        "kcoral_mean_generalization_gap": suite.mean_generalization_gap,
        "kcoral_conditional_correctness": suite.conditional_correctness,
        # untimed (--kcoral-mode correctness): not measured, so absent rather than a 0.0 that reads as measured
        "kcoral_bench_lite_total": suite.bench_lite_total if suite.timed else None,
        **{f"kcoral_fast_{p}": v for p, v in suite.fast_p.items()},
        # how the items were timed, and how many fell back from CUPTI (the summary's TIMER FALLBACK)
        "kcoral_timed_by": fmt_methods(timers.methods) or None,
        "kcoral_timer_fallbacks": sum(timers.fallbacks.values()),
        # what the summary says beside the scores: cases never graded, and pairs slower than the saved run
        "kcoral_collection_errors": collection_errors,
        "kcoral_compare_regressions": len(compare.regressions) if compare is not None else None,
    }
    for name, value in figures.items():
        if value is not None:
            xml.add_global_property(name, junit_figure(value) if isinstance(value, float) else value)
