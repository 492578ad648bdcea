"""Inside a child: one calling convention over the case formats and the candidate forms.

``CaseRuntime`` makes seeded inputs and calls the reference and the baseline; ``CandidateRuntime``
loads a candidate and turns it into a zero-argument callable per input set (``run``, ``prepare``,
a KernelBench ``ModelNew`` or a GPU MODE ``custom_kernel``); ``BaselineRuntime`` does the same for
the case's baseline, in the child that times it. Only children import this module.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_kcoral.case_files import NamedFiles, import_case_module
from pytest_kcoral.cases import GPUMODE, KCORAL_BENCH, KERNELBENCH, helpers_folder


class CandidateError(Exception):
    """The candidate file does not have the shape of a candidate (also found at its first call: a
    ``prepare()`` that returns no callable), a compile failure (``child._is_compile_error``)."""


def gpumode_data(args: tuple) -> Any:
    """What GPU MODE's functions take, from the inputs as the harness holds them (a tuple): the
    tensor itself for one input, the tuple for several (``generate_input``'s return)."""
    return args[0] if len(args) == 1 else args


class CaseRuntime:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.format = spec["format"]
        self.device = spec["device"]
        self.init_seed = int(spec.get("init_seed", 0))
        helpers = helpers_folder(self.format, Path(spec["source"]))
        if helpers is not None:  # for this process's life: the case calls its helpers lazily too
            sys.path.insert(0, str(helpers))
        if spec.get("helper_files"):  # a GPU MODE problem's ``utils.py`` from ``../utils.py``
            sys.meta_path.insert(0, NamedFiles({name: Path(path) for name, path in spec["helper_files"].items()}))
        self.module = import_case_module(Path(spec["source"]))
        # taken now, before any candidate loads in this process: the harness calls these between
        # timed calls (fresh inputs), where a candidate that replaced them would work untimed
        self._entry_points = {name: getattr(self.module, name) for name in ("make_inputs", "get_inputs", "get_init_inputs", "reference", "Model",
                                                                            "generate_input", "ref_kernel", "check_implementation")
                              if callable(getattr(self.module, name, None))}
        self._baseline_fn: Callable[..., Any] | None = getattr(self.module, "baseline", None)
        if self._baseline_fn is None and spec.get("baseline_file"):
            self._baseline_fn = _baseline_from_file(Path(spec["baseline_file"]))
        self._models: dict[str, Any] = {}
        self._seed = _seeder(spec.get("device_kind", "cpu"))

    # -- inputs -----------------------------------------------------------------------------

    def make_inputs(self, shape: dict[str, Any], seed: int) -> tuple:
        import torch

        self._seed(seed)
        if self.format == KERNELBENCH:
            self.set_globals(shape)
            # the item's device as the default: get_inputs()'s draws happen there, not on the host
            # and then copied (seconds a call for KernelBench's own sizes)
            with torch.device(self.device):
                values = self._entry_points["get_inputs"]()
            return tuple(v.to(self.device) if isinstance(v, torch.Tensor) else v for v in values)
        if self.format == KCORAL_BENCH:
            # KCoral's make_inputs(case) takes no device: the item's device is made the default.
            with torch.device(self.device):
                values = self._entry_points["make_inputs"](dict(shape))
        elif self.format == GPUMODE:
            # task.yml's seed is replaced by the harness's; the item's device is made the default
            with torch.device(self.device):
                values = self._entry_points["generate_input"](**shape, seed=seed)
        else:
            values = self._entry_points["make_inputs"](dict(shape), self.device)
        if isinstance(values, dict):
            # inputs are positional (INPLACE and the messages number them): a dict would reach the
            # reference as one argument, and fail there with a message about something else
            raise TypeError(f"make_inputs returned a dict (keys {', '.join(map(str, values))[:120]}): "
                            "return the inputs as a tuple or list, in the order the reference takes them")
        return tuple(values) if isinstance(values, (tuple, list)) else (values,)

    def set_globals(self, shape: dict[str, Any]) -> None:
        for name, value in shape.items():
            setattr(self.module, name, value)

    def cost(self, shape: dict[str, Any]) -> dict[str, Any] | None:
        """The case's ``cost(shape)`` (flops and bytes), when it declares one."""
        fn = getattr(self.module, "cost", None) if self.format not in (KERNELBENCH, KCORAL_BENCH) else None
        if not callable(fn):
            return None
        value = fn(dict(shape))
        return dict(value) if isinstance(value, dict) else None

    # -- oracle and baseline ----------------------------------------------------------------

    def reference(self, shape: dict[str, Any], args: tuple) -> Any:
        if self.format == KERNELBENCH:
            return self.bind_model(self._entry_points["Model"], shape, args)()
        if self.format == GPUMODE:
            return self._entry_points["ref_kernel"](gpumode_data(args))
        return self._entry_points["reference"](*args)

    def check(self, args: tuple, output: Any) -> Any:
        """The case's own verdict on an output for these inputs (GPU MODE's
        ``check_implementation(data, output)``), as it returns it (``checker.problems_of``)."""
        return self._entry_points["check_implementation"](gpumode_data(args), output)

    def baseline(self, shape: dict[str, Any], args: tuple) -> Any:
        return self.bind_baseline(shape, args)()

    def bind_baseline(self, shape: dict[str, Any], args: tuple) -> Callable[[], Any]:
        if self.format == KERNELBENCH:
            return self.bind_model(self._entry_points["Model"], shape, args)
        if self.format == GPUMODE:
            ref_kernel, data = self._entry_points["ref_kernel"], gpumode_data(args)
            return lambda: ref_kernel(data)
        fn = self._baseline_fn or self._entry_points["reference"]
        return lambda: fn(*args)

    def bind_model(self, model_class: Any, shape: dict[str, Any], args: tuple) -> Callable[[], Any]:
        """A KernelBench model built under the init seed, so reference and candidate weights match."""
        import torch

        model = self._model(model_class, shape)

        def call() -> Any:
            with torch.no_grad():
                return model(*args)

        return call

    def _model(self, model_class: Any, shape: dict[str, Any]) -> Any:
        """The model for the shape, built once under the init seed."""
        # the device is part of the key: compile builds the model before the lease names a GPU
        key = f"{model_class.__module__}.{model_class.__qualname__}:{sorted(shape.items())}:{self.device}"
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = self._build_model(model_class, shape)
        return model

    def _build_model(self, model_class: Any, shape: dict[str, Any]) -> Any:
        import torch

        self.set_globals(shape)
        init_inputs = self._entry_points["get_init_inputs"]()
        torch.manual_seed(self.init_seed)
        return model_class(*init_inputs).to(self.device)

    def parameters_differ(self, model_class: Any, shape: dict[str, Any]) -> bool | None:
        """Whether ``model_class``'s model (a KernelBench ``ModelNew``) lacks some parameter or
        buffer that ``Model`` gets under the same seed: equal shape, dtype and values. None when
        it holds no ``state_dict``. ``Model`` is built here and let go, never kept."""
        import torch

        candidate = getattr(self._model(model_class, shape), "state_dict", None)
        if not callable(candidate):
            return None
        theirs = [t for t in candidate().values() if isinstance(t, torch.Tensor)]
        ours = [t for t in self._build_model(self._entry_points["Model"], shape).state_dict().values() if isinstance(t, torch.Tensor)]
        return not all(any(t.shape == c.shape and t.dtype == c.dtype and torch.equal(t, c) for c in theirs) for t in ours)


def _seeder(device_kind: str) -> Callable[[int], None]:
    """Seeds the generators the inputs are drawn from, through references taken before any
    candidate loads. ``torch.manual_seed`` passes the seed through Python callees a candidate can
    replace (``torch.xpu.manual_seed_all``, ...), and one that learnt each refresh's seed could
    make the inputs and the answer outside its timing window. Only the CPU's generator and, on a
    GPU, CUDA's (whose seeding still goes through ``torch.cuda``'s module: docs/security.md)."""
    import torch

    seed_cpu = torch.default_generator.manual_seed  # a method of a C object
    seed_cuda = torch.cuda.manual_seed_all if device_kind == "cuda" else None

    def seed_all(seed: int) -> None:
        if seed_cuda is not None:
            seed_cuda(seed)
        seed_cpu(seed)

    return seed_all


def _baseline_from_file(path: Path) -> Callable[..., Any]:
    module = import_case_module(path, "baseline")
    for name in ("baseline", "run"):
        fn: Callable[..., Any] | None = getattr(module, name, None)
        if callable(fn):
            return fn
    raise CandidateError(f"{path}: defines neither baseline() nor run()")


def _import_candidate(path: Path) -> ModuleType:
    """Import the candidate, letting its own errors (with its own traceback) propagate."""
    spec = importlib.util.spec_from_file_location("kcoral_candidate", path)
    if spec is None or spec.loader is None:
        raise CandidateError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kcoral_candidate"] = module
    spec.loader.exec_module(module)
    return module


class BaselineRuntime:
    """The case's baseline in the form of a loaded candidate (``bind``), for the child that times
    it the way a candidate's child times the candidate (``child._cmd_load_baseline``). Nothing is
    built at load (a KernelBench ``Model`` is built at its first ``bind``): the trusted child has
    run the same code as the reference by then, so a case that hangs or fails there is told as
    the case's, not as the candidate's compile."""

    entry = "baseline"
    parameters_differ = None  # see ``CandidateRuntime``

    def __init__(self, case: CaseRuntime) -> None:
        self.case = case

    def bind(self, shape: dict[str, Any], args: tuple) -> Callable[[], Any]:
        return self.case.bind_baseline(shape, args)


class CandidateRuntime:
    """A loaded candidate. Importing it is the compile stage's 'import' phase."""

    def __init__(self, path: str, case: CaseRuntime, shape: dict[str, Any]) -> None:
        self.path = Path(path)
        self.case = case
        self.module = _import_candidate(self.path)
        # KernelBench: whether ModelNew's weights differ from Model's (``CaseRuntime.parameters_differ``),
        # for the correctness stage's hint
        self.parameters_differ: bool | None = None
        if case.format == KERNELBENCH:
            model_class = getattr(self.module, "ModelNew", None)
            if model_class is None:
                raise CandidateError(f"{self.path}: a KernelBench candidate must define class ModelNew")
            self.entry = "ModelNew"
            self._model_class = model_class
            self.build_for(shape)
            # at the first load, on the CPU and before the lease; a kept child keeps the answer
            # for the candidate's later shapes (an order of creation does not change with them)
            self.parameters_differ = case.parameters_differ(model_class, shape)
        elif case.format == GPUMODE and callable(getattr(self.module, "custom_kernel", None)):
            self.entry = "custom_kernel"  # a GPU MODE problem's candidates are submissions
        elif callable(getattr(self.module, "prepare", None)):
            self.entry = "prepare"
        elif callable(getattr(self.module, "run", None)):
            self.entry = "run"
        elif callable(getattr(self.module, "custom_kernel", None)):
            self.entry = "custom_kernel"  # a GPU MODE submission
        else:
            raise CandidateError(f"{self.path}: defines none of run(*inputs), prepare(*inputs) or custom_kernel(data)")

    def build_for(self, shape: dict[str, Any]) -> None:
        """What the candidate builds for a shape before its first call (a KernelBench ``ModelNew``):
        constructors compile extensions, and that belongs to the compile stage."""
        if self.entry == "ModelNew":
            self.case.bind_model(self._model_class, shape, ())

    def bind(self, shape: dict[str, Any], args: tuple) -> Callable[[], Any]:
        if self.entry == "ModelNew":
            return self.case.bind_model(self._model_class, shape, args)
        if self.entry == "prepare":
            fn: Callable[[], Any] = self.module.prepare(*args)
            if not callable(fn):
                raise CandidateError(f"{self.path}: prepare() returned {type(fn).__name__} {fn!r:.60}, not a callable")
            return fn
        if self.entry == "custom_kernel":
            # GPU MODE passes what its generate_input returned: the tensor itself for one input,
            # the tuple for several
            data = gpumode_data(args)
            kernel = self.module.custom_kernel
            return lambda: kernel(data)
        run = self.module.run
        return lambda: run(*args)
