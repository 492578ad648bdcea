"""The physical floor: no kernel moves ``cost(shape)["bytes"]`` faster than the memory allows.

When a case declares ``cost``, the trusted child works out a floor for the item's device and the
pipeline fails a candidate whose median time is below it (a timer fooled, work skipped or done
elsewhere). Honest kernels must never trip it, so the floor is generous:

- GPU: ``bytes / (peak DRAM bandwidth x GPU_MARGIN)``, with the peak from a table of known devices
  (spec sheets) or, for a device not in it, twice a measured device-to-device copy bandwidth.
- CPU: there is no spec sheet to trust (caches, threads, turbo), so the floor is calibrated on the
  spot: ``bytes / max(measured copy bandwidth of the same bytes x CPU_MARGIN, 100 GB/s)``; the
  fixed 100 GB/s keeps a host slowed by other work during the calibration from raising the floor.

The pipeline applies the floor only when the baseline itself is above it: a baseline below the
floor means the case's ``cost`` overstates the bytes, and then the floor says nothing.
"""

from __future__ import annotations

import time
from typing import Any

GPU_MARGIN = 1.25
CPU_MARGIN = 4.0
CPU_MIN_BYTES_PER_S = 100e9  # the floor never assumes a CPU slower than this
_MIN_COPIES = 20
_MEASURE_MAX_BYTES = 256 << 20
_MEASURE_S = 0.02

# Peak DRAM bandwidth in bytes/s by a substring of the device name, most specific first.
GPU_PEAK_BYTES_PER_S: tuple[tuple[str, float], ...] = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("H800", 3.35e12),
    ("B200", 8.0e12),
    ("GH200", 4.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
    ("L40", 0.864e12),
    ("L4", 0.3e12),
    ("A10", 0.6e12),
    ("RTX 4090", 1.008e12),
    ("RTX 3090", 0.936e12),
    ("V100", 0.9e12),
    ("T4", 0.32e12),
)


def measure(nbytes: float, device: str) -> dict[str, Any]:
    """The floor for moving ``nbytes`` on ``device``: ``{"bytes", "peak_bytes_per_s", "floor_us", "how",
    "spec_bytes_per_s"}``; the last is the spec sheet's DRAM bandwidth (no margin), None where the
    device is not in the table or is a CPU."""
    spec = None
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
        for key, peak in GPU_PEAK_BYTES_PER_S:
            if key in name:
                how = f"{name}: spec-sheet peak {peak / 1e12:.3g} TB/s x {GPU_MARGIN}"
                spec = peak
                break
        else:
            peak = 2.0 * _copy_bandwidth(_MEASURE_MAX_BYTES, device)
            how = f"{name}: 2 x measured copy bandwidth {peak / 2e12:.3g} TB/s x {GPU_MARGIN}"
        bandwidth = peak * GPU_MARGIN
    else:
        measured = _copy_bandwidth(nbytes, device)
        # a busy host slows the calibration copy more than a kernel timed at another moment
        bandwidth = max(measured * CPU_MARGIN, CPU_MIN_BYTES_PER_S)
        how = f"CPU: max(measured copy bandwidth of the same bytes {measured / 1e9:.3g} GB/s x {CPU_MARGIN}, {CPU_MIN_BYTES_PER_S / 1e9:g} GB/s)"
    return {"bytes": nbytes, "peak_bytes_per_s": bandwidth, "floor_us": nbytes / bandwidth * 1e6, "how": how,
            "spec_bytes_per_s": spec}


def _copy_bandwidth(nbytes: float, device: str) -> float:
    """Bytes moved per second (read plus write) by the best of repeated ``copy_`` calls."""
    import torch

    half = max(int(min(nbytes, _MEASURE_MAX_BYTES) // 2), 64)
    src = torch.ones(half, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = float("inf")
    dst.copy_(src)
    sync()
    until = time.perf_counter() + _MEASURE_S
    for i in range(10_000):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - t0)
        if i >= _MIN_COPIES and time.perf_counter() > until:
            break
    return 2 * half / max(best, 1e-9)
