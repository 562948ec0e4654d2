"""The review store on SQLite and on a real PostgreSQL (tests/run.sh starts one; CI must have it)."""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading

import pytest
import sqlalchemy as sa

from dashboards.analysis import analyse_stored_trace
from dashboards.comparison import compare_traces
from dashboards.library import register_exports
from fixtures.samples import sample_paths
from nsysan.analysis import analyse
from nsysan.errors import InputError
from nsysan.ingest import load_trace
from nsysan.store import NotFound, ReviewStore, StaleEdit, StoreUnavailable, schema
from nsysan.store.models import SCHEMA_VERSION, VERSION_TABLE, Base
from tests.conftest import need


def _analysed(store: ReviewStore, sample: str) -> int:
    trace_id = store.register(sample_paths(sample), name=sample)
    analyse_stored_trace(store, trace_id)
    return trace_id


def _only(doc: dict, kind: str) -> dict:
    """The report document with only its findings of ``kind``: a test of the store's bookkeeping
    that does not change when a detector of another kind finds more or less in the sample."""
    return doc | {"findings": [f for f in doc["findings"] if f["kind"] == kind]}


def _concurrent_edits(
    store: ReviewStore, finding_id: int, seen: int, edits: tuple[tuple[str, str], ...], signed: bool = False
) -> dict[str, object]:
    """Each (who, status) edit of a finding loaded at version ``seen``, from its own connection,
    released together: who -> the new version, or the StaleEdit raised. ``signed``: who is the author."""
    results: dict[str, object] = {}
    barrier = threading.Barrier(len(edits))

    def edit(who: str, status: str) -> None:
        mine = ReviewStore(store.url)
        barrier.wait()
        author = {"author": who} if signed else {}
        try:
            results[who] = mine.update_finding(finding_id, based_on_version=seen, status=status, assignee=who, **author)
        except StaleEdit as exc:
            results[who] = exc

    threads = [threading.Thread(target=edit, args=e) for e in edits]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_register_analyse_and_list(store):
    trace_id = _analysed(store, "pipeline-stall")
    (row,) = store.traces()
    assert row["id"] == trace_id and row["status"] == "ready" and row["ranks"] == [0, 1, 2, 3]
    found = store.findings(trace_id)
    assert row["findings"] == {s: sum(f["severity"] == s for f in found) for s in ("info", "warning", "critical")}
    assert all(isinstance(f["recoverable_ns"], int) and f["recoverable_ns"] >= 0 for f in found)
    (finding,) = store.findings(trace_id, kind="nccl_ordering_stall")
    assert finding["evidence"]["late_rank"] == 3
    assert finding["status"] == "open" and finding["version"] == 1
    assert store.findings(trace_id, kind="command_buffer_full") == []


def test_only_nsys_exports_are_registered(store, tmp_path):
    bogus = tmp_path / "notes.sqlite"
    bogus.write_text("not a database")
    with pytest.raises(InputError, match="not an SQLite file"):
        register_exports(store, [bogus])
    assert store.traces() == []


def test_review_edits_comments_and_notes_persist(store):
    trace_id = _analysed(store, "launch-queue-full")
    (finding,) = store.findings(trace_id)
    version = store.update_finding(
        finding["id"], based_on_version=finding["version"], status="confirmed", assignee="ada"
    )
    store.comment(finding["id"], "ada", "fuse the elementwise kernels")
    store.note(trace_id, "bob", "captured on node 7")
    again = ReviewStore(store.url)  # a new process would see the same
    stored = again.finding(finding["id"])
    assert (stored["status"], stored["assignee"], stored["version"]) == ("confirmed", "ada", version)
    assert [c["body"] for c in stored["comments"]] == ["fuse the elementwise kernels"]
    assert [n["body"] for n in again.notes(trace_id)] == ["captured on node 7"]
    with pytest.raises(InputError):
        again.update_finding(finding["id"], based_on_version=version, status="wontfix")
    with pytest.raises(NotFound):
        again.comment(10_000, "ada", "x")


def test_a_group_is_triaged_in_one_action_without_overwriting_a_concurrent_edit(store):
    trace_id = _analysed(store, "pipeline-stall")
    group = [f for f in store.findings(trace_id) if f["group"] == "exposed_communication"]
    assert len(group) == 4
    listed = {f["id"]: f["version"] for f in group}
    first, second, third, fourth = sorted(listed)
    # since the reviewer listed them, bob saved one and another already has the wanted status
    store.update_finding(second, based_on_version=listed[second], assignee="bob", author="bob")
    store.update_finding(third, based_on_version=listed[third], status="confirmed", author="ana")
    listed[third] += 1  # ana's own page reloaded it
    done = store.update_findings(listed, status="confirmed", assignee="ana", author="ana")
    assert done == {"changed": [first, third, fourth], "unchanged": [], "stale": [second], "gone": []}
    after = {f["id"]: f for f in store.findings(trace_id) if f["id"] in listed}
    assert [(after[i]["status"], after[i]["assignee"]) for i in (first, second, third, fourth)] == [
        ("confirmed", "ana"), ("open", "bob"), ("confirmed", "ana"), ("confirmed", "ana")]  # fmt: skip
    events = store.finding(first)["events"]
    assert {(e["field"], e["to"], e["author"]) for e in events} == {("status", "confirmed", "ana"),
                                                                         ("assignee", "ana", "ana")}  # fmt: skip
    assert [e["field"] for e in store.finding(third)["events"]] == ["status", "assignee"]  # the status once
    again = store.update_findings({i: after[i]["version"] for i in (first, fourth)}, status="confirmed")
    assert again == {"changed": [], "unchanged": [first, fourth], "stale": [], "gone": []}
    assert store.update_findings({10**9: 1}, status="fixed")["gone"] == [10**9]  # deleted since: said, not raised
    # the library's review progress: statuses counted, and per assignee what is still to do
    store.update_findings({fourth: after[fourth]["version"]}, status="fixed")
    (row,) = store.traces()
    total = len(store.findings(trace_id))
    assert row["review"] == {"open": total - 3, "confirmed": 2, "false positive": 0, "fixed": 1}
    assert row["to_do"] == {"ana": 2, "bob": 1}  # ana's fixed one is done


def test_two_concurrent_edits_of_one_finding(store):
    trace_id = _analysed(store, "overlap-slowdown")
    finding = store.findings(trace_id)[0]  # the largest of the slowdown's episodes
    seen = finding["version"]  # both people loaded the finding at this version
    results = _concurrent_edits(store, finding["id"], seen, (("ada", "confirmed"), ("bob", "false positive")))
    winners = [w for w, r in results.items() if r == seen + 1]
    losers = [w for w, r in results.items() if isinstance(r, StaleEdit)]
    assert len(winners) == 1 and len(losers) == 1, results
    stored = store.finding(finding["id"])
    assert stored["assignee"] == winners[0] and stored["version"] == seen + 1  # nothing half-applied
    assert "reload it" in str(results[losers[0]])


def test_compare_before_and_after_a_fix(store):
    before = _analysed(store, "pipeline-stall")
    after = _analysed(store, "pipeline-stall-fixed")  # the same job with rank 3 on time
    c = compare_traces(store, before, after)
    assert [f["kind"] for f in c.fixed] == ["nccl_ordering_stall"]
    # rank 2's receive still queued behind its send on one stream, with no late rank now
    assert [(f["kind"], f["recoverable_ns"]) for f in c.new] == [("shared_nccl_stream", 0)]
    assert "nccl_ordering_stall" not in {f["kind"] for f in c.unchanged}  # the rest is the same job's
    # the NVTX "step" ranges: 4 ranks x 1 step; the stall cost rank 2 about 5 ms of a ~9 ms step
    assert c.step_ns_after == pytest.approx(3.96e6, rel=0.01) and c.step_ns_before > c.step_ns_after + 4e6


def test_findings_keep_their_group(store):
    trace_id = store.register(sample_paths("pipeline-stall"))
    with load_trace(store.start_analysis(trace_id).paths) as trace:
        doc = _only(analyse(trace), "nccl_ordering_stall")
    # the detectors may not emit groups yet: give every finding one
    grouped = [f | {"group": f"{f['kind']}|rank {f['rank']}"} for f in doc["findings"]]
    store.save_analysis(trace_id, doc | {"findings": grouped})
    (finding,) = store.findings(trace_id)
    assert finding["group"] == "nccl_ordering_stall|rank 2" and list(finding)[2:4] == ["kind", "group"]
    assert store.finding(finding["id"])["group"] == "nccl_ordering_stall|rank 2"


def _document(store: ReviewStore, trace_id: int) -> dict:
    with load_trace(store.start_analysis(trace_id).paths) as trace:
        return analyse(trace)


def test_reanalysis_keeps_each_finding_with_its_id_status_and_thread(store):
    trace_id = _analysed(store, "overlap-slowdown")  # six episodes of one grouped slowdown, and others
    everything = store.findings(trace_id)
    before = store.findings(trace_id, kind="comm_compute_slowdown")
    assert len(before) == 6 and len({f["group"] for f in before}) == 1
    reviewed, other = before[0], before[3]
    store.update_finding(reviewed["id"], based_on_version=1, status="confirmed", assignee="ada")
    store.comment(reviewed["id"], "ada", "the peer copy again")
    store.update_finding(other["id"], based_on_version=1, status="false positive")
    analyse_stored_trace(store, trace_id)  # the same trace again
    after = store.findings(trace_id)
    assert [f["id"] for f in after] == [f["id"] for f in everything]  # none renumbered, none added
    again = store.finding(reviewed["id"])
    assert (again["status"], again["assignee"], again["version"], again["present"]) == ("confirmed", "ada", 2, True)
    assert [c["body"] for c in again["comments"]] == ["the peer copy again"]
    assert store.finding(other["id"])["status"] == "false positive"
    assert sum(store.trace(trace_id)["findings"].values()) == len(everything)


def test_a_finding_the_new_analysis_lacks_is_kept_and_marked_and_a_new_one_added(store):
    trace_id = store.register(sample_paths("overlap-slowdown"))
    doc = _only(_document(store, trace_id), "comm_compute_slowdown")  # six episodes of one slowdown
    store.save_analysis(trace_id, doc)
    first = store.findings(trace_id)
    gone, kept = first[0], first[1:]
    store.update_finding(gone["id"], based_on_version=1, status="confirmed", assignee="bob")
    store.comment(gone["id"], "bob", "look at rank 0")
    # the next analysis no longer finds the largest episode, finds the rest (one window moved a little,
    # so its text changed), and finds one new problem on another rank
    moved = next(f for f in doc["findings"] if f["start_ns"] == kept[0]["start_ns"])
    new = doc["findings"][0] | {"rank": 1, "group": "comm_compute_slowdown|rank 1|other", "title": "a new one"}
    rest = [f | {"start_ns": f["start_ns"] + 1000, "title": "moved"} if f is moved else f
            for f in doc["findings"] if f["start_ns"] != gone["start_ns"]]  # fmt: skip
    store.save_analysis(trace_id, doc | {"findings": [*rest, new]})
    latest = store.findings(trace_id)
    assert {f["id"] for f in latest} == {f["id"] for f in kept} | {max(f["id"] for f in latest)}
    added = next(f for f in latest if f["id"] not in {k["id"] for k in kept})
    assert added["id"] > max(f["id"] for f in first) and (added["rank"], added["title"]) == (1, "a new one")
    shifted = store.finding(kept[0]["id"])
    assert (shifted["start_ns"], shifted["title"]) == (kept[0]["start_ns"] + 1000, "moved")  # the new analysis's text
    # the one not found again: kept with its review, marked, out of the latest analysis's lists and counts
    missing = store.finding(gone["id"])
    assert (missing["present"], missing["status"], missing["assignee"]) == (False, "confirmed", "bob")
    assert missing["missing_since"] and [c["body"] for c in missing["comments"]] == [
        "look at rank 0", "No longer found by the re-analysis (default settings)."]  # fmt: skip
    assert gone["id"] not in {f["id"] for f in latest} and sum(store.trace(trace_id)["findings"].values()) == 6
    (row,) = store.traces()  # the library's review progress counts the latest analysis's findings only
    assert row["review"] == {"open": 6, "confirmed": 0, "false positive": 0, "fixed": 0} and row["to_do"] == {}
    everything = store.findings(trace_id, include_missing=True)
    assert len(everything) == 7 and [f["id"] for f in everything if not f["present"]] == [gone["id"]]
    # found again by a later analysis: present again, same id, same review
    store.save_analysis(trace_id, doc)
    back = store.finding(gone["id"])
    assert (back["present"], back["missing_since"], back["status"]) == (True, None, "confirmed")
    assert not store.finding(added["id"])["present"]  # and now the new one is the missing one


def test_findings_stored_without_a_group_key_match_the_new_keys(store):
    trace_id = store.register(sample_paths("pipeline-stall"))
    doc = _only(_document(store, trace_id), "nccl_ordering_stall")
    store.save_analysis(trace_id, doc | {"findings": [f | {"group": ""} for f in doc["findings"]]})
    (old,) = store.findings(trace_id)
    store.save_analysis(trace_id, doc)
    (new,) = store.findings(trace_id, include_missing=True)
    assert new["id"] == old["id"] and new["group"] == doc["findings"][0]["group"] != ""


def test_the_matching_rule():
    from nsysan.store.identity import match

    def f(start: int, end: int, n: int = 0, group: str = "g", rank: int = 0, kind: str = "k") -> dict:
        return {"id": n, "kind": kind, "group": group, "rank": rank, "device": 0, "start_ns": start, "end_ns": end}

    old = [f(0, 10, 1), f(20, 30, 2), f(40, 50, 3, group=""), f(0, 100, 4)]
    new = [f(21, 29), f(45, 60, group="h"), f(0, 10), f(0, 10, rank=1), f(60, 70), f(200, 300), f(5, 8, kind="j")]
    # overlapping windows pair, longest overlap first (ties: the closer start, then the older finding); an old
    # finding without a group takes any group; another rank, a window apart or another kind are other findings
    assert match(old, new) == {0: 1, 1: 2, 2: 0, 4: 3}
    assert match(old[:3], [f(10, 20)]) == {0: 0}  # touching windows overlap; of two equally near, the older


# The tables as nsysan with store schema 1 created them (SQLAlchemy's DDL for the models of then).
_SCHEMA_1 = """
CREATE TABLE nsysan_meta ("key" VARCHAR(64) NOT NULL, value VARCHAR(256) NOT NULL, PRIMARY KEY ("key"));
CREATE TABLE traces (id {serial} NOT NULL, name VARCHAR(256) NOT NULL, paths JSON NOT NULL, status VARCHAR(16) NOT NULL,
    error TEXT, ranks JSON NOT NULL, devices JSON NOT NULL, captured_utc_ns BIGINT, summary JSON NOT NULL,
    registered_at {timestamp} NOT NULL, PRIMARY KEY (id));
CREATE TABLE findings (id {serial} NOT NULL, trace_id INTEGER NOT NULL, kind VARCHAR(64) NOT NULL,
    severity VARCHAR(16) NOT NULL, rank INTEGER, device INTEGER, pid INTEGER, start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL, impact_ns BIGINT NOT NULL, title TEXT NOT NULL, evidence JSON NOT NULL, advice TEXT NOT NULL,
    status VARCHAR(16) NOT NULL, assignee VARCHAR(128), version INTEGER NOT NULL, PRIMARY KEY (id),
    FOREIGN KEY(trace_id) REFERENCES traces (id) ON DELETE CASCADE);
CREATE INDEX ix_findings_trace_id ON findings (trace_id);
CREATE TABLE trace_notes (id {serial} NOT NULL, trace_id INTEGER NOT NULL, author VARCHAR(128) NOT NULL,
    body TEXT NOT NULL, created_at {timestamp} NOT NULL, PRIMARY KEY (id),
    FOREIGN KEY(trace_id) REFERENCES traces (id) ON DELETE CASCADE);
CREATE INDEX ix_trace_notes_trace_id ON trace_notes (trace_id);
CREATE TABLE comments (id {serial} NOT NULL, finding_id INTEGER NOT NULL, author VARCHAR(128) NOT NULL,
    body TEXT NOT NULL, created_at {timestamp} NOT NULL, PRIMARY KEY (id),
    FOREIGN KEY(finding_id) REFERENCES findings (id) ON DELETE CASCADE);
CREATE INDEX ix_comments_finding_id ON comments (finding_id);
"""
_TYPES = {"sqlite": {"serial": "INTEGER", "timestamp": "DATETIME"},
          "postgresql": {"serial": "SERIAL", "timestamp": "TIMESTAMP WITH TIME ZONE"}}  # fmt: skip


def _schema_1_store(url: str) -> None:
    """A store as the previous nsysan left it: schema 1, one reviewed finding with a comment."""
    engine = sa.create_engine(url)
    now = dt.datetime.now(dt.timezone.utc)
    json = lambda name: sa.column(name, sa.JSON)  # noqa: E731
    with engine.begin() as c:
        for ddl in _SCHEMA_1.format(**_TYPES[engine.dialect.name]).split(";"):
            if ddl.strip():
                c.exec_driver_sql(ddl)
        c.execute(
            sa.table("nsysan_meta", sa.column("key"), sa.column("value")).insert(),
            [{"key": "schema_version", "value": "1"}],
        )
        c.execute(sa.table("traces", sa.column("name"), json("paths"), sa.column("status"), json("ranks"), json("devices"),
                           json("summary"), sa.column("registered_at")).insert(),
                  [{"name": "old", "paths": ["/x.sqlite"], "status": "ready", "ranks": [0], "devices": [0], "summary": {},
                    "registered_at": now}])  # fmt: skip
        c.execute(sa.table("findings", *map(sa.column, ("trace_id", "kind", "severity", "rank", "start_ns", "end_ns",
                                                        "impact_ns", "title", "advice", "status", "assignee", "version")),
                           json("evidence")).insert(),
                  [{"trace_id": 1, "kind": "nccl_ordering_stall", "severity": "critical", "rank": 2, "start_ns": 10,
                    "end_ns": 20, "impact_ns": 10, "title": "stalled", "advice": "reorder", "status": "confirmed",
                    "assignee": "ada", "version": 3, "evidence": {"late_rank": 3}}])  # fmt: skip
        c.execute(
            sa.table("comments", *map(sa.column, ("finding_id", "author", "body", "created_at"))).insert(),
            [{"finding_id": 1, "author": "ada", "body": "seen it", "created_at": now}],
        )
    engine.dispose()


def _state(url: str) -> tuple[str, list[str]]:
    """The recorded schema version and the findings table's columns."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            version = c.execute(sa.text("SELECT value FROM nsysan_meta")).scalar_one()
        return version, [col["name"] for col in sa.inspect(engine).get_columns("findings")]
    finally:
        engine.dispose()


def test_a_schema_1_store_gains_finding_groups_and_keeps_its_review(url):
    _schema_1_store(url)
    s = ReviewStore(url)
    version, columns = _state(url)
    assert version == str(SCHEMA_VERSION) == "8" and {"group", "recoverable_ns"} <= set(columns)
    (old,) = s.findings(1)
    assert old["group"] == "" and (old["status"], old["assignee"], old["version"]) == ("confirmed", "ada", 3)
    assert old["recoverable_ns"] is None and s.steps(1) is None  # no report of then computed them
    assert [c["body"] for c in s.finding(old["id"])["comments"]] == ["seen it"]
    assert s.update_finding(old["id"], based_on_version=3, status="fixed") == 4
    trace_id = _analysed(s, "pipeline-stall")  # FindingRecord(**finding) with the new keys, on the migrated table
    assert "nccl_ordering_stall" in {f["kind"] for f in s.findings(trace_id)} and s.steps(trace_id)
    assert _revision(url) == schema.head()  # stamped with revision 0001, then upgraded by Alembic
    ReviewStore(url)  # opening it again: nothing left to do
    assert _state(url) == (version, columns)


def _failing_after(revision: str):
    """An ``after_revision`` hook: the upgrade fails once ``revision`` is applied (its DDL done)."""

    def fail(*, step, **_kw) -> None:
        if step.up_revision_id == revision:
            raise RuntimeError("disk full")

    return fail


def test_a_failed_migration_leaves_the_store_as_it_was(url, monkeypatch):
    _schema_1_store(url)
    monkeypatch.setattr(schema, "after_revision", [_failing_after("0002")])
    with pytest.raises(RuntimeError, match="disk full"):
        ReviewStore(url)
    version, columns = _state(url)
    assert version == "1" and "group" not in columns  # stamp, ALTER TABLE and version bump rolled back together
    assert VERSION_TABLE not in _tables(url)
    monkeypatch.setattr(schema, "after_revision", [])
    assert ReviewStore(url).findings(1)[0]["group"] == ""
    assert _revision(url) == schema.head()


def _schema_2_store(url: str) -> None:
    """A store as nsysan with store schema 2 left it: findings with groups, a finding with two
    comments and a trace with a note, in their separate tables."""
    _schema_1_store(url)
    engine = sa.create_engine(url)
    later = dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.timezone.utc)
    with engine.begin() as c:
        c.exec_driver_sql("ALTER TABLE findings ADD COLUMN \"group\" TEXT DEFAULT '' NOT NULL")
        c.execute(sa.text("UPDATE nsysan_meta SET value = '2'"))
        c.execute(sa.table("comments", *map(sa.column, ("finding_id", "author", "body", "created_at"))).insert(),
                  [{"finding_id": 1, "author": "bob", "body": "fixed in #42", "created_at": later}])  # fmt: skip
        c.execute(sa.table("trace_notes", *map(sa.column, ("trace_id", "author", "body", "created_at"))).insert(),
                  [{"trace_id": 1, "author": "bob", "body": "captured on node 7", "created_at": later}])  # fmt: skip
    engine.dispose()


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_schema_2_store_keeps_its_comments_and_notes_in_one_table(url):
    _schema_2_store(url)
    s = ReviewStore(url)
    assert _state(url)[0] == str(SCHEMA_VERSION) == "8"
    assert "remarks" in _tables(url) and not _tables(url) & {"comments", "trace_notes"}
    comments = s.finding(1)["comments"]
    assert [(c["author"], c["body"]) for c in comments] == [("ada", "seen it"), ("bob", "fixed in #42")]
    (note,) = s.notes(1)
    assert (note["author"], note["body"], note["created_at"][:16]) == ("bob", "captured on node 7", "2026-01-02T03:04")
    s.comment(1, "ada", "confirmed on the new build")  # the merged table takes new remarks of both kinds
    s.note(1, "ada", "recaptured")
    assert [c["body"] for c in s.finding(1)["comments"]][-1] == "confirmed on the new build"
    assert [n["body"] for n in s.notes(1)] == ["captured on node 7", "recaptured"]
    ReviewStore(url)  # opening it again: nothing left to do
    assert len(ReviewStore(url).finding(1)["comments"]) == 3


def test_a_failed_merge_of_comments_and_notes_leaves_them_where_they_were(url, monkeypatch):
    _schema_2_store(url)
    monkeypatch.setattr(schema, "after_revision", [_failing_after("0003")])
    with pytest.raises(RuntimeError, match="disk full"):
        ReviewStore(url)
    assert _state(url)[0] == "2"  # the stamp, the new table, the copies and the drops rolled back together
    assert {"comments", "trace_notes"} <= _tables(url) and not _tables(url) & {"remarks", VERSION_TABLE}
    monkeypatch.setattr(schema, "after_revision", [])
    assert [n["body"] for n in ReviewStore(url).notes(1)] == ["captured on node 7"]


def _revision(url: str) -> str | None:
    """The store's Alembic revision."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one_or_none()
    finally:
        engine.dispose()


# The tables as nsysan with the hand-written schema 3 created them (SQLAlchemy's DDL for its models).
_SCHEMA_3 = """
CREATE TABLE nsysan_meta ("key" VARCHAR(64) NOT NULL, value VARCHAR(256) NOT NULL, PRIMARY KEY ("key"));
CREATE TABLE traces (id {serial} NOT NULL, name VARCHAR(256) NOT NULL, paths JSON NOT NULL, status VARCHAR(16) NOT NULL,
    error TEXT, ranks JSON NOT NULL, devices JSON NOT NULL, captured_utc_ns BIGINT, summary JSON NOT NULL,
    registered_at {timestamp} NOT NULL, PRIMARY KEY (id));
CREATE TABLE findings (id {serial} NOT NULL, trace_id INTEGER NOT NULL, kind VARCHAR(64) NOT NULL,
    "group" TEXT DEFAULT '' NOT NULL, severity VARCHAR(16) NOT NULL, rank INTEGER, device INTEGER, pid INTEGER,
    start_ns BIGINT NOT NULL, end_ns BIGINT NOT NULL, impact_ns BIGINT NOT NULL, title TEXT NOT NULL,
    evidence JSON NOT NULL, advice TEXT NOT NULL, status VARCHAR(16) NOT NULL, assignee VARCHAR(128),
    version INTEGER NOT NULL, PRIMARY KEY (id), FOREIGN KEY(trace_id) REFERENCES traces (id) ON DELETE CASCADE);
CREATE INDEX ix_findings_trace_id ON findings (trace_id);
CREATE TABLE remarks (id {serial} NOT NULL, kind VARCHAR(16) NOT NULL, trace_id INTEGER NOT NULL, finding_id INTEGER,
    author VARCHAR(128) NOT NULL, body TEXT NOT NULL, created_at {timestamp} NOT NULL, PRIMARY KEY (id),
    CONSTRAINT remark_kind_names_its_subject CHECK ((kind = 'comment' AND finding_id IS NOT NULL)
        OR (kind = 'note' AND finding_id IS NULL)),
    FOREIGN KEY(trace_id) REFERENCES traces (id) ON DELETE CASCADE,
    FOREIGN KEY(finding_id) REFERENCES findings (id) ON DELETE CASCADE);
CREATE INDEX ix_remarks_finding_id ON remarks (finding_id);
CREATE INDEX ix_remarks_trace_id ON remarks (trace_id);
"""


def _schema_3_store(url: str) -> None:
    """A store as nsysan with the hand-written schema 3 left it (no Alembic table): a trace with two
    grouped findings, one reviewed with two comments, and a note on the trace."""
    engine = sa.create_engine(url)
    now = dt.datetime(2026, 3, 4, 5, 6, tzinfo=dt.timezone.utc)
    json = lambda name: sa.column(name, sa.JSON)  # noqa: E731
    with engine.begin() as c:
        for ddl in _SCHEMA_3.format(**_TYPES[engine.dialect.name]).split(";"):
            if ddl.strip():
                c.exec_driver_sql(ddl)
        c.execute(sa.text("INSERT INTO nsysan_meta VALUES ('schema_version', '3')"))
        c.execute(sa.table("traces", sa.column("name"), json("paths"), sa.column("status"), json("ranks"), json("devices"),
                           json("summary"), sa.column("registered_at")).insert(),
                  [{"name": "three", "paths": ["/y.sqlite"], "status": "ready", "ranks": [0, 1], "devices": [0, 1],
                    "summary": {}, "registered_at": now}])  # fmt: skip
        finding = {"trace_id": 1, "kind": "comm_compute_slowdown", "group": "comm_compute_slowdown|rank 0|sgemm",
                   "severity": "warning", "rank": 0, "advice": "overlap less", "status": "open", "assignee": None,
                   "version": 1, "evidence": {"kernel": "sgemm"}}  # fmt: skip
        c.execute(sa.table("findings", *map(sa.column, ("trace_id", "kind", "group", "severity", "rank", "start_ns",
                                                        "end_ns", "impact_ns", "title", "advice", "status", "assignee",
                                                        "version")), json("evidence")).insert(),
                  [finding | {"start_ns": 100, "end_ns": 200, "impact_ns": 50, "title": "slow 1", "status": "confirmed",
                              "assignee": "ada", "version": 2},
                   finding | {"start_ns": 300, "end_ns": 400, "impact_ns": 40, "title": "slow 2"}])  # fmt: skip
        c.execute(sa.table("remarks", *map(sa.column, ("kind", "trace_id", "finding_id", "author", "body",
                                                       "created_at"))).insert(),
                  [{"kind": "comment", "trace_id": 1, "finding_id": 1, "author": "ada", "body": "real", "created_at": now},
                   {"kind": "note", "trace_id": 1, "finding_id": None, "author": "bob", "body": "node 3", "created_at": now},
                   {"kind": "comment", "trace_id": 1, "finding_id": 1, "author": "bob", "body": "agreed", "created_at": now}])  # fmt: skip
    engine.dispose()


def test_a_schema_3_store_is_stamped_and_upgraded_keeping_its_review(url):
    _schema_3_store(url)
    s = ReviewStore(url)
    assert _revision(url) == schema.head() and _state(url)[0] == str(SCHEMA_VERSION)
    first, second = s.findings(1)
    assert (first["title"], first["status"], first["assignee"], first["version"]) == ("slow 1", "confirmed", "ada", 2)
    assert first["group"] == second["group"] == "comm_compute_slowdown|rank 0|sgemm" and second["status"] == "open"
    assert first["present"] and second["present"] and first["missing_since"] is None  # found by the latest analysis
    assert s.trace(1)["findings"] == {"info": 0, "warning": 2, "critical": 0}
    assert [(c["author"], c["body"]) for c in s.finding(1)["comments"]] == [("ada", "real"), ("bob", "agreed")]
    assert [(n["author"], n["body"], n["created_at"][:16]) for n in s.notes(1)] == [
        ("bob", "node 3", "2026-03-04T05:06")
    ]
    assert s.update_finding(1, based_on_version=2, status="fixed") == 3
    assert s.comment(1, "cy", "done") > 3 and s.note(1, "cy", "recaptured") > 3  # the sequences go on after the rows
    ReviewStore(url)  # opening it again: nothing left to do
    assert _revision(url) == schema.head() and len(s.finding(1)["comments"]) == 3


def test_a_new_store_has_exactly_the_tables_of_the_models(url):
    """Every revision from the first, on an empty database, gives the models' schema (as autogenerate
    sees it: tables, columns, types, nullability, indexes, foreign keys)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    ReviewStore(url)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            context = MigrationContext.configure(c, opts={"version_table": VERSION_TABLE, "compare_type": True})
            differences = [d for d in compare_metadata(context, Base.metadata)
                           if not (d[0] == "add_table" and d[1].name == VERSION_TABLE)]  # fmt: skip
    finally:
        engine.dispose()
    assert differences == []
    assert _revision(url) == schema.head()


def test_two_servers_opening_one_old_store_upgrade_it_once(url):
    _schema_2_store(url)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def open_store() -> None:
        barrier.wait()
        try:
            ReviewStore(url)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _revision(url) == schema.head() and len(ReviewStore(url).finding(1)["comments"]) == 2


def test_a_store_from_a_newer_nsysan_is_refused(url):
    ReviewStore(url)
    engine = sa.create_engine(url)
    with engine.begin() as c:  # a revision this nsysan does not have
        c.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'f00dcafe'"))
    with pytest.raises(InputError, match="revision f00dcafe is newer than this nsysan"):
        ReviewStore(url)
    with engine.begin() as c:  # a newer store of the hand-written migrations' time (no Alembic table)
        c.execute(sa.text(f"DROP TABLE {VERSION_TABLE}"))
        c.execute(sa.text("UPDATE nsysan_meta SET value = '9'"))
    engine.dispose()
    with pytest.raises(InputError, match="store schema 9 is newer than this nsysan"):
        ReviewStore(url)


def test_a_sqlite_store_in_a_missing_directory_is_refused_in_one_line(tmp_path):
    with pytest.raises(StoreUnavailable, match=f"the directory {tmp_path / 'nope'} does not exist"):
        ReviewStore(tmp_path / "nope" / "review.sqlite")
    assert not (tmp_path / "nope").exists()


def test_a_missing_database_driver_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    with pytest.raises(
        StoreUnavailable, match=r'driver is not installed \(psycopg\); pip install "nsysan\[postgres\]"'
    ):
        ReviewStore("postgresql+psycopg://user:secret@127.0.0.1/db")


def test_a_url_that_is_not_one_is_refused_without_its_password():
    with pytest.raises(StoreUnavailable) as refused:
        ReviewStore("postgresql+psycopg://user:secret@host:notaport/db")
    assert "not a store URL" in str(refused.value) and "secret" not in str(refused.value)


def test_a_wrong_postgresql_password_is_a_user_error():
    url = os.environ.get("NSYSAN_TEST_PG_URL")
    need(bool(url), "a PostgreSQL server (NSYSAN_TEST_PG_URL, set by tests/run.sh)")
    wrong = sa.engine.make_url(url).set(password="not-the-password")
    with pytest.raises(StoreUnavailable, match=r"cannot open the store .*password authentication failed") as refused:
        ReviewStore(wrong.render_as_string(hide_password=False))
    assert "not-the-password" not in str(refused.value) and "***" in str(refused.value)


def test_text_over_its_limit_is_refused_by_the_store_itself(store):
    """SQLite keeps any length, so the store checks: a 5 MiB comment, a 129-character assignee."""
    trace_id = _analysed(store, "launch-queue-full")
    (finding,) = store.findings(trace_id)
    with pytest.raises(InputError, match="comment is too long"):
        store.comment(finding["id"], "ana", "x" * (5 * 2**20))
    with pytest.raises(InputError, match="note is too long"):
        store.note(trace_id, "ana", "x" * 10_001)
    with pytest.raises(InputError, match="assignee is too long"):
        store.update_finding(finding["id"], based_on_version=finding["version"], assignee="a" * 129)
    store.comment(finding["id"], "ana", "x" * 10_000)  # at the limit: kept
    assert [len(c["body"]) for c in store.finding(finding["id"])["comments"]] == [10_000]
