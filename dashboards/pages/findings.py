"""A trace's findings: filter by kind, severity, status and rank; sort by any column."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dash_table, dcc, html

from dashboards import ids
from dashboards.app import Server
from dashboards.pages.common import missing
from nsysan.detect import registered
from nsysan.store import FINDING_STATUSES, NotFound

FILTERS = {ids.FILTER_KIND: "kind", ids.FILTER_SEVERITY: "severity", ids.FILTER_STATUS: "status", ids.FILTER_RANK: "rank"}
COLUMNS = [
    {"id": "severity", "name": "severity"},
    {"id": "kind", "name": "kind"},
    {"id": "rank", "name": "rank", "type": "numeric"},
    {"id": "device", "name": "GPU", "type": "numeric"},
    {"id": "impact_ms", "name": "impact (ms)", "type": "numeric"},
    {"id": "status", "name": "status"},
    {"id": "assignee", "name": "assignee"},
    {"id": "title", "name": "finding", "presentation": "markdown"},
]


def layout(server: Server, trace_id: int) -> html.Div:
    try:
        t = server.store.trace(trace_id)
    except NotFound:
        return missing(f"No trace {trace_id}.")
    rows = server.store.findings(trace_id)
    options = {
        ids.FILTER_KIND: sorted(registered()),
        ids.FILTER_SEVERITY: ["critical", "warning", "info"],
        ids.FILTER_STATUS: list(FINDING_STATUSES),
        ids.FILTER_RANK: sorted({f["rank"] for f in rows if f["rank"] is not None}),
    }
    return html.Div([
        html.H1(["Findings · ", dcc.Link(t["name"], href=f"/traces/{trace_id}")]),
        dcc.Store(id=ids.TRACE_ID, data=trace_id),
        html.Div(className="filters", children=[
            dcc.Dropdown(id=key, options=options[key], placeholder=f"any {name}", clearable=True, className="filter")
            for key, name in FILTERS.items()
        ]),
        dash_table.DataTable(
            id=ids.FINDINGS_TABLE, columns=COLUMNS, data=_rows(rows), sort_action="native", sort_by=[],
            page_size=50, markdown_options={"link_target": "_self"}, style_cell={"textAlign": "left", "whiteSpace": "normal", "height": "auto", "fontFamily": "inherit"},
            style_table={"overflowX": "auto"},
            style_data_conditional=[{"if": {"filter_query": f'{{severity}} = "{s}"', "column_id": "severity"},
                                     "color": c, "fontWeight": "bold"}
                                    for s, c in (("critical", "#b00"), ("warning", "#a66b00"))],
        ),
    ])  # fmt: skip


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(ids.FINDINGS_TABLE, "data"), *(Input(key, "value") for key in FILTERS),
                  State(ids.TRACE_ID, "data"), prevent_initial_call=True)  # fmt: skip
    def _filter(kind: str | None, severity: str | None, status: str | None, rank: int | None, trace_id: int) -> Any:
        rows = server.store.findings(trace_id, kind=kind, severity=severity, rank=rank)
        return _rows([f for f in rows if status is None or f["status"] == status])


def _rows(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"severity": f["severity"], "kind": f["kind"], "rank": f["rank"], "device": f["device"],
             "impact_ms": round(f["impact_ns"] / 1e6, 3), "status": f["status"], "assignee": f["assignee"] or "",
             "title": f"[{_escape(f['title'])}](/findings/{f['id']})", "id": f["id"]}
            for f in findings]  # fmt: skip


def _escape(text: str) -> str:
    """Markdown-safe: a finding's title names kernels, which may hold brackets and underscores."""
    return "".join("\\" + c if c in "\\`*_{}[]()<>#+-.!|" else c for c in text)
