"""One regression test per crash site the hostile-exports fuzz run found: each damages a copy of
a bundled sample with one SQL change and checks that nsysan keeps going (or refuses in one line),
says what it left out, and computes no figure outside its range."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fixtures.samples import SAMPLES_DIR, sample_paths
from nsysan.analysis import analyse
from nsysan.errors import CorruptExportError, InputError
from nsysan.ingest import load_trace
from nsysan.report.renderers import RENDERERS
from tests.conftest import sha256
from tests.test_fuzz import impossible_figures

SAMPLE = sample_paths("allreduce-2rank")[0]
INT64_MIN = -(2**63)


def damaged(tmp_path: Path, *sql: str, sample: Path = SAMPLE, name: str = "trace.sqlite") -> Path:
    """A copy of ``sample`` with ``sql`` applied, constraints of nsys's DDL lifted where needed."""
    path = tmp_path / name
    shutil.copy(sample, path)
    con = sqlite3.connect(path)
    for statement in sql:
        try:
            con.execute(statement)
        except sqlite3.IntegrityError:  # NOT NULL / CHECK: rebuild the table without them
            table = statement.split('"')[1] if '"' in statement.split()[1] else statement.split()[1]
            con.execute(f"CREATE TABLE fuzz_tmp AS SELECT * FROM {table}")
            con.execute(f"DROP TABLE {table}")
            con.execute(f"ALTER TABLE fuzz_tmp RENAME TO {table}")
            con.execute(statement)
    con.commit()
    con.close()
    return path


def report(*paths: Path) -> dict:
    """The JSON report of ``paths``, after every renderer has rendered it."""
    with load_trace(paths) as trace:
        doc = analyse(trace)
    for render in RENDERERS.values():
        render(doc)
    doc = json.loads(RENDERERS["json"](doc))
    assert impossible_figures(doc) == []
    return doc


def notes(doc: dict) -> list[str]:
    return doc["summary"]["limitations"]


@pytest.mark.parametrize("value", ["NULL", "'abc'", "1e999", "0.5", str(INT64_MIN), "-1", str(2**62)])
@pytest.mark.parametrize("table", ["CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                   "CUPTI_ACTIVITY_KIND_MEMCPY"])  # fmt: skip
def test_bad_timestamps_are_dropped_and_counted(tmp_path, table, value):
    """intervals.covered_ns, overview.nvtx_range_table, attach_nccl_bytes and device_table used to
    cast NULL/text/NaN/-2**63 timestamps to int64 and crash."""
    path = damaged(tmp_path, f"UPDATE {table} SET start = {value} WHERE rowid % 3 = 0")
    con = sqlite3.connect(path)
    hit = con.execute(f"SELECT count(*) FROM {table} WHERE rowid % 3 = 0").fetchone()[0]
    con.close()
    doc = report(path)
    dropped = [n for n in notes(doc) if "timestamp" in n and "ignored" in n]
    if table == "CUPTI_ACTIVITY_KIND_RUNTIME":  # only the launches of NCCL kernels are read, and counted
        assert len(dropped) <= 1 and all(0 < int(n.split()[0]) <= hit for n in dropped), notes(doc)
    else:
        assert len(dropped) == 1 and dropped[0].startswith(f"{hit} "), notes(doc)


def test_command_buffer_full_with_bad_timestamps(tmp_path):
    sample = sample_paths("launch-queue-full")[0]
    path = damaged(
        tmp_path,
        "UPDATE CUPTI_ACTIVITY_KIND_OVERHEAD SET start = NULL WHERE rowid % 2 = 0",
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = 'x' WHERE rowid % 4 = 0",
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = -9223372036854775808 WHERE rowid % 5 = 0",
        sample=sample,
    )
    doc = report(path)
    for what in ("CUDA runtime calls", "CUPTI overhead records", "kernels"):
        assert any(f"{what} with a missing or non-integer timestamp ignored" in n for n in notes(doc)), notes(doc)


def test_end_before_start_is_dropped_with_a_note_in_every_format(tmp_path):
    path = damaged(tmp_path, 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 1000 WHERE rowid <= 12')
    with load_trace([path]) as trace:
        doc = analyse(trace)
        assert (trace.kernels["end_ns"] >= trace.kernels["start_ns"]).all()
    note = "12 kernels with end before start ignored."
    assert note in doc["summary"]["limitations"]
    assert note in json.loads(RENDERERS["json"](doc))["summary"]["limitations"]
    for fmt in ("terminal", "markdown", "html"):
        assert note in RENDERERS[fmt](doc)


def test_real_int64_min_is_a_value_not_null(tmp_path):
    """-2**63 is also the reader's NULL sentinel: a real one (a uint64 payload of 2**63) must survive."""
    path = damaged(tmp_path, f"UPDATE NVTX_EVENTS SET uint64Value = {INT64_MIN} WHERE rowid = 2",
                   "UPDATE NVTX_EVENTS SET uint64Value = NULL WHERE rowid = 3")  # fmt: skip
    with load_trace([path]) as trace:
        nvtx = trace.nvtx
    assert (nvtx["payload_int"] == INT64_MIN).sum() == 1
    assert nvtx["payload_int"].isna().sum() >= 1


@pytest.mark.parametrize("value", ["'x'", "1.5", "NULL", "X'01'"])
def test_non_integer_enum_ids(tmp_path, value):
    """frames.nvtx_type_names and _label_enum cast enum ids with int()."""
    path = damaged(tmp_path, f"UPDATE ENUM_NSYS_EVENT_TYPE SET id = {value} WHERE rowid % 2 = 0",
                   f"UPDATE ENUM_CUDA_MEMCPY_OPER SET id = {value} WHERE rowid % 2 = 1")  # fmt: skip
    report(path)


def test_huge_rank_in_an_nvtx_mark(tmp_path):
    """ranks.identify_ranks cast 1e20 to Int64."""
    path = damaged(tmp_path, "UPDATE NVTX_EVENTS SET text = 'nsysan rank=99999999999999999999' WHERE eventType = 34")
    doc = report(path)
    assert sorted(r["rank"] for r in doc["summary"]["ranks"]) == [0, 1]
    assert {r["rank_source"] for r in doc["summary"]["ranks"]} == {"process order"}


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE PROCESSES SET name = X'00ff61'",  # ranks: process name
        "UPDATE StringIds SET value = randomblob(12) WHERE id % 2 = 0",  # export._categorical_from_ids
        "UPDATE NVTX_EVENTS SET text = X'6e63636cff' WHERE text IS NOT NULL",  # render_json
        "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = X'0102'",  # export.meta
        "UPDATE META_DATA_EXPORT SET value = X'ff00'",
        "UPDATE TARGET_INFO_GPU SET name = X'ff', uuid = randomblob(16)",
    ],
)
def test_blobs_where_text_belongs(tmp_path, sql):
    doc = report(damaged(tmp_path, sql))
    json.dumps(doc)


def test_table_name_that_is_not_utf8_is_a_corrupt_export(tmp_path):
    path = damaged(
        tmp_path,
        "CREATE TABLE Az (x INTEGER)",
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_master SET name = CAST(X'41ff' AS TEXT), tbl_name = CAST(X'41ff' AS TEXT), "
        "sql = CAST(X'435245415445205441424c45202241ff22202878494e544547455229' AS TEXT) WHERE name = 'Az'",
    )
    with pytest.raises(CorruptExportError, match="corrupt export"):
        load_trace([path])


def test_column_names_are_case_insensitive(tmp_path):
    """export.strings looked up the column "id" of StringIds by its exact spelling."""
    path = damaged(tmp_path, "ALTER TABLE StringIds RENAME COLUMN id TO ID",
                   'ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN "start" TO "START"')  # fmt: skip
    with load_trace([path]) as trace:
        clean = load_trace([SAMPLE])
        assert len(trace.kernels) == len(clean.kernels)
        assert trace.kernels["short_name"].astype(str).tolist() == clean.kernels["short_name"].astype(str).tolist()
        clean.close()
    report(path)


def test_all_kernel_names_dangling(tmp_path):
    """graph_allreduce_gap's .mode().iloc[0] raised IndexError when no short name resolved."""
    sample = sample_paths("graph-gap")[0]
    path = damaged(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = shortName + 1000000000, "
                   "demangledName = demangledName + 1000000000", sample=sample)  # fmt: skip
    doc = report(path)
    assert all(k["kernel"].startswith("<unknown string ") for k in doc["summary"]["top_kernels"])
    assert any("missing from StringIds" in n for n in notes(doc))


@pytest.mark.parametrize("value", [str(2**63 - 1), "9223372036854775808", str(INT64_MIN), "'soon'"])
def test_session_start_out_of_range(tmp_path, value):
    """trace.job_clock overflowed on utcEpochNs = 2**63."""
    ranks = sorted((SAMPLES_DIR / "allreduce-4rank-2022.4").glob("*.sqlite"))
    if (
        not ranks
        or not sqlite3.connect(ranks[0])
        .execute("SELECT 1 FROM sqlite_master WHERE name = 'TARGET_INFO_SESSION_START_TIME'")
        .fetchone()
    ):
        ranks = [SAMPLE]
    paths = [damaged(tmp_path, f"UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = {value}", sample=ranks[0],
                     name="r0.sqlite")] + [shutil.copy(p, tmp_path / f"r{i}.sqlite") for i, p in enumerate(ranks[1:], 1)]  # fmt: skip
    with load_trace(paths) as trace:
        clock = trace.job_clock()
        analyse(trace)
    assert (clock >= 0).all() and (clock < 2**62).all()


def test_invalid_utf8_keeps_the_export_usable(tmp_path):
    path = damaged(tmp_path, "UPDATE StringIds SET value = CAST(X'6e636366ff' AS TEXT) WHERE id % 3 = 0")
    doc = report(path)
    assert "Text with bytes that are not UTF-8 is shown with replacement characters." in notes(doc)


def nsysan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_in_a_directory_is_skipped_with_a_note(tmp_path):
    """The header check blocked forever opening a FIFO named x.sqlite."""
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(SAMPLE, job / "rank0.sqlite")
    os.mkfifo(job / "x.sqlite")
    (job / "nested.sqlite").mkdir()
    result = nsysan_cli("report", str(job), "--format", "json")
    assert result.returncode == 0, result.stderr
    limitations = json.loads(result.stdout)["summary"]["limitations"]
    assert f"{job / 'x.sqlite'}: skipped, not a regular file" in limitations
    assert f"{job / 'nested.sqlite'}: skipped, not a regular file" in limitations


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_given_by_name_is_refused(tmp_path):
    os.mkfifo(tmp_path / "x.sqlite")
    result = nsysan_cli("report", str(tmp_path / "x.sqlite"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"nsysan: error: {tmp_path / 'x.sqlite'}: not a regular file "
                                                  "(a FIFO, device or socket); give the .sqlite export itself"]  # fmt: skip


def test_device_given_by_name_is_refused():
    with pytest.raises(InputError, match="not a regular file"):
        load_trace(["/dev/null"])


def test_sums_that_would_overflow_are_refused_not_wrapped(tmp_path):
    grow = "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL"
    path = damaged(tmp_path, grow, grow, f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 0, "end" = {2**56}')
    with pytest.raises(InputError, match="beyond what int64 holds"), load_trace([path]) as trace:
        analyse(trace)


def test_damaged_input_is_not_modified(tmp_path):
    path = damaged(tmp_path, 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = NULL WHERE rowid % 2 = 0')
    before = sha256(path)
    report(path)
    assert sha256(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.sqlite"]


def test_dropped_rows_frame(tmp_path):
    path = damaged(tmp_path, 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 1 WHERE rowid <= 3')
    with load_trace([path]) as trace:
        _ = trace.kernels  # reading the frame is what drops the rows
        dropped = trace.dropped_rows()
    assert dropped.to_dict("records") == [
        {"export": 0, "what": "kernels", "reason": "with end before start ignored", "rows": 3}
    ]
    assert isinstance(dropped, pd.DataFrame)


@pytest.mark.parametrize("value", ["NULL", "'abc'", "X'00'"])
def test_kernels_without_a_name_id_get_a_placeholder(tmp_path, value):
    """A kernel whose name id is unusable still ran: code grouping kernels by name (the report's
    profile, graph_allreduce_gap) met NA names and crashed."""
    path = damaged(tmp_path, f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = {value}, demangledName = {value} "
                   "WHERE rowid % 2 = 0", sample=sample_paths("graph-gap")[0])  # fmt: skip
    with load_trace([path]) as trace:
        k = trace.kernels
    assert k["short_name"].notna().all() and k["name"].notna().all()
    assert (k["short_name"] == "<no name>").sum() == (k["name"] == "<no name>").sum() > 0
    assert any("kernels without a usable name id, shown as <no name>" in n for n in notes(report(path)))
    result = nsysan_cli("report", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr


def test_kernels_of_process_zero_are_reported_not_a_crash(tmp_path):
    """globalPid 0 (no process) on every kernel: the overview's device table had no rank to join and
    crashed (exit 70); the kernels are reported, with no rank."""
    path = damaged(
        tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = 0", sample=sample_paths("pipeline-stall")[0]
    )
    doc = report(path)
    devices = doc["summary"]["devices"]
    assert devices and all(d["ranks"] == "" for d in devices) and sum(d["kernels"] for d in devices) > 0


def test_a_thread_id_beyond_int64_is_no_thread_and_no_warning(tmp_path):
    """SQLite stores 2**63 as a REAL: decoded as the id of no process, without numpy's cast warning."""
    path = damaged(
        tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = 9223372036854775808 WHERE rowid % 7 = 0"
    )
    out = subprocess.run([sys.executable, "-m", "nsysan", "report", "--no-cache", str(path)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONWARNINGS": "default"})  # fmt: skip
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_sixty_thousand_pushes_without_pops(tmp_path):
    """An instrumentation slip: ranges pushed and never popped nest 60k deep. The slowdown detector's
    program positions were quadratic in the depth (3.3 GB at 20k, MemoryError at 60k); levels past
    64 now fold into their ancestor."""
    sql = ("WITH RECURSIVE r(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM r WHERE x < 59999) "
           'INSERT INTO NVTX_EVENTS(start, "end", eventType, globalTid, text) '
           "SELECT (SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL) + x, "
           '(SELECT max("end") FROM CUPTI_ACTIVITY_KIND_KERNEL) + 60000 - x, 59, '
           "(SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1), 'r' FROM r")  # fmt: skip
    path = damaged(tmp_path, sql, sample=sample_paths("overlap-slowdown")[0])
    out = subprocess.run([sys.executable, "-m", "nsysan", "report", "--no-cache", "--format", "json", str(path)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert impossible_figures(json.loads(out.stdout)) == []


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE NVTX_EVENTS RENAME TO N_real; CREATE VIEW NVTX_EVENTS AS WITH RECURSIVE c(x) AS "
        "(SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT n.* FROM N_real n, c",
        "CREATE TRIGGER t AFTER INSERT ON StringIds BEGIN SELECT 1; END",
    ],
)
def test_a_view_or_trigger_in_place_of_an_nsys_table_is_refused(tmp_path, sql):
    """A recursive view in place of NVTX_EVENTS read forever, and Ctrl-C could not stop it: nsys
    writes plain tables only, so one line and exit 2, and the file is untouched."""
    path = tmp_path / "trace.sqlite"
    shutil.copy(SAMPLE, path)
    with sqlite3.connect(path) as con:
        con.executescript(sql)
    before = sha256(path)
    out = subprocess.run([sys.executable, "-m", "nsysan", "report", "--no-cache", str(path)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "changed after export" in out.stderr
    assert sha256(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["trace.sqlite"]


@pytest.mark.parametrize("value", ["NULL", "0", "-1"])
def test_kernels_whose_stream_is_unknown(tmp_path, value):
    """Every kernel's streamId NULL (or 0, -1): the dependency graph has no step ends, so nothing can
    be replayed; recoverable time is 0, not a crash (exit 70 in the 1,000-case fuzz run)."""
    path = damaged(tmp_path, f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "streamId" = {value}',
                   sample=sample_paths("overlap-slowdown")[0])  # fmt: skip
    doc = report(path)
    assert doc["findings"] and all(f["recoverable_ns"] >= 0 for f in doc["findings"])


COUNT_TO_30M = (
    "WITH RECURSIVE r(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM r WHERE x < 30000000) SELECT count(*) FROM r"
)


def test_ctrl_c_stops_a_read_in_progress():
    """SQLite runs a query in C, where Python's SIGINT handler never runs: without the progress
    handler this read takes ~9 s whatever Ctrl-C says. With it, KeyboardInterrupt comes at once."""
    import _thread
    import signal
    import threading
    import time

    from nsysan.ingest.export import NsysExport

    # Ctrl-C as Python handles it (KeyboardInterrupt), whatever an earlier test's library left
    # (interrupt_main does nothing for a signal Python does not handle), raised for the first press
    # only; pressed every 0.3 s until the read stops (in a full CI run one press was once not seen):
    # without the progress handler no press stops the read early
    pressed: list[int] = []

    def ctrl_c(_signum: int, _frame: object) -> None:
        if not pressed:
            pressed.append(1)
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, ctrl_c)
    done = threading.Event()

    def press() -> None:
        while not done.wait(0.3):
            _thread.interrupt_main()

    try:
        with NsysExport(SAMPLE) as x:
            presser = threading.Thread(target=press, daemon=True)
            start = time.monotonic()
            presser.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    x.scalar(COUNT_TO_30M)
            finally:
                done.set()
                presser.join()
            assert time.monotonic() - start < 2.0 and pressed
            assert x.scalar("SELECT count(*) FROM StringIds")  # the export reads on
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_read_past_the_time_limit_is_stopped_with_one_line(tmp_path, monkeypatch):
    import time

    from nsysan.errors import QueryTimeLimitError
    from nsysan.ingest.export import NsysExport

    monkeypatch.setenv("NSYSAN_QUERY_TIME_LIMIT", "0.3")
    with NsysExport(SAMPLE) as x:
        start = time.monotonic()
        with pytest.raises(QueryTimeLimitError, match=r"ran past 0\.3 s .*NSYSAN_QUERY_TIME_LIMIT"):
            x.scalar(COUNT_TO_30M)
        assert time.monotonic() - start < 2.0
    path = damaged(tmp_path, "WITH RECURSIVE r(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM r WHERE x < 59999) "
                   'INSERT INTO NVTX_EVENTS(start, "end", eventType, globalTid, text) '
                   "SELECT x, x + 10, 59, (SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1), 'r' FROM r",
                   sample=sample_paths("overlap-slowdown")[0])  # fmt: skip
    env = {**os.environ, "NSYSAN_QUERY_TIME_LIMIT": "0.001", "NSYSAN_ARROW": "0"}
    out = subprocess.run([sys.executable, "-m", "nsysan", "report", "--no-cache", str(path)], capture_output=True,
                         text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "ran past 0.001 s" in out.stderr, out.stderr
    for bad in ("0", "-1", "soon", "inf"):
        out = subprocess.run([sys.executable, "-m", "nsysan", "report", "--no-cache", str(path)], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "NSYSAN_QUERY_TIME_LIMIT": bad})  # fmt: skip
        assert out.returncode == 2 and out.stderr.splitlines() == [
            f"nsysan: error: NSYSAN_QUERY_TIME_LIMIT={bad!r}: give a number of seconds greater than 0"
        ], out.stderr


@pytest.mark.parametrize("table", ["CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_MEMCPY"])
def test_copies_on_device_minus_one_make_no_device_row(tmp_path, table):
    """deviceId -1 is nsys's identity for "no device" (the 1,000-case fuzz run, seed 20261130, case
    87: memsets of the real 2x H100 export set to -1 put a device -1 in the device table)."""
    doc = report(damaged(tmp_path, f"UPDATE {table} SET deviceId = -1"))
    assert impossible_figures(doc) == []
    assert all(d["device"] >= 0 for d in doc["summary"]["devices"])
