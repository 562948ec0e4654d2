"""The findings pages show findings the latest analysis did not find (kept by the store, docs/store.md)."""

from __future__ import annotations

from types import SimpleNamespace

from dashboards.analysis import NotReady
from dashboards.pages import finding as finding_page
from dashboards.pages import findings as findings_page
from fixtures.samples import sample_paths
from nsysan.analysis import analyse
from nsysan.ingest import load_trace
from nsysan.store import ReviewStore
from tests.test_store import _only


def _components(component) -> list:
    """Every component in a layout, depth first."""
    found = [component]
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        if child is not None and not isinstance(child, str | int | float):
            found += _components(child)
    return found


def _text(component) -> str:
    return " ".join(str(c.children) for c in _components(component) if isinstance(getattr(c, "children", None), str))


def test_a_finding_not_found_again_is_listed_last_greyed_and_says_so(tmp_path):
    store = ReviewStore(tmp_path / "review.sqlite")
    trace_id = store.register(sample_paths("overlap-slowdown"))
    with load_trace(store.start_analysis(trace_id).paths) as trace:
        doc = _only(analyse(trace), "comm_compute_slowdown")  # six episodes of one slowdown
    store.save_analysis(trace_id, doc)
    gone = store.findings(trace_id)[0]
    store.save_analysis(trace_id, doc | {"findings": [f for f in doc["findings"] if f["start_ns"] != gone["start_ns"]]})

    def no_timeline(_trace_id: int) -> None:
        raise NotReady("no timeline in this test")

    server = SimpleNamespace(store=store, timelines=SimpleNamespace(get=no_timeline))
    page = findings_page.layout(server, trace_id)
    (table,) = [c for c in _components(page) if getattr(c, "id", None) == findings_page.ids.FINDINGS_TABLE]
    latest = [r["latest"] for r in table.rowData]
    assert latest == [findings_page.FOUND, findings_page.MISSING]  # its own headline, last
    assert table.rowData[1]["worst_id"] == gone["id"] and table.rowData[0]["count"] == 5
    assert "1 finding of an earlier analysis was not found in the latest one" in _text(page)
    listing = findings_page.occurrences([store.finding(gone["id"])])
    assert findings_page.MISSING in _text(listing)
    assert "Not found in the latest analysis (since " in _text(finding_page.layout(server, gone["id"]))
    assert "Not found in the latest analysis" not in _text(finding_page.layout(server, table.rowData[0]["worst_id"]))
