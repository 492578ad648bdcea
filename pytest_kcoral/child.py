"""The stage runner: the code that runs inside a child process, never in the pytest process.

A child has one role. A *trusted* child imports only the case (reference, inputs, the baseline's
correctness, the case's cost); a *candidate* child imports one candidate; a *baseline* child
imports only the case and goes the candidate's way with the baseline (load, one correctness run,
timing), so the two sides of a speedup are timed in processes with the same history. The parent
drives each with commands over a pipe (``protocol.py``) and always knows which phase a child is
in, so a crash or a hang is reported with the phase it reached.

Everything the harness relies on (torch, the timer, the checks) is imported before the candidate
loads, and the candidate's working directory is not on ``sys.path``, so files it writes there
cannot shadow a module the harness imports later.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from pytest_kcoral import confine, leftovers, protocol, tamper
from pytest_kcoral.timing import guards, pinning, placement

TRUSTED = "trusted"
CANDIDATE = "candidate"
BASELINE = "baseline"

# Taken at import, before any candidate loads: the timing inputs' seeds and the choice of the
# timed outputs checked come from the kernel's random source through this reference, so a
# candidate that replaces ``random``'s methods or ``os.urandom`` cannot make them predictable.
_urandom = os.urandom


class Unpredictable:
    """The few draws the harness makes in a child, each straight from ``_urandom`` (its methods
    are watched by the tamper snapshot: ``tamper._WATCHED_CLASSES``)."""

    @staticmethod
    def getrandbits(bits: int) -> int:
        return int.from_bytes(_urandom((bits + 7) // 8), "little") & ((1 << bits) - 1)

    @staticmethod
    def randrange(start: int, stop: int | None = None) -> int:
        low, high = (0, start) if stop is None else (start, stop)
        return low + Unpredictable.getrandbits(64) % (high - low)  # bias under 2**-50 for the harness's ranges

    @staticmethod
    def random() -> float:
        return Unpredictable.getrandbits(53) / (1 << 53)


_rng = Unpredictable()


def main(conn: Connection, stdout: Connection, stderr: Connection, role: str, workdir: str, env: dict[str, str], case_spec: dict[str, Any],
         live_output: bool = False) -> None:
    """Entry point of a child (a multiprocessing target started from the template process).
    ``live_output``: stdout flushed at every line, for ``-s``."""
    os.setsid()  # own process group: the parent kills the child and whatever it started at once
    leftovers.die_with_parent()  # the template dies with the pytest process, and the child with it
    # detached grandchildren (setsid + double fork) come back to this process, where they are found
    leftovers.become_subreaper()
    for fd, pipe in ((1, stdout), (2, stderr)):
        os.dup2(pipe.fileno(), fd)
        pipe.close()
    if live_output:
        with contextlib.suppress(Exception):
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper here
    _std_streams[:] = [sys.stdout, sys.stderr]  # the harness's own: a candidate may replace sys.stdout
    os.chdir(workdir)
    os.environ.update(env)
    sys.path[:] = [p for p in sys.path if p not in ("", ".", workdir)]
    sys.dont_write_bytecode = True
    # bytecode is read from, and written to, this child's own directory only: a .pyc a candidate
    # planted in a case's __pycache__ (matching its source's size and time) would otherwise run in
    # place of the case's checked source, in the trusted child and the baseline's
    sys.pycache_prefix = os.path.join(workdir, "pycache")
    if role in (CANDIDATE, BASELINE):
        _keep_large_allocations_on_heap()
    if role in (TRUSTED, BASELINE):
        _compile_without_shared_caches(workdir)
    try:
        confine.confine_child(role, workdir, cuda=case_spec.get("device_kind") == "cuda")  # writes only here and to the caches
        runner = _Runner(role, case_spec)
    except BaseException as exc:  # noqa: BLE001 - the parent must hear why startup failed
        protocol.send(conn, dict(_error_reply(exc), seq=0))
        return
    protocol.send(conn, {"ok": True, "pid": os.getpid(), "seq": 0})
    runner.serve(conn)


_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))


_std_streams: list[Any] = []  # stdout and stderr as the child started (``main``)


def _flush_std_streams() -> None:
    """Flush the streams the child started with: never a flush() a candidate put in their place,
    which would run its code after the command's audit."""
    for stream in _std_streams:
        with contextlib.suppress(Exception):  # a candidate may have closed them
            stream.flush()


def _compile_without_shared_caches(workdir: str) -> None:
    """The trusted and the baseline child compile the reference's and the baseline's kernels
    themselves and never load compiled code from a disk cache.

    Compile caches are shared: Triton's (``~/.triton/cache``), Inductor's
    (``/tmp/torchinductor_<user>``) and ``torch.utils.cpp_extension``'s builds, and under
    ``--kcoral-sandbox`` the session workspace that holds them is writable by every child. A
    candidate that replaced a cached baseline kernel with a slower one would earn a speedup; one
    that planted an extension build would run its code in this process. So Triton always compiles,
    Inductor's caches are off, and every cache directory is in this child's private directory.
    """
    os.environ.update({
        "TRITON_ALWAYS_COMPILE": "1",  # read at every compile: the template's import predates it
        "TRITON_CACHE_DIR": os.path.join(workdir, "triton-cache"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(workdir, "inductor-cache"),
        "TORCH_EXTENSIONS_DIR": os.path.join(workdir, "torch-extensions"),
    })
    # read from the environment when torch was imported, in the template, before this child existed
    compile_config: Any
    try:
        import torch.compiler.config as compile_config
    except ImportError:  # older torch keeps the flag in Inductor's own config
        import torch._inductor.config as compile_config
    # a torch without the flag still keeps Inductor's cache in the private directory above
    with contextlib.suppress(AttributeError):
        compile_config.force_disable_caches = True


def _error_reply(exc: BaseException) -> dict[str, Any]:
    # the harness's own frames say nothing to the kernel author: keep the candidate's and the case's
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith((_HARNESS_DIR, "<frozen"))]
    tb = traceback.format_list(frames[-10:]) + traceback.format_exception_only(type(exc), exc)
    return {
        "ok": False,
        "error": {
            "type": type(exc).__name__,
            "message": _exit_message(exc) if isinstance(exc, SystemExit) else str(exc)[:4000],
            "traceback": "".join(tb)[-6000:],
            "compile_error": _is_compile_error(exc),
            "needs_cuda": _needs_cuda(exc),
        },
    }


def _exit_message(exc: SystemExit) -> str:
    return f"called sys.exit({exc.code!r})"


def _is_compile_error(exc: BaseException) -> bool:
    """Compiler errors that surface at the first call count as compile failures, and so does a
    candidate found at its first call not to have a candidate's shape (a ``prepare()`` that returns
    no callable): neither ever built something to run."""
    import subprocess

    from pytest_kcoral.case_runtime import CandidateError

    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    for e in chain:
        kind = type(e)
        if kind.__module__.startswith(("triton.compiler", "triton.runtime.errors")) or kind.__name__ in (
            "CompilationError",
            "CompileTimeAssertionFailure",
            "NVRTCError",
        ):
            return True
        if isinstance(e, (subprocess.CalledProcessError, CandidateError)) or "Error building extension" in str(e):
            return True
    return False


# what torch says when a case needs CUDA on a machine without it; a CPU build of torch raises the
# last one for ``torch.Generator(device="cuda")``, which GPU MODE's reference.py files use
_CUDA_MISSING = ("Torch not compiled with CUDA", "No CUDA GPUs are available", "Found no NVIDIA driver", "CUDA driver",
                 "without ATen_cuda library")


def _needs_cuda(exc: BaseException) -> bool:
    return any(text in str(exc) for text in _CUDA_MISSING)


class _Runner:
    def __init__(self, role: str, case_spec: dict[str, Any]) -> None:
        import torch

        # loaded before candidate code, so the tamper snapshot covers the comparison it runs here
        from pytest_kcoral import correctness, timing  # noqa: F401
        from pytest_kcoral.case_runtime import CaseRuntime

        # the timers' clocks, synchronize and CUPTI entry points, taken before candidate code loads
        timing.prepare(case_spec.get("device_kind", "cpu"))
        if case_spec.get("device_kind", "cpu") == "cpu":
            # CPU timing is single-threaded: OpenMP workers of one child spinning after its last
            # parallel region would steal the cores from the next child's timed calls
            torch.set_num_threads(1)
        elif case_spec.get("cpu_threads"):
            # this worker's share of the host's cores (``cpu_share``): pools as wide as the machine
            # in every worker's processes fight over each core
            torch.set_num_threads(int(case_spec["cpu_threads"]))
        self.role = role
        self.case = CaseRuntime(case_spec)
        self.device = self.case.device
        self.candidate: Any = None
        # what the harness itself runs and relies on, taken before any candidate code loads
        self.baseline: leftovers.Baseline | None = None
        self.snapshot: tamper.Snapshot | None = None
        # (key, seeds, input sets, bound callables, placements) of the timing rounds: see ``_time``
        self._timing_sets: tuple[Any, list[int], list[tuple], list[Callable[[], Any]], placement.Placements] | None = None

    def serve(self, conn: Connection) -> None:
        while True:
            try:
                header, payload = protocol.recv(conn)
            except EOFError:
                return
            if header.get("cmd") == "exit":
                return
            # every reply names the command it answers, so a forged or duplicated reply shows
            echo = {"seq": header.get("seq"), "nonce": header.get("nonce")}
            # a command still running just before the parent's deadline prints every thread's
            # stack to the output, so a timeout can say where the candidate was
            dump_after_s = header.get("stack_dump_after_s")
            if isinstance(dump_after_s, (int, float)) and dump_after_s > 0:
                faulthandler.dump_traceback_later(dump_after_s, repeat=False, file=sys.stderr, exit=False)
            try:
                reply, reply_payload = self.handle(header, payload)
            finally:
                faulthandler.cancel_dump_traceback_later()
            _flush_std_streams()  # what the command printed is in the pipes before its reply
            protocol.send(conn, dict(reply, **echo), reply_payload)

    def handle(self, header: dict[str, Any], payload: Any) -> tuple[dict[str, Any], Any]:
        """Run one command and audit afterwards: the reply (``ok`` true or false) and its payload.

        Shared by the pipe loop above and the KCoral runner (``remote_runner.py``)."""
        cmd = header.get("cmd")
        handler = getattr(self, f"_cmd_{cmd}", None)
        if handler is None:
            return {"ok": False, "error": {"type": "ProtocolError", "message": f"unknown command {cmd!r}"}}, None
        try:
            if header.get("device"):
                self._use_device(header["device"])
            reply, reply_payload = handler(header, payload)
            detected = self._audit()
        except BaseException as exc:  # noqa: BLE001 - SystemExit from candidate code included
            return _error_reply(exc), None
        if detected:
            return {"ok": False, "error": {"type": "Detected", "message": "; ".join(detected), "detected": True}}, None
        return dict(reply, ok=True), reply_payload

    def _audit(self) -> list[str]:
        """After candidate code ran: what it left running and which harness functions it replaced."""
        if self.baseline is None or self.snapshot is None:
            return []
        problems = self.baseline.find()
        patched = self.snapshot.changed()
        if patched:
            shown = ", ".join(patched[:6]) + (f" and {len(patched) - 6} more" if len(patched) > 6 else "")
            problems.append(f"replaced functions the harness relies on (timers, synchronization, comparison or the harness itself): {shown}")
        return problems

    def _use_device(self, device: str) -> None:
        """The lease picks the device after compile, so a child learns it with its first GPU command."""
        if device == self.device:
            return
        if device.startswith("cuda"):
            import torch

            torch.cuda.set_device(torch.device(device))
        self.device = self.case.device = device

    # -- trusted role -----------------------------------------------------------------------

    def _cmd_reference(self, header: dict[str, Any], _payload: Any) -> tuple[dict, Any]:
        """Inputs and the reference's outputs for each seed. With ``tolerance`` ([atol, rtol,
        strict]) also the verdicts that need nothing from a candidate, reached here on the device
        so the tensors they read never cross the wire: the baseline's problems against the
        reference (with ``baseline``), whether the reference is weak, and whether it is unsteady
        (a second call on the first input set disagrees with the first call). For the INPLACE
        inputs (``inplace``) the reference writes, their values after its call (``written``)."""
        from pytest_kcoral import correctness

        self._require(TRUSTED)
        shape = header["shape"]
        tol = correctness.Tolerance(*header["tolerance"]) if header.get("tolerance") else None
        inplace = set(header.get("inplace") or ())
        # the inputs whose values after the call are kept: those asked for (the timed calls' check
        # compares what the correctness stage found written), else every INPLACE one
        kept_inputs = header["written_inputs"] if "written_inputs" in header else sorted(inplace)
        inputs, refs, baseline_problems, weak, structure, unsteady = [], [], [], False, 0, []
        baseline_raised = False
        output_aliases: set[tuple[int, int]] = set()
        after_calls, written = [], set()
        for t, seed in enumerate(header["seeds"]):
            args = self.case.make_inputs(shape, seed)
            _check_inplace_indices(inplace, args)
            ref_args = _clone(args)
            ref, structure = flatten_outputs(self.case.reference(shape, ref_args))
            _require_plain_outputs(ref, "reference")
            # an output the reference returns as one of its inputs (``return a.add_(b)``, a no-op
            # ``x.to(x.dtype)``, GPU MODE's ``c[...] = a @ b; return c``): a candidate may too
            output_aliases.update(_aliases(ref, ref_args))
            # an INPLACE input the reference writes is a result (``x.add_(y)``), not scratch
            wrote = [j for j, _ in correctness.changed_inputs(args, ref_args) if j in inplace]
            written.update(wrote)
            after_calls.append(dict(zip(kept_inputs, _to_cpu(tuple(ref_args[j] for j in kept_inputs)))))
            if tol is not None:
                if t == 0:  # no candidate can match a reference that answers one input two ways
                    unsteady = correctness.compare_outputs(_leaves(self.case.reference(shape, _clone(args))), ref, tol)
                weak = weak or correctness.is_weak_reference(ref, tol)
                if header.get("baseline"):
                    problems, raised = self._baseline_problems(shape, args, ref, tuple(ref_args[j] for j in wrote), wrote, inplace, tol)
                    baseline_problems += [f"trial {t + 1}: {p}" for p in problems]
                    baseline_raised = baseline_raised or raised
            refs.append(_to_cpu(ref))
            inputs.append(_to_cpu(args))
        # in every trial, once one trial wrote it
        written_inputs = header["written_inputs"] if "written_inputs" in header else sorted(written)
        reply = {"baseline_problems": baseline_problems, "baseline_raised": baseline_raised, "weak": weak, "structure": structure,
                 "unsteady": unsteady[:3], "written_inputs": written_inputs, "output_aliases": sorted(output_aliases)}
        return reply, {"inputs": inputs, "reference": refs,
                       "written": [tuple(after[j] for j in written_inputs) for after in after_calls]}

    def _baseline_problems(self, shape: dict, args: tuple, ref: tuple, ref_written: tuple, wrote: list[int], inplace: set[int],
                           tol: Any) -> tuple[list[str], bool]:
        """The baseline against the reference, as a candidate is held to it: its outputs, the
        INPLACE inputs the reference wrote (``wrote``, as ``ref_written``), and no input outside
        ``inplace`` changed. The problems, and whether the baseline raised (or exited) instead of
        answering: such a baseline cannot be timed on the shape either."""
        from pytest_kcoral import correctness

        base_args = _clone(args)
        try:
            base = _leaves(self.case.baseline(shape, base_args))
        except SystemExit as exc:  # would read as the reference's failure: the command's phase is 'reference'
            return [f"the baseline called sys.exit({exc.code!r})"], True
        except Exception as exc:  # a failing baseline is a finding, not a harness error
            return [f"{type(exc).__name__}: {exc}"[:500]], True
        problems = correctness.compare_outputs(base, ref, tol)
        problems += correctness.compare_outputs(tuple(base_args[j] for j in wrote), ref_written, tol, correctness.written_input_names(wrote))
        problems += correctness.describe_changed_inputs(correctness.changed_inputs(args, base_args), sorted(inplace))
        return problems, False

    def _cmd_check(self, header: dict[str, Any], payload: Any) -> tuple[dict, Any]:
        """The case's own verdict on a candidate's outputs, per seed (GPU MODE's
        ``check_implementation``): see ``checker.py``."""
        from pytest_kcoral import checker

        self._require(TRUSTED)
        return checker.check_outputs(self.case, header, payload), None

    def _cmd_cost(self, header: dict[str, Any], _payload: Any) -> tuple[dict, Any]:
        """The case's cost at the shape and the physical floor its bytes allow (a bandwidth
        measurement on the device, so under the lease)."""
        from pytest_kcoral import physical_floor, speed_of_light

        self._require(TRUSTED)
        try:
            cost = speed_of_light.valid_cost(self.case.cost(header["shape"]))
        except Exception:  # noqa: BLE001 - said at collection (cases._check_cost); timed without it
            cost = None
        reply: dict[str, Any] = {"cost": cost}
        if cost and cost.get("bytes"):
            reply["floor"] = physical_floor.measure(cost["bytes"], self.device)
        return reply, None

    # -- baseline role ----------------------------------------------------------------------

    def _cmd_load_baseline(self, header: dict[str, Any], _payload: Any) -> tuple[dict, Any]:
        """The baseline in place of a candidate: the commands after this one (``run``, ``time``,
        ``finish``) are the candidate's, audits included."""
        self._require(BASELINE)
        from pytest_kcoral.case_runtime import BaselineRuntime

        self.baseline = leftovers.Baseline.take()
        self.snapshot = tamper.Snapshot.take()
        self.candidate = BaselineRuntime(self.case)
        return {"entry": self.candidate.entry}, None

    # -- candidate role ---------------------------------------------------------------------

    def _cmd_load_candidate(self, header: dict[str, Any], _payload: Any) -> tuple[dict, Any]:
        """Import the candidate, or, in a kept child that already holds it (``pipeline`` keeps a
        candidate's child across its items), build it for the next item's shape: the audits'
        snapshots stay those taken before its first import."""
        self._require(CANDIDATE)
        from pytest_kcoral.case_runtime import CandidateRuntime

        if isinstance(self.candidate, CandidateRuntime) and str(self.candidate.path) == header["path"]:
            self.candidate.build_for(header["shape"])
            return {"entry": self.candidate.entry, "kept": True}, None
        if self.candidate is not None:
            raise RuntimeError(f"this child holds {self.candidate.path}, not {header['path']}")
        self.baseline = leftovers.Baseline.take()
        self.snapshot = tamper.Snapshot.take()
        self.candidate = CandidateRuntime(header["path"], self.case, header["shape"])
        return {"entry": self.candidate.entry}, None

    def _cmd_finish(self, _header: dict[str, Any], _payload: Any) -> tuple[dict, Any]:
        """The parent's last word with a child for an item: the audit runs after it, as after any
        command. The item's timing sets go: a kept child (the case's baseline child, a candidate's
        child kept for its next item) then draws new sets and placements for its next item, and
        holds no device memory and no queued work while it waits."""
        self._timing_sets = None
        if str(self.device).startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return {}, None

    def _cmd_run(self, header: dict[str, Any], payload: Any) -> tuple[dict, Any]:
        """Run the candidate once per input set; report outputs, the inputs it changed and findings."""
        self._require(CANDIDATE, BASELINE)
        import torch

        from pytest_kcoral import correctness

        self._timing_sets = None  # an item's timing draws its own sets (see ``_cmd_finish``)
        shape = header["shape"]
        written_inputs = header.get("written_inputs") or []
        allowed_aliases = {(int(i), int(j)) for i, j in header.get("allowed_aliases") or ()}
        outputs, inputs_changed, findings, structures, written, aliases = [], [], [], [], [], []
        for cpu_args in payload["inputs"]:
            # the call gets copies on the device; ``before`` keeps the inputs as sent, to find what it
            # wrote: a copy made on the device, not a second transfer from the host
            args = tuple(t.to(self.device, copy=True) if isinstance(t, torch.Tensor) else t for t in cpu_args)
            before = _clone(args)
            fn = self.candidate.bind(shape, args)
            _poison(header.get("poison_bytes", []), self.device)
            with guards.gc_disabled():  # as in the timing loop: gc's state cannot tell checked calls from timed ones
                out = fn()
                _synchronize(self.device)
            # flattened once: a container of the candidate's could yield other values a second time
            out_tuple, structure = flatten_outputs(out)
            problems = _inspect_outputs(out_tuple, args, self.device, allowed_aliases)
            structures.append(structure)
            findings.append(problems)
            outputs.append(_to_cpu(out_tuple) if not problems else None)
            written.append(_to_cpu(tuple(args[j] for j in written_inputs)) if not problems else None)
            inputs_changed.append(correctness.changed_inputs(before, args))
            # which outputs are inputs: a GPU MODE kernel may write the output buffer its data carries
            # (only for plain dense outputs: a sparse one, say, has no storage to compare)
            aliases.append([list(pair) for pair in sorted(_aliases(out_tuple, args))] if not problems else [])
        return ({"findings": findings, "inputs_changed": inputs_changed, "structures": structures, "output_aliases": aliases,
                 "parameters_differ": self.candidate.parameters_differ},
                {"outputs": outputs, "written": written})

    def _cmd_time(self, header: dict[str, Any], _payload: Any) -> tuple[dict, Any]:
        self._require(CANDIDATE, BASELINE)
        # the baseline's kept outputs are kept as the candidate's are, and not sent: nothing checks them
        return self._time(header, self.candidate.bind, send_kept=header.get("send_kept", True) is not False)

    # -- shared -----------------------------------------------------------------------------

    def _time(self, header: dict[str, Any], bind: Callable[[dict, tuple], Callable[[], Any]], send_kept: bool = True) -> tuple[dict, Any]:
        """Time a callable over rotating input sets whose values are refreshed before every call.

        Each refresh draws a fresh seed, so neither a pointer- nor a content-keyed cache can answer
        a timed call; a few timed calls, picked at random, are kept with their seeds so the parent
        can check them against the reference. With ``send_kept`` False they are kept all the same
        (keeping allocates between timed calls, and a small kernel's time follows where its
        outputs land), then dropped unsent.
        """
        from pytest_kcoral import timing

        shape = header["shape"]
        n_sets = int(header.get("n_sets", 3))
        # The input sets live across an item's timing rounds (the parent sends one ``time``
        # command per round): a fresh set per round would hand a pointer-keyed cache fresh
        # pointers, whose first use it answers correctly, in every round.
        key = (json.dumps(shape, sort_keys=True), n_sets, self.device)
        if self._timing_sets is None or self._timing_sets[0] != key:
            self._timing_sets = None  # the old shape's sets go before the new ones are made
            spread = placement.Placements(self.device, _rng)
            seeds = [_rng.getrandbits(62) for _ in range(n_sets)]
            sets = spread.make_sets(lambda seed: self.case.make_inputs(shape, seed), seeds,
                                    lambda: _rng.getrandbits(62))
            self._timing_sets = (key, seeds, sets, [bind(shape, args) for args in sets], spread)
        _, seeds, sets, fns, spread = self._timing_sets
        kept: list[dict[str, Any]] = []
        keep = int(header.get("verify", 2))
        written_inputs = header.get("written_inputs") or []
        seen_samples = 0

        def refresh(k: int) -> None:
            seeds[k] = _rng.getrandbits(62)
            fresh = self.case.make_inputs(shape, seeds[k])
            for dst, src in zip(sets[k], fresh):
                if hasattr(dst, "copy_"):
                    dst.copy_(src)

        def on_output(k: int, out: Any) -> None:
            nonlocal seen_samples
            seen_samples += 1
            # every timed call's outputs, before anything touches them: a lazy object or a
            # subclass would do its work when the harness copies or checks it, outside the window
            problems = _inspect_outputs(_leaves(out), (), self.device)
            if problems:
                raise TimedOutputRefused(f"timed call {seen_samples}: " + "; ".join(problems))
            spread.keep_output(k, out)
            # reservoir sample of the timed calls: any one of them may be the one checked
            # a copy: a kernel that writes into one preallocated output overwrites it at the next call
            if len(kept) < keep or _rng.random() < keep / seen_samples:
                entry = {"seed": seeds[k], "out": _clone_outputs(out), "written": _clone(tuple(sets[k][j] for j in written_inputs))}
                if len(kept) < keep:
                    kept.append(entry)
                else:
                    kept[_rng.randrange(keep)] = entry

        cpu = header.get("cpu")
        with pinning.pinned(cpu) as is_pinned:
            stats = timing.measure(
                lambda k: fns[k](),
                n_sets=len(sets),
                refresh=refresh,
                on_output=on_output,
                device=self.device,
                method=header.get("timer"),
                budget_s=float(header.get("budget_s", 1.0)),
                warmup_s=float(header.get("warmup_s", 0.05)),
                min_samples=int(header.get("min_samples", 5)),
            )
        spread.release_outputs()
        if is_pinned:
            stats.flags.append(f"timing_cpu={cpu}")
        if len(sets) != n_sets:
            stats.flags.append(f"input_sets={len(sets)}: small inputs, each set placed apart")
        verify = []
        for entry in kept if send_kept else ():
            out_tuple = _leaves(entry["out"])
            problems = _inspect_outputs(out_tuple, (), self.device)
            verify.append({"seed": entry["seed"], "outputs": None if problems else _to_cpu(out_tuple),
                           "written": None if problems else _to_cpu(entry["written"])})
        return {"stats": stats.to_dict(), "verify_seeds": [v["seed"] for v in verify]}, {"verify": verify}

    def _require(self, *roles: str) -> None:
        if self.role not in roles:
            raise RuntimeError(f"command needs a {' or '.join(roles)} child, this one is {self.role}")


class TimedOutputRefused(Exception):
    """A timed call returned something other than plain dense tensors (or plain numbers) on the
    item's device: the item fails at timing, and is not correct."""


MAX_STRUCTURE_DEPTH = 8  # deeper nesting is a leaf, which the output checks then refuse


def flatten_outputs(out: Any) -> tuple[tuple, Any]:
    """A callable's result as its leaves (tensors, numbers, None, anything else) and its
    structure: ``0`` for a leaf, a list for a tuple or list (interchangeable), a dict for a dict
    with str keys (keys sorted, so their order does not matter). ``(a, (b, c))`` gives
    ``(a, b, c)`` and ``[0, [0, 0]]``; a single tensor gives ``(t,)`` and ``0``."""
    leaves: list[Any] = []

    def walk(value: Any, depth: int) -> Any:
        if depth < MAX_STRUCTURE_DEPTH:
            if isinstance(value, (tuple, list)):
                return [walk(v, depth + 1) for v in value]
            if isinstance(value, dict) and all(type(k) is str for k in value):
                return {k: walk(value[k], depth + 1) for k in sorted(value)}
        leaves.append(value)
        return 0

    structure = walk(out, 0)
    return tuple(leaves), structure


def _leaves(out: Any) -> tuple:
    return flatten_outputs(out)[0]


def _clone(args: tuple) -> tuple:
    return tuple(a.clone() if hasattr(a, "clone") else a for a in args)


def _clone_outputs(out: Any) -> Any:
    """A copy of a call's outputs, structure and all (subclasses keep their type, so the later
    checks still see it)."""
    if isinstance(out, (tuple, list)):
        return [_clone_outputs(v) for v in out]
    if isinstance(out, dict):
        return {k: _clone_outputs(v) for k, v in out.items()}
    return out.clone() if hasattr(out, "clone") else out


def _to_cpu(values: tuple) -> tuple:
    import torch

    return tuple(v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for v in values)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


_PLAIN_SCALARS = (int, float, bool, type(None))  # exact types: a subclass could compare equal to anything


def _inspect_outputs(values: tuple, args: tuple, device: str, allowed_aliases: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset()) -> list[str]:
    """Checks of a result's values (``flatten_outputs``) that need the live objects: plain dense
    tensors, on the device, not aliasing inputs (output ``i`` may share memory with input ``j``
    where the reference's does: ``(i, j)`` in ``allowed_aliases``, from ``_aliases``). Plain
    Python numbers and None pass through (a reference may return a count, a scalar or an empty
    slot); the pytest process compares them with the reference's."""
    import torch

    problems = []
    want = torch.device(device)
    for i, value in enumerate(values):
        if type(value) in _PLAIN_SCALARS:
            continue
        if type(value) is not torch.Tensor:
            kind = f"{type(value).__module__}.{type(value).__qualname__}"
            problems.append(f"output {i} is a {kind}, not a plain torch.Tensor (subclasses and lazy objects are refused)")
            continue
        if value.is_meta:
            problems.append(f"output {i} is a meta tensor: it has a shape but no data")
            continue
        if value.layout != torch.strided:
            problems.append(f"output {i} is not a dense tensor (layout {value.layout})")
            continue
        if value.device.type != want.type or (want.index is not None and value.device.index != want.index):
            problems.append(f"output {i} is on {value.device}, expected {want}")
            continue
        for j, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and (i, j) not in allowed_aliases and _overlaps(value, arg):
                problems.append(f"output {i} shares memory with input {j}")
    return problems


def _aliases(values: tuple, args: tuple) -> set[tuple[int, int]]:
    """``(output, input)`` index pairs of outputs that share memory with an input."""
    import torch

    return {(i, j) for i, value in enumerate(values) if type(value) is torch.Tensor
            for j, arg in enumerate(args) if isinstance(arg, torch.Tensor) and _overlaps(value, arg)}


def _check_inplace_indices(inplace: set[int], args: tuple) -> None:
    """``INPLACE`` names inputs by index: each must be one of the inputs ``make_inputs`` made."""
    beyond = sorted(j for j in inplace if not 0 <= j < len(args))
    if beyond:
        raise ValueError(f"INPLACE lists input{'s' if len(beyond) > 1 else ''} {', '.join(map(str, beyond))}, but make_inputs"
                         f" returned {len(args)} input{'s' if len(args) != 1 else ''} (indices 0 to {len(args) - 1})")


def _require_plain_outputs(values: tuple, who: str) -> None:
    """The case's own results must be what a candidate may return, or nothing can match them."""
    import torch

    for i, value in enumerate(values):
        if type(value) not in _PLAIN_SCALARS and not isinstance(value, torch.Tensor):
            kind = f"{type(value).__module__}.{type(value).__qualname__}"
            raise TypeError(f"the {who} returned a {kind} as output {i}: return tensors, plain numbers or None, "
                            "alone or in tuples, lists or dicts with str keys")


def _overlaps(a: Any, b: Any) -> bool:
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return bool(a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes())


def _poison(nbytes: list[int], device: str) -> None:
    """Fill memory the next allocations will reuse with NaN, so unwritten output elements show.

    The bytes are all ones: NaN in every floating format (fp64 to fp8 e4m3fn and e5m2), -1 or
    the maximum in integer ones. A float32 NaN's bytes would read as 0.0 in every other element
    of an fp16 or bf16 output, and a kernel that skips the elements where the reference is zero
    would pass.

    The CUDA caching allocator hands a freed block of the same size straight back; on the CPU,
    glibc reuses freed heap chunks once ``mallopt`` keeps large blocks off ``mmap`` (which would
    return fresh zeroed pages instead).
    """
    if not nbytes:
        return
    blocks = [poison_block(n, device) for n in nbytes]
    _synchronize(device)
    del blocks


def poison_block(nbytes: int, device: str) -> Any:
    """``nbytes`` of all-ones bytes on ``device`` (see ``_poison``)."""
    import torch

    return torch.full((max(nbytes, 1),), 0xFF, dtype=torch.uint8, device=device)


def _keep_large_allocations_on_heap() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        m_mmap_threshold = -3
        libc.mallopt(m_mmap_threshold, 1 << 30)
    except Exception:  # not glibc: poisoning then covers small outputs only
        pass
