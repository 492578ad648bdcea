"""Collect step, part two: find the candidates of a case.

Candidates are files only: this module never imports or executes them (they are untrusted and run
in child processes). Sources: ``<case>/candidates/*.py``, the ``v*.py``-style siblings of a KCoral
``bench.py``, and ``--kcoral-submissions DIR`` laid out as ``DIR/<team>/<case>.py`` or
``DIR/<team>/<case>/<attempt>.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_kcoral.cases import KCORAL_BENCH, Case, CaseError, is_case_folder

# Files beside bench.py that belong to the case, not to its candidates.
_BENCH_CASE_FILES = {"bench.py", "baseline.py", "conftest.py", "__init__.py"}


@dataclass(frozen=True)
class Candidate:
    name: str  # unique within the case; part of the item id
    path: Path
    team: str | None = None
    attempt: str | None = None


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
    """Where a case keeps its own candidates: ``candidates/``, or beside a KCoral ``bench.py``."""
    return case.folder if case.format == KCORAL_BENCH else case.folder / "candidates"


def bundled_candidate_at(path: Path) -> tuple[Path, str] | None:
    """``(case folder, candidate name)`` when ``path`` is a bundled candidate's file (found the
    way ``_bundled`` finds them), so ``pytest cases/add/candidates/mine.py`` selects its items."""
    if path.suffix != ".py" or path.name.startswith("_") or not path.is_file():
        return None
    folder = path.parent
    if folder.name == "candidates" and is_case_folder(folder.parent):
        return folder.parent, path.stem
    if (folder / "bench.json").is_file() and (folder / "bench.py").is_file() and path.name not in _BENCH_CASE_FILES:
        return folder, path.stem
    return None


def _bundled(case: Case) -> list[Candidate]:
    files = _py_files(bundled_folder(case))
    if case.format == KCORAL_BENCH:
        files = [p for p in files if p.name not in _BENCH_CASE_FILES]
    return [Candidate(p.stem, p) for p in files]


def submission_files(root: Path) -> list[Path]:
    """Every file under ``root`` that the layout makes a submission for some case: the files
    ``_submitted`` picks from, for whichever case they name."""
    if not root.is_dir():
        return []
    found = []
    for team_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found += _py_files(team_dir)
        for case_dir in sorted(p for p in team_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            found += _py_files(case_dir)
    return found


def _submitted(case: Case, root: Path) -> list[Candidate]:
    if not root.is_dir():
        return []
    found = []
    for team_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        single = team_dir / f"{case.name}.py"
        if single.is_file():
            found.append(Candidate(team_dir.name, single, team=team_dir.name))
        for attempt in _py_files(team_dir / case.name):
            found.append(Candidate(f"{team_dir.name}/{attempt.stem}", attempt, team=team_dir.name, attempt=attempt.stem))
    return found
