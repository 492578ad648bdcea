"""Tampering: the functions the harness and the timers rely on, replaced by candidate code.

The timers hold references taken before the candidate loads (``timing.prepare``), so replacing
``time.perf_counter`` or ``torch.cuda.synchronize`` does not fool them; but a candidate that tries
has shown its intent, and one that patches the harness's own modules (``pytest_kcoral.*``) could
fool the checks that run in its process. ``Snapshot.take()`` records the identity of every watched
attribute before the candidate loads; ``changed()`` names those that are no longer the same object.
Attributes added later (torch sets some lazily) are not changes.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, is_
from typing import Any

# (module, attribute names or None for every attribute in the module's namespace)
_WATCHED_MODULES: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("time", ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time", "sleep")),
    ("gc", ("collect", "get_objects")),
    # not manual_seed: importing torch._dynamo wraps it (and the candidate's RNG decides nothing)
    ("torch", ("allclose", "isclose", "equal", "eq", "testing", "empty", "empty_like", "full", "save", "load",
               # what a case's make_inputs calls: the harness refreshes the timed inputs through it,
               # outside the window, in the candidate's process
               "randn", "rand", "randint", "randn_like", "rand_like", "randint_like", "randperm", "normal", "bernoulli",
               "multinomial", "empty_strided", "zeros", "ones", "zeros_like", "ones_like", "full_like", "arange", "linspace",
               "tensor", "as_tensor", "from_numpy", "cat", "stack")),
    ("torch.testing", ("assert_close",)),
    ("torch.cuda", ("synchronize", "Event", "Stream", "current_stream", "default_stream", "set_device", "is_available")),
    ("torch._C", ("_cuda_synchronize", "_CudaEventBase")),
    # the profiler the GPU timer reads (``timing.cupti_timer``), where ``timing.prepare`` loaded it
    ("cupti", ("cupti",)),
    ("cupti.cupti", ("get_timestamp", "activity_enable", "activity_disable", "activity_register_callbacks",
                     "activity_flush_all", "ActivityKind")),
    ("multiprocessing.connection", ("Connection",)),
    ("json", ("dumps", "loads")),
    ("threading", ("enumerate", "Thread")),
    ("os", ("kill", "killpg", "waitpid", "write", "_exit", "listdir", "readlink", "getpid")),
)

# Classes whose methods the harness calls on live objects.
_WATCHED_CLASSES: tuple[tuple[str, str], ...] = (
    ("torch", "Tensor"),
    ("torch._C", "TensorBase"),
    ("torch.cuda", "Event"),
    ("multiprocessing.connection", "Connection"),
    ("pytest_kcoral.child", "Unpredictable"),  # the harness's draws in a child (timing seeds)
)


def _harness_modules() -> list[str]:
    return [name for name in sys.modules if name == "pytest_kcoral" or name.startswith("pytest_kcoral.")]


def _case_modules() -> list[str]:
    """The case's module in this child (``case_files.import_case_module``) and the helpers beside it
    (``task.py``, imported by plain name): the harness calls its make_inputs between timed calls,
    where a candidate's replacement would do the work untimed. Not a candidate's own modules."""
    cases = [name for name in sys.modules if name.startswith(("_kcoral_case_", "_kcoral_baseline_"))]
    folders = {os.path.dirname(os.path.abspath(f)) for f in (getattr(sys.modules[n], "__file__", None) for n in cases) if f}
    helpers = []
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if name in cases or name.startswith("kcoral_candidate") or not origin:
            continue
        if os.path.dirname(os.path.abspath(origin)) in folders:
            helpers.append(name)
    return cases + helpers


@dataclass
class Snapshot:
    # each key's object when taken (kept alive, so no replacement can come to share its identity)
    _objects: dict[str, Any] = field(default_factory=dict)
    # each key's path, resolved once (``_path``): the check runs after every command
    _paths: dict[str, tuple[str, tuple[str, ...], bool]] = field(default_factory=dict)
    _groups: dict[tuple[str, tuple[str, ...]], list[tuple[str, str, Any, bool]]] | None = field(default=None, repr=False)
    # per group, its names, their objects, and its functions with their code, for a check by
    # identity in one pass of C loops (``_unchanged``): the per-key loop took milliseconds a round
    _passes: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]] = field(
        default_factory=dict, repr=False)
    # each watched class's own names when taken: one set later over a base's method shadows it
    _class_names: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)

    @classmethod
    def take(cls) -> Snapshot:
        snap = cls()
        for module_name, names in _WATCHED_MODULES:
            module = sys.modules.get(module_name)
            if module is not None:
                snap._watch(module_name, module, names)
        for module_name in _harness_modules():
            snap._watch(module_name, sys.modules[module_name], None)
        for module_name in _case_modules():
            # its callables only: a KernelBench case's shape globals are set per item
            module = sys.modules[module_name]
            snap._watch(module_name, module, tuple(n for n, v in vars(module).items() if callable(v) and not n.startswith("__")))
        for module_name, class_name in _WATCHED_CLASSES:
            cls_obj = getattr(sys.modules.get(module_name), class_name, None)
            if isinstance(cls_obj, type):
                snap._class_names[(module_name, class_name)] = frozenset(vars(cls_obj))
                for name, value in list(vars(cls_obj).items()):
                    snap._record(f"{module_name}.{class_name}.{name}", value)
        snap._groups = snap._grouped()  # now, before candidate code could replace what builds them
        return snap

    def _watch(self, module_name: str, module: Any, names: tuple[str, ...] | None) -> None:
        namespace = vars(module)
        for name in names if names is not None else list(namespace):
            if name not in namespace:
                continue
            # in the harness's own modules, state still unset (None) may be filled in lazily
            if names is None and (name.startswith("__") or namespace[name] is None):
                continue
            value = namespace[name]
            self._record(f"{module_name}.{name}", value)
            if names is None and isinstance(value, type) and value.__module__ == module_name:
                # the harness's own classes: a method replaced on the class (CaseRuntime.make_inputs)
                # leaves the class object itself as it was
                for attr, member in list(vars(value).items()):
                    if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                        self._record(f"{module_name}.{name}.{attr}", member)

    def _record(self, key: str, value: Any) -> None:
        self._groups = None
        self._objects[key] = value
        self._paths[key] = _path(key)
        code = getattr(value, "__code__", None) if isinstance(value, types.FunctionType) else None
        if code is not None:  # fn.__code__ = other: the same function object doing something else
            self._objects[key + _CODE] = code
            self._paths[key + _CODE] = _path(key + _CODE)

    def changed(self) -> list[str]:
        """Watched names now bound to a different object (or deleted), and methods of a watched
        class's base set on the class itself (``torch.Tensor.copy_ = ...`` shadows the
        ``TensorBase`` method the harness calls)."""
        if self._groups is None:
            self._groups = self._grouped()
        problems = []
        missing = object()  # fresh, so it can be found in no namespace
        modules = sys.modules
        for group, entries in self._groups.items():
            module_name, owner_names = group
            owner = _resolve(modules.get(module_name), owner_names, missing)
            namespace = vars(owner) if owner is not missing and hasattr(owner, "__dict__") else {}
            if self._unchanged(group, namespace, missing):
                continue
            for key, name, taken, code in entries:
                current = namespace.get(name, missing)
                if code and current is not missing:
                    current = getattr(current, "__code__", missing)
                if current is not taken:
                    problems.append(key)
        for (module_name, class_name), known in self._class_names.items():
            cls_obj = getattr(modules.get(module_name), class_name, None)
            if isinstance(cls_obj, type) and len(vars(cls_obj)) != len(known):
                problems += [f"{module_name}.{class_name}.{name} (over a method of its base {base})"
                             for name in sorted(set(vars(cls_obj)) - known) for base in self._shadowed(cls_obj, name)]
        return problems

    def _unchanged(self, group: tuple[str, tuple[str, ...]], namespace: Any, missing: Any) -> bool:
        """Whether every name of ``group`` still holds its object, and every function its code."""
        names, objects, functions, codes = self._passes[group]
        return all(map(is_, map(namespace.get, names, repeat(missing)), objects)) and all(map(is_, map(_code_of, functions), codes))

    def _shadowed(self, cls_obj: type, name: str) -> list[str]:
        """The watched base class whose watched ``name`` a new attribute of ``cls_obj`` hides."""
        for module_name, class_name in _WATCHED_CLASSES:
            base = getattr(sys.modules.get(module_name), class_name, None)
            if base is not cls_obj and base in cls_obj.__mro__ and f"{module_name}.{class_name}.{name}" in self._objects:
                return [f"{module_name}.{class_name}"]
        return []

    def _grouped(self) -> dict[tuple[str, tuple[str, ...]], list[tuple[str, str, Any, bool]]]:
        """The watched keys by the namespace that holds them, so each namespace is found once a
        check: the check runs after every command, a timing round's included."""
        groups: dict[tuple[str, tuple[str, ...]], list[tuple[str, str, Any, bool]]] = {}
        for key, taken in self._objects.items():
            module_name, names, code = self._paths[key]  # every key names an attribute below its module
            groups.setdefault((module_name, names[:-1]), []).append((key, names[-1], taken, code))
        self._passes = {}
        for group, entries in groups.items():
            plain = [(name, taken) for _, name, taken, code in entries if not code]
            functions = [(self._objects[key.removesuffix(_CODE)], taken) for key, _, taken, code in entries if code]
            self._passes[group] = (tuple(n for n, _ in plain), tuple(o for _, o in plain),
                                   tuple(f for f, _ in functions), tuple(c for _, c in functions))
        return groups


_CODE = ".__code__"
_code_of = attrgetter("__code__")


def _path(key: str) -> tuple[str, tuple[str, ...], bool]:
    """Where ``key`` lives: the longest prefix that is a loaded module, the attribute names below
    it, and whether the key is a function's ``__code__``."""
    code = key.endswith(_CODE)
    parts = (key[: -len(_CODE)] if code else key).split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        if name in sys.modules:
            return name, tuple(parts[cut:]), code
    return parts[0], tuple(parts[1:]), code


def _resolve(module: Any, names: tuple[str, ...], missing: Any) -> Any:
    # class namespaces, not getattr: inherited or descriptor-made values are no replacements
    if module is None:
        return missing
    obj: Any = module
    for name in names:
        namespace = vars(obj) if hasattr(obj, "__dict__") else {}
        if name not in namespace:
            return missing
        obj = namespace[name]
    return obj
