"""One trace: what is wrong with it, its timeline, then what it is (GPUs, steps, kernels), then the
team's notes: the timeline near the top, where a reader looks first, not three screens down.

* **Summary** (from the stored report document, so its figures are ``nsysan report``'s): per GPU
  busy %, kernel time, NCCL share and copies; the job's step time; where each rank's step time went
  (stacked bars from the document's steps section, :mod:`dashboards.breakdown`; a click zooms the
  timeline to that step); top kernels; NCCL time by operation and size; copies; what the capture
  cannot show, with the nsys option that would show it.
* **Findings by group**, worst first, each with its total impact and a link that selects it here.
* **Timeline** with a legend; finding markers clustered per group and rank row ("×N"); every row
  kept at any zoom. The view is in the URL (``?t0=..&t1=..&finding=..``, ms since the first
  activity) so a link reopens it.
* **Evidence** of the selected finding on the page's clock, each time a button that zooms there;
  the ops it names drawn red on every rank involved; previous/next occurrence of its group.

A timeline the server does not hold yet is built in the background (``TimelineCache.prepare``):
the page says "building the timeline…" and polls, instead of a blank page while it builds.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qs, urlencode

import dash
from dash import ALL, Input, Output, State, dcc, html

from dashboards import breakdown, ids
from dashboards.analysis import stored_steps
from dashboards.pages.common import captured, cell, missing, recoverable_ns, severity_badge, thread
from dashboards.server import Server
from dashboards.timeline import LANE_COLOURS, LANE_SHADES, LANES, SEVERITY_COLOURS, TimelineData, evidence_items
from nsysan.detect.registry import parse_settings, raised_limits
from nsysan.errors import InputError
from nsysan.report import format as fmt
from nsysan.report.document import fold_groups
from nsysan.report.sections import tables
from nsysan.store import NotFound

log = logging.getLogger(__name__)

BODY = "overview-body"
SUMMARY = "overview-summary"  # above the timeline: what is wrong
DETAILS = "overview-details"  # below it: what the trace is (GPUs, steps, kernels, NCCL, copies)
VIEW = "overview-view"  # {"t0": ms, "t1": ms, "finding": id}: what the URL's query string says
TIMELINE_READY = "overview-timeline-ready"  # set once by the poll when the timeline is built: the page is drawn then
URL_SYNC = "overview-url-sync"  # written by the clientside callback that puts the view in the URL
EVIDENCE = "overview-evidence"
LOADING = "overview-loading"
EVIDENCE_TIME = "overview-evidence-time"  # pattern-matching: {"type": EVIDENCE_TIME, "index": n}
DEVICE_TABLE = "overview-devices"
GROUPS_TABLE = "overview-groups"
MORE_GROUPS, MORE_GROUPS_TABLE = "overview-more-groups", "overview-more-groups-table"
INFO_GROUPS_SHOWN = 3  # info groups listed above the timeline; the rest fold away
LIMITATIONS = "overview-limitations"
LEGEND = "overview-legend"

POLL_MS = 500  # while the trace is analysed or its timeline built: a cheap status read a tick
MAX_SETTINGS = 64  # lines of settings a re-analysis takes (every detector has fewer than ten)
MAX_SETTING_CHARS = 200
_NUMBER = re.compile(r"-?[0-9]{1,12}(\.[0-9]{1,9})?")
_SHOWN_TABLES = ("Top kernels by total time", "NCCL time by operation and size", "Memory copies")


# -- the view in the URL -----------------------------------------------------------------------


def parse_view(search: str | None) -> dict[str, Any]:
    """``?t0=1.5&t1=2.5&finding=7`` as ``{"t0": 1.5, "t1": 2.5, "finding": 7}``: what is not a plain
    number is left out (the query string comes from anyone with a link)."""
    query = parse_qs((search or "").lstrip("?"))
    view: dict[str, Any] = {}
    for key in ("t0", "t1"):
        value = query.get(key, [""])[0]
        if _NUMBER.fullmatch(value):
            view[key] = float(value)
    if "t0" in view and "t1" in view and view["t1"] <= view["t0"]:
        view.pop("t0"), view.pop("t1")
    if "t0" not in view or "t1" not in view:
        view.pop("t0", None), view.pop("t1", None)
    finding = query.get("finding", [""])[0]
    if re.fullmatch("[0-9]{1,15}", finding):
        view["finding"] = int(finding)
    return view


def view_query(view: dict[str, Any]) -> str:
    """The inverse of :func:`parse_view`: ``?t0=..&t1=..&finding=..`` (empty for the default view)."""
    parts = {}
    if view.get("t0") is not None and view.get("t1") is not None:
        parts["t0"], parts["t1"] = (
            f"{view['t0']:.6f}".rstrip("0").rstrip("."),
            f"{view['t1']:.6f}".rstrip("0").rstrip("."),
        )
    if view.get("finding") is not None:
        parts["finding"] = str(int(view["finding"]))
    return "?" + urlencode(parts) if parts else ""


def _search_of_request() -> str:
    """The URL's query string of the request that routed here (the app's router passes ids only)."""
    try:
        inputs = dash.callback_context.inputs
    except Exception:  # outside a callback (a test calling layout directly)
        return ""
    value = inputs.get(f"{ids.URL}.search") if isinstance(inputs, dict) else None
    return value if isinstance(value, str) else ""


# -- layout ------------------------------------------------------------------------------------


def layout(server: Server, trace_id: int, search: str | None = None) -> html.Div:
    try:
        t = server.store.trace(trace_id)
    except NotFound:
        return missing(f"No trace {trace_id}.")
    view = parse_view(search if search is not None else _search_of_request())
    counts = ", ".join(f"{n} {s}" for s, n in t["findings"].items() if n) or "none"
    body, final = _body(server, t, view)
    return html.Div([
        html.H1(t["name"]),
        html.P([f"Ranks {', '.join(map(str, t['ranks'])) or '–'} · GPUs {', '.join(map(str, t['devices'])) or '–'} · "
                f"captured {captured(t['captured_utc_ns'])} · step time {fmt.duration(t['step_ns'])} · findings: {counts} · ",
                dcc.Link("findings table", href=f"/traces/{trace_id}/findings"), " · ",
                dcc.Link("compare with another capture", href=f"/compare?before={trace_id}")], className="meta"),
        dcc.Store(id=ids.TRACE_ID, data=trace_id),
        dcc.Store(id=VIEW, data=view),
        dcc.Store(id=URL_SYNC),
        dcc.Store(id=TIMELINE_READY),
        html.Div(_summary(server, t), id=SUMMARY),
        html.Div(body, id=BODY),
        html.Div(_details(server, t), id=DETAILS),
        dcc.Interval(id=ids.TRACE_POLL, interval=POLL_MS, disabled=final),
        html.H2("Notes"),
        html.Div(_notes(server, trace_id), id=ids.NOTES),
        dcc.Textarea(id=ids.NOTE_TEXT, placeholder="A note on this trace for the team", className="text"),
        html.Button("Add note", id=ids.NOTE_ADD, n_clicks=0),
        _reanalysis_form(server, t),
    ])  # fmt: skip


def _reanalysis_form(server: Server, t: dict[str, Any]) -> html.Details:
    """Re-analyse with other detector thresholds (``nsysan report --set``'s, one a line), for those
    the server lets (``--reanalyse-by``). What changes of each finding is written into its thread."""
    lines = "\n".join(f"{kind}.{param}={value}" for kind, params in sorted(t["settings"].items())
                      for param, value in sorted(params.items()))  # fmt: skip
    allowed = server.may_reanalyse()
    return html.Details(className="reanalyse", children=[
        html.Summary("Re-analyse with other settings"),
        html.P(["Detector thresholds, one KIND.PARAM=VALUE a line (", html.Code("nsysan detectors"),
                " lists them); empty for the defaults. Findings keep their review; what changes of each is "
                "written into its thread."], className="hint"),
        dcc.Textarea(id=ids.REANALYSE_SETTINGS, value=lines, className="text",
                     placeholder="comm_compute_slowdown.min_ratio=1.3", disabled=not allowed),
        html.Button("Re-analyse", id=ids.REANALYSE, n_clicks=0, disabled=not allowed),
        html.Div(None if allowed else html.P("This server lets only some users re-analyse traces.", className="hint"),
                 id=ids.REANALYSE_MESSAGE),
    ])  # fmt: skip


def reanalyse(server: Server, trace_id: int, text: str | None) -> tuple[Any, bool]:
    """Queue the trace's analysis with the settings typed (checked first: one line says what is
    wrong, and nothing is queued); the message and whether the page stops polling (it polls while
    the analysis runs, and redraws when it is done)."""
    if not server.may_reanalyse():
        return html.P("Not re-analysed: this server lets only some users re-analyse traces.", className="error"), True
    try:
        if text is not None and not isinstance(text, str):
            raise InputError("the settings are not text; reload the page")
        lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
        if len(lines) > MAX_SETTINGS:
            raise InputError(f"at most {MAX_SETTINGS} settings")
        if any(len(line) > MAX_SETTING_CHARS for line in lines):
            raise InputError(f"a setting of over {MAX_SETTING_CHARS} characters")
        settings = parse_settings(lines)
        raised = raised_limits(settings)
        if raised:
            raise InputError(f"{', '.join(raised)} raises a limit on the memory or work an analysis takes, which the "
                             "dashboard never raises (lower it, or use nsysan report --set on your own machine)")  # fmt: skip
        server.analysis.reanalyse(trace_id, settings)
    except (InputError, NotFound) as exc:
        return html.P(f"Not re-analysed: {str(exc).removeprefix('--set ')}", className="error"), True
    said = ", ".join(lines) or "the default settings"
    return html.P(f"Re-analysing with {said}; the page updates when it is done.", className="ok"), False


def register(app: dash.Dash, server: Server) -> None:
    @app.callback(Output(BODY, "children"), Output(ids.TRACE_POLL, "disabled"), Output(SUMMARY, "children"),
                  Output(DETAILS, "children"), Output(TIMELINE_READY, "data"), Input(ids.TRACE_POLL, "n_intervals"),
                  State(ids.TRACE_ID, "data"),
                  State(VIEW, "data"),
                  prevent_initial_call=True)  # fmt: skip
    def _poll(_n: int, trace_id: int, view: dict[str, Any] | None) -> Any:
        """Cheap on every tick: a tick whose answer took longer than the interval would be dropped
        for the next one, and a page whose every answer is late would never be drawn; the drawing
        is :func:`_draw`'s, once the timeline is built."""
        t = server.store.trace(trace_id)
        waiting = _waiting(server, t)
        if waiting is None:
            return dash.no_update, True, dash.no_update, dash.no_update, trace_id
        body, final = waiting
        if not final:
            return body, final, dash.no_update, dash.no_update, dash.no_update
        return body, final, _summary(server, t), _details(server, t), dash.no_update

    @app.callback(Output(BODY, "children", allow_duplicate=True), Output(SUMMARY, "children", allow_duplicate=True),
                  Output(DETAILS, "children", allow_duplicate=True),
                  Output(ids.TRACE_POLL, "disabled", allow_duplicate=True), Input(TIMELINE_READY, "data"),
                  State(VIEW, "data"), prevent_initial_call=True)  # fmt: skip
    def _draw(trace_id: int | None, view: dict[str, Any] | None) -> Any:
        if trace_id is None:
            return dash.no_update, dash.no_update, dash.no_update, dash.no_update
        try:
            t = server.store.trace(trace_id)
            body, final = _body(server, t, view or {})
            return body, _summary(server, t), _details(server, t), final  # not final: evicted, the poll resumes
        except Exception:  # the poll stopped when it saw the timeline ready: let it try again
            log.exception("trace %s: drawing the page failed; polling again", trace_id)
            return dash.no_update, dash.no_update, dash.no_update, False

    @app.callback(Output(ids.TIMELINE, "figure"), Output(VIEW, "data"), Output(EVIDENCE, "children"),
                  Input(ids.TIMELINE, "relayoutData"), State(ids.TRACE_ID, "data"), State(VIEW, "data"),
                  prevent_initial_call=True)  # fmt: skip
    def _zoom(relayout: dict[str, Any] | None, trace_id: int, view: dict[str, Any] | None) -> Any:
        data = server.timelines.peek(trace_id)
        window = _relayout_window(relayout)
        if data is None or window is None:
            return dash.no_update, dash.no_update, dash.no_update
        view = dict(view or {})
        if isinstance(window, tuple):
            view["t0"], view["t1"] = window
        else:  # reset: the whole trace (or the selected finding's window)
            view.pop("t0", None), view.pop("t1", None)
        return _view_outputs(server, data, trace_id, view)

    @app.callback(Output(ids.TIMELINE, "figure", allow_duplicate=True), Output(VIEW, "data", allow_duplicate=True),
                  Output(EVIDENCE, "children", allow_duplicate=True), Input(ids.TIMELINE, "clickData"),
                  Input(ids.TIMELINE, "clickAnnotationData"), State(ids.TRACE_ID, "data"),
                  prevent_initial_call=True)  # fmt: skip
    def _select(click: dict[str, Any] | None, annotation: dict[str, Any] | None, trace_id: int) -> Any:
        """A click on a marker (its ▼ annotation, or the point under it) selects its finding: zoomed
        to it, its evidence drawn and listed."""
        if dash.ctx.triggered_prop_ids and any(p.endswith("clickAnnotationData") for p in dash.ctx.triggered_prop_ids):
            finding_id = clicked_annotation(annotation)
        else:
            finding_id = (click or {}).get("points", [{}])[0].get("customdata")
        data = server.timelines.peek(trace_id)
        if not isinstance(finding_id, int) or data is None:
            return dash.no_update, dash.no_update, dash.no_update
        return _view_outputs(server, data, trace_id, {"finding": finding_id})

    @app.callback(Output(ids.TIMELINE, "figure", allow_duplicate=True), Output(VIEW, "data", allow_duplicate=True),
                  Output(EVIDENCE, "children", allow_duplicate=True),
                  Input({"type": EVIDENCE_TIME, "index": ALL}, "n_clicks"), State(ids.TRACE_ID, "data"),
                  State(VIEW, "data"), prevent_initial_call=True)  # fmt: skip
    def _zoom_to_evidence(clicks: list[int | None], trace_id: int, view: dict[str, Any] | None) -> Any:
        """A time in the evidence clicked: the timeline zooms to it (a window of the finding's length each side)."""
        trigger = dash.ctx.triggered_id
        data = server.timelines.peek(trace_id)
        if not isinstance(trigger, dict) or not any(clicks) or data is None or not (view or {}).get("finding"):
            return dash.no_update, dash.no_update, dash.no_update
        finding = _finding(server, trace_id, view["finding"])  # type: ignore[index]
        items = evidence_items(data, finding) if finding else []
        index = int(trigger.get("index", -1))
        if finding is None or not 0 <= index < len(items) or items[index]["ms"] is None:
            return dash.no_update, dash.no_update, dash.no_update
        at = items[index]["ms"]
        half = max((finding["end_ns"] - finding["start_ns"]) / 1e6, 0.5)
        return _view_outputs(server, data, trace_id, {"finding": finding["id"], "t0": at - half, "t1": at + half})

    @app.callback(Output(ids.TIMELINE, "figure", allow_duplicate=True), Output(VIEW, "data", allow_duplicate=True),
                  Output(EVIDENCE, "children", allow_duplicate=True), Input(ids.STEP_BREAKDOWN, "clickData"),
                  State(ids.TRACE_ID, "data"), State(VIEW, "data"), prevent_initial_call=True)  # fmt: skip
    def _zoom_to_step(click: dict[str, Any] | None, trace_id: int, view: dict[str, Any] | None) -> Any:
        """A bar of the step breakdown clicked: the timeline zooms to that rank's step."""
        data = server.timelines.peek(trace_id)
        shown = step_view(data, stored_steps(server.store, trace_id), click, view) if data is not None else None
        if data is None or shown is None:
            return dash.no_update, dash.no_update, dash.no_update
        return _view_outputs(server, data, trace_id, shown)

    # the view into the address bar without a reload or a new history entry (a shared link reopens it)
    app.clientside_callback(
        "function(view) { if (!view) { return ''; }"
        " var q = []; if (view.t0 !== undefined && view.t1 !== undefined) { q.push('t0=' + (+view.t0).toFixed(6)"
        ".replace(/\\.?0+$/, '')); q.push('t1=' + (+view.t1).toFixed(6).replace(/\\.?0+$/, '')); }"
        " if (view.finding !== undefined && view.finding !== null) { q.push('finding=' + view.finding); }"
        " var s = q.length ? '?' + q.join('&') : '';"
        " if (window.location.search !== s) { window.history.replaceState(window.history.state, '',"
        " window.location.pathname + s); } return s; }",
        Output(URL_SYNC, "data"),
        Input(VIEW, "data"),
    )

    @app.callback(Output(ids.REANALYSE_MESSAGE, "children"), Output(ids.TRACE_POLL, "disabled", allow_duplicate=True),
                  Input(ids.REANALYSE, "n_clicks"), State(ids.REANALYSE_SETTINGS, "value"), State(ids.TRACE_ID, "data"),
                  prevent_initial_call=True)  # fmt: skip
    def _reanalyse(_n: int, text: str | None, trace_id: int) -> Any:
        return reanalyse(server, trace_id, text)

    @app.callback(Output(ids.NOTES, "children"), Output(ids.NOTE_TEXT, "value"), Input(ids.NOTE_ADD, "n_clicks"),
                  State(ids.NOTE_TEXT, "value"), State(ids.TRACE_ID, "data"), State(ids.AUTHOR, "value"),
                  prevent_initial_call=True)  # fmt: skip
    def _add_note(_n: int, text: str | None, trace_id: int, author: str | None) -> Any:
        text = (text or "").strip()
        if not text:
            return dash.no_update, dash.no_update
        server.store.note(trace_id, server.author(author), text)
        return _notes(server, trace_id), ""


def clicked_annotation(annotation: dict[str, Any] | None) -> int | None:
    """The finding id of a clicked marker annotation (named ``finding-<id>`` by the timeline)."""
    name = ((annotation or {}).get("annotation") or {}).get("name")
    m = re.fullmatch("finding-([0-9]{1,15})", name) if isinstance(name, str) else None
    return int(m[1]) if m else None


def _relayout_window(relayout: dict[str, Any] | None) -> tuple[float, float] | str | None:
    """The x range (ms) plotly's relayoutData asks for; "auto" for a reset; None for anything else."""
    if not relayout:
        return None
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        lo, hi = relayout["xaxis.range[0]"], relayout["xaxis.range[1]"]
    elif isinstance(relayout.get("xaxis.range"), list) and len(relayout["xaxis.range"]) == 2:
        lo, hi = relayout["xaxis.range"]
    elif relayout.get("xaxis.autorange"):
        return "auto"
    else:
        return None
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        return None
    return (lo, hi) if hi > lo else None


# -- the timeline and its selected finding ----------------------------------------------------


def _finding(server: Server, trace_id: int, finding_id: Any) -> dict[str, Any] | None:
    if not isinstance(finding_id, int):
        return None
    for f in server.store.findings(trace_id):
        if f["id"] == finding_id:
            return f
    return None


def _window(data: TimelineData, view: dict[str, Any], finding: dict[str, Any] | None) -> tuple[int, int] | None:
    """The job-clock window a view shows: its t0/t1 (ms since the first activity), else around its finding."""
    if view.get("t0") is not None and view.get("t1") is not None:
        return int(data.origin_ns + view["t0"] * 1e6), int(data.origin_ns + view["t1"] * 1e6)
    return data.window_for(finding) if finding else None


def _view_outputs(server: Server, data: TimelineData, trace_id: int, view: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Figure, view and evidence panel for a view (a view naming an unknown finding drops it)."""
    findings = server.store.findings(trace_id)
    finding = next((f for f in findings if f["id"] == view.get("finding")), None)
    if finding is None:
        view = {k: v for k, v in view.items() if k != "finding"}
    window = _window(data, view, finding)
    figure = data.figure(window, findings, highlight=finding)
    return figure, view, _evidence(data, trace_id, finding, findings, window)


def _waiting(server: Server, t: dict[str, Any]) -> tuple[Any, bool] | None:
    """What the timeline part of the page says while there is no timeline to draw, and whether
    that is final (nothing left to poll for); None once the timeline is built."""
    trace_id = t["id"]
    if t["status"] == "failed":
        return html.P(f"Analysis failed: {t['error']}", className="error"), True
    working = server.analysis.working(trace_id)
    if t["status"] != "ready" or working:
        return html.P(f"Analysing: {working.describe() if working else t['status']}…", className="status loading",
                      id=LOADING), False  # fmt: skip
    if server.timelines.peek(trace_id) is not None:
        return None
    failure = server.timelines.failure(trace_id)
    if failure is not None and not server.timelines.building(trace_id):
        return html.P(f"No timeline: {failure}", className="error"), True
    server.timelines.prepare(trace_id)  # in the background; the poll picks it up
    return html.P("Building the timeline… (reading the trace's kernels, copies and NVTX ranges; the page "
                  "updates by itself)", className="status loading", id=LOADING), False  # fmt: skip


def _body(server: Server, t: dict[str, Any], view: dict[str, Any]) -> tuple[Any, bool]:
    """The timeline part of the page, and whether it is final (nothing left to poll for)."""
    waiting = _waiting(server, t)
    if waiting is not None:
        return waiting
    trace_id = t["id"]
    data = server.timelines.peek(trace_id)
    if data is None:  # evicted between the two looks: the next poll builds it again
        return html.P("Building the timeline…", className="status loading", id=LOADING), False
    figure, view, evidence = _view_outputs(server, data, trace_id, view)
    return [
        html.H2("Timeline"),
        html.P(f"{data.intervals:,} kernels, copies, NVTX ranges and CUDA API calls in {len(data.rows)} rows; time in "
               "ms since the trace's first activity. Zoom in to see every one; zoomed out, a row that would show more than 2,000 "
               "is drawn as its busy share. Click a ▼ to select its finding.", className="hint"),
        _legend(),
        dcc.Graph(id=ids.TIMELINE, figure=figure, config={"displaylogo": False, "scrollZoom": True}),
        html.Div(evidence, id=EVIDENCE, className="overview-evidence"),
    ], True  # fmt: skip


def _legend() -> html.Div:
    swatch = lambda colour, cls="swatch": html.Span(className=cls, style={"background": colour})  # noqa: E731
    items = [html.Span([swatch(LANE_COLOURS[lane]), f"{lane}"], className="item") for lane in LANES]
    items.append(html.Span([swatch(f"linear-gradient(90deg, {LANE_COLOURS['compute']} 50%, {LANE_SHADES['compute']} 50%)"),
                            "every other bar of a stream darker"], className="item"))  # fmt: skip
    items.append(html.Span([swatch("linear-gradient(90deg, #eef1f5, #1f77b4)"), "busy share (zoomed out)"],
                           className="item"))  # fmt: skip
    items += [html.Span([html.Span("▼", className="marker", style={"color": SEVERITY_COLOURS[s]}), f"{s} finding"],
                        className="item") for s in ("critical", "warning", "info")]  # fmt: skip
    items.append(html.Span([html.Span("▼×N", className="marker"), "N occurrences of one problem on that row"],
                           className="item"))  # fmt: skip
    items.append(html.Span([swatch("#d62728"), "evidence of the selected finding"], className="item"))
    return html.Div(items, id=LEGEND, className="timeline-legend")


def _evidence(data: TimelineData, trace_id: int, finding: dict[str, Any] | None, findings: list[dict[str, Any]],
              window: tuple[int, int] | None) -> Any:  # fmt: skip
    """The selected finding: what the timeline draws for it, its evidence on the page's clock, and
    its group's previous and next occurrence."""
    if finding is None:
        return html.P("Select a finding (a ▼ on the timeline, or “show” under What is wrong) to see its evidence here.",
                      className="hint")  # fmt: skip
    drawn = data.evidence_drawn(finding, window)
    rank = finding.get("rank")
    shaded = f"its window is shaded on rank {rank}" if rank is not None else "its window is shaded"
    if drawn:
        header = f"Drawn red: {'; '.join(drawn)}; {shaded}."
    elif data.evidence_intervals(finding).size:
        header = f"The ops its evidence names are outside this window (zoom out or click a time below); {shaded}."
    else:
        header = f"Its evidence names no kernel or copy to draw; {shaded}."
    items = evidence_items(data, finding)
    rows = []
    for i, item in enumerate(items):
        value: Any = item["text"]
        if item["ms"] is not None:
            value = html.Button(item["text"], id={"type": EVIDENCE_TIME, "index": i}, n_clicks=0,
                                className="evidence-time", title="zoom the timeline to this time")  # fmt: skip
        rows.append(html.Tr([html.Th(item["key"]), cell(value)]))
    same = sorted((f for f in findings if finding.get("group") and f.get("group") == finding["group"]),
                  key=lambda f: (f["start_ns"], f["id"]))  # fmt: skip
    at = next((i for i, f in enumerate(same) if f["id"] == finding["id"]), None)
    nav: list[Any] = []
    if at is not None and len(same) > 1:
        before, after = same[at - 1] if at > 0 else None, same[at + 1] if at + 1 < len(same) else None
        nav = [html.Span(f"Occurrence {at + 1} of {len(same)} of this group: "),
               dcc.Link("← previous", href=f"/traces/{trace_id}?finding={before['id']}", className="prev")
               if before else html.Span("← previous", className="disabled"), " · ",
               dcc.Link("next →", href=f"/traces/{trace_id}?finding={after['id']}", className="next")
               if after else html.Span("next →", className="disabled")]  # fmt: skip
    return html.Div([
        html.H2(["Selected: ", severity_badge(finding["severity"]), " ", finding["title"]]),
        html.P(header, className="evidence-header"),
        html.P([*nav, " · " if nav else "", dcc.Link("open the finding to review it", href=f"/findings/{finding['id']}"),
                " · ", dcc.Link("clear the selection", href=f"/traces/{trace_id}")], className="meta"),
        html.Table(html.Tbody(rows), className="evidence-table"),
    ])  # fmt: skip


# -- the summary from the stored document ------------------------------------------------------


def stored_summary(server: Server, trace_id: int) -> dict[str, Any]:
    """The summary of the trace's report document, as the store keeps it (``ReviewStore.save_analysis``)."""
    from nsysan.store.models import TraceRecord

    with server.store.session() as s:
        record = s.get(TraceRecord, trace_id)
        return dict(record.summary or {}) if record is not None else {}


def device_rows(summary: dict[str, Any], data: TimelineData | None) -> list[dict[str, Any]]:
    """Per GPU: the report's figures (kernels, kernel time, busy, span, busy %) and, from the
    timeline when it is built, NCCL's share of the kernel time and the time in copies."""
    lanes = data.lane_ns() if data is not None else None
    out = []
    for d in summary.get("devices", []):
        ranks = [int(r) for r in str(d.get("ranks") or "").split(",") if r.strip().isdigit()]
        row = dict(d) | {"rank_list": ranks, "nccl_ns": None, "copy_ns": None, "nccl_share": None}
        if lanes is not None and ranks:
            mine = lanes[lanes["rank"].isin(ranks) & (lanes["device"] == d["device"]).fillna(False)]
            row["nccl_ns"] = int(mine.loc[mine["lane"] == "NCCL", "ns"].sum())
            row["copy_ns"] = int(mine.loc[mine["lane"] == "copies", "ns"].sum())
            row["nccl_share"] = 100.0 * row["nccl_ns"] / d["kernel_ns"] if d.get("kernel_ns") else None
        out.append(row)
    return out


def _summary(server: Server, t: dict[str, Any]) -> Any:
    """Above the timeline: what the capture cannot show, and what is wrong (the groups, worst first)."""
    summary = stored_summary(server, t["id"]) if t["status"] == "ready" else None
    if not summary:
        return []
    return [*_blind_spots(summary), html.H2("What is wrong"), _groups(t["id"], server.store.findings(t["id"]), summary)]


def _details(server: Server, t: dict[str, Any]) -> Any:
    """Below the timeline: what the trace is, per GPU, per step, by kernel, NCCL op and copy."""
    summary = stored_summary(server, t["id"]) if t["status"] == "ready" else None
    if not summary:
        return []
    data = server.timelines.peek(t["id"])
    parts: list[Any] = [html.H2("What this trace is"), _device_table(summary, data),
                        _step_breakdown(stored_steps(server.store, t["id"]))]  # fmt: skip
    for table in tables({"summary": summary}):
        if table.title in _SHOWN_TABLES:
            parts.append(html.Details([html.Summary(table.title), _table(table)], open=table.title != "Memory copies",
                                      className="summary-table"))  # fmt: skip
    return parts


def _blind_spots(summary: dict[str, Any]) -> list[Any]:
    """What the capture cannot show; said loudly when no kernel was recorded, since then no finding
    is not the same as nothing wrong."""
    notes = summary.get("limitations", [])
    kernels = sum(int(e.get("kernels") or 0) for e in summary.get("exports", []))
    out: list[Any] = []
    if kernels == 0:
        out.append(html.P("This capture recorded no kernels: the GPU detectors had nothing to look at, so no "
                          "finding here does not mean nothing is wrong.", className="blind warning"))  # fmt: skip
    if notes:
        out.append(html.Div([html.H3("What this capture cannot show"),
                             html.Ul([html.Li(_with_code(n)) for n in notes])], id=LIMITATIONS, className="blind"))  # fmt: skip
    return out


def _with_code(text: str) -> list[Any]:
    """A note with its `backticked` capture options as code."""
    return [html.Code(p) if i % 2 else p for i, p in enumerate(text.split("`")) if p]


def _device_table(summary: dict[str, Any], data: TimelineData | None) -> Any:
    rows = device_rows(summary, data)
    if not rows:
        return html.P("No GPU activity recorded.", className="hint")
    step = _step_ns(summary)
    head = ["rank", "GPU", "kernels", "kernel time", "busy", "span", "busy %", "NCCL share of kernel time", "copies"]
    body = []
    for r in rows:
        cells = [
            (r["ranks"] or "–", None), (str(r["device"]), None), (str(r["kernels"]), r["kernels"]),
            (fmt.duration(r["kernel_ns"]), r["kernel_ns"]), (fmt.duration(r["busy_ns"]), r["busy_ns"]),
            (fmt.duration(r["span_ns"]), r["span_ns"]), (fmt.percent(r["busy_pct"]), r["busy_pct"]),
            (fmt.percent(r["nccl_share"]) if r["nccl_share"] is not None else "–", r["nccl_share"]),
            (fmt.duration(r["copy_ns"]) if r["copy_ns"] is not None else "–", r["copy_ns"]),
        ]  # fmt: skip
        body.append(html.Tr([html.Td(text, **_data(value=raw)) for text, raw in cells], **_data(export=r["export"])))
    if step:
        note = f"Step time (mean of the NVTX ranges called step…): {fmt.duration(step)}."
    else:
        note = "Step time unknown: no NVTX range called step… (annotate each step with one to see it)."
    nccl_note = "" if data is not None else " NCCL share and copies appear once the timeline is built."
    return html.Div([
        html.H3("Per GPU"),
        html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)], id=DEVICE_TABLE,
                   className="summary"),
        html.P(note, className="hint"),
        html.P("Busy % is kernels and copies over the GPU's span, as in nsysan report; NCCL share is NCCL kernel "
               "time over all kernel time on that GPU." + nccl_note, className="hint"),
    ])  # fmt: skip


def _step_breakdown(steps: dict[str, Any] | None) -> html.Div:
    """Where each rank's step time went (the document's steps section), or one line saying why not."""
    why = breakdown.unavailable(steps)
    if why is not None or steps is None:
        return html.Div([html.H3("Where step time went"), html.P(why, id=ids.STEP_BREAKDOWN_NOTE, className="hint")])
    return html.Div([
        html.H3("Where step time went"),
        dcc.Graph(id=ids.STEP_BREAKDOWN, figure=breakdown.figure(steps), config={"displaylogo": False}),
        html.P(breakdown.caption(steps), className="hint"),
    ])  # fmt: skip


def step_view(data: TimelineData, steps: dict[str, Any] | None, click: dict[str, Any] | None,
              view: dict[str, Any] | None) -> dict[str, Any] | None:  # fmt: skip
    """The view that shows the step whose bar was clicked: its window (from the stored steps
    section) on the timeline's clock, ms since the first activity, the selected finding kept; None
    when the click names no step there is."""
    clicked = breakdown.clicked_step(click)
    window = breakdown.step_window(steps, *clicked) if clicked is not None else None
    if clicked is None or window is None:
        return None
    rank, (start, end) = clicked[0], window
    t0, t1 = (data.ms_since_origin(data.to_job_clock({"rank": rank}, ns)) for ns in (start, end))
    pad = (t1 - t0) * 0.05
    return {**(view or {}), "t0": t0 - pad, "t1": t1 + pad}


def _data(**values: Any) -> Any:
    """``data-*`` attributes (the raw figure behind a formatted cell, for tests and scripts); None: none."""
    return {f"data-{k}": repr(v) if isinstance(v, float) else str(v) for k, v in values.items() if v is not None}


def _step_ns(summary: dict[str, Any]) -> float | None:
    rows = [r for r in summary.get("nvtx_ranges", []) if str(r.get("range", "")).lower().startswith("step")]
    count = sum(r["count"] for r in rows)
    return sum(r["total_ns"] for r in rows) / count if count else None


def _table(table: Any) -> html.Table:
    if not table.rows:
        return html.Table(html.Tbody(html.Tr(html.Td(table.empty, className="hint"))), className="summary")
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in table.headers])),
                       html.Tbody([html.Tr([cell(c) for c in row]) for row in table.rows])], className="summary")  # fmt: skip


def _groups(trace_id: int, findings: list[dict[str, Any]], summary: dict[str, Any]) -> Any:
    """The problems, worst first (severity, then the time their fix would recover). Warnings and
    criticals are all listed; past the first :data:`INFO_GROUPS_SHOWN`, info groups fold into a
    closed list below, so that the timeline stays near the top of the page with dozens of groups."""
    if not findings:
        kernels = sum(int(e.get("kernels") or 0) for e in summary.get("exports", []))
        text = "No findings." if kernels else "No findings, but see above: this capture shows no kernels to check."
        return html.P(text, className="hint")
    groups = fold_groups([{"kind": "", "impact_ns": 0} | f for f in findings])
    total = sum(g["impact_ns"] for g in groups)
    rows = [_group_row(trace_id, findings, g) for g in groups]
    info = [i for i, g in enumerate(groups) if g["severity"] == "info"][INFO_GROUPS_SHOWN:]
    folded = set(info)
    shown = [r for i, r in enumerate(rows) if i not in folded]
    head = html.Thead(html.Tr([html.Th(h) for h in ("", "kind", "worst occurrence", "occurrences", "total impact",
                                                     "recoverable", "ranks", "")]))  # fmt: skip
    parts: list[Any] = [
        html.P(f"{len(groups)} problem(s), {len(findings)} finding(s), {fmt.duration(total)} lost in all "
               "(impacts overlap across ranks, so this total is an upper bound). Recoverable: the job's wall time "
               "the fix would save, replayed across ranks.", className="meta"),
        html.Table([head, html.Tbody(shown)], id=GROUPS_TABLE, className="summary"),
    ]  # fmt: skip
    if info:
        parts.append(html.Details([
            html.Summary(f"{len(info)} more info problem(s), below the warning share of the job's time"),
            html.Table([head, html.Tbody([rows[i] for i in info])], id=MORE_GROUPS_TABLE, className="summary"),
        ], id=MORE_GROUPS))  # fmt: skip
    return html.Div(parts)


def _group_row(trace_id: int, findings: list[dict[str, Any]], g: dict[str, Any]) -> html.Tr:
    worst = findings[g["worst"]]
    members = [findings[i] for i in g["findings"]]
    ranks = sorted({m["rank"] for m in members if m.get("rank") is not None})
    recoverable = recoverable_ns(members)  # None: stored from a report before recoverable time
    return html.Tr([
        html.Td(severity_badge(g["severity"])), html.Td(g["kind"], className="kind"), cell(worst["title"]),
        html.Td(str(g["count"]), className="count"),
        html.Td(fmt.duration(g["impact_ns"]), className="impact", **_data(value=g["impact_ns"])),
        html.Td(fmt.duration(recoverable), className="recoverable", **_data(value=recoverable)),
        html.Td(fmt.ranks(ranks)),
        html.Td([dcc.Link("show", href=f"/traces/{trace_id}?finding={worst['id']}"), " · ",
                 dcc.Link("open", href=f"/findings/{worst['id']}")]),
    ], **_data(group=g["group"] or f"#{worst['id']}"))  # fmt: skip


def _notes(server: Server, trace_id: int) -> Any:
    return thread(server.store.notes(trace_id), "note", "No notes yet.")
