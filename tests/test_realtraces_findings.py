"""The findings of every real export, pinned: what nsysan says about real captures, "none" included.

Each expectation comes with the facts, read with plain SQL, that make it the right answer: a trace
without NCCL kernels cannot have an ordering stall or a graph all-reduce gap, one without Command
Buffer Full rows cannot have a launch-queue finding, and so on. If a trace's facts change, the
expectation must be thought through again rather than re-recorded.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from nsysan.detect import run_detectors
from nsysan.ingest import load_trace
from tests.test_realtraces import MPI_JOB, NAMES

# 2x H100, 1 s window: 198 real CUPTI overhead rows of type 8 (Command buffer full), 99 per thread;
# tests/test_graph_cbf_truth.py checks each of these findings against the rows.
EXPECTED: dict[str, Counter[tuple[str, str]]] = {
    "h100_2gpu_1s_ab196ea2": Counter({("command_buffer_full", "critical"): 34}),
}
NSYS_AI = ("h100_2gpu_1s_ab196ea2", "mfu_2gpu_after", "mfu_2gpu_before")


def facts(path: Path) -> dict[str, int]:
    """What a finding of each kind would need, counted with plain SQL."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def one(sql: str, *needed: str) -> int:
        return int(con.execute(sql).fetchone()[0] or 0) if all(t in tables for t in needed) else 0

    kernel_names = "CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName"
    out = {
        "nccl_kernels": one(f"SELECT count(*) FROM {kernel_names} WHERE s.value LIKE 'nccl%'",
                            "CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"),
        "nccl_processes": one(f"SELECT count(DISTINCT k.globalPid) FROM {kernel_names} WHERE s.value LIKE 'nccl%'",
                              "CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"),
        "graph_node_kernels": one("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL",
                                  "CUPTI_ACTIVITY_KIND_KERNEL"),
        "command_buffer_full_rows": one(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_OVERHEAD o JOIN ENUM_CUPTI_OVERHEAD_TYPE e ON e.id = o.overheadType "
            "WHERE lower(e.label) LIKE '%command buffer full%'", "CUPTI_ACTIVITY_KIND_OVERHEAD", "ENUM_CUPTI_OVERHEAD_TYPE"),
        # compute kernels overlapping an NCCL kernel or a peer/host copy on the same device
        "compute_under_communication": one(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL c JOIN StringIds sc ON sc.id = c.shortName "
            "WHERE sc.value NOT LIKE 'nccl%' AND (EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL n JOIN StringIds sn "
            "ON sn.id = n.shortName WHERE sn.value LIKE 'nccl%' AND n.deviceId = c.deviceId AND n.start < c.end "
            "AND c.start < n.end) OR EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE m.copyKind IN (1, 2, 10) "
            "AND m.deviceId = c.deviceId AND m.start < c.end AND c.start < m.end))",
            "CUPTI_ACTIVITY_KIND_KERNEL", "StringIds", "CUPTI_ACTIVITY_KIND_MEMCPY"),
    }  # fmt: skip
    con.close()
    return out


def found(paths: list[Path]) -> Counter[tuple[str, str]]:
    with load_trace(paths) as trace:
        return Counter((f.kind, f.severity.value) for f in run_detectors(trace))


@pytest.mark.parametrize("name", NAMES)
def test_findings_of_each_real_export(realtraces, name):
    f = facts(realtraces[name])
    # none of these has NCCL, graph-node kernels, Command Buffer Full rows or compute under
    # communication on its own device (the jacobi and MPI peer copies run beside other devices' work)
    assert tuple(f.values()) == (0, 0, 0, 0, 0)
    assert found([realtraces[name]]) == Counter()


def test_the_mpi_job_as_one_job(realtraces):
    assert found([realtraces[n] for n in MPI_JOB]) == Counter()


@pytest.mark.parametrize("name", NSYS_AI)
def test_findings_of_each_nsys_ai_export(nsysai_traces, name):
    path = nsysai_traces[name]
    f = facts(path)
    if name.startswith("mfu"):
        # two ranks exchanging SendRecv: an ordering stall needs a third rank (B's peers ready while
        # A waits for another one), and no compute kernel overlaps communication on its device
        assert f["nccl_processes"] == 2 and f["nccl_kernels"] in (66, 62)
        assert f["graph_node_kernels"] == 0 and f["command_buffer_full_rows"] == 0
    else:
        assert (f["nccl_kernels"], f["graph_node_kernels"], f["command_buffer_full_rows"]) == (0, 0, 198)
    assert f["compute_under_communication"] == 0
    assert found([path]) == EXPECTED.get(name, Counter())
