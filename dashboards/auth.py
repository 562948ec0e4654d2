"""Login for the dashboard: required whenever it listens beyond loopback.

Users come from a TOML file (``[users]`` table of ``name = "<hash>"``) or the ``NSYSAN_USERS``
environment variable (``name=<hash>,name=<hash>``); hashes are werkzeug's salted scrypt/pbkdf2
(``nsysan hash-password`` makes one), so no password is ever stored in the clear.

Sessions live on the server (Flask-Session, in this process's memory): the cookie holds only a
random id (HttpOnly, SameSite=Lax, Secure with ``--secure-cookies``), logging out deletes the
session, and a session ends ``--session-hours`` after its login whatever it does (and sooner when
idle that long). Restarting the server logs everyone out. Logging in is limited per address and
user name (Flask-Limiter: a sixth wrong password within a minute is answered 429) and its form
carries a CSRF token (Flask-WTF), so another site cannot log a visitor in as someone else.
"""

from __future__ import annotations

import html
import ipaddress
import os
import re
import secrets
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote, urlsplit

import flask
from cachelib import SimpleCache
from flask_limiter import Limiter, RequestLimit
from flask_limiter.util import get_remote_address
from flask_session import Session
from flask_wtf.csrf import generate_csrf, validate_csrf
from werkzeug.security import check_password_hash, generate_password_hash
from werkzeug.wrappers import Response
from wtforms import ValidationError

from nsysan.errors import InputError
from nsysan.store.store import ANALYSIS_AUTHOR

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

USERS_ENV = "NSYSAN_USERS"
SECRET_ENV = "NSYSAN_SECRET_KEY"
_OPEN_PATHS = ("/login", "/favicon.ico")
DEFAULT_SESSION_HOURS = 12.0
LOGIN_LIMIT = "5 per minute"  # wrong passwords, per address and user name
LOGIN_ADDRESS_LIMIT = "30 per minute"  # wrong passwords, per address, whatever the user names
MAX_SESSIONS = 100_000  # kept in memory; beyond that the oldest are dropped
# checked when the name is unknown, so a wrong name costs as long as a wrong password
_DUMMY_HASH = generate_password_hash("nsysan-no-such-user")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hash_password(password: str) -> str:
    return generate_password_hash(password)


MAX_USER_NAME = 128  # the store keeps names (owners, authors) in columns of this size


def load_users(path: Path | None = None, env: str | None = None) -> dict[str, str]:
    """name -> password hash, from the file and/or the environment variable's value."""
    users: dict[str, str] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InputError(f"{path}: cannot read users ({exc})") from None
        table = data.get("users")
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise InputError(f'{path}: expected a [users] table of name = "<password hash>"')
        users.update(table)
    for item in (env or "").split(","):
        if item.strip():
            name, sep, hashed = item.strip().partition("=")
            if not sep or not name or not hashed:
                raise InputError(
                    f"{USERS_ENV}: expected name=<password hash>,... (make a hash with `nsysan hash-password`)"
                )
            users[name] = hashed
    for name, hashed in users.items():
        if len(name) > MAX_USER_NAME:
            raise InputError(f"user {name[:20]!r}…: a name of at most {MAX_USER_NAME} characters")
        if name == ANALYSIS_AUTHOR:
            raise InputError(f"user {name!r}: the name is nsysan's own, for what a re-analysis writes; choose another")
        if "$" not in hashed:
            raise InputError(f"user {name!r}: the password must be a hash (`nsysan hash-password`), not the password")
    return users


def addressed_to_loopback(host: str) -> bool:
    """Whether a request's ``Host`` (name and port) names this machine's loopback: ``localhost`` or
    a loopback address written out (127.0.0.0/8, ``[::1]``), so a server on 127.0.0.2 answers its
    own address. A domain name is never resolved here: one pointed at 127.0.0.1 is what DNS
    rebinding uses, and is refused."""
    bracketed = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::\d+)?", host)  # [IPv6] or [IPv6]:port, nothing else
    if bracketed:
        return is_loopback(bracketed.group(1))
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return is_loopback(name.lower())


def install_loopback_only(server: flask.Flask) -> None:
    """Without login, answer only requests addressed to loopback: a web page elsewhere cannot reach
    the server by pointing its own host name at 127.0.0.1 (DNS rebinding)."""

    @server.before_request
    def _loopback_host() -> flask.Response | None:
        if addressed_to_loopback(flask.request.host):
            return None
        return flask.Response(
            "nsysan serves only its loopback address (http://127.0.0.1, http://localhost) without login", status=403
        )


def current_user() -> str | None:
    """The logged-in user of this request, or None when the server runs without login."""
    return flask.session.get("user") if flask.has_request_context() else None


def install_login(server: flask.Flask, users: dict[str, str], *, session_hours: float = DEFAULT_SESSION_HOURS,
                  secure_cookies: bool = False) -> None:  # fmt: skip
    """Every request needs a logged-in user, except the login page itself."""
    lifetime = timedelta(hours=session_hours)
    server.secret_key = os.environ.get(SECRET_ENV) or secrets.token_hex(32)  # signs the CSRF token
    server.config.update(
        SESSION_TYPE="cachelib",
        SESSION_CACHELIB=SimpleCache(threshold=MAX_SESSIONS, default_timeout=int(lifetime.total_seconds())),
        SESSION_PERMANENT=True,
        PERMANENT_SESSION_LIFETIME=lifetime,
        SESSION_KEY_PREFIX="nsysan-session:",
        SESSION_COOKIE_NAME="nsysan_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=secure_cookies,
        WTF_CSRF_TIME_LIMIT=None,  # the token lives as long as the session it is kept in
    )
    Session(server)
    limiter = Limiter(get_remote_address, app=server, storage_uri="memory://", default_limits=[],
                      headers_enabled=True)  # fmt: skip

    def _logged_in() -> bool:
        since = flask.session.get("since")
        if flask.session.get("user") in users and isinstance(since, (int, float)):
            if _now() - since <= lifetime.total_seconds():
                return True
            flask.session.clear()  # expired: forgotten on the server too
        return False

    @server.before_request
    def _require_login() -> Response | None:
        if flask.request.path in _OPEN_PATHS or _logged_in():
            return None
        if flask.request.method not in ("GET", "HEAD"):  # a callback or an upload: no page to redirect
            return flask.Response("login required", status=401)
        return flask.redirect(f"/login?next={quote(flask.request.full_path.rstrip('?'))}")

    def _failed(response: Response) -> bool:
        return response.status_code != 302  # only a refused login counts against the limit

    def _address_and_name() -> str:
        return f"{get_remote_address()}|{flask.request.form.get('username', '')[:200]}"

    def _too_many(limit: RequestLimit) -> flask.Response:
        wait = max(int(limit.reset_at - time.time()), 1)
        error = f"Too many failed logins; try again in {wait} seconds."
        page = _login_page(_safe_next(flask.request.values.get("next", "/")), error)
        return flask.Response(page, status=429, headers={"Retry-After": str(wait)})

    @server.route("/login", methods=["GET", "POST"])
    @limiter.limit(LOGIN_LIMIT, key_func=_address_and_name, methods=["POST"], deduct_when=_failed,
                   on_breach=_too_many)  # fmt: skip
    @limiter.limit(LOGIN_ADDRESS_LIMIT, methods=["POST"], deduct_when=_failed, on_breach=_too_many)
    def _login() -> Response | str:
        target = _safe_next(flask.request.values.get("next", "/"))
        if flask.request.method == "POST":
            try:
                validate_csrf(flask.request.form.get("csrf_token", ""))
            except ValidationError:
                return flask.Response(_login_page(target, "The login form expired; log in again."), status=400)
            name = flask.request.form.get("username", "")
            password = flask.request.form.get("password", "")
            if check_password_hash(users.get(name, _DUMMY_HASH), password) and name in users:
                flask.session.clear()
                flask.session["user"] = name
                flask.session["since"] = _now()
                # a new id at login: an id planted before it (session fixation) is worth nothing
                server.session_interface.regenerate(flask.session)  # type: ignore[attr-defined]
                return flask.redirect(target)
            return flask.Response(_login_page(target, "Wrong user name or password."), status=401)
        return _login_page(target, "")

    @server.route("/logout", methods=["GET", "POST"])
    def _logout() -> Response | str:
        # only a POST logs out: a GET (a link or an image on another site) gets a page with the
        # button; a POST from another site is refused by its Origin before it gets here (security.py)
        if flask.request.method != "POST":
            return _LOGOUT_PAGE
        flask.session.clear()  # deletes the session on the server: its cookie is worth nothing now
        return flask.redirect("/login")


def _now() -> float:
    """The clock a login's age is read on (the tests move it on)."""
    return time.time()


def _login_page(target: str, error: str) -> str:
    return _LOGIN_PAGE.format(next=html.escape(target), error=html.escape(error), csrf=html.escape(generate_csrf()))


def _safe_next(target: str) -> str:
    """Only a path on this server: the login must not redirect elsewhere. Control characters and
    spaces are refused outright (browsers and werkzeug drop some, turning ``/\t/evil`` into ``//evil``)."""
    if not target.startswith("/") or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in target) or "\\" in target:
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or parts.path.startswith("//"):
        return "/"
    return parts.path + (f"?{parts.query}" if parts.query else "")


_LOGIN_PAGE = """<!doctype html>
<html><head><title>nsysan · log in</title>
<style>body{{font-family:sans-serif;max-width:22em;margin:5em auto}} input{{width:100%;margin:.3em 0 1em;padding:.4em}}
.error{{color:#b00}}</style></head>
<body><h1>nsysan</h1><p>Log in to review traces.</p><p class="error">{error}</p>
<form method="post" action="/login"><input type="hidden" name="next" value="{next}">
<input type="hidden" name="csrf_token" value="{csrf}">
<label>User name<input id="username" name="username" autocomplete="username" autofocus></label>
<label>Password<input id="password" name="password" type="password" autocomplete="current-password"></label>
<button id="login" type="submit">Log in</button></form></body></html>"""

_LOGOUT_PAGE = """<!doctype html>
<html><head><title>nsysan · log out</title>
<style>body{font-family:sans-serif;max-width:22em;margin:5em auto}</style></head>
<body><h1>nsysan</h1><form method="post" action="/logout"><button id="logout" type="submit">Log out</button></form>
<p><a href="/">Back to the traces</a></p></body></html>"""
