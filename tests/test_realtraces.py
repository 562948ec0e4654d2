"""Every real export in ../shared/realtraces ingests and reports, and its figures are the facts of
the file: each oracle here is plain SQL on the export (or a few lines of Python over rows SQL
returned), never nsysan's own readers or interval arithmetic, so a bug in those fails a test."""

from __future__ import annotations

import re
import sqlite3
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from nsysan.analysis import analyse
from nsysan.ingest import load_trace
from nsysan.report.renderers import RENDERERS
from tests.conftest import NSYS_AI_PREFIX, realtraces_dir, sha256

NAMES = sorted(p.name.removesuffix(".sqlite.xz") for p in realtraces_dir().glob("*.sqlite.xz"))
NSYS_AI = sorted(
    p.name.removesuffix(".sqlite.xz").removeprefix(NSYS_AI_PREFIX)
    for p in (realtraces_dir() / "nsys-ai").glob("*.sqlite.xz")
)
MPI_JOB = [f"openhackathons-org__gpubootcamp__mpi_report{n}" for n in (1, 2, 3, 4, 6)]
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
ACTIVITY = (KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


class Sql:
    """Read-only SQL on one export; a missing table reads as no rows."""

    def __init__(self, path: Path) -> None:
        self.con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        self.tables = {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def rows(self, sql: str, *tables: str) -> list[tuple[Any, ...]]:
        if not set(tables) <= self.tables:
            return []
        return self.con.execute(sql).fetchall()

    def one(self, sql: str, table: str) -> int:
        rows = self.rows(sql, table)
        return rows[0][0] if rows else 0


def sql_figures(path: Path) -> dict[str, object]:
    """The report's per-export figures computed independently, straight from the tables."""
    db = Sql(path)
    devices = {r[0] for t in ACTIVITY[:2] for r in db.rows(f"SELECT DISTINCT deviceId FROM {t}", t)}
    figures = {
        "kernels": db.one(f"SELECT count(*) FROM {KERNEL}", KERNEL),
        "memcpy": db.one("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMCPY"),
        # copyKind 10 is CUDA_MEMCPY_KIND_PTOP in every schema version so far
        "peer_copies": db.one(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 10", "CUPTI_ACTIVITY_KIND_MEMCPY"
        ),
        "nvtx_ranges": db.one("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60)", "NVTX_EVENTS"),
        "nvtx_marks": db.one("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 34", "NVTX_EVENTS"),
        # NCCL names every device kernel ncclKernel_... / ncclDevKernel_... (GLOB: case-sensitive, unlike LIKE)
        "nccl_kernels": db.one(
            f"SELECT count(*) FROM {KERNEL} k JOIN StringIds s ON s.id = k.shortName WHERE s.value GLOB 'nccl*'",
            KERNEL,
        ),
        "devices": sorted(devices),
    }
    db.con.close()
    return figures


def _pid(global_id: int) -> int:
    """The process id inside nsys's serialized globalPid/globalTid (bits 24..47, per nsys's docs)."""
    return (global_id >> 24) & 0xFFFFFF


def union_length(intervals: list[tuple[int, int]]) -> int:
    """Total time covered by [start, end) intervals: a plain sort-and-sweep, not nsysan.intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += max(end - start, 0)
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


@cache
def sql_devices(path: Path) -> dict[int, dict[str, Any]]:
    """Per device: kernel count and summed duration, span and busy time of kernels, copies and
    memsets, and the processes that put work on it."""
    db = Sql(path)
    out: dict[int, dict[str, Any]] = defaultdict(lambda: {"kernels": 0, "kernel_ns": 0, "intervals": [], "pids": set()})
    for device, n, total in db.rows(f"SELECT deviceId, count(*), sum(end - start) FROM {KERNEL} GROUP BY 1", KERNEL):
        out[device].update(kernels=n, kernel_ns=total)
    for table in ACTIVITY:
        for device, start, end, gpid in db.rows(f"SELECT deviceId, start, end, globalPid FROM {table}", table):
            out[device]["intervals"].append((start, end))
            out[device]["pids"].add(_pid(gpid))
    for d in out.values():
        starts, ends = zip(*d["intervals"], strict=True)
        d["span_ns"] = max(ends) - min(starts)
        d["busy_ns"] = union_length(d.pop("intervals"))
    db.con.close()
    return dict(out)


def sql_kernel_names(path: Path) -> dict[str, tuple[int, int]]:
    """Kernel short name -> (count, summed duration)."""
    db = Sql(path)
    rows = db.rows(
        f"SELECT s.value, count(*), sum(k.end - k.start) FROM {KERNEL} k JOIN StringIds s ON s.id = k.shortName "
        "GROUP BY s.value",
        KERNEL,
    )
    db.con.close()
    return {name: (n, total) for name, n, total in rows}


def sql_run_ns(path: Path) -> int:
    """How long the export ran: first kernel start to last kernel end, else the NVTX events', else 0."""
    db = Sql(path)
    (first, last), *_ = db.rows(f"SELECT min(start), max(end) FROM {KERNEL}", KERNEL) or [(None, None)]
    if first is None:
        (first, last), *_ = db.rows("SELECT min(start), max(coalesce(end, start)) FROM NVTX_EVENTS", "NVTX_EVENTS") or [
            (None, None)
        ]
    db.con.close()
    return 0 if first is None else last - first


@cache
def _analysed(path: Path) -> tuple[dict[str, Any], list[int]]:
    """The report document of one export and its run length as the detectors measure it, once per session."""
    from nsysan.detect.common import run_ns

    with load_trace([path]) as trace:
        return analyse(trace), run_ns(trace).tolist()


def _all_exports(realtraces: dict[str, Path], nsysai_traces: dict[str, Path]) -> dict[str, Path]:
    return {**realtraces, **{NSYS_AI_PREFIX + k: v for k, v in nsysai_traces.items()}}


EVERY = NAMES + [NSYS_AI_PREFIX + n for n in NSYS_AI]


def test_all_twenty_one_are_here(realtraces, nsysai_traces):
    assert len(realtraces) == 18 == len(NAMES)
    assert sorted(nsysai_traces) == NSYS_AI == ["h100_2gpu_1s_ab196ea2", "mfu_2gpu_after", "mfu_2gpu_before"]


@pytest.mark.parametrize("name", NAMES)
def test_ingests_and_reports_with_figures_matching_sql(realtraces, name):
    path = realtraces[name]
    before = sha256(path)
    doc, _ = _analysed(path)
    for render in RENDERERS.values():
        assert render(doc)
    exported = doc["summary"]["exports"][0]
    expected = sql_figures(path)
    assert {k: exported[k] for k in expected} == expected
    assert doc["traces"][0]["devices"] == expected["devices"]
    assert sha256(path) == before, "the input must never be modified"


@pytest.mark.parametrize("name", EVERY)
def test_per_device_kernels_busy_and_span_match_sql(realtraces, nsysai_traces, name):
    """Per GPU: kernel count and time summed in SQL, span from the first to the last activity, and
    busy time as the union of kernels, copies and memsets (a sweep over SQL's rows)."""
    path = _all_exports(realtraces, nsysai_traces)[name]
    doc, _ = _analysed(path)
    expected = sql_devices(path)
    got = {d["device"]: d for d in doc["summary"]["devices"]}
    assert sorted(got) == sorted(expected)
    for device, e in expected.items():
        g = got[device]
        assert (g["kernels"], g["kernel_ns"], g["span_ns"], g["busy_ns"]) == (
            e["kernels"], e["kernel_ns"], e["span_ns"], e["busy_ns"],
        ), f"device {device}"  # fmt: skip
        assert 0 <= g["busy_pct"] <= 100


@pytest.mark.parametrize("name", EVERY)
def test_top_kernels_and_nccl_counts_match_sql(realtraces, nsysai_traces, name):
    path = _all_exports(realtraces, nsysai_traces)[name]
    doc, _ = _analysed(path)
    s = doc["summary"]
    names = sql_kernel_names(path)
    # the top kernels are the names with the most GPU time, each with SQL's count and time
    assert [(r["kernel"], r["count"], r["total_ns"]) for r in s["top_kernels"]] == [
        (k, n, t) for k, (n, t) in sorted(names.items(), key=lambda kv: -kv[1][1])[: len(s["top_kernels"])]
    ]
    assert len(s["top_kernels"]) == min(len(names), 15)
    assert all(r["nccl"] == r["kernel"].startswith("nccl") for r in s["top_kernels"])
    # every NCCL kernel is counted once, under the operation its name gives
    nccl = Counter({k: n for k, (n, _) in names.items() if k.startswith("nccl")})
    assert s["exports"][0]["nccl_kernels"] == sum(nccl.values())
    by_op = Counter()
    for row in s["nccl"]:
        by_op[row["op"]] += row["count"]
    expected_ops = Counter()
    for kernel, n in nccl.items():
        expected_ops[re.match(r"ncclDevKernel_([A-Za-z]+)|ncclKernel_([A-Za-z]+)", kernel).group(1, 2)[0] or ""] += n
    assert by_op == expected_ops


@pytest.mark.parametrize("name", EVERY)
def test_run_length_is_first_to_last_activity(realtraces, nsysai_traces, name):
    path = _all_exports(realtraces, nsysai_traces)[name]
    _, runs = _analysed(path)
    assert runs == [sql_run_ns(path)]


@pytest.mark.parametrize("name", EVERY)
def test_every_process_that_ran_gpu_work_has_a_rank_on_its_devices(realtraces, nsysai_traces, name):
    """Each process putting work on a GPU (SQL: the pid in globalPid) is one rank of the report,
    and each device lists the ranks of exactly those processes."""
    path = _all_exports(realtraces, nsysai_traces)[name]
    doc, _ = _analysed(path)
    ranks = doc["summary"]["ranks"]
    rank_of = {r["pid"]: r["rank"] for r in ranks}
    assert len({r["rank"] for r in ranks}) == len(ranks), "one rank per process"
    expected = sql_devices(path)
    assert {p for d in expected.values() for p in d["pids"]} <= set(rank_of)
    for d in doc["summary"]["devices"]:
        assert d["ranks"] == ",".join(str(r) for r in sorted(rank_of[p] for p in expected[d["device"]]["pids"]))
    assert doc["traces"][0]["ranks"] == sorted(rank_of.values())


def test_mpi_job_split_across_five_files_is_one_job(realtraces):
    paths = [realtraces[n] for n in MPI_JOB]
    with load_trace(paths) as trace:
        doc = analyse(trace)
        offsets = trace.job_clock()
    # Each file is one MPI rank; the job names its rank in an NVTX thread name ("MPI Rank 3").
    named = []
    for path in paths:
        db = Sql(path)
        (text,) = [v for (v,) in db.rows("SELECT value FROM StringIds WHERE value GLOB 'MPI Rank *'", "StringIds")]
        named.append(int(text.removeprefix("MPI Rank ")))
    assert named == [3, 7, 4, 2, 6]  # as the README says
    ranks = [(r["export"], r["rank"], r["rank_source"]) for r in doc["summary"]["ranks"]]
    assert ranks == [(i, rank, "nvtx") for i, rank in enumerate(named)]
    # Each rank drove the GPU with its own number.
    assert [t["devices"] for t in doc["traces"]] == [[r] for r in named]
    assert [e["peer_copies"] for e in doc["summary"]["exports"]] == [sql_figures(p)["peer_copies"] for p in paths]
    assert [e["peer_copies"] for e in doc["summary"]["exports"]] == [1000, 1000, 1000, 2000, 2000]
    # Session start times lie within 3.7 ms: the clocks line up. The offsets are those of SQL's session starts.
    starts = [Sql(p).one("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SESSION_START_TIME")
              for p in paths]  # fmt: skip
    assert offsets.tolist() == [s - min(starts) for s in starts]
    assert offsets.min() == 0 and offsets.max() < 3_700_000
    assert doc["summary"]["limitations"] == []


def test_two_ranks_in_one_file_with_real_nccl_send_recv(nsysai_traces):
    """nsys-ai's before/after pair: two torchrun processes in one export, one H100 each, and
    NCCL >= 2.19 ``ncclDevKernel_SendRecv`` kernels (66 before, 62 after, as its README says)."""
    for name, sends in (("mfu_2gpu_before", 66), ("mfu_2gpu_after", 62)):
        path = nsysai_traces[name]
        doc, _ = _analysed(path)
        s = doc["summary"]
        db = Sql(path)
        per_pid = db.rows(f"SELECT globalPid, deviceId, count(*) FROM {KERNEL} GROUP BY 1, 2", KERNEL)
        assert len(per_pid) == 2 and len({d for _, d, _ in per_pid}) == 2, "two processes, one GPU each"
        rank_of = {r["pid"]: r["rank"] for r in s["ranks"]}
        assert sorted(rank_of[_pid(g)] for g, _, _ in per_pid) == [0, 1]
        assert doc["traces"][0]["ranks"] == [0, 1] and doc["traces"][0]["devices"] == [0, 1]
        assert s["nccl"] == [{"kind": "p2p", "op": "SendRecv", "bytes": "unknown", "count": sends,
                              "total_ns": s["nccl"][0]["total_ns"], "mean_ns": s["nccl"][0]["mean_ns"]}]  # fmt: skip
        (total,) = db.rows(
            f"SELECT sum(k.end - k.start) FROM {KERNEL} k JOIN StringIds s ON s.id = k.shortName "
            "WHERE s.value = 'ncclDevKernel_SendRecv'",
            KERNEL,
        )[0]
        assert s["nccl"][0]["total_ns"] == total


def test_export_without_kernel_table_says_so(realtraces):
    doc, runs = _analysed(realtraces["Yu-gyoung-Yun__alpa__report2"])
    assert KERNEL not in Sql(realtraces["Yu-gyoung-Yun__alpa__report2"]).tables
    assert doc["summary"]["exports"][0]["kernels"] == 0 and runs == [0]
    assert any("No kernel records" in n for n in doc["summary"]["limitations"])
    assert any("No NVTX events" in n for n in doc["summary"]["limitations"])


def test_new_schema_strings_and_metadata(realtraces):
    path = realtraces["NVIDIA__Fuser__report1_ee4fcf30"]
    with load_trace([path]) as trace:
        info = trace.exports[0]
        kernels = trace.kernels
        api = trace.cuda_api
    db = Sql(path)
    meta = dict(db.rows("SELECT name, value FROM META_DATA_EXPORT", "META_DATA_EXPORT"))
    assert (info.nsys_version, info.schema_version) == ("2025.1.1.110", "3.17.1")
    assert info.schema_version == meta["EXPORT_SCHEMA_VERSION"]
    assert len(kernels) == 18 == db.one(f"SELECT count(*) FROM {KERNEL}", KERNEL)
    assert kernels["short_name"].notna().all()
    # every kernel's launch call is found through its correlation id, and it is the call SQL joins to
    launches = kernels.merge(api, on=["export", "pid", "correlation_id"])
    assert len(launches) == 18
    expected = sorted(
        db.rows(
            f"SELECT s.value FROM {KERNEL} k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
            "AND r.globalTid >> 24 = k.globalPid >> 24 JOIN StringIds s ON s.id = r.nameId",
            KERNEL,
            "CUPTI_ACTIVITY_KIND_RUNTIME",
        )
    )
    assert sorted(launches["name_y"].astype(str)) == [v for (v,) in expected]
    assert launches["name_y"].astype(str).str.startswith("cu").all()
