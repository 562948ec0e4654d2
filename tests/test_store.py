"""The review store on SQLite and on a real PostgreSQL (tests/run.sh starts one; CI must have it)."""

from __future__ import annotations

import os
import threading

import pytest

from fixtures.samples import sample_paths
from nsysan.errors import InputError
from nsysan.store import NotFound, ReviewStore, StaleEdit
from tests.conftest import need


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        yield ReviewStore(tmp_path / "review.sqlite")
        return
    url = os.environ.get("NSYSAN_TEST_PG_URL")
    need(bool(url), "a PostgreSQL server (NSYSAN_TEST_PG_URL, set by tests/run.sh)")
    s = ReviewStore(url)
    from nsysan.store.models import Base

    Base.metadata.drop_all(s.engine)  # a clean schema per test
    yield ReviewStore(url)
    Base.metadata.drop_all(s.engine)


def _analysed(store: ReviewStore, sample: str) -> int:
    trace_id = store.register(sample_paths(sample), name=sample)
    store.analyse(trace_id)
    return trace_id


def test_register_analyse_and_list(store):
    trace_id = _analysed(store, "pipeline-stall")
    (row,) = store.traces()
    assert row["id"] == trace_id and row["status"] == "ready" and row["ranks"] == [0, 1, 2, 3]
    assert row["findings"] == {"info": 0, "warning": 0, "critical": 1}
    (finding,) = store.findings(trace_id)
    assert finding["kind"] == "nccl_ordering_stall" and finding["evidence"]["late_rank"] == 3
    assert finding["status"] == "open" and finding["version"] == 1
    assert store.findings(trace_id, kind="command_buffer_full") == []


def test_only_nsys_exports_are_registered(store, tmp_path):
    bogus = tmp_path / "notes.sqlite"
    bogus.write_text("not a database")
    with pytest.raises(InputError, match="not an SQLite file"):
        store.register([bogus])
    assert store.traces() == []


def test_review_edits_comments_and_notes_persist(store):
    trace_id = _analysed(store, "launch-queue-full")
    (finding,) = store.findings(trace_id)
    version = store.update_finding(finding["id"], based_on_version=finding["version"], status="confirmed", assignee="ada")
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


def test_two_concurrent_edits_of_one_finding(store):
    trace_id = _analysed(store, "overlap-slowdown")
    (finding,) = store.findings(trace_id)
    seen = finding["version"]  # both people loaded the finding at this version
    results: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def edit(who: str, status: str) -> None:
        mine = ReviewStore(store.url)
        barrier.wait()
        try:
            results[who] = mine.update_finding(finding["id"], based_on_version=seen, status=status, assignee=who)
        except StaleEdit as exc:
            results[who] = exc

    threads = [threading.Thread(target=edit, args=("ada", "confirmed")), threading.Thread(target=edit, args=("bob", "false positive"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [w for w, r in results.items() if r == seen + 1]
    losers = [w for w, r in results.items() if isinstance(r, StaleEdit)]
    assert len(winners) == 1 and len(losers) == 1, results
    stored = store.finding(finding["id"])
    assert stored["assignee"] == winners[0] and stored["version"] == seen + 1  # nothing half-applied
    assert "reload it" in str(results[losers[0]])


def test_compare_before_and_after_a_fix(store):
    before = _analysed(store, "pipeline-stall")
    after = _analysed(store, "pipeline-stall-fixed")  # the same job with rank 3 on time
    c = store.compare(before, after)
    assert [f["kind"] for f in c.fixed] == ["nccl_ordering_stall"] and c.new == [] and c.unchanged == []
    # the NVTX "step" ranges: 4 ranks x 1 step; the stall cost rank 2 about 5 ms of a ~9 ms step
    assert c.step_ns_after == pytest.approx(3.96e6, rel=0.01) and c.step_ns_before > c.step_ns_after + 4e6
