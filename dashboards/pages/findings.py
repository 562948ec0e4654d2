"""A trace's findings, one row per problem: findings that share a group key (episodes of one
problem) fold into one headline with their count, total impact and worst occurrence; clicking a
headline lists its occurrences, with a form that sets the status and assignee of all of them at once
(triage by group; each occurrence keeps its own thread). Filter by kind, severity, status and rank, and by text (title, kind,
group key, kernel and other evidence); sort by any column (severity by rank, critical first, not
alphabetically), all in the browser on Dash AG Grid. "when" is an occurrence's start on the timeline's clock: ms since the trace's first
activity, as the overview's axis shows it (the worst occurrence's, for a headline).

The trace's review (every finding with its status, assignee, comments and review events) downloads
as CSV, JSON or Markdown from ``/traces/<id>/review.<csv|json|md>``, linked from the page.

Findings an earlier analysis found and the latest did not are kept with their review (the store
never deletes them): they fold into headlines of their own, after the others, greyed and marked
"not found in the latest analysis"."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import dash
import dash_ag_grid as dag
import flask
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboards import ids, security
from dashboards.pages.common import assignee_field, login_on, missing, recoverable_ns, review_status, where
from dashboards.server import Server
from nsysan.detect import registered
from nsysan.errors import InputError, NsysanError
from nsysan.report.document import SEVERITY_RANK, fold_groups
from nsysan.report.format import duration
from nsysan.store import FINDING_STATUSES, NotFound
from nsysan.store import export as review_export

Clock = Callable[[dict[str, Any]], float | None]  # a finding -> its "when" (ms on the timeline's clock)
MAX_SEARCH = 200  # characters of a text filter that count

FILTERS = {
    ids.FILTER_KIND: "kind",
    ids.FILTER_SEVERITY: "severity",
    ids.FILTER_STATUS: "status",
    ids.FILTER_RANK: "rank",
}


def _column(
    field: str, header: str | None = None, width: int = 90, numeric: bool = False, **more: Any
) -> dict[str, Any]:
    """A column ``width`` px wide at first (a user may resize it); the title column takes the rest."""
    return (
        {"field": field, "headerName": header or field, "width": width}
        | ({"type": "numericColumn", "cellDataType": "number"} if numeric else {})
        | more
    )


# a title cell holds a markdown link: it sorts and filters by the title's text
# (at least 220 px: with every other column at its width the grid scrolls sideways rather than
# squeezing the title to a letter per line)
_TITLE: dict[str, Any] = {"cellRenderer": "markdown", "flex": 1, "minWidth": 220, "filterValueGetter": {"function": "params.data.plain_title"}, "comparator": {"function": "nsysanTitleOrder"},
                          "cellStyle": {"wordBreak": "break-word"}}  # fmt: skip
_SEVERITY_COLOURS = {"styleConditions": [
    {"condition": f"params.value === '{s}'", "style": {"color": c, "fontWeight": "bold"}}
    for s, c in (("critical", "#b00"), ("warning", "#a66b00"))]}  # fmt: skip
# severity, kind, status and rank have the page's own filters above the table: no funnel of their own
_FILTERED_ABOVE: dict[str, Any] = {"filter": False}
COLUMNS = [
    _column(
        "severity",
        width=85,
        comparator={"function": "nsysanSeverityOrder"},
        cellStyle=_SEVERITY_COLOURS,
        **_FILTERED_ABOVE,
    ),
    _column("kind", width=160, cellStyle={"wordBreak": "break-word"}, **_FILTERED_ABOVE),
    _column("title", "worst occurrence", width=260, **_TITLE),
    _column("rank", width=60, numeric=True, **_FILTERED_ABOVE),
    _column("device", "GPU", width=80, numeric=True),
    _column("count", "occurrences", width=110, numeric=True),
    _column("impact_ms", "total impact (ms)", width=90, numeric=True),
    _column("recoverable_ms", "recoverable (ms)", width=100, numeric=True),
    _column("worst_ms", "worst (ms)", width=90, numeric=True),
    _column("when_ms", "when (ms)", width=90, numeric=True),
    _column("status", width=120, **_FILTERED_ABOVE),
    _column("assignee", width=105),
    _column("latest", "latest analysis", width=105),
]
OCCURRENCE_COLUMNS = [
    _column("impact_ms", "impact (ms)", width=90, numeric=True),
    _column("recoverable_ms", "recoverable (ms)", width=100, numeric=True),
    _column("title", "finding", width=300, **_TITLE),
    _column("rank", width=75, numeric=True),
    _column("device", "GPU", width=80, numeric=True),
    _column("when_ms", "when (ms)", width=90, numeric=True),
    _column("start_ms", "start (ms, export clock)", width=110, numeric=True),
    _column("window_ms", "window (ms)", width=95, numeric=True),
    _column("status", width=120),
    _column("assignee", width=105),
    _column("latest", "latest analysis", width=105),
]
FOUND, MISSING = "found", "not found in the latest analysis"
# rows of findings the latest analysis did not find: greyed
_MISSING_STYLE = {"styleConditions": [{"condition": f"params.data.latest === '{MISSING}'",
                                       "style": {"color": "#777", "fontStyle": "italic"}}]}  # fmt: skip
# Every column sorts (its header) and, unless the page filters it above the table, filters (the
# funnel by its name) in the browser, AG Grid's community features; cells wrap, so a 300-character
# kernel name grows its row instead of running over the next column.
_DEFAULT_COLUMN = {"sortable": True, "filter": True, "resizable": True,
                   "wrapText": True, "autoHeight": True, "wrapHeaderText": True, "autoHeaderHeight": True,
                   "comparator": {"function": "nsysanOrder"}}  # fmt: skip
# Up to this many rows a table is as tall as its rows; beyond, it is a box of fixed height that
# draws only the rows in view (virtual scrolling), so thousands of headlines stay cheap.
_ALL_ROWS_DRAWN = 60
_PICK = "Click a row to list its occurrences, each linked to its finding."


def layout(server: Server, trace_id: int) -> html.Div:
    try:
        t = server.store.trace(trace_id)
    except NotFound:
        return missing(f"No trace {trace_id}.")
    rows = server.store.findings(trace_id, include_missing=True)
    when = clock(server, trace_id)
    not_found = sum(not present(f) for f in rows)
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
        dcc.Input(id=ids.FILTER_TEXT, type="search", placeholder="search title, kind, group, kernel", debounce=0.4,
                  maxLength=MAX_SEARCH, className="search"),
        html.P("One row per problem: findings that are episodes of one problem are folded together, with how many "
               "there are (of those the filters keep), their total impact and the worst one. When: the worst "
               "one's start, ms since the trace's first activity (the timeline's clock).", className="hint"),
        html.P(["Export the review (findings, statuses, comments and changes): ",
                *[html.A(label, href=f"/traces/{trace_id}/review.{fmt}", className=f"export-{fmt}",
                         download=review_export.filename({"trace": t}, fmt))
                  for fmt, label in (("csv", "CSV"), ("json", "JSON"), ("md", "Markdown"))]],
               className="hint exports"),
        html.P(f"{not_found} finding{'s' if not_found != 1 else ''} of an earlier analysis {'were' if not_found != 1 else 'was'} "
               f"not found in the latest one: kept with {'their' if not_found != 1 else 'its'} review, listed last and "
               "greyed.", className="hint missing-findings") if not_found else None,
        grid(ids.FINDINGS_TABLE, COLUMNS, headlines(rows, when), selectable=True),
        html.Div(html.P(_PICK, className="hint"), id=ids.OCCURRENCES),
        dcc.Store(id=ids.LISTED_GROUP, data=None),
    ])  # fmt: skip


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(ids.FINDINGS_TABLE, "rowData"), Output(ids.FINDINGS_TABLE, "selectedRows"),
                  Output(ids.LISTED_GROUP, "data", allow_duplicate=True),
                  *(Input(key, "value") for key in FILTERS), Input(ids.FILTER_TEXT, "value"),
                  State(ids.TRACE_ID, "data"), prevent_initial_call=True)  # fmt: skip
    def _filter(kind: str | None, severity: str | None, status: str | None, rank: int | None, text: str | None,
                trace_id: int) -> Any:  # fmt: skip
        found = _filtered(server, trace_id, kind, severity, status, rank, text)
        return headlines(found, clock(server, trace_id)), [], None  # the picked group's listing goes with the old rows

    @app.callback(Output(ids.OCCURRENCES, "children"), Output(ids.LISTED_GROUP, "data"),
                  Input(ids.FINDINGS_TABLE, "selectedRows"), *(State(key, "value") for key in FILTERS),
                  State(ids.FILTER_TEXT, "value"), State(ids.TRACE_ID, "data"), State(ids.LISTED_GROUP, "data"),
                  prevent_initial_call=True)  # fmt: skip
    def _occurrences(picked: list[dict[str, Any]] | None, kind: str | None, severity: str | None, status: str | None,
                     rank: int | None, text: str | None, trace_id: int, listed: str | None) -> Any:  # fmt: skip
        key = picked[0].get("id") if isinstance(picked, list) and picked and isinstance(picked[0], dict) else None
        if key is not None and key == listed:
            # the grid re-sends its selection when a group triage changes the row: the listing, and
            # the triage's answer in it, stay
            raise PreventUpdate
        found = _filtered(server, trace_id, kind, severity, status, rank, text)
        members = [f for f in found if group_id(f) == key]
        if not members:
            return html.P(_PICK, className="hint"), None
        return occurrences(members, clock(server, trace_id), triage=_triage_form(server, members)), key

    @app.callback(Output(ids.OCCURRENCES, "children", allow_duplicate=True),
                  Output(ids.FINDINGS_TABLE, "rowData", allow_duplicate=True),
                  Input(ids.GROUP_APPLY, "n_clicks"), State(ids.GROUP_STATUS, "value"),
                  State(ids.GROUP_ASSIGNEE, "value"), State(ids.GROUP_VERSIONS, "data"),
                  State(ids.FINDINGS_TABLE, "rowData"), State(ids.TRACE_ID, "data"), State(ids.AUTHOR, "value"),
                  prevent_initial_call=True)  # fmt: skip
    def _triage(n: int | None, status: str | None, assignee: str | None, versions: Any, shown: list[dict[str, Any]],
                trace_id: int, author: str | None) -> Any:  # fmt: skip
        if not n or not versions:
            raise PreventUpdate
        return triage(server, trace_id, versions, status, assignee, author, shown)

    @app.server.route("/traces/<int:trace_id>/review.<fmt>")
    def _export(trace_id: int, fmt: str) -> flask.Response:
        """The trace's review as a file (the login and loopback checks guard it like every page)."""
        if fmt not in review_export.FORMATS or trace_id > security.MAX_ID:  # no store holds such an id
            flask.abort(404)
        try:
            review = server.store.review(trace_id)
        except NotFound:
            flask.abort(404)
        name = review_export.filename(review, fmt)
        return flask.Response(review_export.render(review, fmt), mimetype=review_export.FORMATS[fmt],
                              headers={"Content-Disposition": f'attachment; filename="{name}"'})  # fmt: skip


def triage(server: Server, trace_id: int, versions: Any, status: str | None, assignee: str | None,
           typed: str | None, shown: list[dict[str, Any]] | None = None) -> tuple[Any, Any]:  # fmt: skip
    """Set the status and/or assignee of the listed occurrences (``versions``: {id: version} as
    listed, checked against the trace before anything is saved): the occurrences panel with what
    was done, and the headlines shown with their new status and assignees, each row where it was
    (the highlighted row stays on its group; a row the filters would now drop goes at the next
    filtering)."""
    assignee = (assignee or "").strip() or None  # blank: the assignees stay as they are
    try:
        listed = _listed_versions(server, trace_id, versions)
    except InputError as exc:
        return html.P(f"Not saved: {exc}", className="error"), dash.no_update
    try:
        if status is None and assignee is None:
            raise InputError("choose a status or an assignee to set")
        if assignee is not None and login_on(server) and assignee not in server.users:
            raise InputError(f"{assignee!r} is not a user of this server")
        done = server.store.update_findings(listed, status=status, assignee=assignee, author=server.author(typed))
        ok = not done["stale"] and not done["gone"]
        message = html.P(_triaged(done, status, assignee), className="ok triaged" if ok else "error stale")
    except InputError as exc:
        message = html.P(f"Not saved: {exc}", className="error")
    everything = server.store.findings(trace_id, include_missing=True)
    members = [f for f in everything if f["id"] in listed]
    when = clock(server, trace_id)
    panel = occurrences(members, when, triage=_triage_form(server, members, message)) if members else message
    now = {row["id"]: row for row in headlines(everything, when)}
    rows = [row | {k: now[row["id"]][k] for k in ("status", "assignee")} if row.get("id") in now else row
            for row in shown or []]  # fmt: skip
    return panel, rows


def _listed_versions(server: Server, trace_id: int, versions: Any) -> dict[int, int]:
    """The page's {finding id: version}, refused unless every pair is an id and a version of one
    of this trace's findings (the page's state is the browser's, so it is checked like any input)."""
    if not isinstance(versions, dict):
        raise InputError("this page's state is damaged; reload the page")
    mine = server.store.finding_ids(trace_id)
    listed: dict[int, int] = {}
    for key, version in versions.items():
        finding_id = int(key) if isinstance(key, str) and key.isdecimal() and len(key) <= 15 else -1
        if finding_id not in mine or version is None or not security.is_id(version):
            raise InputError("this page's state is damaged (a finding not of this trace); reload the page")
        listed[finding_id] = int(version)
    return listed


def _filtered(server: Server, trace_id: int, kind: str | None, severity: str | None, status: str | None,
              rank: int | None, text: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    found = server.store.findings(trace_id, kind=kind, severity=severity, rank=rank, include_missing=True)
    return [f for f in found if (status is None or f["status"] == status) and matches(f, text)]


def matches(f: dict[str, Any], text: str | None) -> bool:
    """Whether a finding's title, kind, group key or evidence (kernel names, ops, streams) holds
    ``text``, case-insensitively; no text matches everything."""
    needle = (text or "").strip().lower()[:MAX_SEARCH]
    if not needle:
        return True
    haystack = [f.get("title") or "", f.get("kind") or "", f.get("group") or "", json.dumps(f.get("evidence") or {})]
    return any(needle in h.lower() for h in haystack)


def clock(server: Server, trace_id: int) -> Clock | None:
    """A finding's "when": its start on the timeline's clock (the job clock, ms since the trace's first
    kernel, copy or NVTX range), or None when the trace has no timeline (not analysed, nothing drawn)."""
    try:
        data = server.timelines.get(trace_id)
    except NsysanError:
        return None
    origin, offsets = data.origin_ns, data.rank_offset

    def when(f: dict[str, Any]) -> float | None:
        shift = offsets.get(int(f["rank"]), 0) if f.get("rank") is not None else 0
        return round((f["start_ns"] + shift - origin) / 1e6, 3)

    return when


def present(f: dict[str, Any]) -> bool:
    """Whether the trace's latest analysis found the finding (True for findings given without the flag)."""
    return bool(f.get("present", True))


def group_id(f: dict[str, Any]) -> str:
    """A headline's row id: the group key, or for a finding without one (a group of its own) its id;
    findings the latest analysis did not find make headlines of their own."""
    key = f.get("group") or f"#{f['id']}"
    return key if present(f) else f"missing|{key}"


def headlines(findings: list[dict[str, Any]], when: Clock | None = None) -> list[dict[str, Any]]:
    """One row per group (folded as the report folds them), worst first: severity, then total impact;
    the groups of findings the latest analysis did not find after the others. ``when`` gives the
    worst occurrence's time (:func:`clock`; without it the column is empty)."""
    rows = []
    for members in _by_presence(findings):
        rows += _headlines(members, when)
    return rows


def _by_presence(findings: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [part for part in ([f for f in findings if present(f)], [f for f in findings if not present(f)]) if part]


def _headlines(findings: list[dict[str, Any]], when: Clock | None) -> list[dict[str, Any]]:
    rows = []
    for g in fold_groups(findings):
        members = [findings[i] for i in g["findings"]]
        worst = findings[g["worst"]]
        rows.append({
            "id": group_id(worst), "severity": g["severity"], "severity_rank": SEVERITY_RANK.get(g["severity"], -1),
            "kind": g["kind"],
            "rank": _common(m["rank"] for m in members), "device": _common(m["device"] for m in members),
            "count": g["count"], "impact_ms": _ms(g["impact_ns"]), "worst_ms": _ms(worst["impact_ns"]),
            "recoverable_ms": _recoverable_ms(members),
            "when_ms": when(worst) if when else None, "status": _statuses(members),
            "assignee": ", ".join(sorted({m["assignee"] for m in members if m["assignee"]})),
            "latest": FOUND if present(worst) else MISSING,
            "title": _link(worst), "plain_title": worst["title"], "worst_id": worst["id"],
        })  # fmt: skip
    return rows


def occurrences(members: list[dict[str, Any]], when: Clock | None = None, triage: Any = None) -> html.Div:
    """A group's occurrences, largest impact first, each linked to its finding; ``triage``: the form
    that sets them all (:func:`_triage_form`)."""
    shared = {k: _common(m[k] for m in members) for k in ("rank", "device", "pid")}
    place = f" on {where(shared)}" if any(v is not None for v in shared.values()) else ""
    total = sum(m["impact_ns"] for m in members)
    rows = [{"impact_ms": _ms(m["impact_ns"]), "recoverable_ms": _recoverable_ms([m]), "rank": m["rank"], "device": m["device"],
             "when_ms": when(m) if when else None, "start_ms": _ms(m["start_ns"]),
             "window_ms": _ms(m["end_ns"] - m["start_ns"]), "status": m["status"], "assignee": m["assignee"] or "",
             "latest": FOUND if present(m) else MISSING, "title": _link(m), "plain_title": m["title"], "id": m["id"]}
            for m in sorted(members, key=lambda m: (-m["impact_ns"], m["id"]))]  # fmt: skip
    return html.Div([
        html.H2(f"{len(members)} occurrence{'s' if len(members) != 1 else ''} of {members[0]['kind']}{place} "
                f"· {duration(total)} in all{'' if present(members[0]) else f' · {MISSING}'}"),
        *([triage] if triage is not None else []),
        grid(ids.OCCURRENCES_TABLE, OCCURRENCE_COLUMNS, rows),
    ])  # fmt: skip


def grid(
    grid_id: str, columns: list[dict[str, Any]], rows: list[dict[str, Any]], selectable: bool = False
) -> dag.AgGrid:
    """A table on Dash AG Grid: rows keyed by their ``id`` (a re-triaged row keeps its place and
    selection), sorting and filtering in the browser, the rows of findings the latest analysis did
    not find greyed; ``selectable``: a click (or Space on a focused row) picks one row (its
    ``selectedRows``). Whether it draws every row or scrolls virtually is decided by the rows it is
    drawn with."""
    options: dict[str, Any] = {"animateRows": False, "enableCellTextSelection": True,
                               "domLayout": "autoHeight" if len(rows) <= _ALL_ROWS_DRAWN else "normal"}  # fmt: skip
    if selectable:
        options["rowSelection"] = {"mode": "singleRow", "checkboxes": False, "enableClickSelection": True}
    return dag.AgGrid(id=grid_id, columnDefs=columns, rowData=rows, defaultColDef=_DEFAULT_COLUMN,
                      getRowId="params.data.id", getRowStyle=_MISSING_STYLE, dashGridOptions=options,
                      style={"height": None if len(rows) <= _ALL_ROWS_DRAWN else "70vh"})  # fmt: skip


def _triage_form(server: Server, members: list[dict[str, Any]], message: Any = None) -> html.Div:
    """Status and assignee for every listed occurrence at once (a group of 16-83 episodes is one
    problem). The versions as listed go with it: an occurrence someone saved since is left alone."""
    n = len(members)
    return html.Div(className="group-triage", children=[
        dcc.Store(id=ids.GROUP_VERSIONS, data={str(m["id"]): m["version"] for m in members}),
        html.Label(["Status", dcc.Dropdown(id=ids.GROUP_STATUS, options=list(FINDING_STATUSES),
                                           placeholder="status: unchanged", clearable=True)]),
        html.Label(["Assignee", assignee_field(server, ids.GROUP_ASSIGNEE, None, "assignee: unchanged")]),
        html.Button(f"Set all {n} occurrence{'s' if n != 1 else ''}", id=ids.GROUP_APPLY, n_clicks=0),
        html.Div(message, id=ids.GROUP_MESSAGE),
    ])  # fmt: skip


def _triaged(done: dict[str, list[int]], status: str | None, assignee: str | None) -> str:
    what = " and ".join(x for x in (status and f"status {status}", assignee and f"assigned to {assignee}") if x)
    parts = [f"Set {what} on {len(done['changed'])} occurrence{'s' if len(done['changed']) != 1 else ''}"]
    if done["unchanged"]:
        parts.append(f"{len(done['unchanged'])} had it already")
    if done["stale"]:
        ids_ = ", ".join(f"#{i}" for i in done["stale"])
        parts.append(f"not changed, because someone else saved them since you listed them: {ids_} (open them to look)")
    if done["gone"]:
        parts.append(f"{len(done['gone'])} deleted since you listed them")
    return "; ".join(parts) + "."


def _common(values: Any) -> Any:
    """The value all occurrences share, or None (an empty cell) where they differ."""
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def _statuses(members: list[dict[str, Any]]) -> str:
    """The review status of a group: its occurrences' one status, or how many have each."""
    return review_status(m["status"] for m in members)


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def _recoverable_ms(members: list[dict[str, Any]]) -> float | None:
    """The members' summed recoverable time in ms; None (an empty cell) before recoverable time."""
    total = recoverable_ns(members)
    return None if total is None else _ms(total)


def _link(f: dict[str, Any]) -> str:
    return f"[{_escape(f['title'])}](/findings/{f['id']})"


def _escape(text: str) -> str:
    """Markdown-safe: a finding's title names kernels, which may hold brackets and underscores."""
    return "".join("\\" + c if c in "\\`*_{}[]()<>#+-.!|~&" else c for c in text)
