"""The dashboard's parts without a browser: the timeline, routing, registering and uploading, login."""

from __future__ import annotations

import io
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import dash
import numpy as np
import pandas as pd
import pytest

import dashboards
from dashboards import ids, timeline
from dashboards.app import route
from dashboards.auth import _safe_next, hash_password, is_loopback, load_users
from dashboards.library import UploadRefused, jobs_in, save_upload_streams, scan_directory
from dashboards.pages import library as library_page
from dashboards.pages.findings import FILTERS
from dashboards.server import Server
from dashboards.timeline import TimelineData, evidence_correlation_ids
from fixtures.samples import SAMPLES_DIR, sample_paths
from nsysan.errors import InputError
from nsysan.ingest import load_trace
from nsysan.store import ReviewStore
from tests.conftest import sha256


def _timeline(sample: str) -> TimelineData:
    with load_trace(sample_paths(sample)) as trace:
        return TimelineData.from_trace(trace)


def test_timeline_rows_are_ranks_gpus_and_lanes_on_the_job_clock():
    data = _timeline("allreduce-4rank-2022.4")  # one export per rank, sessions started apart
    assert data.rows["label"].tolist()[:6] == [
        "rank 0 · GPU 0 · compute", "rank 0 · GPU 0 · NCCL", "rank 0 · GPU 0 · copies",
        "rank 0 · NVTX tid 4100", "rank 0 · NVTX tid 4100 · level 1", "rank 0 · CUDA API tid 4100",
    ]  # fmt: skip
    # by hand in SQL: each export's kernels, copies, memsets, NVTX ranges (push/pop, type 59; those
    # inside another of their thread) and CUDA runtime calls, every one drawn once, in its row
    counts = {"compute+NCCL+copies": 0, "nvtx": 0, "nested": 0, "api": 0}
    for path in sample_paths("allreduce-4rank-2022.4"):
        with sqlite3.connect(path) as db:
            counts["compute+NCCL+copies"] += sum(db.execute(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{t}").fetchone()[0]
                                                 for t in ("KERNEL", "MEMCPY", "MEMSET"))  # fmt: skip
            counts["nvtx"] += db.execute(
                "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59 AND end IS NOT NULL"
            ).fetchone()[0]
            counts["nested"] += db.execute(
                "SELECT count(*) FROM NVTX_EVENTS i WHERE eventType = 59 AND EXISTS (SELECT 1 FROM NVTX_EVENTS o "
                "WHERE o.eventType = 59 AND o.globalTid = i.globalTid AND o.rowid != i.rowid AND o.start <= i.start "
                "AND o.end >= i.end)").fetchone()[0]  # fmt: skip
            counts["api"] += db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    lanes = data.rows["lane"].to_numpy()[data.row]
    depth1 = data.rows["label"].str.endswith("level 1").to_numpy()[data.row]
    assert counts == {"compute+NCCL+copies": 168, "nvtx": 32, "nested": 16, "api": 168}
    assert {lane: int((lanes == lane).sum()) for lane in ("NVTX", "CUDA API")} == {
        "NVTX": counts["nvtx"],
        "CUDA API": counts["api"],
    }
    assert int(depth1.sum()) == counts["nested"]
    assert len(data.rows) == 24 and data.intervals == 168 + counts["nvtx"] + counts["api"]
    with load_trace(sample_paths("allreduce-4rank-2022.4")) as trace:
        offset = trace.job_clock()
        k = trace.kernel_columns(["start_ns"])
    assert data.rank_offset == {r: int(offset[r]) for r in range(4)} and offset[3] > 0
    # every kernel sits in its row at its export's time plus that export's offset
    first = (k["start_ns"] + k["export"].map(offset)).min()
    assert data.origin_ns <= first and data.start.min() == data.origin_ns


def _busy_share_on_a_grid(intervals: list[tuple[int, int]], edges: np.ndarray) -> np.ndarray:
    """The oracle: mark every nanosecond some interval covers (t busy when start <= t < end), then
    count the marked nanoseconds of each bin. Brute force, nothing shared with nsysan.intervals."""
    t0 = int(edges[0])
    busy = np.zeros(int(edges[-1]) - t0, dtype=bool)
    for start, end in intervals:
        busy[max(start - t0, 0) : max(end - t0, 0)] = True
    counted = np.concatenate([[0], np.cumsum(busy)])
    return (counted[edges[1:] - t0] - counted[edges[:-1] - t0]) / np.diff(edges)


def test_zoomed_out_rows_show_their_busy_share_and_zoomed_in_every_interval():
    data = _timeline("overlap-slowdown")
    detail = data.figure()
    assert {t.type for t in detail.data} == {"scattergl"}
    coarse = data.figure(row_detail_limit=2, bins=200)
    (heat,) = [t for t in coarse.data if t.type == "heatmap"]  # one heatmap for all rows, coloured by lane
    # every row (all busy here): the GPU's, then the CUDA API calls of the thread that made them
    assert list(heat.y)[:2] == ["rank 0 · GPU 0 · compute", "rank 0 · GPU 0 · copies"]
    assert len(heat.y) == 3 and heat.y[2].startswith("rank 0 · CUDA API tid ")
    # each bin's busy share is the share of its nanoseconds under the row's kernels / copies / calls,
    # read straight from the export (one export, one GPU, no NCCL: its clock is the job clock)
    con = sqlite3.connect(f"file:{sample_paths('overlap-slowdown')[0]}?mode=ro", uri=True)
    rows = [con.execute(f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{table}").fetchall()
            for table in ("KERNEL", "MEMCPY", "RUNTIME")]  # fmt: skip
    con.close()
    every = rows[0] + rows[1] + rows[2]
    assert data.extent_ns == (min(s for s, _ in every), max(e for _, e in every))
    edges = np.linspace(*data.extent_ns, 201).astype(np.int64)  # 200 equal bins over the run
    for busy, intervals in zip(heat.customdata, rows, strict=True):
        expected = _busy_share_on_a_grid(intervals, edges)
        assert expected.sum() > 0 and (expected < 1).any()  # partly busy bins: a real check
        assert np.array(busy, dtype=float) == pytest.approx(expected, abs=0.0005)  # customdata keeps 3 decimals
    # a narrow window around one kernel: back to exact intervals, with the kernel's name on hover
    s, e = int(data.start[5]), int(data.end[5])
    zoomed = data.figure((s, e), row_detail_limit=2)
    assert all(t.type != "heatmap" for t in zoomed.data)
    assert any(
        str(data.names[data.name[5]]) in text
        for t in zoomed.data
        for text in (t.hovertext if t.hovertext is not None else [])
        if text
    )


def test_busy_share_of_a_small_case_worked_by_hand(tmp_path):
    """Kernels A [1000, 1100) and B [1050, 1150) on two streams, E [1020, 1080) inside A, C [1300,
    1400): over (1000, 1400) in 4 bins the GPU is busy 100 %, 50 %, 0 % and 100 % of each bin.
    Summing durations instead of merging would say 160 % and 100 % for the first two."""
    from fixtures.exporter import ExportWriter

    w = ExportWriter(tmp_path / "small.sqlite")
    w.process(100, "python3")
    w.thread(100, 100, "python3")
    w.gpu(0)
    for i, (stream, start, end) in enumerate([(7, 1000, 1100), (8, 1050, 1150), (9, 1020, 1080), (7, 1300, 1400)]):
        w.kernel(100, 0, stream, start, end, f"kernel_{i}", correlation=i + 1)
    with load_trace([w.close()]) as trace:
        data = TimelineData.from_trace(trace)
    assert data.extent_ns == (1000, 1400)
    (heat,) = [t for t in data.figure((1000, 1400), bins=4, row_detail_limit=1).data if t.type == "heatmap"]
    assert list(heat.y) == ["rank 0 · GPU 0 · compute"]
    assert [list(r) for r in heat.customdata] == [[1.0, 0.5, 0.0, 1.0]]
    # the same row through the brute-force oracle, so the oracle itself is checked by hand too
    assert _busy_share_on_a_grid([(1000, 1100), (1050, 1150), (1020, 1080), (1300, 1400)],
                                 np.array([1000, 1100, 1200, 1300, 1400])).tolist() == [1.0, 0.5, 0.0, 1.0]  # fmt: skip


def test_back_to_back_kernels_are_two_bars_and_nested_nvtx_ranges_rows_of_their_own(tmp_path):
    from fixtures.exporter import ExportWriter

    w = ExportWriter(tmp_path / "adjacent.sqlite")
    w.process(100, "python3")
    w.thread(100, 100, "python3")
    w.gpu(0)
    for i, (start, end) in enumerate([(1000, 2000), (2000, 3000), (3000, 3500)]):  # no gap between them
        w.kernel(100, 0, 7, start, end, f"kernel_{i}", correlation=i + 1)
    w.kernel(100, 0, 8, 1500, 1800, "other_stream", correlation=9)  # between them in the row, on its own stream
    for start, end, text in [
        (900, 3600, "step"),
        (950, 2100, "forward"),
        (960, 1990, "layer0"),
        (2100, 3500, "backward"),
    ]:
        w.nvtx_range(100, 100, start, end, text)
    with load_trace([w.close()]) as trace:
        data = TimelineData.from_trace(trace)
    fig = data.figure()
    compute = [t for t in fig.data if t.name == "compute"]
    assert [(t.line.color, list(dict.fromkeys(h.split("<br>")[0] for h in t.hovertext if h))) for t in compute] == [
        (timeline.LANE_COLOURS["compute"], ["kernel_0", "other_stream", "kernel_2"]),
        (timeline.LANE_SHADES["compute"], ["kernel_1"]),
    ]  # fmt: skip
    nvtx = {data.rows["label"].iloc[r]: str(data.names[n]) for r, n in zip(data.row, data.name, strict=True)
            if data.rows["lane"].iloc[r] == "NVTX" and str(data.names[n]) != "backward"}  # fmt: skip
    assert nvtx == {"rank 0 · NVTX tid 100": "step", "rank 0 · NVTX tid 100 · level 1": "forward",
                    "rank 0 · NVTX tid 100 · level 2": "layer0"}  # fmt: skip
    backward = data.rows["label"].iloc[data.row[[str(data.names[n]) == "backward" for n in data.name]]].tolist()
    assert backward == ["rank 0 · NVTX tid 100 · level 1"]  # after forward ended, beside it


def test_nesting_depth_counts_the_ranges_still_open():
    thread = pd.DataFrame({"tid": [1, 1, 1, 1, 1, 1, 2]})
    start = pd.Series([0, 1, 2, 6, 10, 0, 1])
    end = pd.Series([10, 5, 3, 8, 12, 4, 2])  # [0,10] holds [1,5] holds [2,3]; [6,8] in [0,10]; [10,12] after it
    # [0,4] starts with [0,10], inside it (the longer is the outer on a tie), so [1,5], open beside
    # both, is a level further down (ranges that overlap without nesting stack); thread 2 on its own
    assert timeline.nesting_depth(thread, start, end).tolist() == [0, 2, 3, 1, 0, 1, 0]
    one = pd.DataFrame({"tid": [1, 1, 1]})
    # start/end ranges that overlap without nesting: C starts while B (level 1) is open, so it goes below
    overlapping = timeline.nesting_depth(one, pd.Series([1000, 1100, 12000]), pd.Series([10000, 20000, 14000]))
    assert overlapping.tolist() == [0, 1, 2]
    # a zero-length range is open at its own instant: the range starting there is not drawn over it
    zero = timeline.nesting_depth(pd.DataFrame({"tid": [1] * 4}), pd.Series([1000, 2000, 5000, 5000]),
                                  pd.Series([10000, 5000, 5000, 7000]))  # fmt: skip
    assert zero.tolist() == [0, 1, 2, 1]


def test_one_long_interval_does_not_keep_a_zoomed_row_coarse(tmp_path):
    from fixtures.exporter import ExportWriter

    w = ExportWriter(tmp_path / "long.sqlite")
    w.process(100, "python3")
    w.thread(100, 100, "python3")
    w.gpu(0)
    w.kernel(100, 0, 7, 0, 10**9, "long_running_kernel", correlation=1)  # spans the whole run
    for i in range(3000):
        w.kernel(100, 0, 8, 1000 + i * 10_000, 1000 + i * 10_000 + 5_000, "short_kernel", correlation=2 + i)
    with load_trace([w.close()]) as trace:
        data = TimelineData.from_trace(trace)
    window = (20_000_000, 20_050_000)  # 50 us: five short kernels and the long one
    fig = data.figure(window)
    assert all(t.type != "heatmap" for t in fig.data)
    x = np.concatenate([np.asarray(t.x, dtype=float) for t in fig.data])  # every other interval a shade darker
    hover = [h for t in fig.data for h in t.hovertext]
    assert np.isnan(x).sum() == 6  # six segments, each ended by a gap
    # hover anywhere on a bar: the long kernel has a point (with its name) every 1/80 of the window
    long = [xi for xi, h in zip(x, hover, strict=True) if h.startswith("long_running_kernel")]
    inside = sorted(v for v in long if not np.isnan(v) and data.ms_since_origin(window[0]) <= v
                    <= data.ms_since_origin(window[1]))  # fmt: skip
    assert len(inside) >= timeline.HOVER_POINTS == 80
    assert max(np.diff(inside)) <= (window[1] - window[0]) / timeline.HOVER_POINTS / 1e6 + 1e-9
    assert any(t.type == "heatmap" for t in data.figure().data)  # zoomed out: 3,001 is over the limit


def test_a_finding_is_marked_and_its_evidence_outlined():
    data = _timeline("pipeline-stall")
    finding = {"id": 7, "rank": 2, "device": 2, "severity": "critical", "title": "stall", "start_ns": 10_035_000,
               "end_ns": 15_056_000, "evidence": {"blocked_op": {"correlation_id": 1002}, "blocking_op": {"correlation_id": 1001}}}  # fmt: skip
    assert evidence_correlation_ids(finding["evidence"]) == {1001, 1002}
    fig = data.figure(data.window_for(finding), [finding], highlight=finding)
    markers = [t for t in fig.data if t.name == "findings"]
    assert list(markers[0].customdata) == [7] and markers[0].y[0] == "rank 2 · GPU 2 · NCCL"
    (evidence,) = [t for t in fig.data if t.name == "evidence"]
    assert np.isnan(np.asarray(evidence.x, dtype=float)).sum() == 2  # two kernels: (start, points, end, gap) each
    assert fig.layout.shapes[0].y0 == 5.5 and fig.layout.shapes[0].y1 == 8.5  # rank 2's rows (NCCL, NVTX, CUDA API)


MS = 1_000_000


def _found(n: int, group: str, impact_ms: float, severity: str = "critical", status: str = "open", rank: int | None = 0,
           assignee: str | None = None) -> dict:  # fmt: skip
    """Finding ``n`` as the store returns it."""
    return {"id": n, "trace_id": 1, "kind": "comm_compute_slowdown", "group": group, "severity": severity, "rank": rank,
            "device": 0, "pid": 9, "start_ns": n * 10 * MS, "end_ns": n * 10 * MS + 2 * MS,
            "impact_ns": int(impact_ms * MS), "title": f"slowed [{n}]", "evidence": {}, "advice": "overlap less",
            "status": status, "assignee": assignee, "version": 1}  # fmt: skip


def test_findings_of_one_group_fold_into_one_headline():
    from dashboards.pages.findings import headlines

    g = "comm_compute_slowdown|rank 0|device 0|sgemm|nccl"
    found = [_found(1, g, 1, status="confirmed", assignee="ada"), _found(2, g, 5), _found(3, g, 2),
             _found(4, "", 3, severity="warning")]  # fmt: skip
    rows = headlines(found)
    assert [(r["id"], r["count"], r["impact_ms"], r["worst_ms"], r["worst_id"], r["severity"]) for r in rows] == [
        (g, 3, 8.0, 5.0, 2, "critical"),
        ("#4", 1, 3.0, 3.0, 4, "warning"),
    ]
    assert rows[0]["title"] == r"[slowed \[2\]](/findings/2)"  # the worst occurrence, linked to its page
    assert (rows[0]["status"], rows[0]["assignee"], rows[0]["rank"]) == ("2 open, 1 confirmed", "ada", 0)
    assert (rows[1]["status"], rows[1]["assignee"]) == ("open", "")
    assert headlines([_found(1, g, 1, rank=0), _found(2, g, 1, rank=1)])[0]["rank"] is None  # differing: empty


def test_the_grid_sorts_severity_by_rank_with_named_comparators():
    """The grid sorts in the browser (the browser test clicks the header); here: the rows carry the
    rank the severity column's comparator reads, and every column sorts empty cells last."""
    from dashboards.pages.findings import COLUMNS, grid, headlines

    rows = headlines([_found(1, "", 9, "info"), _found(2, "", 1, "critical"), _found(3, "", 5, "warning")])
    assert [(r["severity"], r["severity_rank"]) for r in rows] == [("critical", 2), ("warning", 1), ("info", 0)]
    (severity,) = [c for c in COLUMNS if c["field"] == "severity"]
    script = (Path(dashboards.__file__).parent / "assets" / "grid.js").read_text()
    assert severity["comparator"] == {"function": "nsysanSeverityOrder"} and "nodeA.data.severity_rank" in script
    table = grid("t", COLUMNS, rows)
    assert table.defaultColDef["comparator"] == {"function": "nsysanOrder"} and "dagfuncs.nsysanOrder" in script
    assert table.getRowId == "params.data.id" and table.dashGridOptions["domLayout"] == "autoHeight"
    assert grid("t", COLUMNS, rows * 61).dashGridOptions["domLayout"] == "normal"  # many rows: virtual scrolling


def test_a_group_lists_its_occurrences_each_linked():
    from dashboards.pages.findings import occurrences

    g = "comm_compute_slowdown|rank 0|device 0|sgemm|nccl"
    listing = occurrences([_found(1, g, 1), _found(2, g, 5), _found(3, g, 2)])
    heading, table = listing.children
    assert heading.children == "3 occurrences of comm_compute_slowdown on rank 0, GPU 0, pid 9 · 8 ms in all"
    assert [r["title"].rsplit("(", 1)[1] for r in table.rowData] == ["/findings/2)", "/findings/3)", "/findings/1)"]


def test_one_timeline_marker_per_group_at_its_worst_occurrence():
    data = _timeline("pipeline-stall")
    g = "nccl_ordering_stall|rank 2|stream 13"
    found = [_found(1, g, 1, rank=2), _found(2, g, 5, rank=2), _found(3, g, 2, rank=2), _found(4, "", 3, rank=1)]
    (markers,) = [t for t in data.figure(None, found).data if t.name == "findings"]
    assert list(markers.customdata) == [2, 4]
    assert "worst of 3 occurrences, 8.00 ms in all" in markers.hovertext[0] and "worst" not in markers.hovertext[1]


def test_routes_take_ids_only():
    assert route("/traces/12", "") == ("overview", {"trace_id": 12})
    assert route("/findings/3", "") == ("finding", {"finding_id": 3})
    assert route("/compare", "?before=1&after=x") == ("compare", {"before": 1})
    assert route("/compare", "?before=%C2%B2&after=2") == ("compare", {"after": 2})  # "²" is a digit to str.isdigit
    for bad in ("/traces/../../etc/passwd", "/traces/1x", "/files//etc/passwd", "/traces/1/../2",
                "/traces/99999999999999999999", "/traces/\u0662"):  # fmt: skip
        assert route(bad, "")[0] is None


@pytest.fixture
def server(tmp_path):
    s = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads", max_upload_bytes=2 * 2**20)
    yield s
    s.analysis.shutdown()


def _streams(data: bytes, name: str) -> list[tuple[str, io.BytesIO]]:
    return [(name, io.BytesIO(data))]


def test_upload_is_validated_before_anything_is_kept(server, tmp_path):
    good = (SAMPLES_DIR / "pipeline-stall.sqlite").read_bytes()
    with pytest.raises(UploadRefused, match="over the limit of 2 MiB"):
        save_upload_streams(server, _streams(b"\0" * (3 * 2**20), "big.sqlite"))
    with pytest.raises(UploadRefused, match="not an nsys SQLite export"):
        save_upload_streams(server, _streams(good, "report.nsys-rep"))
    with pytest.raises(UploadRefused, match=r"^fake\.sqlite: not an SQLite file") as refused:
        save_upload_streams(server, _streams(b"hello, not a database" * 100, "fake.sqlite"))
    assert str(server.uploads_dir) not in str(refused.value)  # the uploader is not told our paths
    assert not any(server.uploads_dir.iterdir()) and server.store.traces() == []
    trace_id = save_upload_streams(server, _streams(good, "../../etc/evil name.sqlite"))
    (path,) = server.store.trace_paths(trace_id)
    assert path.startswith(str(server.uploads_dir.resolve())) and path.endswith("/evil_name.sqlite")
    assert server.analysis.wait(60) and server.store.trace(trace_id)["status"] == "ready"
    assert "nccl_ordering_stall" in {f["kind"] for f in server.store.findings(trace_id)}  # analysed: the stall found


def test_scan_registers_each_file_and_each_directory_of_ranks_once(server, tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(SAMPLES_DIR / "allreduce-4rank-2022.4", traces / "job-a")
    shutil.copy(SAMPLES_DIR / "graph-gap.sqlite", traces)
    (traces / "broken.sqlite").write_text("not an export")
    before = {p: sha256(p) for p in traces.rglob("*.sqlite")}
    assert [len(j) for j in jobs_in(traces)] == [1, 1, 4]
    server.traces_dir = traces
    found = scan_directory(server)
    assert len(found.ids) == 2 and len(found.errors) == 1 and "broken.sqlite" in found.errors[0]
    assert server.analysis.wait(60)
    assert {t["name"]: t["status"] for t in server.store.traces()} == {"graph-gap": "ready", "job-a": "ready"}
    assert scan_directory(server).ids == []  # nothing registered twice
    # the refused export stays listed, with why, in reviewers' terms (no server paths)
    assert server.refused == [found.errors[0]] and found.errors[0].startswith("broken.sqlite: ")
    page = str(library_page.layout(server).to_plotly_json())
    assert "Not registered from traces/ (1):" in page and found.errors[0] in page
    assert {p: sha256(p) for p in traces.rglob("*.sqlite")} == before  # read-only


def test_the_library_shows_review_progress_and_what_is_yours(server):
    trace_id = save_upload_streams(server, _streams((SAMPLES_DIR / "pipeline-stall.sqlite").read_bytes(), "a.sqlite"))
    assert server.analysis.wait(60)
    found = server.store.findings(trace_id)
    server.store.update_findings({f["id"]: f["version"] for f in found[:2]}, status="confirmed", assignee="ana")
    server.store.update_findings({found[2]["id"]: found[2]["version"]}, status="fixed", assignee="ana")
    row = library_page._traces(server, "ana").children[1].children[0]
    cells = {getattr(c, "className", None): c.children for c in row.children}
    assert cells["review"] == f"{len(found) - 3} open, 2 confirmed, 1 fixed"
    assert cells["yours"] == 2  # open or confirmed, assigned to ana
    row = library_page._traces(server, None).children[1].children[0]
    assert {getattr(c, "className", None): c.children for c in row.children}["yours"] == ""


def test_a_group_triaged_from_the_findings_page_says_what_it_did(server):
    from dashboards.pages.findings import headlines, triage

    trace_id = save_upload_streams(server, _streams((SAMPLES_DIR / "pipeline-stall.sqlite").read_bytes(), "a.sqlite"))
    assert server.analysis.wait(60)
    everything = server.store.findings(trace_id)
    group = [f for f in everything if f["group"] == "exposed_communication"]
    listed = {str(f["id"]): f["version"] for f in group}
    shown = headlines(everything)
    at = [r["id"] for r in shown].index("exposed_communication")

    def said(panel) -> str:
        return str(panel.to_plotly_json())

    panel, rows = triage(server, trace_id, listed, None, "  ", "ana", shown)  # nothing chosen
    assert "Not saved: choose a status or an assignee to set" in said(panel)
    for damaged in ({"abc": 1}, {str(10**20): 1}, {"999999": 1}, {str(group[0]["id"]): "1"}, ["1"]):
        panel, rows = triage(server, trace_id, damaged, "fixed", None, "ana", shown)
        assert "Not saved: this page's state is damaged" in said(panel) and rows is dash.no_update
    server.users = {"ana": hash_password("a long enough password")}  # login on: assignees are its users
    panel, rows = triage(server, trace_id, listed, None, "zed", "ana", shown)
    assert "Not saved: 'zed' is not a user of this server" in said(panel)
    server.users = {}
    assert {f["status"] for f in server.store.findings(trace_id)} == {"open"}  # nothing saved
    first = group[0]
    server.store.update_finding(first["id"], based_on_version=first["version"], assignee="bob", author="bob")
    panel, rows = triage(server, trace_id, listed, "confirmed", None, "ana", shown)
    text = said(panel)
    assert f"Set status confirmed on {len(group) - 1} occurrences" in text and f"#{first['id']}" in text
    assert "error stale" in text  # someone else's save: said, not overwritten
    assert [r["id"] for r in rows] == [r["id"] for r in shown]  # every row where it was
    assert rows[at]["status"] == f"1 open, {len(group) - 1} confirmed"
    assert server.store.finding(first["id"])["status"] == "open"


def test_the_library_sorts_by_what_a_reviewer_picks(server):
    first = save_upload_streams(server, _streams((SAMPLES_DIR / "pipeline-stall.sqlite").read_bytes(), "zeta.sqlite"))
    second = save_upload_streams(server, _streams((SAMPLES_DIR / "graph-gap.sqlite").read_bytes(), "alpha.sqlite"))
    assert server.analysis.wait(60)
    (mine,) = server.store.findings(second)[:1]
    server.store.update_findings({mine["id"]: mine["version"]}, assignee="ana")
    counts = {t["id"]: t["findings"] for t in server.store.traces()}

    def order(sort: str) -> list[str]:
        rows = library_page._traces(server, "ana", sort).children[1].children
        return [r.children[0].children for r in rows]

    assert order("id") == [first, second] and order("newest") == [second, first]
    assert order("name") == [second, first]  # alpha, zeta
    assert order("yours") == [second, first]
    more_critical = max((first, second), key=lambda t: (counts[t]["critical"], counts[t]["warning"], -t))
    assert order("critical")[0] == more_critical
    assert order("no such order") == [first, second]  # a stale choice: the default order


def test_search_across_traces_lists_one_line_per_group(server):
    for name in ("a.sqlite", "b.sqlite"):  # the same job twice: each trace's groups apart
        save_upload_streams(server, _streams((SAMPLES_DIR / "pipeline-stall.sqlite").read_bytes(), name))
    assert server.analysis.wait(60)
    found = server.store.search_findings("sendrecv")
    exposed = [f for f in found if f["group"] == "exposed_communication"]
    per_trace = len(exposed) // 2
    assert per_trace >= 2 and len(exposed) == 2 * per_trace  # the same transfers in each trace
    hint, listing = library_page.search_results(server, "sendrecv").children
    lines = [str(li.to_plotly_json()) for li in listing.children]
    groups = {(f["trace_id"], f["group"]) for f in found}
    assert hint.children == f"{len(found)} findings in {len(groups)} groups:" and len(lines) == len(groups)
    assert sum(f"{per_trace} occurrences" in line and "exposed_communication" in line for line in lines) == 2
    assert library_page.search_results(server, "no such kernel").children == "No finding holds 'no such kernel'."


def test_search_groups_by_trace_and_group_key_not_by_kind(server, monkeypatch):
    def hit(n: int, trace: int, group: str, impact: int) -> dict:
        return {"id": n, "trace_id": trace, "trace_name": f"job-{trace}", "group": group, "kind": "late_rank",
                "title": f"finding {n}", "severity": "warning", "rank": 1, "device": 0, "pid": 7,
                "status": "open", "assignee": None, "impact_ns": impact}  # fmt: skip

    found = [hit(1, 1, "late_rank|rank 1", 9), hit(2, 1, "late_rank|rank 2", 8), hit(3, 1, "late_rank|rank 1", 7),
             hit(4, 2, "late_rank|rank 1", 6), hit(5, 1, "", 5), hit(6, 1, "", 4)]  # fmt: skip
    monkeypatch.setattr(server.store, "search_findings", lambda text, limit: found[:limit])
    hint, listing = library_page.search_results(server, "late").children
    lines = [str(li.to_plotly_json()) for li in listing.children]
    assert hint.children == "6 findings in 5 groups:"
    assert ["finding 1" in lines[0], "2 occurrences" in lines[0], "finding 3" in lines[0]] == [True, True, False]
    assert all("occurrences" not in line for line in lines[1:])  # rank 2's, trace 2's, and each ungrouped one


def test_a_capture_run_directory_is_named_by_the_directory(server, tmp_path):
    runs = tmp_path / "nsysan-runs"  # as `nsysan capture` leaves them: one report.sqlite per run
    for run, sample in (("20260101-120000-pipeline", "pipeline-stall"), ("20260101-130000-pipeline", "graph-gap")):
        (runs / run).mkdir(parents=True)
        shutil.copy(SAMPLES_DIR / f"{sample}.sqlite", runs / run / "report.sqlite")
        (runs / run / "manifest.json").write_text("{}")
    (runs / "latest").symlink_to("20260101-130000-pipeline")  # as capture points it: not a third trace
    server.traces_dir = runs
    assert len(scan_directory(server).ids) == 2 and server.refused == []
    assert sorted(t["name"] for t in server.store.traces()) == ["20260101-120000-pipeline", "20260101-130000-pipeline"]
    assert "Not registered" not in str(library_page.layout(server).to_plotly_json())
    assert server.analysis.wait(60)


def test_users_come_hashed_from_a_file_or_the_environment(tmp_path):
    hashed = hash_password("correct horse")
    users_file = tmp_path / "users.toml"
    users_file.write_text(f'[users]\nalice = "{hashed}"\n')
    assert load_users(users_file, f"bob={hashed}") == {"alice": hashed, "bob": hashed}
    with pytest.raises(InputError, match="must be a hash"):
        load_users(None, "bob=plaintext")
    users_file.write_text("users = 3")
    with pytest.raises(InputError, match=r"\[users\] table"):
        load_users(users_file)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")
    assert _safe_next("/traces/1?x=2") == "/traces/1?x=2"
    for bad in ("//evil.example/", "https://x", "/\t/evil.example", "/\n", "/\\evil.example", "evil.example", "/ /x"):
        assert _safe_next(bad) == "/", bad


def test_the_findings_page_callbacks_fold_filter_and_list_occurrences(server):
    """Through Dash's own HTTP endpoint, as the browser calls them: filter the headlines, pick one."""
    from dashboards.app import create_app
    from nsysan.store.models import FindingRecord

    trace_id = server.store.register(sample_paths("pipeline-stall"))
    g = "comm_compute_slowdown|rank 0|device 0|sgemm|nccl"
    found = [_found(1, g, 1, "info"), _found(2, g, 2, "info"), _found(3, g, 3, "info"), _found(4, "", 4, "critical"),
             _found(5, "", 5, "warning")]  # fmt: skip
    with server.store.session() as s, s.begin():
        s.add_all(FindingRecord(**(f | {"trace_id": trace_id})) for f in found)
    app = create_app(server)
    client = app.server.test_client()
    filters = [{"id": key, "property": "value", "value": None} for key in FILTERS]
    trace = {"id": ids.TRACE_ID, "property": "data", "value": trace_id}
    text = {"id": ids.FILTER_TEXT, "property": "value", "value": None}

    def call(body: dict) -> dict:
        answer = client.post("/_dash-update-component", json=body, headers={"Host": "127.0.0.1"})
        assert answer.status_code == 200, answer.data
        return answer.get_json()["response"]

    text["value"] = "slow"  # a text filter: the findings the test added, worst first; the picked row goes
    (key,) = [k for k in app.callback_map if k.startswith(f"..{ids.FINDINGS_TABLE}.rowData...")]  # "@hash": a duplicate
    table = call({"output": key,
                  "outputs": [dict(zip(("id", "property"), o.rsplit(".", 1), strict=True)) for o in key.strip(".").split("...")],
                  "inputs": [*filters, text], "state": [trace], "changedPropIds": [f"{ids.FILTER_TEXT}.value"]})  # fmt: skip
    rows = table[ids.FINDINGS_TABLE]["rowData"]
    assert [(r["severity"], r["count"], r["impact_ms"]) for r in rows] == [("critical", 1, 4.0), ("warning", 1, 5.0),
                                                                          ("info", 3, 6.0)]  # fmt: skip
    assert table[ids.FINDINGS_TABLE]["selectedRows"] == []
    picked = {"id": ids.FINDINGS_TABLE, "property": "selectedRows", "value": [rows[2]]}
    listed = {"id": ids.LISTED_GROUP, "property": "data", "value": None}
    listing = call({"output": f"..{ids.OCCURRENCES}.children...{ids.LISTED_GROUP}.data..",
                    "outputs": [{"id": ids.OCCURRENCES, "property": "children"}, {"id": ids.LISTED_GROUP, "property": "data"}],
                    "inputs": [picked], "state": [*filters, text, trace, listed],
                    "changedPropIds": [f"{ids.FINDINGS_TABLE}.selectedRows"]})  # fmt: skip
    assert listing[ids.LISTED_GROUP]["data"] == rows[2]["id"]
    heading, triage, occurrences = listing[ids.OCCURRENCES]["children"]["props"]["children"]
    assert heading["props"]["children"].startswith("3 occurrences of comm_compute_slowdown")
    versions, *_, button, _message = triage["props"]["children"]  # the group's triage form, its versions as listed
    assert versions["props"]["data"] == {"1": 1, "2": 1, "3": 1}
    assert button["props"]["children"] == "Set all 3 occurrences"
    assert [r["title"].rsplit("(", 1)[1] for r in occurrences["props"]["rowData"]] == [
        f"/findings/{i})" for i in (3, 2, 1)
    ]


def test_without_login_only_loopback_host_names_are_answered(server):
    from dashboards.app import create_app

    client = create_app(server).server.test_client()
    assert client.get("/", headers={"Host": "127.0.0.1:8050"}).status_code == 200
    assert client.get("/", headers={"Host": "localhost"}).status_code == 200
    # a server started on another loopback address answers it (issue 31: 127.0.0.2 refused everything)
    for host in ("127.0.0.2:8050", "[::1]:8050", "[::1]", "LOCALHOST:8050"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host
    for host in ("attacker.example:8050", "127.0.0.1.attacker.example", "10.0.0.1:8050", "[::2]:8050", "[::1]evil.example",
                 "[::1]@evil.example", "[::1]:80:90"):  # fmt: skip
        refused = client.get("/", headers={"Host": host})  # DNS rebinding to 127.0.0.1, or not loopback
        assert refused.status_code == 403 and b"without login" in refused.data, host


def test_serving_beyond_loopback_without_users_is_refused(tmp_path):
    result = subprocess.run([sys.executable, "-m", "nsysan", "serve", "--host", "0.0.0.0", "--db", str(tmp_path / "s.sqlite")],
                            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "login is required" in result.stderr and not (tmp_path / "s.sqlite").exists()


def test_hash_password_prints_a_hash_that_verifies():
    from werkzeug.security import check_password_hash

    result = subprocess.run([sys.executable, "-m", "nsysan", "hash-password"], input="s3cret-pass\ns3cret-pass\n",
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert check_password_hash(result.stdout.strip(), "s3cret-pass")


def test_the_finding_page_shows_evidence_on_the_timelines_clock_and_says_what_is_drawn(tmp_path):
    """Evidence times are ms since the first activity (the axis), not the export's raw ns, and the
    header names the ops drawn red on both ranks of an ordering stall."""
    from dashboards.analysis import analyse_stored_trace
    from dashboards.pages import finding as page
    from dashboards.server import Server
    from nsysan.store import ReviewStore

    store = ReviewStore(tmp_path / "r.sqlite")
    trace_id = store.register(sample_paths("pipeline-stall"), name="pipeline-stall")
    analyse_stored_trace(store, trace_id)
    (stall,) = [f for f in store.findings(trace_id) if f["kind"] == "nccl_ordering_stall"]
    server = Server(store, traces_dir=None, uploads_dir=tmp_path / "up", max_upload_bytes=2**20)
    text = str(page.layout(server, stall["id"]))
    assert "drawn red: ncclDevKernel_SendRecv" in text and "rank 3" in text and "rank 2" in text
    assert "ms since first activity" in text
    ready_ns = stall["evidence"]["blocked_op"]["ready_ns"]
    data = server.timelines.get(trace_id)
    expected = data.ms_since_origin(data.to_job_clock(stall, ready_ns))
    assert f"{expected:,.3f} ms since first activity" in text


def test_markup_in_a_kernel_name_is_shown_as_text_in_hover_labels(tmp_path):
    """Plotly draws links and styled spans in hover labels: a kernel name (or a finding's title,
    which quotes it) holding markup must show as the characters it is (issue 31 item 8)."""
    from fixtures.exporter import ExportWriter

    evil = '<a href="https://evil.example">click</a><span style="font-size:60px">big</span>'
    w = ExportWriter(tmp_path / "markup.sqlite")
    w.process(100, "python3")
    w.thread(100, 100, "python3")
    w.gpu(0)
    w.kernel(100, 0, 7, 1000, 1100, evil, correlation=1, short_name=evil)
    with load_trace([w.close()]) as trace:
        data = TimelineData.from_trace(trace)
    finding = {"id": 1, "kind": "comm_compute_slowdown", "severity": "warning", "rank": 0, "device": 0,
               "start_ns": 1000, "end_ns": 1100, "impact_ns": 50, "title": f"{evil} 1.5x slower", "evidence": {}}  # fmt: skip
    fig = data.figure((1000, 1100), [finding], row_detail_limit=10)
    hovers = [str(h) for t in fig.data for h in (t.hovertext if t.hovertext is not None else [])]
    hovers += [str(a.hovertext) for a in fig.layout.annotations]
    assert any("&lt;a href=" in h for h in hovers), hovers
    assert any("1.5x slower" in h for h in hovers) and not any("<a " in h or '<span style="font' in h for h in hovers)


def test_zoomed_in_the_bars_wide_enough_are_labelled_with_their_names(monkeypatch):
    data = _timeline("pipeline-stall")
    labelled = [a for a in data.figure().layout.annotations if a.name == "label"]
    # the whole 8.8 ms run: 12 kernels and 4 NVTX ranges, those at least 1/30 of the window named
    assert {a.text for a in labelled} == {"ncclDevKern…", "step 0"}
    for a in labelled:
        assert len(a.text) <= 12 and a.font.color == "#fff"
    s, e = int(data.start[0]), int(data.end[0])
    narrow = data.figure((s + (e - s) // 3, s + (e - s) // 2))  # inside one bar: its name on it
    row = data.rows["label"].iloc[data.row[0]]
    (label,) = [a for a in narrow.layout.annotations if a.name == "label" and a.y == row]
    assert str(data.names[data.name[0]]).startswith(label.text.rstrip("…"))
    monkeypatch.setattr(timeline, "LABEL_LIMIT", len(labelled) - 1)  # more wide bars than that: none named
    assert not [a for a in data.figure().layout.annotations if a.name == "label"]
