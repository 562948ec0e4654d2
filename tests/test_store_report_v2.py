"""The store and the report's version 2 (docs/store.md, schema 6): every finding's ``recoverable_ns``
saved and read back (None for findings stored before it), the ``steps`` section kept in a table of
its own that the library never reads, finding fields the store does not know left out rather than
failing the save, and a store at revision 0005 with reviewed findings upgraded. On SQLite and on a
real PostgreSQL (tests/run.sh starts one), as test_store."""

from __future__ import annotations

import copy
import datetime as dt
import logging

import pytest
import sqlalchemy as sa
from alembic import command

from dashboards.analysis import analyse_stored_trace, stored_steps
from fixtures.samples import sample_paths
from nsysan.findings import Finding, Severity
from nsysan.store import NotFound, ReviewStore, schema
from nsysan.store.models import SCHEMA_VERSION, VERSION_TABLE, StepsRecord, TraceRecord
from nsysan.store.store import DOCUMENT_FIELDS
from tests.test_store import _document


def _finding(start_ns: int, recoverable_ns: int | None = None, **more) -> dict:
    f = {"kind": "late_rank", "group": "late_rank|rank 3", "severity": "warning", "rank": 3, "device": 3, "pid": 9,
         "start_ns": start_ns, "end_ns": start_ns + 100, "impact_ns": 100, "title": f"late at {start_ns}",
         "evidence": {"late_rank": 3}, "advice": "look at rank 3's input pipeline"}  # fmt: skip
    if recoverable_ns is not None:
        f["recoverable_ns"] = recoverable_ns
    return f | more


def _steps(n: int) -> dict:
    """A steps section (docs/report.md) of two ranks and ``n`` steps each."""
    zeros = [0] * n
    rank = {"export": 0, "start_ns": [i * 1000 for i in range(n)], "end_ns": [i * 1000 + 900 for i in range(n)],
            "breakdown_ns": {"compute": [600] * n, "communication_exposed": [100] * n, "waiting_for_peer": [200] * n,
                             "copy_exposed": zeros, "idle": zeros},
            "idle_causes_ns": dict.fromkeys(("launch", "sync", "data_loading", "blocked_launch", "dependency",
                                             "unknown"), zeros)}  # fmt: skip
    return {"version": 1, "source": "nvtx", "detail": "step N", "job": {"wall_ns": n * 1000, "critical_rank": [1] * n},
            "ranks": {"0": rank, "1": copy.deepcopy(rank)}, "unjudged": []}  # fmt: skip


def _document_v2(findings: list[dict], steps: dict | None) -> dict:
    doc = {"report_version": 2, "traces": [{"path": "/x.sqlite", "ranks": [0, 1, 2, 3], "devices": [0, 1, 2, 3]}],
           "findings": findings, "groups": [], "summary": {"nvtx_ranges": []}}  # fmt: skip
    return doc | ({"steps": steps} if steps is not None else {})


def test_recoverable_time_is_saved_read_back_and_taken_from_each_new_analysis(store):
    trace_id = store.register(["/x.sqlite"], name="v2")
    store.save_analysis(trace_id, _document_v2([_finding(0, 5_000_000_000), _finding(1000, 0)], None))
    big, zero = sorted(store.findings(trace_id), key=lambda f: f["start_ns"])
    assert (big["recoverable_ns"], zero["recoverable_ns"]) == (5_000_000_000, 0)  # BIGINT: over 2**31 ns
    assert list(big)[10:13] == ["impact_ns", "recoverable_ns", "title"]
    assert store.finding(big["id"])["recoverable_ns"] == 5_000_000_000
    assert [f["recoverable_ns"] for f in store.search_findings("late at 0")] == [5_000_000_000]
    assert {f["recoverable_ns"] for f in store.review(trace_id)["findings"]} == {5_000_000_000, 0}
    # found again: the new analysis's figure; by a report before version 2 (no recoverable_ns): None
    store.save_analysis(trace_id, _document_v2([_finding(0, 7), _finding(1000, 0)], None))
    assert store.finding(big["id"])["recoverable_ns"] == 7
    store.save_analysis(trace_id, _document_v2([_finding(0), _finding(1000)], None))
    assert [store.finding(f["id"])["recoverable_ns"] for f in (big, zero)] == [None, None]
    assert [f["id"] for f in store.findings(trace_id)] == [big["id"], zero["id"]]  # the same findings


def test_the_dashboards_analysis_stores_the_reports_recoverable_time_and_steps(store):
    trace_id = store.register(sample_paths("pipeline-stall"), name="pipeline-stall")
    doc = _document(store, trace_id)
    analyse_stored_trace(store, trace_id)  # the dashboard's queue: the document as analyse() writes it
    stored = store.findings(trace_id)
    key = lambda f: (f["kind"], f["rank"], f["start_ns"], f["group"])  # noqa: E731
    assert sorted((key(f), f["recoverable_ns"]) for f in stored) == sorted(
        (key(f), f["recoverable_ns"]) for f in doc["findings"]
    )
    assert store.steps(trace_id) == stored_steps(store, trace_id) == doc["steps"] and doc["steps"]["ranks"]
    with store.session() as s:  # not in the summary, which the library reads
        assert "steps" not in s.get(TraceRecord, trace_id).summary


def test_finding_fields_the_store_does_not_know_are_left_out_and_logged(store, caplog):
    trace_id = store.register(["/x.sqlite"], name="newer")
    newer = _finding(0, 10, confidence=0.9, id=123, status="fixed", trace_id=77)  # a newer contract's, the store's own
    with caplog.at_level(logging.WARNING, logger="nsysan.store.store"):
        store.save_analysis(trace_id, _document_v2([newer], None))
    (f,) = store.findings(trace_id)
    assert f["id"] != 123 and f["trace_id"] == trace_id and f["status"] == "open" and "confidence" not in f
    assert f["recoverable_ns"] == 10 and f["evidence"] == {"late_rank": 3}  # nothing of it moved into the evidence
    (record,) = [r for r in caplog.records if "left out" in r.getMessage()]
    assert record.getMessage().endswith("left out: confidence, id, status, trace_id")


def test_the_store_keeps_every_field_of_the_findings_contract():
    """A field added to the report's findings (nsysan.findings) without a place in the store fails
    here, not in a user's analysis (the store would leave it out)."""
    contract = Finding(kind="k", severity=Severity.INFO, title="t", advice="a", start_ns=0, end_ns=1, impact_ns=1)
    assert set(contract.to_dict()) == set(DOCUMENT_FIELDS)


def test_the_steps_section_round_trips_and_the_library_never_reads_it(store):
    trace_id = store.register(["/x.sqlite"], name="steps")
    other = store.register(["/y.sqlite"], name="none yet")
    assert store.steps(other) is None
    with pytest.raises(NotFound):
        store.steps(9999)
    steps = _steps(2000)  # 2 ranks x 2000 steps x 13 numbers
    store.save_analysis(trace_id, _document_v2([_finding(0, 1)], steps))
    assert store.steps(trace_id) == steps and store.steps(other) is None
    statements: list[str] = []

    def record(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        listing = store.traces()
        row = store.trace(trace_id)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    assert statements and not [s for s in statements if "trace_steps" in s or "steps" in s.replace("trace_steps", "")]
    assert [t["id"] for t in listing] == [trace_id, other] and "steps" not in row
    # a later analysis replaces it; one without a steps section (a report before version 2) removes it
    store.save_analysis(trace_id, _document_v2([_finding(0, 1)], _steps(3)))
    assert store.steps(trace_id) == _steps(3)
    store.save_analysis(trace_id, _document_v2([_finding(0)], None))
    assert store.steps(trace_id) is None
    store.save_analysis(trace_id, _document_v2([_finding(0, 1)], steps))
    store.delete_trace(trace_id)  # with its steps
    with store.session() as s:
        assert s.scalars(sa.select(StepsRecord.trace_id)).all() == []


def _schema_5_store(url: str, steps: dict) -> None:
    """A store as the previous nsysan left it (revision 0005, schema 5): a trace with a reviewed
    finding (a comment and a review event), its steps kept in its summary as that nsysan's dashboard
    did, and a trace analysed before steps existed."""
    engine = sa.create_engine(url)
    with engine.begin() as c:
        command.upgrade(schema.config(c), "0005")
    now = dt.datetime(2026, 11, 20, 7, 8, tzinfo=dt.timezone.utc)
    json_col = lambda name: sa.column(name, sa.JSON)  # noqa: E731
    summary = {"nvtx_ranges": [{"range": "step", "count": 2, "total_ns": 4_000_000}]}
    with engine.begin() as c:
        c.execute(sa.table("traces", sa.column("name"), json_col("paths"), sa.column("status"), json_col("ranks"),
                           json_col("devices"), json_col("summary"), sa.column("registered_at")).insert(),
                  [{"name": "five", "paths": ["/a.sqlite"], "status": "ready", "ranks": [0, 1], "devices": [0, 1],
                    "summary": summary | {"steps": steps}, "registered_at": now},
                   {"name": "older", "paths": ["/b.sqlite"], "status": "ready", "ranks": [0], "devices": [0],
                    "summary": summary, "registered_at": now}])  # fmt: skip
        row = {"kind": "nccl_ordering_stall", "group": "g", "severity": "critical", "rank": 1, "start_ns": 10,
               "end_ns": 20, "impact_ns": 10, "title": "stalled", "advice": "reorder", "status": "open",
               "assignee": None, "version": 1, "present": True, "evidence": {"late_rank": 0}}  # fmt: skip
        c.execute(sa.table("findings", *map(sa.column, ("trace_id", "kind", "group", "severity", "rank", "start_ns",
                                                        "end_ns", "impact_ns", "title", "advice", "status", "assignee",
                                                        "version", "present")), json_col("evidence")).insert(),
                  [row | {"trace_id": 1, "status": "confirmed", "assignee": "ada", "version": 2},
                   row | {"trace_id": 2, "title": "older"}])  # fmt: skip
        c.execute(sa.table("remarks", *map(sa.column, ("kind", "trace_id", "finding_id", "author", "body",
                                                       "created_at"))).insert(),
                  [{"kind": "comment", "trace_id": 1, "finding_id": 1, "author": "ada", "body": "seen",
                    "created_at": now + dt.timedelta(minutes=1)}])  # fmt: skip
        c.execute(sa.table("review_events", *map(sa.column, ("trace_id", "finding_id", "author", "field", "old_value",
                                                             "new_value", "version", "created_at"))).insert(),
                  [{"trace_id": 1, "finding_id": 1, "author": "ada", "field": "status", "old_value": "open",
                    "new_value": "confirmed", "version": 2, "created_at": now}])  # fmt: skip
    engine.dispose()


def _revision_number_tables(url: str) -> tuple[str | None, str, set[str], list[str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            revision = c.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one_or_none()
            number = c.execute(sa.text("SELECT value FROM nsysan_meta")).scalar_one()
        inspector = sa.inspect(engine)
        columns = [col["name"] for col in inspector.get_columns("findings")]
        return revision, number, set(inspector.get_table_names()), columns
    finally:
        engine.dispose()


def test_a_schema_5_store_gains_recoverable_time_and_steps_and_keeps_its_review(url):
    steps = _steps(2)
    _schema_5_store(url, steps)
    assert _revision_number_tables(url)[:2] == ("0005", "5")
    s = ReviewStore(url)
    revision, number, tables, columns = _revision_number_tables(url)
    assert (revision, number) == (schema.head(), str(SCHEMA_VERSION)) == ("0008", "8")
    assert "trace_steps" in tables and "recoverable_ns" in columns
    old, older = s.finding(1), s.finding(2)
    assert (old["recoverable_ns"], older["recoverable_ns"]) == (None, None)  # no report of then computed it
    assert (old["status"], old["assignee"], old["version"], old["present"]) == ("confirmed", "ada", 2, True)
    assert [(e["kind"], e.get("body") or e.get("to")) for e in old["thread"]] == [("event", "confirmed"),
                                                                                 ("comment", "seen")]  # fmt: skip
    # the steps the last dashboard kept in the summary moved out of it; the other trace has none
    assert s.steps(1) == steps and s.steps(2) is None
    with s.session() as session:
        assert [t.summary for t in session.scalars(sa.select(TraceRecord).order_by(TraceRecord.id))] == [
            {"nvtx_ranges": [{"range": "step", "count": 2, "total_ns": 4_000_000}]}
        ] * 2
    assert [t["step_ns"] for t in s.traces()] == [2_000_000, 2_000_000]
    # the old finding found again by a version-2 analysis: same id and review, now with its recoverable time
    again = {k: old[k] for k in ("kind", "group", "severity", "rank", "device", "pid", "start_ns", "end_ns",
                                 "impact_ns", "title", "evidence", "advice")} | {"recoverable_ns": 4}  # fmt: skip
    s.save_analysis(1, _document_v2([again], steps))
    assert (s.finding(1)["recoverable_ns"], s.finding(1)["status"], len(s.finding(1)["thread"])) == (4, "confirmed", 2)
    assert s.update_finding(1, based_on_version=2, status="fixed", author="bob") == 3
    ReviewStore(url)  # opening it again: nothing left to do
    assert _revision_number_tables(url)[:2] == ("0008", "8") and ReviewStore(url).steps(1) == steps


def test_a_failed_upgrade_to_schema_6_leaves_the_store_as_it_was(url, monkeypatch):
    steps = _steps(2)
    _schema_5_store(url, steps)

    def fail(*, step, **_kw) -> None:
        if step.up_revision_id == "0006":
            raise RuntimeError("disk full")

    monkeypatch.setattr(schema, "after_revision", [fail])
    with pytest.raises(RuntimeError, match="disk full"):
        ReviewStore(url)
    revision, number, tables, columns = _revision_number_tables(url)
    assert (revision, number) == ("0005", "5") and "trace_steps" not in tables and "recoverable_ns" not in columns
    engine = sa.create_engine(url)
    traces = sa.table("traces", sa.column("id"), sa.column("summary", sa.JSON))
    with engine.connect() as c:  # the summary keeps its steps: the move rolled back with the rest
        summaries = c.execute(sa.select(traces.c.summary).order_by(traces.c.id)).scalars().all()
    engine.dispose()
    assert summaries[0]["steps"] == steps
    monkeypatch.setattr(schema, "after_revision", [])
    s = ReviewStore(url)
    assert s.steps(1) == steps and s.finding(1)["assignee"] == "ada"
