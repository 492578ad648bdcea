"""Collect step, part one: read a case in any of its formats into a ``Case``.

A case folder holds ``case.py`` (native, or a KernelBench problem), ``bench.json`` + ``bench.py``
(a KCoral bench folder) or ``task.yml`` + ``reference.py`` (a GPU MODE problem). A KernelBench
problem file (``<id>_<Name>.py`` in a level folder) is a case by itself. The case module is
trusted code written by the benchmark maintainer, so it is imported here to read its shapes;
candidates never are (see ``candidates.py``). Anything malformed raises ``CaseError`` naming the
file and the problem.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_kcoral.case_files import CaseError, file_digests, helpers_importable, identity, import_case_module
from pytest_kcoral.speed_of_light import cost_problem
from pytest_kcoral.timing import KCORAL_SETTINGS

NATIVE = "native"
KCORAL_BENCH = "kcoral"
KERNELBENCH = "kernelbench"
GPUMODE = "gpumode"

# KernelBench's problem files (``19_ReLU.py``) and the level folders that hold them (``level1``)
KERNELBENCH_PROBLEM_FILE = re.compile(r"^(\d+)_\w+\.py$")
KERNELBENCH_LEVEL_FOLDER = re.compile(r"^level_?(\d+)$")
# The names a KernelBench problem defines (a native case defines make_inputs instead)
KERNELBENCH_NAMES = ("Model", "get_inputs", "get_init_inputs")

# Shape keys that steer the harness rather than parametrize the case.
SHAPE_CONTROL_KEYS = ("id", "gpu_only")
# The top-level keys of a bench.json that the harness reads; KCoral's timing settings
# (``KCORAL_SETTINGS``: warmup, repeat, ...) are known but ignored, anything else is unknown.
BENCH_JSON_KEYS = ("cases", "atol", "rtol", "tier")


@dataclass(frozen=True)
class Shape:
    params: dict[str, Any]  # what make_inputs receives (KernelBench: module globals to set)
    split: str  # "seen" | "unseen"
    shape_id: str
    gpu_only: bool = False


@dataclass
class Case:
    folder: Path
    case_id: str  # folder relative to the rootdir, posix style
    format: str
    source: Path  # the module the harness imports: case.py or bench.py
    shapes: list[Shape]
    tier: int = 1
    atol: float | None = None
    rtol: float | None = None
    inplace: tuple[int, ...] = ()
    has_baseline: bool = False  # a baseline other than the reference
    baseline_file: Path | None = None  # a baseline.py beside the case (native and KCoral bench folders)
    content_hash: str = ""
    # the case's own files as collected (``file_digests``): a child imports them only unchanged
    file_digests: dict[str, bytes] = field(default_factory=dict)
    # what is wrong with cost(shape), per shape: those shapes get no speed-of-light figures or floor
    cost_problems: tuple[str, ...] = ()
    # keys of a bench.json that nothing reads, each said once at its line: the case still grades
    ignored_config: tuple[tuple[int, str], ...] = ()
    # a KernelBench problem file that shares its folder with other problems: only it is the case's
    standalone: bool = False
    # a KernelBench problem's level and id (``level1/19_ReLU.py``: 1 and 19), which match it to
    # the run files ``level_1_problem_19_sample_<k>_kernel.py``; None where not known
    level: int | None = None
    problem_id: int | None = None
    # modules a GPU MODE problem imports by a name of its own (task.yml's ``files``, e.g. ``utils.py``
    # from ``../utils.py``): the module's file name -> the file
    helper_files: dict[str, Path] = field(default_factory=dict)
    # the case judges a candidate's outputs itself (GPU MODE's ``check_implementation``), in the
    # trusted child; the dtype and tolerance rules do not apply
    checker: bool = False
    # an input a candidate returns as an output may be written and shared (GPU MODE: its harness
    # hands a kernel a copy of the data, which may carry the output buffer, as pmpp_v2's matmul does)
    output_buffers_in_inputs: bool = False

    @property
    def name(self) -> str:
        """What submissions name the case by: its folder, or a problem file's stem."""
        return self.source.stem if self.standalone else self.folder.name


def is_case_folder(path: Path) -> bool:
    return (path / "case.py").is_file() or (path / "bench.json").is_file() or is_gpumode_folder(path)


def is_gpumode_folder(path: Path) -> bool:
    return (path / "task.yml").is_file() and (path / "reference.py").is_file()


def case_folder_for(path: Path) -> Path | None:
    """The case folder a command-line path names: the folder itself, or one of the files that
    make it a case (``cases/add/case.py``, ``problem/task.yml``), which pytest would otherwise
    collect nothing from."""
    if path.is_dir():
        return path if is_case_folder(path) else None
    if path.name in ("case.py", "bench.py", "bench.json", "task.yml", "reference.py") and is_case_folder(path.parent):
        return path.parent
    return None


def is_kernelbench_problem_file(path: Path) -> bool:
    """A KernelBench problem file: named ``<id>_<Name>.py``, defining ``Model``, ``get_inputs`` and
    ``get_init_inputs`` at its top level (read from its syntax tree, not imported: every
    ``<digits>_*.py`` a walk meets would otherwise run). One that does not parse counts when it
    mentions ``get_init_inputs``, so its syntax error is reported."""
    return kernelbench_names_missing(path) == []


def kernelbench_names_missing(path: Path) -> list[str] | None:
    """Which of ``KERNELBENCH_NAMES`` a ``<id>_<Name>.py`` file lacks at its top level ([] for a
    problem file); None for a file that is no such file, or defines none of them."""
    if not KERNELBENCH_PROBLEM_FILE.match(path.name) or not path.is_file():
        return None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [] if "get_init_inputs" in text else None
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = [name for name in KERNELBENCH_NAMES if name not in defined]
    return None if len(missing) == len(KERNELBENCH_NAMES) else missing


def kernelbench_level(folder: Path) -> int | None:
    """The level of the problems in ``folder``, from its name (``level1``, ``level_2``)."""
    found = KERNELBENCH_LEVEL_FOLDER.match(folder.name)
    return int(found[1]) if found else None


def kernelbench_problem_id(name: str) -> int | None:
    """A problem's id, from its name's leading number (``19_ReLU``: 19)."""
    found = re.match(r"^(\d+)_", name)
    return int(found[1]) if found else None


def load_problem_file(path: Path, rootdir: Path) -> Case:
    """Read a KernelBench problem file that sits among others in a level folder. Its case id is
    its path without ``.py`` (``level1/19_ReLU``), its name the file's stem."""
    try:
        case_id = path.with_suffix("").relative_to(rootdir).as_posix()
    except ValueError:
        case_id = path.with_suffix("").as_posix()
    with helpers_importable(helpers_folder(KERNELBENCH, path)):
        module = import_case_module(path)
    return _kernelbench_case(path.parent, case_id, path, module, standalone=True)


def load_case(folder: Path, rootdir: Path) -> Case:
    """Read and validate the case in ``folder``."""
    try:
        case_id = folder.relative_to(rootdir).as_posix()
    except ValueError:
        case_id = folder.as_posix()
    if (folder / "bench.json").is_file():
        if (folder / "case.py").is_file():
            # read as a bench folder, its case.py would be graded as a candidate named "case"; read
            # as a case.py case, its bench.json would be ignored: either way a guess
            raise CaseError(folder, "holds both case.py and bench.json: a case is either a case.py case (native or KernelBench)"
                                    " or a KCoral bench folder (bench.json + bench.py); keep one of the two files"
                                    " (a bench folder's candidate named case.py needs another name)")
        return _load_kcoral_bench(folder, case_id)
    if (folder / "case.py").is_file():
        # beside a GPU MODE problem's own files, a case.py is the glue older versions needed: kept
        return _load_case_py(folder, case_id)
    return _load_gpumode(folder, case_id)


def helpers_folder(case_format: str, source: Path) -> Path | None:
    """The folder whose modules a case imports by plain name (``from helpers import make``), as a
    script imports those beside it: a ``case.py``'s own folder. None for a KCoral bench folder,
    where every other ``.py`` beside ``bench.py`` is a candidate, which a trusted process must
    never import."""
    return None if case_format == KCORAL_BENCH else source.resolve().parent


def changed_case_files(case: Case) -> list[str]:
    """The case's files that differ from what was collected: changed, added or removed."""
    try:
        now = file_digests(case.folder, case.source if case.standalone else None, case.helper_files)
    except OSError as exc:
        return [f"{case.folder} ({exc.strerror or exc})"]
    then = case.file_digests
    return sorted(name for name in then.keys() | now.keys() if then.get(name) != now.get(name))


def shape_id_of(params: dict[str, Any], explicit: Any = None) -> str:
    if explicit is not None:
        return str(explicit)
    parts = [f"{k}={v}" for k, v in params.items()]
    return "-".join(parts) if parts else "default"


def _make_shapes(path: Path, entries: Any, split: str, what: str) -> list[Shape]:
    if not isinstance(entries, (list, tuple)):
        raise CaseError(path, f"{what} must be a list of shape dicts, got {type(entries).__name__}")
    shapes = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise CaseError(path, f"{what}[{i}] must be a shape dict, got {type(entry).__name__} {entry!r}")
        gpu_only = bool(entry.get("gpu_only", False))
        params = {k: v for k, v in entry.items() if k not in SHAPE_CONTROL_KEYS}
        shapes.append(Shape(params, split, shape_id_of(params, entry.get("id")), gpu_only))
    return shapes


def _check_unique(path: Path, shapes: list[Shape]) -> None:
    seen: set[tuple[str, str]] = set()
    for s in shapes:
        key = (s.split, s.shape_id)
        if key in seen:
            raise CaseError(path, f"two {s.split} shapes share the id {s.shape_id!r}")
        seen.add(key)


def _tolerance(path: Path, module: ModuleType | dict, name: str) -> float | None:
    value = module.get(name) if isinstance(module, dict) else getattr(module, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CaseError(path, f"{name} must be a non-negative number, got {value!r}")
    return float(value)


def _tier(path: Path, value: Any) -> int:
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        raise CaseError(path, f"TIER must be an integer from 1 to 5, got {value!r}")
    return value


def _baseline_file(folder: Path, case_format: str, source: Path, baseline: Any) -> Path | None:
    """The case's ``baseline.py``, if it has one and no ``baseline()`` of its own (both: which one
    speedups are measured against would be a guess, so it is an error)."""
    path = folder / "baseline.py"
    if not path.is_file():
        return None
    if baseline is not None:
        raise CaseError(source, f"defines baseline() and has a baseline.py beside it ({path}): keep one, the baseline speedups are measured against")
    # imported here as the case module is, so that one that does not import or defines no
    # baseline is a collection error naming it, not a failure of every candidate's process later
    with helpers_importable(helpers_folder(case_format, path)):
        module = import_case_module(path, "baseline")
    if not any(callable(getattr(module, name, None)) for name in ("baseline", "run")):
        raise CaseError(path, "defines neither baseline(*inputs) nor run(*inputs): the baseline a case's speedups are measured against")
    return path


def _require_callable(path: Path, module: ModuleType, name: str) -> None:
    if not callable(getattr(module, name, None)):
        raise CaseError(path, f"missing required function {name}()")


def _load_case_py(folder: Path, case_id: str) -> Case:
    path = folder / "case.py"
    with helpers_importable(helpers_folder(NATIVE, path)):
        module = import_case_module(path)
    if hasattr(module, "Model") and not hasattr(module, "make_inputs"):
        # a KernelBench problem (a native case has make_inputs): its own names are checked, so a
        # misspelt get_inputs is named as such, not as a native case's missing SEEN
        return _kernelbench_case(folder, case_id, path, module)
    return _native_case(folder, case_id, path, module)


def _native_case(folder: Path, case_id: str, path: Path, module: ModuleType) -> Case:
    if not hasattr(module, "SEEN"):
        raise CaseError(path, "missing required name SEEN (a non-empty list of shape dicts)")
    seen = _make_shapes(path, module.SEEN, "seen", "SEEN")
    if not seen:
        raise CaseError(path, "SEEN is empty: a case needs at least one seen shape")
    unseen = _make_shapes(path, getattr(module, "UNSEEN", []), "unseen", "UNSEEN")
    _require_callable(path, module, "make_inputs")
    _require_callable(path, module, "reference")
    baseline = getattr(module, "baseline", None)
    if baseline is not None and not callable(baseline):
        raise CaseError(path, "baseline must be a function")
    baseline_file = _baseline_file(folder, NATIVE, path, baseline)
    cost = getattr(module, "cost", None)
    if cost is not None and not callable(cost):
        raise CaseError(path, "cost must be a function of the shape")
    inplace = getattr(module, "INPLACE", ())
    if not isinstance(inplace, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in inplace):
        raise CaseError(path, f"INPLACE must be a list of input indices, got {inplace!r}")
    shapes = seen + unseen
    _check_unique(path, shapes)
    cost_problems = _check_cost(cost, shapes) if cost is not None else ()
    return Case(
        folder=folder,
        case_id=case_id,
        format=NATIVE,
        source=path,
        shapes=shapes,
        tier=_tier(path, getattr(module, "TIER", None)),
        atol=_tolerance(path, module, "ATOL"),
        rtol=_tolerance(path, module, "RTOL"),
        inplace=tuple(inplace),
        has_baseline=baseline is not None or baseline_file is not None,
        baseline_file=baseline_file,
        **identity(folder),
        cost_problems=cost_problems,
    )


def _check_cost(cost: Any, shapes: list[Shape]) -> tuple[str, ...]:
    """``cost(shape)`` on every shape, at collection: an answer the report cannot use would
    otherwise only show as figures missing from the summary."""
    problems = []
    for shape in shapes:
        try:
            problem = cost_problem(cost(dict(shape.params)))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the case's code; reported, not raised
            problem = f"raised {type(exc).__name__}: {exc}"[:300]
        if problem:
            problems.append(f"cost(shape) for {shape.split} shape {shape.shape_id} {problem}")
    return tuple(problems)


def _kernelbench_case(folder: Path, case_id: str, path: Path, module: ModuleType, standalone: bool = False) -> Case:
    for name in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, name, None)):
            raise CaseError(path, f"missing required function {name}() (read as a KernelBench problem, since it defines Model;"
                                  " a native case defines make_inputs instead)")
    if not callable(module.Model):
        raise CaseError(path, "Model must be a class")
    # SEEN/UNSEEN hold module globals to set before get_inputs(); with none, the file's own shape.
    if hasattr(module, "SEEN"):
        seen = _make_shapes(path, module.SEEN, "seen", "SEEN")
        if not seen:
            raise CaseError(path, "SEEN is empty: a case needs at least one seen shape")
    else:
        seen = [Shape({}, "seen", "default")]
    unseen = _make_shapes(path, getattr(module, "UNSEEN", []), "unseen", "UNSEEN")
    for shape in seen + unseen:
        for name in shape.params:
            if not hasattr(module, name):
                raise CaseError(path, f"shape {shape.shape_id!r} sets {name}, which is not a global of the module")
    shapes = seen + unseen
    _check_unique(path, shapes)
    # a problem file's level is its folder's (``level1/19_ReLU.py``); a case folder's, its parent's
    # (``level1/19_ReLU/case.py``)
    name = path.stem if standalone else folder.name
    return Case(
        folder=folder,
        case_id=case_id,
        format=KERNELBENCH,
        source=path,
        shapes=shapes,
        tier=_tier(path, getattr(module, "TIER", None)),
        atol=_tolerance(path, module, "ATOL"),
        rtol=_tolerance(path, module, "RTOL"),
        **identity(folder, path if standalone else None),
        standalone=standalone,
        level=kernelbench_level(folder if standalone else folder.parent),
        problem_id=kernelbench_problem_id(name),
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CaseError(path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def _load_kcoral_bench(folder: Path, case_id: str) -> Case:
    config_path = folder / "bench.json"
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise CaseError(config_path, "must hold a JSON object")
    bench_py = folder / "bench.py"
    if not bench_py.is_file():
        raise CaseError(config_path, "bench.py is missing beside it")
    if "cases" not in config:
        raise CaseError(config_path, 'missing "cases" (a list of shape dicts)')
    seen = _make_shapes(config_path, config["cases"], "seen", '"cases"')
    if not seen:
        raise CaseError(config_path, '"cases" is empty: a case needs at least one seen shape')
    unseen: list[Shape] = []
    unseen_path = folder / "unseen.json"
    if unseen_path.is_file():
        unseen = _make_shapes(unseen_path, _read_json(unseen_path), "unseen", "unseen.json")
    module = import_case_module(bench_py, "bench")
    _require_callable(bench_py, module, "make_inputs")
    _require_callable(bench_py, module, "reference")
    baseline = getattr(module, "baseline", None)
    if baseline is not None and not callable(baseline):
        raise CaseError(bench_py, "baseline must be a function")
    # a baseline.py beside bench.py is the baseline, as in a native case (it is never a candidate)
    baseline_file = _baseline_file(folder, KCORAL_BENCH, bench_py, baseline)
    shapes = seen + unseen
    _check_unique(config_path, shapes)
    return Case(
        folder=folder,
        case_id=case_id,
        format=KCORAL_BENCH,
        source=bench_py,
        shapes=shapes,
        tier=_tier(config_path, config.get("tier")),
        atol=_tolerance(config_path, config, "atol"),
        rtol=_tolerance(config_path, config, "rtol"),
        has_baseline=baseline is not None or baseline_file is not None,
        baseline_file=baseline_file,
        **identity(folder),
        ignored_config=_ignored_bench_keys(config_path, f"{case_id}/bench.json", config),
    )


def _ignored_bench_keys(path: Path, shown: str, config: dict[str, Any]) -> tuple[tuple[int, str], ...]:
    """``(line, message)`` per bench.json key the harness does not read: a KCoral timing setting
    would otherwise seem to take effect, and a misspelt ``atol`` would leave the default in silence."""
    text_lines = path.read_text().splitlines()
    lines = []
    for key in config:
        if key in BENCH_JSON_KEYS:
            continue
        if key in KCORAL_SETTINGS:
            message = (f'{shown}: "{key}" is ignored: KCoral\'s timing settings ({", ".join(sorted(KCORAL_SETTINGS))}) do not'
                       " apply here; timing runs by time, set by --kcoral-timing-budget")
        else:
            close = difflib.get_close_matches(key, BENCH_JSON_KEYS, n=1)
            hint = f'; did you mean "{close[0]}"?' if close else ""
            known = ", ".join(f'"{k}"' for k in BENCH_JSON_KEYS)
            message = f'{shown}: unknown key "{key}" is ignored (a bench.json holds {known}){hint}'
        quoted = json.dumps(key)
        line = next((i for i, text in enumerate(text_lines, 1) if quoted in text), 1)
        lines.append((line, message))
    return tuple(lines)


# -- GPU MODE -----------------------------------------------------------------------------------

# Keys of a GPU MODE test or benchmark that the harness replaces: the session's secret seeds
GPUMODE_DROPPED_KEYS = ("seed",)
GPUMODE_SUBMISSION = "@SUBMISSION@"  # task.yml's placeholder for the candidate's file


def _read_yaml(path: Path) -> Any:
    import yaml  # only GPU MODE folders need it

    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise CaseError(path, f"invalid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None


def _gpumode_shapes(path: Path, entries: Any, split: str, what: str) -> list[Shape]:
    """``tests``/``benchmarks`` (or ``unseen.json``) without their seeds, each shape once: GPU MODE
    lists one shape under both with two seeds, and the session's seeds replace both."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise CaseError(path, f"{what} must be a list of shape dicts, got {type(entries).__name__}")
    unseeded, seen_ids = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise CaseError(path, f"{what}[{i}] must be a shape dict, got {type(entry).__name__} {entry!r}")
        params = {k: v for k, v in entry.items() if k not in GPUMODE_DROPPED_KEYS}
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in seen_ids:
            seen_ids.add(key)
            unseeded.append(params)
    return _make_shapes(path, unseeded, split, what)


def _gpumode_files(task_path: Path, task: dict[str, Any]) -> dict[str, Path]:
    """The modules task.yml's ``files`` sets up under a name of their own (``utils.py`` from
    ``../utils.py``); the candidate's placeholder and the runner GPU MODE's harness starts
    (``config.main``, replaced by this one) are left out, and so are files already in place."""
    folder = task_path.parent
    files = task.get("files") or []
    if not isinstance(files, list):
        raise CaseError(task_path, f'"files" must be a list of {{"name": ..., "source": ...}}, got {type(files).__name__}')
    config = task.get("config")
    runner = config.get("main") if isinstance(config, dict) else None
    named: dict[str, Path] = {}
    for i, entry in enumerate(files):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("source"), str)):
            raise CaseError(task_path, f'files[{i}] must be {{"name": ..., "source": ...}}, got {entry!r}')
        name, source = entry["name"], entry["source"]
        if source == GPUMODE_SUBMISSION or name == runner or not name.endswith(".py") or "/" in name:
            continue
        path = (folder / source).resolve()
        if not path.is_file():
            raise CaseError(task_path, f"files[{i}] sets up {name} from {source}, and {path} is not a file")
        if path != (folder / name).resolve():
            named[name] = path
    return named


def _load_gpumode(folder: Path, case_id: str) -> Case:
    """A GPU MODE problem folder: ``task.yml`` (``tests``, ``benchmarks``, ``files``) and
    ``reference.py`` (``ref_kernel``, ``generate_input``, optional ``check_implementation``)."""
    task_path = folder / "task.yml"
    task = _read_yaml(task_path)
    if not isinstance(task, dict):
        raise CaseError(task_path, "must hold a mapping (tests, benchmarks, files, ...)")
    seen = _gpumode_shapes(task_path, task.get("tests"), "seen", '"tests"')
    seen_ids = {s.shape_id for s in seen}
    seen += [s for s in _gpumode_shapes(task_path, task.get("benchmarks"), "seen", '"benchmarks"') if s.shape_id not in seen_ids]
    if not seen:
        raise CaseError(task_path, 'no "tests" or "benchmarks": a case needs at least one seen shape')
    unseen_path = folder / "unseen.json"
    unseen = _gpumode_shapes(unseen_path, _read_json(unseen_path), "unseen", "unseen.json") if unseen_path.is_file() else []
    shapes = seen + unseen
    _check_unique(task_path, shapes)
    helper_files = _gpumode_files(task_path, task)
    source = folder / "reference.py"
    with helpers_importable(folder, helper_files):
        module = import_case_module(source, "reference")
    _require_callable(source, module, "ref_kernel")
    _require_callable(source, module, "generate_input")
    checker = getattr(module, "check_implementation", None)
    if checker is not None and not callable(checker):
        raise CaseError(source, "check_implementation must be a function of (data, output)")
    _check_generate_input(source, module.generate_input, shapes, task_path)
    return Case(
        folder=folder,
        case_id=case_id,
        format=GPUMODE,
        source=source,
        shapes=shapes,
        **identity(folder, None, helper_files),
        helper_files=helper_files,
        checker=checker is not None,
        output_buffers_in_inputs=True,
    )


def _check_generate_input(source: Path, generate_input: Any, shapes: list[Shape], task_path: Path) -> None:
    """``generate_input(**shape, seed=...)`` must accept every shape: a misspelt key in task.yml is
    then an error naming it, not a TypeError in every candidate's item."""
    try:
        signature = inspect.signature(generate_input)
    except (TypeError, ValueError):
        return  # a builtin or a C function: it says at its first call
    for shape in shapes:
        try:
            signature.bind(**shape.params, seed=0)
        except TypeError as exc:
            takes = ", ".join(signature.parameters)
            raise CaseError(task_path, f"{shape.split} shape {shape.shape_id} does not fit generate_input({takes}) in {source.name},"
                                       f" called with the shape's keys and a seed: {exc}") from None
