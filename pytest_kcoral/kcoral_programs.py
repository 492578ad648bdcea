"""Run step, remote transport: an item's processes as KCoral programs on a ``kcoral server`` or
router (``--kcoral-url``).

Every program starts on a fresh worker the service provides (and isolates, and leases a GPU for),
and uploads the harness modules (``remote_runner.py`` and what it imports), the case's files and,
for a candidate program, the candidate file. One command is one ``run`` instruction, so a worker
that dies is reported with the instruction, and so the phase, it died in. A program's commands
are fixed before it is sent; its replies come back together, and ``ReplayedChild`` hands them
out in the order the stages ask, as a local child would answer them.

The client has no read timeout, so the service's health is asked while a program is out: a
service that stops answering fails the item as ungraded (an "outage"), never as the candidate's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_kcoral import captured_output, protocol
from pytest_kcoral.cases import Case
from pytest_kcoral.context import Budget
from pytest_kcoral.isolation import ChildFailure, failure_of
from pytest_kcoral.messages import Command, ErrorInfo, LoadCandidate, M, MessageError, R, Started
from pytest_kcoral.options import Settings
from pytest_kcoral.remote_runner import BOOTSTRAP_SOURCE

HARNESS_DIR = Path(__file__).resolve().parent
# The server's limit is a backstop behind the runner's own watchdog, which names the phase.
SERVER_TIMEOUT_GRACE_S = 30.0
# A program's worker starts afresh (it imports torch and the case) before the item's own time
# counts (``remote_runner.start``): this much more is allowed for that start.
STARTUP_ALLOWANCE_S = 60.0
CONNECT_TIMEOUT_S = 10.0
# While a program is out, the service's health is asked this often, and must answer this fast: the
# client has no read timeout, so a server that stops answering (frozen, or a router whose last node
# died) would otherwise hold the session forever. Health answers while a worker computes.
HEALTH_POLL_S = 10.0
HEALTH_TIMEOUT_S = 10.0


class RemoteUnavailable(Exception):
    """The KCoral client is missing or the server does not answer: ``str()`` names the URL."""


def connect(url: str) -> tuple[Any, dict[str, Any]]:
    """A ``kcoral.Client`` for ``url`` and the server's health report."""
    try:
        import kcoral  # an optional dependency: the remote extra
    except ImportError as exc:
        raise RemoteUnavailable(
            f"--kcoral-url {url}: the kcoral client is not installed ({exc}); pip install 'pytest-kcoral[remote]'"
        ) from None
    client = kcoral.Client(url, connect_timeout_seconds=CONNECT_TIMEOUT_S)
    try:
        health = client.health()
    except Exception as exc:  # TransportError, KCoralError, ProtocolError: none of them can grade
        client.close()
        status = getattr(exc, "status_code", None)
        if status == 503:
            why = "it answered, but has no worker to run programs (HTTP 503: a router with no server node yet?)"
        elif status is not None:
            why = f"it answered /health with HTTP {status}: is it a KCoral server or router?"
        else:
            why = f"cannot reach the KCoral server: {type(exc).__name__}: {exc}"
        raise RemoteUnavailable(f"--kcoral-url {url}: {why}") from None
    return client, health


def harness_files() -> dict[str, bytes]:
    """The ``pytest_kcoral`` modules, as the worker imports them (``kcoral_harness/pytest_kcoral/...``)."""
    files = {}
    for path in sorted(HARNESS_DIR.rglob("*.py")):
        rel = path.relative_to(HARNESS_DIR.parent).as_posix()
        if "__pycache__" not in rel:
            files[f"kcoral_harness/{rel}"] = path.read_bytes()
    return files


def case_files(case: Case) -> dict[str, bytes]:
    """The case folder's own files (not subfolders: ``candidates/`` stays here), and the modules a
    GPU MODE problem sets up from elsewhere, under their names beside them (``utils.py``); a
    KernelBench problem file among others alone."""
    if case.standalone:  # a KernelBench problem file among others: only it is the case's
        return {f"case/{case.source.name}": case.source.read_bytes()}
    files = {f"case/{p.name}": p.read_bytes() for p in sorted(case.folder.iterdir()) if p.is_file() and not p.name.endswith(".pyc")}
    files.update({f"case/{name}": path.read_bytes() for name, path in case.helper_files.items()})
    return files


class Programs:
    """Sends KCoral programs to one service and hands back their replies (``ReplayedChild``)."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings = settings
        self.url = url
        self.client, self.health = connect(url)
        self.harness = harness_files()
        self.sent: list[dict[str, Any]] = []  # the programs sent for the item being graded (``extra.remote.programs``)
        # the last worker's start, for a program whose worker died: KCoral then drops every reply,
        # the start's included
        self.last_startup_s = 0.0

    def close(self) -> None:
        self.client.close()

    def execute(self, role: str, case: Case, case_spec: dict[str, Any], env: dict[str, str], commands: list[tuple[Command[Any], str]],
                budget: Budget, extra_files: dict[str, bytes] | None = None) -> ReplayedChild:
        """One program: upload, ``start``, one ``run`` per command, ``done``; its replies,
        replayable. Its time on the server comes out of ``budget``; its wait for a worker does not."""
        from kcoral import Program  # the optional KCoral client: pip install 'pytest-kcoral[remote]'

        budget_s = budget.remaining_s()
        if budget_s <= 0:
            first = commands[0][1]
            return ReplayedChild.failed(ChildFailure("timeout", first, f"timed out before phase '{first}' (item timeout reached)"))
        program = Program()
        for path, data in {**self.harness, **case_files(case), **(extra_files or {})}.items():
            program.upload_file(blob=data, path=path)
        runner = program.upload(id="runner", kind="module", source=BOOTSTRAP_SOURCE)
        start, command, done = (program.get_function(id=f"fn_{n}", module=runner, name=n) for n in ("start", "command", "done"))
        phases = {START: STARTUP_PHASE}
        program.return_(key=START, value=program.run(id=START, fn=start, args=[role, case_spec, env, budget_s]))
        for sent, phase in commands:
            header, payload = sent.to_wire()
            args: list[Any] = [sent.op, json.dumps(header), None]
            if payload is not None:
                args[2] = program.upload(id=f"payload_{sent.op}", kind="bytes", value=protocol.encode_payload(payload))
            phases[sent.op] = phase
            program.return_(key=sent.op, value=program.run(id=sent.op, fn=command, args=args))
        program.run(id="done", fn=done)
        return self._send(program, role, phases, budget)

    def _execute_watched(self, program: Any, budget_s: float) -> Any:
        """``client.execute`` in a thread of its own, while the service's health is watched here.

        A service that stops answering, or has no worker left, raises ``ServiceDown`` after
        closing the client (which ends the blocked request) and opening a new one. Waiting for a
        worker while the service is healthy is bounded by ``--kcoral-lease-timeout`` only, as
        waiting for a device is locally."""
        box: dict[str, Any] = {}

        def execute() -> None:
            try:
                box["outcome"] = self.client.execute(program, timeout_seconds=budget_s + STARTUP_ALLOWANCE_S + SERVER_TIMEOUT_GRACE_S)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc

        started = time.monotonic()
        thread = threading.Thread(target=execute, name="kcoral-remote-execute", daemon=True)
        thread.start()
        lease_s = self.settings.lease_timeout_s if self.settings.lease_timeout_s is not None else float("inf")
        patience = budget_s + STARTUP_ALLOWANCE_S + SERVER_TIMEOUT_GRACE_S + lease_s
        while True:
            thread.join(HEALTH_POLL_S)
            if not thread.is_alive():
                break
            waited = time.monotonic() - started
            problem = _watch_health(self.url)
            if problem is not None:
                problem = f"the KCoral server at {self.url} stopped answering after {waited:.0f} s: {problem}"
            elif waited > patience:
                problem = (f"no worker of the KCoral service at {self.url} finished the program within {waited:.0f} s"
                           f" (the item's {budget_s:.0f} s, and --kcoral-lease-timeout for a worker)")
            if problem is not None:
                self.client.close()  # the blocked request ends with a transport error
                thread.join(HEALTH_TIMEOUT_S)
                self.client = self._fresh_client()  # for the items after this one: makes no connection yet
                raise ServiceDown(problem)
        if "error" in box:
            raise box["error"]
        return box["outcome"]

    def _fresh_client(self) -> Any:
        import kcoral  # the optional KCoral client, as in ``connect``

        return kcoral.Client(self.url, connect_timeout_seconds=CONNECT_TIMEOUT_S)

    def _send(self, program: Any, role: str, phases: dict[str, str], budget: Budget) -> ReplayedChild:
        from kcoral import KCoralError, TransportError  # the optional KCoral client, as in ``connect``

        budget_s = budget.remaining_s()
        first = next(iter(phases.values()))
        started = time.monotonic()
        try:
            outcome = self._execute_watched(program, budget_s)
        except ServiceDown as exc:
            return ReplayedChild.failed(ChildFailure("outage", first, str(exc)))
        except KCoralError as exc:
            if exc.status_code == 504 or exc.kind == "timeout":
                # the server's own limit: it does not say which instruction was running
                failure = ChildFailure("timeout", "unknown", f"timed out on the KCoral server: its own time limit (its"
                                       f" --max-timeout-seconds) or this item's --kcoral-timeout was reached; the server does not say"
                                       f" which instruction was running (request {exc.request_id})")
            elif exc.status_code == 503:
                failure = ChildFailure("outage", first, f"the KCoral service at {self.url} has no worker for the {role} program: {exc}")
            else:
                failure = ChildFailure("protocol", first, f"the KCoral server at {self.url} refused the {role} program: {exc} (kind {exc.kind})")
            return ReplayedChild.failed(failure)
        except TransportError as exc:  # refused, reset, or disconnected: the service is gone, not the item's fault
            return ReplayedChild.failed(ChildFailure("outage", first, f"the KCoral server at {self.url} stopped answering: {type(exc).__name__}: {exc}"))
        except Exception as exc:  # ProtocolError
            return ReplayedChild.failed(ChildFailure("protocol", first, f"KCoral server at {self.url}: {type(exc).__name__}: {exc}"))
        wall_s = time.monotonic() - started
        # waiting for a worker, and its start, are not the item's own work (as waiting for a lease
        # is not, locally)
        said_s = startup_seconds(outcome)
        startup_s = self.last_startup_s if said_s is None else said_s
        self.last_startup_s = startup_s
        budget.extend(outcome.queue_ms / 1000.0 + startup_s)
        self.sent.append({
            "role": role,
            "request_id": outcome.request_id,
            "status": outcome.status,
            "queue_ms": outcome.queue_ms,
            "elapsed_ms": outcome.elapsed_ms,
            "lease_wait_ms": outcome.lease_wait_ms,
            "lease_held_ms": outcome.lease_held_ms,
            "gpu_ids": list(outcome.gpu_ids),
            "startup_ms": None if said_s is None else round(said_s * 1000.0, 1),
        })
        own_s = wall_s - outcome.queue_ms / 1000.0 - startup_s
        return ReplayedChild(outcome, phases, own_s >= budget_s, role)


class ServiceDown(Exception):
    """The KCoral service stopped answering, or has no worker left, while a program was out."""


def health_of(url: str) -> tuple[int, dict[str, Any]] | None:
    """The service's ``/health`` (HTTP status, body), or None when it does not answer within
    ``HEALTH_TIMEOUT_S`` (the kcoral client's own call has no read timeout)."""
    import httpx  # installed with the KCoral client (the remote extra)

    try:
        response = httpx.get(f"{url.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S)
        body = response.json()
    except Exception:  # noqa: BLE001 - any failure to answer is the finding
        return None
    return response.status_code, body if isinstance(body, dict) else {}


def _watch_health(url: str) -> str | None:
    """Why the service at ``url`` cannot finish a program now, or None while it is healthy."""
    answer = health_of(url)
    if answer is None:
        return f"its health check got no answer within {HEALTH_TIMEOUT_S:.0f} s"
    return _unhealthy(*answer)


def _unhealthy(http_status: int, body: dict[str, Any]) -> str | None:
    """What a ``/health`` answer says is wrong, or None for a service that can finish programs.

    Only the status counts. A router with no server node left answers 503, status 'unavailable'.
    ``load.request_capacity`` is 0 on a healthy server too, while it replaces a worker (after every
    program, by default) and so, often, while it is busy: one poll in eight read 0 on an idle
    one-worker server with a request waiting, one in two under load."""
    if http_status != 200 or body.get("status") != "ok":
        return f"its health check says status {body.get('status')!r} (HTTP {http_status})"
    return None


def device_kind_of(health: dict[str, Any]) -> str:
    """'cuda' when the service's workers have GPUs: a server counts them (``gpu_count``); a router
    does not (null), but passes on its nodes' compile target, which names a GPU architecture
    (``{"arch": "sm_90a"}``) and is empty for CPU workers."""
    gpus = health.get("gpu_count")
    target = health.get("target")
    arch = target.get("arch") if isinstance(target, dict) else None
    return "cuda" if (isinstance(gpus, int) and gpus > 0) or arch else "cpu"


def server_info(url: str, health: dict[str, Any]) -> dict[str, Any]:
    """What the JSON records of the service that ran an item (``extra.remote``)."""
    return {"url": url, **{key: health.get(key) for key in ("instance_id", "gpu_count", "target", "versions")}}


class ReplayedChild:
    """A finished program's replies, handed out one command at a time like ``isolation.Child``."""

    def __init__(self, outcome: Any, phases: dict[str, str], out_of_time: bool, role: str = "candidate") -> None:
        self.outcome = outcome
        self.role = role  # whose program: its audit's findings name the baseline or the candidate
        self.phases = phases
        self.out_of_time = out_of_time
        self.failure: ChildFailure | None = None
        # the whole program's time on the server bounds any one command's (``implausible_stats``)
        self.last_call_s = outcome.elapsed_ms / 1000.0 if outcome is not None else 0.0

    @classmethod
    def failed(cls, failure: ChildFailure) -> ReplayedChild:
        replay = cls(None, {}, False)
        replay.failure = failure
        return replay

    def close(self) -> None:
        pass  # the program is over; its worker went with it

    def start(self, phase: str) -> Started:
        """The program's ``start`` instruction: the runner built, as a child's first word is."""
        return self._reply(START, phase, lambda header, _payload: Started.from_wire(header))

    def call(self, command: Command[R], phase: str, reply_limit_bytes: int | None = None, fds: Sequence[int] = ()) -> R:
        if fds:
            raise ValueError("a KCoral program takes no file descriptors: a feed is for local children")
        if command.op == LoadCandidate.op and self._gate_passed(command.op):
            # KCoral drops every reply of a program whose worker died, also those that came
            # before; a later command ran the candidate, so this gate had passed
            return command.parse_reply({"entry": "unknown: the reply went with the worker"}, None)
        return self._reply(command.op, phase, command.parse_reply)

    def _gate_passed(self, op: str) -> bool:
        """Whether the program failed at an instruction after ``op``, its reply lost with the rest."""
        if self.outcome is None or self.outcome.results.get(op) is not None:
            return False
        order = list(self.phases)
        failed_at = (self.outcome.error or {}).get("instruction_id")
        return failed_at in order and op in order and order.index(failed_at) > order.index(op)

    def _reply(self, op: str, phase: str, parse: Callable[[dict[str, Any], Any], M]) -> M:
        if self.failure is not None:
            raise self.failure
        reply = self.outcome.results.get(op)
        if reply is None:
            if op == START and self._gate_passed(op):
                return parse({"pid": 0}, None)
            raise self._program_failure(op, phase)
        header = json.loads(reply["header"])
        try:
            if not header.get("ok"):
                raise failure_of(ErrorInfo.parse(header.get("error") or {}), self.role, phase, self._output())
            data = protocol.decode_payload(reply["payload"]) if reply.get("payload") is not None else None
            return parse(header, data)
        except (protocol.ProtocolError, MessageError) as exc:
            raise ChildFailure("protocol", phase, f"sent a malformed reply in phase '{phase}': {exc}", self._output()) from None

    def _program_failure(self, cmd: str, phase: str) -> ChildFailure:
        """No reply for ``cmd``: the program failed at it (or before it)."""
        error = self.outcome.error or {}
        failed_at = error.get("instruction_id")
        at_phase = self.phases.get(failed_at or "", phase)
        if error.get("kind") == "runtime" and "worker exited" in error.get("message", ""):
            if self.out_of_time:
                why = f"timed out in phase '{at_phase}' (item timeout reached)"
                if at_phase == STARTUP_PHASE:
                    why += STARTUP_TIMEOUT_HINT
                return ChildFailure("timeout", at_phase, why, self._output())
            return ChildFailure("crash", at_phase, f"the KCoral worker exited in phase '{at_phase}' (a crash, os._exit or a kill; "
                                                   "the server does not report the exit status)", self._output())
        kind = error.get("kind", "unknown")
        return ChildFailure("protocol", at_phase, f"the KCoral program failed at instruction {failed_at!r} ({kind}): {error.get('message', '')}",
                            self._output())

    def take_output_tail(self) -> dict[str, Any] | None:
        """What the program printed, kept as a local child's output is (``captured_output.record``)."""
        if self.outcome is None:
            return None
        tails = {name: captured_output.StreamTail() for name in captured_output.STREAMS}
        for name, tail in tails.items():
            tail.feed((getattr(self.outcome, name, None) or "").encode())
        return captured_output.record(tails)

    def _output(self) -> str:
        if self.outcome is None:
            return ""
        return "\n".join(s for s in (self.outcome.stdout, self.outcome.stderr) if s)


# The program's first instruction, which builds the runner (``remote_runner.start``).
START = "start"
STARTUP_PHASE = "startup"
STARTUP_TIMEOUT_HINT = (f": the KCoral worker had not started (a fresh process per program imports torch and the case first)"
                        f" within {STARTUP_ALLOWANCE_S:.0f} s; the server may be overloaded")


def startup_seconds(outcome: Any) -> float | None:
    """How long the program's worker took to start (``remote_runner.start``), or None when it
    did not say (it never started). At most ``STARTUP_ALLOWANCE_S``: the reply waits in the worker,
    where the candidate's code runs later, so a forged figure must not buy the item more time."""
    reply = (getattr(outcome, "results", None) or {}).get(START)
    if not reply:
        return None
    try:
        value = json.loads(reply["header"]).get("startup_s")
    except (TypeError, ValueError, KeyError):
        return None
    return min(float(value), STARTUP_ALLOWANCE_S) if isinstance(value, (int, float)) and value >= 0 else None
# The stage a failure in each phase belongs to (a lost reply raises it from an earlier stage's call).
_STAGE_OF_PHASE = {"startup": "compile", "import": "compile", "correctness": "correctness", "timing": "timing"}


