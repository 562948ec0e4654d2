"""graph_allreduce_gap and command_buffer_full against scenarios with confounders, scored strictly.

Scenarios (fixtures/confounders_graph.py): 32 seeds x (planted, clean twin) per kind; the seed
cycles the schema flavour (2022.4, current) and the layout (one export, one per rank). Scoring
(tests/scoring.py): same kind and rank, windows overlapping >= 50% of the shorter, impact within
5%, severity exactly what the planted group's total share makes it. Per kind precision and
recall >= 0.95; clean twins give no finding at all. Then unit cases for the producer (copy and
memset nodes) and the eager baseline (host-bound passes, median), and the real 2x H100 export
with 198 Command Buffer Full rows, cross-checked with plain SQL.
"""

from __future__ import annotations

import lzma
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from fixtures.anomalies import NCCL_STREAM, US, Rank, _close, _job, nccl_name
from fixtures.confounders_graph import FAMILIES, GEMM, _plan, _pre_op, _write, scenario
from nsysan.detect import registered
from nsysan.findings import Finding
from nsysan.ingest import load_trace
from tests.conftest import need, realtraces_dir
from tests.scoring import Score, expected_severities, why_not

SEEDS = range(32)
KINDS = list(FAMILIES)
H100 = "GindaChen__nsys-ai__h100_2gpu_1s_ab196ea2"


def run(kind: str, paths: list[Path]) -> list[Finding]:
    spec = registered()[kind]
    with load_trace(paths) as trace:
        return spec.run(trace, spec.params())


@pytest.fixture(scope="module")
def outcomes(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, list[tuple[int, bool, tuple[str, bool], list, list, list]]]:
    results: dict[str, list] = {kind: [] for kind in KINDS}
    for kind in KINDS:
        for seed in SEEDS:
            for planted in (True, False):
                out = tmp_path_factory.mktemp(f"{kind}-{seed}-{planted}")
                paths, truths = scenario(kind, seed, planted, out)
                shape = (("2022.4", "current")[seed % 2], paths[0].name.startswith("rank"))
                results[kind].append((seed, planted, shape, paths, truths, run(kind, paths)))
    return results


def test_table(outcomes, capsys):
    lines = [
        f"seeds {SEEDS.start}-{SEEDS.stop - 1} x (planted, clean); flavours 2022.4/current x layouts one-file/per-rank",
        f"{'kind':<22}{'planted':>8}{'found':>7}{'matched':>8}{'precision':>10}{'recall':>8}{'clean findings':>16}",
    ]
    for kind, rows in outcomes.items():
        score = Score()
        for _, _, _, paths, truths, findings in rows:
            score.add(truths, paths, findings, kind)
        clean = sum(len(f) for _, planted, _, _, _, f in rows if not planted)
        lines.append(f"{kind:<22}{score.planted:>8}{score.found:>7}{score.matched:>8}{score.precision:>10.3f}"
                     f"{score.recall:>8.3f}{clean:>16}")  # fmt: skip
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.parametrize("kind", KINDS)
def test_every_shape_is_covered(outcomes, kind):
    assert {shape for _, _, shape, _, _, _ in outcomes[kind]} == {
        ("2022.4", False), ("2022.4", True), ("current", False), ("current", True)}  # fmt: skip
    assert sum(len(t) for _, planted, _, _, t, _ in outcomes[kind] if planted) >= 16


@pytest.mark.parametrize("kind", KINDS)
def test_precision_and_recall(outcomes, kind):
    score = Score()
    for _, _, _, paths, truths, findings in outcomes[kind]:
        score.add(truths, paths, findings, kind)
    assert score.precision >= 0.95 and score.recall >= 0.95, (
        f"{kind}: precision {score.precision:.3f}, recall {score.recall:.3f} ({score.matched}/{score.found}/{score.planted})"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_clean_twins_have_no_findings(outcomes, kind):
    noisy = [(seed, f.title) for seed, planted, _, _, _, found in outcomes[kind] if not planted for f in found]
    assert noisy == []


def test_gpu_state_says_what_the_rows_show(outcomes):
    """Saturated, waiting on a dependency, or unknown because the queued kernels fall outside the
    capture: each matched finding states what was planted, and 'unknown' never claims idleness."""
    states = set()
    for _, _, _, paths, truths, findings in outcomes["command_buffer_full"]:
        severities = expected_severities(truths, paths)
        for t, sev in zip(truths, severities, strict=True):
            f = next(f for f in findings if why_not(t, sev, f) is None)
            assert f.evidence["gpu_state"] == t.detail["gpu_state"], (t, f.evidence["gpu"])
            states.add(f.evidence["gpu_state"])
            if t.detail["gpu_state"] == "unknown":
                assert "fall outside the capture window; GPU state unknown" in f.evidence["gpu"]
                assert "fall outside the capture window; GPU state unknown" in f.advice
                assert "idle" not in f.advice.lower()
    assert states == {"saturated", "waiting", "unknown"}


def test_groups_and_event_nodes(outcomes):
    for kind, rows in outcomes.items():
        for _, _, _, _, _, findings in rows:
            for f in findings:
                assert f.group.startswith(f"{kind}|rank {f.rank}|")
                assert f.start_ns <= f.end_ns and f.impact_ns > 0
    gaps = [f for *_, found in outcomes["graph_allreduce_gap"] for f in found]
    assert gaps and all(f.evidence["event_node_names"] == ["cudaEventRecord", "cudaStreamWaitEvent"] for f in gaps)
    assert any(p.startswith("memcpy") or p == "memset" for f in gaps for p in f.evidence["producers"])


# -- unit cases: the producer and the baseline --------------------------------------------------


def _rank(tmp_path: Path, flavour: str = "current") -> Rank:
    return _job(tmp_path, random.Random(0), 1, flavour, False)[0]


def _replays(
    rk: Rank, t: int, gap: int, pre: str | None, n: int = 5, events: bool = False
) -> tuple[int, list[int], list[int]]:
    """``n`` replays of GEMM [-> copy/memset node] -> all-reduce ``gap`` after its producer.
    Returns (time after, producer ends, all-reduce starts)."""
    order = ["cudaLaunchKernel"] + ([{"copy": "cudaMemcpyAsync", "memset": "cudaMemsetAsync"}[pre]] if pre else []) + (
        ["cudaEventRecord", "cudaStreamWaitEvent"] if events else []) + ["cudaLaunchKernelExC"]  # fmt: skip
    for j, api in enumerate(order):
        rk.w.graph_node(rk.pid, rk.tid, t + j * US, 100 + j, name=api)
    for j in range(len(order)):
        rk.w.graph_node(rk.pid, rk.tid, t + 20 * US + j * US, 600 + j, original=100 + j, name="cudaGraphInstantiate")
    t += 100 * US
    ends, starts = [], []
    for _ in range(n):
        rk.corr += 1
        rk.w.runtime(rk.pid, rk.tid, t, t + 10 * US, "cudaGraphLaunch", rk.corr)
        gpu = t + 15 * US
        rk.kernel(t, gpu, 100 * US, GEMM, graph_node_id=600, correlation=rk.corr)
        end = gpu + 100 * US
        if pre:
            _pre_op(rk, pre, end + 1 * US, 50 * US, rk.corr, 601)
            end += 51 * US
        rk.kernel(t, end + gap, 200 * US, nccl_name("current"), stream=NCCL_STREAM, graph_node_id=600 + len(order) - 1,
                  correlation=rk.corr)  # fmt: skip
        ends.append(end)
        starts.append(end + gap)
        t = end + gap + 300 * US
    return t, ends, starts


def _eager(rk: Rank, t: int, gap: int, device_bound: bool) -> int:
    """One eager GEMM -> all-reduce; device-bound: the all-reduce queued long before the GEMM ends;
    host-bound: launched by a Python hook 150 us after the GEMM ended."""
    rk.kernel(t, t + 20 * US, 100 * US, GEMM)
    producer_end = t + 120 * US
    cpu = t + 10 * US if device_bound else producer_end + 150 * US
    start = producer_end + gap if device_bound else cpu + 5 * US + gap
    rk.kernel(cpu, start, 200 * US, nccl_name("current"), stream=NCCL_STREAM)
    return start + 500 * US


@pytest.mark.parametrize("pre", ["copy", "memset"])
def test_a_copy_or_memset_node_is_the_producer(tmp_path, pre):
    """GEMM -> 50 us copy/memset node -> all-reduce 3 us later: from the GEMM that is 54 us, from
    the real producer 3 us, so no finding."""
    rk = _rank(tmp_path)
    _replays(rk, 5_000 * US, 3 * US, pre)
    assert run("graph_allreduce_gap", _close([rk])) == []


@pytest.mark.parametrize("pre", ["copy", "memset"])
def test_a_delay_after_a_copy_node_is_measured_from_the_copy(tmp_path, pre):
    rk = _rank(tmp_path)
    _, ends, starts = _replays(rk, 5_000 * US, 40 * US, pre)
    (f,) = run("graph_allreduce_gap", _close([rk]))
    assert f.evidence["producers"] == (["memcpy Device-to-Device"] if pre == "copy" else ["memset"])
    assert f.impact_ns == 5 * (40 - 5) * US  # over the launch floor: no eager run in the trace
    assert (f.start_ns, f.end_ns) == (ends[0], starts[-1])
    assert f.group == f"graph_allreduce_gap|rank 0|device {rk.device}|graph 600"


def test_host_bound_eager_passes_do_not_set_the_baseline(tmp_path):
    """Eager: three host-bound passes (gap ~160 us, the CPU's doing) and device-bound ones with
    gaps 4, 4, 5 and 90 us. Baseline = median of the device-bound = 4.5 us (the mean of all
    would be ~70 us and hide the 40 us replay gap; the mean of the device-bound ones, 25.75 us,
    too)."""
    rk = _rank(tmp_path)
    t = 5_000 * US
    for gap, bound in ((4, True), (150, False), (4, True), (150, False), (5, True), (150, False), (90, True)):
        t = _eager(rk, t, gap * US, bound)
    _, _ends, _starts = _replays(rk, t, 40 * US, None, events=True)
    (f,) = run("graph_allreduce_gap", _close([rk]))
    assert f.evidence["baseline_gap_ns"] == 4_500
    assert f.evidence["baseline"] == "median of 4 device-bound eager all-reduces"
    assert f.evidence["host_bound_eager_excluded"] == 3
    assert f.impact_ns == 5 * (40_000 - 4_500)
    assert f.evidence["event_nodes"] == 2
    assert f.evidence["event_node_ids"] == [101, 102]
    assert f.evidence["event_node_names"] == ["cudaEventRecord", "cudaStreamWaitEvent"]


def test_only_host_bound_eager_passes_fall_back_to_the_launch_floor(tmp_path):
    rk = _rank(tmp_path, "2022.4")
    t = 5_000 * US
    for _ in range(4):
        t = _eager(rk, t, 150 * US, False)
    _replays(rk, t, 40 * US, "copy")
    (f,) = run("graph_allreduce_gap", _close([rk]))
    assert f.evidence["baseline"].startswith("launch floor (0 device-bound")
    assert f.evidence["host_bound_eager_excluded"] == 4
    assert f.impact_ns == 5 * (40 - 5) * US


def test_replays_as_long_as_device_bound_eager_gaps_are_no_finding(tmp_path):
    rk = _rank(tmp_path)
    t = 5_000 * US
    for _ in range(3):
        t = _eager(rk, t, 30 * US, True)
    _replays(rk, t, 32 * US, None)
    assert run("graph_allreduce_gap", _close([rk])) == []


# -- the real 2x H100 export with Command Buffer Full rows ----------------------------------------


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = realtraces_dir() / "nsys-ai" / f"{H100}.sqlite.xz"
    need(src.is_file(), f"the real trace {src}")
    target = tmp_path_factory.mktemp("h100") / f"{H100}.sqlite"
    with lzma.open(src) as fin, target.open("wb") as fout:
        shutil.copyfileobj(fin, fout)
    return target


def _sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


_CBF_ROWS = """FROM CUPTI_ACTIVITY_KIND_OVERHEAD o WHERE o.overheadType IN
    (SELECT id FROM ENUM_CUPTI_OVERHEAD_TYPE WHERE lower(label) LIKE '%command buffer full%')"""
_NO_WORK = """NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.correlationId = o.correlationId
    AND k.globalPid / 16777216 = o.globalTid / 16777216)
    AND NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE m.correlationId = o.correlationId
    AND m.globalPid / 16777216 = o.globalTid / 16777216)"""


def test_real_h100_command_buffer_full_matches_the_rows(h100):
    # plain SQL: per thread, rows, blocked ns (the rows of a thread never overlap, so the sum is
    # the union), and the rows whose call queued no GPU work inside the capture
    per_thread = {
        tid: (n, blocked)
        for tid, n, blocked in _sql(
            h100, f"SELECT o.globalTid % 16777216, count(*), sum(o.end - o.start) {_CBF_ROWS} GROUP BY 1"
        )
    }
    assert per_thread == {111: (99, 455_907_792), 112: (99, 456_062_014)}
    assert _sql(
        h100,
        f"SELECT count(*) {_CBF_ROWS} AND EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_OVERHEAD p "
        "WHERE p.globalTid = o.globalTid AND p.rowid <> o.rowid AND p.start < o.end AND o.start < p.end)",
    ) == [(0,)]
    outside = dict(_sql(h100, f"SELECT o.globalTid % 16777216, count(*) {_CBF_ROWS} AND {_NO_WORK} GROUP BY 1"))
    assert outside == {111: 29, 112: 29}
    last_work = _sql(
        h100,
        "SELECT max(end) FROM (SELECT end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
        "SELECT end FROM CUPTI_ACTIVITY_KIND_MEMCPY)",
    )[0][0]

    found = run("command_buffer_full", [h100])
    assert len(found) == 34
    clusters = {111: (12, 6), 112: (11, 5)}  # (saturated, unknown) stalls per thread: 1 ms apart or more
    for tid, (rows, blocked) in per_thread.items():
        mine = [f for f in found if f.evidence["thread"] == tid]
        assert sum(f.evidence["overhead_rows"] for f in mine) == rows
        assert sum(f.impact_ns for f in mine) == blocked
        assert {f.group for f in mine} == {f"command_buffer_full|rank {mine[0].rank}|pid {tid}|thread {tid}"}
        unknown = [f for f in mine if f.evidence["gpu_state"] == "unknown"]
        saturated = [f for f in mine if f.evidence["gpu_state"] == "saturated"]
        assert (len(saturated), len(unknown)) == clusters[tid]
        assert sum(f.evidence["overhead_rows"] for f in unknown) == outside[tid]
        for f in unknown:  # the capture ends ~420 ms before these launches' kernels would run
            assert f.evidence["calls_with_work_in_capture"] == 0 and f.evidence["kernels_queued"] == []
            assert (
                f.evidence["gpu"]
                == "the kernels these launches queued fall outside the capture window; GPU state unknown"
            )
            assert "fall outside the capture window; GPU state unknown" in f.advice and "idle" not in f.advice
            assert f.start_ns < last_work
        for f in saturated:  # busy with Host-to-Device copies, the queued kernels ran ~0.42 s later
            assert f.evidence["gpu_busy_pct"] >= 99
            top = max(f.evidence["gpu_busy_by_kind_pct"], key=f.evidence["gpu_busy_by_kind_pct"].get)
            assert top == "memcpy Host-to-Device"
            assert 0.4e9 < f.evidence["queue_delay_ns_median"] < 0.45e9
            assert "idle" not in f.advice and "CUDA_SCALE_LAUNCH_QUEUES" in f.advice
        assert {f.severity.value for f in mine} == {"critical"}  # 456 ms of a 0.96 s run
    longest = max(found, key=lambda f: f.impact_ns)
    assert (longest.evidence["thread"], longest.start_ns, longest.end_ns, longest.impact_ns) == (
        112, 156_107_739_362, 156_230_577_702, 122_438_770)  # fmt: skip


@pytest.mark.parametrize("kernel_us, gap_us, state", [(1, 2, "launch_bound"), (3, 0, "saturated")])
def test_short_kernels_back_to_back_are_launch_bound_not_waiting(tmp_path, kernel_us, gap_us, state):
    """1 us kernels the device starts 2 us apart (its own launch cost) fill a 64-entry queue while it
    is busy a third of the time: no dependency held the work, the launches did; fewer launches is
    the fix. 3 us kernels without the gaps keep the device busy: saturated."""
    rk = _rank(tmp_path)
    calls = _plan(5_000 * US, 5_030 * US, 600, 64, kernel_us * US, gap=gap_us * US + 300)
    assert sum(c.blocked for c in calls) > 100
    _write(rk, "current", calls)
    _close([rk])
    (f,) = run("command_buffer_full", [tmp_path / "job.sqlite"])
    assert f.evidence["gpu_state"] == state, f.evidence["gpu"]
    if state == "launch_bound":
        assert f.evidence["gpu_busy_pct"] < 50 and f.evidence["short_gaps"]["count"] > 100
        assert "CUDA graph" in f.advice and "more queue space" not in f.advice
