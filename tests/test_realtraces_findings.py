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
# Since the step attribution, each finding's severity is the share of the step its fix would recover:
# the Command Buffer Full rows are real but the GPU is ~96% host-to-device copies on the compute
# stream (925 ms of the 969 ms window; checked by hand with SQL), so the copies are the critical
# finding and the launch queue recovers nothing.
EXPECTED: dict[str, Counter[tuple[str, str]]] = {
    "h100_2gpu_1s_ab196ea2": Counter({("command_buffer_full", "info"): 34, ("copy_bound", "critical"): 2}),
    # the SendRecv waits for a late peer grow from ~11 to ~18 ms per 300 ms and GPU idle from ~9 to ~17%:
    # the late rank is named (it recovers little: both ranks wait on their hosts), the idle is what to fix
    "mfu_2gpu_before": Counter({("gpu_idle", "warning"): 8, ("late_rank", "info"): 14}),
    "mfu_2gpu_after": Counter({("gpu_idle", "critical"): 2, ("gpu_idle", "info"): 1, ("late_rank", "info"): 13}),
}

# The attribution's findings on the single-node exports: GPUs idle waiting for their hosts. Each
# critical one stands on an export whose GPU is idle for at least a fifth of its span (``idle_share``,
# plain SQL); none of these exports has a pattern the other detectors look for (``facts``).
EXPECTED_REAL: dict[str, Counter[tuple[str, str]]] = {
    "NVIDIA__Fuser__report1_8fa9ec29": Counter({("gpu_idle", "critical"): 1}),
    "NVIDIA__Fuser__report1_ee4fcf30": Counter({("gpu_idle", "critical"): 2}),
    "NVIDIA__Fuser__report2_df8f397e": Counter({("gpu_idle", "critical"): 1}),
    "Yu-gyoung-Yun__alpa__jax_profile_mem": Counter({("gpu_idle", "critical"): 2}),
    "Yu-gyoung-Yun__alpa__report1": Counter({("gpu_idle", "critical"): 1, ("gpu_idle", "info"): 1}),
    "Yu-gyoung-Yun__alpa__report2": Counter({("gpu_idle", "critical"): 1}),
    "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0": Counter(
        {("gpu_idle", "critical"): 1, ("copy_bound", "critical"): 1}
    ),
    "openhackathons-org__AI-Profiler__baseline": Counter({("gpu_idle", "critical"): 1, ("gpu_idle", "info"): 3}),
    "openhackathons-org__AI-Profiler__baseline_nvtx": Counter({("gpu_idle", "critical"): 1, ("copy_bound", "info"): 1}),
    "openhackathons-org__gpubootcamp__jacobi_report": Counter({("gpu_idle", "info"): 1}),
    "openhackathons-org__gpubootcamp__mpi_report1": Counter({("gpu_idle", "critical"): 2}),
    "openhackathons-org__gpubootcamp__mpi_report2": Counter({("gpu_idle", "critical"): 2}),
    "openhackathons-org__gpubootcamp__mpi_report3": Counter({("gpu_idle", "critical"): 1}),
    "openhackathons-org__gpubootcamp__mpi_report4": Counter({("gpu_idle", "critical"): 2}),
    "openhackathons-org__gpubootcamp__mpi_report6": Counter({("gpu_idle", "critical"): 2}),
}
# the five MPI ranks as one job: the synchronisations are the critical idle on every rank; the launch
# gaps recover nothing once the syncs are gone
MPI_JOB_FINDINGS = Counter({("gpu_idle", "critical"): 5, ("gpu_idle", "info"): 4})
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


def idle_share(path: Path) -> float:
    """The largest share of a device's activity span with no kernel, copy or memset on it (a lower
    bound: overlapping work is counted twice)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    activity = " UNION ALL ".join(f"SELECT deviceId AS d, start AS s, end AS e FROM {t}" for t in
                                  ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
                                  if t in tables)  # fmt: skip
    rows = con.execute(f"SELECT 1.0 - sum(e - s) * 1.0 / (max(e) - min(s)) FROM ({activity}) GROUP BY d").fetchall()
    con.close()
    return max(r[0] for r in rows)


def found(paths: list[Path]) -> Counter[tuple[str, str]]:
    with load_trace(paths) as trace:
        return Counter((f.kind, f.severity.value) for f in run_detectors(trace))


@pytest.mark.parametrize("name", NAMES)
def test_findings_of_each_real_export(realtraces, name):
    f = facts(realtraces[name])
    # none of these has NCCL, graph-node kernels, Command Buffer Full rows or compute under
    # communication on its own device (the jacobi and MPI peer copies run beside other devices' work)
    assert tuple(f.values()) == (0, 0, 0, 0, 0)
    expected = EXPECTED_REAL.get(name, Counter())
    if ("gpu_idle", "critical") in expected:
        assert idle_share(realtraces[name]) >= 0.2
    assert found([realtraces[name]]) == expected


def test_the_mpi_job_as_one_job(realtraces):
    assert found([realtraces[n] for n in MPI_JOB]) == MPI_JOB_FINDINGS


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


@pytest.mark.parametrize("name", ["healthy_1pct", "healthy_judged_1pct"])
def test_cut_down_exports_without_a_process_column_are_read(tmp_path, name):
    """nsys-ai's cut-down fixtures: a kernel table without ``globalPid`` (and six tables in all).
    They are read, with their kernels, and a healthy job has nothing to report."""
    import lzma
    import shutil

    from tests.conftest import NSYS_AI_PREFIX, need, realtraces_dir

    src = realtraces_dir() / "stripped" / f"{NSYS_AI_PREFIX}{name}.sqlite.xz"
    need(src.is_file(), f"the stripped real exports ({src})")
    path = tmp_path / f"{name}.sqlite"
    with lzma.open(src) as fin, path.open("wb") as fout:
        shutil.copyfileobj(fin, fout)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    columns = {r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    assert "globalPid" not in columns and kernels in (400, 20)
    with load_trace([path]) as trace:
        assert len(trace.kernels) == kernels
        assert run_detectors(trace) == []
