"""Collect step: a case's files. Its module imported as trusted code (``import_case_module``),
its helper modules importable by plain name while it runs, its bytecode kept private, and the
digests that show whether its files changed since collection.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.abc
import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any


class CaseError(Exception):
    """A malformed case: ``str()`` names the file and what is wrong."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class NamedFiles(importlib.abc.MetaPathFinder):
    """Top-level modules imported from files of other names or places: a GPU MODE problem's
    ``utils`` is its task.yml's ``../utils.py`` (``Case.helper_files``)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = {Path(name).stem: Path(path) for name, path in files.items()}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if path is None and fullname in self.files:
            return importlib.util.spec_from_file_location(fullname, self.files[fullname])
        return None


@contextlib.contextmanager
def helpers_importable(folder: Path | None, named_files: dict[str, Path] | None = None) -> Iterator[None]:
    """In the pytest process, which imports many cases in turn: the case's helpers import by plain
    name while its module runs (``named_files`` too, by their names), and leave ``sys.modules``
    afterwards, so that another case's helper of the same name (``task.py``, ``utils.py``) is its
    own. (A child serves one case and keeps them importable for its life: ``CaseRuntime``.)"""
    if folder is None:
        yield
        return
    entry = str(folder)
    before = set(sys.modules)
    sys.path.insert(0, entry)
    finder = NamedFiles(named_files) if named_files else None
    if finder is not None:
        sys.meta_path.insert(0, finder)
    places = [folder, *(Path(p).resolve() for p in (named_files or {}).values())]
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)
        if finder is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None)
            if origin and not name.startswith("_kcoral_") and any(Path(origin).resolve() == place or Path(origin).resolve().is_relative_to(place)
                                                                  for place in places):
                del sys.modules[name]


_private_pycache: str | None = None


@contextlib.contextmanager
def _private_bytecode() -> Iterator[None]:
    """Bytecode of what runs inside from a directory of this process's own (``sys.pycache_prefix``),
    never from a ``__pycache__`` beside the sources: a candidate can write into the case tree, and a
    .pyc it planted there (matching the source's size and time) would run in place of the source
    whose digest was checked. A child sets the prefix for its life (``child.main``)."""
    global _private_pycache
    if sys.pycache_prefix is not None:
        yield
        return
    if _private_pycache is None:
        _private_pycache = tempfile.mkdtemp(prefix="kcoral-pycache-")
        atexit.register(shutil.rmtree, _private_pycache, True)
    sys.pycache_prefix = _private_pycache
    try:
        yield
    finally:
        sys.pycache_prefix = None


def keep_private_bytecode_in(directory: Path) -> None:
    """Make ``directory`` this process's private bytecode directory (``_private_bytecode``), for a
    process that may be killed before its exit handlers run, inside a private directory its parent
    removes (``diagnostics_child``): the default one, made in the temp dir, would outlive it."""
    global _private_pycache
    directory.mkdir(mode=0o700, exist_ok=True)
    _private_pycache = str(directory)


def import_case_module(path: Path, name_hint: str = "case") -> ModuleType:
    """Import a trusted case module under a unique name (many cases share the file name)."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    mod_name = f"_kcoral_{name_hint}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise CaseError(path, "cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        with _private_bytecode():
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(mod_name, None)
        if exc.filename and Path(exc.filename).resolve() != path.resolve():
            # in a module the case imports (a helper beside it): name that file, not the case's line
            raise CaseError(path, f"importing it raised SyntaxError in {exc.filename} at line {exc.lineno}: {exc.msg}") from None
        raise CaseError(path, f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        raise CaseError(path, f"importing it raised {type(exc).__name__}: {exc}") from None
    except SystemExit as exc:  # would end the whole session (pytest's INTERNALERROR), not one case
        sys.modules.pop(mod_name, None)
        raise CaseError(path, f"importing it called sys.exit({exc.code!r})") from None
    return module


def identity(folder: Path, standalone_source: Path | None = None, helper_files: dict[str, Path] | None = None) -> dict[str, Any]:
    """``Case``'s ``content_hash`` (keys cached reference results) and ``file_digests``, from one
    read of the case's own files."""
    digests = file_digests(folder, standalone_source, helper_files)
    return {"content_hash": hash_of(digests), "file_digests": digests}


def hash_of(digests: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name, digest in digests.items():
        h.update(name.encode())
        h.update(digest)
    return h.hexdigest()[:16]


def file_digests(folder: Path, standalone_source: Path | None = None, helper_files: dict[str, Path] | None = None) -> dict[str, bytes]:
    """The case's own files, by name, sorted: the ``.py``, ``.json`` and ``.yml`` files beside
    ``case.py`` (only the file itself for a problem file among others, ``standalone_source``),
    and the files a GPU MODE problem imports from elsewhere (``helper_files``, named ``utils.py
    (../utils.py)``)."""
    if standalone_source is not None:
        return {standalone_source.name: hashlib.sha256(standalone_source.read_bytes()).digest()}
    digests = {path.name: hashlib.sha256(path.read_bytes()).digest()
               for path in sorted(folder.iterdir()) if path.is_file() and path.suffix in (".py", ".json", ".yml", ".yaml")}
    for name, path in sorted((helper_files or {}).items()):
        digests[f"{name} ({path})"] = hashlib.sha256(path.read_bytes()).digest()
    return digests
