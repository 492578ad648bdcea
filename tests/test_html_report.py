"""``--kcoral-html``: the report page, parsed as a browser would read it (and rendered in headless
Chromium where one is installed)."""

from __future__ import annotations

import html.parser
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from pytest_kcoral import scoring
from pytest_kcoral.report import html as html_report
from pytest_kcoral.report import json_artifact
from pytest_kcoral.results import ItemResult

# what a candidate might name itself, or print into its failure message
HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "b", "br", "span", "div", "table",
                "thead", "tbody", "tr", "th", "td", "details", "summary", "pre", "small",
                "svg", "line", "circle", "rect", "text", "g"}


class Page(html.parser.HTMLParser):
    """The elements of a page, their attributes, the text inside each ``td`` and ``svg``."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.first_cells: list[str] = []  # of the items table
        self._stack: list[str] = []
        self._cell: list[str] | None = None
        self._in_items = False
        self._column = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "table":
            self._in_items = "items" in (attributes.get("class") or "")
        if tag == "tr":
            self._column = 0
        if tag == "td" and self._in_items:
            self._column += 1
            self._cell = [] if self._column == 1 else None
        if tag not in ("meta", "br", "line", "circle", "rect"):
            self._stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.first_cells.append("".join(self._cell))
            self._cell = None
        if tag == "table":
            self._in_items = False
        if self._stack and self._stack[-1] == tag:
            self._stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def svgs(self, css_class: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == "svg" and a.get("class") == css_class]


def _timing(median_us: float) -> dict:
    return {"method": "wall", "median_us": median_us, "n": 100, "flags": [], "rounds": 8,
            "round_medians_us": [median_us * (1 + i / 100) for i in range(8)],
            "quantiles_us": [median_us * (0.9 + i / 320) for i in range(65)]}


def hostile_items() -> list[ItemResult]:
    def item(candidate: str, split: str, shape_id: str, **kw) -> ItemResult:
        return ItemResult(nodeid=f"cases/a::{candidate}[{split}-{shape_id}]", case="cases/a", candidate=candidate, split=split,
                          shape={"n": 1}, shape_id=shape_id, **{"compiled": True, **kw})

    timed = dict(stage="done", outcome="passed", correct=True, timer="wall", t_baseline_us=20.0, t_candidate_us=10.0,
                 baseline_timing=_timing(20.0), candidate_timing=_timing(10.0))
    return [
        item("good", "seen", "n=1", speedup=2.0, speedup_ci=[1.9, 2.1], speedup_ci_level=0.95, **timed),
        item("good", "unseen", "n=3", speedup=1.5, speedup_ci=[1.2, 1.9], speedup_ci_level=0.95, noisy=True,
             noisy_reason="wall-clock timing " + HOSTILE, baseline_correct=True, **timed),
        item(HOSTILE, "seen", "n=1", stage="correctness", outcome="failed", correct=False,
             message="trial 1: output 0 wrong </pre>" + HOSTILE + "\nsecond line"),
        item(HOSTILE, "unseen", HOSTILE, stage="compile", outcome="failed", compiled=False, message=HOSTILE),
        item("skipper", "seen", "n=1", stage="compile", outcome="skipped", message="gpu_only"),
    ]


def render(items: list[ItemResult], **kw) -> str:
    return html_report.render(json_artifact.build_document(items, scoring.score(items), **kw))


def test_the_page_holds_one_chart_per_pair_and_lists_every_item():
    items = hostile_items()
    page = Page(render(items))
    pairs = scoring.score(items).candidates
    assert len(pairs) == 2  # good and the hostile one; the skipped pair is in no score
    assert len(page.svgs("pair-chart")) == len(pairs)
    assert [a["aria-label"] for a in page.svgs("pair-chart")] == [f"speedup per shape of cases/a::{c.candidate}" for c in pairs]
    assert len(page.svgs("overview-chart")) == 1
    assert sorted(page.first_cells) == sorted(it.nodeid for it in items)
    assert len(page.svgs("dist-chart")) == 2  # the timed items
    text = "".join(page.text)
    assert "1.50x (1.20-1.90x)" in text  # an unseen speedup with its interval
    assert "2.00x" in text and "±5.0%" in text  # the seen one, whose interval reaches 5% from it


def test_names_and_messages_cannot_inject_markup():
    source = render(hostile_items())
    page = Page(source)
    assert {t for t, _ in page.tags} <= ALLOWED_TAGS
    for tag, attributes in page.tags:
        assert not any(name.startswith("on") or name in ("src", "href") for name in attributes), (tag, attributes)
    assert "<script" not in source and "<img" not in source
    # the hostile text is shown, as text: in the failures, the grid's tooltips and the items
    text = "".join(page.text)
    assert text.count(HOSTILE) >= 4
    assert any(HOSTILE in (a.get("title") or "") for _, a in page.tags)
    (policy,) = [a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert "default-src 'none'" in policy


def test_a_partial_session_says_so_and_the_secret_seed_stays_out():
    items = hostile_items()
    doc = json_artifact.build_document(items, scoring.score(items), partial=True)
    doc["seed"] = 987654321987
    source = html_report.render(doc)
    assert "Partial run" in source
    assert "987654321987" not in source


def test_large_suites_draw_fewer_points_and_the_page_stays_bounded():
    base = hostile_items()[0]
    items = []
    for n in range(600):
        d = base.to_dict()
        d.update(nodeid=f"cases/a::good[seen-n={n}]", shape_id=f"n={n}")
        items.append(ItemResult.from_dict(d))
    source = render(items)
    assert html_report.points_per_side(600) == 17
    assert len(Page(source).svgs("dist-chart")) == 600
    assert len(source) < 5_000_000 and len(source) / 600 < 6000


def test_old_documents_without_intervals_or_quantiles_still_render():
    items = hostile_items()
    doc = json_artifact.build_document(items, scoring.score(items))
    for it in doc["items"]:
        it.pop("speedup_ci", None)
        for side in ("baseline_timing", "candidate_timing"):
            if it.get(side):
                it[side].pop("quantiles_us")  # the round medians are drawn instead
    for c in doc["candidates"]:
        c.pop("mean_speedup_seen_range")
    page = Page(html_report.render(doc))
    assert len(page.svgs("dist-chart")) == 2 and len(page.svgs("pair-chart")) == 2


def test_main_renders_a_saved_document(tmp_path: Path):
    items = hostile_items()
    saved = tmp_path / "out.json"
    json_artifact.write_atomically(saved, json_artifact.build_document(items, scoring.score(items)))
    assert html_report.main([str(saved), str(tmp_path / "page.html")]) == 0
    assert len(Page((tmp_path / "page.html").read_text()).first_cells) == len(items)
    assert html_report.main([str(saved)]) == 2


def test_main_names_a_file_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "notes.txt").write_text("not json")
    for path in (tmp_path / "notes.txt", tmp_path / "missing.json"):
        assert html_report.main([str(path), str(tmp_path / "page.html")]) == 2
        assert f"{path}: not a --kcoral-json document" in capsys.readouterr().err
    assert not (tmp_path / "page.html").exists()


# -- the session writes it -------------------------------------------------------------------------

FAKE_PIPELINE = textwrap.dedent("""
    import pytest

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(item, call):
        report = yield
        if call.when == "call":
            p = item.callspec.params
            timing = {"method": "wall", "median_us": 10.0, "flags": [], "quantiles_us": [9.0, 10.0, 11.0]}
            report.kcoral_result = {
                "nodeid": item.nodeid, "case": "cases/a", "candidate": p["candidate"], "split": "seen", "shape": {},
                "shape_id": p["shape_id"], "stage": "done" if p["ok"] else "correctness", "outcome": report.outcome,
                "compiled": True, "correct": p["ok"], "speedup": 1.0 if p["ok"] else None, "timer": "wall",
                "speedup_ci": [0.9, 1.1] if p["ok"] else None, "baseline_timing": timing, "candidate_timing": timing,
                "message": None if p["ok"] else "wrong output",
            }
        return report
""")

FAKE_CASES = textwrap.dedent("""
    import pytest

    @pytest.mark.parametrize("candidate,shape_id,ok", [
        ("v1", "n=1", True), ("v1", "n=2", True), ("v2", "n=1", False), ("v2", "n=2", True), ("w", "n=1", True),
    ])
    def test_item(candidate, shape_id, ok):
        assert ok, "wrong output"
""")


@pytest.fixture
def fake_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(FAKE_PIPELINE)
    pytester.makepyfile(test_fake=FAKE_CASES)
    return pytester


def test_the_controller_writes_the_page_under_xdist(fake_suite: pytest.Pytester):
    pytest.importorskip("xdist")
    result = fake_suite.runpytest("-p", "kcoral", "test_fake.py", "--kcoral-html", "report/page.html", "-n", "2", "-p", "no:benchmark")
    result.stdout.fnmatch_lines(["*created: 2/2 workers*", "report page written to *page.html"])
    page = Page((fake_suite.path / "report" / "page.html").read_text())
    assert len(page.first_cells) == 5  # every item, gathered from both workers
    assert len(page.svgs("pair-chart")) == 3
    assert not list(fake_suite.path.glob("report/.page.html.*"))  # written atomically: no temporary file left


def test_a_session_stopped_by_x_still_writes_a_partial_page(fake_suite: pytest.Pytester):
    fake_suite.runpytest("-p", "kcoral", "test_fake.py", "--kcoral-html", "page.html", "-x")
    source = (fake_suite.path / "page.html").read_text()
    assert "Partial run" in source
    assert len(Page(source).first_cells) == 3  # v1 twice, then v2's failure stopped it


def test_a_directory_for_the_page_is_a_usage_error(fake_suite: pytest.Pytester):
    (fake_suite.path / "out").mkdir()
    result = fake_suite.runpytest("-p", "kcoral", "test_fake.py", "--kcoral-html", "out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kcoral-html out: a directory*"])


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]


def _chromium() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None)


@pytest.mark.skipif(_chromium() is None, reason="no chromium on this machine (apt-get install chromium to run it)")
def test_chromium_renders_the_page_without_running_anything(tmp_path: Path):
    """The page as a browser builds it: the hostile names stay text (no script or image element
    in the DOM Chromium built), and it draws something."""
    page = tmp_path / "page.html"
    page.write_text(render(hostile_items()))
    proc = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = Page(proc.stdout)
    assert {t for t, _ in dom.tags} <= ALLOWED_TAGS
    assert len(dom.svgs("pair-chart")) == 2
    assert "".join(dom.text).count(HOSTILE) >= 4
    shot = tmp_path / "page.png"
    subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,2000",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000  # a page drawn, not a blank one


def test_the_json_and_the_page_agree(fake_suite: pytest.Pytester):
    fake_suite.runpytest("-p", "kcoral", "test_fake.py", "--kcoral-html", "page.html", "--kcoral-json", "out.json")
    doc = json.loads((fake_suite.path / "out.json").read_text())
    page = Page((fake_suite.path / "page.html").read_text())
    assert sorted(page.first_cells) == sorted(it["nodeid"] for it in doc["items"])
