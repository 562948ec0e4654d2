"""One finding: the timeline zoomed to its window with its evidence outlined, the advice, and its
review (status, assignee, comments). A finding the trace's latest analysis did not find says so
(the store keeps it, with its review, and shows what the analysis that last found it said).

Saving names the version the page was loaded with; if someone saved in between, the store refuses
and the page says so instead of overwriting their change. A save that changes nothing saves nothing
(no event, no new version). Every status or assignee change is a review event in the thread.

The review stays live: every few seconds the page re-reads the finding's version and thread size
(:meth:`ReviewStore.review_state`) and, when they changed, redraws the thread; the form takes the new
status and assignee unless the user has unsaved edits in it, which are kept (the page says the
finding changed under them). Leaving the page with unsaved edits or an unposted comment asks first
(``assets/review.js``). With login on, the assignee is chosen from the server's users.
"""

from __future__ import annotations

import json
from typing import Any

import dash
from dash import ClientsideFunction, Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboards import ids
from dashboards.pages.common import (
    assignee_field,
    cell,
    login_on,
    missing,
    severity_badge,
    thread,
    where,
    zoomed_figure,
)
from dashboards.server import Server
from dashboards.timeline import TimelineData, evidence_items
from nsysan.errors import InputError
from nsysan.report.format import duration, share_of_run
from nsysan.store import FINDING_STATUSES, NotFound, StaleEdit
from nsysan.store.export import describe
from nsysan.store.store import ANALYSIS_AUTHOR

POLL_MS = 3000  # how often an open finding page re-reads its review
_UNEDITED: dict[str, Any] = {"data-dirty": "false"}  # assets/review.js's clientside callback keeps it


def layout(server: Server, finding_id: int) -> html.Div:
    try:
        f = server.store.finding(finding_id)
    except NotFound:
        return missing(f"No finding {finding_id}.")
    trace = server.store.trace(f["trace_id"])
    data: TimelineData | None = None
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
        html.P(f"{f['kind']} · {where(f)} · impact {duration(f['impact_ns'])}{_share(f)}{_recoverable(f)} · window {duration(f['end_ns'] - f['start_ns'])} "
               f"({_drawn(data, f)})", className="meta"),
        dcc.Store(id=ids.FINDING_ID, data=finding_id),
        dcc.Store(id=ids.TRACE_ID, data=f["trace_id"]),
        dcc.Store(id=ids.FINDING_VERSION, data=f["version"]),
        dcc.Store(id=ids.REVIEW_SEEN, data=_seen(f)),
        dcc.Interval(id=ids.REVIEW_POLL, interval=POLL_MS),
        timeline,
        html.Div(className="columns", children=[
            html.Div(className="column", children=[
                html.H2("Fix"), html.P(f["advice"], className="advice"),
                html.H2("Evidence"), _evidence(data, f),
            ]),
            html.Div(className="column review", children=[
                html.H2("Review"),
                html.Div(id=ids.REVIEW_FORM, **_UNEDITED, children=[
                    html.Label(["Status", dcc.Dropdown(id=ids.STATUS, options=list(FINDING_STATUSES), value=f["status"],
                                                       clearable=False)]),
                    html.Label(["Assignee", assignee_field(server, ids.ASSIGNEE, f["assignee"], "nobody")]),
                    html.Button("Save", id=ids.SAVE, n_clicks=0),
                ]),
                html.Div(id=ids.REVIEW_MESSAGE),
                html.H2("Discussion"),
                html.Div(_thread(f), id=ids.COMMENTS),
                dcc.Textarea(id=ids.COMMENT_TEXT, placeholder="Add to the discussion", className="text"),
                html.Button("Comment", id=ids.COMMENT_ADD, n_clicks=0),
            ]),
        ]),
    ])  # fmt: skip


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(ids.REVIEW_MESSAGE, "children"), Output(ids.FINDING_VERSION, "data"),
                  Output(ids.COMMENTS, "children"), Output(ids.REVIEW_SEEN, "data"),
                  Input(ids.SAVE, "n_clicks"), State(ids.STATUS, "value"), State(ids.ASSIGNEE, "value"),
                  State(ids.FINDING_ID, "data"), State(ids.FINDING_VERSION, "data"), State(ids.AUTHOR, "value"),
                  prevent_initial_call=True)  # fmt: skip
    def _save(_n: int, status: str, assignee: str | None, finding_id: int, version: int, author: str | None) -> Any:
        assignee = (assignee or "").strip()
        try:
            before = server.store.review_state(finding_id)["version"]
            # with login, only the server's users (or the assignee it already has, from before)
            known = not login_on(server) or not assignee or assignee in server.users
            if not known and assignee != (server.store.review_state(finding_id)["assignee"] or ""):
                raise InputError(f"{assignee!r} is not a user of this server")
            new_version = server.store.update_finding(finding_id, based_on_version=version, status=status,
                                                      assignee=assignee, author=server.author(author))  # fmt: skip
        except StaleEdit as exc:
            return html.P(f"Not saved: {exc}", className="error stale"), dash.no_update, dash.no_update, dash.no_update
        except InputError as exc:
            return html.P(f"Not saved: {exc}", className="error"), dash.no_update, dash.no_update, dash.no_update
        f = server.store.finding(finding_id)
        if new_version == before:
            message = html.P("Nothing to save: no change.", className="ok unchanged")
        else:
            message = html.P(f"Saved: {status}, assigned to {assignee or 'nobody'}.", className="ok saved")
        return message, f["version"], _thread(f), _seen(f)

    @app.callback(Output(ids.COMMENTS, "children", allow_duplicate=True), Output(ids.COMMENT_TEXT, "value"),
                  Input(ids.COMMENT_ADD, "n_clicks"), State(ids.COMMENT_TEXT, "value"), State(ids.FINDING_ID, "data"),
                  State(ids.AUTHOR, "value"), prevent_initial_call=True)  # fmt: skip
    def _comment(_n: int, text: str | None, finding_id: int, author: str | None) -> Any:
        text = (text or "").strip()
        if not text:
            return dash.no_update, dash.no_update
        server.store.comment(finding_id, server.author(author), text)
        return _thread(server.store.finding(finding_id)), ""

    @app.callback(Output(ids.COMMENTS, "children", allow_duplicate=True),
                  Output(ids.REVIEW_SEEN, "data", allow_duplicate=True),
                  Output(ids.REVIEW_MESSAGE, "children", allow_duplicate=True),
                  Output(ids.FINDING_VERSION, "data", allow_duplicate=True),
                  Output(ids.STATUS, "value"), Output(ids.ASSIGNEE, "value"),
                  Input(ids.REVIEW_POLL, "n_intervals"), State(ids.FINDING_ID, "data"), State(ids.REVIEW_SEEN, "data"),
                  State(ids.FINDING_VERSION, "data"), State(ids.STATUS, "value"), State(ids.ASSIGNEE, "value"),
                  State(ids.AUTHOR, "value"), prevent_initial_call=True)  # fmt: skip
    def _poll(_n: int, finding_id: int, seen: dict[str, Any] | None, version: int, status: str | None,
              assignee: str | None, author: str | None) -> Any:  # fmt: skip
        """Redraw the review when someone else changed it; keep the form when the user is editing it."""
        state = server.store.review_state(finding_id)
        if _same(state, seen or {}):
            raise PreventUpdate
        f = server.store.finding(finding_id)
        if state["version"] == version:  # only the thread grew (a comment): the form is current
            return _thread(f), _seen(f), _reanalysed(f, seen or {}), dash.no_update, dash.no_update, dash.no_update
        mine = (status, (assignee or "").strip())
        editing = mine != ((seen or {}).get("status"), (seen or {}).get("assignee") or "")
        newer = [e for e in f["events"] if e["version"] > version]
        what = "; ".join(f"{e['author']} changed {describe(e).replace(' -> ', ' → ')}" for e in newer) or "changed"
        if (
            editing
            and mine == (f["status"], f["assignee"] or "")
            and {e["author"] for e in newer} == {server.author(author)}
        ):
            # this page's own save, read before its answer arrived (a tick sent while the save was in
            # flight): the save's answer says "Saved"; saying "Updated" here would overwrite it
            return _thread(f), _seen(f), dash.no_update, f["version"], dash.no_update, dash.no_update
        if editing and mine != (f["status"], f["assignee"] or ""):
            message = html.P(f"This finding was changed by someone else while you edit it ({what}): your unsaved edit "
                             "is kept, but saving it will be refused; reload it to start from theirs.",
                             className="error stale live")  # fmt: skip
            return _thread(f), _seen(f), message, dash.no_update, dash.no_update, dash.no_update
        message = html.P(f"Updated: {what}.", className="ok live")
        return _thread(f), _seen(f), message, f["version"], f["status"], _assignee_value(server, f["assignee"])

    app.clientside_callback(  # whether the form or the comment box holds something unsaved (assets/review.js)
        ClientsideFunction(namespace="nsysan", function_name="reviewDirty"),
        Output(ids.REVIEW_FORM, "data-dirty"), Input(ids.STATUS, "value"), Input(ids.ASSIGNEE, "value"),
        Input(ids.COMMENT_TEXT, "value"), Input(ids.REVIEW_SEEN, "data"),
    )  # fmt: skip

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


def _drawn(data: TimelineData | None, f: dict[str, Any]) -> str:
    """What the timeline shows for this finding, as drawn (the header must not promise more)."""
    if data is None:
        return "no timeline to draw on"
    drawn = data.evidence_drawn(f, data.window_for(f))
    if drawn:
        return f"its window shaded; drawn red: {'; '.join(drawn)}"
    return "its window shaded; its evidence names no kernel or copy to draw"


def _evidence(data: TimelineData | None, f: dict[str, Any]) -> html.Div:
    """The evidence as readable lines (times on the timeline's clock, durations with units), and the
    raw record as stored for whoever needs the export's own numbers."""
    rows = [html.Tr([html.Th(item["key"]), cell(item["text"])]) for item in evidence_items(data, f)]
    return html.Div([
        html.Table(html.Tbody(rows), className="evidence-table"),
        html.Details([html.Summary("as stored (the export's clock)"),
                      html.Pre(json.dumps(f["evidence"], indent=2), className="evidence")]),
    ])  # fmt: skip


def _recoverable(f: dict[str, Any]) -> str:
    """ " · recoverable 1.2 ms": the job's wall time fixing this would save (replayed across ranks);
    nothing for a finding stored before recoverable time was computed."""
    rec = f.get("recoverable_ns")
    return "" if rec is None else f" · recoverable {duration(rec)}"


def _share(f: dict[str, Any]) -> str:
    """The impact's share of the run, as " (57.1% of the run)", when the detector gave one."""
    evidence = f.get("evidence") or {}
    return f" ({share_of_run(evidence['share_of_run'])})" if "share_of_run" in evidence else ""


def _thread(f: dict[str, Any]) -> Any:
    """The finding's thread: comments and review events, in the order they happened."""
    return thread(f["thread"], "comment", "No comments or changes yet.")


def _seen(f: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of the review, to tell a change from the poll's answer."""
    return {"version": f["version"], "status": f["status"], "assignee": f["assignee"] or "",
            "comments": len(f["comments"]), "events": len(f["events"])}  # fmt: skip


def _reanalysed(f: dict[str, Any], seen: dict[str, Any]) -> Any:
    """A line when the comments that arrived include a re-analysis's (its title, figures and
    evidence on this page are the old ones until a reload), else nothing to change."""
    arrived = f["comments"][int(seen.get("comments") or 0) :]
    if not any(c["author"] == ANALYSIS_AUTHOR for c in arrived):
        return dash.no_update
    return html.P("A re-analysis changed this finding (see the discussion): reload the page for its new title, "
                  "figures and evidence.", className="error stale live")  # fmt: skip


def _same(state: dict[str, Any], seen: dict[str, Any]) -> bool:
    return all(state[k] == seen.get(k) for k in ("version", "comments", "events"))


def _assignee_value(server: Server, current: str | None) -> str | None:
    return current if login_on(server) else (current or "")
