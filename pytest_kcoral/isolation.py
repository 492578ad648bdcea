"""Isolate step: every child in a fresh process, forked from a pre-warmed template.

The template is a multiprocessing forkserver that has imported torch (and Triton) but never
initialized CUDA, so a child costs a fork, not an interpreter start plus a torch import. Each child
gets a private working directory (removed afterwards), its own process group (killed as a whole),
and its stdout/stderr drained by a thread that keeps only the head and tail, so a flood of output
can neither deadlock the child nor fill memory.

``Child.call`` sends one command and waits for the reply within the item's deadline; a crash, an
early exit, a timeout or garbage on the wire becomes a ``ChildFailure`` naming the phase.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import secrets
import selectors
import shutil
import signal
import struct
import tempfile
import termios
import threading
import time
from collections.abc import Sequence
from multiprocessing import context as mp_context
from multiprocessing import popen_forkserver, spawn
from multiprocessing.connection import Connection
from typing import Any

from pytest_kcoral import captured_output, child, lease, leftovers, protocol
from pytest_kcoral.messages import NO_ERROR, Command, ErrorInfo, M, MessageError, R, Started, wire_header

# Imported once by the template so children start warm. Missing ones are skipped by forkserver.
TEMPLATE_PRELOAD = ["pytest_kcoral.template", "torch", "triton", "triton.language", "pytest_kcoral.child", "pytest_kcoral.case_runtime", "pytest_kcoral.timing",
                    "pytest_kcoral.timing.preload"]

_OUTPUT_HEAD_BYTES = 4 << 10
_OUTPUT_TAIL_BYTES = 16 << 10

_template_ready = False
_template_key: str | None = None  # the sandbox wrapper the template runs under, None: none
_template_pid: int | None = None  # the process children are forked from
_live_pids: set[int] = set()  # this process's children that are alive, to tell orphans apart
_template_lock = threading.Lock()
_launch_lock = threading.Lock()
# In the environment of the template, so of every child and whatever they start: how processes of
# this pytest process are told apart from anyone else's once they have left the template's tree.
SESSION_ENV = "KCORAL_SESSION"
# The one process the template takes launches from (``template.only_from``): any process of the
# user can reach its socket. A secret would not do: every child is a fork of the template.
TEMPLATE_CLIENT_ENV = "KCORAL_TEMPLATE_CLIENT_PID"
_session_token = secrets.token_hex(12)
_get_preparation_data = spawn.get_preparation_data


def _preparation_without_main(name: str) -> dict[str, Any]:
    data = _get_preparation_data(name)
    data.pop("init_main_from_path", None)
    data.pop("init_main_from_name", None)
    return data


class _TemplatePopen(popen_forkserver.Popen):
    """A forkserver launch that does not re-run the parent's ``__main__`` in the child.

    multiprocessing re-imports the main script in every child; under pytest that is pytest's own
    entry script, which a child has no use for, and re-running it costs time at every item.
    """

    def _launch(self, process_obj: Any) -> None:
        with _launch_lock:
            spawn.get_preparation_data = _preparation_without_main
            try:
                super()._launch(process_obj)  # type: ignore[misc]  # private: typeshed leaves it out
            finally:
                spawn.get_preparation_data = _get_preparation_data


class _TemplateProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _TemplatePopen:
        return _TemplatePopen(process_obj)


def ensure_template(env: dict[str, str], sandbox: Any = None) -> None:
    """Start the template (one per pytest process) preloaded with what every child imports.

    Returns at once: the template imports in the background, and the first child waits for it.

    The template starts with the children's environment: Triton reads ``TRITON_INTERPRET`` when
    it is imported (its own library functions are jitted then), so the CPU interpreter must be
    chosen before the preload, not in the child. Under ``--kcoral-sandbox`` it starts inside
    bubblewrap (``sandbox.py``); a template of another sandbox setting is stopped first.
    """
    global _template_ready, _template_key, _template_pid
    key = getattr(sandbox, "executable", None)
    with _template_lock:
        if _template_ready and _template_key == key and _template_alive():
            return
        if _template_ready:
            # another sandbox setting, or a template that died (a candidate can kill it: same user):
            # multiprocessing would start a new one by itself, outside the sandbox
            stop_template()
        env = dict(env, **{SESSION_ENV: _session_token, TEMPLATE_CLIENT_ENV: str(os.getpid())})
        if threading.current_thread() is threading.main_thread():
            env[leftovers.TEMPLATE_DIES_WITH_PARENT_ENV] = "1"
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        saved_exe = spawn.get_executable()
        try:
            if key is not None:
                spawn.set_executable(key)
            multiprocessing.forkserver.set_forkserver_preload(TEMPLATE_PRELOAD)
            _short_socket_dir()
            multiprocessing.forkserver.ensure_running()
        finally:
            spawn.set_executable(saved_exe)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _template_ready = True
        _template_key = key
        _template_pid = None  # learnt from the first child (bwrap may stand between)


# The most bytes of a Unix socket's path (``sun_path`` holds 108, with its terminating zero).
_SOCKET_PATH_MAX = 107


def _short_socket_dir() -> None:
    """The template listens on a Unix socket in multiprocessing's directory for this process, a
    ``pymp-*`` directory made under the temp dir. A deep ``TMPDIR`` (a CI runner's, a test's
    ``tmp_path``) made its path too long: every session failed at collection with ``OSError: AF_UNIX
    path too long``. Then the directory is made in the host's temp dir (``lease.host_temp_dir``:
    ``/tmp``) instead; multiprocessing removes it at exit as it would the other. Only the pytest
    process uses the path (the template inherits the listening socket), so a sandbox's fresh
    ``/tmp`` does not hide it."""
    longest = os.path.join(tempfile.gettempdir(), "pymp-" + "x" * 8, "listener-" + "x" * 8)
    short = lease.host_temp_dir()
    if len(os.fsencode(longest)) <= _SOCKET_PATH_MAX or short == tempfile.gettempdir():
        return
    saved = tempfile.tempdir
    tempfile.tempdir = short
    try:
        multiprocessing.util.get_temp_dir()  # made now and kept for this process's life
    finally:
        tempfile.tempdir = saved


def stop_template() -> None:
    """Stop the template process (its children are unaffected); the next child starts a new one."""
    global _template_ready, _template_pid
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        try:
            server._stop()  # type: ignore[attr-defined]  # private: typeshed leaves it out
        except Exception:  # noqa: BLE001 - already gone
            pass
    _template_ready = False
    _template_pid = None


def _launched_pid() -> int | None:
    """The process multiprocessing launched the template as (bwrap, under the sandbox)."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def _template_alive() -> bool:
    """Whether the template, and the process it was launched as, still run. Not known yet (no
    child forked): taken as alive."""
    return all(leftovers.is_alive(pid) for pid in (_launched_pid(), _template_pid) if pid is not None)


def template_alive() -> bool:
    """Whether the template runs (or none was started), leaving it as it is (``template_lost`` mends)."""
    with _template_lock:
        return not _template_ready or _template_alive()


def template_lost() -> bool:
    """True once after the template died (killed by a candidate, most likely: it runs as the same
    user). Its orphans then escape to init, where ``_kill_orphans`` cannot see them: every process
    still carrying this session's token is killed, and the next child starts a new template, in
    the sandbox when there is one (``ensure_template``)."""
    with _template_lock:
        if not _template_ready or _template_alive():
            return False
        stop_template()
    sweep_session_processes()
    return True


def sweep_session_processes() -> list[int]:
    """Kill every process carrying this session's token (``SESSION_ENV``) that is no live child
    and not the template: what children left behind outside their trees (a candidate that killed
    the template, then detached). Returns their pids."""
    tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)  # started with the template's environment
    keep = {os.getpid(), *_live_pids, *(p for p in (_template_pid, _launched_pid(), tracker) if p)}
    strays = [p for p in leftovers.carrying(f"{SESSION_ENV}={_session_token}".encode()) if p not in keep]
    for pid in strays:
        leftovers.kill_tree(pid, include_root=True)
    return strays


def _kill_orphans() -> list[int]:
    """Processes re-parented to the template after their child died: a candidate's leftovers.

    The template is a subreaper (``pytest_kcoral.template``), so what a dead child left running
    lands there rather than at init; anything under it that is not a live child is killed.
    """
    template_pid = _template_pid
    if not template_pid:
        return []
    orphans = [p for p in leftovers.descendants(template_pid) if p not in _live_pids]
    # only the roots: kill_tree takes their descendants with them
    roots = [p for p in orphans if leftovers.parent_of(p) == template_pid]
    for pid in roots:
        leftovers.kill_tree(pid, include_root=True)
    return roots


# A command still running this long before the item's deadline prints its stacks (``child.serve``).
STACK_DUMP_LEAD_S = 1.0
class ChildFailure(Exception):
    """A child did not complete a command: it raised, crashed, exited, hung or lied on the wire."""

    def __init__(self, kind: str, phase: str, message: str, output: str = "", error: ErrorInfo = NO_ERROR) -> None:
        super().__init__(message)
        self.kind = kind  # "error" | "crash" | "exit" | "timeout" | "protocol" | "outage" (``remote``)
        self.phase = phase
        self.message = message
        self.output = output
        self.error = error  # what the child said about an "error": its type, message and traceback


def failure_of(error: ErrorInfo, role: str, phase: str, output: str) -> ChildFailure:
    """The failure a reply with ``ok`` false reports: the child's error, or what its audit found."""
    message = f"{error.type}: {error.message}"
    if error.detected:  # the child's own audit: the message names what it found
        ran = "the baseline" if role == "baseline" else "the candidate"
        message = f"detected after {ran} ran in phase '{phase}': {error.message}"
    return ChildFailure("error", phase, message, output, error)


def _pending_bytes(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` reads from."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])


class _OutputDrain(threading.Thread):
    """Reads a child's stdout and stderr to EOF: both together in arrival order, keeping the first
    and last few kilobytes (what a crash report shows), and each stream's last lines on its own
    (``captured_output.StreamTail``: the report's captured sections). With ``live_label`` (``-s``)
    it also writes each stream to this process's as it comes, up to a limit."""

    def __init__(self, fds: dict[str, int], live_label: str | None = None) -> None:
        super().__init__(daemon=True, name=f"kcoral-drain-{fds['stdout']}")
        self.fds = fds
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.live_label = live_label
        # held while a chunk is read and kept: ``settle`` then sees a chunk either in the pipe or kept
        self._lock = threading.Lock()
        self._closed = False  # the pipes are closed: everything was read
        self.streams: dict[str, captured_output.StreamTail] = {}
        self.live: dict[str, captured_output.LiveWriter] = {}
        self.restart()

    def restart(self) -> dict[str, captured_output.StreamTail]:
        """Each stream's tail so far; from now on, fresh ones (a kept child's next item)."""
        with self._lock:
            taken = self.streams
            self.streams = {name: captured_output.StreamTail() for name in self.fds}
            self.live = {name: captured_output.LiveWriter(name, self.live_label) for name in self.fds} if self.live_label else {}
        return taken

    def settle(self, timeout_s: float = 1.0) -> None:
        """Wait, for at most ``timeout_s``, until what the child has written so far is read."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._closed or not any(_pending_bytes(fd) for fd in self.fds.values()):
                    return
            time.sleep(0.002)

    def run(self) -> None:
        names = {fd: name for name, fd in self.fds.items()}
        with selectors.DefaultSelector() as selector:
            for fd in names:
                selector.register(fd, selectors.EVENT_READ)
            try:
                while names:
                    for key, _ in selector.select():
                        with self._lock:  # a ready pipe: the read does not block
                            chunk = os.read(key.fd, 65536)
                            if chunk:
                                self._take(names[key.fd], chunk)
                        if not chunk:
                            selector.unregister(key.fd)
                            del names[key.fd]
            except OSError:
                pass
            finally:
                with self._lock:
                    for fd in self.fds.values():
                        os.close(fd)
                    self._closed = True

    def _take(self, stream: str, chunk: bytes) -> None:
        self.streams[stream].feed(chunk)
        if stream in self.live:
            self.live[stream].write(chunk)
        self.total += len(chunk)
        if len(self.head) < _OUTPUT_HEAD_BYTES:
            take = _OUTPUT_HEAD_BYTES - len(self.head)
            self.head += chunk[:take]
            chunk = chunk[take:]
        self.tail += chunk
        if len(self.tail) > 2 * _OUTPUT_TAIL_BYTES:
            del self.tail[: len(self.tail) - _OUTPUT_TAIL_BYTES]

    def text(self) -> str:
        tail = bytes(self.tail[-_OUTPUT_TAIL_BYTES:])
        dropped = self.total - len(self.head) - len(tail)
        middle = f"\n[... {dropped} bytes of output dropped ...]\n" if dropped > 0 else ""
        return (bytes(self.head) + middle.encode() + tail).decode(errors="replace")


class Child:
    """The parent's handle on one child process."""

    def __init__(self, role: str, case_spec: dict[str, Any], env: dict[str, str], deadline: float, label: str = "", sandbox: Any = None,
                 live_output: bool = False) -> None:
        """``live_output``: write what the child prints to this process's stdout and stderr as
        it comes (``-s``), besides keeping its tail."""
        global _template_pid
        self.role = role
        self.label = label or role
        self.deadline = deadline
        self.phase = "startup"
        # under the sandbox only its workspace is writable (and visible at the same path)
        self.workdir = tempfile.mkdtemp(prefix=f"kcoral-{role}-", dir=getattr(sandbox, "workspace", None))
        ensure_template(env, sandbox)
        self.conn, child_conn = multiprocessing.Pipe(duplex=True)
        # two pipes, so the report can say which stream a line came from
        pipes = {name: os.pipe() for name in captured_output.STREAMS}
        write_ends = [Connection(w, readable=False) for _, w in pipes.values()]
        self.process = _TemplateProcess(
            target=child.main,
            args=(child_conn, *write_ends, role, self.workdir, env, case_spec, live_output),
            name=f"kcoral-{self.label}",
            daemon=True,
        )
        self.started_at = time.perf_counter()
        self._seq = 0
        self._nonce = 0
        self.last_call_s = 0.0  # the parent's own clock around the last command
        self.paused = False
        self._paused_below: list[int] = []  # descendants outside its group that ``pause`` stopped
        self.items_served = 0  # items this child ran a candidate for (``kept_children``)
        self.timed_out = False
        try:
            self.process.start()
        finally:
            child_conn.close()
            for conn in write_ends:
                conn.close()
        if self.process.pid is not None:
            _live_pids.add(self.process.pid)
            if _template_pid is None:
                _template_pid = leftovers.parent_of(self.process.pid)
        self.drain = _OutputDrain({name: r for name, (r, _) in pipes.items()}, f"{role} {self.label}" if live_output else None)
        self.drain.start()
        self._closed = False
        try:
            self.pid = self._parse(Started, *self._receive()).pid
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - self.started_at

    def call(self, command: Command[R], phase: str, reply_limit_bytes: int | None = None, fds: Sequence[int] = ()) -> R:
        """Send a command and return its reply; raise ``ChildFailure`` if it does not come back.
        ``reply_limit_bytes``: the most tensor bytes the reply may carry (an untrusted child's);
        ``fds``: file descriptors the command hands over (a feed's socket; the caller closes its own)."""
        self.phase = phase
        self._seq += 1
        self._nonce = secrets.randbits(63)
        header, payload = wire_header(command)
        started = time.perf_counter()
        try:
            dump_after_s = self.deadline - time.monotonic() - STACK_DUMP_LEAD_S
            envelope = dict(header, seq=self._seq, nonce=self._nonce, stack_dump_after_s=dump_after_s)
            protocol.send(self.conn, dict(envelope, fds=len(fds)) if fds else envelope, payload)
            if fds:
                protocol.send_fds(self.conn, list(fds))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            self._raise_died()
        try:
            reply_header, reply_payload = self._receive(reply_limit_bytes)
        finally:
            self.last_call_s = time.perf_counter() - started
        try:
            return command.parse_reply(reply_header, reply_payload)
        except MessageError as exc:
            raise self._malformed(exc) from None

    def _parse(self, kind: type[M], header: dict[str, Any], payload: Any) -> M:
        """A message read as ``kind`` (``messages.py``)."""
        try:
            return kind.from_wire(header, payload)
        except MessageError as exc:
            raise self._malformed(exc) from None

    def _malformed(self, exc: MessageError) -> ChildFailure:
        """A message that does not parse is a protocol failure, as a malformed frame is: the child
        may be lying, and is killed."""
        self.kill()
        return ChildFailure("protocol", self.phase, f"sent a malformed message in phase '{self.phase}': {exc}", self.output())

    def _receive(self, reply_limit_bytes: int | None = None) -> tuple[dict[str, Any], Any]:
        remaining = self.deadline - time.monotonic()
        # the channel, or the child's end: a process the child started (exec'd, detached) may
        # hold the child's end of the channel open, so a child that died would read as a hang
        ready = multiprocessing.connection.wait([self.conn, self.process.sentinel], max(0.0, remaining)) if remaining > 0 else []
        if not ready:
            self.kill()
            self.timed_out = True
            where, output = captured_output.stack_at_timeout(self.output())
            raise ChildFailure("timeout", self.phase, f"timed out in phase '{self.phase}' (item timeout reached){where}", output)
        if self.conn not in ready and not self.conn.poll(0):
            self._raise_died()
        try:
            header, payload = protocol.recv(self.conn, self.deadline, check_header=self._check_answers_the_command,
                                            max_payload_bytes=reply_limit_bytes)
        except TimeoutError:  # a message begun and never finished counts as a hang
            self.kill()
            self.timed_out = True
            raise ChildFailure("timeout", self.phase, f"timed out in phase '{self.phase}' in the middle of a reply (item timeout reached)",
                               self.output()) from None
        except (EOFError, ConnectionResetError, OSError):
            self._raise_died()
        except protocol.ProtocolError as exc:
            self.kill()
            raise ChildFailure("protocol", self.phase, f"sent a malformed message in phase '{self.phase}': {exc}", self.output()) from None
        if not header.get("ok"):
            raise failure_of(self._parse(ErrorInfo, header.get("error") or {}, None), self.role, self.phase, self.output())
        return header, payload

    def _check_answers_the_command(self, header: dict[str, Any]) -> None:
        """Before a reply's payload is read: it echoes the command's number and nonce. The harness
        answers each command exactly once: anything else was written into the channel by someone
        else (or is a second answer), and its tensors are never allocated."""
        if header.get("seq") != self._seq or (self._seq and header.get("nonce") != self._nonce):
            self.kill()
            raise ChildFailure(
                "protocol",
                self.phase,
                f"a reply in phase '{self.phase}' does not answer the command sent (sequence {header.get('seq')!r}, "
                f"expected {self._seq}): a forged or duplicated result on the channel",
                self.output(),
            )

    def _raise_died(self) -> None:
        self.process.join(5)
        code = self.process.exitcode
        if code is None:
            self.kill()
            message = f"closed its channel in phase '{self.phase}' and did not exit"
            kind = "protocol"
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            message = f"crashed with {name} in phase '{self.phase}'"
            kind = "crash"
        else:
            message = f"exited with status {code} in phase '{self.phase}' before replying"
            kind = "exit"
        raise ChildFailure(kind, self.phase, message, self.output())

    def pause(self) -> None:
        """Stop the child and everything in its process group (SIGSTOP), so a kept child runs
        nothing while other items hold the device: it cannot launch work or take a core. What it
        detached (setsid) is in no group the signal reaches: the child is its subreaper, so it is
        found below the child and stopped first, and once more after the child (what it started
        meanwhile)."""
        pid = self.process.pid
        below = set(leftovers.stop_tree(pid)) if pid is not None else set()
        self._signal_group(signal.SIGSTOP)
        self.paused = True
        # a signal is delivered in its own time: wait until the child is stopped, so that it is
        # before the caller gives the device back
        if pid is not None:
            leftovers.wait_stopped(pid, timeout_s=2.0)
            below.update(leftovers.stop_tree(pid))
        self._paused_below = sorted(below)

    def resume(self) -> bool:
        """Continue a paused child; False when it is no longer alive (killed while kept)."""
        self._signal_group(signal.SIGCONT)
        self.paused = False
        if self.process.pid is not None:  # those still below it: a pid may have been reused meanwhile
            for pid in set(leftovers.descendants(self.process.pid)) & set(self._paused_below):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGCONT)
        self._paused_below = []
        return self.process.exitcode is None

    def stopped_by_another(self) -> bool:
        """Whether the child is stopped though the harness did not pause it (a same-user
        candidate's SIGSTOP, without Landlock's signal scoping); then it is continued."""
        if self.paused or self.process.pid is None or not leftovers.is_stopped(self.process.pid):
            return False
        self._signal_group(signal.SIGCONT)
        return True

    def _signal_group(self, signum: int) -> None:
        pid = self.process.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signum)

    def output(self) -> str:
        self.drain.join(0.5)  # let the drain catch up with what the child wrote before dying
        return self.drain.text()

    def take_output_tail(self) -> dict[str, Any] | None:
        """The last lines of each stream since the last call (``captured_output.record``): what
        the child printed during one item, when it serves several. The child flushes its streams
        before every reply, so once a reply came back, what it printed before is here. After a
        timeout, without the stacks the child printed just before it (the message has them)."""
        self.drain.settle()
        tail = captured_output.record(self.drain.restart())
        if tail is not None and self.timed_out:
            tail = captured_output.cut_from(tail, "stderr", captured_output.STACK_DUMP_START)
        return tail

    def kill(self) -> None:
        pid = self.process.pid
        if pid is None:
            return
        # descendants first (detached ones included: the child is their subreaper), frozen then
        # killed so a fork storm cannot outrun it; then the child's own process group
        leftovers.kill_tree(pid)
        try:
            os.killpg(pid, signal.SIGKILL)  # the child and everything it started in its group
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.kill()
        except Exception:
            pass
        self.process.join(5)
        _live_pids.discard(pid)
        _kill_orphans()

    def close(self) -> None:
        """Ask the child to exit, make sure it did, and remove its working directory."""
        if self._closed:
            return
        self._closed = True
        if self.paused:  # a stopped child would not read the exit command
            self.resume()
        if self.process.exitcode is None:
            try:
                protocol.send(self.conn, {"cmd": "exit"})
            except OSError:
                pass
            self.process.join(2)
        self.kill()
        self.conn.close()
        self.drain.join(2)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
