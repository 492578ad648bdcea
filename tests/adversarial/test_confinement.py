"""Confinement by default (``confine.py``): children write only to their own directory and the
session's caches, under Landlock where the kernel has it; without it the summary and the JSON say so."""

from __future__ import annotations

import json
import os
import site

import pytest

from pytest_kcoral import confine

ABI, WHY_NOT = confine.landlock_abi()
needs_landlock = pytest.mark.skipif(not ABI, reason=f"no Landlock here: {WHY_NOT}")

# Tries every write a same-user candidate could use to reach beyond its item, then says what
# happened to each; the private directory it works in stays writable.
ESCAPES = """
import os

TARGETS = TARGETS_HERE

def _try(path):
    try:
        with open(path, "w") as f:
            f.write("import sys; sys.stderr.write('kcoral escape ran\\\\n')\\n")
    except OSError as exc:
        return f"{os.path.basename(os.path.dirname(path))}: {type(exc).__name__}"
    return f"{os.path.basename(os.path.dirname(path))}: WRITTEN"

def run(a, b):
    with open("scratch.txt", "w") as f:      # the private directory is writable
        f.write("ok")
    raise RuntimeError("escapes: " + " | ".join(_try(p) for p in TARGETS))
"""

HONEST_WRITER = """
import os, subprocess, tempfile

def run(a, b):
    with open("scratch.txt", "w") as f:      # its working directory
        f.write("ok")
    with tempfile.NamedTemporaryFile() as f:  # temp files land in its own directory
        f.write(b"ok")
    subprocess.run("echo quiet > /dev/null", shell=True, check=True)
    return a + b
"""


def _targets(pytester: pytest.Pytester, lease_dir, case_dir, marker: str) -> dict[str, str]:
    """Where the candidate tries to write: a ``.pth`` in the running interpreter's site-packages,
    the lease directory, the case folder, the JSON report's path, the user's home."""
    return {
        "site-packages": os.path.join(site.getsitepackages()[0], f"{marker}.pth"),
        "leases": os.path.join(lease_dir, f"{marker}.lock"),
        "case": os.path.join(case_dir, f"{marker}.py"),
        "report": str(pytester.path / "out.json"),
        "home": os.path.join(os.path.expanduser("~"), f"{marker}.txt"),
    }


@needs_landlock
def test_writes_outside_the_workspace_are_refused(make_case, run_kcoral, pytester):
    marker = f"kcoral_escape_{os.getpid()}"
    lease_dir = pytester.path / "leases"
    case_dir = pytester.path / "cases" / "add"
    targets = _targets(pytester, lease_dir, case_dir, marker)
    try:
        make_case("cases/add", candidates={"escapes": ESCAPES.replace("TARGETS_HERE", repr(list(targets.values()))),
                                           "honest": HONEST_WRITER})
        result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "--kcoral-lease-dir", str(lease_dir),
                            "--kcoral-json", "out.json")
        result.assert_outcomes(passed=1, failed=1, deselected=2)
        out = result.stdout.str()
        for path in targets.values():
            where = os.path.basename(os.path.dirname(path))
            assert f"{where}: PermissionError" in out, (where, out)
        for name, path in targets.items():
            if name != "report":  # the report is written after the items, by the pytest process
                assert not os.path.exists(path), f"the candidate wrote {path}"
        doc = json.loads((pytester.path / "out.json").read_text())
        assert doc["environment"]["confinement"] == f"landlock ABI {ABI}"
        assert "NOT CONFINED" not in out
    finally:
        for name, path in targets.items():
            if name != "report" and os.path.exists(path):
                os.unlink(path)


@needs_landlock
def test_a_pth_file_in_site_packages_is_refused(make_case, run_kcoral, pytester):
    """A ``.pth`` file in site-packages runs in every later Python process of the environment,
    the next grading session's included: the write fails and the file never appears."""
    pth = os.path.join(site.getsitepackages()[0], f"kcoral_attack_{os.getpid()}.pth")
    source = f"""
import torch
PTH = {pth!r}
with open(PTH, "w") as f:  # at import: the whole candidate fails to load
    f.write("import os; os.environ['KCORAL_OWNED'] = '1'\\n")
def run(a, b):
    return a + b
"""
    try:
        make_case("cases/add", candidates={"pth": source})
        result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
        result.assert_outcomes(failed=1, deselected=1)
        result.stdout.fnmatch_lines([f"*kcoral compile failed*PermissionError*{os.path.basename(pth)}*"])
        assert not os.path.exists(pth)
    finally:
        if os.path.exists(pth):
            os.unlink(pth)


@needs_landlock
@pytest.mark.skipif(ABI < 6, reason=f"signal scoping needs Landlock ABI 6 (Linux 6.12), this kernel has {ABI}")
def test_signals_out_of_the_child_are_refused(make_case, run_kcoral):
    """From ABI 6 a candidate cannot signal the pytest process, the template or the case's
    other children (a SIGSTOP of the baseline's child would slow its timing)."""
    source = f"""
import os
def run(a, b):
    refused = []
    for who, pid in (("pytest", {os.getpid()}), ("template", os.getppid())):
        try:
            os.kill(pid, 0)
        except PermissionError:
            refused.append(who)
    raise RuntimeError("signals refused to: " + ", ".join(refused))
"""
    make_case("cases/add", candidates={"signals": source})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*RuntimeError: signals refused to: pytest, template*"])


@needs_landlock
def test_a_child_names_its_own_threads_and_no_other_process(make_case, run_kcoral):
    """CUDA's cuInit names the threads it starts through ``/proc/<pid>/task/<tid>/comm`` and fails
    with error 304 when that write is refused: a confined child may write there for its own
    threads, also those started after it was confined, and for no other process."""
    source = f"""
import os, threading
def _name(path):
    try:
        with open(path, "w") as f:
            f.write("kcoral-named")
        return "named"
    except OSError as exc:
        return type(exc).__name__
def run(a, b):
    found = {{}}
    worker = threading.Thread(target=lambda: found.update(thread=_name(f"/proc/self/task/{{threading.get_native_id()}}/comm")))
    worker.start(); worker.join()
    found["main"] = _name(f"/proc/self/task/{{threading.get_native_id()}}/comm")
    found["template"] = _name(f"/proc/{{os.getppid()}}/comm")
    found["pytest"] = _name("/proc/{os.getpid()}/comm")
    raise RuntimeError("comm: " + ", ".join(f"{{k}}={{v}}" for k, v in sorted(found.items())))
"""
    make_case("cases/add", candidates={"names": source})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*RuntimeError: comm: main=named, pytest=PermissionError, template=PermissionError, thread=named*"])


@needs_landlock
def test_an_honest_candidate_that_writes_its_own_files_passes(make_case, run_kcoral):
    make_case("cases/add", candidates={"honest": HONEST_WRITER})
    run_kcoral("-m", "seen").assert_outcomes(passed=1, deselected=1)


def test_without_confinement_the_summary_and_the_json_say_so(make_case, run_kcoral, pytester):
    make_case("cases/add")
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "--kcoral-confinement", "off", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["NOT CONFINED: children could write outside their own directories (off (--kcoral-confinement off)); *"])
    assert result.stdout.str().count("NOT CONFINED") == 1
    doc = json.loads((pytester.path / "out.json").read_text())
    assert doc["environment"]["confinement"] == "off (--kcoral-confinement off)"


def test_required_confinement_where_there_is_none_is_a_usage_error(make_case, run_kcoral):
    if ABI:
        pytest.skip("Landlock is here: --kcoral-confinement landlock runs")
    make_case("cases/add")
    result = run_kcoral("--kcoral-confinement", "landlock")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kcoral-confinement landlock: children cannot be confined here (none: *)*"])


# Where a confined candidate's compile caches, home and temp files go, written to and then shown
SHOWS_ITS_CACHES = """
import os, tempfile

def run(a, b):
    places = {}
    for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH", "HOME"):
        os.makedirs(os.environ[key], exist_ok=True)
        with open(os.path.join(os.environ[key], "probe"), "w") as f:   # writable
            f.write("ok")
        places[key] = os.environ[key]
    places["tmp"] = tempfile.mkdtemp()
    raise RuntimeError("places " + " ".join(f"{k}={v}" for k, v in sorted(places.items())) + " cwd=" + os.getcwd())
"""


@needs_landlock
def test_a_candidates_caches_are_the_sessions_and_writable(make_case, run_kcoral):
    import re

    make_case("cases/add", candidates={"caches": SHOWS_ITS_CACHES})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen")
    result.assert_outcomes(failed=1, deselected=1)
    line = next(x for x in result.stdout.lines if x.startswith("kcoral correctness failed: RuntimeError: places "))
    places = dict(re.findall(r"(\w+)=(\S+)", line))
    for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH", "HOME"):
        # the session's cache directory, shared by its candidates and outside each one's own
        assert os.path.basename(os.path.dirname(places[key])).startswith("kcoral-caches-"), (key, places)
    assert places["tmp"].startswith(places["cwd"] + os.sep)


# The template is a multiprocessing forkserver: it forks a process for whoever connects to its Unix
# socket, and that process unpickles what it reads. A confined candidate found the socket in
# /proc/net/unix and sent a pickle that runs a command: the command ran outside the confinement
# and wrote into the case tree (a .pth in site-packages would run in every later session).
THROUGH_THE_TEMPLATE = """
import os
import pickle
import socket

MARK = {mark!r}
OWN_DIR = {own_dir!r}  # this session's sockets only: other sessions of the user listen too


class _Command:
    def __reduce__(self):
        return (os.system, (f"echo unconfined > {{MARK}}",))


def _key():
    # any secret the template holds is in this process too (it is a fork of the template): a key
    # the template wanted first on the pipe was a closure's cell of spawn._main
    import multiprocessing.spawn
    for cell in getattr(multiprocessing.spawn._main, "__closure__", None) or ():
        if isinstance(cell.cell_contents, bytes):
            return cell.cell_contents
    return b""


with open("/proc/net/unix") as f:
    addresses = [line.split()[-1] for line in f.read().splitlines()[1:] if line.split()[-1].startswith(OWN_DIR)]
for address in addresses:
    r, w = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(address)
            # child_r, child_w, the alive fd, the resource tracker's fd
            socket.send_fds(s, [bytes([4])], [r, w, w, w])
            os.write(w, _key() + pickle.dumps(_Command()))
    except OSError:  # the template may hang up before the fds are sent
        pass
print("sent through", addresses)


def run(a, b):
    return a + b
"""


@needs_landlock
def test_a_candidate_cannot_have_the_template_fork_an_unconfined_process(make_case, run_kcoral, pytester):
    import multiprocessing.util
    import time

    folder = make_case("cases/add")
    mark = folder / "MARK"
    own_dir = multiprocessing.util.get_temp_dir()  # where this process's template listens
    make_case("cases/add", candidates={"attack": THROUGH_THE_TEMPLATE.format(mark=str(mark), own_dir=own_dir)})
    result = run_kcoral("--kcoral-mode", "correctness", "-s")
    assert "sent through ['" + own_dir in result.stdout.str(), result.stdout.str()[-2000:]
    time.sleep(1.0)  # what the template forked runs on its own time
    assert not mark.exists(), "the template forked an unconfined process for the candidate"
