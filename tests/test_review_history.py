"""Review history in the store: every status and assignee change is an event in the finding's thread,
a save that changes nothing does nothing, the review exports with its thread, and findings are
searched across traces. On SQLite and on a real PostgreSQL (tests/run.sh starts one), as test_store."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
import sqlalchemy as sa
from alembic import command

from nsysan.store import ReviewStore, StaleEdit, schema
from nsysan.store import export as review_export
from nsysan.store.models import SCHEMA_VERSION, VERSION_TABLE
from tests.test_store import _analysed, _concurrent_edits


def _changes(finding: dict) -> list[tuple]:
    return [(e["author"], e["field"], e["from"], e["to"], e["version"]) for e in finding["events"]]


def test_every_status_and_assignee_change_is_an_event_in_the_thread(store):
    trace_id = _analysed(store, "pipeline-stall")
    (f,) = store.findings(trace_id, kind="nccl_ordering_stall")
    assert store.update_finding(f["id"], based_on_version=1, status="confirmed", assignee="ana", author="ana") == 2
    store.comment(f["id"], "ben", "rank 3 is late")
    assert store.update_finding(f["id"], based_on_version=2, status="confirmed", assignee="ben", author="ben") == 3
    assert store.update_finding(f["id"], based_on_version=3, assignee="", author="ben") == 4
    got = ReviewStore(store.url).finding(f["id"])  # as another process reads it
    assert _changes(got) == [("ana", "status", "open", "confirmed", 2), ("ana", "assignee", None, "ana", 2),
                             ("ben", "assignee", "ana", "ben", 3), ("ben", "assignee", "ben", None, 4)]  # fmt: skip
    # the thread: comments and events in the order they happened
    assert [(e["kind"], e.get("field") or e.get("body")) for e in got["thread"]] == [
        ("event", "status"), ("event", "assignee"), ("comment", "rank 3 is late"), ("event", "assignee"),
        ("event", "assignee"),
    ]  # fmt: skip
    assert all(dt.datetime.fromisoformat(e["created_at"]).tzinfo is not None for e in got["thread"])
    state = store.review_state(f["id"])
    assert state == {"version": 4, "status": "confirmed", "assignee": None, "comments": 1, "events": 4}


def test_a_save_that_changes_nothing_does_nothing(store):
    trace_id = _analysed(store, "pipeline-stall")
    (f,) = store.findings(trace_id, kind="nccl_ordering_stall")
    assert store.update_finding(f["id"], based_on_version=1, status="open", assignee="  ", author="ana") == 1
    assert store.update_finding(f["id"], based_on_version=1, status="confirmed", assignee="ana") == 2
    # ben's page still says version 1; his save asks for what the finding already is: nothing to do,
    # no event, no new version, and no "changed by someone else"
    assert store.update_finding(f["id"], based_on_version=1, status="confirmed", assignee="ana", author="ben") == 2
    assert store.update_finding(f["id"], based_on_version=2, status="confirmed", assignee=" ana ", author="ben") == 2
    got = store.finding(f["id"])
    assert got["version"] == 2 and len(got["events"]) == 2 and {e["author"] for e in got["events"]} == {"anonymous"}
    # a stale save that would change something is refused, and writes no event
    with pytest.raises(StaleEdit, match="changed by someone else"):
        store.update_finding(f["id"], based_on_version=1, status="fixed", author="ben")
    assert store.review_state(f["id"])["events"] == 2


def test_of_two_concurrent_edits_one_wins_and_only_its_change_is_recorded(store):
    trace_id = _analysed(store, "overlap-slowdown")
    f = store.findings(trace_id)[0]
    results = _concurrent_edits(store, f["id"], 1, (("ana", "confirmed"), ("ben", "fixed")), signed=True)
    (winner,) = [w for w, r in results.items() if r == 2]
    assert sum(isinstance(r, StaleEdit) for r in results.values()) == 1
    got = store.finding(f["id"])
    assert {e["author"] for e in got["events"]} == {winner} and len(got["events"]) == 2
    assert [(e["from"], e["to"]) for e in got["events"] if e["field"] == "assignee"] == [(None, winner)]


def test_the_review_exports_with_its_thread_as_json_csv_and_markdown(store):
    trace_id = _analysed(store, "pipeline-stall")
    (f,) = store.findings(trace_id, kind="nccl_ordering_stall")
    store.update_finding(f["id"], based_on_version=1, status="confirmed", assignee="ana", author="ana")
    store.comment(f["id"], "ben", 'rank 3, "late", again')
    store.note(trace_id, "cy", "captured on node 7")
    review = store.review(trace_id)
    assert review["trace"]["name"] == "pipeline-stall" and [n["body"] for n in review["notes"]] == [
        "captured on node 7"
    ]
    assert {x["id"] for x in review["findings"]} == {x["id"] for x in store.findings(trace_id)}
    review["findings"] = [x for x in review["findings"] if x["id"] == f["id"]]  # the reviewed one
    (exported,) = review["findings"]
    assert exported["recoverable_ns"] == f["recoverable_ns"] is not None
    assert (exported["status"], exported["assignee"]) == ("confirmed", "ana")
    assert [e["kind"] for e in exported["thread"]] == ["event", "event", "comment"]
    as_json = json.loads(review_export.render(review, "json"))
    assert as_json["findings"][0]["thread"][2]["body"] == 'rank 3, "late", again'
    rows = list(csv.DictReader(io.StringIO(review_export.render(review, "csv"))))
    assert [r["entry"] for r in rows] == ["note", "finding", "event", "event", "comment"]
    assert (rows[1]["status"], rows[1]["assignee"], rows[1]["kind"]) == ("confirmed", "ana", "nccl_ordering_stall")
    assert rows[1]["recoverable_ns"] == str(f["recoverable_ns"]) and rows[1]["present"] == "True"
    assert (rows[2]["author"], rows[2]["field"], rows[2]["from"], rows[2]["to"]) == (
        "ana",
        "status",
        "open",
        "confirmed",
    )
    assert rows[4]["text"] == 'rank 3, "late", again'
    md = review_export.render(review, "md")
    assert "status: **confirmed**, assignee: ana" in md and "**ana** (" in md
    assert f"recoverable: {f['recoverable_ns'] / 1e6:.3f} ms" in md
    assert "changed status open -> confirmed" in md and 'rank 3, "late", again' in md
    assert review_export.filename(review, "md") == f"review-{trace_id}-pipeline-stall.md"
    store.comment(f["id"], "eve", '=HYPERLINK("http://evil.example")')  # a formula, to a spreadsheet
    rows = list(csv.DictReader(io.StringIO(review_export.render(store.review(trace_id), "csv"))))
    last = [r for r in rows if r["finding_id"] == str(f["id"])][-1]
    assert last["text"] == '\'=HYPERLINK("http://evil.example")'


def test_findings_are_searched_across_traces(store):
    stall = _analysed(store, "pipeline-stall")
    slow = _analysed(store, "overlap-slowdown")
    assert {f["trace_id"] for f in store.search_findings("NCCL_ORDERING")} == {stall}
    by_kernel = store.search_findings("sgemm")  # a kernel named in the slowdown's evidence and group
    assert (
        by_kernel and {f["trace_id"] for f in by_kernel} == {slow} and by_kernel[0]["trace_name"] == "overlap-slowdown"
    )
    assert store.search_findings("100%_") == [] and store.search_findings("  ") == []  # LIKE wildcards are text
    assert len(store.search_findings("a", limit=3)) == 3


def _schema_4_store(url: str) -> None:
    """A store as the previous nsysan left it (revision 0004, schema 4): a reviewed finding with a comment."""
    engine = sa.create_engine(url)
    with engine.begin() as c:
        command.upgrade(schema.config(c), "0004")
    now = dt.datetime(2026, 5, 6, 7, 8, tzinfo=dt.timezone.utc)
    json_col = lambda name: sa.column(name, sa.JSON)  # noqa: E731
    with engine.begin() as c:
        c.execute(sa.table("traces", sa.column("name"), json_col("paths"), sa.column("status"), json_col("ranks"),
                           json_col("devices"), json_col("summary"), sa.column("registered_at")).insert(),
                  [{"name": "four", "paths": ["/z.sqlite"], "status": "ready", "ranks": [0], "devices": [0],
                    "summary": {}, "registered_at": now}])  # fmt: skip
        c.execute(sa.table("findings", *map(sa.column, ("trace_id", "kind", "group", "severity", "rank", "start_ns",
                                                        "end_ns", "impact_ns", "title", "advice", "status", "assignee",
                                                        "version", "present")), json_col("evidence")).insert(),
                  [{"trace_id": 1, "kind": "nccl_ordering_stall", "group": "g", "severity": "critical", "rank": 2,
                    "start_ns": 10, "end_ns": 20, "impact_ns": 10, "title": "stalled", "advice": "reorder",
                    "status": "confirmed", "assignee": "ada", "version": 3, "present": True,
                    "evidence": {"late_rank": 3}}])  # fmt: skip
        c.execute(sa.table("remarks", *map(sa.column, ("kind", "trace_id", "finding_id", "author", "body",
                                                       "created_at"))).insert(),
                  [{"kind": "comment", "trace_id": 1, "finding_id": 1, "author": "ada", "body": "seen", "created_at": now}])  # fmt: skip
    engine.dispose()


def _revision_and_tables(url: str) -> tuple[str | None, str, set[str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            revision = c.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one_or_none()
            number = c.execute(sa.text("SELECT value FROM nsysan_meta")).scalar_one()
        return revision, number, set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_schema_4_store_gains_review_events_and_keeps_its_review(url):
    _schema_4_store(url)
    assert _revision_and_tables(url)[:2] == ("0004", "4")
    s = ReviewStore(url)
    revision, number, tables = _revision_and_tables(url)
    assert (revision, number) == (schema.head(), str(SCHEMA_VERSION)) == ("0008", "8") and "review_events" in tables
    old = s.finding(1)
    assert (old["status"], old["assignee"], old["version"], old["events"]) == ("confirmed", "ada", 3, [])
    assert [e["body"] for e in old["thread"]] == ["seen"]
    assert s.update_finding(1, based_on_version=3, status="fixed", author="bob") == 4
    assert _changes(s.finding(1)) == [("bob", "status", "confirmed", "fixed", 4)]
    ReviewStore(url)  # opening it again: nothing left to do
    assert len(ReviewStore(url).finding(1)["events"]) == 1


def test_a_failed_upgrade_to_review_events_leaves_the_store_as_it_was(url, monkeypatch):
    _schema_4_store(url)

    def fail(*, step, **_kw) -> None:
        if step.up_revision_id == "0005":
            raise RuntimeError("disk full")

    monkeypatch.setattr(schema, "after_revision", [fail])
    with pytest.raises(RuntimeError, match="disk full"):
        ReviewStore(url)
    revision, number, tables = _revision_and_tables(url)
    assert (revision, number) == ("0004", "4") and "review_events" not in tables
    monkeypatch.setattr(schema, "after_revision", [])
    assert ReviewStore(url).finding(1)["assignee"] == "ada"


def test_the_export_route_and_the_findings_pages_text_filter_and_clock(tmp_path):
    """Without a browser: ``/traces/<id>/review.<fmt>`` through the app, the findings page's text
    filter and its "when" (ms since the trace's first activity, the timeline's clock)."""
    from dashboards.app import create_app
    from dashboards.pages import findings as findings_page
    from dashboards.server import Server

    server = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads")
    try:
        trace_id = _analysed(server.store, "pipeline-stall")
        (f,) = server.store.findings(trace_id, kind="nccl_ordering_stall")
        server.store.update_finding(f["id"], based_on_version=1, assignee="ana", author="ana")
        client = create_app(server).server.test_client()
        answer = client.get(f"/traces/{trace_id}/review.csv", headers={"Host": "127.0.0.1"})
        assert answer.status_code == 200 and answer.mimetype == "text/csv"
        assert f'filename="review-{trace_id}-pipeline-stall.csv"' in answer.headers["Content-Disposition"]
        assert "event,ana" in answer.get_data(as_text=True)
        for missing in (f"/traces/{trace_id}/review.xml", "/traces/99/review.json", f"/traces/{'9' * 30}/review.csv"):
            assert client.get(missing, headers={"Host": "127.0.0.1"}).status_code == 404
        assert (
            findings_page.matches(f, "sendrecv")
            and findings_page.matches(f, "NCCL_ordering")
            and findings_page.matches(f, None)
        )
        assert not findings_page.matches(f, "sgemm")
        when = findings_page.clock(server, trace_id)
        assert when is not None
        data = server.timelines.get(trace_id)
        shift = data.rank_offset.get(f["rank"], 0)
        assert when(f) == round((f["start_ns"] + shift - data.origin_ns) / 1e6, 3) >= 0
        assert findings_page.headlines([f], when)[0]["when_ms"] == when(f)
        assert findings_page.headlines([f])[0]["when_ms"] is None
    finally:
        server.analysis.shutdown()


def test_the_poll_does_not_answer_a_pages_own_save_with_updated(tmp_path):
    """A poll tick sent while the page's save is in flight reads the saved finding; its answer, arriving
    after the save's, must not overwrite "Saved" with "Updated: sam changed ..." (CI saw this race
    hide the confirmation). Another reviewer's change, or a different one, still says "Updated"."""
    from dashboards import ids
    from dashboards.server import Server
    from tests.test_dashboard_security import _call, _client

    server = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads")
    try:
        trace_id = _analysed(server.store, "pipeline-stall")
        (f,) = server.store.findings(trace_id, kind="nccl_ordering_stall")
        seen = {"version": 1, "status": "open", "assignee": "", "comments": 0, "events": 0}
        server.store.update_finding(f["id"], based_on_version=1, status="confirmed", author="sam")
        client = _client(server)

        def poll(author: str, status: str) -> dict:
            values = {f"{ids.REVIEW_POLL}.n_intervals": 5, f"{ids.FINDING_ID}.data": f["id"],
                      f"{ids.REVIEW_SEEN}.data": seen, f"{ids.FINDING_VERSION}.data": 1,
                      f"{ids.STATUS}.value": status, f"{ids.ASSIGNEE}.value": "", f"{ids.AUTHOR}.value": author}  # fmt: skip
            answer = _call(client, f"{ids.REVIEW_POLL}.n_intervals", values, {"Host": "127.0.0.1"})
            assert answer.status_code == 200, answer.data
            return answer.get_json()["response"]

        own = poll("sam", "confirmed")  # sam's page, its save's answer not yet applied
        assert ids.REVIEW_MESSAGE not in own and own[ids.FINDING_VERSION]["data"] == 2
        assert own[ids.REVIEW_SEEN]["data"]["version"] == 2
        other = poll("ana", "confirmed")  # ana made the same edit in her page: sam's change is news to her
        assert "Updated: sam changed status open → confirmed." in str(other[ids.REVIEW_MESSAGE])
        stale = poll("sam", "fixed")  # sam, another tab, editing something else: kept and warned
        assert "changed by someone else while you edit it" in str(stale[ids.REVIEW_MESSAGE])
    finally:
        server.analysis.shutdown()
