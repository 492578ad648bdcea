"""``--kcoral-json PATH``: the session as one versioned JSON document (docs/json-schema.md).

Written atomically (temporary file in the same directory, fsync, ``os.replace``) so a reader, or
a ``--kcoral-compare`` of a later run, never sees half a file, even when the session is
interrupted.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_kcoral.options import Settings
from pytest_kcoral.report.compare import CompareResult
from pytest_kcoral.results import ItemResult
from pytest_kcoral.scoring import Scores, host_set

SCHEMA = "pytest-kcoral/1"


def _jsonable(value: Any) -> Any:
    """Paths to strings, tuples to lists, non-finite floats to None (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def settings_config(settings: Settings | None) -> dict[str, Any]:
    """The options of the session; the seed is left out here and recorded at the top level."""
    if settings is None:
        return {}
    config = dataclasses.asdict(settings)
    config.pop("seed", None)
    config.pop("seed_is_secret", None)
    jsonable: dict[str, Any] = _jsonable(config)
    return jsonable


def build_document(
    items: Sequence[ItemResult],
    scores: Scores,
    *,
    settings: Settings | None = None,
    environment: dict[str, Any] | None = None,
    partial: bool = False,
    collection_errors: Sequence[dict[str, Any]] = (),
    lease_history: Sequence[dict[str, Any]] = (),
    compare: CompareResult | None = None,
    created: datetime.datetime | None = None,
) -> dict[str, Any]:
    created = created or datetime.datetime.now(datetime.timezone.utc)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "partial": bool(partial),
        "created": created.isoformat(timespec="seconds"),
        "config": settings_config(settings),
        "environment": environment or {},
        "seed": settings.seed if settings is not None else None,
        "seed_is_secret": settings.seed_is_secret if settings is not None else None,
        "items": [_item_dict(it) for it in sorted(items, key=lambda it: it.nodeid)],
        "candidates": [c.to_dict() for c in scores.candidates],
        "cases": [c.to_dict() for c in scores.cases],
        "suite": scores.suite.to_dict(),
        "leaderboard": [e.to_dict() for e in scores.leaderboard],
        "weak_cases": [w.to_dict() for w in scores.weak_cases],
        "failed_cases": [f.to_dict() for f in scores.failed_cases],
        "skipped_candidates": [c.to_dict() for c in scores.skipped_candidates],
        "known_answers": scores.known_answers.to_dict(),
        "timers": scores.timers.to_dict(),
        "collection_errors": list(collection_errors),
        "lease_history": list(lease_history),
        "compare": compare.to_dict() if compare is not None else None,
    }
    if not scores.suite.timed:
        _drop_speed_scores(doc)
    jsonable: dict[str, Any] = _jsonable(doc)
    return jsonable


def _drop_speed_scores(doc: dict[str, Any]) -> None:
    """bench-lite is earned by speed alone: a session that timed nothing has none (null, as its
    ``fast_p``), where 0 would read as measured and lost."""
    doc["suite"]["bench_lite_total"] = None
    for c in doc["candidates"]:
        c["bench_lite"] = c["bench_lite_weighted"] = None
    for e in doc["leaderboard"]:
        e["bench_lite_total"] = None


def _item_dict(item: ItemResult) -> dict[str, Any]:
    d = item.to_dict()
    if item.speedup is not None:
        d["host_set"] = host_set(item)  # derived, for readers: the summary's ~ mark
    return d


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` to ``path`` so that the path holds either the old file or the whole new one."""
    return write_text_atomically(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")


def write_text_atomically(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` so that the path holds either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; give it a plain file's mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable; not every filesystem lets a directory be opened
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return path


SAVED_INFIX = ".kcoral-saved"  # ``out.json`` that cannot be written is saved as ``out.json.kcoral-saved.json``


def write_or_save_elsewhere(path: str | Path, doc: dict[str, Any],
                            write: Callable[[Path, dict[str, Any]], Path] | None = None) -> tuple[Path | None, str | None]:
    """Write a report to ``path`` with ``write`` (default ``write_atomically``); where that fails
    (the path turned into a directory during the session: a candidate of the same user can do
    that), save it beside the path as ``<path>.kcoral-saved<suffix>``, else in a new file of the
    temp dir. Returns where the report went (None: nowhere) and, when that is not ``path``, why,
    in words naming both."""
    write = write or write_atomically
    path = Path(path)
    try:
        return write(path, doc), None
    except OSError as exc:
        problem = f"cannot write {path}: {exc.strerror or exc}" + (" (it is a directory now)" if path.is_dir() else "")
    suffix = SAVED_INFIX + path.suffix
    for place in (path.with_name(path.name + suffix), None):
        try:
            if place is None:  # the folder itself is unusable: a fresh name in the temp dir
                fd, name = tempfile.mkstemp(prefix=f"{path.stem}.", suffix=suffix)
                os.close(fd)
                place = Path(name)
            return write(place, doc), f"{problem}; the report was saved to {place} instead"
        except OSError:
            continue
    return None, f"{problem}; the report could not be saved anywhere else either"
