"""One trace: what it is, its timeline with a marker per finding, and the team's notes on it."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from dashboards import ids
from dashboards.pages.common import captured, missing, thread, zoomed_figure
from dashboards.server import Server
from nsysan.errors import InputError
from nsysan.report.format import duration
from nsysan.store import NotFound

BODY = "overview-body"


def layout(server: Server, trace_id: int) -> html.Div:
    try:
        t = server.store.trace(trace_id)
    except NotFound:
        return missing(f"No trace {trace_id}.")
    counts = ", ".join(f"{n} {s}" for s, n in t["findings"].items() if n) or "none"
    body, final = _body(server, t)
    return html.Div([
        html.H1(t["name"]),
        html.P([f"Ranks {', '.join(map(str, t['ranks'])) or '–'} · GPUs {', '.join(map(str, t['devices'])) or '–'} · "
                f"captured {captured(t['captured_utc_ns'])} · step time {duration(t['step_ns'])} · findings: {counts} · ",
                dcc.Link("findings table", href=f"/traces/{trace_id}/findings"), " · ",
                dcc.Link("compare with another capture", href=f"/compare?before={trace_id}")], className="meta"),
        dcc.Store(id=ids.TRACE_ID, data=trace_id),
        html.Div(body, id=BODY),
        dcc.Interval(id=ids.TRACE_POLL, interval=1000, disabled=final),
        html.H2("Notes"),
        html.Div(_notes(server, trace_id), id=ids.NOTES),
        dcc.Textarea(id=ids.NOTE_TEXT, placeholder="A note on this trace for the team", className="text"),
        html.Button("Add note", id=ids.NOTE_ADD, n_clicks=0),
    ])  # fmt: skip


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(BODY, "children"), Output(ids.TRACE_POLL, "disabled"),
                  Input(ids.TRACE_POLL, "n_intervals"), State(ids.TRACE_ID, "data"), prevent_initial_call=True)  # fmt: skip
    def _poll(_n: int, trace_id: int) -> Any:
        return _body(server, server.store.trace(trace_id))

    @app.callback(Output(ids.TIMELINE, "figure"), Input(ids.TIMELINE, "relayoutData"), State(ids.TRACE_ID, "data"),
                  prevent_initial_call=True)  # fmt: skip
    def _zoom(relayout: dict[str, Any] | None, trace_id: int) -> Any:
        return zoomed_figure(server, trace_id, relayout)

    @app.callback(Output(ids.URL, "pathname", allow_duplicate=True), Input(ids.TIMELINE, "clickData"),
                  prevent_initial_call=True)  # fmt: skip
    def _open_finding(click: dict[str, Any] | None) -> Any:
        point = (click or {}).get("points", [{}])[0]
        finding_id = point.get("customdata")
        return f"/findings/{int(finding_id)}" if isinstance(finding_id, int) else dash.no_update

    @app.callback(Output(ids.NOTES, "children"), Output(ids.NOTE_TEXT, "value"), Input(ids.NOTE_ADD, "n_clicks"),
                  State(ids.NOTE_TEXT, "value"), State(ids.TRACE_ID, "data"), State(ids.AUTHOR, "value"),
                  prevent_initial_call=True)  # fmt: skip
    def _add_note(_n: int, text: str | None, trace_id: int, author: str | None) -> Any:
        text = (text or "").strip()
        if not text:
            return dash.no_update, dash.no_update
        server.store.note(trace_id, server.author(author), text)
        return _notes(server, trace_id), ""


def _body(server: Server, t: dict[str, Any]) -> tuple[Any, bool]:
    """What the page shows under its header, and whether that is final (nothing left to poll for)."""
    trace_id = t["id"]
    if t["status"] == "failed":
        return html.P(f"Analysis failed: {t['error']}", className="error"), True
    working = server.analysis.working(trace_id)
    if t["status"] != "ready" or working:
        return html.P(f"Analysing: {working.describe() if working else t['status']}…", className="status"), False
    try:
        data = server.timelines.get(trace_id)
    except InputError as exc:
        return html.P(f"No timeline: {exc}", className="error"), True
    figure = data.figure(None, server.store.findings(trace_id))
    return [
        html.P(f"{data.intervals:,} kernels, copies and NVTX ranges in {len(data.rows)} rows. Zoom in to see every "
               "one; zoomed out, a row that would show more than 2,000 is drawn as its busy share. Click a ▼ to "
               "open its finding.", className="hint"),
        dcc.Graph(id=ids.TIMELINE, figure=figure, config={"displaylogo": False, "scrollZoom": True}),
    ], True  # fmt: skip


def _notes(server: Server, trace_id: int) -> Any:
    return thread(server.store.notes(trace_id), "note", "No notes yet.")
