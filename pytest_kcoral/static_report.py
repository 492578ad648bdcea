"""A static report on a candidate's source: constructs that graders have seen used for gaming.

Information, not a verdict: the list lands in the item's ``suspicious`` field and the JUnit
property ``kcoral_suspicious``, and never fails an item by itself (honest kernels use streams and
ctypes too). The source is parsed with ``ast`` in the pytest process; it is never executed there.
"""

from __future__ import annotations

import ast
from pathlib import Path

# module imported -> why it is worth a look
_MODULES = {
    "threading": "threads (work left running after return)",
    "_thread": "low-level threads (not seen by the thread audit)",
    "concurrent": "thread or process pools",
    "multiprocessing": "processes or the harness's result channel",
    "subprocess": "child processes",
    "ctypes": "ctypes (raw memory, libc, the CUDA driver)",
    "gc": "gc (reading objects the harness holds)",
    "inspect": "inspect (reading the harness's frames)",
    "socket": "sockets",
    "signal": "signal handlers",
    "pytest_kcoral": "the harness itself",
    "unittest.mock": "monkeypatching",
    "importlib": "import machinery",
}

# attribute or name used -> why
_ATTRIBUTES = {
    "Stream": "CUDA streams (work on another stream)",
    "stream": "CUDA streams (work on another stream)",
    "Event": "CUDA events (timers)",
    "synchronize": "synchronization calls",
    "perf_counter": "the clock the timers use",
    "_getframe": "frame inspection",
    "f_back": "frame inspection",
    "f_locals": "frame inspection",
    "f_globals": "frame inspection",
    "get_objects": "gc.get_objects (reading harness memory)",
    "get_referrers": "gc.get_referrers (reading harness memory)",
    "manual_seed": "seeding the RNG (predicting inputs)",
    "get_rng_state": "reading the RNG state (predicting inputs)",
    "initial_seed": "reading the RNG seed (predicting inputs)",
    "data_ptr": "pointers (caching by address)",
    "fork": "forking processes",
    "setsid": "detaching processes",
    "_exit": "exiting early",
    "exit": "exiting early",
    "environ": "the environment (secrets, seeds)",
    "persisting_l2_cache_size": "persisting L2",
    "accessPolicyWindow": "persisting L2",
    "pin_memory": "pinned host memory (host compute a kernel can read without a copy)",
    "cudaHostAlloc": "pinned host memory (host compute a kernel can read without a copy)",
    "cudaHostRegister": "pinned host memory (host compute a kernel can read without a copy)",
    "reference": "calls into the reference",
    "baseline": "calls into the baseline",
}

_BUILTINS = {
    "setattr": "monkeypatching (setattr)",
    "exec": "exec of generated code",
    "eval": "eval of generated code",
    "open": "file access",
    "__import__": "dynamic imports",
    "globals": "rewriting module globals",
}


def scan_source(source: str, filename: str = "<candidate>") -> list[str]:
    """One line per suspicious construct: ``line N: <construct>: <why>``, first occurrence of each."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        return [f"line {exc.lineno}: does not parse ({exc.msg})"]
    found: dict[str, tuple[int, str]] = {}

    def note(node: ast.AST, construct: str, why: str) -> None:
        line = getattr(node, "lineno", 0)
        found.setdefault(construct, (line, f"line {line}: {construct}: {why}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _note_module(node, alias.name, note)
        elif isinstance(node, ast.ImportFrom) and node.module:
            _note_module(node, node.module, note)
            for alias in node.names:
                if alias.name in _ATTRIBUTES:
                    note(node, alias.name, _ATTRIBUTES[alias.name])
        elif isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTES:
            note(node, f".{node.attr}", _ATTRIBUTES[node.attr])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BUILTINS:
            note(node, f"{node.func.id}()", _BUILTINS[node.func.id])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("reference", "baseline"):
            note(node, f"{node.func.id}()", _ATTRIBUTES[node.func.id])
        elif isinstance(node, ast.Assign):
            # assigning to an attribute of an imported module is monkeypatching (torch.x = ...)
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, (ast.Name, ast.Attribute)):
                    root: ast.expr = target.value
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    if isinstance(root, ast.Name) and root.id in ("torch", "time", "triton", "os", "sys", "pytest_kcoral", "gc", "builtins"):
                        note(node, f"{ast.unparse(target)} = ...", "monkeypatching a module")
    return [text for _, text in sorted(found.values())]


def _note_module(node: ast.AST, name: str, note) -> None:  # type: ignore[no-untyped-def]
    for module, why in _MODULES.items():
        if name == module or name.startswith(module + "."):
            note(node, f"import {name}", why)
            return


def scan_file(path: Path) -> list[str]:
    try:
        return scan_source(Path(path).read_text(errors="replace"), str(path))
    except OSError as exc:
        return [f"unreadable: {exc}"]
