"""Run step, remote: an item's stages as KCoral programs sent to a ``kcoral server`` or router.

``RemoteExecutor`` is a ``LocalExecutor`` whose children live on a KCoral service. Every program
starts on a fresh worker the server provides (and isolates, and leases a GPU for), and uploads the
harness modules (``remote_runner.py`` and what it imports), the case's files and, for a candidate
program, the candidate file. One stage command is one ``run`` instruction, so a worker that dies
is reported with the instruction, and so the phase, it died in.

Per item: a *trusted* program makes the inputs and runs the reference (cached, as locally); one
*candidate* program imports the candidate and runs correctness, timing and the last audit; in
full mode, a *baseline* program goes the candidate program's way with the baseline and times it,
and trusted programs give the case's cost and recompute the reference for the timed outputs the
candidate sent back. The candidate never shares a process with the reference or the baseline.
Replies are compared in the pytest process by the same code as local runs (``correctness.py``,
``pipeline.LocalExecutor``), so the messages, the JSON and the scores are the same.

The candidate program runs its stages in one go (a fresh worker per stage would import it again);
its replies are then replayed through ``ReplayedChild`` in stage order, so an item still ends at
the first stage that fails and later stages' results are ignored.
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_kcoral import captured_output, protocol
from pytest_kcoral.cases import Case
from pytest_kcoral.isolation import ChildFailure
from pytest_kcoral.options import Settings
from pytest_kcoral.pipeline import ItemSpec, LocalExecutor, StageFailed, timed_phase, untimed_reason
from pytest_kcoral.results import ItemResult

HARNESS_DIR = Path(__file__).resolve().parent
# The server's limit is a backstop behind the runner's own watchdog, which names the phase.
SERVER_TIMEOUT_GRACE_S = 30.0
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
        import kcoral
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


def _harness_files() -> dict[str, bytes]:
    """The ``pytest_kcoral`` modules, as the worker imports them (``kcoral_harness/pytest_kcoral/...``)."""
    files = {}
    for path in sorted(HARNESS_DIR.rglob("*.py")):
        rel = path.relative_to(HARNESS_DIR.parent).as_posix()
        if "__pycache__" not in rel:
            files[f"kcoral_harness/{rel}"] = path.read_bytes()
    return files


def _case_files(case: Case) -> dict[str, bytes]:
    """The case folder's own files (not subfolders: ``candidates/`` stays here), and the modules a
    GPU MODE problem sets up from elsewhere, under their names beside them (``utils.py``); a
    KernelBench problem file among others alone."""
    if case.standalone:  # a KernelBench problem file among others: only it is the case's
        return {f"case/{case.source.name}": case.source.read_bytes()}
    files = {f"case/{p.name}": p.read_bytes() for p in sorted(case.folder.iterdir()) if p.is_file() and not p.name.endswith(".pyc")}
    files.update({f"case/{name}": path.read_bytes() for name, path in case.helper_files.items()})
    return files


class RemoteExecutor(LocalExecutor):
    def __init__(self, settings: Settings, url: str) -> None:
        from pytest_kcoral.remote_runner import BOOTSTRAP_SOURCE

        self.url = url
        self.client, health = connect(url)
        device_kind = _device_kind(health)
        # the server owns leases: no local lease is taken for remote items
        super().__init__(settings, lease_factory=_no_lease, device_kind=device_kind)
        self.worker_device = "cuda:0" if device_kind == "cuda" else "cpu"  # a worker sees its own GPU(s) only
        self.server = _server_info(url, health)
        self._bootstrap = BOOTSTRAP_SOURCE
        self._harness = _harness_files()
        self._programs: list[dict[str, Any]] = []

    def close(self) -> None:
        self.client.close()

    # -- stages -------------------------------------------------------------------------------

    def run(self, spec: ItemSpec) -> ItemResult:
        self._programs = []
        # who serves this item: a server restarted since the last item is another instance
        fresh = _health(self.url)
        if fresh is not None and fresh[0] == 200:
            self.server = _server_info(self.url, fresh[1])
        result = super().run(spec)
        if result.outcome != "skipped" or self._programs:
            result.extra["remote"] = dict(self.server, programs=self._programs)
            if self._programs:
                result.lease_wait_ms = sum(p["lease_wait_ms"] for p in self._programs)
                result.lease_held_ms = sum(p["lease_held_ms"] for p in self._programs)
        return result

    def _run_stages(self, spec: ItemSpec, result: ItemResult, deadline: float) -> None:
        from pytest_kcoral import correctness

        case = spec.case
        tol = correctness.Tolerance(case.atol, case.rtol, strict=self.settings.tolerance == "strict")
        device = self.worker_device
        result.device = f"{device}@{self.url}"
        self._deadline = deadline

        def trusted() -> RemoteTrusted:
            return RemoteTrusted(self, case)

        # the inputs come from the trusted side first: the candidate's program carries them
        with timed_phase(result, "reference"):
            try:
                ref = self._reference_data(spec, device, trusted, tol)  # type: ignore[arg-type]  # answers as a Child does; no shared type yet
            except StageFailed as failure:
                if failure.case_failed:
                    # a local run compiles first: learn what it would have, so the item reads the same
                    result.compiled = self._compiles(spec)
                raise
        # known before the candidate runs, so a compile failure still counts in the quadrants
        ref.record_into(result)
        # the candidate's whole program runs here; the phases below only replay its replies
        with timed_phase(result, "compile"):
            candidate = self._candidate_program(spec, ref, device)
            result.output_tail = candidate.take_output_tail()
            self._stage("compile", lambda: candidate.call("start", "startup"))
            self._stage("compile", lambda: candidate.call("load_candidate", "import"))
        result.compiled = True
        with timed_phase(result, "correctness"):
            self._check_correctness(spec, candidate, ref, device, tol, trusted)  # type: ignore[arg-type]  # answers as a Child does; no shared type yet
        result.correct = True
        if self.settings.mode != "correctness":
            with timed_phase(result, "timing"):
                baseline = self._baseline_program(spec, ref, device) if self._timed(spec, ref) else None
                if baseline is not None:
                    self._baseline_call(baseline, "start", "baseline")  # type: ignore[arg-type]  # answers as a Child does; no shared type yet
                    self._baseline_call(baseline, "load_baseline", "baseline")  # type: ignore[arg-type]  # answers as a Child does; no shared type yet
                # no timing core: a core of this host means nothing on the server, and the
                # candidate's program is built without one, so neither side is pinned
                # a replay answers as a Child does; no shared type yet
                self._time(spec, candidate, baseline, trusted, ref, device, None, tol, result)  # type: ignore[arg-type]
        self._stage("correctness" if self.settings.mode == "correctness" else "timing", lambda: candidate.call("finish", "finish"))

    def _timing_rounds(self, ref: Any) -> int:
        """One timing round per side: a candidate program's commands are fixed before it is sent,
        and every trusted call is a program of its own."""
        return 1

    def _first_sides(self, spec: ItemSpec) -> Iterator[str]:
        """The candidate's, always: its program runs whole, timing included, before the
        baseline's program is sent (``_run_stages``); the turns here only replay replies."""
        return itertools.repeat("candidate")

    def _process_pairs_for(self, pairs: list[Any]) -> int:
        """One pair of programs, whatever ``--kcoral-process-pairs`` says: the server starts a
        fresh worker per program, and timing in further pairs would send a pair of programs each
        (not yet done; docs/design.md)."""
        return 1

    def _timed(self, spec: ItemSpec, ref: Any) -> bool:
        """Whether the item reaches timing once correct (``pipeline.untimed_reason``): a program's
        commands are fixed before it is sent, so an untimed item's carry no timing."""
        return self.settings.mode != "correctness" and untimed_reason(spec, ref) is None

    def _stage(self, stage: str, fn: Any) -> Any:
        try:
            return fn()
        except ChildFailure as failure:
            # a crash or a timeout belongs to the stage of the phase it happened in
            if failure.kind in ("crash", "timeout") and failure.phase in _STAGE_OF_PHASE:
                stage = _STAGE_OF_PHASE[failure.phase]
            return super()._stage(stage, functools.partial(_reraise, failure))

    def _compiles(self, spec: ItemSpec) -> bool:
        """Whether the candidate imports (a program of its own, run only when the case failed
        before the candidate's program could be built). A candidate that does not compile fails
        its item at compile, as it would locally, ahead of the case's failure."""
        # its own budget, as a local compile has: the case's failure (a hung reference) may have
        # used up the item's
        self._deadline = time.monotonic() + self.settings.timeout_s
        load, files = _candidate_upload(spec)
        program = self.execute("candidate", spec.case, [load, ("finish", "finish", {}, None)], files)
        try:
            program.call("start", "startup")
        except ChildFailure:
            return False  # the case fails in the candidate's process too: the case's failure stands
        self._stage("compile", lambda: program.call("load_candidate", "import"))
        return True

    def _candidate_program(self, spec: ItemSpec, ref: Any, device: str) -> ReplayedChild:
        load, files = _candidate_upload(spec)
        commands = self._side_commands(spec, ref, device, load, ("correctness", "timing"))
        commands.append(("finish", "finish", {}, None))
        return self.execute("candidate", spec.case, commands, files)

    def _baseline_program(self, spec: ItemSpec, ref: Any, device: str) -> ReplayedChild:
        """The baseline's timing: a program that goes the candidate's program's way, with the
        baseline in the candidate's place (``LocalExecutor._baseline_child`` says why)."""
        load: tuple[str, str, dict[str, Any], Any] = ("load_baseline", "baseline", {}, None)
        return self.execute("baseline", spec.case, self._side_commands(spec, ref, device, load, ("baseline", "baseline"), send_kept=False))

    def _side_commands(self, spec: ItemSpec, ref: Any, device: str, load: tuple[str, str, dict[str, Any], Any],
                       phases: tuple[str, str], **time_fields: Any) -> list[tuple[str, str, dict[str, Any], Any]]:
        """One side's load, correctness run and (unless ``--kcoral-mode correctness``) timing: a
        program's commands are fixed before it is sent, so both sides' are built here alike."""
        from pytest_kcoral.pipeline import correctness_run

        run = correctness_run(spec, ref, device)
        payload = run.pop("payload")
        commands: list[tuple[str, str, dict[str, Any], Any]] = [load, ("run", phases[0], run, payload)]
        if self._timed(spec, ref):
            commands.append(("time", phases[1], dict(self._time_fields(spec, ref, device), **time_fields), None))
        return commands

    # -- programs ----------------------------------------------------------------------------

    def _case_spec(self, case: Case) -> dict[str, Any]:
        # paths relative to the program's workspace, where ``_case_files`` puts them
        spec = super()._case_spec(case)
        spec["source"] = f"case/{case.source.name}"
        spec["helper_files"] = {}  # uploaded beside the case's files (``_case_files``)
        if case.baseline_file:
            spec["baseline_file"] = f"case/{case.baseline_file.name}"
        return spec

    def execute(self, role: str, case: Case, commands: list[tuple[str, str, dict[str, Any], Any]],
                extra_files: dict[str, bytes] | None = None) -> ReplayedChild:
        """One program: upload, ``start``, one ``run`` per command, ``done``; its replies, replayable."""
        from kcoral import Program

        budget_s = self._deadline - time.monotonic()
        if budget_s <= 0:
            return ReplayedChild.failed(ChildFailure("timeout", commands[0][1], f"timed out before phase '{commands[0][1]}' (item timeout reached)"))
        program = Program()
        for path, data in {**self._harness, **_case_files(case), **(extra_files or {})}.items():
            program.upload_file(blob=data, path=path)
        runner = program.upload(id="runner", kind="module", source=self._bootstrap)
        start, command, done = (program.get_function(id=f"fn_{n}", module=runner, name=n) for n in ("start", "command", "done"))
        phases = {"start": "startup"}
        program.return_(key="start", value=program.run(id="start", fn=start, args=[role, self._case_spec(case), self._child_env(), budget_s]))
        for cmd, phase, header, payload in commands:
            args: list[Any] = [cmd, json.dumps(header), None]
            if payload is not None:
                args[2] = program.upload(id=f"payload_{cmd}", kind="bytes", value=protocol.encode_payload(payload))
            phases[cmd] = phase
            program.return_(key=cmd, value=program.run(id=cmd, fn=command, args=args))
        program.run(id="done", fn=done)
        return self._send(program, role, phases, budget_s)

    def _execute_watched(self, program: Any, budget_s: float) -> Any:
        """``client.execute`` in a thread of its own, while the service's health is watched here.

        A service that stops answering, or has no worker left, raises ``ServiceDown`` after
        closing the client (which ends the blocked request) and opening a new one. Waiting for a
        worker while the service is healthy is bounded by ``--kcoral-lease-timeout`` only, as
        waiting for a device is locally."""
        box: dict[str, Any] = {}

        def execute() -> None:
            try:
                box["outcome"] = self.client.execute(program, timeout_seconds=budget_s + SERVER_TIMEOUT_GRACE_S)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc

        started = time.monotonic()
        thread = threading.Thread(target=execute, name="kcoral-remote-execute", daemon=True)
        thread.start()
        patience = budget_s + SERVER_TIMEOUT_GRACE_S + (self.settings.lease_timeout_s if self.settings.lease_timeout_s is not None else float("inf"))
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
        import kcoral

        return kcoral.Client(self.url, connect_timeout_seconds=CONNECT_TIMEOUT_S)

    def _send(self, program: Any, role: str, phases: dict[str, str], budget_s: float) -> ReplayedChild:
        from kcoral import KCoralError, TransportError

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
        # waiting for a worker is not the item's own work (as waiting for a lease is not, locally)
        self._deadline += outcome.queue_ms / 1000.0
        self._programs.append({
            "role": role,
            "request_id": outcome.request_id,
            "status": outcome.status,
            "queue_ms": outcome.queue_ms,
            "elapsed_ms": outcome.elapsed_ms,
            "lease_wait_ms": outcome.lease_wait_ms,
            "lease_held_ms": outcome.lease_held_ms,
            "gpu_ids": list(outcome.gpu_ids),
        })
        return ReplayedChild(outcome, phases, wall_s >= budget_s, role)


class ServiceDown(Exception):
    """The KCoral service stopped answering, or has no worker left, while a program was out."""


def _health(url: str) -> tuple[int, dict[str, Any]] | None:
    """The service's ``/health`` (HTTP status, body), or None when it does not answer within
    ``HEALTH_TIMEOUT_S`` (the kcoral client's own call has no read timeout)."""
    import httpx

    try:
        response = httpx.get(f"{url.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S)
        body = response.json()
    except Exception:  # noqa: BLE001 - any failure to answer is the finding
        return None
    return response.status_code, body if isinstance(body, dict) else {}


def _watch_health(url: str) -> str | None:
    """Why the service at ``url`` cannot finish a program now, or None while it is healthy."""
    answer = _health(url)
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


def _device_kind(health: dict[str, Any]) -> str:
    """'cuda' when the service's workers have GPUs: a server counts them (``gpu_count``); a router
    does not (null), but passes on its nodes' compile target, which names a GPU architecture
    (``{"arch": "sm_90a"}``) and is empty for CPU workers."""
    gpus = health.get("gpu_count")
    target = health.get("target")
    arch = target.get("arch") if isinstance(target, dict) else None
    return "cuda" if (isinstance(gpus, int) and gpus > 0) or arch else "cpu"


def _server_info(url: str, health: dict[str, Any]) -> dict[str, Any]:
    """What the JSON records of the service that ran an item (``extra.remote``)."""
    return {"url": url, **{key: health.get(key) for key in ("instance_id", "gpu_count", "target", "versions")}}


class RemoteTrusted:
    """The trusted side of one item, as ``LocalExecutor`` drives a trusted child: one program per call."""

    def __init__(self, executor: RemoteExecutor, case: Case) -> None:
        self.executor = executor
        self.case = case

    def call(self, cmd: str, phase: str, payload: Any = None, **fields: Any) -> tuple[dict[str, Any], Any]:
        replay = self.executor.execute("trusted", self.case, [(cmd, phase, fields, payload)])
        replay.call("start", "startup")
        return replay.call(cmd, phase)

    def close(self) -> None:
        pass  # each program had a worker of its own, gone with it


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

    def call(self, cmd: str, phase: str, payload: Any = None, **_fields: Any) -> tuple[dict[str, Any], Any]:
        if self.failure is not None:
            raise self.failure
        reply = self.outcome.results.get(cmd)
        if reply is None:
            failure = self._program_failure(cmd, phase)
            order = list(self.phases)
            failed_at = (self.outcome.error or {}).get("instruction_id")
            if cmd in _GATES_ONLY and failed_at in order and order.index(failed_at) > order.index(cmd):
                # KCoral drops every reply of a program whose worker died, also those that came
                # before; a later command ran the candidate, so this gate had passed
                return {"ok": True, "reply_lost": True}, None
            raise failure
        header = json.loads(reply["header"])
        if not header.get("ok"):
            error = header.get("error") or {}
            message = f"{error.get('type', 'Error')}: {error.get('message', '')}"
            if error.get("detected"):
                ran = "the baseline" if self.role == "baseline" else "the candidate"
                message = f"detected after {ran} ran in phase '{phase}': {error.get('message', '')}"
            raise ChildFailure("error", phase, message, self._output(), error)
        try:
            data = protocol.decode_payload(reply["payload"]) if reply.get("payload") is not None else None
        except protocol.ProtocolError as exc:
            raise ChildFailure("protocol", phase, f"sent a malformed reply in phase '{phase}': {exc}", self._output()) from None
        return header, data

    def _program_failure(self, cmd: str, phase: str) -> ChildFailure:
        """No reply for ``cmd``: the program failed at it (or before it)."""
        error = self.outcome.error or {}
        failed_at = error.get("instruction_id")
        at_phase = self.phases.get(failed_at or "", phase)
        if error.get("kind") == "runtime" and "worker exited" in error.get("message", ""):
            if self.out_of_time:
                return ChildFailure("timeout", at_phase, f"timed out in phase '{at_phase}' (item timeout reached)", self._output())
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


# Commands whose reply only opens the gate to the next stage (their data is not needed).
_GATES_ONLY = ("start", "load_candidate")
# The stage a failure in each phase belongs to (a lost reply raises it from an earlier stage's call).
_STAGE_OF_PHASE = {"startup": "compile", "import": "compile", "correctness": "correctness", "timing": "timing"}


def _candidate_upload(spec: ItemSpec) -> tuple[tuple[str, str, dict[str, Any], Any], dict[str, bytes]]:
    """A candidate program's ``load_candidate`` command and the candidate file it imports."""
    path = f"candidate/{spec.candidate.path.name}"
    return ("load_candidate", "import", {"path": path, "shape": spec.shape.params}, None), {path: spec.candidate.path.read_bytes()}


def _reraise(failure: ChildFailure) -> Any:
    raise failure


def _no_lease(_label: str) -> Any:
    raise AssertionError("remote items take no local lease: the KCoral server owns the devices")
