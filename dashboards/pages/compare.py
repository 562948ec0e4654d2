"""Two captures of one job, before and after a fix: which findings went, which came, which stayed,
and how the step time (NVTX ranges named ``step…``) changed."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html

from dashboards import ids
from dashboards.app import Server
from dashboards.pages.common import duration, severity_badge, where
from nsysan.store import NotFound


def layout(server: Server, before: int | None = None, after: int | None = None) -> html.Div:
    options = [{"label": f"{t['id']}: {t['name']}", "value": t["id"]} for t in server.store.traces() if t["status"] == "ready"]
    return html.Div([
        html.H1("Compare two captures"),
        html.P("Pick the capture from before a fix and the one from after it.", className="hint"),
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
        c = server.store.compare(before, after)
        names = [server.store.trace(t)["name"] for t in (before, after)]
    except NotFound as exc:
        return html.P(str(exc), className="error")
    if c.step_ns_before and c.step_ns_after:
        change = (c.step_ns_after - c.step_ns_before) / c.step_ns_before
        step = f"{duration(c.step_ns_before)} → {duration(c.step_ns_after)} ({change:+.1%})"
    else:
        step = f"{duration(c.step_ns_before)} → {duration(c.step_ns_after)} (needs NVTX ranges named step… in both)"
    return html.Div([
        html.P([html.B("Step time: "), html.Span(step, id="step-change")]),
        html.Div(className="columns compare", children=[
            _column(f"Fixed ({len(c.fixed)})", "fixed", c.fixed, f"in {names[0]}, gone from {names[1]}"),
            _column(f"New ({len(c.new)})", "new", c.new, f"in {names[1]} only"),
            _column(f"Unchanged ({len(c.unchanged)})", "unchanged", c.unchanged, "in both (as found after)"),
        ]),
    ])  # fmt: skip


def _column(title: str, key: str, findings: list[dict[str, Any]], explain: str) -> html.Div:
    items = [html.Li([severity_badge(f["severity"]), " ", dcc.Link(f["title"], href=f"/findings/{f['id']}"),
                      html.Small(f" ({f['kind']}, {where(f)}, impact {duration(f['impact_ns'])})")]) for f in findings]  # fmt: skip
    return html.Div(className=f"column {key}", children=[html.H2(title), html.P(explain, className="hint"),
                                                          html.Ul(items) if items else html.P("none", className="hint")])  # fmt: skip
