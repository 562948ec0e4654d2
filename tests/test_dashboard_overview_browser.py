"""The trace overview in a real browser: ``nsysan serve`` in its own process, Debian's Chromium via
Playwright (skips without them, like tests/test_dashboard_browser.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fixtures.samples import SAMPLES_DIR
from nsysan.report import format as fmt
from tests.test_dashboard_browser import _database
from tools.browser import ServeProcess

GRAPH = "#timeline .js-plotly-plot"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[ServeProcess]:
    """One server per store: SQLite, and PostgreSQL (emptied; as tests/test_dashboard_browser.py)."""
    tmp = tmp_path_factory.mktemp("overview")
    traces = tmp / "traces"
    traces.mkdir()
    for name in ("pipeline-stall", "overlap-slowdown"):
        shutil.copy(SAMPLES_DIR / f"{name}.sqlite", traces)
    with ServeProcess(traces, _database(request.param, tmp), tmp) as s:
        yield s


def _page(browser, served, name: str) -> tuple[object, str]:
    """A page (CSP bypassed for the test's own evaluate calls) and the overview's URL of ``name``."""
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.goto(served.url)
    row = page.locator("table.library tr", has=page.get_by_role("link", name=name, exact=True))
    row.locator("td.status", has_text="ready").wait_for(timeout=60_000)
    trace_id = row.get_attribute("data-trace")
    return page, f"{served.url}/traces/{trace_id}"


def _report(sample: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "nsysan", "report", str(SAMPLES_DIR / f"{sample}.sqlite"),
                          "--format", "json"], capture_output=True, text=True, check=False)  # fmt: skip
    return json.loads(out.stdout)


def test_the_summary_shows_the_reports_figures(browser, served):
    page, url = _page(browser, served, "pipeline-stall")
    page.goto(url)
    table = page.locator("#overview-devices")
    table.wait_for()
    report = _report("pipeline-stall")
    rows = table.locator("tbody tr")
    assert rows.count() == len(report["summary"]["devices"])
    for i, d in enumerate(report["summary"]["devices"]):
        cells = rows.nth(i).locator("td")
        assert cells.nth(0).inner_text() == d["ranks"] and cells.nth(1).inner_text() == str(d["device"])
        assert [float(cells.nth(c).get_attribute("data-value")) for c in (2, 3, 4, 5, 6)] == [
            d["kernels"], d["kernel_ns"], d["busy_ns"], d["span_ns"], d["busy_pct"]]  # fmt: skip
        assert cells.nth(6).inner_text() == fmt.percent(d["busy_pct"])
    assert "NCCL_NVTX_DISABLE" in page.locator("#overview-limitations").inner_text()
    groups = page.locator("#overview-groups tbody tr")
    assert groups.count() == len(report["groups"])
    assert groups.first.locator("td.impact").inner_text() == fmt.duration(report["groups"][0]["impact_ns"])
    assert page.locator("#overview-legend").inner_text().count("finding") >= 3


def test_markers_are_clustered_per_group_and_row_with_counts(browser, served):
    page, url = _page(browser, served, "overlap-slowdown")
    page.goto(url)
    page.locator(f"{GRAPH} .main-svg").first.wait_for()
    markers = page.evaluate(f"document.querySelector('{GRAPH}').data.filter(t => t.name === 'findings')"
                            ".map(t => ({text: t.text, x: t.x}))")  # fmt: skip
    report = _report("overlap-slowdown")
    n = len(report["findings"])  # six slowdowns, and the launch gaps of five steps
    assert n == 11 and len(markers) == 1
    texts = markers[0]["text"]
    counts = [int(t[1:]) if t else 1 for t in texts]
    assert sum(counts) == n and len(texts) < n and any(t.startswith("×") for t in texts)
    drawn = page.locator(f"{GRAPH} g.annotation").all_text_contents()  # drawn above the WebGL bars
    marked = [t for t in drawn if t.startswith("▼")]  # the others name the bars wide enough to hold one
    assert sorted(marked) == sorted(f"▼{t}" for t in texts) and all(len(t) <= 12 for t in drawn if t not in marked)
    lo, hi = page.evaluate(f"document.querySelector('{GRAPH}').layout.xaxis.range")
    assert all(lo < x < hi for x in markers[0]["x"])
    # a click on a marker selects its finding here (the URL says which), with its evidence listed
    page.locator(f"{GRAPH} g.annotation", has_text="▼").first.click()
    page.locator(".evidence-header").wait_for(timeout=10_000)
    page.wait_for_url("**finding=*", timeout=10_000)
    assert "ampere_sgemm_128x64_tn" in page.locator(".overview-evidence").inner_text()


def test_an_ordering_stall_highlights_both_ranks_and_its_times_zoom(browser, served):
    page, url = _page(browser, served, "pipeline-stall")
    page.goto(url)
    stall = page.locator("#overview-groups tr", has_text="nccl_ordering_stall")
    stall.locator("a", has_text="show").click()  # selects the finding: ?finding=..
    page.locator(".evidence-header").wait_for()
    assert "finding=" in page.url
    header = page.locator(".evidence-header").inner_text()
    assert "ncclDevKernel_SendRecv ×2 on rank 2 · GPU 2 · NCCL" in header and "rank 3 · GPU 3 · NCCL" in header
    page.locator(f"{GRAPH} .main-svg").first.wait_for()
    rows = page.evaluate(f"document.querySelector('{GRAPH}').data.filter(t => t.name === 'evidence')"
                         ".flatMap(t => t.y).filter(y => y)")  # fmt: skip
    assert set(rows) == {"rank 2 · GPU 2 · NCCL", "rank 3 · GPU 3 · NCCL"}
    evidence = page.locator(".overview-evidence").inner_text()
    assert "ms since first activity" in evidence and "10035000" not in evidence and "4.86 ms" in evidence
    before = page.evaluate(f"document.querySelector('{GRAPH}').layout.xaxis.range")
    page.locator("button.evidence-time").first.click()  # zooms there, and the URL follows
    page.wait_for_url("**t0=*", timeout=10_000)
    after = page.evaluate(f"document.querySelector('{GRAPH}').layout.xaxis.range")
    assert after != before


def test_the_zoom_window_round_trips_through_the_url(browser, served):
    page, url = _page(browser, served, "pipeline-stall")
    page.goto(url)
    page.locator(f"{GRAPH} .main-svg").first.wait_for()
    for _ in range(10):  # as a drag would; the graph may not be listening yet
        page.evaluate(f"Plotly.relayout(document.querySelector('{GRAPH}'), {{'xaxis.range': [3, 5]}})")
        try:
            page.wait_for_url("**t0=3&t1=5*", timeout=3_000)
            break
        except Exception:
            continue
    assert page.url.endswith("?t0=3&t1=5")
    labels = page.evaluate(f"document.querySelector('{GRAPH}')._fullLayout.yaxis._categories")
    shared = browser.new_context().new_page()
    shared.goto(page.url)  # a shared link reopens at that window, every row kept
    shared.locator(f"{GRAPH} .main-svg").first.wait_for()
    assert shared.evaluate(f"document.querySelector('{GRAPH}').layout.xaxis.range") == [3, 5]
    assert shared.evaluate(f"document.querySelector('{GRAPH}')._fullLayout.yaxis._categories") == labels
    ticks = shared.locator(f"{GRAPH} .ytick").count()
    assert ticks == len(labels) == 12  # 4 ranks x (NCCL, NVTX, CUDA API): rank 0's NCCL row is idle in 3-5 ms and kept


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_after_a_restart_the_page_says_it_is_building_the_timeline_then_draws_it(browser, store, tmp_path):
    from benchmarks.ingest import build

    traces = tmp_path / "traces"
    traces.mkdir()
    build(traces / "big.sqlite", 24_000)
    db = _database(store, tmp_path)
    with ServeProcess(traces, db, tmp_path) as first:
        page, url = _page(browser, first, "big")
    path = url.removeprefix(first.url)
    with ServeProcess(traces, db, tmp_path) as again:  # a new process: no timeline in memory
        page = browser.new_context().new_page()
        bodies: list[str] = []
        page.on("response", lambda r: bodies.append(r.text()) if "_dash-update-component" in r.url else None)
        page.goto(again.url + path)
        page.locator("h1").wait_for()
        page.locator(f"{GRAPH} .main-svg").first.wait_for(timeout=60_000)
        assert any("Building the timeline" in b for b in bodies)  # the page said so before drawing it
        assert page.locator("#overview-loading").count() == 0  # and then the timeline replaced it
