"""Login for the dashboard: required whenever it listens beyond loopback.

Users come from a TOML file (``[users]`` table of ``name = "<hash>"``) or the ``NSYSAN_USERS``
environment variable (``name=<hash>,name=<hash>``); hashes are werkzeug's salted scrypt/pbkdf2
(``nsysan hash-password`` makes one), so no password is ever stored in the clear. The session is a
signed cookie (HttpOnly, SameSite=Lax); its key comes from ``NSYSAN_SECRET_KEY`` or is drawn at
start-up, which logs everyone out when the server restarts.
"""

from __future__ import annotations

import html
import ipaddress
import os
import secrets
import sys
from pathlib import Path
from urllib.parse import quote, urlsplit

import flask
from werkzeug.security import check_password_hash, generate_password_hash
from werkzeug.wrappers import Response

from nsysan.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

USERS_ENV = "NSYSAN_USERS"
SECRET_ENV = "NSYSAN_SECRET_KEY"
_OPEN_PATHS = ("/login", "/favicon.ico")
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
        if "$" not in hashed:
            raise InputError(f"user {name!r}: the password must be a hash (`nsysan hash-password`), not the password")
    return users


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def install_loopback_only(server: flask.Flask) -> None:
    """Without login, answer only requests addressed to loopback: a web page elsewhere cannot reach
    the server by pointing its own host name at 127.0.0.1 (DNS rebinding)."""

    @server.before_request
    def _loopback_host() -> flask.Response | None:
        if flask.request.host.rsplit(":", 1)[0] in LOOPBACK_NAMES:
            return None
        return flask.Response("nsysan serves only http://127.0.0.1 or http://localhost without login", status=403)


def current_user() -> str | None:
    """The logged-in user of this request, or None when the server runs without login."""
    return flask.session.get("user") if flask.has_request_context() else None


def install_login(server: flask.Flask, users: dict[str, str]) -> None:
    """Every request needs a logged-in user, except the login page itself."""
    server.secret_key = os.environ.get(SECRET_ENV) or secrets.token_hex(32)
    server.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax")

    @server.before_request
    def _require_login() -> Response | None:
        if flask.request.path in _OPEN_PATHS or flask.session.get("user") in users:
            return None
        if flask.request.path.startswith("/_dash-") and flask.request.method == "POST":
            return flask.Response("login required", status=401)
        return flask.redirect(f"/login?next={quote(flask.request.full_path.rstrip('?'))}")

    @server.route("/login", methods=["GET", "POST"])
    def _login() -> Response | str:
        target = _safe_next(flask.request.values.get("next", "/"))
        error = ""
        if flask.request.method == "POST":
            name = flask.request.form.get("username", "")
            password = flask.request.form.get("password", "")
            if check_password_hash(users.get(name, _DUMMY_HASH), password) and name in users:
                flask.session.clear()
                flask.session["user"] = name
                return flask.redirect(target)
            error = "Wrong user name or password."
        return _LOGIN_PAGE.format(next=html.escape(target), error=html.escape(error))

    @server.route("/logout")
    def _logout() -> Response:
        flask.session.clear()
        return flask.redirect("/login")


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
<label>User name<input id="username" name="username" autocomplete="username" autofocus></label>
<label>Password<input id="password" name="password" type="password" autocomplete="current-password"></label>
<button id="login" type="submit">Log in</button></form></body></html>"""
