"""pytest-kcoral: grade GPU kernels as pytest items.

Importing this package never imports torch or touches a GPU; the public ``benchmark`` loads the
timing module on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def benchmark(fn: Any, *args: Any, **kwargs: Any) -> dict:
    """Time ``fn`` the way the grader does; see ``pytest_kcoral.timing.benchmark``."""
    from pytest_kcoral.timing import benchmark as _benchmark

    return _benchmark(fn, *args, **kwargs)


__all__ = ["__version__", "benchmark"]
