"""The pytest entry point (``-p kcoral``): options, configuration and the hooks that wire the
pipeline together. The work itself lives in the modules named after each step:
collect (``cases``, ``candidates``, ``items``) -> run (``pipeline``: ``isolation``, ``lease``,
``timing``, ``compare``) -> score (``scoring``) -> report (``report/``)."""

from __future__ import annotations

import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytest_kcoral import confine, lease_plugin, options, scheduling
from pytest_kcoral.candidates import CANDIDATES_FOLDER, bundled_candidate_at, submission_files
from pytest_kcoral.cases import KERNELBENCH_NAMES, KERNELBENCH_PROBLEM_FILE, case_folder_for, is_case_folder, kernelbench_names_missing
from pytest_kcoral.diagnostics import DiagnosticsUnavailable, find_tool
from pytest_kcoral.executors import close_executor, get_executor
from pytest_kcoral.items import CaseDirectory, KernelBenchProblem, KernelItem
from pytest_kcoral.kcoral_programs import RemoteUnavailable, connect
from pytest_kcoral.lease_plugin import get_devices
from pytest_kcoral.options import Settings
from pytest_kcoral.sandbox import SandboxUnavailable, find_bwrap
from pytest_kcoral.session import KcoralSession
from pytest_kcoral.stash import get_settings, result_key, selection_key, settings_key, settings_or_none, submissions_matched_key

MARKERS = [
    "kcoral: a graded kernel item (pytest-kcoral)",
    "seen: an item on a shape visible during development",
    "unseen: an item on a held-out shape (generalization check)",
    *(f"tier{t}: an item of a tier-{t} case" for t in range(1, 6)),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    # xdist workers must generate the same inputs as each other: the controller draws the seed.
    seed = workerinput.get("kcoral_seed") if workerinput else None
    settings = Settings.from_config(config, seed=seed)
    if (settings.ncu or settings.sanitizer) and not config.option.collectonly:
        _check_diagnostics(config, settings)
    if settings.timer in ("cupti", "events") and not settings.url and not config.option.collectonly:
        if not any(d.is_cuda for d in get_devices(config)):  # else every item would fail as its case's fault
            raise pytest.UsageError(f"--kcoral-timer {settings.timer} times CUDA devices, and none is visible here; "
                                    "a CPU is timed by the wall clock (--kcoral-timer wall or auto)")
    if settings.url and not config.option.collectonly:
        try:  # a server that cannot be reached stops the session here, naming the URL
            connect(settings.url)[0].close()
        except RemoteUnavailable as exc:
            raise pytest.UsageError(str(exc)) from None
    if settings.sandbox:
        try:
            find_bwrap()  # a missing or broken bwrap stops the session here, never a silent fallback
        except SandboxUnavailable as exc:
            raise pytest.UsageError(str(exc)) from None
    if settings.confinement == "landlock" and not settings.url:
        status = confine.session_status(settings.confinement)
        if not confine.is_confined(status):  # asked for, so never a silent fallback
            raise pytest.UsageError(f"--kcoral-confinement landlock: children cannot be confined here ({status})")
    config.stash[settings_key] = settings
    _stop_on_sigterm_as_on_ctrl_c(config)
    for plugin in (lease_plugin, scheduling):
        # registered as imported: import_plugin would warn that an imported module cannot be rewritten
        if not config.pluginmanager.is_registered(plugin) and config.pluginmanager.get_plugin(plugin.__name__) is None:
            config.pluginmanager.register(plugin, plugin.__name__)
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    # scores and reports: written once, by the controller (the session object idles on workers)
    config.pluginmanager.register(KcoralSession(config), "kcoral-session")


def _check_diagnostics(config: pytest.Config, settings: Settings) -> None:
    """--kcoral-ncu and --kcoral-sanitizer need their tool and a GPU here: say so before grading."""
    asked = " and ".join(o for o, on in (("--kcoral-ncu", settings.ncu), ("--kcoral-sanitizer", settings.sanitizer)) if on)
    if settings.url:
        raise pytest.UsageError(f"{asked} runs the tools on this machine's GPUs: not with --kcoral-url")
    for wanted, tool in ((settings.ncu, "ncu"), (settings.sanitizer, "compute-sanitizer")):
        if wanted:
            try:
                find_tool(tool)
            except DiagnosticsUnavailable as exc:
                raise pytest.UsageError(f"{asked}: {exc}") from None
    if not any(d.is_cuda for d in get_devices(config)):
        raise pytest.UsageError(f"{asked} needs a GPU, and none is visible")


def _stop_on_sigterm_as_on_ctrl_c(config: pytest.Config) -> None:
    """SIGTERM (a cancelled CI job, ``timeout``, ``kill``) ends the session as Ctrl-C does: the
    children are stopped, and the JSON artifact and the reports are written, marked partial.
    By default SIGTERM ends Python at once, with no cleanup and no artifact. A handler someone
    else installed is left alone, and so is a session run off the main thread."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)
    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    config.add_cleanup(restore)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist controller: hand the session seed on
    node.workerinput["kcoral_seed"] = get_settings(node.config).seed


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """Let ``pytest cases/add::triton[seen-n=4096]`` select items by the ids this plugin prints,
    and ``pytest cases/add/candidates/triton.py`` a candidate's items.

    pytest refuses ``::`` after a directory, and a case is a directory (a candidate's file is
    never collected by pytest itself: it is untrusted): the argument becomes the case folder, and
    the selection is applied when the items are collected.
    """
    # the paths given, in order; never an option's value (``--deselect cases/add::x[...]`` must
    # stay whole, or it deselects the whole case)
    positional = list(getattr(early_config.known_args_namespace, "file_or_dir", None) or [])
    selected = []
    for i, arg in enumerate(args):
        if not positional:
            break
        if arg != positional[0]:
            continue
        positional.pop(0)
        path, sep, rest = arg.partition("::")
        folder = case_folder_for(Path(path))
        if folder is not None and Path(path) != folder:
            args[i] = arg = str(folder) + (sep + rest if sep else "")  # the case's file: its folder
            path = str(folder)
        if sep and rest and folder is not None:
            args[i] = path
            selected.append((str(Path(path).resolve()), rest, arg))
        elif not sep and (candidate := bundled_candidate_at(Path(arg))) is not None:
            # a candidate's file: its items, as a test file selects its tests
            folder, name = candidate
            args[i] = str(folder)
            selected.append((str(folder.resolve()), name, arg))
    if selected:
        early_config.stash[selection_key] = selected


@pytest.hookimpl(tryfirst=True)  # before -k, -m and --lf deselect: an id they drop was still found
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = config.stash.get(selection_key, None)
    if not selected:
        return
    matched: set[str] = set()  # the arguments that selected something

    def wanted(item: pytest.Item) -> bool:
        if not isinstance(item, KernelItem):
            return True
        folder = str(item.case.folder.resolve())
        names = [(rest, arg) for case, rest, arg in selected if case == folder]
        # a case folder given without a selection keeps all its items; "case::candidate" selects
        # all of the candidate's items, "case::candidate[split-shape]" one item
        hits = [arg for rest, arg in names if item.name == rest or item.name.startswith(rest + "[")]
        matched.update(hits)
        return not names or bool(hits)

    keep = [item for item in items if wanted(item)]
    # as pytest answers a node id that names nothing: a typo must not shrink the run in silence
    # (a case that did not collect at all has said why: its collection error)
    collected = {str(item.case.folder.resolve()) for item in items if isinstance(item, KernelItem)}
    missing = [f"not found: {arg} (no item of that case has this id; --co -q lists them)"
               for case, _, arg in selected if arg not in matched and case in collected]
    if missing:
        workerinput = getattr(config, "workerinput", None)
        if workerinput is None:
            raise pytest.UsageError(*missing)
        if workerinput.get("workerid") == "gw0":  # a usage error on a worker is an INTERNALERROR: warn, once
            for line in missing:
                warnings.warn(pytest.PytestWarning(line), stacklevel=1)
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if not wanted(item)])
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """Say which submission files no collected case took: a misnamed one is otherwise graded
    nowhere, and its team is missing from the leaderboard without a word. And which ones several
    cases took: a submission is matched by its case folder's name alone, so ``cases/a/add`` and
    ``cases/b/add`` both grade ``<team>/add.py``, which nobody would guess from the results."""
    config = session.config
    settings = get_settings(config)
    workerinput = getattr(config, "workerinput", None)
    if not settings.submissions or (workerinput is not None and workerinput.get("workerid") != "gw0"):
        return  # under xdist every worker collects the same: one of them says it
    matched = config.stash.get(submissions_matched_key, {})
    for root in settings.submissions:
        files = submission_files(root)
        unmatched = [p.relative_to(root).as_posix() for p in files if p not in matched]
        if unmatched:
            # a case that failed to collect takes no files: its own error says why, and this one must not mislead
            failed = f"; {session.testsfailed} case(s) failed to collect (the errors above), whose files would be among these" \
                if session.testsfailed else ""
            warnings.warn_explicit(pytest.PytestWarning(
                f"--kcoral-submissions {root}: {len(unmatched)} file(s) match no collected case and are not graded: {_a_few(unmatched)}"
                " (a submission is <team>/<case>.py or <team>/<case>/<attempt>.py, <case> being a case folder's name; or KernelBench's"
                f" level_<L>_problem_<id>_sample_<k>_kernel.py, matched to the problem file <id>_<Name>.py in a folder named level<L>){failed}"),
                None, filename=str(root), lineno=1)
        shared: dict[tuple[str, ...], list[str]] = {}  # the cases that took the same files -> those files
        for p in files:
            if len(matched.get(p, ())) > 1:
                shared.setdefault(tuple(sorted(matched[p])), []).append(p.relative_to(root).as_posix())
        for cases, taken in shared.items():
            warnings.warn_explicit(pytest.PytestWarning(
                f"--kcoral-submissions {root}: the case folders {', '.join(cases)} share the name '{Path(cases[0]).name}',"
                f" and a submission is matched by that name alone: each of them grades the same {len(taken)} file(s),"
                f" {_a_few(taken)}; rename a case folder (and its submissions) to grade them apart"), None, filename=str(root), lineno=1)


def _a_few(paths: list[str]) -> str:
    return ", ".join(paths[:8]) + (f", ... ({len(paths) - 8} more)" if len(paths) > 8 else "")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Never let pytest's own collection walk a submissions folder: it would import a team's
    ``test_*.py`` and ``conftest.py`` into the pytest process, and candidates are untrusted code
    that only ever runs in children (``candidates.py`` finds them)."""
    settings = settings_or_none(config)
    if settings is None or not settings.submissions:
        return None
    resolved = collection_path.resolve()
    return True if any(resolved == root or root in resolved.parents for root in settings.submissions) else None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """A KernelBench problem file (``level1/19_ReLU.py``) is a case of its own, found in a walk
    of its folder or given on the command line."""
    if file_path.suffix != ".py" or not KERNELBENCH_PROBLEM_FILE.match(file_path.name):
        return None
    missing = kernelbench_names_missing(file_path)
    if missing == []:
        _start_children_early(parent.config)
        return KernelBenchProblem.from_parent(parent, path=file_path)
    if missing:  # a problem file in all but a name: graded nowhere, without a word, were it not said
        warnings.warn_explicit(pytest.PytestWarning(f"{file_path.name}: not graded as a KernelBench problem: it does not define"
                                                    f" {' or '.join(missing)} (a problem defines {', '.join(KERNELBENCH_NAMES)})"),
                               None, filename=str(file_path), lineno=1)
    return None


def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if is_case_folder(path):
        _start_children_early(parent.config)
        return CaseDirectory.from_parent(parent, path=path)
    if (path / CANDIDATES_FOLDER).is_dir():  # a case's candidates with no case beside them: said, not skipped
        warnings.warn_explicit(pytest.PytestWarning(f"{path.name}: has a {CANDIDATES_FOLDER}/ folder but no case.py (nor bench.json,"
                                                    " nor task.yml with reference.py): not graded"), None, filename=str(path), lineno=1)
    return None


def _start_children_early(config: pytest.Config) -> None:
    """A case will be graded here: start the template children are forked from now, so its
    imports run while the rest is collected (on an xdist worker: that worker's template)."""
    if config.option.collectonly or get_settings(config).url:
        return
    get_executor(config).start_template()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if isinstance(item, KernelItem) and report.skipped and type(report.longrepr) is tuple:
        # as pytest does for a skip mark: where the reason lies (the case), not the line of the
        # plugin that raised the skip (-rs read "SKIPPED [6] .../pytest_kcoral/items.py:83: ...")
        report.longrepr = (str(item.case.source), 1, report.longrepr[2])
    if call.when == "call":
        result = item.stash.get(result_key, None)
        if result is not None:
            # a plain attribute of the report: pytest-xdist carries it to the controller
            report.kcoral_result = result.to_dict()
            if getattr(report, "wasxfail", None) and result.outcome == "failed":  # a known-wrong candidate: say how it failed
                report.wasxfail += f"; {result.stage} failed: {(result.message or '').splitlines()[0][:200]}"
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    close_executor(session.config)
