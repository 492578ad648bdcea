"""The static report on candidate source: information in the item's properties, never a verdict."""

from __future__ import annotations

import json

import attacks

from pytest_kcoral.static_report import scan_source


def test_suspicious_constructs_are_named_with_their_line():
    report = scan_source(attacks.READ_EXPECTED_FROM_MEMORY)
    assert "line 2: import gc: gc (reading objects the harness holds)" in report
    assert "line 2: import inspect: inspect (reading the harness's frames)" in report
    assert any(".get_objects" in line for line in report)
    assert any(".f_back" in line for line in report)


def test_streams_threads_ctypes_and_monkeypatching_are_reported():
    src = (
        "import threading, ctypes, torch, time\n"
        "s = torch.cuda.Stream()\n"
        "time.perf_counter = lambda: 0.0\n"
        "setattr(torch, 'allclose', None)\n"
        "from case import reference\n"
        "def run(a, b):\n    return reference(a, b)\n"
    )
    text = "\n".join(scan_source(src))
    for expected in ("import threading", "import ctypes", ".Stream", "time.perf_counter = ...", "setattr()", "line 5: reference", "line 7: reference()"):
        assert expected in text, (expected, text)


def test_pinned_host_memory_is_reported():
    src = "import torch\ndef run(a, b):\n    host = (a.cpu() + b.cpu()).pin_memory()\n    return host.to(a.device, non_blocking=True)\n"
    assert any("pinned host memory" in line and "line 3" in line for line in scan_source(src)), scan_source(src)


def test_honest_candidates_report_nothing():
    assert scan_source("import torch\nimport triton\nimport triton.language as tl\ndef run(a, b):\n    return a + b\n") == []


def test_report_lands_in_junit_and_json_without_failing(make_case, run_kcoral, pytester):
    src = "import threading\ndef run(a, b):\n    return a + b\n"
    make_case("cases/add", candidates={"uses_threads": src})
    result = run_kcoral("--kcoral-mode", "correctness", "-m", "seen", "--junitxml", "junit.xml", "--kcoral-json", "out.json")
    result.assert_outcomes(passed=1, deselected=1)
    xml = (pytester.path / "junit.xml").read_text()
    assert 'name="kcoral_suspicious" value="line 1: import threading: threads (work left running after return)"' in xml
    items = json.loads((pytester.path / "out.json").read_text())["items"]
    assert items[0]["suspicious"] == ["line 1: import threading: threads (work left running after return)"]
