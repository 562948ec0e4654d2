"""Exports nsys writes in Parquet or Arrow (``--type parquetdir``, ``arrowdir``) give the report
their SQLite export gives: real SQLite exports are laid out as those directories with plain
sqlite3 + pyarrow (tests/parquetdir.py) and both reports compared whole. nsys's own 2022.4
``--type arrow`` output is checked against the real nsys in tests/test_real_nsys.py."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from nsysan.analysis import analyse
from nsysan.ingest import arrow_exports, load_trace, raw_reports
from nsysan.ingest.inputs import expand_inputs
from tests.conftest import NSYS_AI_PREFIX, need, realtraces_dir
from tests.parquetdir import write_table_dir

# one export of each kind the real ones cover: NCCL payloads and Command Buffer Full rows (nsys
# 2026), a before/after pair's side, NVTX-heavy PyTorch, peer copies, JAX on an old nsys, MPI
SINGLE = [
    "openhackathons-org__AI-Profiler__baseline_nvtx",
    "openhackathons-org__gpubootcamp__jacobi_memcpy_sys_report",
    "Yu-gyoung-Yun__alpa__jax_profile_mem",
    "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0",
    "NVIDIA__Fuser__report1_ee4fcf30",
]
MPI_JOB = [f"openhackathons-org__gpubootcamp__mpi_report{n}" for n in (1, 2, 3, 4, 6)]


def _doc(paths: list[Path]) -> str:
    """The report as JSON, paths left out (the copy's path is not the export's)."""
    with load_trace(paths, cache=None) as trace:
        doc = analyse(trace)
    return re.sub(r'"path": "[^"]*"', '"path": "-"', json.dumps(doc, sort_keys=True))


@pytest.fixture(autouse=True)
def _copies_in(tmp_path):
    raw_reports.configure(tmp_path / "exports")
    yield
    raw_reports.configure(None, cached=False)


@pytest.mark.parametrize("name", SINGLE)
def test_a_parquetdir_reports_as_its_sqlite_export(realtraces, tmp_path, name):
    sqlite = realtraces[name]
    pqt = write_table_dir(sqlite, tmp_path / f"{name}_pqtdir")
    assert _doc([pqt]) == _doc([sqlite])


@pytest.mark.parametrize("name", ["h100_2gpu_1s_ab196ea2", "mfu_2gpu_after"])
def test_nsys_2026_exports_as_arrowdir_report_as_their_sqlite(nsysai_traces, tmp_path, name):
    sqlite = nsysai_traces[name]
    arw = write_table_dir(sqlite, tmp_path / name, fmt="arrow")
    assert {p.suffix for p in arw.iterdir()} == {".arrow"}
    assert _doc([arw]) == _doc([sqlite])


@pytest.mark.parametrize("name", ["healthy_1pct", "healthy_judged_1pct"])
def test_stripped_exports_as_parquetdir_report_as_their_sqlite(tmp_path, name):
    """nsys-ai's cut-down exports (kernel table without globalPid, few tables)."""
    import lzma
    import shutil

    src = realtraces_dir() / "stripped" / f"{NSYS_AI_PREFIX}{name}.sqlite.xz"
    need(src.is_file(), f"the stripped real exports ({src})")
    sqlite = tmp_path / f"{name}.sqlite"
    with lzma.open(src) as fin, sqlite.open("wb") as fout:
        shutil.copyfileobj(fin, fout)
    pqt = write_table_dir(sqlite, tmp_path / "pqt" / f"{name}_pqtdir")
    assert _doc([pqt]) == _doc([sqlite])


def test_a_job_of_parquetdirs_in_one_directory_reports_as_its_sqlite_exports(realtraces, tmp_path):
    """Five ranks of an MPI job, each a parquetdir, named by their parent directory."""
    job = tmp_path / "job"
    for name in MPI_JOB:
        write_table_dir(realtraces[name], job / f"{name}_pqtdir")
    copies = expand_inputs([job])
    assert [p.name for p in copies] == [f"{n}.sqlite" for n in MPI_JOB]
    assert _doc([job]) == _doc([realtraces[n] for n in MPI_JOB])


def test_copied_once_and_nothing_written_beside_it(realtraces, tmp_path):
    pqt = write_table_dir(realtraces[SINGLE[0]], tmp_path / "in" / "run_pqtdir")
    before = sorted(os.listdir(pqt))
    arrow_exports._done.clear()
    (first,) = expand_inputs([pqt])
    made = first.stat().st_mtime_ns
    arrow_exports._done.clear()  # as a new process would: found by the hash of the files
    (again,) = expand_inputs([str(pqt)])
    assert again == first and again.stat().st_mtime_ns == made
    assert first.name == "run.sqlite" and tmp_path / "exports" in first.parents
    assert sorted(os.listdir(pqt)) == before and sorted(os.listdir(tmp_path / "in")) == ["run_pqtdir"]
    # a changed table is a different export
    sid = pq.read_table(pqt / "StringIds.parquet")
    pq.write_table(sid.slice(0, sid.num_rows - 1), pqt / "StringIds.parquet")
    (changed,) = expand_inputs([pqt])
    assert changed != first


def test_text_is_copied_byte_for_byte(tmp_path):
    """nsys's SQLite keeps what the application wrote, valid UTF-8 or not; so does the copy."""
    pqt = tmp_path / "odd_pqtdir"
    pqt.mkdir()
    odd = [b"step 1", b"\xff\xfebad", "caf\u00e9".encode()]
    pq.write_table(pa.table({"id": pa.array([0, 1, 2], pa.uint32()), "value": pa.array(odd, pa.binary())}),
                   pqt / "StringIds.parquet")  # fmt: skip
    pq.write_table(pa.table({"globalTid": pa.array([2**62 + 5], pa.uint64()), "nameId": pa.array([1], pa.uint32()),
                             "on": pa.array([True])}), pqt / "ThreadNames.parquet")  # fmt: skip
    # an NVTX payload the application chose (2**64 - 1 is -1 in nsys's SQLite), and NCCL's payload
    # struct, which a parquetdir may carry as a string column and nsys's SQLite keeps as a blob
    blob = bytes(range(256))[::-1]
    as_text = pa.compute.cast(pa.array([blob], pa.binary()), pa.large_string(), safe=False)
    pq.write_table(pa.table({"start": pa.array([1], pa.int64()), "uint64Value": pa.array([2**64 - 1], pa.uint64()),
                             "binaryData": as_text}), pqt / "NVTX_EVENTS.parquet")  # fmt: skip
    copy = arrow_exports.sqlite_of_tables(pqt)
    con = sqlite3.connect(copy)
    con.text_factory = bytes
    assert con.execute("SELECT value, typeof(value) FROM StringIds ORDER BY id").fetchall() == [
        (v, b"text") for v in odd
    ]
    assert con.execute('SELECT globalTid, nameId, "on" FROM ThreadNames').fetchall() == [(2**62 + 5, 1, 1)]
    assert con.execute("SELECT uint64Value, binaryData, typeof(binaryData) FROM NVTX_EVENTS").fetchall() == [
        (-1, blob, b"blob")
    ]


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsysan", "report", "--no-cache", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_unreadable_tables_are_one_line_and_exit_2(tmp_path):
    broken = tmp_path / "broken_pqtdir"
    broken.mkdir()
    (broken / "StringIds.parquet").write_bytes(b"PAR1 not really")
    r = _report(str(broken))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "StringIds.parquet" in r.stderr and "cannot read" in r.stderr

    garbage = tmp_path / "x.arrows"
    garbage.write_bytes(b"\x00" * 64)
    r = _report(str(garbage))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "x.arrows" in r.stderr, r.stderr

    twice = tmp_path / "twice_pqtdir"
    twice.mkdir()
    strings = pa.table({"id": pa.array([0], pa.uint32()), "value": pa.array([b"x"], pa.binary())})
    pq.write_table(strings, twice / "StringIds.parquet")
    feather.write_feather(strings, twice / "StringIds.arrow", compression="uncompressed")
    r = _report(str(twice))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "table StringIds is in both StringIds.arrow and StringIds.parquet" in r.stderr


def _streams(path: Path, tables: dict[str, pa.Table]) -> bytes:
    """An nsys 2022.4 style .arrows: one Arrow stream per table, named in its metadata."""
    sink = pa.BufferOutputStream()
    for name, table in tables.items():
        table = table.replace_schema_metadata({"table_name": name})
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    path.write_bytes(data)
    return data


def test_an_arrows_file_cut_short_is_refused_and_messages_name_the_input(tmp_path):
    """A stream without its end marker is a truncated file, not a shorter table; and an error found
    after the copy names what the user gave, not the copy in the cache."""
    whole = _streams(tmp_path / "whole.arrows", {
        "StringIds": pa.table({"id": pa.array([0, 1], pa.uint32()), "value": pa.array([b"a", b"b"], pa.binary())}),
        "ThreadNames": pa.table({"nameId": pa.array([1], pa.uint64()), "globalTid": pa.array([7], pa.uint64())}),
    })  # fmt: skip
    cut = tmp_path / "cut.arrows"
    cut.write_bytes(whole[:-8])  # the last stream's end marker gone
    r = _report(str(cut))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cut.arrows is cut short" in r.stderr, r.stderr
    r = _report(str(tmp_path / "whole.arrows"))  # complete, but no CUDA and no NVTX: refused, naming the input
    assert r.returncode == 2 and f"{tmp_path / 'whole.arrows'}:" in r.stderr and "exports" not in r.stderr, r.stderr


def test_an_export_beside_its_sqlite_twin_is_read_once_and_dot_is_named_after_its_directory(realtraces, tmp_path):
    """`nsys export --type sqlite,parquetdir` writes job.sqlite and job_pqtdir/ side by side: a
    directory holding both is one capture (the .sqlite is read), as with job.nsys-rep."""
    runs = tmp_path / "runs"
    write_table_dir(realtraces[SINGLE[0]], runs / "job_pqtdir")
    (runs / "job.sqlite").write_bytes(realtraces[SINGLE[0]].read_bytes())
    write_table_dir(realtraces[SINGLE[1]], runs / "other_arwdir", fmt="arrow")
    assert [p.name for p in expand_inputs([runs])] == ["job.sqlite", "other.sqlite"]
    old = Path.cwd()
    try:
        os.chdir(runs / "job_pqtdir")
        (copy,) = expand_inputs(["."])
    finally:
        os.chdir(old)
    assert copy.name == "job.sqlite" and tmp_path / "exports" in copy.parents


def test_a_directory_of_unrelated_parquet_is_not_an_export(tmp_path):
    other = tmp_path / "data"
    other.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), other / "sales.parquet")
    r = _report(str(other))
    assert r.returncode == 2 and "holds no .sqlite exports" in r.stderr and r.stderr.count("\n") == 1, r.stderr
