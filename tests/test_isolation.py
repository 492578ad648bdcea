"""Isolation: every candidate in a fresh child with a private directory; crashes, exits, hangs and
floods fail only their own item, naming the phase; the reference never shares a process with a
candidate."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import pytest

GOOD = "def run(a, b):\n    return a + b\n"


def test_segfault_fails_only_its_item_and_names_the_phase(make_case, run_kcoral):
    crash = "import os, signal\ndef run(a, b):\n    print('about to crash')\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    make_case("cases/add", candidates={"crash": crash, "good": GOOD})
    result = run_kcoral("--kcoral-mode", "correctness")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: crashed with SIGSEGV in phase 'correctness'*", "*about to crash*"])


def test_os_exit_zero_is_not_a_pass(make_case, run_kcoral):
    make_case("cases/add", candidates={"quit": "import os\ndef run(a, b):\n    os._exit(0)\n"})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*exited with status 0 in phase 'correctness' before replying*"])


def test_sys_exit_at_import_fails_compile(make_case, run_kcoral):
    make_case("cases/add", candidates={"quit": "import sys\nsys.exit(0)\n"})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': SystemExit: called sys.exit(0)*"])


def test_hang_times_out_naming_the_phase_and_the_next_item_runs(make_case, run_kcoral):
    hang = "import time\ndef run(a, b):\n    while True:\n        time.sleep(0.1)\n"
    make_case("cases/add", candidates={"hang": hang, "z_good": GOOD})
    started = time.monotonic()
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-timeout", "3", "-m", "seen")
    elapsed = time.monotonic() - started
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    result.stdout.fnmatch_lines(["*timed out in phase 'correctness' (item timeout reached)*"])
    assert elapsed < 20, f"the hung child was not killed promptly ({elapsed:.1f} s)"


def test_a_timeout_says_where_the_candidate_was(make_case, run_kcoral):
    # a hang in prepare() and one in the callable it returns read alike without the line
    in_prepare = "import time\ndef prepare(a, b):\n    while True:\n        time.sleep(0.1)\n"
    in_call = "import time\ndef spin():\n    while True:\n        time.sleep(0.1)\ndef prepare(a, b):\n    return spin\n"
    make_case("cases/add", candidates={"in_prepare": in_prepare, "in_call": in_call})
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-timeout", "4", "-m", "seen")
    result.assert_outcomes(failed=2, deselected=2)
    result.stdout.fnmatch_lines([
        "*kcoral correctness failed: timed out in phase 'correctness' (item timeout reached) at in_call.py:4 in spin*",
        "*stack at the timeout, innermost first (harness and library frames left out):",
        "*in_call.py:4 in spin",
        "*kcoral correctness failed: timed out in phase 'correctness' (item timeout reached) at in_prepare.py:4 in prepare*",
    ])
    assert "faulthandler" not in result.stdout.str() and "Thread 0x" not in result.stdout.str()  # the raw dump is cut


def test_hang_at_import_is_killed_in_the_import_phase(make_case, run_kcoral):
    make_case("cases/add", candidates={"hang": "import time\nwhile True:\n    time.sleep(0.1)\n"})
    result = run_kcoral("--kcoral-mode", "correctness", "--kcoral-timeout", "2", "-m", "seen")
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': timed out in phase 'import'*"])


def test_output_flood_is_drained_and_truncated(make_case, run_kcoral):
    flood = "import sys\nfor i in range(200000):\n    print('spam line', i)\ndef run(a, b):\n    raise RuntimeError('after the flood')\n"
    make_case("cases/add", candidates={"flood": flood, "good": GOOD})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    out = result.stdout.str()
    assert "RuntimeError: after the flood" in out
    assert "spam line 0" not in out  # the head is kept, but the report shows only the last lines
    assert len(out) < 200_000


def test_private_working_directory_removed_and_not_importable(make_case, run_kcoral, pytester):
    log = pytester.path / "cwd_log.jsonl"
    spy = (
        "import json, os, sys\n"
        "open('torch.py', 'w').write('raise SystemExit(3)')  # try to shadow a module\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'cwd': os.getcwd(), 'path': sys.path, 'pid': os.getpid()}) + '\\n')\n"
        "def run(a, b):\n    return a + b\n"
    )
    make_case("cases/add", candidates={"spy": spy, "spy_too": spy})
    run_kcoral("--kcoral-mode", "correctness", "--kcoral-confinement", "off").assert_outcomes(passed=4)  # the log is outside their directories
    # one import per candidate: its two items share its process (pytest_kcoral/kept_children.py)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2
    assert records[0]["cwd"] != records[1]["cwd"], "each candidate gets its own directory"
    assert records[0]["pid"] != records[1]["pid"], "each candidate gets a process of its own"
    for rec in records:
        assert rec["cwd"] != str(pytester.path)
        assert rec["cwd"] not in rec["path"] and "" not in rec["path"] and "." not in rec["path"]
        assert not __import__("os").path.exists(rec["cwd"]), "the private directory is removed"


def _add_case_logging_roles(log_source: str, unseen: str) -> str:
    """An add case whose reference and baseline call ``_log(role)``, defined by ``log_source``."""
    return log_source + f"""
import torch
SEEN = [{{"n": 64}}]
UNSEEN = {unseen}

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    _log("reference")
    return a + b

def baseline(a, b):
    _log("baseline")
    return a + b
"""


def test_reference_and_baseline_never_share_a_process_with_a_candidate(make_case, run_kcoral, pytester):
    pids = pytester.path / "pids.jsonl"
    case = _add_case_logging_roles(f"""
import json, os, sys

def _log(role):
    with open({str(pids)!r}, "a") as f:
        f.write(json.dumps({{"role": role, "pid": os.getpid(), "candidate_loaded": "kcoral_candidate" in sys.modules}}) + "\\n")
""", unseen='[{"n": 65}]')
    cand = f"import json, os\ndef run(a, b):\n    with open({str(pids)!r}, 'a') as f:\n        f.write(json.dumps({{'role': 'candidate', 'pid': os.getpid()}}) + '\\n')\n    return a + b\n"
    make_case("cases/add", case, {"c1": cand, "c2": cand})
    run_kcoral("--kcoral-confinement", "off").assert_outcomes(passed=4)
    records = [json.loads(line) for line in pids.read_text().splitlines()]
    trusted = {r["pid"] for r in records if r["role"] in ("reference", "baseline")}
    candidates = {r["pid"] for r in records if r["role"] == "candidate"}
    assert trusted and candidates and not trusted & candidates
    assert len(candidates) == 2, "one process per candidate, kept across its items"
    assert not any(r.get("candidate_loaded") for r in records if r["role"] != "candidate")


@pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_GET_THP_DISABLE) is Linux only")
def test_every_child_runs_without_transparent_huge_pages(make_case, run_kcoral, pytester):
    # the huge-page lottery moved pure Python by up to 1.33x between two forked processes: the
    # baseline's and the candidate's processes must not draw in it (pytest_kcoral/template.py)
    log = pytester.path / "thp.jsonl"
    probe = (
        "import ctypes, json\n"
        "PR_GET_THP_DISABLE = 42\n"
        "def _log(role):\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(json.dumps({'role': role, 'thp_disabled': ctypes.CDLL(None).prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0)}) + '\\n')\n"
    )
    case = _add_case_logging_roles(probe, unseen="[]")
    make_case("cases/add", case, {"c": probe + "def run(a, b):\n    _log('candidate')\n    return a + b\n"})
    run_kcoral("--kcoral-confinement", "off").assert_outcomes(passed=1)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["role"] for r in records} == {"reference", "baseline", "candidate"}
    assert all(r["thp_disabled"] == 1 for r in records), records


def test_template_preload_never_touches_cuda():
    """Children fork from the template: a CUDA call there (even ``is_available()``) would make
    every child fail with "Cannot re-initialize CUDA in forked subprocess" on a GPU host."""
    import subprocess
    import sys

    probe = (
        "import torch, torch.cuda as tc\n"
        "called = []\n"
        "for name in ('is_available', 'device_count', '_lazy_init', 'current_device', 'init', 'get_device_properties'):\n"
        "    orig = getattr(tc, name)\n"
        "    setattr(tc, name, lambda *a, _n=name, _o=orig, **k: called.append(_n) or _o(*a, **k))\n"
        "import importlib\n"
        "from pytest_kcoral.isolation import TEMPLATE_PRELOAD\n"
        "for module in TEMPLATE_PRELOAD:\n"
        "    importlib.import_module(module)\n"
        "print(called)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"the template's imports called torch.cuda: {out}"


def test_template_preload_survives_a_broken_cupti(tmp_path):
    """The template loads cupti-python once for every child (``timing/preload.py``). A cupti that
    fails to load in another way than ImportError (a missing libcupti raises OSError) must not
    take the template down: the children would all fail at start-up, and on a CPU run nobody
    asked for CUPTI at all."""
    import subprocess
    import sys

    broken = tmp_path / "cupti"
    broken.mkdir()
    (broken / "__init__.py").write_text("")
    (broken / "cupti.py").write_text("raise OSError('libcupti.so.13: cannot open shared object file')\n")
    probe = "import pytest_kcoral.timing.preload, sys; print('cupti.cupti' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # the broken module was tried (it is on the path) and left out


# What a conftest sees when collection is over and no item has run yet: the template's pid, if any.
_TEMPLATE_PROBE = """
import os
from multiprocessing import forkserver

def pytest_collection_finish(session):
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    alive = pid is not None and os.waitpid(pid, os.WNOHANG) == (0, 0)
    print(f"TEMPLATE AT COLLECTION: {'running' if alive else 'none'}")
"""


def test_template_starts_while_cases_are_collected(make_case, pytester):
    """The template's imports (torch, Triton: seconds) overlap collection instead of delaying the
    first item; a collection-only run starts nothing."""
    make_case("cases/add")
    pytester.makeconftest(_TEMPLATE_PROBE)
    args = ["-p", "kcoral", "-p", "no:cacheprovider", "-s", "--kcoral-timing-budget", "0.02", "-m", "seen"]
    graded = pytester.runpytest_subprocess(*args)
    graded.stdout.fnmatch_lines(["*TEMPLATE AT COLLECTION: running*"])
    graded.assert_outcomes(passed=1, deselected=1)
    collected = pytester.runpytest_subprocess(*args, "--collect-only")
    collected.stdout.fnmatch_lines(["*TEMPLATE AT COLLECTION: none*"])


def test_trusted_and_baseline_children_never_load_compiled_code_from_a_shared_cache(make_case, run_kcoral, pytester):
    # A candidate can write to the compile caches (Triton's, Inductor's, extension builds): the
    # trusted child and the child that times the baseline must compile the case's kernels
    # themselves, in directories of their own.
    log = pytester.path / "env.jsonl"
    logger = f"""
def _log(role):
    import json, os, torch.compiler.config
    keys = ("TRITON_ALWAYS_COMPILE", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR")
    with open({str(log)!r}, "a") as f:
        f.write(json.dumps({{"role": role, "cwd": os.getcwd(), "env": {{k: os.environ.get(k) for k in keys}},
                            "inductor_caches_off": torch.compiler.config.force_disable_caches}}) + "\\n")
"""
    case = f"""
import torch
SEEN = [{{"n": 64}}]
UNSEEN = []
{logger}
def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    _log("trusted")
    return a + b

def baseline(a, b):
    _log("baseline")
    return a + b
"""
    cand = f"{logger}\ndef run(a, b):\n    _log('candidate')\n    return a + b\n"
    make_case("cases/add", case, {"c": cand})
    run_kcoral("--kcoral-confinement", "off").assert_outcomes(passed=1)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # the baseline runs in the trusted child (its correctness) and in the child that times it
    trusted = [r for r in records if r["role"] in ("trusted", "baseline")]
    candidate = [r for r in records if r["role"] == "candidate"]
    assert candidate and any(os.path.basename(r["cwd"]).startswith("kcoral-baseline-") for r in trusted)
    for r in trusted:
        assert r["env"]["TRITON_ALWAYS_COMPILE"] == "1"
        assert r["inductor_caches_off"] is True
        for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR"):
            assert r["env"][key].startswith(r["cwd"] + os.sep), (key, r)
    for r in candidate:  # the candidate keeps its caches (a Triton kernel compiles once per host)
        assert r["env"]["TRITON_ALWAYS_COMPILE"] != "1"
        assert r["inductor_caches_off"] is False


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie nobody reaps counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_stopped_session_leaves_no_candidate_running(pytester, make_case, sig, request):
    """A cancelled CI job sends SIGTERM, and then SIGKILL: neither may leave the template or a
    candidate running, and SIGTERM still writes the artifact, marked partial."""
    import signal
    import subprocess

    pid_file = pytester.path / "candidate.pid"
    sleeper = f"import os, time\ndef run(a, b):\n    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n    time.sleep(120)\n    return a + b\n"
    make_case("cases/add", candidates={"sleeper": sleeper})
    # a killed session cannot remove its children's directories: they go in a directory this test
    # removes, one short enough for the template's socket (``isolation._short_socket_dir``)
    temp = tempfile.mkdtemp(prefix="kc-")
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TMPDIR=temp)
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "cases",
                                "-k", "seen and not unseen", "--kcoral-mode", "correctness", "--kcoral-timeout", "300",
                                "--kcoral-json", "out.json", "--kcoral-confinement", "off"], cwd=pytester.path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and session.poll() is None, "the candidate never started"
            time.sleep(0.1)
        candidate = int(pid_file.read_text())
        with open(f"/proc/{candidate}/stat") as f:
            template = int(f.read().rsplit(")", 1)[1].split()[1])
        session.send_signal(getattr(signal, sig))
        code = session.wait(60)
    finally:
        if session.poll() is None:
            session.kill()
    deadline = time.monotonic() + 10
    while (_running(candidate) or _running(template)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(candidate), f"the candidate ({candidate}) outlived the session"
    assert not _running(template), f"the template ({template}) outlived the session"
    if sig == "SIGTERM":
        assert code == pytest.ExitCode.INTERRUPTED
        assert json.loads((pytester.path / "out.json").read_text())["partial"] is True


def test_a_session_grades_under_a_deep_temp_dir(pytester, make_case):
    """The template's Unix socket lives under the temp dir, and a socket's path holds at most 107
    bytes: under a CI runner's deep TMPDIR every session failed at collection with ``AF_UNIX path
    too long``. The children's own directories still go under that TMPDIR."""
    import subprocess

    make_case("cases/add")
    deep = pytester.path / ("t" * 60) / ("u" * 60)
    deep.mkdir(parents=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TMPDIR=str(deep))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "cases", "-m", "seen",
                           "--kcoral-timing-budget", "0.02", "-p", "no:randomly"], cwd=pytester.path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "AF_UNIX" not in proc.stdout
    assert list(deep.iterdir()) == []  # the children's directories were made there, and removed


def test_a_kept_baseline_child_draws_new_timing_sets_for_every_item(tmp_path):
    """The child that times a case's baseline is kept across items: its timing input sets (and on
    a GPU their placements) go at each item's ``finish``, and at the next ``run``, so every item
    is timed on sets of its own, as a candidate's fresh child's are."""
    import torch

    from pytest_kcoral import child
    from pytest_kcoral.case_runtime import BaselineRuntime
    from pytest_kcoral.messages import Finish, Run, RunInputs, Time, wire_header

    (tmp_path / "case.py").write_text("import torch\nSEEN = [{'n': 8}]\ndef make_inputs(shape, device):\n"
                                      "    return (torch.randn(shape['n']),)\ndef reference(x):\n    return x * 2\n")
    spec = {"format": "native", "source": str(tmp_path / "case.py"), "baseline_file": None, "device": "cpu",
            "device_kind": "cpu", "init_seed": 1, "cpu_threads": None}
    threads = torch.get_num_threads()
    try:
        runner = child._Runner(child.BASELINE, spec)
        timed = Time(shape={"n": 8}, device="cpu", n_sets=3, budget_s=0.01, timer=None, warmup_s=0.0, verify=1, written_inputs=[],
                     send_kept=False)
        run = Run(shape={"n": 8}, device="cpu", poison_bytes=[], written_inputs=[], allowed_aliases=[],
                  payload=RunInputs(inputs=[(torch.ones(8),)]))

        def item() -> list[tuple]:
            reply, _ = runner.handle(*wire_header(run))
            assert reply["ok"], reply
            reply, payload = runner.handle(*wire_header(timed))
            assert reply["ok"] and payload["verify"] == [], reply  # kept as the candidate's are, not sent
            sets = list(runner._timing_sets.sets)  # held here, so no later object can take their ids
            assert runner.handle(*wire_header(Finish()))[0]["ok"] and runner._timing_sets is None
            return sets

        # as ``load_baseline`` does, less its audits: they watch the whole process, here pytest's own
        runner.candidate = BaselineRuntime(runner.case)
        first = item()
        assert not {id(s) for s in first} & {id(s) for s in item()}  # the second item's sets are new objects
    finally:
        torch.set_num_threads(threads)
