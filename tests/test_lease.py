"""The host-wide device lease, with real processes and real locks."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import pytest_kcoral
from pytest_kcoral import lease_plugin, stash
from pytest_kcoral.devices import DeviceSpec
from pytest_kcoral.lease import (
    LeaseError,
    LeaseManager,
    LeaseRepaired,
    LeaseTimeout,
    default_lease_dir,
    worker_preferred_index,
)

REPO_ROOT = Path(pytest_kcoral.__file__).resolve().parents[1]
CPU = DeviceSpec("cpu", "cpu", "test CPU")
DEV_A = DeviceSpec("cpu", "fake-a", "fake device a")
DEV_B = DeviceSpec("cpu", "fake-b", "fake device b")
PLUGINS = ("-p", "kcoral", "-p", "pytest_kcoral.lease_plugin")


def child_env(**extra: str) -> dict[str, str]:
    """Children import this checkout of pytest_kcoral, not whatever is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def assert_disjoint(intervals: list[tuple[float, float]]) -> None:
    intervals = sorted(intervals)
    for (start, end), (next_start, next_end) in zip(intervals, intervals[1:]):
        assert start <= end and next_start <= next_end
        assert end <= next_start, f"[{start}, {end}] overlaps [{next_start}, {next_end}]"


CONTENDER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from pytest_kcoral.devices import DeviceSpec
    from pytest_kcoral.lease import LeaseManager

    lease_dir, name = sys.argv[1], sys.argv[2]
    manager = LeaseManager([DeviceSpec("cpu", "cpu", "test CPU")], Path(lease_dir), 20.0, holder=name)
    print("ready", flush=True)
    sys.stdin.readline()  # both start together, however long each took to start
    for i in range(20):
        with manager.lease(label=f"{name}-{i}"):
            time.sleep(0.004)
        time.sleep(0.002)
    print(json.dumps(manager.history))
    """
)


def test_two_processes_take_turns(tmp_path: Path) -> None:
    script = tmp_path / "contender.py"
    script.write_text(CONTENDER)
    procs = [
        subprocess.Popen([sys.executable, str(script), str(tmp_path / "leases"), name],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
        for name in ("one", "two")
    ]
    assert [p.stdout.readline() for p in procs if p.stdout is not None] == ["ready\n"] * 2
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    histories = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    records = histories[0] + histories[1]
    assert len(records) == 40
    assert {r["holder"] for r in histories[1]} == {"two"}
    assert_disjoint([(r["t_acquired"], r["t_released"]) for r in records])
    assert max(r["wait_ms"] for r in records) > 1.0  # they did contend
    for r in records:
        assert r["held_ms"] >= 3.0 and r["lock_key"] == "cpu" and r["device"] == "cpu"


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pytest_kcoral.devices import DeviceSpec
    from pytest_kcoral.lease import LeaseManager

    manager = LeaseManager([DeviceSpec("cpu", "cpu", "test CPU")], Path(sys.argv[1]), 5.0, holder="victim-session")
    with manager.lease(label="tests/test_x.py::test_hang"):
        print("held", flush=True)
        time.sleep(60)
    """
)


def test_sigkilled_holder_frees_the_device(tmp_path: Path) -> None:
    lease_dir = tmp_path / "leases"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), str(lease_dir)], stdout=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        waiter = LeaseManager([CPU], lease_dir, 0.2, holder="waiter")
        with pytest.raises(LeaseTimeout) as excinfo:
            with waiter.lease():
                pass
        message = str(excinfo.value)
        assert f"pid {proc.pid}" in message and "victim-session" in message and "test_hang" in message
        assert excinfo.value.holders["cpu"]["pid"] == proc.pid

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        t0 = time.monotonic()
        with LeaseManager([CPU], lease_dir, 5.0, holder="next").lease() as lease:
            taken_s = time.monotonic() - t0
            assert lease.device == CPU
            assert waiter.read_holder(CPU)["holder"] == "next"  # the dead holder's sidecar is replaced
        assert taken_s < 0.5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_timeout_names_devices_dir_wait_and_holder(tmp_path: Path) -> None:
    lease_dir = tmp_path / "leases"
    holder = LeaseManager([DEV_A, DEV_B], lease_dir, None, holder="holder-session")
    other = LeaseManager([DEV_A, DEV_B], lease_dir, None, holder="holder-two")
    waiter = LeaseManager([DEV_A, DEV_B], lease_dir, 0.15, holder="waiter")
    held = threading.Event()
    done = threading.Event()

    def hold_b() -> None:
        with other.lease(preferred=1, label="item-b"):
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold_b)
    thread.start()
    try:
        assert held.wait(10)
        with holder.lease(preferred=0, label="item-a"):
            t0 = time.monotonic()
            with pytest.raises(LeaseTimeout) as excinfo:
                with waiter.lease():
                    pass
            waited = time.monotonic() - t0
    finally:
        done.set()
        thread.join()
    message = str(excinfo.value)
    assert 0.15 <= excinfo.value.waited_s <= waited
    assert re.search(r"after waiting \d+\.\d\ds", message) and "--kcoral-lease-timeout 0.15" in message
    assert f"lease dir {lease_dir}" in message
    assert "[fake-a]" in message and "[fake-b]" in message
    assert "holder-session, item-a" in message and "holder-two, item-b" in message
    assert f"pid {os.getpid()}" in message
    assert excinfo.value.devices == [DEV_A, DEV_B]


def test_preferred_device_then_any_free_then_first_freed(tmp_path: Path) -> None:
    lease_dir = tmp_path / "leases"
    manager = LeaseManager([DEV_A, DEV_B], lease_dir, 5.0, holder="me")
    with manager.lease(preferred=1) as lease:
        assert lease.device == DEV_B
    with LeaseManager([DEV_A, DEV_B], lease_dir, 5.0, preferred=1).lease() as lease:  # the default preference
        assert lease.device == DEV_B

    holders = [LeaseManager([DEV_A, DEV_B], lease_dir, None, holder=f"h{i}") for i in range(2)]
    held = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]

    def hold(i: int) -> None:
        with holders[i].lease(preferred=i):
            held[i].set()
            release[i].wait(10)

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(2)]
    threads[1].start()
    try:
        assert held[1].wait(10)
        with manager.lease(preferred=1) as lease:  # B is held: A is free, no wait
            assert lease.device == DEV_A
            assert lease.wait_ms < 100
        threads[0].start()
        assert held[0].wait(10)
        threading.Timer(0.15, release[0].set).start()  # A frees first, though B is preferred
        with manager.lease(preferred=1) as lease:
            assert lease.device == DEV_A
            assert lease.wait_ms >= 100
    finally:
        for event in release:
            event.set()
        for thread in threads:
            if thread.is_alive() or thread.ident is not None:
                thread.join()
    assert [r["lock_key"] for r in manager.history] == ["fake-b", "fake-a", "fake-a"]
    assert all(r["t_released"] >= r["t_acquired"] and r["held_ms"] >= 0 for r in manager.history)


def test_nested_lease_reuses_the_held_device(tmp_path: Path) -> None:
    manager = LeaseManager([CPU], tmp_path / "leases", 0.1, holder="me")
    with manager.lease(label="outer") as outer:
        with manager.lease(label="inner") as inner:
            assert inner is outer
        assert manager.current is outer and outer.t_released is None  # still held
        errors: list[BaseException] = []

        def other_thread() -> None:  # another thread contends like another process
            try:
                with manager.lease():
                    pass
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], LeaseTimeout)
    assert manager.current is None
    assert [r["label"] for r in manager.history] == ["outer"]


@pytest.mark.parametrize(
    ("worker_id", "n_devices", "expected"),
    [("gw3", 2, 1), ("gw0", 2, 0), ("gw5", 4, 1), ("gw2", 1, 0), (None, 2, 0), ("master", 3, 0), ("gw1", 0, 0)],
)
def test_worker_preferred_index(worker_id: str | None, n_devices: int, expected: int) -> None:
    assert worker_preferred_index(worker_id, n_devices) == expected


class TestDefaultLeaseDir:
    @pytest.fixture(autouse=True)
    def private_tempdir(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        # the host's temp dir is /tmp: these tests make (and break) theirs in a directory of their own
        monkeypatch.setattr("pytest_kcoral.lease.host_temp_dir", lambda: str(tmp_path))
        return tmp_path

    @pytest.mark.skipif(os.name != "posix" or not os.access("/tmp", os.W_OK), reason="needs a writable /tmp")
    def test_is_the_hosts_whatever_tmpdir_says(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Two sessions with different TMPDIRs on one host (a batch scheduler's per-job
        directories) must find each other's leases."""
        from pytest_kcoral import lease

        monkeypatch.undo()
        monkeypatch.setenv("TMPDIR", str(tmp_path))
        monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
        assert tempfile.gettempdir() == str(tmp_path)
        assert lease.host_temp_dir() == "/tmp"
        assert default_lease_dir(str(tmp_path)).parent == tmp_path

    def test_created_private_and_reused(self, tmp_path: Path) -> None:
        path = default_lease_dir()
        assert path.parent == tmp_path and path.name == f"pytest-kcoral-leases-{os.getuid()}"
        assert path.stat().st_mode & 0o777 == 0o700
        assert default_lease_dir() == path
        assert LeaseManager([CPU], None, None).lease_dir == path

    def test_refuses_a_symlink(self, tmp_path: Path) -> None:
        target = tmp_path / "elsewhere"
        target.mkdir(mode=0o700)
        (tmp_path / f"pytest-kcoral-leases-{os.getuid()}").symlink_to(target)
        with pytest.raises(LeaseError, match="is a symlink"):
            default_lease_dir()

    def test_refuses_world_writable(self, tmp_path: Path) -> None:
        path = tmp_path / f"pytest-kcoral-leases-{os.getuid()}"
        path.mkdir()
        path.chmod(0o777)
        with pytest.raises(LeaseError, match="group- or world-writable"):
            default_lease_dir()

    def test_refuses_a_plain_file(self, tmp_path: Path) -> None:
        (tmp_path / f"pytest-kcoral-leases-{os.getuid()}").write_text("")
        with pytest.raises(LeaseError, match="not a directory"):
            default_lease_dir()

    @pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
    def test_refuses_another_users_directory(self, tmp_path: Path) -> None:
        path = tmp_path / f"pytest-kcoral-leases-{os.getuid()}"
        path.mkdir(mode=0o700)
        os.chown(path, 4242, -1)
        with pytest.raises(LeaseError, match="owned by uid 4242"):
            default_lease_dir()


HOLD_TEST = """
import os, time
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_hold(gpu_lease, i):
    t_start = time.time()
    assert gpu_lease.t_acquired <= t_start and gpu_lease.device.name == "cpu"
    time.sleep({hold_s})
    line = f"{{os.getpid()}} {{t_start}} {{time.time()}}\\n"
    with open(os.environ["KCORAL_TEST_LOG"], "a") as f:
        f.write(line)
"""


def read_intervals(log: Path) -> tuple[list[tuple[float, float]], set[str]]:
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(float(start), float(end)) for _, start, end in rows], {pid for pid, _, _ in rows}


def test_two_pytest_sessions_take_turns(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_hold=HOLD_TEST.format(n=1, hold_s=0.3))
    log = tmp_path / "intervals.log"
    command = [sys.executable, "-m", "pytest", *PLUGINS, "-p", "no:cacheprovider", "-q",
               "--kcoral-lease-dir", str(tmp_path / "leases"), "test_hold.py"]
    procs = [subprocess.Popen(command, cwd=pytester.path, env=child_env(KCORAL_TEST_LOG=str(log)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    intervals, pids = read_intervals(log)
    assert len(intervals) == 2 and len(pids) == 2
    assert_disjoint(intervals)


def test_xdist_workers_take_turns(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_hold=HOLD_TEST.format(n=4, hold_s=0.15))
    log = tmp_path / "intervals.log"
    monkeypatch.setenv("KCORAL_TEST_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest_subprocess(*PLUGINS, "-n", "2", "--kcoral-lease-dir", str(tmp_path / "leases"),
                                           f"--junitxml={junit}")
    result.assert_outcomes(passed=4)
    intervals, pids = read_intervals(log)
    assert len(intervals) == 4 and len(pids) == 2
    assert_disjoint(intervals)
    xml = junit.read_text()
    assert xml.count('name="lease_wait_ms"') == 4 and xml.count('name="lease_held_ms"') == 4


def test_auto_workers_one_per_gpu_else_xdist_default(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfigure(*PLUGINS, "--kcoral-lease-dir", str(pytester.path / "leases"))
    if not any(d.is_cuda for d in lease_plugin.get_devices(config)):
        assert lease_plugin.pytest_xdist_auto_num_workers(config) is None  # xdist counts the cores
    # What the hook returns on a two-GPU host (the devices are the only fake here).
    config.stash[stash.devices_key] = [DeviceSpec(f"cuda:{i}", f"GPU-{i}", "GPU") for i in range(2)]
    assert lease_plugin.pytest_xdist_auto_num_workers(config) == 2


def test_get_lease_manager_reads_the_options(pytester: pytest.Pytester) -> None:
    lease_dir = pytester.path / "my-leases"
    config = pytester.parseconfigure(*PLUGINS, "--kcoral-lease-dir", str(lease_dir), "--kcoral-lease-timeout", "2.5")
    manager = lease_plugin.get_lease_manager(config)
    assert manager is lease_plugin.get_lease_manager(config)
    assert manager.lease_dir == lease_dir and lease_dir.is_dir()
    assert manager.timeout_s == 2.5 and manager.devices == lease_plugin.get_devices(config)


def test_gpu_lease_fixture_records_properties(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_uses_device(gpu_lease, record_property):
            assert gpu_lease.device.name in ("cpu", "cuda:0")
            assert gpu_lease.held_ms is None and gpu_lease.wait_ms >= 0
        """
    )
    result = pytester.runpytest(*PLUGINS, "--kcoral-lease-dir", str(pytester.path / "leases"))
    result.assert_outcomes(passed=1)
    (report,) = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when == "teardown"]
    props = dict(report.user_properties)
    assert props["lease_wait_ms"] >= 0 and props["lease_held_ms"] >= 0


def test_lease_factory_is_what_the_pipeline_calls(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfigure(*PLUGINS, "--kcoral-lease-dir", str(pytester.path / "leases"))
    factory = lease_plugin.lease_factory(config)
    with factory("cases/vector_add::v1[seen-n=4096]") as lease:
        assert lease.device_name == lease.device.name and lease.wait_ms >= 0
    assert lease.held_ms is not None and lease.held_ms >= 0
    (record,) = lease_plugin.get_lease_manager(config).history
    assert record["label"] == "cases/vector_add::v1[seen-n=4096]"


def test_odd_lock_keys_make_plain_file_names_and_the_sidecar_goes_with_the_lease(tmp_path: Path) -> None:
    mig = DeviceSpec("cuda:0", "MIG-GPU-aaaa/1/0", "NVIDIA H200 MIG")
    manager = LeaseManager([mig], tmp_path / "leases", 1.0, holder="me")
    assert manager.lock_path(mig).name == "MIG-GPU-aaaa_1_0.lock"
    with manager.lease(label="item") as lease:
        assert manager.read_holder(mig) == {
            "pid": os.getpid(), "host": manager.read_holder(mig)["host"], "holder": "me", "label": "item",
            "t_acquired": lease.t_acquired, "device": "cuda:0", "stale": False,
        }
    assert manager.read_holder(mig) is None
    assert sorted(p.name for p in (tmp_path / "leases").iterdir()) == ["MIG-GPU-aaaa_1_0.lock"]


ACCOUNT = textwrap.dedent(
    """
    import encodings.ascii, json, os, sys, tempfile, time  # noqa: F401 - imported while the interpreter's files are readable
    from pathlib import Path
    from pytest_kcoral.devices import DeviceSpec
    from pytest_kcoral.lease import LeaseError, LeaseManager, LeaseTimeout

    lease_dir, uid, group, hold_s = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    device = DeviceSpec("cpu", "cpu", "test CPU")
    with tempfile.TemporaryDirectory() as warm:  # filelock imports some of its modules at first use
        with LeaseManager([device], Path(warm), 1.0).lease():
            pass
    # another account, in the shared group, with a strict umask: without explicit modes the lock
    # file would be 0600 (the group could not lock it) and so would the holder's sidecar (a waiter
    # of another account could not say who held the device)
    os.setgroups([group])
    os.setgid(uid)
    os.setuid(uid)
    os.umask(0o077)
    print("ready", flush=True)
    sys.stdin.readline()  # the test says when to start: the accounts before this one hold the device by then
    report = {"uid": uid}
    try:
        if hold_s < 0:  # a waiter: first a short wait that times out, naming the holder, then a long one
            try:
                with LeaseManager([device], lease_dir, 0.2).lease():
                    report["short_wait"] = "got it"
            except LeaseTimeout as exc:
                report["short_wait"] = str(exc)
        manager = LeaseManager([device], lease_dir, 10.0, holder=f"account {uid}")
        with manager.lease(label="x"):
            print("holding", flush=True)
            time.sleep(max(hold_s, 0.05))
        report["history"] = manager.history
    except LeaseError as exc:
        report["error"] = str(exc)
    print(json.dumps(report), flush=True)
    """
)


def _as_accounts(tmp_path: Path, lease_dir: Path, runs: list[tuple[int, int, float]]) -> list[dict]:
    """Run ACCOUNT once per (uid, group, hold_s), each as that account, in turn: each starts once the
    one before it holds the device (or has failed to). Their reports."""
    script = tmp_path / "account.py"
    script.write_text(ACCOUNT)
    procs = [subprocess.Popen([sys.executable, str(script), str(lease_dir), str(uid), str(group), str(hold)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
             for uid, group, hold in runs]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n", p.communicate(timeout=60)[1][-2000:]
        started = []
        for p in procs:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            started.append(p.stdout.readline())  # "holding", or its report when it got no lease
        outputs = [(first + out, err) for first, (out, err) in zip(started, (p.communicate(timeout=60) for p in procs))]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * len(procs), [err[-2000:] for _, err in outputs]
    return [json.loads(out.splitlines()[-1]) for out, _ in outputs]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as two accounts")
def test_two_accounts_share_a_group_lease_directory(tmp_path: Path) -> None:
    """Two accounts in one group take turns on a device through a group directory (setgid, 2770):
    the lock file the first one made is one the second can lock, whatever the first's umask (077
    here), and the second, timing out while the first holds it, names the holder from its sidecar."""
    group = 4170
    shared = Path(tempfile.mkdtemp(prefix="kcoral-shared-leases-", dir="/tmp"))
    try:
        os.chown(shared, 0, group)
        os.chmod(shared, 0o2770)
        holder, waiter = _as_accounts(tmp_path, shared, [(4171, group, 1.5), (4172, group, -1.0)])
        assert "error" not in holder and "error" not in waiter, (holder, waiter)
        assert "no device free" in waiter["short_wait"] and "account 4171" in waiter["short_wait"], waiter["short_wait"]
        (first,), (second,) = holder["history"], waiter["history"]
        assert_disjoint([(first["t_acquired"], first["t_released"]), (second["t_acquired"], second["t_released"])])
        assert second["wait_ms"] > 500  # it waited for the holder rather than timing alongside it
        lock = os.stat(shared / "cpu.lock")
        assert (lock.st_uid, lock.st_gid, lock.st_mode & 0o777) == (4171, group, 0o660)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as two accounts")
def test_another_accounts_lock_file_in_a_sticky_directory_is_a_clear_error(tmp_path: Path) -> None:
    """In a sticky world-writable directory (as /tmp itself) another account's lock file cannot be
    locked: the error names the file, its owner and mode, and how to share a directory instead
    (a raw PermissionError used to escape the lease)."""
    shared = Path(tempfile.mkdtemp(prefix="kcoral-sticky-leases-", dir="/tmp"))
    try:
        os.chmod(shared, 0o1777)
        holder, other = _as_accounts(tmp_path, shared, [(4181, 4181, 1.0), (4182, 4182, 0.0)])
        assert "error" not in holder, holder
        message = other["error"]
        assert str(shared / "cpu.lock") in message and "owned by uid 4181" in message and "sticky" in message, message
        assert "install -d -m 2770" in message
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.parametrize("replacement", ["directory", "symlink"])
def test_a_lock_path_that_is_no_longer_a_file_is_moved_aside(tmp_path: Path, replacement: str) -> None:
    """A candidate of the same user (no confinement) replaced the lock file: every later lease on
    the directory failed. The path is moved aside, named in a warning, and a fresh lock made."""
    manager = LeaseManager([CPU], lease_dir=tmp_path)
    path = manager.lock_path(CPU)
    if replacement == "directory":
        path.mkdir()
        (path / "inside").write_text("not empty")
    else:
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.warns(LeaseRepaired, match=rf"lock file {re.escape(str(path))} was a {replacement}, not a file .*moved aside to "):
        with manager.lease() as held:
            assert held.device == CPU
            assert path.is_file() and not path.is_symlink()
    (aside,) = tmp_path.glob(f"{path.name}.broken-*")
    assert aside.is_symlink() if replacement == "symlink" else (aside / "inside").is_file()
    assert not (tmp_path / "elsewhere").exists()  # a symlink's target is never created or written


def test_a_broken_holder_sidecar_is_moved_aside_too(tmp_path: Path) -> None:
    manager = LeaseManager([CPU], lease_dir=tmp_path)
    manager.holder_path(CPU).mkdir()
    with pytest.warns(LeaseRepaired):
        with manager.lease(label="after"):
            assert manager.read_holder(CPU)["label"] == "after"
