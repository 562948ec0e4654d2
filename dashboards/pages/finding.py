"""One finding: the timeline zoomed to its window with its evidence outlined, the advice, and its
review (status, assignee, comments). A finding the trace's latest analysis did not find says so
(the store keeps it, with its review, and shows what the analysis that last found it said).

Saving names the version the page was loaded with; if someone saved in between, the store refuses
and the page says so instead of overwriting their change.
"""

from __future__ import annotations

import json
from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from dashboards import ids
from dashboards.pages.common import missing, severity_badge, thread, where, zoomed_figure
from dashboards.server import Server
from nsysan.errors import InputError
from nsysan.report.format import duration, share_of_run
from nsysan.store import FINDING_STATUSES, NotFound, StaleEdit


def layout(server: Server, finding_id: int) -> html.Div:
    try:
        f = server.store.finding(finding_id)
    except NotFound:
        return missing(f"No finding {finding_id}.")
    trace = server.store.trace(f["trace_id"])
    try:
        data = server.timelines.get(f["trace_id"])
        timeline: Any = dcc.Graph(id=ids.FINDING_TIMELINE, figure=data.figure(data.window_for(f), server.store.findings(f["trace_id"]),
                                                                      highlight=f),
                                  config={"displaylogo": False, "scrollZoom": True})  # fmt: skip
    except InputError as exc:
        timeline = html.P(f"No timeline: {exc}", className="error")
    return html.Div([
        html.P([dcc.Link(f"← {trace['name']}", href=f"/traces/{f['trace_id']}"), " · ",
                dcc.Link("all findings", href=f"/traces/{f['trace_id']}/findings")], className="meta"),
        html.H1([severity_badge(f["severity"]), " ", f["title"]], className="finding-title"),
        _missing(f),
        html.P(f"{f['kind']} · {where(f)} · impact {duration(f['impact_ns'])}{_share(f)} · window {duration(f['end_ns'] - f['start_ns'])} "
               "(outlined in red; the evidence kernels are drawn thick and red)", className="meta"),
        dcc.Store(id=ids.FINDING_ID, data=finding_id),
        dcc.Store(id=ids.TRACE_ID, data=f["trace_id"]),
        dcc.Store(id=ids.FINDING_VERSION, data=f["version"]),
        timeline,
        html.Div(className="columns", children=[
            html.Div(className="column", children=[
                html.H2("Fix"), html.P(f["advice"], className="advice"),
                html.H2("Evidence"), html.Pre(json.dumps(f["evidence"], indent=2), className="evidence"),
            ]),
            html.Div(className="column review", children=[
                html.H2("Review"),
                html.Label(["Status", dcc.Dropdown(id=ids.STATUS, options=list(FINDING_STATUSES), value=f["status"],
                                                   clearable=False)]),
                html.Label(["Assignee", dcc.Input(id=ids.ASSIGNEE, value=f["assignee"] or "", className="text")]),
                html.Button("Save", id=ids.SAVE, n_clicks=0),
                html.Div(id=ids.REVIEW_MESSAGE),
                html.H2("Comments"),
                html.Div(_comments(f["comments"]), id=ids.COMMENTS),
                dcc.Textarea(id=ids.COMMENT_TEXT, placeholder="Add to the discussion", className="text"),
                html.Button("Comment", id=ids.COMMENT_ADD, n_clicks=0),
            ]),
        ]),
    ])  # fmt: skip


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(ids.REVIEW_MESSAGE, "children"), Output(ids.FINDING_VERSION, "data"),
                  Input(ids.SAVE, "n_clicks"), State(ids.STATUS, "value"), State(ids.ASSIGNEE, "value"),
                  State(ids.FINDING_ID, "data"), State(ids.FINDING_VERSION, "data"), prevent_initial_call=True)  # fmt: skip
    def _save(_n: int, status: str, assignee: str | None, finding_id: int, version: int) -> Any:
        try:
            new_version = server.store.update_finding(finding_id, based_on_version=version, status=status,
                                                      assignee=assignee or "")  # fmt: skip
        except StaleEdit as exc:
            return html.P(f"Not saved: {exc}", className="error stale"), dash.no_update
        except InputError as exc:
            return html.P(f"Not saved: {exc}", className="error"), dash.no_update
        return html.P(f"Saved: {status}, assigned to {assignee or 'nobody'}.", className="ok saved"), new_version

    @app.callback(Output(ids.COMMENTS, "children"), Output(ids.COMMENT_TEXT, "value"), Input(ids.COMMENT_ADD, "n_clicks"),
                  State(ids.COMMENT_TEXT, "value"), State(ids.FINDING_ID, "data"), State(ids.AUTHOR, "value"),
                  prevent_initial_call=True)  # fmt: skip
    def _comment(_n: int, text: str | None, finding_id: int, author: str | None) -> Any:
        text = (text or "").strip()
        if not text:
            return dash.no_update, dash.no_update
        server.store.comment(finding_id, server.author(author), text)
        return _comments(server.store.finding(finding_id)["comments"]), ""

    @app.callback(Output(ids.FINDING_TIMELINE, "figure"), Input(ids.FINDING_TIMELINE, "relayoutData"),
                  State(ids.FINDING_ID, "data"), prevent_initial_call=True)  # fmt: skip
    def _zoom(relayout: dict[str, Any] | None, finding_id: int) -> Any:
        f = server.store.finding(finding_id)
        return zoomed_figure(server, f["trace_id"], relayout, highlight=f)


def _missing(f: dict[str, Any]) -> html.P | None:
    """The notice on a finding the latest analysis of its trace did not find."""
    if f.get("present", True):
        return None
    since = f" (since {f['missing_since'][:16].replace('T', ' ')} UTC)" if f.get("missing_since") else ""
    return html.P(f"Not found in the latest analysis{since}: kept with its review; the window and evidence are those "
                  "of the analysis that last found it.", className="error missing-finding")  # fmt: skip


def _share(f: dict[str, Any]) -> str:
    """The impact's share of the run, as " (57.1% of the run)", when the detector gave one."""
    evidence = f.get("evidence") or {}
    return f" ({share_of_run(evidence['share_of_run'])})" if "share_of_run" in evidence else ""


def _comments(comments: list[dict[str, Any]]) -> Any:
    return thread(comments, "comment", "No comments yet.")
