"""xdist: ``-n 2`` grades the same items with the same outcomes as a serial run, and the results
reach the controller, which alone writes the artifacts."""

from __future__ import annotations

import json

GOOD = "def run(a, b):\n    return a + b\n"
WRONG = "def run(a, b):\n    return a - b\n"
SEEN_ONLY = "def run(a, b):\n    out = a + b\n    if a.numel() % 2:\n        out[-1] = 0.0\n    return out\n"


def _outcomes(path):
    doc = json.loads(path.read_text())
    return {item["nodeid"]: (item["outcome"], item["stage"], item["correct"]) for item in doc["items"]}


def test_two_workers_match_a_serial_run(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"good": GOOD, "wrong": WRONG, "seen_only": SEEN_ONLY})
    make_case("cases/add2", candidates={"good": GOOD, "crash": "import os\ndef run(a, b):\n    os._exit(3)\n"})
    serial = run_kcoral("--kcoral-json", "serial.json", "--kcoral-seed", "7")
    parallel = run_kcoral("-n", "2", "--kcoral-json", "parallel.json", "--kcoral-seed", "7")
    expected = dict(passed=5, failed=5)
    serial.assert_outcomes(**expected)
    parallel.assert_outcomes(**expected)
    s, p = _outcomes(pytester.path / "serial.json"), _outcomes(pytester.path / "parallel.json")
    assert s == p and len(s) == 10
    assert s["cases/add::seen_only[seen-n=256]"] == ("passed", "done", True)
    assert s["cases/add::seen_only[unseen-n=257]"] == ("failed", "correctness", False)
    # the summary is written once, by the controller
    assert parallel.stdout.str().count("kcoral summary") == 1


def _junit(path):
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    suite_props = {p.get("name"): p.get("value") for p in suite.find("properties") or []}
    items = {}
    for case in suite.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        items[props.get("kcoral_nodeid") or case.get("name")] = props
    return suite_props, items


def test_json_junit_and_table_agree_under_xdist(make_case, run_kcoral, pytester):
    make_case("cases/add", candidates={"good": GOOD, "wrong": WRONG, "seen_only": SEEN_ONLY})
    runs = {}
    for name, extra in (("serial", []), ("parallel", ["-n", "2"])):
        result = run_kcoral("--kcoral-json", f"{name}.json", "--junitxml", f"{name}.xml", "--kcoral-seed", "3", *extra)
        doc = json.loads((pytester.path / f"{name}.json").read_text())
        suite_props, junit_items = _junit(pytester.path / f"{name}.xml")
        # JUnit per-item properties match the JSON items, item by item (names end in the item name)
        assert len(junit_items) == len(doc["items"]) == 6
        for item in doc["items"]:
            (props,) = [p for n, p in junit_items.items() if item["nodeid"].endswith(n)]
            assert props["kcoral_stage"] == item["stage"]
            if item["speedup"] is not None:
                assert abs(float(props["kcoral_speedup"]) - item["speedup"]) < 1e-3 * item["speedup"] + 1e-4
        # suite figures in the JUnit file are the JSON's
        assert float(suite_props["kcoral_correctness_rate"]) == round(doc["suite"]["correctness_rate"], 6)
        assert int(suite_props["kcoral_pairs"]) == doc["suite"]["pairs"] == 3
        assert suite_props["kcoral_timed_by"] == ", ".join(f"{m} {n}" for m, n in doc["timers"]["methods"].items())
        assert suite_props["kcoral_timer_fallbacks"] == "0"
        # the terminal table shows each pair as the JSON scores it
        for cand in doc["candidates"]:
            unseen = cand["correct_unseen"]
            row = f"cases/add::{cand['candidate']} *{'yes' if cand['compiled'] else 'no'} *{'yes' if cand['correct_seen'] else 'no'} *{sum(unseen.values())}/{len(unseen)} *"
            result.stdout.fnmatch_lines([row])
        runs[name] = doc
    fields = ("case", "candidate", "compiled", "correct_seen", "correct_unseen")
    assert [{k: c[k] for k in fields} for c in runs["serial"]["candidates"]] == \
           [{k: c[k] for k in fields} for c in runs["parallel"]["candidates"]]


def test_a_shapes_items_run_on_one_worker(make_case, run_kcoral, pytester):
    """Reference data is computed once per worker and shape: xdist's round-robin start would give
    a shape's consecutive items to alternating workers, each computing it again."""
    case = "import torch\nSEEN = [{'n': 64}, {'n': 128}]\nUNSEEN = [{'n': 65}, {'n': 129}]\n" \
           "def make_inputs(shape, device):\n    return torch.randn(shape['n']), torch.randn(shape['n'])\n" \
           "def reference(a, b):\n    return a + b\n"
    make_case("cases/add", case, candidates={f"c{k}": GOOD for k in range(4)})
    result = run_kcoral("-n", "2", "--kcoral-json", "out.json", "--kcoral-mode", "correctness")
    result.assert_outcomes(passed=16)
    doc = json.loads((pytester.path / "out.json").read_text())
    workers_by_shape: dict[str, set[int]] = {}
    for lease in doc["lease_history"]:
        shape = lease["label"].split("[", 1)[1]
        workers_by_shape.setdefault(shape, set()).add(lease["pid"])
    assert len(workers_by_shape) == 4 and all(len(pids) == 1 for pids in workers_by_shape.values()), workers_by_shape
    assert len(set().union(*workers_by_shape.values())) == 2  # and both workers had work


def test_shape_scope_groups_case_items_only(tmp_path):
    from pytest_kcoral.scheduling import shape_scope

    (tmp_path / "cases" / "add").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    assert shape_scope("cases/add::good[seen-n=4]", tmp_path) == "cases/add::[seen-n=4]"
    assert shape_scope("cases/add::other[seen-n=4]", tmp_path) == "cases/add::[seen-n=4]"
    assert shape_scope("tests/test_x.py::test_f[seen-n=4]", tmp_path) == "tests/test_x.py::test_f[seen-n=4]"
    assert shape_scope("cases/add::Klass::test[1]", tmp_path) == "cases/add::Klass::test[1]"
    # a KernelBench problem file among others is a case of its own
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "1_Add.py").write_text("class Model: pass\ndef get_inputs(): pass\ndef get_init_inputs(): pass\n")
    assert shape_scope("level1/1_Add.py::run/sample_0[seen-default]", tmp_path) == "level1/1_Add.py::[seen-default]"
