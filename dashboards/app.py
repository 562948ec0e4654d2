"""The Dash app behind ``nsysan serve``: a shell (navigation, who is reviewing) and a router.

Pages live one per module in ``dashboards/pages``; each has ``layout(server, ...)`` and
``register(app, server)``. Everything a page needs from the process (store, background analysis,
timelines, limits) is in one :class:`~dashboards.server.Server`; the app imports the pages, the
pages import the server, never the app. Pages address traces and findings by id only: a path
never comes from the browser.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any
from urllib.parse import parse_qs

import dash
import flask
from dash import Input, Output, dcc, html

from dashboards import auth, ids, security
from dashboards.library import UploadRefused, save_upload_streams, scan_directory
from dashboards.pages import compare, finding, findings, library, overview
from dashboards.server import Server
from nsysan.errors import NsysanError

_ID = "[0-9]{1,15}"  # ASCII digits only, and small enough for any database's integer
log = logging.getLogger(__name__)


def create_app(server: Server) -> dash.Dash:
    app = dash.Dash(__name__, title="nsysan", suppress_callback_exceptions=True, update_title="",
                    on_error=_callback_failed)  # fmt: skip
    if server.login_required:
        auth.install_login(app.server, server.users, session_hours=server.session_hours,
                           secure_cookies=server.secure_cookies)  # fmt: skip
    else:
        auth.install_loopback_only(app.server)
    app.layout = lambda: _shell(server)  # a function: built per request, so it knows who is logged in
    pages = {"library": library, "overview": overview, "findings": findings, "finding": finding, "compare": compare}

    @app.callback(Output(ids.PAGE, "children"), Output(security.NOTICE, "children"), Input(ids.URL, "pathname"),
                  Input(ids.URL, "search"))  # fmt: skip
    def _route(pathname: str | None, search: str | None) -> Any:
        return _page(pathname, search), None  # a new page: what the last one was told is cleared

    def _page(pathname: str | None, search: str | None) -> Any:
        name, params = route(pathname or "/", search or "")
        if name is None:
            return html.P(f"No page at {pathname}.", className="error")
        try:
            return pages[name].layout(server, **params)
        except NsysanError as exc:
            return html.P(str(exc), className="error")
        except Exception:
            log.exception("page %s%s", pathname, search or "")
            return html.P("This page failed; the server's log has the details.", className="error")

    for page in pages.values():
        page.register(app, server)

    @app.server.route(security.UPLOAD_PATH, methods=["POST"])
    def _upload() -> tuple[flask.Response, int]:
        """Upload exports as multipart form data (field ``files``, one per rank), streamed to disk:
        ``curl -F files=@report.sqlite http://host:8050/upload``."""
        files = flask.request.files.getlist("files")
        try:
            trace_id = save_upload_streams(server, [(f.filename or "", f.stream) for f in files])
        except UploadRefused as exc:
            return flask.jsonify(error=f"Upload refused: {exc}"), 400
        return flask.jsonify(trace_id=trace_id), 201

    # last: its checks run before everything else, and its CSP names every inline script
    security.install(app, server.max_upload_bytes)
    return app


def _callback_failed(exc: Exception) -> None:
    """A callback that raised: its outputs stay as they were and the shell says why, instead of an
    HTTP 500 the page would not show (a damaged id in the page's state, say)."""
    if isinstance(exc, NsysanError | security.FieldTooLong):
        message = str(exc)
    else:
        log.error("callback failed", exc_info=exc)
        message = "That action failed; the server's log has the details."
    dash.set_props(security.NOTICE, {"children": message})


def _shell(server: Server) -> html.Div:
    user = auth.current_user()
    # a form, not a link: only a POST logs out (a link elsewhere must not)
    who = ([html.Span(f"{user} · "), html.Form(html.Button("log out", id="logout", type="submit", className="link"),
                                               action="/logout", method="POST", className="logout")]
           if user else [])  # fmt: skip
    return html.Div(className="nsysan", children=[
        dcc.Location(id=ids.URL, refresh=False),
        html.Header(className="bar", children=[
            dcc.Link("nsysan", href="/", className="brand"),
            dcc.Link("Traces", href="/"),
            dcc.Link("Compare", href="/compare"),
            html.Span(className="spacer"),
            *who,
            # always present (callbacks read it); shown only when there is no login to name the reviewer
            html.Div(dcc.Input(id=ids.AUTHOR, placeholder="your name (for comments)", persistence=True,
                               persistence_type="local", debounce=True, className="author"), hidden=bool(user)),
        ]),
        html.Div(id=security.NOTICE, className="error", role="alert"),  # what a refused action says
        html.Main(id=ids.PAGE),
    ])  # fmt: skip


def route(pathname: str, search: str) -> tuple[str | None, dict[str, Any]]:
    """Which page a URL shows, and its parameters (ids as ints; anything else is not a page)."""
    if pathname in ("/", "/traces"):
        return "library", {}
    if m := re.fullmatch(rf"/traces/({_ID})", pathname):
        return "overview", {"trace_id": int(m[1])}
    if m := re.fullmatch(rf"/traces/({_ID})/findings", pathname):
        return "findings", {"trace_id": int(m[1])}
    if m := re.fullmatch(rf"/findings/({_ID})", pathname):
        return "finding", {"finding_id": int(m[1])}
    if pathname == "/compare":
        query = parse_qs(search.lstrip("?"))
        picked = {k: int(v[0]) for k, v in query.items() if k in ("before", "after") and re.fullmatch(_ID, v[0])}
        return "compare", picked
    return None, {}


SERVER_THREADS = 16


def start(server: Server, host: str, port: int) -> None:
    """Register what ``traces_dir`` holds, resume unfinished analyses, and serve until interrupted."""
    app = create_app(server)
    server.analysis.resume()
    if server.traces_dir is not None:
        for reason in scan_directory(server).errors:  # also listed in the library
            print(f"nsysan: not registered: {reason}", file=sys.stderr, flush=True)
    # waitress, not Flask's development server: no "do not use it in production" warning to teams, no
    # coloured line per request (each page polls every few seconds) in the log. Its threads answer
    # the pages; a page waiting for a timeline holds one, so there are more than waitress's 4.
    from waitress import serve

    try:
        serve(app.server, host=host, port=port, threads=SERVER_THREADS, ident="nsysan")
    finally:
        server.analysis.shutdown()
