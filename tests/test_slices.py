"""An export of several processes is mapped one slice of processes at a time: the slices partition
every table's rows, processes sharing a GPU stay together, and the report is the same as mapping
the whole export at once, byte for byte."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fixtures import confounders_slowdown
from fixtures.exporter import ExportWriter
from fixtures.samples import sample_paths
from nsysan.analysis import analyse
from nsysan.detect.runner import DetectorParts, reduce_detectors
from nsysan.engine import Serial, analyse_files
from nsysan.findings import Finding, Severity
from nsysan.ingest import load_trace
from nsysan.ingest.export import NsysExport
from nsysan.ingest.frames import decode_pid
from nsysan.ingest.slices import ProcessSlice


def _owned_tables(x: NsysExport) -> list[str]:
    return [t for t, cols in x.columns_by_table.items() if {"globalPid", "globalTid"} & set(cols)]


def _document(paths: list[Path], sliced: bool) -> str:
    with load_trace(paths, cache=None) as trace:
        return json.dumps(analyse(trace, by_slices=sliced), sort_keys=True, default=str)


def test_processes_on_their_own_gpus_are_each_a_slice():
    (path,) = sample_paths("pipeline-stall")
    with NsysExport(path) as x:
        slices = x.process_slices()
    assert [s.rest for s in slices] == [True, False, False, False]
    others = [s.pids for s in slices[1:]]
    assert all(len(p) == 1 for p in others)
    assert slices[0].pids == tuple(sorted(p for (p,) in others))  # the first holds every other process


def _check_partition(path: Path) -> int:
    """The slices of ``path`` hold each row of every table with a process exactly once, and a
    slice's kernels are its processes'. Returns the number of slices."""
    with NsysExport(path) as x:
        slices = x.process_slices()
        tables = _owned_tables(x)
        whole = {t: x.count(t) for t in tables}
    assert len(slices) > 1 and len(tables) >= 5
    seen: dict[str, list[int]] = {t: [] for t in tables}
    for part in slices:
        with NsysExport(path, part) as y:
            for t in tables:
                seen[t].append(y.count(t))
            kernels = y.query("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid")
            assert part.holds(decode_pid(kernels["globalPid"])).all()
    assert {t: sum(n) for t, n in seen.items()} == whole
    assert sum(1 for n in seen["CUPTI_ACTIVITY_KIND_KERNEL"] if n) == len(slices)
    return len(slices)


@pytest.mark.parametrize("sample", ["pipeline-stall", "pipeline-stall-fixed"])
def test_slices_partition_every_table_with_a_process(sample):
    (path,) = sample_paths(sample)
    assert _check_partition(path) == 4


def _two_processes(path: Path, *, same_gpu: bool, peer_copy: bool) -> Path:
    """Processes 100 and 200 on GPUs 0 and 1 (or both on 0), a launcher 300 with NVTX only."""
    w = ExportWriter(path)
    for pid in (100, 200, 300):
        w.process(pid, "python")
        w.thread(pid, pid, "python")
    for i, (pid, device) in enumerate([(100, 0), (200, 0 if same_gpu else 1)]):
        for k in range(3):
            c = 10 * i + k + 1
            w.runtime(pid, pid, 1_000 * c, 1_000 * c + 100, "cudaLaunchKernel_v7000", c)
            w.kernel(pid, device, 7, 1_000 * c + 200, 1_000 * c + 900, "ampere_sgemm_128x64_tn", correlation=c)
    if peer_copy:  # process 100 copies into process 200's GPU
        w.memcpy(100, 0, 7, 50_000, 60_000, 1 << 20, "Peer-to-Peer", correlation=99, src_device=0, dst_device=1)
    w.nvtx_mark(300, 300, 70_000, "launcher up")
    return w.close()


def test_processes_sharing_a_gpu_or_a_peer_copy_are_one_slice(tmp_path):
    apart = _two_processes(tmp_path / "apart.sqlite", same_gpu=False, peer_copy=False)
    shared = _two_processes(tmp_path / "shared.sqlite", same_gpu=True, peer_copy=False)
    copied = _two_processes(tmp_path / "copied.sqlite", same_gpu=False, peer_copy=True)
    with NsysExport(apart) as x:
        assert x.process_slices() == [ProcessSlice((200,), rest=True), ProcessSlice((200,), rest=False)]
    for path in (shared, copied):
        with NsysExport(path) as x:
            assert x.process_slices() == [ProcessSlice()]
    # the launcher, with no GPU work, is read with the first slice: no row is left out
    with NsysExport(apart, ProcessSlice((200,), rest=True)) as y:
        assert y.count("NVTX_EVENTS") == 1
        assert set(decode_pid(y.query("SELECT globalTid FROM NVTX_EVENTS")["globalTid"])) == {300}


def test_a_slice_has_only_its_ranks_and_the_export_run(tmp_path):
    path = _two_processes(tmp_path / "apart.sqlite", same_gpu=False, peer_copy=False)
    with load_trace([path], cache=None) as trace:
        whole_run = 20_900 - 1_200
        (part,) = trace.export_slices(0)[1:]
        with trace.export_alone(0, part, whole_run) as one:
            assert set(one.ranks["pid"]) == {200}
            assert set(one.kernels["pid"]) == {200}
            assert one.known_runs == [whole_run]


@pytest.mark.parametrize("sample", ["pipeline-stall", "pipeline-stall-fixed"])
def test_sliced_report_equals_the_whole_export_report(sample):
    paths = sample_paths(sample)
    assert _document(paths, True) == _document(paths, False)


@pytest.mark.parametrize("seed", [0, 1])
def test_sliced_report_equals_the_whole_export_report_on_a_confounded_job(seed, tmp_path):
    """A job of one export for all ranks, slowdowns planted among confounders (seed 0, 1: both flavours)."""
    paths, planted = confounders_slowdown.scenario(seed, True, tmp_path / "job", file_per_rank=False)
    assert len(paths) == 1 and planted
    assert _check_partition(paths[0]) >= 2
    sliced = _document(paths, True)
    assert json.loads(sliced)["findings"]
    assert sliced == _document(paths, False)


def test_real_two_gpu_export_is_two_slices_and_the_same_report(nsysai_traces):
    path = nsysai_traces["h100_2gpu_1s_ab196ea2"]
    assert _check_partition(path) == 2
    sliced = _document([path], True)
    # the 34 launch-queue stalls of before, now info: the GPUs were busy copying meanwhile, so
    # unblocking the host recovers nothing; and each GPU's copies exposed for 97% of the capture
    kinds = Counter((f["kind"], f["rank"], f["severity"]) for f in json.loads(sliced)["findings"])
    assert kinds == {("command_buffer_full", 0, "info"): 18, ("command_buffer_full", 1, "info"): 16,
                     ("copy_bound", 0, "critical"): 1, ("copy_bound", 1, "critical"): 1}  # fmt: skip
    assert sliced == _document([path], False)


def test_findings_tied_on_severity_impact_and_start_come_out_the_same_from_slices_in_any_order():
    """Two slices' findings alike in severity, impact and start (one per rank) are ordered by what
    tells them apart, not by the order the slices were mapped in."""

    def stall(rank: int, tid: int) -> Finding:
        return Finding(kind="command_buffer_full", severity=Severity.INFO, title=f"thread {tid} blocked",
                       advice="", start_ns=1_000, end_ns=2_000, impact_ns=1_000, rank=rank, device=rank,
                       pid=100 + rank, group=f"command_buffer_full:{rank}")  # fmt: skip

    def slice_of(*found: Finding) -> DetectorParts:
        return DetectorParts(run_ns=10**9, findings={"command_buffer_full": list(found)})

    first, second = slice_of(stall(1, 7)), slice_of(stall(0, 9), stall(0, 8))
    orders = [
        [(f.rank, f.title) for f in reduce_detectors([DetectorParts.combine_slices(parts)], [0])]
        for parts in ([first, second], [second, first])
    ]
    assert orders[0] == orders[1] == [(0, "thread 8 blocked"), (0, "thread 9 blocked"), (1, "thread 7 blocked")]


def test_rows_without_a_process_are_read_once(tmp_path):
    """NULL or text where a globalTid belongs: such rows belong to the first slice only."""
    path = _two_processes(tmp_path / "apart.sqlite", same_gpu=False, peer_copy=False)
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("UPDATE NVTX_EVENTS SET globalTid = NULL")
    con.commit()
    con.close()
    with NsysExport(path) as x:
        slices = x.process_slices()
    counts = []
    for part in slices:
        with NsysExport(path, part) as y:
            counts.append(y.count("NVTX_EVENTS"))
    assert counts == [1, 0]
    assert np.array_equal(ProcessSlice((5,), rest=True).holds(np.array([5, 6])), [False, True])


class _CountingSerial(Serial):
    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    def map(self, fn, tasks, what):  # type: ignore[no-untyped-def]
        self.sent[what] = len(tasks)
        return super().map(fn, tasks, what)


@pytest.mark.parametrize("memory_files", [7, 9])
def test_in_process_an_export_above_an_eighth_of_memory_is_mapped_by_slices(memory_files, monkeypatch):
    """Same document either way; the slices only bound memory, at the cost of a scan per slice."""
    (path,) = sample_paths("pipeline-stall")
    total = memory_files * path.stat().st_size
    monkeypatch.setattr("nsysan.analysis.psutil.virtual_memory", lambda: SimpleNamespace(total=total))
    engine = _CountingSerial()
    doc = analyse_files([str(path)], {}, engine)
    assert engine.sent == {"ranks": 1, "exports": 4 if memory_files < 8 else 1}
    assert json.dumps(doc, sort_keys=True, default=str) == _document([path], False)
