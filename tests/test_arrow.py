"""The Arrow read path: the same frames as the sqlite3 path, the fallback on values Arrow cannot
type as int64, and the export left untouched."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from nsysan.ingest import NsysExport, load_trace
from nsysan.ingest.frames import FRAMES, read_frame

REPO = Path(__file__).resolve().parent.parent
SAMPLES = sorted(p for p in (REPO / "fixtures" / "samples").glob("*.sqlite"))
KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"

pytest.importorskip("adbc_driver_sqlite")


def all_frames(path: Path, monkeypatch: pytest.MonkeyPatch, arrow: bool) -> dict[str, pd.DataFrame]:
    monkeypatch.setenv("NSYSAN_ARROW", "1" if arrow else "0")
    with load_trace([path], cache=None) as t:
        out = {name: getattr(t, name) for name in [*FRAMES, "nccl_calls", "ranks"]}
        t.audit_times()
        out["dropped"] = t.dropped_rows()
    return out


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_arrow_and_sqlite3_paths_give_identical_frames(path, monkeypatch):
    arrow, plain = all_frames(path, monkeypatch, True), all_frames(path, monkeypatch, False)
    for name in plain:
        pd.testing.assert_frame_equal(arrow[name], plain[name], obj=name)


def test_arrow_and_sqlite3_paths_give_identical_frames_on_real_exports(realtraces, nsysai_traces, monkeypatch):
    """Every frame of the 21 real exports (nsys 2020.3-2026.2): text, payloads and NULLs as they
    occur in captures, not only as the samples write them."""
    for name, path in {**realtraces, **nsysai_traces}.items():
        arrow, plain = all_frames(path, monkeypatch, True), all_frames(path, monkeypatch, False)
        for frame in plain:
            pd.testing.assert_frame_equal(arrow[frame], plain[frame], obj=f"{name}: {frame}")


def test_arrow_path_reads_text_and_reals(monkeypatch):
    """A mixed SELECT (text, REAL, NULLs) comes through Arrow, typed as the sqlite3 path types it."""
    sql = ("SELECT rowid AS id, CAST(text AS TEXT) AS text, doubleValue AS real, "
           "CASE WHEN rowid % 2 THEN NULL ELSE rowid END AS some_null, NULL AS none FROM NVTX_EVENTS")  # fmt: skip
    with NsysExport(SAMPLES[0]) as x:
        read = x._arrow_frame(sql)
    monkeypatch.setenv("NSYSAN_ARROW", "0")
    with NsysExport(SAMPLES[0]) as x:
        plain = x.query(sql)
    assert read is not None and len(read) > 1
    pd.testing.assert_frame_equal(read, plain)


def test_arrow_path_is_used_for_integer_reads(tmp_path):
    with NsysExport(SAMPLES[0]) as x:
        df = x.query(f"SELECT start AS s, end AS e FROM {KERNELS}", integers=True)
        assert x._arrow not in (None, False)
        assert df["s"].dtype == "int64" and len(df) == x.count(KERNELS)
        empty = x.query(f"SELECT start AS s FROM {KERNELS} WHERE 0", integers=True)
        assert empty["s"].dtype == "int64" and len(empty) == 0


@pytest.mark.parametrize(
    ("value", "rowid"), [("0.5", 1), ("'text'", 1), ("NULL", 1), ("0.5", "(SELECT max(rowid) FROM t)")]
)
def test_values_arrow_cannot_type_fall_back_to_the_checked_path(tmp_path, monkeypatch, value, rowid):
    """A REAL, text or NULL in an integer column, first or last row (Arrow types a column from its
    first rows and fails on a change later): the frame and its dropped-row notes are the sqlite3 path's."""
    path = tmp_path / "damaged.sqlite"
    shutil.copy(SAMPLES[0], path)
    with sqlite3.connect(path) as con:
        where = str(rowid).replace(" t)", f" {KERNELS})")
        columns = ["graphNodeId"] if value == "NULL" else ["start", "streamId"]  # NOT NULL in the DDL: start, streamId
        con.execute(f"UPDATE {KERNELS} SET {', '.join(f'{c} = {value}' for c in columns)} WHERE rowid = {where}")
    con.close()
    results = []
    for arrow in ("1", "0"):
        monkeypatch.setenv("NSYSAN_ARROW", arrow)
        with NsysExport(path) as x:
            df = read_frame(x, "kernels")
            results.append((df, sorted(x.dropped_counts().items())))
    pd.testing.assert_frame_equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1]
    assert value == "NULL" or results[0][1], "the damaged row is counted"


def test_export_is_not_written(tmp_path):
    path = tmp_path / "trace.sqlite"
    shutil.copy(SAMPLES[0], path)
    digest, mtime = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    with load_trace([path], cache=None) as t:
        assert len(t.kernels)
        t.audit_times()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.sqlite"]
