"""The dashboard's HTTP surface under attack, through the real app (Flask's test client) and, for the
memory probe, a real ``nsysan serve`` process: every probe of issue 12's hardening item is refused."""

from __future__ import annotations

import http.client
import io
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from dashboards import ids, security
from dashboards.app import create_app
from dashboards.auth import hash_password
from dashboards.server import Server
from fixtures.samples import SAMPLES_DIR, sample_paths
from nsysan.store import ReviewStore

PASSWORD = "correct horse battery"
CALLBACK = "/_dash-update-component"


@pytest.fixture
def server(tmp_path):
    s = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads",
               max_upload_bytes=2 * 2**20, users={"ada": hash_password(PASSWORD), "bob": hash_password(PASSWORD)})  # fmt: skip
    yield s
    s.analysis.shutdown()


@pytest.fixture
def finding_id(server) -> int:
    from nsysan.store.models import FindingRecord

    trace_id = server.store.register(sample_paths("pipeline-stall"))
    with server.store.session() as s, s.begin():
        record = FindingRecord(trace_id=trace_id, kind="pipeline_stall", group="", severity="critical", rank=0,
                               device=0, pid=9, start_ns=0, end_ns=10, impact_ns=10, title="stall", evidence={},
                               advice="", status="open", assignee=None, version=1)  # fmt: skip
        s.add(record)
        s.flush()
        return int(record.id)


def _token(client) -> str:
    page = client.get("/login").get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', page)[1]


def _login(client, name: str = "ada", password: str = PASSWORD, **kw):
    return client.post("/login", data={"username": name, "password": password, "csrf_token": _token(client)}, **kw)


def _client(server):
    """Flask's test client of a fresh app, knowing the app (to address its callbacks)."""
    app = create_app(server)
    client = app.server.test_client()
    client.dash_app = app
    return client


def _call(client, trigger: str, values: dict[str, object], headers=None):
    """Fire the callback that ``trigger`` ("id.property") sets off, as the browser does, with
    ``values`` ("id.property" -> value) for its inputs and state (None for the others)."""
    wanted = dict(zip(("id", "property"), trigger.split(".", 1), strict=True))
    (key, spec), *_ = [(k, v) for k, v in client.dash_app.callback_map.items() if wanted in v["inputs"]]
    outputs = [dict(zip(("id", "property"), o.split(".", 1), strict=True)) for o in key.strip(".").split("...")]

    def filled(items):
        return [i | {"value": values.get(f"{i['id']}.{i['property']}")} for i in items]

    body = {"output": key, "outputs": outputs, "inputs": filled(spec["inputs"]), "state": filled(spec["state"]),
            "changedPropIds": [trigger]}  # fmt: skip
    return client.post(CALLBACK, json=body, headers=headers or {})


def _comment(client, finding_id, text, headers=None):
    values = {f"{ids.COMMENT_ADD}.n_clicks": 1, f"{ids.COMMENT_TEXT}.value": text, f"{ids.FINDING_ID}.data": finding_id}
    return _call(client, f"{ids.COMMENT_ADD}.n_clicks", values, headers)


def _notice(answer) -> str:
    return answer.get_json()["sideUpdate"][security.NOTICE]["children"]


def test_the_sixth_wrong_password_within_a_minute_is_answered_429(server):
    client = _client(server)
    for _ in range(5):
        assert _login(client, password="wrong").status_code == 401
    locked = _login(client, password="wrong")
    assert locked.status_code == 429 and "Too many failed logins" in locked.get_data(as_text=True)
    assert int(locked.headers["Retry-After"]) <= 60
    assert _login(client).status_code == 429  # even the right password, for that name from that address
    assert client.get("/").status_code == 302  # not logged in
    # another user at the same address is not locked out by ada's failures
    assert _login(client, "bob").status_code == 302 and client.get("/").status_code == 200


def test_many_names_from_one_address_are_limited_too(server):
    client = _client(server)
    answers = [_login(client, f"guess{i}", "wrong").status_code for i in range(31)]
    assert answers[:30] == [401] * 30 and answers[30] == 429


def test_a_successful_login_does_not_count_against_the_limit(server):
    client = _client(server)
    for _ in range(8):
        assert _login(client).status_code == 302
        client.post("/logout")


def test_a_session_cookie_replayed_after_logout_is_not_logged_in(server):
    client = _client(server)
    planted = client.get_cookie("nsysan_session")  # the id drawn for the login form
    answer = _login(client)
    assert answer.status_code == 302
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    sid = client.get_cookie("nsysan_session").value
    assert planted is None or planted.value != sid  # a new id at login
    assert client.get("/").status_code == 200
    # a GET (a link or an image on another site) does not log out: it answers a page with the button
    page = client.get("/logout")
    assert page.status_code == 200 and 'method="post" action="/logout"' in page.get_data(as_text=True)
    assert client.get("/").status_code == 200
    assert client.post("/logout").status_code == 302
    client.set_cookie("nsysan_session", sid)  # replayed, as a thief who copied it would
    replayed = client.get("/")
    assert replayed.status_code == 302 and replayed.location.startswith("/login")
    assert client.post(CALLBACK, json={}).status_code == 401


def test_a_session_ends_after_its_hours_and_cookies_can_be_secure(server, monkeypatch):
    server.session_hours, server.secure_cookies = 1.0, True
    client = _client(server)
    answer = _login(client)
    assert "Secure" in answer.headers["Set-Cookie"]
    sid = answer.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    client.set_cookie("nsysan_session", sid)  # the test client itself speaks plain HTTP
    assert client.get("/").status_code == 200
    later = time.time() + 3601
    monkeypatch.setattr("dashboards.auth._now", lambda: later)  # only the login's age: the session is fresh
    assert client.get("/").status_code == 302


def test_a_login_without_its_csrf_token_is_refused(server):
    client = _client(server)
    client.get("/login")
    for token in ("", "forged"):
        refused = client.post("/login", data={"username": "ada", "password": PASSWORD, "csrf_token": token})
        assert refused.status_code == 400 and "log in again" in refused.get_data(as_text=True)
    # a token from another visitor's session (an attacker's own) does not fit this session either
    other = _client(server)
    refused = client.post("/login", data={"username": "ada", "password": PASSWORD, "csrf_token": _token(other)})
    assert refused.status_code == 400
    assert client.get("/").status_code == 302


def test_a_post_from_another_site_is_refused_and_nothing_stored(server, finding_id):
    server.users = {}  # no login: the loopback-only server, where a cross-site POST needs no cookie at all
    client = _client(server)
    host = {"Host": "127.0.0.1:8050"}
    for foreign in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Origin": "http://127.0.0.1:9999"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):  # fmt: skip
        answer = _comment(client, finding_id, "planted", headers=host | foreign)
        assert answer.status_code == 403, foreign
    assert server.store.finding(finding_id)["comments"] == []
    same = {"Origin": "http://127.0.0.1:8050", "Sec-Fetch-Site": "same-origin"}
    assert _comment(client, finding_id, "from the page", headers=host | same).status_code == 200
    assert _comment(client, finding_id, "from a script", headers=host).status_code == 200  # no browser headers
    assert [c["body"] for c in server.store.finding(finding_id)["comments"]] == ["from the page", "from a script"]


def test_a_login_posted_from_another_site_is_refused(server):
    client = _client(server)
    token = _token(client)
    answer = client.post("/login", data={"username": "ada", "password": PASSWORD, "csrf_token": token},
                         headers={"Origin": "http://evil.example"})  # fmt: skip
    assert answer.status_code == 403 and client.get("/").status_code == 302


def test_every_answer_carries_the_security_headers(server):
    client = _client(server)
    _login(client)
    for answer in (client.get("/"), client.get("/login"), client.post(CALLBACK, json={}), client.get("/nowhere")):
        assert answer.headers["X-Frame-Options"] == "DENY"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["Referrer-Policy"] == "same-origin"
        csp = dict(d.strip().split(" ", 1) for d in answer.headers["Content-Security-Policy"].split(";"))
        assert csp["frame-ancestors"] == "'none'" and csp["default-src"] == "'self'"
        assert "'unsafe-inline'" not in csp["script-src"]  # eval stays: Plotly's WebGL needs it
        assert "'sha256-" in csp["script-src"]  # Dash's own inline script, by hash


def test_an_oversized_comment_note_or_assignee_is_refused_with_a_message(server, finding_id):
    client = _client(server)
    _login(client)
    huge = _comment(client, finding_id, "x" * 5 * 2**20)  # over a callback's 1 MiB: refused unread
    assert huge.headers["X-Nsysan-Refused"] == "413" and _notice(huge).startswith("Refused: 5.0 MiB sent")
    for text in ("x" * 2**19, "x" * 10_001):
        answer = _comment(client, finding_id, text)
        assert answer.status_code == 200 and "comment is too long" in _notice(answer)
        assert answer.get_json()["response"] == {}  # the typed comment stays, to be shortened
    assert server.store.finding(finding_id)["comments"] == []
    assert _comment(client, finding_id, "x" * 10_000).status_code == 200
    assert len(server.store.finding(finding_id)["comments"]) == 1
    trace_id = server.store.finding(finding_id)["trace_id"]
    note = _call(client, f"{ids.NOTE_ADD}.n_clicks", {f"{ids.NOTE_ADD}.n_clicks": 1, f"{ids.NOTE_TEXT}.value": "y" * 10_001,
                                                     f"{ids.TRACE_ID}.data": trace_id})  # fmt: skip
    assert "note is too long" in _notice(note) and server.store.notes(trace_id) == []
    assignee = _call(client, f"{ids.SAVE}.n_clicks", {f"{ids.SAVE}.n_clicks": 1, f"{ids.STATUS}.value": "confirmed",
                                                      f"{ids.ASSIGNEE}.value": "z" * 201, f"{ids.FINDING_ID}.data": finding_id,
                                                      f"{ids.FINDING_VERSION}.data": 1})  # fmt: skip
    assert "assignee is too long" in _notice(assignee)
    assert server.store.finding(finding_id)["status"] == "open"


def test_a_bad_id_in_callback_state_is_answered_with_a_message_not_500(server, finding_id):
    client = _client(server)
    _login(client)
    for bad in ("1; DROP TABLE findings", 10**30, -1, 1.5, True, [1], {"id": 1}):
        answer = _comment(client, bad, "hello")
        assert answer.status_code == 200 and "not a valid id" in _notice(answer), bad
    missing = _comment(client, 999_999, "hello")  # well formed, but no such finding: the store says so
    assert missing.status_code == 200 and "999999" in _notice(missing)
    assert server.store.finding(finding_id)["comments"] == []
    assert client.post(CALLBACK, data="not json", content_type="application/json").status_code == 400


def test_an_oversized_callback_is_refused_by_its_length_before_it_is_read(server):
    client = _client(server)
    _login(client)

    class Unreadable(io.RawIOBase):  # a body that fails the test if anything reads it
        def readable(self) -> bool:
            return True

        def readinto(self, _buffer):
            raise AssertionError("the body was read")

        def seekable(self) -> bool:
            return True

        def seek(self, _offset: int, _whence: int = 0) -> int:
            return 0

    answer = client.post(CALLBACK, input_stream=Unreadable(), content_type="application/json",
                         environ_overrides={"CONTENT_LENGTH": str(150 * 2**20)})  # fmt: skip
    assert answer.headers["X-Nsysan-Refused"] == "413"
    assert _notice(answer) == "Refused: 150.0 MiB sent; a dashboard action may send 1 MiB at most."
    small = client.post(
        "/login", data="x" * (security.SMALL_BODY + 1), content_type="application/x-www-form-urlencoded"
    )
    assert small.status_code == 413


def _rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def test_a_refused_150_mib_upload_does_not_grow_the_server(tmp_path):
    """A real ``nsysan serve`` (no login, loopback) with a 100 MiB limit, sent a 150 MiB callback body
    as a browser would send a big upload: refused, and the server's memory stays where it was."""
    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "nsysan", "serve", "--db", str(tmp_path / "r.sqlite"),
                                "--traces", str(tmp_path), "--port", str(port), "--uploads", str(tmp_path / "up"),
                                "--max-upload-mb", "100"], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _wait_for(port, process)
        _post_big(port, 2**20)  # a first callback, refused after reading (not base64): warms the server up
        before = _rss_mib(process.pid)
        with PeakRss(process.pid) as peak:
            status, headers, body = _post_big(port, 150 * 2**20)
        after = _rss_mib(process.pid)
        print(f"server RSS before {before:.0f} MiB, peak {peak.mib:.0f} MiB, after {after:.0f} MiB")
        assert headers.get("X-Nsysan-Refused") == "413" and b"Refused: 150.0 MiB sent" in body, (status, body[:200])
        # waitress spools what was sent to a temporary file; the app refuses it by its length
        assert peak.mib - before < 50 and after - before < 50
    finally:
        process.terminate()
        process.wait(10)
        log.close()


class PeakRss:
    """The highest resident size of process ``pid`` while the ``with`` block runs, sampled every 5 ms."""

    def __init__(self, pid: int) -> None:
        self.process, self.mib, self._stop = psutil.Process(pid), 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.mib = max(self.mib, self.process.memory_info().rss / 2**20)
            time.sleep(0.005)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        time.sleep(0.2)
        self._stop.set()
        self._thread.join()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/")
            conn.getresponse().read()
            return
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.2)
    raise AssertionError("nsysan serve did not start")


def _post_big(port: int, size: int) -> tuple[int, dict[str, str], bytes]:
    """POST a callback of ``size`` bytes as the browser sends an upload (its JSON, the file as a
    base64 data URL), a piece at a time, reading the answer as soon as it comes (the server may
    answer, and close, before the body is all sent)."""
    head = b'{"output": "..library-message.children...upload.contents..", "outputs": [{"id": "library-message", '
    head += b'"property": "children"}, {"id": "upload", "property": "contents"}], "inputs": [{"id": "upload", '
    head += b'"property": "contents", "value": ["data:application/octet-stream;base64,'
    tail = b'"]}], "state": [{"id": "upload", "property": "filename", "value": ["big.sqlite"]}], '
    tail += b'"changedPropIds": ["upload.contents"]}'
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest("POST", CALLBACK)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(size))
    conn.putheader("Origin", f"http://127.0.0.1:{port}")
    conn.endheaders()
    filler = size - len(head) - len(tail)
    piece = b"A" * 2**20
    try:
        conn.send(head)
        for start in range(0, filler, len(piece)):
            conn.send(piece[: min(len(piece), filler - start)])
        conn.send(tail)
    except OSError:  # refused and closed early: the answer is already there to read
        pass
    answer = conn.getresponse()
    return answer.status, dict(answer.headers), answer.read()


def test_a_multipart_upload_is_streamed_to_disk_and_refused_when_too_big(server, tmp_path):
    client = _client(server)
    good = SAMPLES_DIR / "pipeline-stall.sqlite"
    assert client.post("/upload", data={"files": (io.BytesIO(good.read_bytes()), "report.sqlite")}).status_code == 401
    _login(client)
    foreign = client.post(
        "/upload",
        data={"files": (io.BytesIO(good.read_bytes()), "r.sqlite")},
        headers={"Origin": "http://evil.example"},
    )
    assert foreign.status_code == 403 and server.store.traces() == []
    answer = client.post("/upload", data={"files": (io.BytesIO(good.read_bytes()), "report.sqlite")})
    assert answer.status_code == 201, answer.data
    (path,) = server.store.trace_paths(answer.get_json()["trace_id"])
    assert path.endswith("/report.sqlite") and Path(path).read_bytes() == good.read_bytes()
    fake = client.post("/upload", data={"files": (io.BytesIO(b"not a database" * 100), "fake.sqlite")})
    assert fake.status_code == 400 and "Upload refused: fake.sqlite" in fake.get_json()["error"]
    big = tmp_path / "big.sqlite"
    big.write_bytes(b"\0" * (3 * 2**20))  # over the fixture's 2 MiB limit, refused by its length
    refused = client.post("/upload", data={"files": (io.BytesIO(big.read_bytes()), "big.sqlite")})
    assert refused.status_code == 413
    assert len(server.store.traces()) == 1 and len(list(server.uploads_dir.iterdir())) == 1
    assert server.analysis.wait(60)


def test_serve_refuses_a_session_length_that_is_not_positive(tmp_path):
    result = subprocess.run([sys.executable, "-m", "nsysan", "serve", "--session-hours", "0", "--db",
                             str(tmp_path / "s.sqlite")], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and "--session-hours must be positive" in result.stderr
