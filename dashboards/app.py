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
from dash import Input, Output, dcc, html

from dashboards import auth, ids
from dashboards.library import scan_directory
from dashboards.pages import compare, finding, findings, library, overview
from dashboards.server import Server
from nsysan.errors import NsysanError

_ID = "[0-9]{1,15}"  # ASCII digits only, and small enough for any database's integer
log = logging.getLogger(__name__)


def create_app(server: Server) -> dash.Dash:
    app = dash.Dash(__name__, title="nsysan", suppress_callback_exceptions=True, update_title="")
    # an upload arrives base64-encoded in a callback: leave room for a refusal with a reason (the
    # callback's own check); a request far beyond that is cut off by Flask with 413
    app.server.config["MAX_CONTENT_LENGTH"] = 2 * (server.max_upload_bytes * 4 // 3) + 2**20
    if server.login_required:
        auth.install_login(app.server, server.users)
    else:
        auth.install_loopback_only(app.server)
    app.layout = lambda: _shell(server)  # a function: built per request, so it knows who is logged in
    pages = {"library": library, "overview": overview, "findings": findings, "finding": finding, "compare": compare}

    @app.callback(Output(ids.PAGE, "children"), Input(ids.URL, "pathname"), Input(ids.URL, "search"))
    def _route(pathname: str | None, search: str | None) -> Any:
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
    return app


def _shell(server: Server) -> html.Div:
    user = auth.current_user()
    who = [html.Span(f"{user} · "), html.A("log out", href="/logout")] if user else []
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


def start(server: Server, host: str, port: int) -> None:
    """Register what ``traces_dir`` holds, resume unfinished analyses, and serve until interrupted."""
    app = create_app(server)
    server.analysis.resume()
    if server.traces_dir is not None:
        for reason in scan_directory(server).errors:  # also listed in the library
            print(f"nsysan: not registered: {reason}", file=sys.stderr, flush=True)
    try:
        app.run(host=host, port=port, debug=False)
    finally:
        server.analysis.shutdown()
