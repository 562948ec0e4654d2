"""The dashboard says what each fix would recover, as the report does, and keeps the timeline near
the top when a trace has dozens of problems (issue 31 item 7, issue 29 item 8)."""

from __future__ import annotations

from types import SimpleNamespace

from dashboards.analysis import NotReady
from dashboards.pages import finding as finding_page
from dashboards.pages import findings as findings_page
from dashboards.pages import overview
from fixtures.samples import sample_paths
from nsysan.analysis import analyse
from nsysan.ingest import load_trace
from nsysan.report import format as fmt
from nsysan.store import ReviewStore
from tests.test_store_findings_page import _components, _text


def _finding(i: int, severity: str, group: str, impact_ns: int, recoverable_ns: int | None) -> dict:
    return {"id": i, "kind": f"kind_{group}", "group": group, "severity": severity, "impact_ns": impact_ns,
            "recoverable_ns": recoverable_ns, "title": f"problem {group} #{i}", "rank": i % 4}  # fmt: skip


def _rows(component, table_id: str) -> list:
    (table,) = [c for c in _components(component) if getattr(c, "id", None) == table_id]
    (body,) = [c for c in _components(table) if type(c).__name__ == "Tbody"]
    return body.children


def test_info_groups_past_the_first_three_fold_below_and_recoverable_time_is_shown():
    findings = [_finding(0, "critical", "a", 5_000_000, 3_000_000), _finding(1, "critical", "a", 1_000_000, 1_000_000),
                _finding(2, "warning", "b", 9_000_000, 2_000_000)]  # fmt: skip
    findings += [_finding(10 + i, "info", f"i{i}", 100_000 * (i + 1), 10_000 * (i + 1)) for i in range(8)]
    part = overview._groups(7, findings, {"exports": [{"kernels": 10}]})
    shown = _rows(part, overview.GROUPS_TABLE)
    folded = _rows(part, overview.MORE_GROUPS_TABLE)
    groups = [r.to_plotly_json()["props"]["data-group"] for r in shown]
    # every critical and warning, then the three info groups that recover the most
    assert groups == ["a", "b", "i7", "i6", "i5"]
    assert [r.to_plotly_json()["props"]["data-group"] for r in folded] == ["i4", "i3", "i2", "i1", "i0"]
    recoverable = [c for c in _components(shown[0]) if getattr(c, "className", None) == "recoverable"]
    assert (
        recoverable[0].children == fmt.duration(4_000_000)
        and recoverable[0].to_plotly_json()["props"]["data-value"] == "4000000"
    )
    (details,) = [c for c in _components(part) if getattr(c, "id", None) == overview.MORE_GROUPS]
    assert not getattr(details, "open", False)  # closed until asked for
    assert "5 more info problem(s)" in _text(details)


def test_no_fold_with_three_info_groups_and_a_dash_for_analyses_before_recoverable_time():
    findings = [_finding(i, "info", f"g{i}", 1_000 * (i + 1), None) for i in range(3)]
    part = overview._groups(1, findings, {"exports": [{"kernels": 10}]})
    assert len(_rows(part, overview.GROUPS_TABLE)) == 3
    assert not [c for c in _components(part) if getattr(c, "id", None) == overview.MORE_GROUPS]
    cells = [c for c in _components(part) if getattr(c, "className", None) == "recoverable"]
    assert [c.children for c in cells] == ["-", "-", "-"]


def test_the_findings_pages_show_each_fix_s_recoverable_time(tmp_path):
    store = ReviewStore(tmp_path / "review.sqlite")
    trace_id = store.register(sample_paths("pipeline-stall"))
    with load_trace(store.start_analysis(trace_id).paths) as trace:
        doc = analyse(trace)
    store.save_analysis(trace_id, doc)

    def no_timeline(_trace_id: int) -> None:
        raise NotReady("no timeline in this test")

    server = SimpleNamespace(store=store, timelines=SimpleNamespace(get=no_timeline))
    page = findings_page.layout(server, trace_id)
    (table,) = [c for c in _components(page) if getattr(c, "id", None) == findings_page.ids.FINDINGS_TABLE]
    stored = store.findings(trace_id)
    by_id = {f["id"]: f for f in stored}
    for row in table.rowData:
        group = by_id[row["worst_id"]]["group"]
        members = [f for f in stored if f["group"] == group] if group else [by_id[row["worst_id"]]]
        assert row["recoverable_ms"] == round(sum(f["recoverable_ns"] for f in members) / 1e6, 3), row
    assert any(r["recoverable_ms"] > 0 for r in table.rowData)
    listing = findings_page.occurrences(stored[:2])
    (grid,) = [c for c in _components(listing) if type(c).__name__ == "AgGrid"]
    assert [r["recoverable_ms"] for r in grid.rowData] == [
        round(f["recoverable_ns"] / 1e6, 3) for f in sorted(stored[:2], key=lambda f: (-f["impact_ns"], f["id"]))
    ]
    best = max(stored, key=lambda f: f["recoverable_ns"])
    assert f"recoverable {fmt.duration(best['recoverable_ns'])}" in _text(finding_page.layout(server, best["id"]))
