"""Which devices this session grades on, and the host-wide identity each one is locked by.

Discovery never creates a CUDA context in the pytest process (a context there would pin memory on
every GPU and break forked children): GPUs are listed with ``nvidia-smi`` and mapped through
``CUDA_VISIBLE_DEVICES`` the way the CUDA driver does. Only when ``nvidia-smi`` is unavailable does
it ask ``torch.cuda.device_count()``.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

NVIDIA_SMI_QUERY = ("--query-gpu=index,uuid,name", "--format=csv,noheader")
NVIDIA_SMI_TIMEOUT_S = 15.0
TORCH_COUNT_TIMEOUT_S = 120.0
# Device nodes of the NVIDIA driver, WSL's GPU paravirtualization and ROCm (torch.cuda on AMD).
GPU_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg", "/dev/kfd")
CPU_LOCK_KEY = "cpu"


@dataclass(frozen=True)
class DeviceSpec:
    """One device the harness can lease.

    ``name`` is what torch and the harness use in this process ("cpu" or "cuda:<i>", ``i`` an index
    into the devices visible here). ``lock_key`` names the physical device host-wide (the GPU or MIG
    UUID when known), so sessions that see the GPUs in different orders still lock the same file for
    the same GPU. ``host_index`` is the GPU's number on the host (``nvidia-smi``'s index), the same
    in every session whatever ``CUDA_VISIBLE_DEVICES`` says; None where it is not known (a MIG
    instance, a GPU named by UUID without ``nvidia-smi``).
    """

    name: str
    lock_key: str
    label: str
    host_index: int | None = None

    @property
    def is_cuda(self) -> bool:
        return self.name.startswith("cuda")

    @property
    def timing_slot(self) -> int | None:
        """Which timing core this device's timing uses (``timing/pinning.py``): its host-wide
        number, so that two sessions timing different GPUs never share a core; the index among the
        visible devices where that number is unknown; None for the CPU."""
        if not self.is_cuda:
            return None
        if self.host_index is not None:
            return self.host_index
        return int(self.name.partition(":")[2] or 0)


@dataclass(frozen=True)
class GpuRow:
    """One line of ``nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader``."""

    index: int
    uuid: str
    name: str


def parse_nvidia_smi(text: str) -> list[GpuRow]:
    """Parse the CSV that ``nvidia-smi`` prints; lines that do not parse are skipped."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1]:
            continue
        rows.append(GpuRow(int(parts[0]), parts[1], parts[2]))
    return rows


def query_nvidia_smi() -> list[GpuRow] | None:
    """The host's GPUs in ``nvidia-smi`` order, or None when ``nvidia-smi`` is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return parse_nvidia_smi(proc.stdout)


def map_visible_gpus(rows: Sequence[GpuRow], cuda_visible_devices: str | None) -> list[DeviceSpec]:
    """The GPUs CUDA shows this process, given the host's ``nvidia-smi`` rows.

    Follows the driver's rules: unset means every GPU; an empty string means none; entries are
    physical indices or ``GPU-``/``MIG-`` UUID prefixes; the first entry that is invalid (unknown,
    ambiguous, repeated, negative) ends the list, so ``CUDA_VISIBLE_DEVICES=-1`` hides every GPU.
    Integer entries are read in ``nvidia-smi`` (PCI bus) order, which is CUDA's order with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and, on hosts with identical GPUs, with the default order too.
    """
    chosen: list[tuple[str, str, int | None]]
    if cuda_visible_devices is None:
        chosen = [(row.uuid, row.name, row.index) for row in rows]
    else:
        chosen = []
        for raw in cuda_visible_devices.split(","):
            entry = raw.strip()
            found = _match_entry(rows, entry)
            if found is None or found[0] in (key for key, _, _ in chosen):
                break
            chosen.append(found)
    return [DeviceSpec(f"cuda:{i}", key, label, index) for i, (key, label, index) in enumerate(chosen)]


def _match_entry(rows: Sequence[GpuRow], entry: str) -> tuple[str, str, int | None] | None:
    """(lock key, label, host index) for one ``CUDA_VISIBLE_DEVICES`` entry, or None when CUDA
    would stop."""
    if not entry:
        return None
    if re.fullmatch(r"\d+", entry):
        for row in rows:
            if row.index == int(entry):
                return row.uuid, row.name, row.index
        return None
    if entry.startswith("MIG-"):
        # MIG instances are not listed by --query-gpu; the instance itself is the locked device.
        # The legacy form MIG-GPU-<uuid>/<gi>/<ci> names its parent GPU, which gives the label. Its
        # host index stays unknown: instances of one GPU are leased apart and must not share a core.
        parent = entry[len("MIG-"):].split("/", 1)[0]
        names = [row.name for row in rows if parent.startswith("GPU-") and row.uuid.startswith(parent)]
        return entry, f"{names[0]} MIG" if names else "MIG instance", None
    if entry.startswith("GPU-"):
        matches = [row for row in rows if row.uuid.startswith(entry)]
        if len(matches) == 1:
            return matches[0].uuid, matches[0].name, matches[0].index
    return None


def fallback_torch_gpus(environ: Mapping[str, str] = os.environ) -> list[DeviceSpec]:
    """Without ``nvidia-smi``: count GPUs with torch and key them by index (not UUID).

    The count runs in a child process: ``torch.cuda.device_count()`` initializes the CUDA driver,
    after which forking the pytest process is unsafe, and importing torch here would tie the
    plugin's import time to torch's. Without any sign of a GPU driver the child is not started.
    """
    import importlib.util

    if importlib.util.find_spec("torch") is None or not gpu_driver_present():
        return []
    cuda_visible_devices = environ.get("CUDA_VISIBLE_DEVICES")
    child_env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if cuda_visible_devices is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
            capture_output=True, text=True, timeout=TORCH_COUNT_TIMEOUT_S, env=child_env,
        )
        count = int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else 0
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return []
    # Physical indices when CUDA_VISIBLE_DEVICES names them, so sessions agree on the key.
    entries = [e.strip() for e in (cuda_visible_devices or "").split(",")][:count]
    known = cuda_visible_devices is None or (len(entries) == count and all(e.isdigit() for e in entries))
    physical = [int(e) for e in entries] if cuda_visible_devices is not None and known else list(range(count))
    return [DeviceSpec(f"cuda:{i}", f"cuda-index-{physical[i]}", "CUDA GPU", physical[i] if known else None)
            for i in range(count)]


def gpu_driver_present() -> bool:
    return any(os.path.exists(p) for p in GPU_DRIVER_PATHS)


def cpu_model() -> str:
    """A human-readable CPU name, e.g. "AMD EPYC 9654 96-Core Processor"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def cpu_device() -> DeviceSpec:
    return DeviceSpec("cpu", CPU_LOCK_KEY, cpu_model())


def all_visible_devices(environ: Mapping[str, str] = os.environ) -> list[DeviceSpec]:
    """Every GPU visible to this process, or the CPU alone when there is none."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    rows = query_nvidia_smi()
    gpus = map_visible_gpus(rows, cvd) if rows is not None else fallback_torch_gpus(environ)
    return gpus or [cpu_device()]


def host_timing_slots(selected: Sequence[DeviceSpec]) -> list[int]:
    """The timing slots of every GPU on this host, not only the selected ones: each session keeps
    the timing cores of all of them free, so that its compiles never land on a core another
    session is timing on (``timing/pinning.py``)."""
    rows = query_nvidia_smi() or []
    slots = {row.index for row in rows} | {d.timing_slot for d in selected if d.timing_slot is not None}
    return sorted(slots)


def select_devices(visible: Sequence[DeviceSpec], devices_option: str | None) -> list[DeviceSpec]:
    """Apply ``--kcoral-devices 0,1`` (indices into ``visible``) to the visible devices."""
    if devices_option is None:
        return list(visible)
    text = devices_option.strip()
    entries = [e.strip() for e in text.split(",")] if text else []
    if not entries or not all(re.fullmatch(r"\d+", e) for e in entries):
        raise pytest.UsageError(
            f"--kcoral-devices {devices_option!r}: expected comma-separated device indices, e.g. 0,1"
        )
    indices = [int(e) for e in entries]
    if len(set(indices)) != len(indices):
        raise pytest.UsageError(f"--kcoral-devices {devices_option!r}: a device is listed twice")
    names = ", ".join(f"{i}={d.name}" for i, d in enumerate(visible))
    for i in indices:
        if i >= len(visible):
            raise pytest.UsageError(
                f"--kcoral-devices {devices_option!r}: index {i} is out of range; "
                f"{len(visible)} visible device(s): {names}"
            )
    return [visible[i] for i in indices]


def visible_devices(devices_option: str | None, environ: Mapping[str, str] = os.environ) -> list[DeviceSpec]:
    """The devices to grade on: all visible ones, or those ``--kcoral-devices`` selects."""
    return select_devices(all_visible_devices(environ), devices_option)
