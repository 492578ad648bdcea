"""What the session ran on: host, Python, package versions, GPUs, driver, CUDA and clocks.

Recorded in the JSON artifact so a saved run can be compared with another one knowingly. Runs in
the pytest process, so it never imports torch (importing it is slow, and nothing here may
initialize CUDA): versions come from package metadata and GPU facts from ``nvidia-smi``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# Distribution names, keyed by how the JSON names them.
PACKAGES = {
    "pytest-kcoral": "pytest-kcoral",
    "pytest": "pytest",
    "pytest-xdist": "pytest-xdist",
    "torch": "torch",
    "triton": "triton",
    "cupti-python": "cupti-python",
    "kcoral": "kcoral",
}

GPU_QUERY_FIELDS = ("name", "uuid", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem")
NVIDIA_SMI_TIMEOUT_S = 10.0


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_cuda_version() -> str | None:
    """``torch.version.cuda``, read from torch's ``version.py`` without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        try:
            text = path.read_text()
        except OSError:
            continue
        m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        return m.group(1) if m else None
    return None


def _run(args: list[str]) -> str | None:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _number(text: str) -> float | None:
    m = re.search(r"[-+]?\d+(?:\.\d+)?", text)
    return float(m.group(0)) if m else None


def parse_gpu_query(csv_text: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader``."""
    gpus = []
    for index, line in enumerate(csv_text.strip().splitlines()):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(GPU_QUERY_FIELDS):
            continue
        name, uuid, driver, sm, max_sm, mem = cells
        gpus.append({
            "index": index,
            "name": name,
            "uuid": uuid,
            "driver_version": driver,
            "clock_sm_mhz": _number(sm),
            "clock_max_sm_mhz": _number(max_sm),
            "clock_mem_mhz": _number(mem),
        })
    return gpus


def parse_cuda_version(header_text: str) -> str | None:
    """The ``CUDA Version: 12.8`` of ``nvidia-smi``'s banner (what the driver supports)."""
    m = re.search(r"CUDA Version:\s*([\d.]+)", header_text)
    return m.group(1) if m else None


def gpu_info() -> dict[str, Any]:
    """GPUs, driver and driver CUDA version; empty lists and None where ``nvidia-smi`` is absent."""
    smi = shutil.which("nvidia-smi")
    info: dict[str, Any] = {"gpus": [], "driver_version": None, "cuda_driver_version": None}
    if smi is None:
        return info
    query = _run([smi, f"--query-gpu={','.join(GPU_QUERY_FIELDS)}", "--format=csv,noheader"])
    if query:
        info["gpus"] = parse_gpu_query(query)
        if info["gpus"]:
            info["driver_version"] = info["gpus"][0]["driver_version"]
    banner = _run([smi])
    if banner:
        info["cuda_driver_version"] = parse_cuda_version(banner)
    return info


def collect_environment() -> dict[str, Any]:
    """The environment section of the JSON artifact."""
    gpus = gpu_info()
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "packages": {key: package_version(dist) for key, dist in PACKAGES.items()},
        "torch_cuda": torch_cuda_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **gpus,
    }
