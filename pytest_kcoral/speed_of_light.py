"""The speed-of-light report: what a kernel achieved against what its case says it must do.

A case that declares ``cost(shape)`` (``{"flops": ..., "bytes": ...}``) gets, per timed item, the
baseline's and the candidate's achieved rates (TFLOP/s and GB/s, from their median times) and, on a
GPU whose DRAM bandwidth is on the spec sheet (``physical_floor.GPU_PEAK_BYTES_PER_S``), the share
of that peak the candidate reached and the time moving its bytes at the peak would take. A
memory-bound kernel at 90% of the peak has little left to win, whatever its speedup says; one at
20% has room. No FLOP/s peak is given: it depends on the dtype and on whether tensor cores apply,
which ``cost`` does not say.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

COST_KEYS = ("flops", "bytes")


def _count(value: Any) -> bool:
    """A usable count: a real number (numpy's included), finite and not negative; not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and float(value) >= 0


def valid_cost(cost: Any) -> dict[str, float] | None:
    """``cost(shape)``'s answer with its usable entries: finite, positive ``flops`` and ``bytes``
    (either may be missing; a zero is allowed and gives no rate); None when neither is usable."""
    if not isinstance(cost, dict):
        return None
    usable = {key: float(cost[key]) for key in COST_KEYS if _count(cost.get(key)) and cost[key] > 0}
    return usable or None


def cost_problem(cost: Any) -> str | None:
    """What is wrong with ``cost(shape)``'s answer, for the case's author; None when nothing is."""
    if not isinstance(cost, dict):
        return f"returned a {type(cost).__name__}, expected a dict like {{\"flops\": ..., \"bytes\": ...}}"
    unknown = sorted(str(k) for k in cost if k not in COST_KEYS)
    if unknown:
        return f"returned unknown keys {', '.join(unknown)} (known: flops, bytes)"
    bad = [f"{key}={cost[key]!r}" for key in COST_KEYS if key in cost and not _count(cost[key])]
    if bad:
        return f"returned {', '.join(bad)}: counts must be finite numbers, not negative"
    return None


def report(cost: dict[str, float] | None, peak_bytes_per_s: float | None, t_baseline_us: float | None,
           t_candidate_us: float | None) -> dict[str, Any] | None:
    """The item's speed-of-light figures (None without a usable cost or a candidate time)."""
    if not cost or not t_candidate_us or t_candidate_us <= 0:
        return None
    flops, nbytes = cost.get("flops"), cost.get("bytes")
    out: dict[str, Any] = {"flops": flops, "bytes": nbytes}
    for side, t_us in (("candidate", t_candidate_us), ("baseline", t_baseline_us)):
        seconds = t_us * 1e-6 if t_us and t_us > 0 else None
        out[f"{side}_tflops"] = flops / seconds / 1e12 if flops and seconds else None
        out[f"{side}_gbps"] = nbytes / seconds / 1e9 if nbytes and seconds else None
    out["peak_gbps"] = peak_bytes_per_s / 1e9 if peak_bytes_per_s else None
    out["memory_bound_us"] = nbytes / peak_bytes_per_s * 1e6 if nbytes and peak_bytes_per_s else None
    out["candidate_of_peak"] = (out["candidate_gbps"] / out["peak_gbps"]) if out["candidate_gbps"] and out["peak_gbps"] else None
    return out


def largest_shape(items: Sequence[Any]) -> dict[str, Any] | None:
    """A (case, candidate) pair's figures on its largest correct seen shape (most bytes, then most
    flops): where a kernel's distance from the peak shows, rather than its launch overhead.
    ``items`` are ``ItemResult``; the figures gain the shape's ``shape_id``."""
    rated = [it for it in items if it.split == "seen" and it.correct is True and it.speed_of_light]
    if not rated:
        return None
    best = max(rated, key=lambda it: (it.speed_of_light.get("bytes") or 0.0, it.speed_of_light.get("flops") or 0.0))
    return dict(best.speed_of_light, shape_id=best.shape_id)
