"""Imported by the template process (``isolation.TEMPLATE_PRELOAD``): the timers' optional libraries,
loaded once before the fork instead of in every child.

Importing cupti-python loads libcupti, a fixed cost in every child that the fork makes free;
cuda-bindings is cheap but rides along. Loading them does not initialize CUDA (which would break
every forked child), and CUPTI still times in a child forked after the load (``bench/startup.py``,
docs/performance.md, "Start-up: the preload's saving"). Either may be missing or broken:
the child's ``timing.prepare()`` then finds out for itself and says why, so nothing is raised here.
"""

from __future__ import annotations

for _module in ("cupti.cupti", "cuda.bindings.runtime"):
    try:
        __import__(_module)
    except Exception:  # noqa: BLE001, S110 - optional; the child reports what is missing
        pass
