"""Every CPU attack in one session: it finishes within its timeouts and leaves no process behind."""

from __future__ import annotations

import time

import attacks
import psutil

TIMEOUT_S = 8


def _template_processes() -> set[int]:
    """The pytest process's long-lived helpers: the template (forkserver) and the resource tracker."""
    keep = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "multiprocessing.forkserver" in cmdline or "resource_tracker" in cmdline:
            keep.add(proc.pid)
    return keep


def _left_behind(before: set[int], timeout_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        helpers = _template_processes()
        left = []
        for proc in psutil.Process().children(recursive=True):
            if proc.pid in before or proc.pid in helpers:
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                left.append(f"{proc.pid} {proc.cmdline()}")
            except psutil.Error:
                continue
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if attacks.MARKER in " ".join(proc.info["cmdline"] or []):
                left.append(f"{proc.info['pid']} {proc.info['cmdline']}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_a_session_with_every_attack_fails_them_all_and_leaves_nothing(make_case, run_kcoral):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    honest = {"honest_add": "def run(a, b):\n    return a + b\n",
              "honest_prepare": "import torch\ndef prepare(a, b):\n    out = torch.empty_like(a)\n"
                                "    return lambda: torch.add(a, b, out=out)\n"}
    make_case("cases/add", candidates={**attacks.ALL_CPU, **honest})
    started = time.monotonic()
    result = run_kcoral("-m", "seen", "--kcoral-timeout", str(TIMEOUT_S))
    elapsed = time.monotonic() - started

    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == len(honest), result.stdout.str()[-3000:]
    assert outcomes.get("failed") == len(attacks.ALL_CPU)
    for name in attacks.ALL_CPU:
        result.stdout.fnmatch_lines([f"FAILED cases/add::{name}?seen-n=256? - kcoral *"])
    # one hang takes its timeout; everything else is quick
    assert elapsed < TIMEOUT_S + 90, f"the session took {elapsed:.0f} s"
    assert not _left_behind(before), "processes outlived the session"
