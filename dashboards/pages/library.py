"""The trace library: every registered trace, its analysis progress and its findings by severity,
and a search across every trace's findings (title, kind, group key, kernel and other evidence)."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from dashboards import ids
from dashboards.library import UploadRefused, save_upload, scan_directory
from dashboards.pages.common import captured, severity_badge, where
from dashboards.server import Server


def layout(server: Server) -> html.Div:
    limit_mib = server.max_upload_bytes / 2**20
    actions: list[Any] = [
        dcc.Upload(  # no max_size: the browser would drop a big file silently; the server says why instead
            id=ids.UPLOAD, multiple=True, className="upload",
            children=html.Div(["Drop nsys SQLite exports here or ", html.A("choose files"),
                               html.Br(), html.Small(f"Files uploaded together are the ranks of one job; "
                                                     f"at most {limit_mib:.0f} MiB in all.")]),
        ),
    ]  # fmt: skip
    # always in the layout (its callback names it), shown only when the server has a traces directory
    scan_label = f"Register new traces from {server.traces_dir.name}/" if server.traces_dir else ""
    actions.append(html.Button(scan_label, id=ids.SCAN, n_clicks=0, hidden=server.traces_dir is None))
    return html.Div([
        html.H1("Traces"),
        html.Div(actions, className="actions"),
        html.Div(id=ids.LIBRARY_MESSAGE),
        html.Div(_table(server), id=ids.LIBRARY_TABLE),
        html.H2("Search findings"),
        dcc.Input(id=ids.SEARCH_ALL, type="search", placeholder="title, kind, group or kernel, in every trace",
                  debounce=0.4, maxLength=SEARCH_CHARS, className="search"),
        html.Div(id=ids.SEARCH_ALL_RESULTS),
        # always on: traces someone else registers, and their progress, show up without a reload
        dcc.Interval(id=ids.LIBRARY_POLL, interval=1000),
    ])  # fmt: skip


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(ids.LIBRARY_MESSAGE, "children"), Output(ids.UPLOAD, "contents"),
                  Input(ids.UPLOAD, "contents"), State(ids.UPLOAD, "filename"), prevent_initial_call=True)  # fmt: skip
    def _upload(contents: list[str] | None, filenames: list[str] | None) -> Any:
        # the contents are cleared once stored: the browser would otherwise send them again with every call
        if not contents:
            return dash.no_update, dash.no_update
        try:
            trace_id = save_upload(server, contents, filenames or [])
        except UploadRefused as exc:
            return html.P(f"Upload refused: {exc}", className="error"), None
        return html.P(f"Uploaded as trace {trace_id}; analysing.", className="ok"), None

    @app.callback(Output(ids.LIBRARY_MESSAGE, "children", allow_duplicate=True), Input(ids.SCAN, "n_clicks"),
                  prevent_initial_call=True)  # fmt: skip
    def _scan(_n: int) -> Any:
        found = scan_directory(server)
        lines = [f"Registered {len(found.ids)} new trace(s)."] + [f"Skipped: {e}" for e in found.errors]
        return html.Div([html.P(line, className="error" if line.startswith("Skipped") else "ok") for line in lines])

    @app.callback(
        Output(ids.LIBRARY_TABLE, "children"), Input(ids.LIBRARY_POLL, "n_intervals"), prevent_initial_call=True
    )
    def _refresh(_n: int) -> Any:
        return _table(server)

    @app.callback(Output(ids.SEARCH_ALL_RESULTS, "children"), Input(ids.SEARCH_ALL, "value"), prevent_initial_call=True)
    def _search(text: str | None) -> Any:
        return search_results(server, text)


SEARCH_CHARS = 200
SEARCH_LIMIT = 200  # findings listed at most


def search_results(server: Server, text: str | None) -> Any:
    """The findings of every trace's latest analysis that hold ``text``, largest impact first, each
    linked to its page and its trace."""
    text = (text or "").strip()[:SEARCH_CHARS]
    if not text:
        return None
    found = server.store.search_findings(text, limit=SEARCH_LIMIT + 1)
    if not found:
        return html.P(f"No finding holds {text!r}.", className="hint")
    more = len(found) > SEARCH_LIMIT
    items = [html.Li([severity_badge(f["severity"]), " ", dcc.Link(f["title"], href=f"/findings/{f['id']}"),
                      f" · {f['kind']} · {where(f)} · {f['status']}{' · ' + f['assignee'] if f['assignee'] else ''} · in ",
                      dcc.Link(f["trace_name"], href=f"/traces/{f['trace_id']}/findings")], className="search-hit")
             for f in found[:SEARCH_LIMIT]]  # fmt: skip
    count = f"first {SEARCH_LIMIT}" if more else str(len(found))
    return html.Div([html.P(f"{count} finding{'s' if len(found) != 1 else ''}:", className="hint"), html.Ul(items)])


def _table(server: Server) -> html.Div:
    """The library table, after the exports of the traces directory that were refused, and why."""
    return html.Div([_refused(server), _traces(server)])


def _refused(server: Server) -> html.Div | None:
    if not server.refused or server.traces_dir is None:
        return None
    return html.Div(className="refused", children=[
        html.P(f"Not registered from {server.traces_dir.name}/ ({len(server.refused)}):", className="error"),
        html.Ul([html.Li(reason, className="error") for reason in server.refused]),
    ])  # fmt: skip


def _traces(server: Server) -> html.Table | html.P:
    rows = server.store.traces()
    if not rows:
        return html.P("No traces yet: upload an export, or start the server with --traces DIR.")
    header = ["id", "job", "status", "ranks", "GPUs", "captured", "critical", "warning", "info", ""]
    return html.Table(className="library", children=[
        html.Thead(html.Tr([html.Th(h) for h in header])),
        html.Tbody([_row(server, t) for t in rows]),
    ])  # fmt: skip


def _row(server: Server, t: dict[str, Any]) -> html.Tr:
    working = server.analysis.working(t["id"])
    status = working.describe() if working else t["status"]  # queued, analysing, or preparing the timeline
    ready = status == "ready"
    status_cell = html.Td(
        [status, html.Div(t["error"], className="error")] if t["error"] else status, className="status"
    )
    counts = [
        html.Td(
            t["findings"][s] if ready else "", className=f"count {s}{' some' if ready and t['findings'][s] else ''}"
        )
        for s in ("critical", "warning", "info")
    ]
    row_data: dict[str, Any] = {"data-trace": str(t["id"])}  # the browser tests find a trace's row by it
    return html.Tr(**row_data, children=[
        html.Td(t["id"]),
        html.Td(dcc.Link(t["name"], href=f"/traces/{t['id']}")),
        status_cell,
        html.Td(", ".join(map(str, t["ranks"])) or "–"),
        html.Td(", ".join(map(str, t["devices"])) or "–"),
        html.Td(captured(t["captured_utc_ns"])),
        *counts,
        html.Td(dcc.Link("findings", href=f"/traces/{t['id']}/findings") if ready else ""),
    ])  # fmt: skip
