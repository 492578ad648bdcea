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

import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import signal
import tempfile
import threading
import time
from multiprocessing import context as mp_context
from multiprocessing import popen_forkserver, spawn
from multiprocessing.connection import Connection
from typing import Any

from pytest_kcoral import child, protocol

# Imported once by the template so children start warm. Missing ones are skipped by forkserver.
TEMPLATE_PRELOAD = ["torch", "triton", "triton.language", "pytest_kcoral.child", "pytest_kcoral.case_runtime", "pytest_kcoral.timing"]

_OUTPUT_HEAD_BYTES = 4 << 10
_OUTPUT_TAIL_BYTES = 16 << 10

_template_ready = False
_template_lock = threading.Lock()
_launch_lock = threading.Lock()
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
                super()._launch(process_obj)
            finally:
                spawn.get_preparation_data = _get_preparation_data


class _TemplateProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _TemplatePopen:
        return _TemplatePopen(process_obj)


def _ensure_template(env: dict[str, str]) -> None:
    """Start the template (one per pytest process) preloaded with what every child imports.

    The template starts with the children's environment: Triton reads ``TRITON_INTERPRET`` when
    it is imported (its own library functions are jitted then), so the CPU interpreter must be
    chosen before the preload, not in the child.
    """
    global _template_ready
    with _template_lock:
        if _template_ready:
            return
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            multiprocessing.forkserver.set_forkserver_preload(TEMPLATE_PRELOAD)
            multiprocessing.forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _template_ready = True


class ChildFailure(Exception):
    """A child did not complete a command: it raised, crashed, exited, hung or lied on the wire."""

    def __init__(self, kind: str, phase: str, message: str, output: str = "", error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind  # "error" | "crash" | "exit" | "timeout" | "protocol"
        self.phase = phase
        self.message = message
        self.output = output
        self.error = error or {}


class _OutputDrain(threading.Thread):
    """Reads a child's stdout/stderr to EOF, keeping the first and last few kilobytes."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True, name=f"kcoral-drain-{fd}")
        self.fd = fd
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 65536):
                self.total += len(chunk)
                if len(self.head) < _OUTPUT_HEAD_BYTES:
                    take = _OUTPUT_HEAD_BYTES - len(self.head)
                    self.head += chunk[:take]
                    chunk = chunk[take:]
                self.tail += chunk
                if len(self.tail) > 2 * _OUTPUT_TAIL_BYTES:
                    del self.tail[: len(self.tail) - _OUTPUT_TAIL_BYTES]
        except OSError:
            pass
        finally:
            os.close(self.fd)

    def text(self) -> str:
        tail = bytes(self.tail[-_OUTPUT_TAIL_BYTES:])
        dropped = self.total - len(self.head) - len(tail)
        middle = f"\n[... {dropped} bytes of output dropped ...]\n" if dropped > 0 else ""
        return (bytes(self.head) + middle.encode() + tail).decode(errors="replace")


class Child:
    """The parent's handle on one child process."""

    def __init__(self, role: str, case_spec: dict[str, Any], env: dict[str, str], deadline: float, label: str = "") -> None:
        self.role = role
        self.label = label or role
        self.deadline = deadline
        self.phase = "startup"
        self.workdir = tempfile.mkdtemp(prefix=f"kcoral-{role}-")
        _ensure_template(env)
        self.conn, child_conn = multiprocessing.Pipe(duplex=True)
        out_r, out_w = os.pipe()
        out_w_conn = Connection(out_w, readable=False)
        self.process = _TemplateProcess(
            target=child.main,
            args=(child_conn, out_w_conn, role, self.workdir, env, case_spec),
            name=f"kcoral-{self.label}",
            daemon=True,
        )
        self.started_at = time.perf_counter()
        try:
            self.process.start()
        finally:
            child_conn.close()
            out_w_conn.close()
        self.drain = _OutputDrain(out_r)
        self.drain.start()
        self._closed = False
        try:
            header, _ = self._receive()
        except BaseException:
            self.close()
            raise
        self.pid = header.get("pid", self.process.pid)
        self.startup_s = time.perf_counter() - self.started_at

    def call(self, cmd: str, phase: str, payload: Any = None, **fields: Any) -> tuple[dict[str, Any], Any]:
        """Send a command and return its reply; raise ``ChildFailure`` if it does not come back."""
        self.phase = phase
        try:
            protocol.send(self.conn, dict(fields, cmd=cmd), payload)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            self._raise_died()
        return self._receive()

    def _receive(self) -> tuple[dict[str, Any], Any]:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0 or not self.conn.poll(remaining):
            self.kill()
            raise ChildFailure("timeout", self.phase, f"timed out in phase '{self.phase}' (item timeout reached)", self.output())
        try:
            header, payload = protocol.recv(self.conn)
        except (EOFError, ConnectionResetError, OSError):
            self._raise_died()
        except protocol.ProtocolError as exc:
            self.kill()
            raise ChildFailure("protocol", self.phase, f"sent a malformed message in phase '{self.phase}': {exc}", self.output()) from None
        if not header.get("ok"):
            error = header.get("error") or {}
            message = f"{error.get('type', 'Error')}: {error.get('message', '')}"
            raise ChildFailure("error", self.phase, message, self.output(), error)
        return header, payload

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

    def output(self) -> str:
        self.drain.join(0.5)  # let the drain catch up with what the child wrote before dying
        return self.drain.text()

    def kill(self) -> None:
        pid = self.process.pid
        if pid is None:
            return
        try:
            os.killpg(pid, signal.SIGKILL)  # the child and everything it started in its group
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.kill()
        except Exception:
            pass
        self.process.join(5)

    def close(self) -> None:
        """Ask the child to exit, make sure it did, and remove its working directory."""
        if self._closed:
            return
        self._closed = True
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
