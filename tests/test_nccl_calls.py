"""NCCL API calls from NCCL's NVTX ranges: fixtures in both payload encodings, the real nsys-ai
exports (schema present, payload values absent), and blobs that are cut or garbled."""

from __future__ import annotations

import lzma
import shutil
import sqlite3
import struct
from pathlib import Path

import pandas as pd
import pytest

from fixtures.exporter import ExportWriter
from nsysan.ingest import NsysExport, load_trace
from nsysan.ingest.nccl_calls import NCCL_CALL_COLUMNS, nccl_payload_status, read_nccl_calls
from tests.conftest import need, realtraces_dir

COMM = 0xF00D_0000_0000_0001  # above 2**63: the communicator hash uses all 64 bits
COMM_DP = 0x1234_5678


def _write_job(path: Path, flavour: str, *, noise_ranges: int = 0) -> None:
    """Two ranks: init, a grouped send/recv pair, an all-reduce; NVTX noise written first."""
    w = ExportWriter(path, flavour)
    for rank, pid in enumerate((300, 301)):
        w.process(pid, "python")
        w.thread(pid, pid, "python")
        w.nvtx_domain(pid, pid, 2, "train", 0)
        for i in range(noise_ranges):
            w.nvtx_range(pid, pid, 10 * i, 10 * i + 5, f"step {i}", domain_id=2, payload=i)
        t = 1_000_000
        w.nccl_call(pid, pid, t, t + 900, "ncclCommInitRankConfig", comm_id=COMM, nranks=2, rank=rank)
        w.nccl_call(pid, pid, t + 1000, t + 1010, "ncclGroupStart")
        w.nccl_call(pid, pid, t + 1020, t + 1100, "ncclSend", comm_id=COMM, nbytes=1 << 20, peer=1 - rank)
        w.nccl_call(pid, pid, t + 1120, t + 1200, "ncclRecv", comm_id=COMM, nbytes=1 << 19, peer=1 - rank)
        w.nccl_call(pid, pid, t + 1210, t + 1300, "ncclGroupEnd")
        w.nccl_call(pid, pid, t + 2000, t + 2100, "ncclAllReduce", comm_id=COMM_DP, nbytes=4096)
    w.close()


def _expected(flavour: str) -> pd.DataFrame:
    rows = []
    for rank, pid in enumerate((300, 301)):
        rows += [
            (pid, "ncclCommInitRankConfig", COMM, None, None, 2, rank),
            (pid, "ncclGroupStart", None, None, None, None, None),
            (pid, "ncclSend", COMM, 1 << 20, 1 - rank, None, None),
            (pid, "ncclRecv", COMM, 1 << 19, 1 - rank, None, None),
            (pid, "ncclGroupEnd", None, None, None, None, None),
            (pid, "ncclAllReduce", COMM_DP, 4096, None, None, None),
        ]
    df = pd.DataFrame(rows, columns=["pid", "call", "comm_id", "bytes", "peer", "nranks", "comm_rank"], dtype=object)
    if flavour == "2022.4":  # older NCCL: the size as the integer payload of the data calls, nothing else
        df[["comm_id", "peer", "nranks", "comm_rank"]] = None
        df.loc[df["call"] == "ncclCommInitRankConfig", "bytes"] = None
    return df


def _comparable(df: pd.DataFrame) -> pd.DataFrame:
    out = df[["pid", "call", "comm_id", "bytes", "peer", "nranks", "comm_rank"]].astype(object)
    out["call"] = out["call"].astype(str)
    return out.where(out.notna(), None).reset_index(drop=True)


@pytest.mark.parametrize("flavour", ["current", "2022.4"])
def test_round_trip_through_the_exporter(tmp_path, flavour):
    path = tmp_path / f"{flavour}.sqlite"
    _write_job(path, flavour, noise_ranges=1200)  # binaryData first appears after 1000 buffered rows
    with NsysExport(path) as x:
        calls = read_nccl_calls(x)
        status = nccl_payload_status(x)
    assert tuple(calls.columns) == NCCL_CALL_COLUMNS
    pd.testing.assert_frame_equal(_comparable(calls), _comparable(_expected(flavour)))
    assert str(calls["comm_id"].dtype) == "UInt64"
    assert all(str(calls[c].dtype) == "Int64" for c in ("bytes", "peer", "nranks", "comm_rank"))
    assert (calls["end_ns"] > calls["start_ns"]).all() and (calls["pid"] == calls["tid"]).all()
    assert status.state == ("decoded" if flavour == "current" else "integer")
    assert not status.missing and status.calls == 12


def test_trace_gathers_both_flavours_with_ranks(tmp_path):
    paths = [tmp_path / "a.sqlite", tmp_path / "b.sqlite"]
    _write_job(paths[0], "current")
    _write_job(paths[1], "2022.4")
    with load_trace(paths) as t:
        calls = t.nccl_calls
    assert calls.groupby("export").size().to_dict() == {0: 12, 1: 12}
    assert calls["rank"].notna().all()
    sends = calls[calls["call"] == "ncclSend"]
    assert sends["bytes"].tolist() == [1 << 20] * 4
    assert sends["comm_id"].isna().tolist() == [False, False, True, True]


def test_fixture_schema_rows_are_those_of_a_real_export(tmp_path):
    real = _real_export(tmp_path, "mfu_2gpu_before")
    path = tmp_path / "fixture.sqlite"
    _write_job(path, "current")
    which = "WHERE schemaId IN (16777225, 16777226, 16777227)"  # ncclSend, ncclRecv, ncclCommInitRankConfig
    query = ("SELECT domainId, schemaId, idx, flags, type, name, description, arrayOrUnionDetail, offset "
             f"FROM NVTX_PAYLOAD_SCHEMA_ENTRIES {which} ORDER BY 2, 3")  # fmt: skip
    schemas = ("SELECT domainId, schemaId, name, type, flags, numEntries, payloadSize, alignTo "
               f"FROM NVTX_PAYLOAD_SCHEMAS {which} ORDER BY 2")  # fmt: skip
    with sqlite3.connect(real) as r, sqlite3.connect(path) as f:
        # one registration per process in both (two processes each)
        assert f.execute(query).fetchall() == r.execute(query).fetchall()
        assert f.execute(schemas).fetchall() == r.execute(schemas).fetchall()
        sends = "textId IN (SELECT id FROM StringIds WHERE value = 'ncclSend')"
        stored = f.execute(f"SELECT DISTINCT typeof(binaryData) FROM NVTX_EVENTS WHERE domainId = 1 AND {sends}")
        assert stored.fetchall() == [("blob",)]


def _real_export(tmp_path: Path, name: str) -> Path:
    src = realtraces_dir() / "nsys-ai" / f"GindaChen__nsys-ai__{name}.sqlite.xz"
    need(src.is_file(), f"the real nsys-ai export {src}")
    target = tmp_path / f"{name}.sqlite"
    if not target.exists():
        with lzma.open(src) as fin, target.open("wb") as fout:
            shutil.copyfileobj(fin, fout)
    return target


# Calls per (pid, name) in the nsys-ai windows, as plain SQL counts them (domain 1, push/pop).
REAL_COUNTS = {
    "mfu_2gpu_before": {144: (32, 32, 32, 64, 64), 145: (34, 34, 34, 68, 68)},
    "mfu_2gpu_after": {148: (30, 30, 30, 60, 60), 149: (30, 30, 30, 60, 60)},
}
REAL_NAMES = ("ncclCommCount", "ncclGroupEnd", "ncclGroupStart", "ncclRecv", "ncclSend")


@pytest.mark.parametrize("name", sorted(REAL_COUNTS))
def test_real_exports_give_named_calls_without_payload_values(tmp_path, name):
    path = _real_export(tmp_path, name)
    with sqlite3.connect(path) as c:
        sql = {
            (pid, call): n
            for pid, call, n in c.execute(
                "SELECT globalTid / 16777216 % 16777216, s.value, count(*) FROM NVTX_EVENTS e "
                "JOIN StringIds s ON s.id = e.textId WHERE e.domainId = 1 AND e.eventType = 59 GROUP BY 1, 2"
            )
        }
        # the domain-create row was cut away: the domain has no name, the calls are found by theirs
        assert c.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 75").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM NVTX_EVENTS WHERE binaryData IS NOT NULL").fetchone() == (0,)
    expected = {
        (pid, call): n for pid, counts in REAL_COUNTS[name].items() for call, n in zip(REAL_NAMES, counts, strict=True)
    }
    assert sql == expected
    with NsysExport(path) as x:
        calls = read_nccl_calls(x)
        status = nccl_payload_status(x)
    got = calls.groupby(["pid", "call"], observed=True).size().to_dict()
    assert {(int(p), str(n)): v for (p, n), v in got.items()} == expected
    assert calls[["comm_id", "bytes", "peer", "nranks", "comm_rank"]].isna().all().all()
    assert status.missing and status.calls == sum(expected.values()) and status.with_values == 0
    assert "--include-blobs=true" in status.reason


def test_export_without_nccl_calls(tmp_path):
    path = tmp_path / "none.sqlite"
    w = ExportWriter(path, "current")
    w.process(1, "python")
    w.nvtx_domain(1, 1, 5, "other", 0)
    w.nvtx_range(1, 1, 10, 20, "ncclLookalike", domain_id=5)  # NCCL's name pattern in a named foreign domain
    w.nvtx_range(1, 1, 30, 40, "ncclAllReduce")  # default domain: not NCCL's
    w.close()
    with NsysExport(path) as x:
        calls = read_nccl_calls(x)
        assert nccl_payload_status(x).state == "absent"
    assert calls.empty and tuple(calls.columns) == NCCL_CALL_COLUMNS


def _blob(schema: int, payload: bytes, *, size: int | None = None, domain: int = 1) -> bytes:
    size = len(payload) if size is None else size
    return struct.pack("<4Q", domain, schema, size, 32 + size) + payload


SEND = 16777225
GOOD = struct.pack("<QQi4x", 77, 512, 1)
# start_ns -> (binaryData written over the fixture's, expected (comm_id, bytes, peer))
DAMAGED: dict[int, tuple[object, tuple[object, object, object]]] = {
    1000: (_blob(SEND, GOOD), (77, 512, 1)),
    2000: (_blob(SEND, GOOD)[:20], (None, None, None)),  # cut inside the header
    3000: (_blob(SEND, GOOD)[:40], (None, None, None)),  # header claims 24 payload bytes, 8 follow
    4000: (_blob(SEND, GOOD, size=1 << 40), (None, None, None)),  # absurd payload size
    5000: (_blob(SEND, GOOD[:12], size=12), (77, None, None)),  # short payload: the fields that fit
    6000: (_blob(999, GOOD), (None, None, None)),  # no such schema
    7000: (_blob(SEND, GOOD, domain=9), (None, None, None)),  # schema of another domain
    8000: (b"", (None, None, None)),
    9000: ("not hex at all", (None, None, None)),
    10000: (_blob(SEND, GOOD).hex(), (77, 512, 1)),  # a blob stored as hex text still reads
    11000: (None, (None, None, None)),
}


def test_damaged_blobs_give_na_not_a_crash(tmp_path):
    path = tmp_path / "damaged.sqlite"
    w = ExportWriter(path, "current")
    w.process(7, "python")
    for start in DAMAGED:
        w.nccl_call(7, 7, start, start + 100, "ncclSend", comm_id=1, nbytes=1, peer=0)
    w.close()
    with sqlite3.connect(path) as c:
        for start, (blob, _) in DAMAGED.items():
            c.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE start = ? AND domainId = 1", (blob, start))
    with NsysExport(path) as x:
        calls = read_nccl_calls(x).set_index("start_ns")
        status = nccl_payload_status(x)
    for start, (_, expected) in DAMAGED.items():
        got = tuple(None if pd.isna(v) else int(v) for v in calls.loc[start, ["comm_id", "bytes", "peer"]])
        assert got == expected, start
    assert status.state == "decoded" and status.with_values == 3


def test_calls_found_by_name_when_the_domain_row_is_gone(tmp_path):
    path = tmp_path / "cut.sqlite"
    _write_job(path, "current")
    with sqlite3.connect(path) as c:
        c.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 75")
    with NsysExport(path) as x:
        calls = read_nccl_calls(x)
    pd.testing.assert_frame_equal(_comparable(calls), _comparable(_expected("current")))


def test_a_grouped_send_recv_kernel_with_payloads_is_matched_by_communicator(tmp_path):
    """One SendRecv kernel doing a group's send and receive (two legs) on each of two ranks, with
    NCCL's payloads: its participants come from the communicator, and analysing it does not crash
    (it did under pandas 3: a Series' numpy view is read-only)."""
    from nsysan.analysis import analyse

    path = tmp_path / "grouped.sqlite"
    w = ExportWriter(path, "current")
    kernel = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    for rank, pid in enumerate((300, 301)):
        w.process(pid, "python")
        w.thread(pid, pid, "python")
        w.gpu(rank)
        w.nccl_call(pid, pid, 1_000_000, 1_000_900, "ncclCommInitRankConfig", comm_id=COMM, nranks=2, rank=rank)
        for step in range(3):
            t = 2_000_000 + step * 1_000_000
            w.nccl_call(pid, pid, t, t + 10, "ncclGroupStart")
            w.nccl_call(pid, pid, t + 20, t + 100, "ncclSend", comm_id=COMM, nbytes=1 << 20, peer=1 - rank)
            w.nccl_call(pid, pid, t + 120, t + 200, "ncclRecv", comm_id=COMM, nbytes=1 << 20, peer=1 - rank)
            w.nccl_call(pid, pid, t + 210, t + 300, "ncclGroupEnd")
            correlation = 10 * step + 1
            w.runtime(pid, pid, t + 220, t + 280, "cudaLaunchKernel", correlation)
            late = 200_000 if (rank, step) == (1, 1) else 0  # rank 1 arrives late once
            w.kernel(pid, rank, 13, t + 300 + late, t + 400_000, kernel, correlation=correlation, grid=(2, 1, 1))
    w.close()
    with load_trace([path]) as trace:
        doc = analyse(trace)
    assert {(f["kind"], f["rank"]) for f in doc["findings"] if f["kind"] == "exposed_communication"} == {
        ("exposed_communication", 0),
        ("exposed_communication", 1),
    }
    # every op's participants were found (by communicator): none of their time is left unjudged
    assert not [u for u in doc["steps"].get("unjudged", []) if u["detector"] == "nccl_ordering_stall"]
