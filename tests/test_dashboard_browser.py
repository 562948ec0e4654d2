"""The dashboard driven for real: ``nsysan serve`` in its own process, Debian's Chromium driven by
Playwright. Skips on a machine without them; CI (tests/run.sh installs both) fails instead."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.samples import SAMPLES_DIR
from tests.conftest import need
from tools.browser import ServeProcess


def serve(tmp: Path, db: str, *, samples: tuple[str, ...] = ("pipeline-stall", "pipeline-stall-fixed"),
          **options: object) -> ServeProcess:  # fmt: skip
    """``nsysan serve`` on copies of ``samples`` (plus whatever the test put in ``tmp/traces``)."""
    traces = tmp / "traces"
    traces.mkdir(exist_ok=True)
    for name in samples:
        shutil.copy(SAMPLES_DIR / f"{name}.sqlite", traces)
    return ServeProcess(traces, db, tmp, **options)  # type: ignore[arg-type]


def _database(kind: str, tmp: Path) -> str:
    if kind == "sqlite":
        return str(tmp / "review.sqlite")
    url = os.environ.get("NSYSAN_TEST_PG_URL")
    need(bool(url), "a PostgreSQL server (NSYSAN_TEST_PG_URL, set by tests/run.sh)")
    from nsysan.store import ReviewStore
    from nsysan.store.models import Base

    Base.metadata.drop_all(ReviewStore(url).engine)  # a clean store for this server
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def served(request, tmp_path) -> Iterator[ServeProcess]:
    with serve(tmp_path, _database(request.param, tmp_path)) as s:
        yield s


def _ready(page, name: str) -> None:
    """Wait until the library lists ``name`` with its analysis done."""
    row = page.locator("table.library tr", has=page.get_by_role("link", name=name, exact=True))
    row.locator("td.status", has_text="ready").wait_for(timeout=60_000)


def test_review_a_finding_and_see_it_persist(browser, served, tmp_path):
    page = browser.new_page()
    page.goto(served.url)
    _ready(page, "pipeline-stall")
    _ready(page, "pipeline-stall-fixed")

    # register one more by upload: the same export under another name, analysed in the background
    upload = tmp_path / "upload" / "stall-upload.sqlite"
    upload.parent.mkdir()
    shutil.copy(SAMPLES_DIR / "pipeline-stall.sqlite", upload)
    page.set_input_files("#upload input[type=file]", str(upload))
    page.get_by_text("Uploaded as trace 3; analysing.").wait_for()
    _ready(page, "stall-upload")
    row = page.locator("tr[data-trace='3']")
    # critical: rank 2's launch gaps (2.15 ms of the job) and the exposed transfers, each group's members
    assert row.locator("td.count.critical").inner_text() == "7" and "0, 1, 2, 3" in row.inner_text()

    # open it: a timeline with a finding marker, then its findings table
    page.get_by_role("link", name="stall-upload", exact=True).click()
    page.locator("#timeline .main-svg").first.wait_for()
    assert page.locator("#timeline .scatterlayer .point").count() == 8  # the findings' markers, one each
    page.get_by_role("link", name="findings table").click()
    cell = page.locator("#findings-table").get_by_text("nccl_ordering_stall")
    cell.wait_for()
    page.locator("#findings-table a", has_text="waited").click()

    # the finding: zoomed timeline with its evidence, advice, then review it
    page.locator("#finding-timeline .main-svg").first.wait_for()
    assert "NCCL runs a stream's (and a communicator's) operations in order" in page.locator(".advice").inner_text()
    evidence = page.locator(".evidence-table").inner_text()
    assert "late_rank\t3" in evidence and "ms since first activity" in evidence
    page.click("#finding-status")
    page.get_by_role("option", name="confirmed").click()
    page.fill("#finding-assignee", "dana")
    page.click("#finding-save")
    page.locator(".saved").wait_for()
    page.fill("#author", "sam")
    page.keyboard.press("Tab")
    page.fill("#comment-text", "Rank 3 starts its sends late; moving them to their own group.")
    page.click("#comment-add")
    page.locator("li.comment").wait_for()

    page.reload()
    page.locator("#finding-status-value").wait_for()
    assert page.locator("#finding-status-value").inner_text() == "confirmed"
    assert page.input_value("#finding-assignee") == "dana"
    assert "sam" in page.locator("li.comment").inner_text() and "own group" in page.locator("li.comment").inner_text()

    # the findings table shows the new status, and filters by it
    page.goto(f"{served.url}/traces/3/findings")
    page.locator("#findings-table").get_by_text("confirmed").wait_for()
    page.click("#filter-status")
    page.get_by_role("option", name="open").click()
    page.locator("#findings-table").get_by_text("nccl_ordering_stall").wait_for(state="detached")


def test_a_group_is_triaged_in_one_action(browser, served):
    """Status and assignee set on all four occurrences of the sample's exposed-communication group
    at once, each recorded in its own thread (issue 31 item 5)."""
    page = browser.new_page()
    page.goto(served.url)
    _ready(page, "pipeline-stall")
    page.get_by_role("link", name="pipeline-stall", exact=True).click()
    page.get_by_role("link", name="findings table").click()
    trace_id = int(page.url.split("/traces/")[1].split("/")[0])
    table = page.locator("#findings-table")
    table.locator(".ag-cell", has_text="exposed_communication").first.wait_for()
    rows = table.locator(".ag-center-cols-container .ag-row").count()

    def severities() -> list[str]:
        return [
            table.locator(f'.ag-row[row-index="{i}"] .ag-cell[col-id="severity"]').inner_text() for i in range(rows)
        ]

    assert severities()[0] == "critical" and "info" in severities()  # worst first
    table.locator(".ag-header-cell", has_text="severity").click()  # ascending: by rank, not alphabetically
    table.locator('.ag-header-cell[col-id="severity"][aria-sort="ascending"]').wait_for()
    rank = {"info": 0, "warning": 1, "critical": 2}
    assert [rank[s] for s in severities()] == sorted(rank[s] for s in severities())
    for direction in ("ascending", "descending"):  # one headline has a rank (2), the others none: empty last
        table.locator(".ag-header-cell", has_text="rank").first.click()
        table.locator(f'.ag-header-cell[col-id="rank"][aria-sort="{direction}"]').wait_for()
        ranks = [table.locator(f'.ag-row[row-index="{i}"] .ag-cell[col-id="rank"]').inner_text() for i in range(rows)]
        assert ranks[0] == "2" and set(ranks[1:]) == {""}, direction
    table.locator(".ag-cell", has_text="exposed_communication").first.click()
    apply = page.locator("#group-apply")
    apply.wait_for()
    assert apply.inner_text() == "Set all 4 occurrences"
    page.click("#group-status")
    page.get_by_role("option", name="confirmed").click()
    page.fill("#group-assignee", "dana")
    apply.click()
    done = page.locator(".triaged")
    done.wait_for()
    assert done.inner_text() == "Set status confirmed and assigned to dana on 4 occurrences."
    page.wait_for_timeout(2_000)  # the grid re-sends its selection when the row changes: the answer stays
    assert done.inner_text() == "Set status confirmed and assigned to dana on 4 occurrences."
    assert page.locator("#occurrences-table .ag-cell", has_text="confirmed").count() == 4
    headline = page.locator("#findings-table .ag-row", has=page.locator(".ag-cell", has_text="exposed_communication"))
    assert "confirmed" in headline.inner_text() and "dana" in headline.inner_text()
    page.close()
    with urllib.request.urlopen(f"{served.url}/traces/{trace_id}/review.json") as answer:
        review = json.load(answer)
    group = [f for f in review["findings"] if f["group"] == "exposed_communication"]
    assert [(f["status"], f["assignee"]) for f in group] == [("confirmed", "dana")] * 4
    assert all(sorted(e["field"] for e in f["thread"] if e["kind"] == "event") == ["assignee", "status"] for f in group)


def test_a_stale_edit_is_refused_with_a_clear_message(browser, served):
    first, second = browser.new_page(), browser.new_page()
    first.goto(served.url)
    _ready(first, "pipeline-stall")
    for page in (first, second):
        page.goto(f"{served.url}/findings/1")
        page.locator("#finding-assignee").wait_for()
    # ben's edit is under way (so his page's live refresh keeps it) when ana saves hers
    second.fill("#finding-assignee", "ben")
    first.fill("#finding-assignee", "ana")
    first.click("#finding-save")
    first.locator(".saved").wait_for()
    second.click("#finding-save")
    second.locator(".stale").wait_for()
    assert "changed by someone else" in second.locator(".stale").inner_text()
    assert "reload it" in second.locator(".stale").inner_text()
    second.reload()
    second.locator("#finding-assignee").wait_for()
    assert second.input_value("#finding-assignee") == "ana"  # ana's edit was not lost


def test_compare_before_and_after_a_fix(browser, served):
    page = browser.new_page()
    page.goto(served.url)
    _ready(page, "pipeline-stall")
    _ready(page, "pipeline-stall-fixed")
    ids = {name: page.locator("tr", has=page.get_by_role("link", name=name, exact=True)).get_attribute("data-trace")
           for name in ("pipeline-stall", "pipeline-stall-fixed")}  # fmt: skip
    page.goto(f"{served.url}/compare?before={ids['pipeline-stall']}&after={ids['pipeline-stall-fixed']}")
    page.locator("#step-change").wait_for()
    assert page.locator("#step-change").inner_text() == "8.79 ms → 3.94 ms (-55.2%)"
    assert page.locator(".column.fixed h2").inner_text() == "Fixed (1)"
    assert "waited 4996 us" in page.locator(".column.fixed").inner_text()
    assert page.locator(".column.new h2").inner_text() == "New (1)"  # the receive behind the send on one stream
    assert "of another communicator" in page.locator(".column.new").inner_text()
    # the launch gaps and the exposed transfers are found in both, at the same impact
    assert page.locator(".column.unchanged h2").inner_text() == "In both (2)"
    assert "0 better, 0 worse, 2 about the same" in page.locator(".column.unchanged").inner_text()


def test_an_upload_that_is_not_an_export_is_refused(browser, served, tmp_path):
    page = browser.new_page()
    page.goto(served.url)
    _ready(page, "pipeline-stall")
    fake = tmp_path / "fake.sqlite"
    fake.write_text("not a database at all")
    page.set_input_files("#upload input[type=file]", str(fake))
    page.get_by_text("Upload refused: fake.sqlite: not an SQLite file").wait_for()
    assert page.locator("table.library tbody tr").count() == 2
    assert not any((tmp_path / "uploads").iterdir())


def test_login_is_required_beyond_loopback(browser, tmp_path):
    from dashboards.auth import hash_password

    s = serve(tmp_path, str(tmp_path / "review.sqlite"), host="0.0.0.0",
               env={"NSYSAN_USERS": f"alice={hash_password('wonderland-42')}"})  # fmt: skip
    try:
        request = urllib.request.Request(f"{s.url}/_dash-update-component", data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
        page = browser.new_page()
        page.goto(f"{s.url}/traces/1")
        assert page.url.startswith(f"{s.url}/login")
        page.fill("#username", "alice")
        page.fill("#password", "wrong")
        page.click("#login")
        page.get_by_text("Wrong user name or password.").wait_for()
        page.fill("#username", "alice")
        page.fill("#password", "wonderland-42")
        page.click("#login")
        page.wait_for_url(f"{s.url}/traces/1")
        page.get_by_text("alice ·").wait_for()
    finally:
        s.stop()


def test_a_big_trace_is_drawn_as_busy_share_and_zooming_in_shows_every_kernel(browser, tmp_path):
    from benchmarks.ingest import build

    (tmp_path / "traces").mkdir()
    build(tmp_path / "traces" / "big.sqlite", 24_000)  # 8 ranks, ~2,850 compute kernels per GPU row
    s = serve(tmp_path, str(tmp_path / "review.sqlite"), samples=())
    try:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(s.url)
        _ready(page, "big")
        page.get_by_role("link", name="big", exact=True).click()
        graph = "#timeline .js-plotly-plot"
        page.locator(f"{graph} g.hm").wait_for(state="attached")
        types = page.evaluate(f"document.querySelector('{graph}').data.map(t => t.type)")
        # compute rows as busy share; NCCL and NVTX (150 a row) drawn, each in two shades (every other
        # interval darker); the findings' markers
        assert types == ["heatmap", "scattergl", "scattergl", "scattergl", "scattergl", "scatter"]
        # zoom as a drag would; the server redraws the window (the graph may not be listening yet: retry)
        for _ in range(5):
            page.evaluate(f"Plotly.relayout(document.querySelector('{graph}'), {{'xaxis.range': [10, 10.4]}})")
            # polled with evaluate (DevTools), not wait_for_function: the page's CSP forbids eval
            for _ in range(50):
                if not page.evaluate(f"document.querySelector('{graph}').data.some(t => t.type === 'heatmap')"):
                    break
                page.wait_for_timeout(100)
            else:
                continue
            break
        types = page.evaluate(f"document.querySelector('{graph}').data.map(t => t.type)")
        assert "heatmap" not in types and "scattergl" in types
        hover = page.evaluate(f"document.querySelector('{graph}').data.flatMap(t => t.hovertext || []).join(' ')")
        assert "ampere_sgemm_128x64_tn" in hover  # each kernel with its name
        assert errors == []
    finally:
        s.stop()
