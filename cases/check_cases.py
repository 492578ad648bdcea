"""Check the bundled cases without the plugin: every candidate against every CPU-sized shape.

Run ``python cases/check_cases.py``. Triton kernels run on the CPU through the interpreter, so
shapes marked ``gpu_only`` are skipped. On a machine with a GPU, ``--device cuda`` runs everything
compiled on the GPU instead, ``gpu_only`` shapes included.

For each case (native ``case.py``, KCoral ``bench.json`` folder, KernelBench ``case.py``) and each
candidate, the inputs come from ``torch.manual_seed(0)``; outputs are compared with the reference
by ``torch.allclose`` at the case's tolerances (SPEC defaults by dtype when the case declares
none), and inputs must come back unchanged.

Exit status is non-zero when an honest candidate (or a case's own baseline) fails any shape, when
a seen-only candidate fails a seen shape or fails no unseen shape, or when a reference output is
matched by zeros or by a constant (a weak shape). This is a development check, not a grader: it
imports candidates into its own process.
"""

from __future__ import annotations

import os
import sys


def _device_from_argv() -> str:
    import argparse

    parser = argparse.ArgumentParser(description="Check every bundled case and candidate")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu",
        help="Where to run: cpu (the Triton interpreter, gpu_only shapes skipped) or cuda",
    )
    return parser.parse_known_args()[0].device


DEVICE = _device_from_argv()

# Must be set before triton is imported anywhere, or kernels try to compile for a GPU.
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import importlib.util  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

CASES_DIR = Path(__file__).resolve().parent

# Candidates written to pass the seen shapes only. A real seen-only submission does not announce
# itself, so the list lives here rather than in the candidates.
SEEN_ONLY = {
    "vector_add": {"triton_unmasked"},
    "row_softmax": {"triton_pad_zero"},
    "layer_norm": {"triton_unmasked_var"},
    "matmul": {"triton_no_k_tail"},
    "kernelbench_gelu_linear": {"triton_tiled_unmasked"},
}

# SPEC section 2 defaults by output dtype: (atol, rtol).
DEFAULT_TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
}

# Keys of a shape entry that steer the harness rather than parametrize the case.
SHAPE_CONTROL_KEYS = ("id", "gpu_only")

# Every output is kept alive until the end, so a later buffer from torch.empty can never be a
# freed earlier result that happens to hold the right answer.
_keep_alive: list[Any] = []


@dataclass
class Shape:
    params: dict[str, Any]
    split: str  # "seen" | "unseen"
    label: str
    gpu_only: bool


@dataclass
class Case:
    name: str
    format: str  # "native" | "kcoral" | "kernelbench"
    module: ModuleType
    shapes: list[Shape]
    candidates: dict[str, Path]
    atol: float | None = None
    rtol: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Row:
    case: str
    candidate: str
    shape: Shape
    status: str  # "pass" | "FAIL" | "skip"
    call_ms: float = 0.0
    detail: str = ""


def import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_shapes(entries: list[dict], split: str) -> list[Shape]:
    shapes = []
    for entry in entries:
        params = {k: v for k, v in entry.items() if k not in SHAPE_CONTROL_KEYS}
        label = "-".join(f"{k}={v}" for k, v in params.items())
        if "id" in entry:
            label = str(entry["id"])
        shapes.append(Shape(params, split, label, bool(entry.get("gpu_only", False))))
    return shapes


def load_case(folder: Path) -> Case:
    name = folder.name
    if (folder / "bench.json").is_file():
        config = json.loads((folder / "bench.json").read_text())
        unseen_path = folder / "unseen.json"
        unseen = json.loads(unseen_path.read_text()) if unseen_path.is_file() else []
        module = import_file(folder / "bench.py", f"_check_{name}_bench")
        candidates = {p.stem: p for p in sorted(folder.glob("*.py")) if p.name != "bench.py"}
        shapes = make_shapes(config["cases"], "seen") + make_shapes(unseen, "unseen")
        return Case(
            name, "kcoral", module, shapes, candidates, config.get("atol"), config.get("rtol")
        )

    module = import_file(folder / "case.py", f"_check_{name}_case")
    candidates = {p.stem: p for p in sorted((folder / "candidates").glob("*.py"))}
    is_kernelbench = hasattr(module, "Model") and hasattr(module, "get_inputs")
    seen = getattr(module, "SEEN", None)
    if is_kernelbench and seen is None:
        seen = [{}]  # the file's own globals are the one seen shape
    assert isinstance(seen, list) and seen, f"{name}: SEEN must be a non-empty list"
    assert all(isinstance(s, dict) for s in seen), f"{name}: SEEN entries must be dicts"
    unseen = getattr(module, "UNSEEN", [])
    assert isinstance(unseen, list) and all(isinstance(s, dict) for s in unseen), f"{name}: UNSEEN"
    case = Case(
        name,
        "kernelbench" if is_kernelbench else "native",
        module,
        make_shapes(seen, "seen") + make_shapes(unseen, "unseen"),
        candidates,
        getattr(module, "ATOL", None),
        getattr(module, "RTOL", None),
    )
    if not is_kernelbench:
        tier = getattr(module, "TIER", 1)
        assert isinstance(tier, int) and 1 <= tier <= 5, f"{name}: TIER {tier!r}"
        case.notes.append(f"tier {tier}")
        if hasattr(module, "baseline"):
            case.notes.append("explicit baseline")
        if hasattr(module, "cost"):
            for shape in case.shapes:
                cost = module.cost(shape.params)
                assert set(cost) == {"flops", "bytes"} and all(v > 0 for v in cost.values()), (
                    f"{name}: cost({shape.params}) = {cost}"
                )
    return case


def call_candidate(module: ModuleType, inputs: tuple) -> Any:
    if hasattr(module, "prepare"):
        return module.prepare(*inputs)()
    return module.run(*inputs)


def as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def compare(out: Any, ref: Any, atol: float | None, rtol: float | None) -> str:
    """Empty string when ``out`` matches ``ref``, else what is wrong, in one line."""
    outs, refs = as_tuple(out), as_tuple(ref)
    if len(outs) != len(refs):
        return f"{len(outs)} outputs, expected {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        if type(o) is not torch.Tensor:
            return f"output {i} is a {type(o).__name__}, not a plain torch.Tensor"
        if o.shape != r.shape or o.dtype != r.dtype or o.device != r.device:
            got = f"{tuple(o.shape)} {o.dtype} {o.device}"
            return f"output {i} is {got}, expected {tuple(r.shape)} {r.dtype} {r.device}"
        default_atol, default_rtol = DEFAULT_TOLERANCES.get(r.dtype, (0.0, 0.0))
        a = default_atol if atol is None else atol
        t = default_rtol if rtol is None else rtol
        if not torch.allclose(o, r, atol=a, rtol=t):
            err = (o.double() - r.double()).abs()
            bad = int((err > a + t * r.double().abs()).sum()) + int(torch.isnan(o).sum())
            max_diff = float(err.nan_to_num(float("inf")).max())
            return (
                f"output {i}: {bad}/{o.numel()} elements off, max |diff| {max_diff:.3g}"
                f" (atol {a:g}, rtol {t:g})"
            )
    return ""


def weak(ref: Any, atol: float | None, rtol: float | None) -> str:
    """Why a reference output would be matched by zeros or by a constant, or empty."""
    for r in as_tuple(ref):
        if r.numel() < 2:
            continue
        if not compare(torch.zeros_like(r), r, atol, rtol):
            return "reference matched by zeros"
        if not compare(torch.full_like(r, float(r.flatten()[0])), r, atol, rtol):
            return "reference matched by a constant"
    return ""


def run_native(case: Case, shape: Shape, fn: Callable[..., Any]) -> tuple[Any, Any, float, str]:
    """(reference output, candidate output, candidate call ms, problem with the inputs)."""
    module = case.module
    torch.manual_seed(0)
    if case.format == "kcoral":
        with torch.device(DEVICE):  # what the harness does with the item's device
            inputs = tuple(module.make_inputs(dict(shape.params)))
    else:
        inputs = tuple(module.make_inputs(dict(shape.params), DEVICE))
    originals = [x.clone() for x in inputs]
    ref = module.reference(*inputs)
    start = time.perf_counter()
    out = fn(*inputs)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    call_ms = (time.perf_counter() - start) * 1e3
    changed = [i for i, (x, x0) in enumerate(zip(inputs, originals)) if not torch.equal(x, x0)]
    return ref, out, call_ms, f"modified inputs {changed}" if changed else ""


def run_kernelbench(case: Case, shape: Shape, candidate: ModuleType) -> tuple[Any, Any, float, str]:
    module = case.module
    saved = {k: getattr(module, k) for k in shape.params}
    try:
        for k, v in shape.params.items():
            setattr(module, k, v)
        init_inputs = module.get_init_inputs()
        torch.manual_seed(0)
        model = module.Model(*init_inputs).to(DEVICE)
        torch.manual_seed(0)
        model_new = candidate.ModelNew(*init_inputs).to(DEVICE)
        torch.manual_seed(0)
        inputs = tuple(x.to(DEVICE) for x in module.get_inputs())
    finally:
        for k, v in saved.items():
            setattr(module, k, v)
    originals = [x.clone() for x in inputs]
    with torch.no_grad():
        ref = model(*inputs)
        start = time.perf_counter()
        out = model_new(*inputs)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        call_ms = (time.perf_counter() - start) * 1e3
    changed = [i for i, (x, x0) in enumerate(zip(inputs, originals)) if not torch.equal(x, x0)]
    return ref, out, call_ms, f"modified inputs {changed}" if changed else ""


def check_case(case: Case) -> tuple[list[Row], list[str]]:
    """(one row per candidate and shape, weak-shape errors)."""
    rows: list[Row] = []
    weak_errors: list[str] = []
    weak_checked: set[tuple[str, str]] = set()
    runners: dict[str, Any] = {}
    if case.format != "kernelbench" and hasattr(case.module, "baseline"):
        runners["(baseline)"] = case.module.baseline
    for cand_name, path in case.candidates.items():
        runners[cand_name] = import_file(path, f"_check_{case.name}_cand_{cand_name}")

    for cand_name, runner in runners.items():
        for shape in case.shapes:
            if shape.gpu_only and DEVICE == "cpu":
                rows.append(Row(case.name, cand_name, shape, "skip", detail="gpu_only"))
                continue
            try:
                if case.format == "kernelbench":
                    ref, out, call_ms, problem = run_kernelbench(case, shape, runner)
                else:
                    fn = runner
                    if not callable(runner):
                        fn = lambda *xs, m=runner: call_candidate(m, xs)  # noqa: E731
                    ref, out, call_ms, problem = run_native(case, shape, fn)
            except Exception as exc:  # a broken candidate is a failed row, not a crashed check
                last = traceback.extract_tb(exc.__traceback__)[-1]
                where = f"{Path(last.filename).name}:{last.lineno}"
                detail = f"raised {type(exc).__name__}: {exc} ({where})"
                rows.append(Row(case.name, cand_name, shape, "FAIL", detail=detail))
                continue
            _keep_alive.append((ref, out))
            if (shape.split, shape.label) not in weak_checked:
                weak_checked.add((shape.split, shape.label))
                why = weak(ref, case.atol, case.rtol)
                if why:
                    weak_errors.append(f"{case.name} [{shape.split} {shape.label}] is weak: {why}")
            problem = problem or compare(out, ref, case.atol, case.rtol)
            status = "FAIL" if problem else "pass"
            rows.append(Row(case.name, cand_name, shape, status, call_ms, problem))
    return rows, weak_errors


def verdicts(case: Case, rows: list[Row]) -> tuple[list[str], list[str]]:
    """(errors, seen-only notes) for one case's rows."""
    errors, notes = [], []
    seen_only = SEEN_ONLY.get(case.name, set())
    missing = seen_only - set(case.candidates)
    if missing:
        errors.append(f"{case.name}: seen-only candidates {sorted(missing)} not found")
    for cand_name in dict.fromkeys(r.candidate for r in rows):
        where = f"{case.name}::{cand_name}"
        mine = [r for r in rows if r.candidate == cand_name and r.status != "skip"]
        failed = [r for r in mine if r.status == "FAIL"]
        if cand_name in seen_only:
            seen_fails = [r for r in failed if r.shape.split == "seen"]
            unseen_fails = [r.shape.label for r in failed if r.shape.split == "unseen"]
            for r in seen_fails:
                errors.append(
                    f"{where} is seen-only but fails seen shape {r.shape.label}: {r.detail}"
                )
            if not unseen_fails:
                errors.append(f"{where} is seen-only but passes every unseen shape")
            else:
                notes.append(f"{where} (seen-only) fails unseen {', '.join(unseen_fails)}")
        else:
            for r in failed:
                errors.append(f"{where} [{r.shape.split} {r.shape.label}]: {r.detail}")
    return errors, notes


def main() -> int:
    folders = sorted(
        p for p in CASES_DIR.iterdir()
        if p.is_dir() and ((p / "case.py").is_file() or (p / "bench.json").is_file())
    )
    all_rows: list[Row] = []
    errors: list[str] = []
    notes: list[str] = []
    case_seconds: dict[str, float] = {}
    total_start = time.perf_counter()
    for folder in folders:
        start = time.perf_counter()
        try:
            case = load_case(folder)
        except Exception as exc:
            errors.append(f"{folder.name}: cannot load: {type(exc).__name__}: {exc}")
            continue
        rows, weak_errors = check_case(case)
        errors += weak_errors
        case_seconds[case.name] = time.perf_counter() - start
        case_errors, case_notes = verdicts(case, rows)
        errors += case_errors
        notes += case_notes
        all_rows += rows
        extra = f", {', '.join(case.notes)}" if case.notes else ""
        print(f"== {case.name} ({case.format}{extra}): {len(case.candidates)} candidates, "
              f"{sum(not s.gpu_only for s in case.shapes)} CPU-sized shapes, "
              f"{sum(s.gpu_only for s in case.shapes)} gpu_only, {case_seconds[case.name]:.1f} s")

    print()
    width = max((len(r.shape.label) for r in all_rows), default=5)
    cand_width = max((len(r.candidate) for r in all_rows), default=9)
    columns = f"{'case':<24} {'candidate':<{cand_width}} {'split':<6} {'shape':<{width}}"
    header = f"{columns} {'result':<6} {'call ms':>8}  detail"
    print(header)
    print("-" * len(header))
    for r in all_rows:
        ms = f"{r.call_ms:8.1f}" if r.status != "skip" else " " * 8
        columns = (
            f"{r.case:<24} {r.candidate:<{cand_width}} {r.shape.split:<6} {r.shape.label:<{width}}"
        )
        print(f"{columns} {r.status:<6} {ms}  {r.detail}".rstrip())

    counted = [r for r in all_rows if r.status != "skip"]
    print()
    print(f"{len(counted)} runs: {sum(r.status == 'pass' for r in counted)} pass, "
          f"{sum(r.status == 'FAIL' for r in counted)} fail; "
          f"{len(all_rows) - len(counted)} gpu_only skipped; "
          f"{time.perf_counter() - total_start:.1f} s total")
    for line in notes:
        print(f"ok: {line}")
    for line in errors:
        print(f"ERROR: {line}")
    print("check_cases: " + ("FAILED" if errors else "all good"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
