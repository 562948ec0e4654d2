"""Uploads have owners (issue 31 item 8): with login, an upload belongs to who uploaded it, and only
they or an admin (``--admins``) may delete it; every delete is recorded with who made it and how much
review went with it; one uploader's traces may take at most ``--upload-quota-mb``. Without login (a
loopback-only server) anyone may delete, recorded under the name typed in the header."""

from __future__ import annotations

import io
import subprocess
import sys

import flask
import pytest

from dashboards.auth import hash_password
from dashboards.library import UploadRefused, save_upload_streams
from dashboards.pages import library as library_page
from dashboards.server import Server
from fixtures.samples import SAMPLES_DIR
from nsysan.store import ReviewStore

SAMPLE = (SAMPLES_DIR / "pipeline-stall.sqlite").read_bytes()


@pytest.fixture
def server(tmp_path):
    hashed = hash_password("pass-word-42")
    s = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads",
               users={"ana": hashed, "ben": hashed, "root": hashed}, admins=frozenset({"root"}))  # fmt: skip
    yield s
    s.analysis.shutdown()


@pytest.fixture
def as_user():
    """Run as a logged-in user: ``with as_user("ana"): ...``."""
    app = flask.Flask(__name__)
    app.secret_key = "test"

    class _As:
        def __init__(self, name: str) -> None:
            self.context = app.test_request_context()
            self.name = name

        def __enter__(self) -> None:
            self.context.__enter__()
            flask.session["user"] = self.name

        def __exit__(self, *exc: object) -> None:
            self.context.__exit__(*exc)

    return _As


def _upload(server: Server, name: str = "a.sqlite") -> int:
    return save_upload_streams(server, [(name, io.BytesIO(SAMPLE))])


def test_only_the_owner_or_an_admin_deletes_an_upload_and_each_delete_is_recorded(server, as_user):
    with as_user("ana"):
        first, second = _upload(server, "a.sqlite"), _upload(server, "b.sqlite")
    assert server.analysis.wait(60)
    assert [server.store.trace(t)["owner"] for t in (first, second)] == ["ana", "ana"]
    assert server.store.uploaded_bytes("ana") == 2 * len(SAMPLE) and server.store.uploaded_bytes("ben") == 0
    server.store.comment(server.store.findings(first)[0]["id"], "ana", "look")
    findings = len(server.store.findings(first, include_missing=True))
    with as_user("ben"):
        assert library_page.delete_trace(server, first) == (
            f"Not deleted: trace {first} was uploaded by ana; only they or an admin (nsysan serve --admins) may "
            "delete it."
        )
        assert str(library_page._delete_button(server, server.store.trace(first))) == "uploaded by ana"
    assert server.store.trace(first)["status"] == "ready"  # nothing deleted
    with as_user("ana"):
        assert library_page.delete_trace(server, first) == f"Deleted trace {first} with its findings and review."
    with as_user("root"):  # an admin deletes anyone's
        assert library_page.delete_trace(server, second) == f"Deleted trace {second} with its findings and review."
    (by_root, by_ana) = server.store.deletions()
    assert (by_ana["trace_id"], by_ana["owner"], by_ana["deleted_by"], by_ana["remarks"]) == (first, "ana", "ana", 1)
    assert by_ana["findings"] == findings > 0 and by_ana["name"] == "a"
    assert (by_root["trace_id"], by_root["owner"], by_root["deleted_by"]) == (second, "ana", "root")
    assert server.store.traces() == [] and server.store.uploaded_bytes("ana") == 0
    page = str(library_page._table(server).to_plotly_json())
    assert "Recently deleted (2)" in page and "a (trace 1, uploaded by ana): deleted by ana at " in page


def test_an_upload_past_the_quota_is_refused_and_nothing_kept(server, as_user):
    server.upload_quota_bytes = len(SAMPLE) + len(SAMPLE) // 2  # one sample fits, two do not
    with as_user("ana"):
        _upload(server)
        with pytest.raises(
            UploadRefused, match=r"^your uploads would pass the quota of 0\.7 MiB \(0\.5 MiB used\): delete some first$"
        ):
            _upload(server, "b.sqlite")
    with as_user("ben"):  # a quota per uploader
        _upload(server, "c.sqlite")
    assert server.analysis.wait(60)
    assert sorted((t["name"], t["owner"]) for t in server.store.traces()) == [("a", "ana"), ("c", "ben")]
    assert len(list(server.uploads_dir.iterdir())) == 2  # the refused upload left nothing


def test_without_login_anyone_deletes_recorded_under_the_typed_name(tmp_path):
    server = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads")
    try:
        trace_id = _upload(server)
        assert server.analysis.wait(60) and server.store.trace(trace_id)["owner"] is None
        assert library_page.delete_trace(server, trace_id, " carl ").startswith("Deleted trace")
        assert [(d["owner"], d["deleted_by"]) for d in server.store.deletions()] == [(None, "carl")]
    finally:
        server.analysis.shutdown()


@pytest.mark.parametrize(("args", "said"), [
    (["--admins", "ana"], "--admins names users, but the server has no login: give --users"),
    (["--upload-quota-mb", "-1"], "--upload-quota-mb must be 0 (no quota) or positive"),
])  # fmt: skip
def test_serve_checks_admins_and_quota(tmp_path, args, said):
    done = subprocess.run([sys.executable, "-m", "nsysan", "serve", "--db", str(tmp_path / "s.sqlite"), *args],
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr == f"nsysan: error: {said}\n"


def test_two_uploads_at_once_never_both_fit_one_quota(server, as_user):
    import threading

    server.upload_quota_bytes = len(SAMPLE) + len(SAMPLE) // 2
    outcomes: list[str] = []

    def upload(name: str) -> None:
        with as_user("ana"):
            try:
                _upload(server, name)
                outcomes.append("kept")
            except UploadRefused:
                outcomes.append("refused")

    threads = [threading.Thread(target=upload, args=(f"{i}.sqlite",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["kept", "refused"] and server.store.uploaded_bytes("ana") == len(SAMPLE)
    assert server.analysis.wait(60)


def test_a_trace_deleted_twice_is_recorded_once(server, as_user):
    from nsysan.store import NotFound

    with as_user("ana"):
        trace_id = _upload(server)
    assert server.analysis.wait(60)
    server.store.delete_trace(trace_id, by="ana")
    with pytest.raises(NotFound):
        server.store.delete_trace(trace_id, by="ben")
    assert [d["deleted_by"] for d in server.store.deletions()] == ["ana"]


def test_an_upload_without_a_recorded_uploader_is_an_admins_to_delete(server, as_user):
    trace_id = _upload(server)  # no one logged in: no owner
    assert server.analysis.wait(60) and server.store.trace(trace_id)["owner"] is None
    with as_user("ana"):
        assert library_page.delete_trace(server, trace_id) == (
            f"Not deleted: trace {trace_id} has no recorded uploader (uploaded before uploads had owners, or without "
            "login); only an admin (nsysan serve --admins) may delete it."
        )
        assert library_page._delete_button(server, server.store.trace(trace_id)) == (
            "no recorded uploader: an admin may delete it"
        )
    with as_user("root"):
        assert library_page.delete_trace(server, trace_id).startswith("Deleted trace")


def test_a_user_name_longer_than_the_store_keeps_is_refused():
    from dashboards.auth import load_users
    from nsysan.errors import InputError

    with pytest.raises(InputError, match="a name of at most 128 characters"):
        load_users(None, f"{'a' * 129}={hash_password('pass-word-42')}")
