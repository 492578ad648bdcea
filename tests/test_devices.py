"""Device discovery: CUDA_VISIBLE_DEVICES mapping (fed with nvidia-smi rows, since this machine may
have no GPU), --kcoral-devices selection, and the real CPU path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_kcoral
from pytest_kcoral.devices import (
    DeviceSpec,
    GpuRow,
    cpu_device,
    fallback_torch_gpus,
    host_timing_slots,
    map_visible_gpus,
    parse_nvidia_smi,
    query_nvidia_smi,
    select_devices,
    visible_devices,
)

NVIDIA_SMI_OUTPUT = """\
0, GPU-aaaa1111-0000-0000-0000-000000000000, NVIDIA H200
1, GPU-bbbb2222-0000-0000-0000-000000000000, NVIDIA H200
2, GPU-bbbb3333-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3
"""
ROWS = parse_nvidia_smi(NVIDIA_SMI_OUTPUT)
UUID0, UUID1, UUID2 = (r.uuid for r in ROWS)
REPO_ROOT = Path(pytest_kcoral.__file__).resolve().parents[1]

needs_no_gpu = pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has nvidia-smi")


def keys(devices: list[DeviceSpec]) -> list[str]:
    return [d.lock_key for d in devices]


def test_parse_nvidia_smi_skips_junk() -> None:
    rows = parse_nvidia_smi(NVIDIA_SMI_OUTPUT + "\nNo devices were found\n")
    assert rows[0] == GpuRow(0, UUID0, "NVIDIA H200")
    assert [r.index for r in rows] == [0, 1, 2]
    assert rows[2].name == "NVIDIA H100 80GB HBM3"


def test_unset_means_every_gpu_in_order() -> None:
    devices = map_visible_gpus(ROWS, None)
    assert [d.name for d in devices] == ["cuda:0", "cuda:1", "cuda:2"]
    assert keys(devices) == [UUID0, UUID1, UUID2]
    assert devices[0].label == "NVIDIA H200"


def test_empty_string_means_no_gpu() -> None:
    assert map_visible_gpus(ROWS, "") == []


def test_reordered_indices_lock_the_same_physical_gpu() -> None:
    a = map_visible_gpus(ROWS, "0,1")
    b = map_visible_gpus(ROWS, "1,0")
    assert [d.name for d in b] == ["cuda:0", "cuda:1"]
    assert keys(b) == [UUID1, UUID0]  # cuda:0 of session b is physical GPU 1
    assert set(keys(a)) == set(keys(b))


def test_uuid_prefixes_and_whitespace() -> None:
    devices = map_visible_gpus(ROWS, " GPU-bbbb3 , 0")
    assert keys(devices) == [UUID2, UUID0]
    assert devices[0].label == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("cvd", "expected"),
    [
        ("0,7,1", [UUID0]),  # unknown index ends the list, as in the driver
        ("-1", []),  # the usual way to hide every GPU
        ("2,GPU-bbbb,0", [UUID2]),  # ambiguous prefix
        ("1,1,0", [UUID1]),  # repeated device
        ("1,GPU-ffff", [UUID1]),  # no such UUID
        ("0,,1", [UUID0]),
    ],
)
def test_invalid_entry_ends_the_list(cvd: str, expected: list[str]) -> None:
    assert keys(map_visible_gpus(ROWS, cvd)) == expected


def test_mig_instances_are_their_own_lock_keys() -> None:
    mig = "MIG-0c2f4a4e-7e1f-5b3c-9d2a-0123456789ab"
    legacy = f"MIG-{UUID1}/1/0"
    devices = map_visible_gpus(ROWS, f"{mig},{legacy}")
    assert keys(devices) == [mig, legacy]
    assert devices[1].label == "NVIDIA H200 MIG"


def test_timing_slots_follow_the_physical_gpu_not_the_visible_index() -> None:
    # two sessions, one on GPU 0 and one on GPU 1, each seeing its GPU as cuda:0: their timing must
    # not land on one core, so the slot is the host's number for the GPU
    (first,) = map_visible_gpus(ROWS, "0")
    (second,) = map_visible_gpus(ROWS, "1")
    assert first.name == second.name == "cuda:0"
    assert (first.timing_slot, second.timing_slot) == (0, 1)
    assert [d.timing_slot for d in map_visible_gpus(ROWS, f"2,{UUID0[:8]}")] == [2, 0]
    assert [d.timing_slot for d in map_visible_gpus(ROWS, None)] == [0, 1, 2]
    # --kcoral-devices picks among the visible devices and keeps the host's number
    (picked,) = select_devices(map_visible_gpus(ROWS, "2,1"), "1")
    assert (picked.name, picked.timing_slot) == ("cuda:1", 1)
    # unknown host number (a MIG instance): the visible index, as before; the CPU has none
    mig = map_visible_gpus(ROWS, "0,MIG-0c2f4a4e-7e1f-5b3c-9d2a-0123456789ab")
    assert [(d.host_index, d.timing_slot) for d in mig] == [(0, 0), (None, 1)]
    assert cpu_device().timing_slot is None


def test_every_gpu_of_the_host_keeps_its_timing_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a session on GPU 1 keeps the timing cores of GPUs 0 and 2 free too: another session times there
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{NVIDIA_SMI_OUTPUT}EOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    selected = map_visible_gpus(ROWS, "1")
    assert host_timing_slots(selected) == [0, 1, 2]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no nvidia-smi: the selected GPUs' slots
    assert host_timing_slots(selected) == [1]
    assert host_timing_slots([cpu_device()]) == []


def test_select_devices_by_index() -> None:
    visible = map_visible_gpus(ROWS, None)
    assert select_devices(visible, None) == visible
    assert select_devices(visible, "2,0") == [visible[2], visible[0]]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("3", "--kcoral-devices '3': index 3 is out of range; 3 visible device(s)"),
        ("a,b", "expected comma-separated device indices"),
        ("", "expected comma-separated device indices"),
        ("1,1", "a device is listed twice"),
    ],
)
def test_select_devices_rejects(option: str, message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        select_devices(map_visible_gpus(ROWS, None), option)


@needs_no_gpu
def test_cpu_only_machine_is_one_cpu_device() -> None:
    devices = visible_devices(None)
    assert devices == [cpu_device()]
    assert devices[0].name == "cpu" and devices[0].lock_key == "cpu" and devices[0].label
    assert visible_devices("0") == devices
    assert fallback_torch_gpus({}) == []  # no GPU driver here
    with pytest.raises(pytest.UsageError, match=r"index 1 is out of range; 1 visible device\(s\): 0=cpu"):
        visible_devices("1")


def test_hidden_gpus_fall_back_to_the_cpu() -> None:
    assert visible_devices(None, environ={"CUDA_VISIBLE_DEVICES": ""}) == [cpu_device()]


def test_bad_devices_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest_subprocess("-p", "kcoral", "-p", "pytest_kcoral.lease_plugin", "--kcoral-devices", "5")
    result.stderr.fnmatch_lines(["ERROR: --kcoral-devices '5': index 5 is out of range; * visible device(s)*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


UUIDS_SEEN_BY_CUDA = """
import json, torch
from pytest_kcoral.devices import visible_devices
print(json.dumps({
    "harness": [[d.name, d.lock_key] for d in visible_devices(None)],
    "torch": [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())],
}))
"""


def needs_nvidia_gpus(n: int) -> list[str]:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("needs nvidia-smi")
    rows = query_nvidia_smi() or []
    if len(rows) < n:
        pytest.skip(f"needs {n} NVIDIA GPU(s)")
    return [row.uuid for row in rows]


def uuids_seen_by_cuda(cuda_visible_devices: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    out = subprocess.run([sys.executable, "-c", UUIDS_SEEN_BY_CUDA], env=env, capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return json.loads(out.splitlines()[-1])


def bare(uuid: str) -> str:
    return uuid.removeprefix("GPU-")


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["unset", "reversed", "uuids"])
def test_lock_keys_are_the_uuids_cuda_reports(order: str) -> None:
    """On a GPU host: cuda:<i> in the harness is the GPU CUDA calls device i, whatever the order."""
    uuids = needs_nvidia_gpus(1)
    pytest.importorskip("torch")
    cvd = {"unset": None, "reversed": ",".join(str(i) for i in reversed(range(len(uuids)))),
           "uuids": ",".join(u[:12] for u in reversed(uuids))}[order]
    seen = uuids_seen_by_cuda(cvd)
    assert [name for name, _ in seen["harness"]] == [f"cuda:{i}" for i in range(len(seen["torch"]))]
    assert [bare(key) for _, key in seen["harness"]] == [bare(u) for u in seen["torch"]]
    if order != "unset":
        assert [key for _, key in seen["harness"]] == list(reversed(uuids))


@pytest.mark.gpu
def test_auto_starts_one_worker_per_gpu(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    uuids = needs_nvidia_gpus(1)
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    pytester.makepyfile(
        """
        import pytest
        @pytest.mark.parametrize("i", range(4))
        def test_device(gpu_lease, i):
            assert gpu_lease.device.name.startswith("cuda:")
        """
    )
    result = pytester.runpytest_subprocess("-p", "kcoral", "-p", "pytest_kcoral.lease_plugin", "-n", "auto",
                                           "--kcoral-lease-dir", str(pytester.path / "leases"))
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([f"created: {len(uuids)}/{len(uuids)} workers*"])
