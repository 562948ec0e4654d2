"""Two captures of one job, before and after a fix, through ``nsysan diff``'s comparison
(:func:`dashboards.comparison.compare_traces`): step time with its confidence, finding groups fixed, new and unchanged, and the same
tables the CLI prints (GPU time per rank, NCCL, copies, kernel deltas, capture differences)."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html

from dashboards import breakdown, ids
from dashboards.comparison import compare_traces
from dashboards.pages.common import cell, severity_badge, where
from dashboards.server import Server
from nsysan.diff.compare import CHANGE_FACTOR, CHANGE_MIN_NS, change_counts
from nsysan.diff.render import change, confidence, notes, sections
from nsysan.errors import InputError
from nsysan.report.format import duration

_FINDINGS_TABLE = "Findings:"  # shown as the three columns instead


def layout(server: Server, before: int | None = None, after: int | None = None) -> html.Div:
    options = [
        {"label": f"{t['id']}: {t['name']}", "value": t["id"]} for t in server.store.traces() if t["status"] == "ready"
    ]
    return html.Div([
        html.H1("Compare two captures"),
        html.P("Pick the capture from before a fix and the one from after it (the same comparison as `nsysan diff`).", className="hint"),
        html.Div(className="filters", children=[
            dcc.Dropdown(id=ids.COMPARE_BEFORE, options=options, value=before, placeholder="before", className="filter"),
            dcc.Dropdown(id=ids.COMPARE_AFTER, options=options, value=after, placeholder="after", className="filter"),
        ]),
        html.Div(_result(server, before, after), id=ids.COMPARE_RESULT),
    ])  # fmt: skip


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(ids.COMPARE_RESULT, "children"), Input(ids.COMPARE_BEFORE, "value"),
                  Input(ids.COMPARE_AFTER, "value"), prevent_initial_call=True)  # fmt: skip
    def _compare(before: int | None, after: int | None) -> Any:
        return _result(server, before, after)


def _result(server: Server, before: int | None, after: int | None) -> Any:
    if before is None or after is None:
        return html.P("Choose both captures.", className="hint")
    try:
        c = compare_traces(server.store, before, after)
        names = [server.store.trace(t)["name"] for t in (before, after)]
    except InputError as exc:
        return html.P(str(exc), className="error")
    doc = c.diff
    slowest = doc["steps"]["slowest"]
    if c.step_ns_before and c.step_ns_after:
        step = change(slowest)
    else:
        step = (
            f"{duration(c.step_ns_before)} → {duration(c.step_ns_after)} "
            "(needs NVTX step ranges or a repeating kernel sequence in both)"
        )
    return html.Div([
        html.P([html.B("Step time (slowest rank's median): "), html.Span(step, id="step-change"),
                html.Small(f" confidence {confidence(slowest['confidence'])}", className="hint")]),
        html.Ul([html.Li(line, className="error" if line.startswith("not comparable") else "hint") for line in notes(doc)]),
        *_breakdown_chart(doc),
        html.Div(className="columns compare", children=[
            _column(f"Fixed ({len(c.fixed)})", "fixed", c.fixed, f"in {names[0]}, gone from {names[1]}"),
            _column(f"New ({len(c.new)})", "new", c.new, f"in {names[1]} only"),
            _column(f"In both ({len(c.unchanged)})", "unchanged", c.unchanged,
                    f"matched by group and evidence (as found after): {change_counts(c.unchanged)} (better or worse: "
                    f"impact moved {CHANGE_FACTOR:g}x or more and by {CHANGE_MIN_NS // 1000} us or more)"),
        ]),
        *[_table(t) for t in sections(doc) if not t.title.startswith(_FINDINGS_TABLE)],
    ])  # fmt: skip


def _breakdown_chart(doc: dict[str, Any]) -> list[Any]:
    """Where step time went, before and after, as bars (the table below has the same figures)."""
    fig = breakdown.comparison_figure(doc["breakdown"])
    if fig is None:
        return []
    return [html.H2("Where step time went, before and after"),
            dcc.Graph(id=ids.COMPARE_BREAKDOWN, figure=fig, config={"displaylogo": False})]  # fmt: skip


def _impact(f: dict[str, Any]) -> str:
    if "impact_before_ns" in f:
        moved = {"better": "better: ", "worse": "worse: "}.get(f.get("change", "same"), "")
        return f"{moved}impact {duration(f['impact_before_ns'])} → {duration(f['impact_ns'])}"
    return f"impact {duration(f['impact_ns'])}"


def _column(title: str, key: str, findings: list[dict[str, Any]], explain: str) -> html.Div:
    items = [html.Li([severity_badge(f["severity"]), " ", dcc.Link(f["title"], href=f"/findings/{f['id']}"),
                      html.Small(f" ({f['kind']}, {where(f)}, {f['count']} occurrence{'s' if f['count'] != 1 else ''}, "
                                 f"{_impact(f)})")]) for f in findings]  # fmt: skip
    return html.Div(className=f"column {key}", children=[html.H2(title), html.P(explain, className="hint"),
                                                          html.Ul(items) if items else html.P("none", className="hint")])  # fmt: skip


def _table(t: Any) -> html.Div:
    if not t.rows:
        return html.Div([html.H3(t.title), html.P(t.empty, className="hint")], className="diff-table")
    return html.Div([html.H3(t.title), html.Table([html.Thead(html.Tr([html.Th(h) for h in t.headers])),
                                                   html.Tbody([html.Tr([cell(v) for v in row]) for row in t.rows])])],
                    className="diff-table")  # fmt: skip
