"""Remote execution (``--kcoral-url``): items graded by a real ``kcoral server --device cpu``.

The server runs on a free loopback port for this module and is stopped (by its pid) afterwards.
Where kcoral or its server dependencies are missing, or the server cannot start, the tests skip
with that reason: ``pip install -e ".[remote]"`` installs them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# imported here, not first inside an in-process pytester run (which would drop it again)
kcoral = pytest.importorskip("kcoral", reason="kcoral is not installed: pip install -e '.[remote]'")
import pytest_kcoral.kcoral_programs  # noqa: E402, F401
import pytest_kcoral.remote  # noqa: E402, F401

WRONG = "def run(a, b):\n    return a - b\n"
EXITS = "import os\n\ndef run(a, b):\n    os._exit(3)\n"
HANGS = "def run(a, b):\n    while True:\n        pass\n"
BROKEN = "import no_such_module_anywhere\n"
SERVER_START_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bwrap_works() -> bool:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    return subprocess.run([bwrap, "--ro-bind", "/", "/", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def kcoral_url(tmp_path_factory: pytest.TempPathFactory):
    """A real ``kcoral server --device cpu`` on a free loopback port, stopped after the module."""
    for module in ("fastapi", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            pytest.skip(f"the kcoral server needs {module}: pip install -e '.[remote]'")
    workdir = tmp_path_factory.mktemp("kcoral-server")
    log_path = workdir / "server.log"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # the server's own bubblewrap isolation where it works here; plain workers otherwise
    sandbox = "bubblewrap" if _bwrap_works() else "none"
    command = [sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
               "--num-workers", "2", "--sandbox", sandbox, "--log-dir", "", "--disk-cache-dir", ""]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_server_env(workdir))
    try:
        reason = _wait_until_ready(server, url, log_path)
        if reason:
            pytest.skip(reason)
        yield url
    finally:
        server.terminate()  # a clean shutdown stops the workers (bubblewrap's --die-with-parent too)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, 9)
            server.wait(10)


@pytest.fixture(scope="module")
def kcoral_router_url(tmp_path_factory: pytest.TempPathFactory):
    """A real ``kcoral router`` with one ``kcoral server --device cpu`` node behind it, both on
    free loopback ports and stopped after the module: the setup for more than one machine."""
    for module in ("fastapi", "uvicorn", "grpc"):
        try:
            __import__(module)
        except ImportError:
            pytest.skip(f"a kcoral router node needs {module}: pip install -e '.[remote]'")
    workdir = tmp_path_factory.mktemp("kcoral-router")
    router_port, node_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{router_port}"
    processes: list[subprocess.Popen] = []
    try:
        with open(workdir / "router.log", "wb") as log:
            processes.append(subprocess.Popen([sys.executable, "-m", "kcoral", "router", "--host", "127.0.0.1", "--port", str(router_port)],
                                              cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_server_env(workdir)))
        with open(workdir / "node.log", "wb") as log:
            processes.append(subprocess.Popen([sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--host", "127.0.0.1",
                                               "--port", str(node_port), "--router", url, "--node-id", "node-1", "--num-workers", "1",
                                               "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""],
                                              cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_server_env(workdir)))
        reason = _wait_until_ready(processes[0], url, workdir / "router.log")
        if reason:
            pytest.skip(f"{reason}; node log: {_tail(workdir / 'node.log')}")
        yield url
    finally:
        for process in reversed(processes):  # the node first, then the router
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, 9)
                process.wait(10)


def _server_env(workdir: Path) -> dict[str, str]:
    """The server's environment, its temporary files (a directory per program, which it leaves
    behind when stopped) under the fixture's own directory, not in the machine's /tmp."""
    temp = workdir / "tmp"
    temp.mkdir(exist_ok=True)
    return dict(os.environ, TMPDIR=str(temp))


def _wait_until_ready(server: subprocess.Popen, url: str, log_path: Path) -> str | None:
    """None once the server answers and a worker has run a program; otherwise why not."""
    deadline = time.monotonic() + SERVER_START_S
    with kcoral.Client(url, connect_timeout_seconds=2) as client:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                return f"kcoral server exited with status {server.returncode}: {_tail(log_path)}"
            try:
                client.health()
            except Exception:
                time.sleep(0.3)
                continue
            program = kcoral.Program()
            fn = program.get_function(module=program.upload(kind="module", source="def one():\n    return 1\n"), name="one")
            program.return_(key="one", value=program.run(fn=fn))
            try:
                outcome = client.execute(program, timeout_seconds=60)
            except Exception as exc:
                return f"kcoral server cannot run a program: {exc}: {_tail(log_path)}"
            if outcome.completed and outcome["one"] == 1:
                return None
            return f"kcoral server cannot run a program: {outcome.error}: {_tail(log_path)}"
    return f"kcoral server did not answer within {SERVER_START_S:.0f} s: {_tail(log_path)}"


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-1500:]


def _items(path: Path) -> dict[str, dict]:
    return {item["nodeid"]: item for item in json.loads(path.read_text())["items"]}


def test_remote_passing_candidate_runs_every_stage_on_the_server(make_case, run_kcoral, pytester, kcoral_url):
    make_case("cases/add")
    result = run_kcoral("--kcoral-url", kcoral_url, "-m", "seen", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, deselected=1)
    (item,) = _items(pytester.path / "out.json").values()
    assert item["stage"] == "done" and item["correct"] is True
    assert item["device"] == f"cpu@{kcoral_url}"
    assert item["timer"] == "wall" and item["speedup"] is not None
    remote = item["extra"]["remote"]
    assert remote["url"] == kcoral_url and remote["gpu_count"] == 0
    # the reference, the candidate, the baseline's timing (the candidate's way), the case's cost and
    # the timed outputs' reference
    assert [p["role"] for p in remote["programs"]] == ["trusted", "candidate", "baseline", "trusted", "trusted"]
    assert all(p["status"] == "COMPLETED" for p in remote["programs"])
    # and the record says what ran first: the candidate's program, whatever a local item would draw
    assert "first_in_turns=candidate: the side whose round came first in each pair of processes" in item["candidate_timing"]["flags"]
    # the server owns the leases: what it reports is what the item says (a CPU server holds none)
    assert item["lease_wait_ms"] == 0.0 and item["lease_held_ms"] == 0.0
    # the candidate's whole program runs in compile; the later phases replay its replies
    assert set(item["phases_ms"]) == {"reference", "compile", "correctness", "timing", "verify"}
    assert item["phases_ms"]["compile"] > item["phases_ms"]["correctness"]


HELPER_CASE = """
import torch
from task import make
SEEN = [{"n": 8}]
UNSEEN = []

def make_inputs(shape, device):
    return make(shape["n"], device)

def reference(a, b):
    import utils  # imported when called, on the server
    return utils.add(a, b)
"""
HELPERS = {
    "task.py": "import torch\ndef make(n, device):\n    return torch.randn(n, device=device), torch.randn(n, device=device)\n",
    "utils.py": "def add(a, b):\n    return a + b\n",
}


def test_remote_case_imports_the_modules_beside_it(make_case, run_kcoral, kcoral_url):
    make_case("cases/add", HELPER_CASE, {"c": "from utils import add\ndef run(a, b):\n    return add(a, b)\n"}, files=HELPERS)
    run_kcoral("--kcoral-url", kcoral_url, "--kcoral-mode", "correctness").assert_outcomes(passed=1)


def test_remote_runs_a_gpu_mode_submission(make_case, run_kcoral, kcoral_url):
    make_case("cases/add", candidates={"gm": "def custom_kernel(data):\n    a, b = data\n    return a + b\n"})
    run_kcoral("--kcoral-url", kcoral_url, "-m", "seen").assert_outcomes(passed=1, deselected=1)


def test_remote_grades_a_gpu_mode_problem_with_its_checker(pytester, run_kcoral, kcoral_url):
    # ../utils.py uploaded beside the case; check_implementation asked of trusted programs, the
    # timed outputs' too
    from test_gpumode_suite import FP32_SCAN, gpumode_problem

    gpumode_problem(pytester.path, solutions={"submission.py": FP32_SCAN,
                                              "solutions/wrong/zeros.py": "import torch\ndef custom_kernel(data):\n    return torch.zeros_like(data)\n"})
    result = run_kcoral("problems", "--kcoral-url", kcoral_url, "-k", "63", "-rx")
    result.assert_outcomes(passed=1, xfailed=1, deselected=4)
    result.stdout.fnmatch_lines(["*XFAIL*wrong/zeros*check_implementation: mismatch found!*"])


def test_remote_wrong_candidate_fails_correctness_with_the_local_message(make_case, run_kcoral, pytester, kcoral_url):
    make_case("cases/add", candidates={"wrong": WRONG})
    common = ("-m", "seen", "--kcoral-mode", "correctness", "--kcoral-seed", "7")
    local = run_kcoral(*common, "--kcoral-json", "local.json")
    local.assert_outcomes(failed=1, deselected=1)
    remote = run_kcoral(*common, "--kcoral-url", kcoral_url, "--kcoral-json", "remote.json")
    remote.assert_outcomes(failed=1, deselected=1)
    remote.stdout.fnmatch_lines(["*kcoral correctness failed: trial 1 of 3: output 0: * elements * outside atol*"])
    (local_item,) = _items(pytester.path / "local.json").values()
    (remote_item,) = _items(pytester.path / "remote.json").values()
    assert remote_item["stage"] == local_item["stage"] == "correctness"
    assert remote_item["message"] == local_item["message"]


def test_remote_output_is_captured_as_locally(make_case, run_kcoral, pytester, kcoral_url):
    chatty = "import sys\ndef run(a, b):\n    print('from the candidate', a.numel())\n    print('to stderr', file=sys.stderr)\n    return a - b\n"
    make_case("cases/add", candidates={"chatty": chatty})
    common = ("-m", "seen", "--kcoral-mode", "correctness", "--kcoral-trials", "1")
    run_kcoral(*common, "--kcoral-json", "local.json").assert_outcomes(failed=1, deselected=1)
    remote = run_kcoral(*common, "--kcoral-url", kcoral_url, "--kcoral-json", "remote.json")
    remote.assert_outcomes(failed=1, deselected=1)
    remote.stdout.fnmatch_lines(["*- Captured stdout call -*", "from the candidate 256", "*- Captured stderr call -*", "to stderr"])
    (local_item,) = _items(pytester.path / "local.json").values()
    (remote_item,) = _items(pytester.path / "remote.json").values()
    assert remote_item["output_tail"] == local_item["output_tail"]
    assert local_item["output_tail"]["stdout"]["text"] == "from the candidate 256\n"


def test_remote_compile_error_fails_compile(make_case, run_kcoral, kcoral_url):
    make_case("cases/add", candidates={"broken": BROKEN})
    result = run_kcoral("--kcoral-url", kcoral_url, "-m", "seen", "--kcoral-mode", "correctness")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral compile failed in phase 'import': ModuleNotFoundError: No module named 'no_such_module_anywhere'*"])


def test_remote_crash_fails_its_item_not_the_session(make_case, run_kcoral, kcoral_url):
    make_case("cases/add", candidates={"exits": EXITS, "good": "def run(a, b):\n    return a + b\n"})
    result = run_kcoral("--kcoral-url", kcoral_url, "-m", "seen", "--kcoral-mode", "correctness")
    result.assert_outcomes(failed=1, passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: the KCoral worker exited in phase 'correctness'*"])


def test_remote_hang_times_out_in_the_phase_it_reached(make_case, run_kcoral, kcoral_url):
    make_case("cases/add", candidates={"hangs": HANGS})
    result = run_kcoral("--kcoral-url", kcoral_url, "-m", "seen", "--kcoral-mode", "correctness", "--kcoral-timeout", "15")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*kcoral correctness failed: timed out in phase 'correctness' (item timeout reached)*"])


def test_a_workers_start_is_measured_and_left_out_of_the_item_time(make_case, run_kcoral, kcoral_url, pytester):
    # each program's worker imports torch and the case before the item's time counts
    # (``remote_runner.start``): the JSON says how long that took, program by program
    make_case("cases/add")
    result = run_kcoral("--kcoral-url", kcoral_url, "-m", "seen", "--kcoral-mode", "correctness", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, deselected=1)
    (item,) = json.loads((pytester.path / "out.json").read_text())["items"]
    programs = item["extra"]["remote"]["programs"]
    assert {p["role"] for p in programs} >= {"trusted", "candidate"}, programs
    # importing torch alone takes longer than this
    assert all(p["startup_ms"] is not None and p["startup_ms"] > 100 for p in programs), programs


RAISES_IN_A_HELPER = "def helper(a):\n    raise ValueError('boom')\n\ndef run(a, b):\n    return helper(a)\n"


def test_a_remote_traceback_names_the_candidates_file_here(make_case, run_kcoral, kcoral_url, pytester):
    # not the path of the file's copy in the server's program workspace
    make_case("cases/add", candidates={"boom": RAISES_IN_A_HELPER})
    result = run_kcoral("--kcoral-url", kcoral_url, "-m", "seen", "--kcoral-mode", "correctness")
    result.assert_outcomes(failed=1, deselected=1)
    here = pytester.path / "cases/add/candidates/boom.py"
    result.stdout.fnmatch_lines([f'*File "{here}", line 5, in run', f'*File "{here}", line 2, in helper'])


def test_local_and_remote_runs_agree_per_nodeid(make_case, run_kcoral, pytester, kcoral_url):
    make_case("cases/add", candidates={"good": "def run(a, b):\n    return a + b\n", "wrong": WRONG, "broken": BROKEN})
    common = ("-m", "seen", "--kcoral-seed", "11")
    run_kcoral(*common, "--kcoral-json", "local.json").assert_outcomes(passed=1, failed=2, deselected=3)
    run_kcoral(*common, "--kcoral-url", kcoral_url, "--kcoral-json", "remote.json").assert_outcomes(passed=1, failed=2, deselected=3)
    local, remote = _items(pytester.path / "local.json"), _items(pytester.path / "remote.json")
    assert local.keys() == remote.keys()
    for nodeid, item in local.items():
        fields = ("outcome", "stage", "compiled", "correct", "baseline_correct", "timer")
        assert {f: remote[nodeid][f] for f in fields} == {f: item[f] for f in fields}, nodeid
        assert set(remote[nodeid]) == set(item), nodeid  # the same ItemResult fields


IN_PLACE_CASE = """
import torch
SEEN = [{"n": 256}]
INPLACE = [0]

def make_inputs(shape, device):
    return torch.randn(shape["n"], device=device), torch.randn(shape["n"], device=device)

def reference(a, b):
    a.add_(b)
"""


def test_remote_checks_in_place_results_as_local_runs_do(make_case, run_kcoral, pytester, kcoral_url):
    watched = "calls = 0\ndef run(a, b):\n    global calls\n    calls += 1\n    if calls <= 3:\n        a.add_(b)\n"
    make_case("cases/iadd", IN_PLACE_CASE, {"good": "def run(a, b):\n    a.add_(b)\n", "noop": "def run(a, b):\n    pass\n",
                                            "watched": watched})
    common = ("--kcoral-seed", "5")
    run_kcoral(*common, "--kcoral-json", "local.json").assert_outcomes(passed=1, failed=2)
    run_kcoral(*common, "--kcoral-url", kcoral_url, "--kcoral-json", "remote.json").assert_outcomes(passed=1, failed=2)
    local, remote = _items(pytester.path / "local.json"), _items(pytester.path / "remote.json")
    for nodeid, item in local.items():
        assert (remote[nodeid]["stage"], remote[nodeid]["phase"]) == (item["stage"], item["phase"]), nodeid
    noop = next(i for n, i in remote.items() if "noop" in n)
    assert "input 0 (written in place by the reference)" in noop["message"]
    watched_item = next(i for n, i in remote.items() if "watched" in n)
    assert watched_item["phase"] == "verify" and "input 0 (written in place by the reference)" in watched_item["message"]


def test_a_router_in_front_of_the_server_grades_the_same(make_case, run_kcoral, pytester, kcoral_router_url):
    # --kcoral-url names a router as readily as a server: programs reach a node through it
    make_case("cases/add", candidates={"good": "def run(a, b):\n    return a + b\n", "wrong": WRONG})
    result = run_kcoral("-m", "seen", "--kcoral-url", kcoral_router_url, "--kcoral-json", "routed.json")
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    items = _items(pytester.path / "routed.json")
    good, wrong = items["cases/add::good[seen-n=256]"], items["cases/add::wrong[seen-n=256]"]
    assert good["stage"] == "done" and good["device"] == f"cpu@{kcoral_router_url}" and good["speedup"] is not None
    assert all(p["status"] == "COMPLETED" for p in good["extra"]["remote"]["programs"])
    assert wrong["stage"] == "correctness" and "outside atol" in wrong["message"]


def test_unreachable_url_is_a_usage_error_naming_it(make_case, run_kcoral):
    make_case("cases/add")
    url = f"http://127.0.0.1:{_free_port()}"
    result = run_kcoral("--kcoral-url", url)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--kcoral-url {url}: cannot reach the KCoral server: TransportError:*"])


def test_an_empty_url_option_grades_here_despite_kcoral_url_in_the_environment(make_case, run_kcoral, monkeypatch):
    make_case("cases/add")
    monkeypatch.setenv("KCORAL_URL", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    run_kcoral("--kcoral-url", "", "--kcoral-mode", "correctness").assert_outcomes(passed=2)


NUMBERS_CASE = """
import torch
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device),)

def reference(x):
    return x * 2, x.numel()
"""

BROKEN_REFERENCE_CASE = """
import torch
SEEN = [{"n": 64}]

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device),)

def reference(x):
    raise ValueError("reference bug")
"""


def test_remote_checks_structure_and_numbers_and_names_a_failed_case(make_case, run_kcoral, pytester, kcoral_url):
    make_case("cases/numbers", NUMBERS_CASE, {
        "good": "def run(x):\n    return x * 2, x.numel()\n",
        "off_by_one": "def run(x):\n    return [x * 2, x.numel() + 1]\n",  # a list for a tuple is fine; the count is not
        "single": "def run(x):\n    return x * 2\n",
    })
    make_case("cases/broken", BROKEN_REFERENCE_CASE, {"any": "def run(x):\n    return x\n", "missing": BROKEN})
    common = ("--kcoral-mode", "correctness", "--kcoral-seed", "5")
    run_kcoral(*common, "--kcoral-json", "local.json").assert_outcomes(passed=1, failed=4)
    remote = run_kcoral(*common, "--kcoral-url", kcoral_url, "--kcoral-json", "remote.json")
    remote.assert_outcomes(passed=1, failed=4)
    remote.stdout.fnmatch_lines(["CASE FAILED cases/broken on seen n=64, every candidate failing there: ValueError: reference bug"])
    local, remote_items = _items(pytester.path / "local.json"), _items(pytester.path / "remote.json")
    assert "output 1 is 65, expected 64" in remote_items["cases/numbers::off_by_one[seen-n=64]"]["message"]
    assert "returned a single value, the reference returns a tuple or list of 2" in remote_items["cases/numbers::single[seen-n=64]"]["message"]
    assert remote_items["cases/broken::any[seen-n=64]"]["case_failed"] is True
    for nodeid, item in local.items():  # the first lines: a traceback names the server's copy of the case
        assert (remote_items[nodeid]["message"] or "").split("\n")[0] == (item["message"] or "").split("\n")[0], nodeid
        # remote runs the reference before the candidate's program, yet reads as a local run that compiled first
        fields = ("stage", "compiled", "case_failed")
        assert {f: remote_items[nodeid][f] for f in fields} == {f: item[f] for f in fields}, nodeid


RAISING_BASELINE_CASE = """
import torch
SEEN = [{"n": 64}]
UNSEEN = []

def make_inputs(shape, device):
    return (torch.randn(shape["n"], device=device),)

def reference(x):
    return x * 2

def baseline(x):
    raise ValueError("no baseline today")
"""


def test_remote_a_baseline_that_fails_its_program_fails_the_case_as_locally(make_case, run_kcoral, pytester, kcoral_url):
    # the baseline's program failing once crashed the plugin (AttributeError), leaving the item out of the JSON
    make_case("cases/nobase", RAISING_BASELINE_CASE, {"good": "def run(x):\n    return x * 2\n"})
    run_kcoral("--kcoral-json", "local.json").assert_outcomes(failed=1)
    run_kcoral("--kcoral-url", kcoral_url, "--kcoral-json", "remote.json").assert_outcomes(failed=1)
    (local,), (remote,) = _items(pytester.path / "local.json").values(), _items(pytester.path / "remote.json").values()
    for item in (local, remote):
        assert (item["stage"], item["phase"], item["case_failed"], item["correct"]) == ("timing", "baseline", True, True)
        assert "ValueError: no baseline today" in item["message"]
    assert [p["role"] for p in remote["extra"]["remote"]["programs"]] == ["trusted", "candidate", "baseline"]


def test_remote_a_baseline_that_raises_on_an_unseen_shape_leaves_the_item_untimed_as_locally(make_case, run_kcoral, pytester, kcoral_url):
    even_only = RAISING_BASELINE_CASE.replace("UNSEEN = []", 'UNSEEN = [{"n": 65}]').replace(
        'raise ValueError("no baseline today")', 'if x.numel() % 2:\n        raise ValueError("even sizes only")\n    return x + x')
    make_case("cases/evens", even_only, {"good": "def run(x):\n    return x * 2\n"})
    run_kcoral("--kcoral-json", "local.json").assert_outcomes(passed=2)
    run_kcoral("--kcoral-url", kcoral_url, "--kcoral-json", "remote.json").assert_outcomes(passed=2)
    nodeid = "cases/evens::good[unseen-n=65]"
    local, remote = _items(pytester.path / "local.json")[nodeid], _items(pytester.path / "remote.json")[nodeid]
    for item in (local, remote):
        assert (item["correct"], item["baseline_correct"], item["speedup"]) == (True, False, None)
        assert "ValueError: even sizes only" in item["extra"]["untimed"]
    # no baseline program, and the candidate's carried no timing
    assert [p["role"] for p in remote["extra"]["remote"]["programs"]] == ["trusted", "candidate"]


def test_remote_a_reference_that_hangs_still_learns_whether_the_candidate_compiles(make_case, run_kcoral, pytester, kcoral_url):
    # the compile check once ran on what was left of the item's time, nothing, and read "does not compile"
    hanging = RAISING_BASELINE_CASE.replace("def reference(x):\n    return x * 2", "def reference(x):\n    import time\n    time.sleep(600)")
    make_case("cases/hangs", hanging, {"good": "def run(x):\n    return x * 2\n"})
    run_kcoral("--kcoral-url", kcoral_url, "--kcoral-timeout", "8", "--kcoral-json", "remote.json").assert_outcomes(failed=1)
    (item,) = _items(pytester.path / "remote.json").values()
    assert item["case_failed"] is True and item["compiled"] is True, item["message"]


@pytest.fixture
def own_server(tmp_path: Path):
    """A ``kcoral server`` of this test's own, in a process group of its own, that the test may
    freeze or kill; whatever is left of it is killed afterwards."""
    for module in ("fastapi", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            pytest.skip(f"the kcoral server needs {module}: pip install -e '.[remote]'")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "own-server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
                                   "--num-workers", "1", "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""],
                                  cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=_server_env(tmp_path))
    try:
        reason = _wait_until_ready(server, url, log_path)
        if reason:
            pytest.skip(reason)
        yield server, url
    finally:
        try:
            os.killpg(server.pid, 9)  # the server and its workers, frozen or not
        except ProcessLookupError:
            pass
        server.wait(10)


@pytest.mark.parametrize("how", ["frozen", "killed"])
def test_a_server_that_stops_answering_stops_the_session_and_blames_no_one(make_case, pytester, own_server, how):
    import signal

    server, url = own_server
    started = pytester.path / "started"
    # the candidate says when it runs on the server, then takes long enough for the server to go
    slow = f"import time\ndef run(a, b):\n    open({str(started)!r}, 'w').close()\n    time.sleep(30)\n    return a + b\n"
    make_case("cases/add", candidates={"slow": slow})
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "cases", "--kcoral-url", url,
                                "--kcoral-mode", "correctness", "--kcoral-timeout", "120", "--kcoral-json", "out.json"],
                               cwd=pytester.path, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert time.monotonic() < deadline and session.poll() is None, "the candidate never ran on the server"
            time.sleep(0.2)
        if how == "frozen":
            os.kill(server.pid, signal.SIGSTOP)  # the server process: no answer, not even to /health
        else:
            os.killpg(server.pid, 9)
        out, _ = session.communicate(timeout=90)  # well before the candidate's 30 s sleep and the 120 s item timeout add up
    finally:
        if session.poll() is None:
            session.kill()
    text = out.decode(errors="replace")
    assert session.returncode == pytest.ExitCode.INTERRUPTED, text[-3000:]
    assert f"kcoral could not grade this item: the KCoral server at {url} stopped answering" in text, text[-3000:]
    doc = json.loads((pytester.path / "out.json").read_text())
    assert doc["partial"] is True  # stopped at the first outage: the items after it were not graded
    (item,) = doc["items"]
    assert item["outcome"] == "failed" and item["extra"]["service_unavailable"] is True
    assert not item["case_failed"] and "the case itself failed" not in item["message"]
    assert doc["candidates"] == [] and doc["failed_cases"] == []  # no one is scored or blamed for it


def _start_router(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(workdir / "router.log", "wb") as log:
        router = subprocess.Popen([sys.executable, "-m", "kcoral", "router", "--host", "127.0.0.1", "--port", str(port)],
                                  cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_server_env(workdir))
    deadline = time.monotonic() + SERVER_START_S
    while pytest_kcoral.kcoral_programs.health_of(url) is None:
        if router.poll() is not None or time.monotonic() > deadline:
            router.kill()
            pytest.skip(f"the kcoral router did not start: {_tail(workdir / 'router.log')}")
        time.sleep(0.5)
    return router, url


def test_only_the_health_status_says_a_service_is_down(kcoral_url, tmp_path):
    """A healthy server reads capacity 0 while it replaces a worker, which it does after every
    program by default: one health poll in eight on a one-worker server with a request waiting,
    one in two under load. Taken for 'no worker left', that stopped the session on a shared,
    busy server. What a service that cannot finish programs says is its status: a router whose
    last node is gone answers 503, 'unavailable'."""
    from pytest_kcoral.kcoral_programs import _unhealthy
    from pytest_kcoral.kcoral_programs import health_of as _health

    status, body = _health(kcoral_url)
    assert status == 200 and _unhealthy(status, body) is None
    busy = dict(body, load=dict(body["load"], request_capacity=0, requests_waiting=1))  # as such a poll reads
    assert _unhealthy(200, busy) is None
    router, url = _start_router(tmp_path)  # no node behind it
    try:
        status, body = _health(url)
        assert (status, body["status"]) == (503, "unavailable")
        assert _unhealthy(status, body) == "its health check says status 'unavailable' (HTTP 503)"
    finally:
        router.terminate()
        router.wait(20)


def test_a_router_in_front_of_gpu_servers_is_graded_as_a_gpu(kcoral_router_url):
    """A router does not count its nodes' GPUs (``gpu_count`` null), so a GPU cluster behind one was
    graded as a CPU: Triton in its interpreter, gpu_only shapes skipped, the wall clock. Its nodes'
    compile target names the GPU architecture, and is empty for CPU workers."""
    from pytest_kcoral.kcoral_programs import device_kind_of as _device_kind
    from pytest_kcoral.kcoral_programs import health_of as _health

    status, body = _health(kcoral_router_url)  # CPU nodes behind a real router
    assert status == 200 and body["gpu_count"] is None and body["target"] == {}
    assert _device_kind(body) == "cpu"
    assert _device_kind(dict(body, target={"arch": "sm_90a"})) == "cuda"  # what a GPU node's workers report
    assert _device_kind(dict(body, gpu_count=2)) == "cuda"  # a GPU server counts its GPUs


def test_items_after_a_server_restart_name_the_new_instance(make_case, pytester, own_server, tmp_path):
    """The server's identity was read once, at connect: after a restart every later item named an
    instance that no longer existed. It is read again for every item."""
    import signal

    server, url = own_server
    make_case("cases/add", candidates={"good": "def run(a, b):\n    return a + b\n"})
    make_case("cases/mul", candidates={"good": "def run(a, b):\n    return a + b\n"})
    paused, resume = pytester.path / "paused", pytester.path / "resume"
    # a plain test between the two cases' items: the server is restarted while it waits
    (pytester.path / "pause").mkdir()
    (pytester.path / "pause" / "test_pause.py").write_text(
        "import pathlib, time\n\ndef test_pause():\n"
        f"    pathlib.Path({str(paused)!r}).touch()\n"
        f"    while not pathlib.Path({str(resume)!r}).exists():\n        time.sleep(0.2)\n")
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "kcoral", "-p", "no:cacheprovider", "cases/add", "pause", "cases/mul",
                                "--kcoral-url", url, "--kcoral-mode", "correctness", "--kcoral-json", "out.json"],
                               cwd=pytester.path, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second = None
    try:
        deadline = time.monotonic() + 180
        while not paused.exists():
            assert time.monotonic() < deadline and session.poll() is None, "the pause was never reached"
            time.sleep(0.2)
        first_id = pytest_kcoral.kcoral_programs.health_of(url)[1]["instance_id"]
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        port = url.rsplit(":", 1)[1]
        with open(tmp_path / "second-server.log", "wb") as log:
            second = subprocess.Popen([sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--host", "127.0.0.1", "--port", port,
                                       "--num-workers", "1", "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""],
                                      cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=_server_env(tmp_path))
        reason = _wait_until_ready(second, url, tmp_path / "second-server.log")
        assert reason is None, reason
        second_id = pytest_kcoral.kcoral_programs.health_of(url)[1]["instance_id"]
        resume.touch()
        out, _ = session.communicate(timeout=180)
    finally:
        if session.poll() is None:
            session.kill()
        if second is not None:
            os.killpg(second.pid, 9)
            second.wait(10)
    assert session.returncode == 0, out.decode(errors="replace")[-3000:]
    items = json.loads((pytester.path / "out.json").read_text())["items"]
    ids: dict[str, set[str]] = {}
    for item in items:
        ids.setdefault(item["case"], set()).add(item["extra"]["remote"]["instance_id"])
    assert first_id != second_id
    assert ids == {"cases/add": {first_id}, "cases/mul": {second_id}}, (ids, out.decode(errors="replace")[-3000:])
