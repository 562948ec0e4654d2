"""The trace overview's step breakdown without a browser: the stacked bars against the report's own
`steps` section, the rank selection of a big job, the note for a document without steps, a click on
a bar zooming the timeline to that step, and the compare page's breakdown table."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from dashboards import breakdown, ids
from dashboards.analysis import stored_steps
from dashboards.comparison import compare_traces
from dashboards.pages import compare as compare_page
from dashboards.pages import overview
from dashboards.server import Server
from fixtures.samples import sample_paths
from nsysan.diff import diff_documents, load_side
from nsysan.diff.compare import CATEGORIES
from nsysan.store import ReviewStore

MS = 1e6


@pytest.fixture
def server(tmp_path):
    s = Server(ReviewStore(tmp_path / "review.sqlite"), uploads_dir=tmp_path / "uploads")
    yield s
    s.analysis.shutdown()


def _analysed(server: Server, sample: str) -> int:
    trace_id = server.store.register(sample_paths(sample), name=sample)
    server.analysis.submit(trace_id)
    assert server.analysis.wait(120)
    assert server.store.trace(trace_id)["status"] == "ready", server.store.trace(trace_id)["error"]
    return trace_id


def _report(sample: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "nsysan", "report", *map(str, sample_paths(sample)), "--format", "json",
                          "--no-cache"], capture_output=True, text=True, check=False)  # fmt: skip
    assert out.stdout, out.stderr
    return json.loads(out.stdout)


def test_one_trace_per_category_with_each_steps_values():
    steps = _report("allreduce-2rank")["steps"]
    ranks = steps["ranks"]
    assert len(ranks) == 2 and all(len(r["start_ns"]) > 1 for r in ranks.values())  # several steps a rank
    fig = breakdown.figure(steps)
    assert [t.name for t in fig.data] == [
        "compute",
        "communication exposed",
        "waiting for peer",
        "copy exposed",
        "idle",
    ]
    assert [t.marker.color for t in fig.data] == [breakdown.CATEGORY_COLOURS[c] for c in CATEGORIES]
    assert fig.layout.barmode == "stack" and fig.layout.xaxis.type == "multicategory"
    order = sorted(ranks, key=int)
    expected_x = [[f"rank {r}" for r in order for _ in ranks[r]["start_ns"]],
                  [str(i) for r in order for i in range(len(ranks[r]["start_ns"]))]]  # fmt: skip
    for c, trace in zip(CATEGORIES, fig.data, strict=True):
        assert [list(level) for level in trace.x] == expected_x
        assert list(trace.y) == pytest.approx([ns / MS for r in order for ns in ranks[r]["breakdown_ns"][c]])
    # a bar adds up to its step, and its hover lists the step, the rank and each category in ms and %
    bars = [(rank, i) for rank in order for i in range(len(ranks[rank]["start_ns"]))]
    for j, (r, i) in enumerate(bars):
        total = sum(t.y[j] for t in fig.data)
        assert total == pytest.approx((ranks[r]["end_ns"][i] - ranks[r]["start_ns"][i]) / MS)
        for segment in fig.data:
            hover = _hover(segment, j)
            assert hover.startswith(f"<b>{segment.name}</b><br>rank {r}, step {i}: {total:,.3f} ms<br>")
            for c in CATEGORIES:
                ms = ranks[r]["breakdown_ns"][c][i] / MS
                shown = re.search(rf"<br>{c.replace('_', ' ')}: ([0-9.,]+) ms \(([0-9.]+)%\)", hover)
                assert shown is not None, hover
                assert float(shown[1].replace(",", "")) == pytest.approx(ms, abs=0.0005)
                assert float(shown[2]) == pytest.approx(100 * ms / total, abs=0.051)


def _hover(trace, bar: int) -> str:
    """A bar segment's hover text as plotly.js composes it from the trace's template and customdata
    (``%{customdata[i]:FMT}``, d3-format; the formats used here read the same in Python)."""
    custom = trace.customdata[bar]

    def fill(m: re.Match) -> str:
        return format(custom[int(m[1])], m[2] or "")

    text = re.sub(r"%\{customdata\[(\d+)\](?::([^}]*))?\}", fill, trace.hovertemplate)
    assert "%{" not in text  # every placeholder filled
    return text.removesuffix("<extra></extra>")


def _job(n: int) -> dict:
    """A synthetic steps section of n ranks, 3 steps each: rank r computes r ms a step; rank 5 is the
    critical one in two steps of three."""
    ranks = {}
    for r in range(n):
        compute = [r * 1_000_000] * 3
        wait = [(n - r) * 100_000] * 3
        ranks[str(r)] = {"export": 0, "start_ns": [0, 100_000_000, 200_000_000],
                         "end_ns": [c + w for c, w in zip(compute, wait, strict=True)],
                         "breakdown_ns": {"compute": compute, "communication_exposed": [0] * 3, "waiting_for_peer": wait,
                                          "copy_exposed": [0] * 3, "idle": [0] * 3}}  # fmt: skip
        ranks[str(r)]["end_ns"] = [
            s + d for s, d in zip(ranks[str(r)]["start_ns"], ranks[str(r)]["end_ns"], strict=True)
        ]
    return {"version": 1, "source": "nvtx", "detail": None, "job": {"critical_rank": [5, 5, 7]}, "ranks": ranks}


def test_up_to_eight_ranks_all_drawn_beyond_the_critical_and_least_median_most_working():
    assert [s.label for s in breakdown.shown_ranks(_job(8))] == [f"rank {r}" for r in range(8)]
    shown = breakdown.shown_ranks(_job(64))
    assert [s.label for s in shown] == ["rank 5 · critical", "rank 0 · least work", "rank 32 · median work",
                                        "rank 63 · most work"]  # fmt: skip
    fig = breakdown.figure(_job(64))
    assert len(fig.data) == len(CATEGORIES) and len(fig.data[0].y) == 4 * 3  # four ranks of three steps
    assert list(fig.data[0].y[:3]) == [5.0, 5.0, 5.0]  # rank 5's compute, the critical rank first
    assert "64 ranks" in breakdown.caption(_job(64)) and "64 ranks" not in breakdown.caption(_job(8))


def test_the_overview_draws_the_stored_steps_and_a_click_zooms_the_timeline(server):
    trace_id = _analysed(server, "pipeline-stall")
    report = _report("pipeline-stall")
    assert stored_steps(server.store, trace_id) == report["steps"]
    assert "steps" not in overview.stored_summary(server, trace_id)  # kept apart from the library's summary
    page = overview.layout(server, trace_id, search="")
    graphs = [c for c in _walk(page) if getattr(c, "id", None) == ids.STEP_BREAKDOWN]
    assert len(graphs) == 1
    fig = graphs[0].figure
    rank2 = [j for j, x in enumerate(fig.data[0].x[0]) if x == "rank 2"]
    assert [fig.data[2].y[j] for j in rank2] == pytest.approx(
        [ns / MS for ns in report["steps"]["ranks"]["2"]["breakdown_ns"]["waiting_for_peer"]]
    )
    # a click on rank 2's bar: the timeline shows rank 2's step, on the timeline's clock
    data = server.timelines.peek(trace_id)
    assert data is not None
    click = {"points": [{"customdata": list(fig.data[2].customdata[rank2[0]]), "curveNumber": 2}]}
    view = overview.step_view(data, report["steps"], click, {"finding": 3})
    start, end = report["steps"]["ranks"]["2"]["start_ns"][0], report["steps"]["ranks"]["2"]["end_ns"][0]
    t0, t1 = (data.ms_since_origin(data.to_job_clock({"rank": 2}, ns)) for ns in (start, end))
    assert view is not None and view["finding"] == 3 and view["t0"] < t0 < t1 < view["t1"]
    assert view["t1"] - view["t0"] == pytest.approx((t1 - t0) * 1.1)
    assert overview.step_view(data, report["steps"], {"points": [{"customdata": "x"}]}, None) is None
    assert overview.step_view(data, report["steps"], None, None) is None
    assert overview.step_view(data, report["steps"], {"points": [{"customdata": [2, 99]}]}, None) is None  # no step 99
    assert overview.step_view(data, None, click, None) is None  # no steps stored


def _walk(component):
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children] if children is not None else []:
        if hasattr(child, "to_plotly_json"):
            yield from _walk(child)


def test_a_document_without_steps_shows_a_note_instead(server):
    trace_id = server.store.register(sample_paths("pipeline-stall"), name="old")
    server.store.start_analysis(trace_id)
    old = {k: v for k, v in load_side(str(sample_paths("pipeline-stall")[0])).items() if k != "steps"}
    server.store.save_analysis(trace_id, old)  # as an nsysan without steps stored it
    assert stored_steps(server.store, trace_id) is None
    page = overview.layout(server, trace_id, search="")
    notes = [c for c in _walk(page) if getattr(c, "id", None) == ids.STEP_BREAKDOWN_NOTE]
    assert len(notes) == 1 and notes[0].children.startswith("No step breakdown: this trace was analysed by an nsysan")
    assert not [c for c in _walk(page) if getattr(c, "id", None) == ids.STEP_BREAKDOWN]
    none_found = {"version": 1, "source": None, "detail": "no GPU work", "ranks": {}}
    assert breakdown.unavailable(none_found) == (
        'No step breakdown: no steps found (no GPU work). Mark each step with an NVTX range named "step N".'
    )


def test_the_compare_page_shows_the_breakdown_as_the_cli_does(server):
    ids_ = [_analysed(server, name) for name in ("pipeline-stall", "pipeline-stall-fixed")]
    c = compare_traces(server.store, *ids_)
    cli = diff_documents(*(load_side(str(sample_paths(n)[0])) for n in ("pipeline-stall", "pipeline-stall-fixed")))
    assert c.diff["breakdown"] == cli["breakdown"] and c.diff["breakdown"]["available"]
    text = str(compare_page._result(server, *ids_))
    assert "Where step time went (mean per step over ranks; steps from nvtx)" in text and "waiting for peer" in text
    # the same figures as bars: the job, then each rank (4: all drawn), before and after, by category
    (graph,) = [
        g for g in _walk(compare_page._result(server, *ids_)) if getattr(g, "id", None) == ids.COMPARE_BREAKDOWN
    ]
    bars = {t.name: t for t in graph.figure.data}
    assert list(bars) == [breakdown.CATEGORY_LABELS[cat] for cat in CATEGORIES]
    b = c.diff["breakdown"]
    columns = [("job", b["job"])] + [(f"rank {r['rank']}", r["categories"]) for r in b["per_rank"]]
    assert len(columns) == 5
    for cat in CATEGORIES:
        trace = bars[breakdown.CATEGORY_LABELS[cat]]
        assert list(trace.x[0]) == [label for label, _ in columns for _ in (0, 1)]
        assert list(trace.x[1]) == ["before", "after"] * len(columns)
        assert list(trace.y) == [cats[cat][side] / 1e6 for _, cats in columns for side in ("before", "after")]
    waiting = bars["waiting for peer"].y
    assert list(waiting[:2]) == pytest.approx([4.07575, 1.65025], abs=1e-9)  # the job's wait for its late rank, a step
    # a trace stored without steps: the page says the breakdown is unavailable, the rest compares
    old = {k: v for k, v in load_side(str(sample_paths("pipeline-stall")[0])).items() if k != "steps"}
    server.store.save_analysis(ids_[0], old)
    text = str(compare_page._result(server, *ids_))
    assert "step breakdown unavailable: before: no steps section" in text and "Kernel improvements" in text
    assert not [
        g for g in _walk(compare_page._result(server, *ids_)) if getattr(g, "id", None) == ids.COMPARE_BREAKDOWN
    ]


def test_clicking_a_bar_through_the_app_zooms_the_timeline(server):
    from dashboards.app import create_app

    trace_id = _analysed(server, "pipeline-stall")
    app = create_app(server)
    (key,) = [k for k, v in app.callback_map.items()
              if any(i["id"] == ids.STEP_BREAKDOWN for i in v["inputs"])]  # fmt: skip
    steps = stored_steps(server.store, trace_id)
    assert steps is not None
    fig = breakdown.figure(steps)
    bar = list(fig.data[0].x[0]).index("rank 3")
    body = {
        "output": key,
        "outputs": [{"id": o.split(".")[0], "property": o.split(".")[1]} for o in key.strip(".").split("...")],
        "inputs": [{"id": ids.STEP_BREAKDOWN, "property": "clickData",
                    "value": {"points": [{"customdata": list(fig.data[0].customdata[bar])}]}}],
        "state": [{"id": ids.TRACE_ID, "property": "data", "value": trace_id},
                  {"id": overview.VIEW, "property": "data", "value": {}}],
        "changedPropIds": [f"{ids.STEP_BREAKDOWN}.clickData"],
    }  # fmt: skip
    answer = app.server.test_client().post("/_dash-update-component", json=body, headers={"Host": "127.0.0.1"})
    assert answer.status_code == 200, answer.data
    response = answer.get_json()["response"]
    view = response[overview.VIEW]["data"]
    data = server.timelines.peek(trace_id)
    start, end = steps["ranks"]["3"]["start_ns"][0], steps["ranks"]["3"]["end_ns"][0]
    t0, t1 = (data.ms_since_origin(data.to_job_clock({"rank": 3}, ns)) for ns in (start, end))
    assert view["t0"] < t0 < t1 < view["t1"] and "finding" not in view
    assert response[ids.TIMELINE]["figure"]["layout"]["xaxis"]["range"] == pytest.approx([view["t0"], view["t1"]])


def test_the_compare_chart_of_a_large_job_keeps_the_ranks_furthest_from_the_job():
    def cats(delta: float) -> dict:
        return {c: {"before": 1e6, "after": 1e6 + delta, "delta": delta, "differs": True} for c in CATEGORIES}

    job = {c: {"before": 1e6, "after": 1.1e6, "delta": 1e5} for c in CATEGORIES}
    ranks = [{"rank": r, "categories": cats(1e5 + 1e3 * r + (5e7 if r == 15 else 0))} for r in range(16)]
    fig = breakdown.comparison_figure({"available": True, "job": job, "per_rank": ranks})
    shown = list(dict.fromkeys(fig.data[0].x[0]))
    assert shown == ["job", "rank 8", "rank 9", "rank 10", "rank 11", "rank 12", "rank 13", "rank 14", "rank 15"]
