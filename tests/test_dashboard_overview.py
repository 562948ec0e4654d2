"""The trace overview without a browser: the summary against the report, clustered markers, the
ordering stall's evidence on both ranks, the view in the URL, and the timeline built off the request."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from dashboards.pages import overview
from dashboards.server import Server
from dashboards.timeline import TimelineData, evidence_items, marker_clusters
from fixtures.samples import sample_paths
from nsysan.ingest import load_trace
from nsysan.report import format as fmt
from nsysan.store import ReviewStore

MS = 1_000_000


def _timeline(sample: str) -> TimelineData:
    with load_trace(sample_paths(sample)) as trace:
        return TimelineData.from_trace(trace)


@pytest.fixture
def server(tmp_path):
    s = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads")
    yield s
    s.analysis.shutdown()


def _analysed(server: Server, sample: str) -> int:
    trace_id = server.store.register(sample_paths(sample), name=sample)
    server.analysis.submit(trace_id)
    assert server.analysis.wait(120)
    return trace_id


def _report_json(sample: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "nsysan", "report", *map(str, sample_paths(sample)), "--format", "json"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.stdout, out.stderr
    return json.loads(out.stdout)


def test_the_per_gpu_figures_are_the_reports(server):
    trace_id = _analysed(server, "pipeline-stall")
    report = _report_json("pipeline-stall")
    rows = overview.device_rows(overview.stored_summary(server, trace_id), server.timelines.peek(trace_id))
    keys = ("export", "device", "ranks", "kernels", "kernel_ns", "busy_ns", "span_ns", "busy_pct")
    assert [{k: r[k] for k in keys} for r in rows] == [{k: d[k] for k in keys} for d in report["summary"]["devices"]]
    # NCCL share from the timeline: its NCCL time over all GPUs is the report's NCCL table's
    assert sum(r["nccl_ns"] for r in rows) == sum(n["total_ns"] for n in report["summary"]["nccl"])
    assert all(0 <= r["nccl_share"] <= 100 for r in rows)
    # and the page shows them as the report prints them
    page = str(overview.layout(server, trace_id, search=""))
    for d in report["summary"]["devices"]:
        assert fmt.percent(d["busy_pct"]) in page and fmt.duration(d["busy_ns"]) in page
    assert "message sizes are unknown" in page and "NCCL_NVTX_DISABLE" in page  # what the capture cannot show
    assert "nccl_ordering_stall" in page and fmt.duration(report["groups"][0]["impact_ns"]) in page


def _found(n: int, group: str, rank: int, start_ms: float, impact_ms: float = 1) -> dict:
    return {"id": n, "kind": "k", "group": group, "severity": "warning", "rank": rank, "device": rank,
            "start_ns": int(start_ms * MS), "end_ns": int(start_ms * MS) + MS // 10, "impact_ns": int(impact_ms * MS),
            "title": f"f{n}", "evidence": {}}  # fmt: skip


def test_markers_cluster_per_group_and_rank_row_with_counts_inside_the_plot():
    data = _timeline("pipeline-stall")
    found = [_found(i, "a", i % 2, 1 + i * 0.1, impact_ms=i) for i in range(10)] + [_found(10, "b", 3, 0)]
    clusters = marker_clusters(data, found)
    assert sorted((c["group"], c["row"], c["count"]) for c in clusters) == sorted([
        ("a", data._rows_of(0, 0)[0], 5), ("a", data._rows_of(1, 1)[0], 5), ("b", data._rows_of(3, 3)[0], 1)])  # fmt: skip
    fig = data.figure(None, found)
    (markers,) = [t for t in fig.data if t.name == "findings"]
    assert sorted(markers.text) == ["", "×5", "×5"]
    lo, hi = fig.layout.xaxis.range
    assert all(lo < x < hi for x in markers.x)  # finding b starts at the origin: still inside the plot
    # zoomed to a window: only the occurrences in it are counted
    window = (data.to_job_clock(found[0], int(1.05 * MS)), data.to_job_clock(found[0], int(1.45 * MS)))
    in_view = next(t for t in data.figure(window, found).data if t.name == "findings")
    assert sorted(in_view.text) == ["×2", "×3"]  # occurrences 0-4 overlap 1.05-1.45 ms: 0, 2, 4 and 1, 3


def test_an_ordering_stall_is_drawn_on_the_waiting_and_the_late_rank(server):
    trace_id = _analysed(server, "pipeline-stall")
    (finding,) = [f for f in server.store.findings(trace_id) if f["kind"] == "nccl_ordering_stall"]
    data = server.timelines.peek(trace_id)
    assert data is not None
    fig = data.figure(data.window_for(finding), [finding], highlight=finding)
    (evidence,) = [t for t in fig.data if t.name == "evidence"]
    rows = {y for y in evidence.y if y}
    assert rows == {"rank 2 · GPU 2 · NCCL", "rank 3 · GPU 3 · NCCL"}
    drawn = data.evidence_drawn(finding, data.window_for(finding))
    assert drawn == ["ncclDevKernel_SendRecv ×2 on rank 2 · GPU 2 · NCCL",
                     "ncclDevKernel_SendRecv on rank 3 · GPU 3 · NCCL"]  # fmt: skip
    items = {i["key"]: i for i in evidence_items(data, finding)}
    ready = items["blocked_op.ready_ns"]
    expected = data.ms_since_origin(data.to_job_clock(finding, 10_035_000))
    assert ready["ms"] == pytest.approx(expected) and ready["text"].endswith("ms since first activity")
    assert items["blocking_op.waited_for_peer_ns"]["text"] == "4.86 ms"
    panel = str(overview.layout(server, trace_id, search=f"?finding={finding['id']}"))
    assert "Drawn red: ncclDevKernel_SendRecv ×2 on rank 2" in panel and "on rank 3 · GPU 3 · NCCL" in panel
    assert "10035000" not in panel  # no raw export-clock numbers


def test_the_view_round_trips_through_the_query_string():
    view = {"t0": 1.25, "t1": 3.5, "finding": 7}
    assert overview.view_query(view) == "?t0=1.25&t1=3.5&finding=7"
    assert overview.parse_view(overview.view_query(view)) == view
    assert overview.parse_view("?t0=3&t1=1&finding=x") == {}  # an empty window, a bad id: dropped
    assert overview.parse_view("?t0=1e999&t1=2") == {}
    assert overview.view_query({}) == ""


def test_after_a_restart_the_timeline_is_built_in_the_background(server, tmp_path):
    trace_id = _analysed(server, "pipeline-stall")
    restarted = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads")
    try:
        assert restarted.timelines.peek(trace_id) is None
        page = str(overview.layout(restarted, trace_id, search=""))
        assert "Building the timeline…" in page  # at once, not after the build
        deadline = time.monotonic() + 60
        while restarted.timelines.peek(trace_id) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Building the timeline" not in str(overview.layout(restarted, trace_id, search=""))
    finally:
        restarted.analysis.shutdown()


def test_records_in_the_evidence_read_as_lines_not_python_reprs():
    """shared_nccl_stream's held_ops (a list of records) was shown as "{'kernel': ...}": a line per
    record, each field as the other lines show it (durations with units, times on a clock)."""
    finding = {"evidence": {"held_ops": [
        {"kernel": "ncclDevKernel_SendRecv", "start_ns": 5_000_000, "lost_ns": 160_000, "behind": "ncclDevKernel_SendRecv"},
        {"kernel": "ncclDevKernel_AllReduce", "start_ns": 6_000_000, "lost_ns": 2_400_000, "behind": "ncclDevKernel_SendRecv"},
    ], "participants": [1, 2]}}  # fmt: skip
    items = {i["key"]: i["text"] for i in evidence_items(None, finding)}
    assert items["held_ops[1]"] == (
        "kernel ncclDevKernel_AllReduce · start_ns 0.006000 s (the export's clock) · lost_ns 2.4 ms · "
        "behind ncclDevKernel_SendRecv"
    )
    assert items["participants"] == "1, 2" and not any("{" in t for t in items.values())


def test_a_record_s_times_are_on_the_clock_of_the_rank_it_names_and_no_field_is_dropped():
    """A cascade's ops are on other ranks: rank 3's op at 1 ms of its export is 6 ms on the job
    clock when rank 3's export starts 5 ms later than rank 0's. Lists and nested records inside a
    record (a late rank's participants and per-peer waits) stay on its line."""

    class Clock:  # the timeline's clock alone: rank 0's export at +0, rank 3's at +5 ms
        rank_offset, origin_ns = {0: 0, 3: 5_000_000}, 0
        to_job_clock, ms_since_origin = TimelineData.to_job_clock, TimelineData.ms_since_origin

    stall = {"rank": 0, "evidence": {"cascade": [{"rank": 3, "kernel": "k", "start_ns": 1_000_000}]}}
    (item,) = evidence_items(Clock(), stall)  # type: ignore[arg-type]
    assert item["ms"] == pytest.approx(6.0) and "6.000 ms since first activity" in item["text"]
    late = {"rank": 2, "evidence": {"operations": [{"kernel": "k", "participants": [0, 1],
                                                    "waited_ns": {"0": 250_000, "1": 300_000}}]}}  # fmt: skip
    (item,) = evidence_items(None, late)
    assert item["text"] == "kernel k · participants 0, 1 · waited_ns.0 250 us · waited_ns.1 300 us"
