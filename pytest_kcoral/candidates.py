"""Collect step, part two: find the candidates of a case.

Candidates are files only: this module never imports or executes them (they are untrusted and run
in child processes). Sources: ``<case>/candidates/*.py`` (and its ``correct/`` and ``wrong/``
folders), the ``v*.py``-style siblings of a KCoral ``bench.py``, a GPU MODE problem's
``submission.py`` and ``solutions/**/*.py``, and ``--kcoral-submissions DIR`` laid out as
``DIR/<team>/<case>.py`` or ``DIR/<team>/<case>/<attempt>.py``, or as KernelBench's run files
``level_<L>_problem_<id>_sample_<k>_kernel.py`` (in ``DIR``, whose name is then the team, or in
``DIR/<team>/``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pytest_kcoral.cases import GPUMODE, KCORAL_BENCH, KERNELBENCH, Case, CaseError, is_case_folder, is_gpumode_folder

# Files beside bench.py that belong to the case, not to its candidates.
_BENCH_CASE_FILES = {"bench.py", "baseline.py", "conftest.py", "__init__.py"}
# KernelBench's generated kernels: level, problem id and sample number
KERNELBENCH_RUN_FILE = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
# Known answers: a candidate in a folder of this name is expected to fail, or to pass
EXPECTED_BY_FOLDER = {"wrong": "fail", "correct": "pass"}
GPUMODE_SOLUTIONS = "solutions"
GPUMODE_SUBMISSION_FILE = "submission.py"
CANDIDATES_FOLDER = "candidates"  # a native case's candidates


@dataclass(frozen=True)
class Candidate:
    name: str  # unique within the case; part of the item id
    path: Path
    team: str | None = None
    attempt: str | None = None
    # a known answer (``wrong/``: "fail", ``correct/``: "pass"), or None
    expected: str | None = None


def find_candidates(case: Case, submission_dirs: tuple[Path, ...] = ()) -> list[Candidate]:
    """All candidates of ``case`` in a deterministic order: bundled first, then submissions.

    Raises ``CaseError`` when two files would get one name (a bundled ``teamB.py`` and a team
    ``teamB``'s submission, or one team in two ``--kcoral-submissions`` folders): their items would
    share ids, and one file's results would silently replace the other's."""
    found = _bundled(case)
    for root in submission_dirs:
        found.extend(_submitted(case, root))
    files: dict[str, list[Path]] = {}
    for candidate in found:
        files.setdefault(candidate.name, []).append(candidate.path)
    clashes = [f"'{name}' ({', '.join(map(_shown, paths))})" for name, paths in files.items() if len(paths) > 1]
    if clashes:
        raise CaseError(case.folder, f"two or more candidate files get one name: {'; '.join(clashes)}; their items would share"
                        " ids and one file's results would replace the other's: rename a file or a team folder")
    return found


def _shown(path: Path) -> str:
    """A path as a user finds it: relative to the working directory when it lies below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _py_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == ".py" and not p.name.startswith("_"))


def bundled_folder(case: Case) -> Path:
    """Where a case keeps its own candidates: ``candidates/``, beside a KCoral ``bench.py``, or a
    GPU MODE problem's ``solutions/`` (its ``submission.py`` lies beside it)."""
    if case.format == KCORAL_BENCH:
        return case.folder
    return case.folder / (GPUMODE_SOLUTIONS if case.format == GPUMODE else CANDIDATES_FOLDER)


def bundled_candidate_at(path: Path) -> tuple[Path, str] | None:
    """``(case folder, candidate name)`` when ``path`` is a bundled candidate's file (found the
    way ``_bundled`` finds them), so ``pytest cases/add/candidates/mine.py`` selects its items."""
    if path.suffix != ".py" or path.name.startswith("_") or not path.is_file():
        return None
    folder = path.parent
    if folder.name == CANDIDATES_FOLDER and is_case_folder(folder.parent):
        return folder.parent, path.stem
    if folder.name in EXPECTED_BY_FOLDER and folder.parent.name == CANDIDATES_FOLDER and is_case_folder(folder.parent.parent):
        return folder.parent.parent, f"{folder.name}/{path.stem}"
    if (folder / "bench.json").is_file() and (folder / "bench.py").is_file() and path.name not in _BENCH_CASE_FILES:
        return folder, path.stem
    if path.name == GPUMODE_SUBMISSION_FILE and is_gpumode_folder(folder) and not (folder / "case.py").is_file():
        return folder, path.stem
    for above in path.parents:
        if above.name == GPUMODE_SOLUTIONS and is_gpumode_folder(above.parent) and not (above.parent / "case.py").is_file():
            return above.parent, path.relative_to(above).with_suffix("").as_posix()
    return None


def _expected(folders: tuple[str, ...]) -> str | None:
    """A known answer from the folders a candidate lies in (``wrong/``, ``correct/``)."""
    found = {EXPECTED_BY_FOLDER[f] for f in folders if f in EXPECTED_BY_FOLDER}
    return found.pop() if len(found) == 1 else None


def _bundled(case: Case) -> list[Candidate]:
    if case.standalone:  # a KernelBench problem file among others: its candidates are submissions
        return []
    if case.format == GPUMODE:
        found = []
        submission = case.folder / GPUMODE_SUBMISSION_FILE
        if submission.is_file():
            found.append(Candidate(submission.stem, submission))
        solutions = bundled_folder(case)
        if solutions.is_dir():
            for path in sorted(solutions.rglob("*.py")):
                rel = path.relative_to(solutions)
                if any(part.startswith(("_", ".")) for part in rel.parts):
                    continue
                found.append(Candidate(rel.with_suffix("").as_posix(), path, expected=_expected(rel.parts[:-1])))
        return found
    files = _py_files(bundled_folder(case))
    if case.format == KCORAL_BENCH:
        return [Candidate(p.stem, p) for p in files if p.name not in _BENCH_CASE_FILES]
    found = [Candidate(p.stem, p) for p in files]
    for folder, expected in EXPECTED_BY_FOLDER.items():
        found += [Candidate(f"{folder}/{p.stem}", p, expected=expected) for p in _py_files(bundled_folder(case) / folder)]
    return found


def submission_files(root: Path) -> list[Path]:
    """Every file under ``root`` that the layout makes a submission for some case: the files
    ``_submitted`` picks from, for whichever case they name."""
    if not root.is_dir():
        return []
    found = [p for p in _py_files(root) if KERNELBENCH_RUN_FILE.match(p.name)]
    for team_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found += _py_files(team_dir)
        for case_dir in sorted(p for p in team_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            found += _py_files(case_dir)
    return found


def _submitted(case: Case, root: Path) -> list[Candidate]:
    if not root.is_dir():
        return []
    found = _run_files(case, root, root.name)
    for team_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        single = team_dir / f"{case.name}.py"
        if single.is_file():
            found.append(Candidate(team_dir.name, single, team=team_dir.name))
        for attempt in _py_files(team_dir / case.name):
            found.append(Candidate(f"{team_dir.name}/{attempt.stem}", attempt, team=team_dir.name, attempt=attempt.stem))
        found += _run_files(case, team_dir, team_dir.name)
    return found


def _run_files(case: Case, folder: Path, team: str) -> list[Candidate]:
    """KernelBench's generated kernels for this problem in ``folder``, one attempt per sample, in
    sample order: ``level_<L>_problem_<id>_sample_<k>_kernel.py`` whose level and id are the
    problem's (``Case.level``, from its level folder's name, and ``Case.problem_id``)."""
    if case.format != KERNELBENCH or case.level is None or case.problem_id is None:
        return []
    samples = []
    for path in _py_files(folder):
        found = KERNELBENCH_RUN_FILE.match(path.name)
        if found and (int(found[1]), int(found[2])) == (case.level, case.problem_id):
            samples.append((int(found[3]), path))
    return [Candidate(f"{team}/sample_{k}", path, team=team, attempt=f"sample_{k}") for k, path in sorted(samples)]
