"""Lay a SQLite export out as nsys's ``--type parquetdir`` / ``arrowdir`` does: one file per table,
named after it, text as Parquet strings (as public readers of parquetdir exports find it) or, for
Arrow files, as ``binary`` (as nsys 2022.4's own Arrow export writes it), bytes kept as they are.
Written with plain sqlite3 and pyarrow, not nsysan's readers, so a test comparing the two reports
compares nsysan against the file, not against itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.compute
import pyarrow.feather as feather
import pyarrow.parquet as pq


def _column(values: list[object], declared: str, text: pa.DataType) -> pa.Array:
    declared = declared.upper()
    if "INT" in declared:
        try:
            return pa.array(values, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    elif "REAL" in declared or "FLOA" in declared or "DOUB" in declared:
        try:
            return pa.array(values, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    raw = [v if v is None or isinstance(v, bytes) else str(v).encode() for v in values]
    return pa.compute.cast(pa.array(raw, pa.binary()), text, safe=False)  # bytes as stored


def write_table_dir(sqlite_path: Path, out: Path, fmt: str = "parquet") -> Path:
    """Every table of ``sqlite_path`` as ``out/TABLE.parquet`` (or ``.arrow``, Arrow's IPC file)."""
    out.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    con.text_factory = bytes
    try:
        tables = [r[0].decode() for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            info = con.execute(f'PRAGMA table_info("{table}")').fetchall()
            names = [r[1].decode() for r in info]
            rows = con.execute(f'SELECT * FROM "{table}" ORDER BY rowid').fetchall()
            text = pa.string() if fmt == "parquet" else pa.binary()
            cols = {n: _column([r[i] for r in rows], (info[i][2] or b"").decode(), text) for i, n in enumerate(names)}
            data = pa.table(cols) if names else pa.table({})
            if fmt == "parquet":
                pq.write_table(data, out / f"{table}.parquet")
            else:
                feather.write_feather(data, out / f"{table}.arrow", compression="uncompressed")
    finally:
        con.close()
    return out
