"""Command-line options and the settings object every other module reads them from."""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MODES = ("full", "correctness")
TOLERANCE_MODES = ("elementwise", "strict")
TIMER_CHOICES = ("auto", "cupti", "events", "wall")
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("kcoral", "GPU kernel grading (pytest-kcoral)")
    group.addoption("--kcoral-mode", choices=MODES, default="full",
                    help="full: compile, correctness and timing; correctness: stop after correctness")
    group.addoption("--kcoral-submissions", metavar="DIR", action="append", default=[],
                    help="Grade submissions DIR/<team>/<case>.py or DIR/<team>/<case>/<attempt>.py")
    group.addoption("--kcoral-trials", type=int, default=3, metavar="N",
                    help="Fresh input sets checked for correctness (default 3)")
    group.addoption("--kcoral-timeout", type=float, default=300.0, metavar="S",
                    help="Seconds one item may take in all (default 300)")
    group.addoption("--kcoral-min-speedup", type=float, default=None, metavar="X",
                    help="Fail items slower than X times the baseline")
    group.addoption("--kcoral-tolerance", choices=TOLERANCE_MODES, default="elementwise",
                    help="elementwise: |out-ref| <= atol + rtol*|ref|; strict: max-abs <= atol and max-rel <= rtol")
    group.addoption("--kcoral-timer", choices=TIMER_CHOICES, default="auto",
                    help="Force a timing method (default: the best available)")
    group.addoption("--kcoral-seed", type=int, default=None, metavar="N",
                    help="Seed for input generation (default: drawn fresh and kept secret from candidates)")
    group.addoption("--kcoral-devices", default=None, metavar="LIST",
                    help="Devices to grade on, as indices into the visible devices, e.g. 0,1")
    group.addoption("--kcoral-lease-dir", default=None, metavar="DIR",
                    help="Directory of the host-wide device lock files")
    group.addoption("--kcoral-lease-timeout", type=float, default=None, metavar="S",
                    help="Give up waiting for a device after S seconds (default: wait)")
    group.addoption("--kcoral-json", default=None, metavar="PATH",
                    help="Write the session's results as one JSON document")
    group.addoption("--kcoral-html", default=None, metavar="PATH",
                    help="Write the session's results as one self-contained HTML page (charts inline, nothing loaded)")
    group.addoption("--kcoral-compare", default=None, metavar="OLD.json",
                    help="Compare speedups with a saved --kcoral-json run")
    group.addoption("--kcoral-compare-fail", default=None, metavar="PCT",
                    help="With --kcoral-compare: fail candidates slower than the saved run by more than PCT, e.g. 5%%")
    group.addoption("--kcoral-url", default=None, metavar="URL",
                    help="Send GPU work to a KCoral service (default: $KCORAL_URL)")
    group.addoption("--kcoral-sandbox", action="store_true", default=False,
                    help="Run children under bubblewrap (read-only system, private workspace, no network)")
    group.addoption("--kcoral-confinement", choices=("auto", "landlock", "off"), default="auto",
                    help="Confine children's writes to their own directories: auto = with Landlock where the kernel has it;"
                         " landlock = stop if it has not; off = never")
    group.addoption("--kcoral-artifacts", default=None, metavar="DIR",
                    help="Directory for diagnostics files (default: kcoral-artifacts)")
    group.addoption("--kcoral-ncu", action="store_true", default=False,
                    help="Capture an Nsight Compute report of each item's candidate (diagnostics, never speedups)")
    group.addoption("--kcoral-sanitizer", choices=SANITIZER_TOOLS, default=None,
                    help="Run each candidate's correctness inputs under compute-sanitizer; findings fail the item")
    group.addoption("--kcoral-timing-budget", type=float, default=None, metavar="S",
                    help="Seconds of timed samples per callable (default 1.0 on a GPU, 0.2 on a CPU)")
    group.addoption("--kcoral-precision", default="1%", metavar="PCT|off",
                    help="Stop timing an item once its speedup's 95%% confidence interval lies within +-PCT (default 1%%);"
                         " the timing budget caps it; off: always spend the budget")
    group.addoption("--kcoral-process-pairs", default="auto", metavar="auto|N",
                    help="Pairs of fresh processes (baseline's, candidate's) an item is timed in, the median pair's speedup"
                         " kept: auto = one, and 3 for an item the host's speed sets (~); N = N for every item")
    group.addoption("--kcoral-timing-cpu", default="auto", metavar="auto|off|N",
                    help="CPU core that GPU timing (baseline and candidate alike) runs on: auto picks one per GPU")
    group.addoption("--kcoral-cpu-threads", type=int, default=None, metavar="N",
                    help="Torch CPU threads of each process (pytest and children); default: a share of the cores per worker")


MAX_TRIALS = 1000  # correctness input sets: more only ends in the item's timeout
MAX_PROCESS_PAIRS = 8  # each pair costs two process starts and a timing budget: more only ends in the timeout
# for a host-set item under --kcoral-process-pairs auto: the median of 3 pairs keeps identical code
# within 2% often enough for the self-speedup target, at three fifths of 5's cost (docs/performance.md)
AUTO_PROCESS_PAIRS = 3
DEFAULT_PRECISION = 0.01
MAX_SECONDS = 7 * 24 * 3600.0  # a week: larger waits overflow the timers they reach


def _parse_precision(text: str) -> float | None:
    """``--kcoral-precision``: ``1%``, ``0.5%`` or ``off``; a plain number is a percentage too."""
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text.strip().rstrip("%")) / 100
    except ValueError:
        value = math.nan
    if not (0 < value < 1):
        raise pytest.UsageError(f"--kcoral-precision must be a percentage above 0 and below 100 (e.g. 1%) or off, not {text!r}")
    return value


def _check_seconds(opt: Callable[[str], Any], option: str, zero_ok: bool = False) -> None:
    """A time option, when given, is a finite number of seconds above zero (or zero)."""
    value = opt(option.lstrip("-").replace("-", "_"))
    if value is None:
        return
    if not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0) and value <= MAX_SECONDS):
        least = "0 or more" if zero_ok else "above 0"
        raise pytest.UsageError(f"{option} must be a number of seconds, {least} and at most {MAX_SECONDS:.0f}, not {value}")


def _check_lease_dir(path: Path) -> None:
    """--kcoral-lease-dir names a directory this process can make lock files in (made if missing),
    said at the start rather than as a collection error of the first case."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise pytest.UsageError(f"--kcoral-lease-dir {path}: cannot be made a directory ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"--kcoral-lease-dir {path}: this user cannot create lock files there")


@dataclass(frozen=True)
class Settings:
    """The options of this session, validated once."""

    mode: str
    submissions: tuple[Path, ...]
    trials: int
    timeout_s: float
    min_speedup: float | None
    tolerance: str
    timer: str | None  # None: best available
    seed: int
    seed_is_secret: bool
    devices: str | None
    lease_dir: Path | None
    lease_timeout_s: float | None
    json_path: Path | None
    url: str | None
    sandbox: bool
    artifacts: Path | None
    timing_budget_s: float | None
    timing_cpu: str = "auto"  # "auto" | "off" | a core number, see timing/pinning.py
    ncu: bool = False  # --kcoral-ncu: see diagnostics.py
    sanitizer: str | None = None  # --kcoral-sanitizer: a compute-sanitizer tool
    cpu_threads: int | None = None  # --kcoral-cpu-threads; None: cpu_share's share of the cores
    # --kcoral-process-pairs: None (auto) times an item in one pair of processes, and a host-set
    # one in AUTO_PROCESS_PAIRS; N, every item in N (``LocalExecutor._process_pairs_for``)
    process_pairs: int | None = None
    # --kcoral-precision: the half-width, relative, of the speedup's interval at which timing
    # stops (0.01 for 1%); None: off, every item spends its timing budget
    precision: float | None = DEFAULT_PRECISION
    html_path: Path | None = None  # --kcoral-html: the report page (report/html.py)
    confinement: str = "auto"  # --kcoral-confinement: see confine.py
    # -s / --capture=no, not on an xdist worker: a candidate's output goes to the terminal as it comes (``captured_output``)
    live_output: bool = False

    @classmethod
    def from_config(cls, config: pytest.Config, seed: int | None = None) -> Settings:
        opt = config.getoption
        if not 1 <= opt("kcoral_trials") <= MAX_TRIALS:
            raise pytest.UsageError(f"--kcoral-trials must be from 1 to {MAX_TRIALS}, not {opt('kcoral_trials')}")
        _check_seconds(opt, "--kcoral-timeout")
        _check_seconds(opt, "--kcoral-timing-budget")
        _check_seconds(opt, "--kcoral-lease-timeout", zero_ok=True)
        min_speedup = opt("kcoral_min_speedup")
        if min_speedup is not None and not (math.isfinite(min_speedup) and min_speedup > 0):
            raise pytest.UsageError(f"--kcoral-min-speedup must be a positive number, not {min_speedup}")
        if min_speedup is not None and opt("kcoral_mode") == "correctness":
            # nothing is timed, so the gate could never fail an item: a run that looks gated and is not
            raise pytest.UsageError(f"--kcoral-min-speedup {min_speedup:g} needs timing, and --kcoral-mode correctness times nothing;"
                                    " drop one of them")
        if opt("kcoral_compare") and opt("kcoral_mode") == "correctness":
            # a comparison of speedups with nothing timed would pass every candidate, saying nothing
            raise pytest.UsageError(f"--kcoral-compare {opt('kcoral_compare')} compares speedups, and --kcoral-mode correctness"
                                    " times nothing; drop one of them")
        given_seed = opt("kcoral_seed")
        if seed is None:
            seed = given_seed if given_seed is not None else secrets.randbits(63)
        json_path = opt("kcoral_json")
        if json_path and Path(json_path).is_dir():
            raise pytest.UsageError(f"--kcoral-json {json_path}: a directory; give the path of the file to write")
        html_path = opt("kcoral_html")
        if html_path and Path(html_path).is_dir():
            raise pytest.UsageError(f"--kcoral-html {html_path}: a directory; give the path of the file to write")
        lease_dir = opt("kcoral_lease_dir")
        if lease_dir:
            _check_lease_dir(Path(lease_dir))
        artifacts = opt("kcoral_artifacts")
        timer = opt("kcoral_timer")
        timing_cpu = str(opt("kcoral_timing_cpu"))
        if timing_cpu not in ("auto", "off") and not timing_cpu.isdigit():
            raise pytest.UsageError(f"--kcoral-timing-cpu must be auto, off or a core number, not {timing_cpu!r}")
        if timing_cpu.isdigit() and hasattr(os, "sched_getaffinity") and int(timing_cpu) not in os.sched_getaffinity(0):
            raise pytest.UsageError(f"--kcoral-timing-cpu {timing_cpu}: not one of this process's cores {sorted(os.sched_getaffinity(0))}")
        # absolute: every child works in a private directory of its own, where a relative path
        # would name nothing
        submissions = tuple((config.invocation_params.dir / p).resolve() for p in opt("kcoral_submissions"))
        for given, folder in zip(opt("kcoral_submissions"), submissions):
            if not folder.is_dir():
                raise pytest.UsageError(f"--kcoral-submissions {given}: no such directory ({folder})")
        cpu_threads = opt("kcoral_cpu_threads")
        if cpu_threads is not None and cpu_threads < 1:
            raise pytest.UsageError(f"--kcoral-cpu-threads must be at least 1, not {cpu_threads}")
        process_pairs = str(opt("kcoral_process_pairs"))
        if process_pairs != "auto" and not (process_pairs.isdigit() and 1 <= int(process_pairs) <= MAX_PROCESS_PAIRS):
            raise pytest.UsageError(f"--kcoral-process-pairs must be auto or a number from 1 to {MAX_PROCESS_PAIRS}, not {process_pairs!r}")
        precision = _parse_precision(str(opt("kcoral_precision")))
        return cls(
            mode=opt("kcoral_mode"),
            submissions=submissions,
            trials=opt("kcoral_trials"),
            timeout_s=opt("kcoral_timeout"),
            min_speedup=opt("kcoral_min_speedup"),
            tolerance=opt("kcoral_tolerance"),
            timer=None if timer == "auto" else timer,
            seed=seed,
            seed_is_secret=given_seed is None,
            devices=opt("kcoral_devices"),
            lease_dir=Path(lease_dir) if lease_dir else None,
            lease_timeout_s=opt("kcoral_lease_timeout"),
            json_path=Path(json_path) if json_path else None,
            # an explicit --kcoral-url "" grades here even with KCORAL_URL set
            url=(opt("kcoral_url") if opt("kcoral_url") is not None else os.environ.get("KCORAL_URL")) or None,
            sandbox=opt("kcoral_sandbox"),
            artifacts=Path(artifacts) if artifacts else None,
            timing_budget_s=opt("kcoral_timing_budget"),
            timing_cpu=timing_cpu,
            ncu=opt("kcoral_ncu"),
            sanitizer=opt("kcoral_sanitizer"),
            cpu_threads=cpu_threads,
            process_pairs=None if process_pairs == "auto" else int(process_pairs),
            precision=precision,
            html_path=Path(html_path) if html_path else None,
            confinement=opt("kcoral_confinement"),
            # an xdist worker's own output reaches no terminal: there the report's sections show it
            live_output=opt("capture", None) == "no" and not hasattr(config, "workerinput"),
        )
