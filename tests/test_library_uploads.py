"""Deleting a trace from the review store (the library page's "delete" of an uploaded trace), on
SQLite and PostgreSQL: the trace goes with its findings, remarks and review events, others stay."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nsysan.store import NotFound, ReviewStore
from nsysan.store.models import FindingRecord, RemarkRecord, ReviewEventRecord, TraceRecord
from tests.test_store import _analysed


def _rows(store: ReviewStore, trace_id: int) -> dict[str, int]:
    with store.session() as s:
        return {
            table.__tablename__: s.scalar(sa.select(sa.func.count()).select_from(table).where(column == trace_id))
            for table, column in (
                (TraceRecord, TraceRecord.id),
                (FindingRecord, FindingRecord.trace_id),
                (RemarkRecord, RemarkRecord.trace_id),
                (ReviewEventRecord, ReviewEventRecord.trace_id),
            )
        }


def _reviewed(store: ReviewStore, sample: str) -> int:
    trace_id = _analysed(store, sample)
    finding = store.findings(trace_id)[0]
    store.update_finding(finding["id"], based_on_version=finding["version"], status="confirmed", assignee="ada")
    store.comment(finding["id"], "ada", "a comment")
    store.note(trace_id, "bob", "a note")
    return trace_id


def test_deleting_a_trace_removes_its_findings_remarks_and_events_and_nothing_else(store):
    gone, kept = _reviewed(store, "pipeline-stall"), _reviewed(store, "launch-queue-full")
    before = _rows(store, kept)
    assert all(before.values()) and all(_rows(store, gone).values())
    gone_findings = [f["id"] for f in store.findings(gone, include_missing=True)]
    store.delete_trace(gone)
    assert set(_rows(store, gone).values()) == {0}
    assert _rows(store, kept) == before
    assert [t["id"] for t in store.traces()] == [kept]
    with pytest.raises(NotFound):
        store.trace(gone)
    with pytest.raises(NotFound):
        store.finding(gone_findings[0])
    assert store.search_findings("nccl_ordering_stall") == []  # pipeline-stall's only finding
    with pytest.raises(NotFound):
        store.delete_trace(gone)  # twice: the second finds nothing
