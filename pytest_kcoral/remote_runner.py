"""The stage runner inside a KCoral worker (``--kcoral-url``): never imported by the pytest process.

``remote.py`` uploads the harness modules a child needs (this one, ``child.py``, ``case_runtime.py``,
``timing/``, ...) with the case and, for a candidate program, the candidate, then calls ``start``
once and ``command`` once per stage, each as its own KCoral ``run`` instruction, so a crash names
the instruction (the phase) it happened in. The commands are the ones a local child serves
(``child._Runner.handle``): the same checks, audits and timers, on the server's device.

Replies are JSON text (a header may hold NaN, which KCoral's own encoding refuses) and
payload blobs (``protocol.encode_payload``: a JSON skeleton and raw tensor bytes, never a pickle).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

_runner: Any = None
_failed = False  # an earlier command failed: later ones in the same program do not run
_watchdog: threading.Timer | None = None

# Exit status of a worker whose item ran out of time (KCoral reports only that the worker exited).
WATCHDOG_EXIT_STATUS = 124


def start(role: str, case_spec: dict[str, Any], env: dict[str, str], budget_s: float) -> dict[str, Any]:
    """Set up the worker for one role and build the runner; ``{"ok": ...}`` like a command reply."""
    global _runner, _failed, _watchdog
    started = time.monotonic()
    os.environ.update(env)  # before torch and Triton load: TRITON_INTERPRET is read at import
    sys.dont_write_bytecode = True
    workdir = os.getcwd()
    try:
        import torch  # noqa: F401

        from pytest_kcoral import case_runtime, child, child_outputs, leftovers, physical_floor, protocol, tamper, timing  # noqa: F401
        from pytest_kcoral.timing import clocks, stats, timers  # noqa: F401 - loaded before any candidate code

        spec = dict(case_spec)
        for key in ("source", "baseline_file"):
            if spec.get(key):
                spec[key] = os.path.join(workdir, spec[key])
        # files a candidate writes into the workspace cannot shadow a module imported later
        sys.path[:] = [p for p in sys.path if p not in ("", ".", workdir)]
        if role in (child.CANDIDATE, child.BASELINE):
            child_outputs.keep_large_allocations_on_heap()
        _runner = child._Runner(role, spec)
    except BaseException as exc:  # noqa: BLE001 - the client must hear why startup failed
        from pytest_kcoral import child

        _failed = True
        return _reply(child._error_reply(exc), None)
    # the item's own deadline, from now: the imports above are the worker's start, not the item's
    # work (the server's timeout bounds them). A hung stage ends this worker inside the
    # instruction it reached, which KCoral reports with that instruction.
    _watchdog = threading.Timer(max(budget_s, 0.1), _expire)
    _watchdog.daemon = True
    _watchdog.start()
    return _reply({"ok": True, "pid": os.getpid(), "startup_s": time.monotonic() - started}, None)


def command(cmd: str, header_json: str, payload: bytes | None) -> dict[str, Any]:
    """Run one command of the runner; relative paths in it name files in the workspace."""
    global _failed
    from pytest_kcoral import protocol

    if _failed or _runner is None:
        return {"ok": False, "skipped": True, "header": "{}", "payload": None}
    header = dict(json.loads(header_json), cmd=cmd)
    if header.get("path"):
        header["path"] = os.path.join(os.getcwd(), header["path"])
    reply, reply_payload = _runner.handle(header, protocol.decode_payload(payload) if payload else None)
    if not reply.get("ok"):
        _failed = True
    return _reply(reply, reply_payload)


def done() -> bool:
    """The program's last instruction: disarm the watchdog (a reused worker must not inherit it)."""
    if _watchdog is not None:
        _watchdog.cancel()
    return True


def _reply(header: dict[str, Any], payload: Any) -> dict[str, Any]:
    from pytest_kcoral import protocol

    return {
        "ok": bool(header.get("ok")),
        "header": json.dumps(header),
        "payload": protocol.encode_payload(payload) if payload is not None else None,
    }


def _expire() -> None:
    sys.stderr.write("kcoral: item timeout reached in the KCoral worker\n")
    sys.stderr.flush()
    os._exit(WATCHDOG_EXIT_STATUS)


# What ``remote.py`` uploads as the program's module: it puts the uploaded harness first on
# ``sys.path`` (a server may have another pytest_kcoral installed) and hands over to this module.
BOOTSTRAP_SOURCE = '''
import os, sys

def _runner():
    root = os.path.join(os.getcwd(), "kcoral_harness")
    if root not in sys.path:
        sys.path.insert(0, root)
    from pytest_kcoral import remote_runner
    return remote_runner

def start(role, case_spec, env, budget_s):
    return _runner().start(role, case_spec, env, budget_s)

def command(cmd, header_json, payload):
    return _runner().command(cmd, header_json, payload)

def done():
    return _runner().done()
'''
