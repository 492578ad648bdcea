"""The package's layout: no import cycle among its modules, and a start-up without torch.

The import graph is read from the source with ``ast``, so it counts what a run may never reach:
imports inside functions, and the packages a module import runs first (``a.b.c`` runs ``a.b``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest_kcoral

PACKAGE_DIR = Path(pytest_kcoral.__file__).resolve().parent
PACKAGE = PACKAGE_DIR.name


def package_modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package (``__init__`` as its package)."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _owning_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package: ``pkg.a.f`` -> ``pkg.a``."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source (functions included).

    ``from pkg import a`` imports the module ``pkg.a`` when there is one, else the package; every
    import also runs the packages above its target, except those above the importer itself,
    which Python has run before the importer started."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_owning_module(alias.name, modules) or "" for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    targets.add(_owning_module(f"{source}.{alias.name}", modules) or "")
        targets.discard("")
        for target in list(targets):
            targets.update(_ancestors(target))
        graph[name] = {t for t in targets if t in modules and t != name and t not in _ancestors(name)}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(package_modules())
    assert len(graph) > 40, "the graph covers the whole package"
    assert f"{PACKAGE}.stash" in graph[f"{PACKAGE}.plugin"], "imports at the top are read"
    assert f"{PACKAGE}.timing" in graph[f"{PACKAGE}"], "imports inside functions are read (pytest_kcoral.benchmark)"
    cycles = import_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from pkg import b\n")
    (root / "b.py").write_text("def f():\n    from pkg.sub import c\n")
    (root / "sub" / "__init__.py").write_text("from pkg.sub.c import x\n")
    (root / "sub" / "c.py").write_text("import pkg.a\nx = 1\n")
    (root / "d.py").write_text("from . import a\n")
    modules = {name.replace("/", "."): path for name, path in
               (("pkg", root / "__init__.py"), ("pkg/a", root / "a.py"), ("pkg/b", root / "b.py"),
                ("pkg/sub", root / "sub" / "__init__.py"), ("pkg/sub/c", root / "sub" / "c.py"), ("pkg/d", root / "d.py"))}
    graph = import_graph(modules)
    assert graph["pkg.b"] == {"pkg.sub", "pkg.sub.c"}  # the package runs before its module
    assert graph["pkg.sub.c"] == {"pkg.a"}  # not its own package, which ran first
    assert graph["pkg.d"] == {"pkg.a"}  # relative
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"]]


def test_loading_the_plugin_imports_no_torch() -> None:
    """The plugin is an entry point, so every pytest run in the environment loads it: torch (and
    the optional KCoral client) load only when an item runs."""
    probe = ("import sys, pytest_kcoral.plugin, pytest_kcoral.lease_plugin, pytest_kcoral.scheduling;"
             " print(sorted(m for m in ('torch', 'triton', 'kcoral', 'httpx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_loading_the_plugin_warns_of_nothing(tmp_path: Path) -> None:
    """Every run loads the plugin: pytest's warning that an imported module cannot be rewritten
    (a sub-plugin imported before pytest registers it) reached every user's summary."""
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "-q", "-W", "error"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Warning" not in proc.stdout + proc.stderr


MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80


def test_no_module_class_or_function_is_too_long() -> None:
    """A newcomer reads a module, a class or a function whole: over these sizes, split it."""
    too_long = []
    for name, path in package_modules().items():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"module {name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    too_long.append(f"{type(node).__name__} {name}.{node.name}: {lines} lines")
    assert not too_long, "over the size limits: " + "; ".join(too_long)
