"""Timing: one interface over the CUPTI, CUDA-events and wall-clock timers.

``measure`` is what the stage runner calls inside a child process; ``benchmark`` is the public
wrapper (``pytest_kcoral.benchmark``). Both return the same statistics.

(Stub: wall clock only. The CUPTI and events timers replace this body behind the same signature.)
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from pytest_kcoral.results import TimingStats


def measure(
    call: Callable[[int], Any],
    *,
    n_sets: int,
    refresh: Callable[[int], None] | None = None,
    on_output: Callable[[int, Any], None] | None = None,
    device: str = "cpu",
    method: str | None = None,
    warmup_s: float = 0.05,
    budget_s: float = 1.0,
    min_samples: int = 5,
    max_samples: int = 1000,
) -> TimingStats:
    """Time ``call(i)`` for input sets ``i`` in ``range(n_sets)``, rotating through them.

    ``refresh(i)`` gives set ``i`` fresh values and runs outside the timed window, before every
    timed call. ``on_output(i, out)`` receives each timed call's output, also outside the window,
    so the caller can verify it. ``method`` forces a timer ("cupti", "events", "wall"); None picks
    the best one available for ``device``.
    """
    call(0)  # first untimed call: JIT, autotune, lazy loading
    samples_us: list[float] = []
    deadline_warm = time.perf_counter() + warmup_s
    i = 0
    while time.perf_counter() < deadline_warm:
        call(i % n_sets)
        i += 1
    deadline = time.perf_counter() + budget_s
    i = 0
    while len(samples_us) < max_samples and (len(samples_us) < min_samples or time.perf_counter() < deadline):
        k = i % n_sets
        if refresh is not None:
            refresh(k)
        t0 = time.perf_counter()
        out = call(k)
        t1 = time.perf_counter()
        if on_output is not None:
            on_output(k, out)
        samples_us.append((t1 - t0) * 1e6)
        i += 1
    samples_us.sort()
    q = statistics.quantiles(samples_us, n=4) if len(samples_us) >= 2 else [samples_us[0]] * 3
    return TimingStats(
        method="wall",
        median_us=statistics.median(samples_us),
        iqr_us=q[2] - q[0],
        min_us=samples_us[0],
        n=len(samples_us),
    )
