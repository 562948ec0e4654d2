"""Edge cases of each detector, threshold overrides, and the detector listing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fixtures.anomalies import scenario
from fixtures.confounders_ordering import scenario as ordering_scenario
from fixtures.exporter import ExportWriter
from fixtures.scenarios import JobSpec, write_job
from nsysan.cli import app
from nsysan.detect import parse_settings, registered, run_detectors
from nsysan.errors import InputError
from nsysan.ingest import load_trace

runner = CliRunner()


def findings(paths, kind=None, **settings):
    with load_trace(paths) as trace:
        found = run_detectors(trace, dict(settings.items()))
    return [f for f in found if kind is None or f.kind == kind]


def test_one_rank_has_no_ordering_stall(tmp_path):
    paths, _ = write_job(JobSpec(ranks=1), tmp_path)
    assert findings(paths, "nccl_ordering_stall") == []


def test_missing_peer_files_do_not_invent_a_stall(tmp_path):
    paths, truths = ordering_scenario(6, True, tmp_path)  # one file per rank
    victim = truths[0].rank
    # only the victim's own file: the late peer is not in the trace, so nobody can be blamed
    assert findings([p for p in paths if p.name == f"rank{victim}.sqlite"], "nccl_ordering_stall") == []
    assert findings(paths, "nccl_ordering_stall")  # with every file it is found


def test_stall_names_the_late_peer_and_both_ops(tmp_path):
    paths, truths = ordering_scenario(1, True, tmp_path)
    found = findings(paths, "nccl_ordering_stall")
    assert sorted(f.rank for f in found) == sorted(t.rank for t in truths)
    for f in found:
        ev = f.evidence
        assert ev["late_rank"] not in ev["blocked_op"]["participants"]
        assert ev["blocking_op"]["waited_for_peer_ns"] >= 500_000
        assert ev["blocked_op"]["ready_ns"] < ev["blocking_op"]["end_ns"] <= ev["blocked_op"]["start_ns"]
        assert f.start_ns >= ev["blocked_op"]["ready_ns"] and f.end_ns == ev["blocked_op"]["start_ns"]
        assert f"rank {ev['late_rank']}" in f.advice


def test_single_kernel_instance_is_not_a_slowdown(tmp_path):
    w = ExportWriter(tmp_path / "one.sqlite", "current")
    w.process(5, "python3")
    w.nvtx_mark(5, 5, 10, "nsysan rank=0")
    w.runtime(5, 5, 100, 110, "cudaLaunchKernel", 1)
    w.kernel(5, 0, 7, 200, 900_000, "ampere_sgemm_128x64_tn", correlation=1)
    w.runtime(5, 5, 120, 130, "cudaLaunchKernel", 2)
    w.kernel(5, 0, 13, 300, 800_000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", correlation=2)
    w.close()
    assert findings([tmp_path / "one.sqlite"]) == []


def test_compute_on_overlapping_streams_without_communication_is_not_a_slowdown(tmp_path):
    paths, _ = scenario("comm_compute_slowdown", 0, True, tmp_path / "a")
    for p in paths:  # remove all communication: what is left is compute overlapping compute
        con = sqlite3.connect(p)
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE streamId = 13")
        con.execute("DROP TABLE IF EXISTS CUPTI_ACTIVITY_KIND_MEMCPY")
        con.commit()
        con.close()
    # the gaps the deleted kernels leave are the step attribution's (gpu_idle), not a slowdown
    assert findings(paths, "comm_compute_slowdown") == []


def test_no_overhead_rows_no_command_buffer_finding(tmp_path):
    paths, _ = write_job(JobSpec(ranks=2), tmp_path)
    assert findings(paths, "command_buffer_full") == []


def test_command_buffer_full_evidence(tmp_path):
    paths, truths = scenario("command_buffer_full", 5, True, tmp_path, flavour="current")
    found = findings(paths, "command_buffer_full")
    assert len(found) == len(truths)
    f = found[0]
    ev = f.evidence
    assert ev["overhead_table"] == "CUPTI_ACTIVITY_KIND_OVERHEAD"
    assert ev["launch_calls"] > 50 and ev["kernels_queued"][0]["kernel"] == "vectorized_elementwise_kernel"
    assert ev["gpu_busy_pct"] > 80 and "CUDA_SCALE_LAUNCH_QUEUES" in f.advice
    assert f.impact_ns == ev["blocked_ns"] <= f.end_ns - f.start_ns


def test_graph_mode_capture_gives_an_info_finding(tmp_path):
    paths, _ = write_job(JobSpec(graph="graph"), tmp_path)
    found = findings(paths, "graph_allreduce_gap")
    assert [(f.severity.value, f.impact_ns) for f in found] == [("info", 0), ("info", 0)]
    assert "--cuda-graph-trace=node" in found[0].advice


@pytest.mark.parametrize("flavour", ["2022.4", "current"])
def test_graph_gap_in_both_graph_table_layouts(tmp_path, flavour):
    paths, truths = scenario("graph_allreduce_gap", 3, True, tmp_path, flavour=flavour)
    found = findings(paths, "graph_allreduce_gap")
    assert {f.rank for f in found} == {t.rank for t in truths}
    assert all(f.evidence["event_nodes"] == 2 for f in found)
    assert "NCCL_GRAPH_MIXING_SUPPORT=0" in found[0].advice


def test_graph_gap_without_event_nodes_does_not_advise_the_mixing_switch(tmp_path):
    """NCCL_GRAPH_MIXING_SUPPORT=0 drops NCCL's event nodes; where the capture shows none, it cannot be the fix."""
    import sqlite3

    paths, truths = scenario("graph_allreduce_gap", 3, True, tmp_path)
    for path in paths:
        with sqlite3.connect(path) as con:
            table = next(t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
                         if t.startswith("CUDA_GRAPH_NODE_EVENTS") or t == "CUDA_GRAPH_EVENTS")  # fmt: skip
            con.execute(f"DELETE FROM {table} WHERE nameId IN (SELECT id FROM StringIds WHERE value IN "
                        "('cudaEventRecord', 'cudaStreamWaitEvent'))")  # fmt: skip
    found = findings(paths, "graph_allreduce_gap")
    assert {f.rank for f in found} == {t.rank for t in truths}
    assert all(f.evidence["event_nodes"] == 0 for f in found)
    assert all("NCCL_GRAPH_MIXING_SUPPORT=0 would not" in f.advice for f in found)
    gaps = [f.evidence["median_gap_ns"] <= f.evidence["worst_gap_ns"] for f in found]
    assert gaps and all(gaps)


def test_settings_change_the_verdict(tmp_path):
    paths, _ = scenario("comm_compute_slowdown", 1, True, tmp_path)
    assert findings(paths, "comm_compute_slowdown")
    assert findings(paths, "comm_compute_slowdown", comm_compute_slowdown={"min_ratio": 5.0}) == []


def test_parse_settings():
    assert parse_settings(["comm_compute_slowdown.min_samples=7", "graph_allreduce_gap.min_ratio=1.5"]) == {
        "comm_compute_slowdown": {"min_samples": 7}, "graph_allreduce_gap": {"min_ratio": 1.5}}  # fmt: skip
    for bad in ("nope.x=1", "comm_compute_slowdown.nope=1", "comm_compute_slowdown.min_ratio=abc", "min_ratio=1"):
        with pytest.raises(InputError):
            parse_settings([bad])


def test_bad_setting_is_one_line_exit_2(tmp_path):
    paths, _ = write_job(JobSpec(ranks=1), tmp_path)
    r = subprocess.run([sys.executable, "-m", "nsysan", "report", str(paths[0]), "--set", "comm_compute_slowdown.nope=1"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no parameter 'nope'" in r.stderr


def test_detectors_command_lists_every_parameter():
    out = CliRunner().invoke(app, ["detectors"]).output
    import dataclasses

    for kind, spec in registered().items():
        for f in dataclasses.fields(spec.params):
            assert f"{kind}.{f.name}" in out


def test_every_parameter_is_documented():
    import dataclasses
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "detectors.md").read_text()
    for kind, spec in registered().items():
        assert f"## `{kind}`" in doc
        for f in dataclasses.fields(spec.params):
            assert f"`{f.name}`" in doc, f"{kind}.{f.name} is not in docs/detectors.md"


def test_a_128_rank_job_wide_all_reduce_with_a_late_rank_is_not_a_stall(tmp_path):
    w = ExportWriter(tmp_path / "wide.sqlite", "current")
    name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    for r in range(128):
        pid = 10_000 + r
        w.process(pid, "python3")
        w.nvtx_mark(pid, pid, 100, f"nsysan rank={r}")
        late = 2_000_000 if r == 77 else 0
        for i, (start, end) in enumerate(((1_000_000 + late, 3_300_000), (3_305_000, 3_600_000))):
            w.runtime(pid, pid, 900_000 + i * 10_000, 905_000 + i * 10_000, "cudaLaunchKernel", i + 1)
            w.kernel(pid, r % 8, 13, start, end + r % 3 * 1_000, name, correlation=i + 1)
    w.close()
    assert findings([tmp_path / "wide.sqlite"], "nccl_ordering_stall") == []


def test_no_launch_calls_in_the_trace_means_no_readiness_and_no_crash(tmp_path):
    paths, _ = scenario("nccl_ordering_stall", 1, True, tmp_path)
    for p in paths:
        con = sqlite3.connect(p)
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
        con.commit()
        con.close()
    assert findings(paths, "nccl_ordering_stall") == []


def test_overhead_rows_without_a_thread_are_not_pinned_on_pid_0(tmp_path):
    paths, _ = scenario("command_buffer_full", 5, True, tmp_path, flavour="current")
    for p in paths:
        con = sqlite3.connect(p)
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_OVERHEAD SET globalTid = NULL")
        con.commit()
        con.close()
    found = findings(paths, "command_buffer_full")
    assert found and all(f.pid is None and f.rank is None for f in found)
    assert found[0].evidence["thread"].startswith("unknown")


@pytest.mark.parametrize("value", ["inf", "nan", "-5"])
def test_settings_must_be_finite_and_not_negative(value):
    with pytest.raises(InputError):
        parse_settings([f"nccl_ordering_stall.min_stall_ns={value}"])


def test_an_ordering_stall_whose_participants_are_unknown_is_not_dropped_silently():
    """Without participants (matching not attempted: the limit set to 1 pair) the stall on rank 2
    cannot be judged; its time is in steps.unjudged, per rank, instead of vanishing."""
    import json

    from fixtures.samples import sample_paths

    sample = str(sample_paths("pipeline-stall")[0])

    def report(*extra: str) -> dict:
        out = runner.invoke(app, ["report", "--no-cache", "-f", "json", sample, *extra], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    seen = report()
    stall = [f for f in seen["findings"] if f["kind"] == "nccl_ordering_stall"]
    assert [(f["rank"], f["impact_ns"]) for f in stall] == [(2, 4_996_000)]
    assert not [u for u in seen["steps"]["unjudged"] if u["detector"] == "nccl_ordering_stall"]
    blind = report("--set", "nccl_ordering_stall.max_position_pairs=1")
    assert not [f for f in blind["findings"] if f["kind"] == "nccl_ordering_stall"]
    unjudged = {u["rank"]: u for u in blind["steps"]["unjudged"] if u["detector"] == "nccl_ordering_stall"}
    assert unjudged[2]["ns"] >= 4_996_000 and unjudged[2]["why"].startswith("2 NCCL operations ready")
    # each op's wait from ready to start, the union per stream (checked by hand on the sample's rows)
    assert {r: u["ns"] for r, u in unjudged.items()} == {0: 2_433_000, 1: 2_433_000, 2: 7_454_000, 3: 2_433_000}
