"""Host-wide device leases: one ``filelock`` lock file per device.

A lease serializes GPU work across xdist workers and across separate pytest sessions on the host.
The lock is a kernel ``flock``: when the holding process dies, even by SIGKILL, the kernel drops
it, so a crashed holder never blocks a device. Next to each lock a ``<key>.holder`` sidecar names
the current holder (best effort), so a waiter that gives up can say who it waited for.

Waiting polls every device with non-blocking tries (preferred first), so whichever device frees
first is taken; there is no FIFO order between waiters.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

from pytest_kcoral.devices import DeviceSpec

POLL_INTERVAL_S = 0.01
# Lock files the directory's group can lock too, whatever the creating account's umask (filelock
# applies an explicit mode to a file it creates): sessions under different accounts share a GPU
# through a ``--kcoral-lease-dir`` that is a group directory (docs/grading.md, *Sharing GPUs
# between accounts*). The default directory is 0700, so there nobody else reaches them.
LOCK_FILE_MODE = 0o660
# The holder sidecar: what a waiter of another account reads to say who it waited for.
HOLDER_FILE_MODE = 0o644


class LeaseError(Exception):
    """The lease directory or a lease request is unusable."""


class LeaseTimeout(LeaseError):
    """No device became free within the lease timeout."""

    def __init__(self, message: str, devices: Sequence[DeviceSpec], lease_dir: Path, waited_s: float,
                 holders: dict[str, dict[str, Any] | None]) -> None:  # by lock key
        super().__init__(message)
        self.devices = list(devices)
        self.lease_dir = lease_dir
        self.waited_s = waited_s
        self.holders = holders


def _user_tag() -> str:
    if hasattr(os, "getuid"):
        return str(os.getuid())
    import getpass

    return re.sub(r"[^A-Za-z0-9_.-]", "_", getpass.getuser())


def host_temp_dir() -> str:
    """The host's temp dir, not this process's: ``/tmp`` where it is a directory this user can
    write, whatever ``TMPDIR`` says; otherwise the process's temp dir.

    ``TMPDIR`` differs between sessions on one host (a batch scheduler's per-job directory, a CI
    runner's, a test's), and two sessions that looked for their leases in different directories
    would time on one GPU at once."""
    if os.name == "posix" and os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK):
        return "/tmp"
    return tempfile.gettempdir()


def default_lease_dir(base: str | None = None) -> Path:
    """``<host temp dir>/pytest-kcoral-leases-<uid>`` (``host_temp_dir``, or ``base``), created
    0700 and checked to be ours.

    The directory is per user: another user could otherwise plant or hold our lock files. Sessions
    under different accounts share a GPU through a ``--kcoral-lease-dir`` that is a group
    directory (``LOCK_FILE_MODE``; tests/test_lease.py runs two accounts against one).
    """
    path = Path(base or host_temp_dir()) / f"pytest-kcoral-leases-{_user_tag()}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path)
    return path


def check_private_dir(path: Path) -> None:
    """Refuse a lease directory another user could tamper with."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise LeaseError(f"lease directory {path} is a symlink; refusing to use it (remove it or pass --kcoral-lease-dir)")
    if not stat.S_ISDIR(st.st_mode):
        raise LeaseError(f"lease directory {path} exists and is not a directory (remove it or pass --kcoral-lease-dir)")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise LeaseError(
            f"lease directory {path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()}); "
            "refusing to use it (pass --kcoral-lease-dir)"
        )
    if os.name == "posix" and st.st_mode & 0o022:
        raise LeaseError(
            f"lease directory {path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o}); "
            "refusing to use it (chmod 700 it, remove it, or pass --kcoral-lease-dir)"
        )


def lock_file_stem(lock_key: str) -> str:
    """A file name for a lock key: UUIDs pass unchanged, anything odd becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", lock_key).lstrip(".") or "_"


def worker_preferred_index(worker_id: str | None, n_devices: int) -> int:
    """The device an xdist worker tries first: ``gw<k>`` -> ``k % n_devices``; others -> 0."""
    if n_devices <= 0 or worker_id is None:
        return 0
    m = re.fullmatch(r"gw(\d+)", worker_id)
    return int(m.group(1)) % n_devices if m else 0


@dataclass
class Lease:
    """One held (or past) lease of one device."""

    device: DeviceSpec
    holder: str
    label: str
    wait_ms: float
    t_acquired: float  # time.time() epoch, comparable across processes
    t_released: float | None = None
    held_ms: float | None = None  # set on release
    pid: int = field(default_factory=os.getpid)
    _t0_monotonic: float = field(default=0.0, repr=False)

    @property
    def device_name(self) -> str:
        """The torch device string, e.g. "cuda:0" or "cpu"."""
        return self.device.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device.name,
            "lock_key": self.device.lock_key,
            "holder": self.holder,
            "label": self.label,
            "pid": self.pid,
            "t_acquired": self.t_acquired,
            "t_released": self.t_released,
            "wait_ms": self.wait_ms,
            "held_ms": self.held_ms,
        }


class LeaseManager:
    """Leases the devices of one session.

    Re-entrancy: a thread that already holds a lease from this manager and asks again gets the same
    ``Lease`` back (no second lock, no new history entry); the outer ``with`` releases it. Asking
    for a second device while holding one would deadlock a single-GPU host, and a nested request is
    almost always "the device I am on". Other threads contend like other processes.
    """

    def __init__(self, devices: Sequence[DeviceSpec], lease_dir: Path | None = None,
                 timeout_s: float | None = None, holder: str = "", *, preferred: int = 0) -> None:
        if not devices:
            raise LeaseError("no devices to lease")
        self.devices = list(devices)
        if lease_dir is None:
            self.lease_dir = default_lease_dir()
        else:
            self.lease_dir = Path(lease_dir)
            self.lease_dir.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self.holder = holder or f"pid {os.getpid()}"
        self.preferred = preferred
        self.history: list[dict[str, Any]] = []
        self._history_lock = threading.Lock()
        self._local = threading.local()

    def lock_path(self, device: DeviceSpec) -> Path:
        return self.lease_dir / f"{lock_file_stem(device.lock_key)}.lock"

    def holder_path(self, device: DeviceSpec) -> Path:
        return self.lease_dir / f"{lock_file_stem(device.lock_key)}.holder"

    @property
    def current(self) -> Lease | None:
        """The lease this thread holds from this manager, if any."""
        return getattr(self._local, "lease", None)

    @contextlib.contextmanager
    def lease(self, preferred: int | None = None, label: str = "") -> Iterator[Lease]:
        """Hold one device for the ``with`` block: the preferred one if free, else any free one,
        else wait (up to ``timeout_s``) for whichever frees first."""
        if preferred is not None and not isinstance(preferred, int):
            raise TypeError(f"preferred must be a device index, not {preferred!r} (pass label=...)")
        outer = self.current
        if outer is not None:
            yield outer
            return
        lease, lock = self._acquire(self.preferred if preferred is None else preferred, label)
        self._local.lease = lease
        try:
            yield lease
        finally:
            self._local.lease = None
            self._release(lease, lock)

    def _order(self, preferred: int) -> list[DeviceSpec]:
        start = preferred % len(self.devices)
        return self.devices[start:] + self.devices[:start]

    def _acquire(self, preferred: int, label: str) -> tuple[Lease, filelock.BaseFileLock]:
        order = self._order(preferred)
        t0 = time.monotonic()
        deadline = None if self.timeout_s is None else t0 + self.timeout_s
        while True:
            for device in order:
                lock = self._try_lock(device)
                if lock is None:
                    continue
                try:
                    now = time.monotonic()
                    lease = Lease(device=device, holder=self.holder, label=label,
                                  wait_ms=(now - t0) * 1e3, t_acquired=time.time(), _t0_monotonic=now)
                    self._write_holder(lease)
                except BaseException:  # e.g. KeyboardInterrupt: never keep a lock nobody will release
                    lock.release()
                    raise
                return lease, lock
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise self._timeout_error(order, now - t0)
            sleep_s = POLL_INTERVAL_S if deadline is None else min(POLL_INTERVAL_S, max(deadline - now, 0.0))
            time.sleep(sleep_s)

    def _try_lock(self, device: DeviceSpec) -> filelock.BaseFileLock | None:
        """``device``'s lock, taken without waiting; None when another holds it. A lock path that
        no longer opens as a file is moved aside and a fresh one made (``set_aside_broken``)."""
        for _ in range(MAX_LOCK_REPAIRS + 1):
            lock = filelock.FileLock(str(self.lock_path(device)), mode=LOCK_FILE_MODE)
            try:
                lock.acquire(timeout=0)
                return lock
            except filelock.Timeout:
                return None
            except PermissionError as exc:
                raise LeaseError(self._not_ours_message(device, exc)) from None
            except OSError as exc:  # a directory, a symlink, a socket where the lock file was
                set_aside_broken(self.lock_path(device), exc)
        raise LeaseError(f"cannot lock {self.lock_path(device)}: what stood there was moved aside {MAX_LOCK_REPAIRS} times,"
                         " and something keeps replacing it")

    def _release(self, lease: Lease, lock: filelock.BaseFileLock) -> None:
        # Stamp the release while still holding, so [t_acquired, t_released] lies inside the hold
        # and intervals of different holders never overlap, even by a clock read.
        lease.held_ms = (time.monotonic() - lease._t0_monotonic) * 1e3
        lease.t_released = time.time()
        # The sidecar goes before the lock, so it never names a holder that has already left.
        with contextlib.suppress(OSError):
            self.holder_path(lease.device).unlink()
        lock.release()
        with self._history_lock:
            self.history.append(lease.to_dict())

    def _write_holder(self, lease: Lease) -> None:
        info = {"pid": lease.pid, "host": socket.gethostname(), "holder": lease.holder,
                "label": lease.label, "t_acquired": lease.t_acquired, "device": lease.device.name}
        path = self.holder_path(lease.device)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(info), encoding="utf-8")
            os.chmod(tmp, HOLDER_FILE_MODE)
            try:
                os.replace(tmp, path)
            except IsADirectoryError as exc:  # replaced by a directory: the sidecar would stay unwritable
                set_aside_broken(path, exc)
                os.replace(tmp, path)
        except (OSError, LeaseError):
            with contextlib.suppress(OSError):
                tmp.unlink()

    def read_holder(self, device: DeviceSpec) -> dict[str, Any] | None:
        """Who holds ``device``, from its sidecar; ``stale`` is set when that process is gone."""
        try:
            info = json.loads(self.holder_path(device).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict):
            return None
        if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
            info["stale"] = not _pid_alive(info["pid"])
        return info

    def _not_ours_message(self, device: DeviceSpec, exc: PermissionError) -> str:
        """Why this account cannot lock ``device``'s lock file: another account's file in a
        directory they share, and what makes such a directory work."""
        path = self.lock_path(device)
        try:
            st = os.stat(path)
            found = f"the file is owned by uid {st.st_uid}, gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):o}"
        except FileNotFoundError:
            found = "the file does not exist and this account cannot create it"
        except OSError as why:
            found = f"the file cannot be examined ({why.strerror or why})"
        try:
            directory = os.stat(self.lease_dir)
            sticky = " (sticky: another account's lock file there is refused, since its owner could replace it during a hold)" \
                if directory.st_mode & stat.S_ISVTX else ""
            where = (f"the directory is owned by uid {directory.st_uid}, gid {directory.st_gid}, "
                     f"mode {stat.S_IMODE(directory.st_mode):o}{sticky}")
        except OSError as why:
            where = f"the directory cannot be examined ({why.strerror or why})"
        return (f"cannot lock {path} for {device.name} ({exc.strerror or exc}): {found}; {where}. "
                "Accounts share leases through a group directory that is not sticky, each account in its group "
                "(for example `install -d -m 2770 -g GROUP DIR`, then --kcoral-lease-dir DIR); lock files made "
                "there before this version may need `chmod 660`")

    def _timeout_error(self, order: Sequence[DeviceSpec], waited_s: float) -> LeaseTimeout:
        holders = {d.lock_key: self.read_holder(d) for d in order}
        parts = []
        for device in order:
            info = holders[device.lock_key]
            if info is None:
                who = "holder unknown"
            else:
                age_s = time.time() - float(info.get("t_acquired") or time.time())
                who = (f"held by pid {info.get('pid')} on {info.get('host')} ({info.get('holder')}"
                       f"{', ' + str(info['label']) if info.get('label') else ''}) for {age_s:.1f}s"
                       f"{' [holder is gone: sidecar is stale]' if info.get('stale') else ''}")
            parts.append(f"{device.name} [{device.lock_key}] {who}")
        message = (f"no device free after waiting {waited_s:.2f}s (--kcoral-lease-timeout {self.timeout_s}); "
                   f"lease dir {self.lease_dir}: " + "; ".join(parts))
        return LeaseTimeout(message, order, self.lease_dir, waited_s, holders)


class LeaseRepaired(UserWarning):
    """A lock path that was no longer a regular file was moved aside and a fresh lock file made."""


# Broken lock paths moved aside within one acquisition before giving up: a candidate of the same
# user that keeps replacing the lock file (it is killed before its item's lease is released).
MAX_LOCK_REPAIRS = 3
_REPAIR_WAIT_S = 10.0


def set_aside_broken(path: Path, error: OSError) -> None:
    """A lock path that no longer opens as a file (a candidate of the same user replaced it with a
    directory or a symlink) is renamed to ``<name>.broken-<time>-<pid>`` and warned about
    (``LeaseRepaired``); the next try makes a fresh lock file. Raises ``LeaseError`` with the fix
    when it cannot. Repairs hold an ``flock`` on the lease directory, so a lock file that another
    session has just made in the meantime is never the one moved."""
    with _directory_locked(path.parent):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return  # another session repaired it first
        if stat.S_ISREG(st.st_mode):
            raise LeaseError(f"cannot lock {path}: {error.strerror or error}") from None
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "special file"
        # a fresh name: a rename onto an earlier empty directory of the same name would succeed
        aside = path.with_name(f"{path.name}.broken-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.rename(path, aside)
        except OSError as why:
            raise LeaseError(f"lock file {path} is a {kind}, not a file (a candidate of this user may have replaced it), and"
                             f" it cannot be moved aside ({why.strerror or why}): remove it (rm -r '{path}')") from None
    import warnings

    warnings.warn(LeaseRepaired(f"lock file {path} was a {kind}, not a file (a candidate of this user may have replaced it):"
                                f" moved aside to {aside}, and a fresh lock file made; remove {aside.name} once looked at"), stacklevel=2)


@contextlib.contextmanager
def _directory_locked(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` itself (none where there is no ``fcntl``)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + _REPAIR_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LeaseError(f"lease directory {directory}: another process has held it locked for"
                                     f" {_REPAIR_WAIT_S:.0f} s while repairing a lock file") from None
                time.sleep(POLL_INTERVAL_S)
        yield
    finally:
        os.close(fd)  # drops the flock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True
