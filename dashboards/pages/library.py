"""The trace library: every registered trace, its analysis progress and its findings by severity,
and a search across every trace's findings (title, kind, group key, kernel and other evidence)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from typing import Any

import dash
from dash import ALL, Input, Output, State, ctx, dcc, html
from plotly.utils import PlotlyJSONEncoder

from dashboards import ids
from dashboards.library import delete_upload, scan_directory, upload_directory
from dashboards.pages.common import captured, review_status, severity_badge, status_counts, where
from dashboards.server import Server
from nsysan.report.format import duration
from nsysan.store import NotFound

UPLOAD_STATUS = "upload-status"  # written by assets/upload.js, never by a callback


def layout(server: Server) -> html.Div:
    limit_mib = server.max_upload_bytes / 2**20
    actions: list[Any] = [
        # Dash has no file input: assets/upload.js adds one to this label and posts what is chosen or dropped
        html.Div(id=ids.UPLOAD, className="upload", children=[
            html.Label("Drop nsys SQLite exports here or choose files: ", className="upload-choose"),
            html.Small(f"Files uploaded together are the ranks of one job; at most {limit_mib:.0f} MiB in all."),
            html.Div(id=UPLOAD_STATUS, role="status"),
        ]),
    ]  # fmt: skip
    # always in the layout (its callback names it), shown only when the server has a traces directory
    scan_label = f"Register new traces from {server.traces_dir.name}/" if server.traces_dir else ""
    actions.append(html.Button(scan_label, id=ids.SCAN, n_clicks=0, hidden=server.traces_dir is None))
    return html.Div([
        html.H1("Traces"),
        html.Div(actions, className="actions"),
        html.Div(id=ids.LIBRARY_MESSAGE),
        html.Label(["Sort by ", dcc.Dropdown(id=ids.LIBRARY_SORT, options=[{"label": label, "value": key}
                                                                           for key, (label, _) in SORTS.items()],
                                             value=DEFAULT_SORT, clearable=False, className="library-sort")]),
        html.Div(_table(server), id=ids.LIBRARY_TABLE),
        html.H2("Search findings"),
        dcc.Input(id=ids.SEARCH_ALL, type="search", placeholder="title, kind, group or kernel, in every trace",
                  debounce=0.4, maxLength=SEARCH_CHARS, className="search"),
        html.Div(id=ids.SEARCH_ALL_RESULTS),
        # always on: traces someone else registers, and their progress, show up without a reload
        dcc.Interval(id=ids.LIBRARY_POLL, interval=1000),
        dcc.Store(id=TABLE_DIGEST),
    ])  # fmt: skip


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(ids.LIBRARY_MESSAGE, "children"), Input(ids.SCAN, "n_clicks"), prevent_initial_call=True)  # fmt: skip
    def _scan(_n: int) -> Any:
        found = scan_directory(server)
        lines = [f"Registered {len(found.ids)} new trace(s)."] + [f"Skipped: {e}" for e in found.errors]
        return html.Div([html.P(line, className="error" if line.startswith("Skipped") else "ok") for line in lines])

    @app.callback(Output(ids.LIBRARY_TABLE, "children"), Output(TABLE_DIGEST, "data"),
                  Input(ids.LIBRARY_POLL, "n_intervals"), Input(ids.LIBRARY_SORT, "value"), State(TABLE_DIGEST, "data"),
                  State(ids.AUTHOR, "value"), prevent_initial_call=True)  # fmt: skip
    def _refresh(_n: int, sort: str | None, shown: str | None, typed: str | None) -> Any:
        # redrawn only when it changed: a redraw recreates the delete buttons, which calls _delete
        table = _table(server, typed, sort)
        digest = hashlib.sha256(json.dumps(table, cls=PlotlyJSONEncoder).encode()).hexdigest()
        return (dash.no_update, dash.no_update) if digest == shown else (table, digest)

    @app.callback(Output(ids.LIBRARY_MESSAGE, "children", allow_duplicate=True),
                  Output(ids.LIBRARY_TABLE, "children", allow_duplicate=True),
                  Input({"type": DELETE, "trace": ALL}, "submit_n_clicks"), State(ids.AUTHOR, "value"),
                  State(ids.LIBRARY_SORT, "value"), prevent_initial_call=True)  # fmt: skip
    def _delete(_clicks: list[int | None], typed: str | None, sort: str | None) -> Any:
        # the table is redrawn every second: fired for new buttons too, which nobody confirmed
        confirmed = [t for t in ctx.triggered if t["value"]]
        if not confirmed or not isinstance(ctx.triggered_id, dict):
            return dash.no_update, dash.no_update
        message = delete_trace(server, ctx.triggered_id.get("trace"), typed)
        return html.P(message, className="error" if message.startswith("Not deleted") else "ok"), _table(
            server, typed, sort
        )

    @app.callback(Output(ids.SEARCH_ALL_RESULTS, "children"), Input(ids.SEARCH_ALL, "value"), prevent_initial_call=True)
    def _search(text: str | None) -> Any:
        return search_results(server, text)


TABLE_DIGEST = "library-table-digest"  # of the table last drawn by the poll
DELETE = "delete-trace"  # the pattern of an uploaded trace's delete button: {"type": DELETE, "trace": id}


def delete_trace(server: Server, trace_id: object, typed: str | None = None) -> str:
    """Delete an uploaded trace: its files, then its findings and review from the store, recorded
    with who did it (``typed``: the name typed in the header, without login). Traces registered from
    --traces are not the server's to delete, nor one still being analysed; with login, only its
    uploader or an admin may."""
    if not isinstance(trace_id, int) or isinstance(trace_id, bool):
        return "Not deleted: no such trace."
    try:
        uploaded = upload_directory(server, trace_id) is not None
        owner = server.store.trace(trace_id)["owner"]
    except NotFound:
        return f"Not deleted: no trace {trace_id}."
    if not uploaded:
        return f"Not deleted: trace {trace_id} was not uploaded (its files are the traces directory's)."
    if not server.may_delete(owner):
        if owner is None:
            return (f"Not deleted: trace {trace_id} has no recorded uploader (uploaded before uploads had owners, or "
                    "without login); only an admin (nsysan serve --admins) may delete it.")  # fmt: skip
        return (f"Not deleted: trace {trace_id} was uploaded by {owner}; only they or an admin (nsysan serve "
                "--admins) may delete it.")  # fmt: skip
    if server.analysis.working(trace_id) or server.timelines.building(trace_id):
        return f"Not deleted: trace {trace_id} is still being analysed; delete it once it is done."
    delete_upload(server, trace_id)
    with contextlib.suppress(NotFound):  # deleted at the same moment by someone else
        server.store.delete_trace(trace_id, by=server.author(typed))
    server.timelines.forget(trace_id)  # SQLite may give this id to the next trace registered
    return f"Deleted trace {trace_id} with its findings and review."


SEARCH_CHARS = 200
SEARCH_LIMIT = 200  # groups listed at most
SEARCH_SCAN = 5000  # findings read at most, largest impact first (each group's worst ones)


def search_results(server: Server, text: str | None) -> Any:
    """The findings of every trace's latest analysis that hold ``text``, one line per group (per
    trace and group key: episodes of one problem), the group with the largest occurrence first;
    each line links its worst occurrence and its trace's findings, with how many there are."""
    text = (text or "").strip()[:SEARCH_CHARS]
    if not text:
        return None
    found = server.store.search_findings(text, limit=SEARCH_SCAN + 1)
    if not found:
        return html.P(f"No finding holds {text!r}.", className="hint")
    scanned = found[:SEARCH_SCAN]
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for f in scanned:  # largest impact first: each group's first is its worst
        groups.setdefault((f["trace_id"], f["group"] or f"#{f['id']}"), []).append(f)
    items = [_search_hit(members) for members in list(groups.values())[:SEARCH_LIMIT]]
    said = f"{len(scanned)}{'+' if len(found) > SEARCH_SCAN else ''} finding{'s' if len(scanned) != 1 else ''} " \
           f"in {len(groups)} group{'s' if len(groups) != 1 else ''}"  # fmt: skip
    shown = f", the first {SEARCH_LIMIT} listed" if len(groups) > SEARCH_LIMIT else ""
    return html.Div([html.P(f"{said}{shown}:", className="hint"), html.Ul(items)])


def _search_hit(members: list[dict[str, Any]]) -> html.Li:
    worst = members[0]
    assignees = sorted({m["assignee"] for m in members if m["assignee"]})
    many = (
        f" · {len(members)} occurrences, {duration(sum(m['impact_ns'] for m in members))} in all"
        if len(members) > 1
        else ""
    )
    review = review_status(m["status"] for m in members)
    return html.Li([severity_badge(worst["severity"]), " ", dcc.Link(worst["title"], href=f"/findings/{worst['id']}"),
                    f" · {worst['kind']} · {where(worst)}{many} · {review}{' · ' + ', '.join(assignees) if assignees else ''} · in ",
                    dcc.Link(worst["trace_name"], href=f"/traces/{worst['trace_id']}/findings")], className="search-hit")  # fmt: skip


Row = dict[str, Any]
# the library's orders: (label, key of a row and the reviewer's name); stable sorts from the id order
SORTS: dict[str, tuple[str, Callable[[Row, str | None], Any]]] = {
    "id": ("registered (oldest first)", lambda t, me: t["id"]),
    "newest": ("registered (newest first)", lambda t, me: -t["id"]),
    "name": ("job name", lambda t, me: t["name"].lower()),
    "captured": ("captured (newest first)", lambda t, me: -(t["captured_utc_ns"] or 0)),
    "critical": ("most critical findings", lambda t, me: (-t["findings"]["critical"], -t["findings"]["warning"])),
    "open": ("most open findings", lambda t, me: -t["review"]["open"]),
    "yours": ("most assigned to you", lambda t, me: -t["to_do"].get(me, 0)),
}
DEFAULT_SORT = "id"


def _table(server: Server, typed: str | None = None, sort: str | None = None) -> html.Div:
    """The library table, after the exports of the traces directory that were refused, and why.
    ``typed``: the reviewer's name typed in the header (without login), whose work "yours" counts;
    ``sort``: a key of :data:`SORTS`."""
    return html.Div([_refused(server), _traces(server, typed, sort), _deletions(server)])


def _deletions(server: Server) -> html.Details | None:
    """The latest deletes, who made them and what went with them: a deleted review is gone for good."""
    rows = server.store.deletions(10)
    if not rows:
        return None
    return html.Details(className="deletions", children=[
        html.Summary(f"Recently deleted ({len(rows)})"),
        html.Ul([html.Li(f"{d['name']} (trace {d['trace_id']}{', uploaded by ' + d['owner'] if d['owner'] else ''}): "
                         f"deleted by {d['deleted_by']} at {d['deleted_at'][:16].replace('T', ' ')} UTC with "
                         f"{d['findings']} findings and {d['remarks']} comments or notes") for d in rows]),
    ])  # fmt: skip


def _refused(server: Server) -> html.Div | None:
    if not server.refused or server.traces_dir is None:
        return None
    return html.Div(className="refused", children=[
        html.P(f"Not registered from {server.traces_dir.name}/ ({len(server.refused)}):", className="error"),
        html.Ul([html.Li(reason, className="error") for reason in server.refused]),
    ])  # fmt: skip


def _traces(server: Server, typed: str | None = None, sort: str | None = None) -> html.Table | html.P:
    rows = server.store.traces()
    if not rows:
        return html.P("No traces yet: upload an export, or start the server with --traces DIR.")
    author = server.author(typed)
    me = None if author == "anonymous" else author
    order = SORTS.get(sort or DEFAULT_SORT, SORTS[DEFAULT_SORT])[1]
    rows.sort(key=lambda t: order(t, me))
    header: list[Any] = ["id", "job", "status", "ranks", "GPUs", "captured", "critical", "warning", "info", "review",
              html.Span("yours", title=f"open or confirmed findings assigned to {me or 'you (type your name above)'}"),
              "", ""]  # fmt: skip
    return html.Table(className="library", children=[
        html.Thead(html.Tr([html.Th(h) for h in header])),
        html.Tbody([_row(server, t, me) for t in rows]),
    ])  # fmt: skip


def _row(server: Server, t: dict[str, Any], me: str | None = None) -> html.Tr:
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
        html.Td(status_counts(t["review"]) or "–" if ready else "", className="review"),
        html.Td(t["to_do"].get(me, 0) if ready and me else "", className="yours"),
        html.Td(dcc.Link("findings", href=f"/traces/{t['id']}/findings") if ready else ""),
        html.Td(_delete_button(server, t) if not working else ""),
    ])  # fmt: skip


def _delete_button(server: Server, t: dict[str, Any]) -> dcc.ConfirmDialogProvider | str:
    """A delete button, behind a confirmation, on uploaded traces the person may delete (with
    login: their own, or any for an admin); the uploader's name otherwise."""
    try:
        if upload_directory(server, t["id"]) is None:
            return ""
    except NotFound:  # deleted since the table was listed
        return ""
    if not server.may_delete(t["owner"]):
        return f"uploaded by {t['owner']}" if t["owner"] else "no recorded uploader: an admin may delete it"
    return dcc.ConfirmDialogProvider(
        html.Button("delete", className="delete"), id={"type": DELETE, "trace": t["id"]},
        message=f"Delete trace {t['id']} ({t['name']}): its files, findings, comments and review history? "
                "This cannot be undone.",
    )  # fmt: skip
