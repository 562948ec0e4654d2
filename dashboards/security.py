"""Hardening of the dashboard's HTTP surface, for every request whether or not login is on.

* **Origin check**: a POST (a Dash callback, an upload, the login form) that a browser sends from
  another site is refused with 403 before anything reads it: its ``Origin`` must name this server's
  own host, and ``Sec-Fetch-Site``, when sent, must say ``same-origin``. A POST with neither header
  is let through: browsers send ``Origin`` with every POST, so only a non-browser client (curl, a
  script) sends none, and such a client has no user's cookie to ride on (the session cookie is
  SameSite=Lax besides). Behind a reverse proxy the proxy must pass the browser's ``Host`` on.
* **Body limits before reading**: a request whose ``Content-Length`` is over its limit is refused
  before its body is read (nothing is buffered); the same limit caps a body sent without a length.
  Dash sends an upload base64-encoded inside a callback's JSON, so the callback route accepts the
  upload limit (plus its base64 growth); any other POST is small.
* **Callback payload checks**: a comment, note or assignee over its length, or an id in a
  callback's state that is not a small whole number, is answered with a message in the page and
  never reaches the store.
* **Headers**: no framing (``X-Frame-Options`` and CSP ``frame-ancestors``), a Content Security
  Policy that allows only this server's scripts (and Dash's own inline ones, by hash),
  ``nosniff`` and a same-origin referrer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import flask
from werkzeug.wrappers import Response

from dashboards import ids
from nsysan.store.store import MAX_NAME_CHARS, MAX_TEXT_CHARS

CALLBACK_PATH = "/_dash-update-component"
UPLOAD_PATH = "/upload"  # multipart uploads, streamed to disk: the library page's and scripts'
SMALL_BODY = 64 * 2**10  # any POST but a callback: the login form
CALLBACK_BODY = 2**20  # the most a callback's JSON may be (uploads go to UPLOAD_PATH, not through callbacks)
NOTICE = "notice"  # the shell's message area, for what a refused callback should say

# text a reviewer types: (what it is called, most characters)
FIELD_LIMITS: dict[str, tuple[str, int]] = {
    ids.COMMENT_TEXT: ("comment", MAX_TEXT_CHARS),
    ids.NOTE_TEXT: ("note", MAX_TEXT_CHARS),
    ids.ASSIGNEE: ("assignee", MAX_NAME_CHARS),
    ids.AUTHOR: ("name", MAX_NAME_CHARS),
    ids.REANALYSE_SETTINGS: ("settings", 64 * 200),  # the form's limits: 64 lines of 200 characters
}
# components whose value is a trace's or finding's id (or a version): whole numbers, as routes allow
ID_FIELDS = frozenset({ids.TRACE_ID, ids.FINDING_ID, ids.FINDING_VERSION, ids.COMPARE_BEFORE, ids.COMPARE_AFTER})
MAX_ID = 10**15 - 1


class FieldTooLong(ValueError):
    pass


def check_length(component: str, value: Any) -> None:
    """Refuse a reviewer's text over its limit (:data:`FIELD_LIMITS`), with a message for them."""
    if component in FIELD_LIMITS and isinstance(value, str):
        what, most = FIELD_LIMITS[component]
        if len(value) > most:
            raise FieldTooLong(
                f"The {what} is too long ({len(value):,} characters; at most {most:,}): nothing was saved."
            )


def is_id(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID)


def install(app: Any, max_upload_bytes: int) -> None:
    """Everything above, on the Dash app's Flask server. Call after every callback is registered
    (the CSP names Dash's inline scripts by hash)."""
    server: flask.Flask = app.server
    callback_limit = CALLBACK_BODY
    upload_limit = max_upload_bytes + CALLBACK_BODY  # multipart: the files and a little framing
    server.config["MAX_CONTENT_LENGTH"] = max(callback_limit, upload_limit)  # the largest any request may be
    csp = content_security_policy(app.csp_hashes())

    # registered first, so these run before login and anything else reads the request
    server.before_request_funcs.setdefault(None, []).insert(0, _make_guard(callback_limit, upload_limit))

    @server.after_request
    def _headers(response: Response) -> Response:
        response.headers.setdefault("Content-Security-Policy", csp)
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Cross-Origin-Opener-Policy"] = "same-origin"
        return response


def content_security_policy(script_hashes: Sequence[str]) -> str:
    """Dash's renderer and components are served by this server; its one inline script (which
    starts the renderer) is allowed by its hash. Plotly and React set styles inline and Plotly
    draws with data: and blob: images, so those are allowed; nothing loads from elsewhere. The
    timeline's WebGL traces (Plotly's scattergl, drawn by regl) compile their shaders' glue code
    with ``Function``, so eval is allowed; inline scripts other than Dash's own still are not."""
    directives = {
        "default-src": ["'self'"],
        "script-src": ["'self'", "'unsafe-eval'", *script_hashes],  # Dash quotes its hashes itself
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:", "blob:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "worker-src": ["'self'", "blob:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
    return "; ".join(f"{name} {' '.join(values)}" for name, values in directives.items())


def same_origin(request: flask.Request) -> bool:
    """Whether a state-changing request may come from where it says it comes from (see above)."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    try:
        host = urlsplit(origin).netloc
    except ValueError:
        return False
    return bool(host) and host.lower() == request.host.lower()


def _make_guard(callback_limit: int, upload_limit: int) -> Any:
    def _guard() -> Response | None:
        request = flask.request
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return None
        if not same_origin(request):
            return _plain("refused: this request came from another site", 403)
        limit = {CALLBACK_PATH: callback_limit, UPLOAD_PATH: upload_limit}.get(request.path, SMALL_BODY)
        request.max_content_length = limit  # a body without Content-Length is cut off at the limit too
        if request.content_length is not None and request.content_length > limit:
            if request.path == CALLBACK_PATH:
                # say why in the page, without reading a byte
                return _dash_message(
                    f"Refused: {request.content_length / 2**20:.1f} MiB sent; a dashboard action may send "
                    f"{callback_limit / 2**20:.0f} MiB at most.",
                    status=413,
                )
            if request.path == UPLOAD_PATH:  # the library page shows this line as it is
                return _plain(
                    f"Upload refused: {request.content_length / 2**20:.1f} MiB sent; an upload may be "
                    f"{(upload_limit - CALLBACK_BODY) / 2**20:.0f} MiB in all.",
                    413,
                )
            return _plain(f"refused: the request is over {limit:,} bytes", 413)
        if request.path == CALLBACK_PATH:
            return _check_callback(request)
        return None

    return _guard


def _check_callback(request: flask.Request) -> Response | None:
    body = request.get_json(silent=True)  # cached: Dash reads the same parsed body
    if not isinstance(body, dict):
        return _plain("refused: not a Dash callback", 400)
    for component, prop, value in _values(body.get("inputs"), body.get("state")):
        if component in ID_FIELDS and prop in ("data", "value") and not is_id(value):
            return _dash_message("This page's state is damaged (not a valid id); reload the page.")
        try:
            if prop == "value":
                check_length(component, value)
        except FieldTooLong as exc:
            return _dash_message(str(exc))
    return None


def _values(*groups: Any) -> Iterable[tuple[str, str, Any]]:
    for group in groups:
        for item in group if isinstance(group, list) else []:
            for entry in item if isinstance(item, list) else [item]:  # pattern-matching callbacks: lists
                if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                    yield entry["id"], str(entry.get("property")), entry.get("value")


def _dash_message(text: str, status: int = 200) -> Response:
    """A callback's answer that changes none of its outputs and shows ``text`` in the shell's notice
    area. Answered 200 even when refused (``status`` is then in ``X-Nsysan-Refused``): the renderer
    shows nothing for an error status."""
    answer = flask.jsonify({"multi": True, "response": {}, "sideUpdate": {NOTICE: {"children": text}}})
    if status != 200:
        answer.headers["X-Nsysan-Refused"] = str(status)
    return answer


def _plain(text: str, status: int) -> Response:
    return Response(text + "\n", status=status, mimetype="text/plain")
