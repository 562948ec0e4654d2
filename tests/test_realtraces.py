"""Every real export in ../shared/realtraces ingests and reports; its figures match plain SQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from nsysan.ingest import load_trace
from nsysan.report import RENDERERS, analyse
from tests.conftest import realtraces_dir, sha256

NAMES = sorted(p.name.removesuffix(".sqlite.xz") for p in realtraces_dir().glob("*.sqlite.xz"))
MPI_JOB = [f"openhackathons-org__gpubootcamp__mpi_report{n}" for n in (1, 2, 3, 4, 6)]


def sql_figures(path: Path) -> dict[str, object]:
    """The report's figures computed independently, straight from the tables."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def one(sql: str, table: str) -> int:
        return con.execute(sql).fetchone()[0] if table in tables else 0

    devices: set[int] = set()
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        if table in tables:
            devices |= {r[0] for r in con.execute(f"SELECT DISTINCT deviceId FROM {table}")}
    figures = {
        "kernels": one("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_KERNEL"),
        "memcpy": one("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMCPY"),
        # copyKind 10 is CUDA_MEMCPY_KIND_PTOP in every schema version so far
        "peer_copies": one(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 10", "CUPTI_ACTIVITY_KIND_MEMCPY"
        ),
        "nvtx_ranges": one("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60)", "NVTX_EVENTS"),
        "nvtx_marks": one("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 34", "NVTX_EVENTS"),
        "devices": sorted(devices),
    }
    con.close()
    return figures


def test_all_eighteen_are_here(realtraces):
    assert len(realtraces) == 18 == len(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_ingests_and_reports_with_figures_matching_sql(realtraces, name):
    path = realtraces[name]
    before = sha256(path)
    with load_trace([path]) as trace:
        doc = analyse(trace)
    for render in RENDERERS.values():
        assert render(doc)
    exported = doc["summary"]["exports"][0]
    expected = sql_figures(path)
    assert {k: exported[k] for k in expected} == expected
    assert doc["traces"][0]["devices"] == expected["devices"]
    assert sha256(path) == before, "the input must never be modified"


def test_mpi_job_split_across_five_files_is_one_job(realtraces):
    paths = [realtraces[n] for n in MPI_JOB]
    with load_trace(paths) as trace:
        doc = analyse(trace)
        offsets = trace.job_clock()
    # Each file is one MPI rank; the job names its rank in an NVTX thread name ("MPI Rank 3").
    ranks = [(r["export"], r["rank"], r["rank_source"]) for r in doc["summary"]["ranks"]]
    assert ranks == [(0, 3, "nvtx"), (1, 7, "nvtx"), (2, 4, "nvtx"), (3, 2, "nvtx"), (4, 6, "nvtx")]
    # Each rank drove the GPU with its own number.
    assert [t["devices"] for t in doc["traces"]] == [[3], [7], [4], [2], [6]]
    assert [e["peer_copies"] for e in doc["summary"]["exports"]] == [1000, 1000, 1000, 2000, 2000]
    # Session start times lie within 3.7 ms: the clocks line up.
    assert offsets.min() == 0 and offsets.max() < 3_700_000
    assert doc["summary"]["limitations"] == []


def test_export_without_kernel_table_says_so(realtraces):
    with load_trace([realtraces["Yu-gyoung-Yun__alpa__report2"]]) as trace:
        doc = analyse(trace)
    assert doc["summary"]["exports"][0]["kernels"] == 0
    assert any("No kernel records" in n for n in doc["summary"]["limitations"])
    assert any("No NVTX events" in n for n in doc["summary"]["limitations"])


def test_new_schema_strings_and_metadata(realtraces):
    with load_trace([realtraces["NVIDIA__Fuser__report1_ee4fcf30"]]) as trace:
        info = trace.exports[0]
        kernels = trace.kernels
        api = trace.cuda_api
    assert (info.nsys_version, info.schema_version) == ("2025.1.1.110", "3.17.1")
    assert len(kernels) == 18 and kernels["short_name"].notna().all()
    # every kernel's launch call is found through its correlation id
    launches = kernels.merge(api, on=["export", "pid", "correlation_id"])
    assert len(launches) == 18
    assert launches["name_y"].astype(str).str.startswith("cu").all()
