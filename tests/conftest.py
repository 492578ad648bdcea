"""Shared helpers: build small case trees inside a pytester directory."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

# In-process pytester runs drop modules first imported inside them; torch must not be imported
# twice in one process (a second import crashes in native code), so import it here, up front.
# The same holds for the plugin's lazily imported modules: children are started with references
# to functions that must stay the ones in sys.modules.
import torch  # noqa: F401

import pytest_kcoral.items  # noqa: F401
import pytest_kcoral.pipeline  # noqa: F401

VECTOR_ADD_CASE = """
import torch
SEEN = [{"n": 256}]
UNSEEN = [{"n": 257}]
TIER = 2

def make_inputs(shape, device):
    n = shape["n"]
    return torch.randn(n, device=device), torch.randn(n, device=device)

def reference(a, b):
    return a + b
"""

TORCH_ADD = "def run(a, b):\n    return a + b\n"


@pytest.fixture(autouse=True)
def a_session_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees the environment of a plain session, also when this run is an xdist worker.

    xdist sets ``PYTEST_XDIST_WORKER`` and friends in its workers, and a pytester run or a pytest
    subprocess inherits them: a test of ``--lf`` or ``-x`` would then check a different session
    under ``-n 2`` (the README's command) than when run alone."""
    for name in list(os.environ):
        if name.startswith("PYTEST_XDIST_"):
            monkeypatch.delenv(name)


@pytest.fixture
def make_case(pytester: pytest.Pytester):
    """``make_case("cases/add", case_src, {"good": src})`` writes a case folder and its candidates."""

    def make(folder: str, case_src: str = VECTOR_ADD_CASE, candidates: dict[str, str] | None = None,
             files: dict[str, str] | None = None) -> Path:
        root = pytester.path / folder
        (root / "candidates").mkdir(parents=True, exist_ok=True)
        if case_src is not None:
            (root / "case.py").write_text(textwrap.dedent(case_src))
        for name, src in (candidates or {"good": TORCH_ADD}).items():
            (root / "candidates" / f"{name}.py").write_text(textwrap.dedent(src))
        for name, src in (files or {}).items():
            (root / name).write_text(textwrap.dedent(src))
        return root

    return make


@pytest.fixture
def run_kcoral(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run pytest-kcoral in process on the pytester directory (children are real processes).

    These runs grade on the CPU, also on a GPU host, so they assert the same things everywhere:
    the GPU paths have their own tests under ``tests/gpu``, which start pytest in a subprocess.
    """
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest("-p", "kcoral", "-p", "no:cacheprovider", "--kcoral-timing-budget", "0.02", *args)

    return run
