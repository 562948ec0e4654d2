"""One nsys SQLite export, opened read-only, with its tables, strings, enums and metadata.

Everything that touches SQL lives here so that the rest of nsysan sees only pandas frames.
A user's trace is never written: the file is opened through SQLite's ``mode=ro`` URI and
every query is a ``SELECT``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from nsysan.errors import CorruptExportError, InputError, NotAnExportError

SQLITE_MAGIC = b"SQLite format 3\x00"
CHUNK_ROWS = 250_000
# Integer reads convert each chunk at once; small chunks keep the row tuples in cache (measured:
# 20k rows per chunk reads 1M kernels ~40% faster than 250k).
INT_CHUNK_ROWS = 20_000

_RAW_REPORT_SUFFIXES = (".nsys-rep", ".qdrep", ".qdstrm")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ExportMeta:
    """What the export says about itself; empty strings where an old export is silent."""

    nsys_version: str
    schema_version: str
    session_start_utc_ns: int | None


def _check_sqlite_file(path: Path) -> None:
    """Fail early, with the reason, on files SQLite would reject or misread."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory with no .sqlite exports in it")
    if path.suffix.lower() in _RAW_REPORT_SUFFIXES:
        raise InputError(
            f"{path}: is a raw nsys report, not its SQLite export; "
            f"run `nsys export --type sqlite {path.name}` and pass the .sqlite file"
        )
    try:
        with path.open("rb") as fh:
            header = fh.read(100)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise InputError(
            f"{path}: not an SQLite file; nsysan reads the output of `nsys export --type sqlite`"
        )
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    change_counter, page_count = struct.unpack(">II", header[24:32])
    version_valid_for = struct.unpack(">I", header[92:96])[0]
    # The in-header page count is only trustworthy when written by SQLite >= 3.7.0 (then the
    # two counters agree); a file shorter than it claims was cut off in transfer.
    if page_count and change_counter == version_valid_for:
        expected = page_count * page_size
        actual = path.stat().st_size
        if actual < expected:
            raise CorruptExportError(
                f"{path}: truncated SQLite file ({actual} of {expected} bytes); "
                "copy or export it again"
            )


class NsysExport:
    """A read-only handle on one nsys SQLite export.

    Opening validates the file (exists, is SQLite, is not truncated, looks like an nsys export)
    and raises an :class:`~nsysan.errors.InputError` subclass with a one-line reason otherwise.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        _check_sqlite_file(self.path)
        url = f"sqlite+pysqlite:///file:{quote(str(self.path.resolve()))}?mode=ro&uri=true"
        self._engine = sa.create_engine(url, poolclass=NullPool)
        self._conn: sa.Connection | None = None
        self._enums: dict[str, pd.DataFrame] = {}
        self.columns_by_table = self._read_catalogue()
        if "StringIds" not in self.columns_by_table:
            self.close()
            raise NotAnExportError(
                f"{self.path}: SQLite file is not an nsys export (no StringIds table); "
                "nsysan reads the output of `nsys export --type sqlite`"
            )

    # -- connection -------------------------------------------------------------------------

    def _connection(self) -> sa.Connection:
        if self._conn is None:
            self._conn = self._engine.connect()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._engine.dispose()

    def __enter__(self) -> NsysExport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _corrupt(self, exc: Exception) -> CorruptExportError:
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        return CorruptExportError(f"{self.path}: SQLite cannot read this export ({reason})")

    def _read_catalogue(self) -> dict[str, tuple[str, ...]]:
        try:
            conn = self._connection()
            names = [
                row[0]
                for row in conn.exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            ]
            catalogue: dict[str, tuple[str, ...]] = {}
            for name in names:
                if not _IDENT.match(name):
                    continue
                cols = conn.exec_driver_sql(f"PRAGMA table_info({name})").fetchall()
                catalogue[name] = tuple(c[1] for c in cols)
            return catalogue
        except sa.exc.DatabaseError as exc:
            self.close()
            raise self._corrupt(exc) from None

    # -- schema -----------------------------------------------------------------------------

    def has_table(self, name: str) -> bool:
        return name in self.columns_by_table

    def columns(self, table: str) -> tuple[str, ...]:
        return self.columns_by_table.get(table, ())

    # -- reading ----------------------------------------------------------------------------

    def query(self, sql: str, params: tuple[object, ...] = (), *, integers: bool = False) -> pd.DataFrame:
        """Run one SELECT and return its rows as a frame, fetched in bounded chunks.

        Rows come as plain tuples from the DBAPI cursor of SQLAlchemy's connection: pandas and
        numpy build columns from tuples in C, while SQLAlchemy ``Row`` objects cost a Python probe
        each. With ``integers=True`` (every selected value a non-NULL integer) chunks become one
        int64 array, several times cheaper than pandas' per-column object conversion; if a value
        is not an integer after all, the query is read again the general way.
        """
        try:
            cursor = self._connection().connection.dbapi_connection.cursor()
            try:
                cursor.execute(sql, params)
                names = [d[0] for d in cursor.description]
                parts: list = []
                while rows := cursor.fetchmany(INT_CHUNK_ROWS if integers else CHUNK_ROWS):
                    if integers:
                        try:
                            parts.append(np.array(rows, dtype=np.int64))
                            continue
                        except (TypeError, ValueError, OverflowError):
                            return self.query(sql, params)
                    parts.append(pd.DataFrame.from_records(rows, columns=names, coerce_float=False))
            finally:
                cursor.close()
        except (sa.exc.DatabaseError, sqlite3.DatabaseError) as exc:
            raise self._corrupt(exc) from None
        if not parts:
            return pd.DataFrame({n: pd.Series(dtype="int64" if integers else "object") for n in names})
        if integers:
            block = parts[0] if len(parts) == 1 else np.concatenate(parts)
            block = block.reshape(-1, len(names))
            return pd.DataFrame({n: np.ascontiguousarray(block[:, i]) for i, n in enumerate(names)}, copy=False)
        return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)

    def scalar(self, sql: str, params: tuple[object, ...] = ()) -> object:
        try:
            return self._connection().exec_driver_sql(sql, params).scalar()
        except sa.exc.DatabaseError as exc:
            raise self._corrupt(exc) from None

    def has_rows(self, table: str | None) -> bool:
        if not table or not self.has_table(table):
            return False
        return bool(self.scalar(f"SELECT EXISTS (SELECT 1 FROM {table})"))

    @functools.cached_property
    def has_cuda_data(self) -> bool:
        """Whether any CUDA activity table holds rows (``--lazy=false`` exports hold empty ones)."""
        from nsysan.ingest.tables import CUDA_ROLES, find_table

        return any(self.has_rows(find_table(self, role)) for role in CUDA_ROLES)

    def count(self, table: str) -> int:
        if not self.has_table(table):
            return 0
        return int(self.scalar(f"SELECT count(*) FROM {table}") or 0)

    # -- strings and enums ------------------------------------------------------------------

    def strings(self, ids: np.ndarray) -> pd.Series:
        """The StringIds values of ``ids``, indexed by id."""
        wanted = json.dumps([int(i) for i in np.unique(ids)])
        df = self.query("SELECT id, value FROM StringIds WHERE id IN (SELECT value FROM json_each(?))", (wanted,))
        return pd.Series(df["value"].to_numpy(dtype=object), index=df["id"].to_numpy(dtype=np.int64))

    def resolve(self, ids: pd.Series) -> pd.Categorical:
        """Turn a column of StringIds ids into a categorical of their text (NA stays missing)."""
        present = pd.to_numeric(ids, errors="coerce").dropna().to_numpy(dtype=np.int64)
        return _categorical_from_ids(ids, self.strings(present))

    def enum(self, table: str) -> pd.DataFrame:
        """An ``ENUM_*`` table as (id, name, label); empty when this export lacks it."""
        if table not in self._enums:
            cols = self.columns(table)
            if "id" not in cols or "name" not in cols:
                self._enums[table] = pd.DataFrame({"id": [], "name": [], "label": []})
            else:
                label = "label" if "label" in cols else "name"
                self._enums[table] = self.query(f"SELECT id, name, {label} AS label FROM {table}")
        return self._enums[table]

    # -- metadata ---------------------------------------------------------------------------

    @functools.cached_property
    def meta(self) -> ExportMeta:
        values: dict[str, str] = {}
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if {"name", "value"} <= set(self.columns(table)):
                df = self.query(f"SELECT name, value FROM {table}")
                values.update(zip(df["name"].astype(str), df["value"].astype(str)))
        start = None
        if "utcEpochNs" in self.columns("TARGET_INFO_SESSION_START_TIME"):
            value = self.scalar("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
            start = int(value) if value is not None else None
        return ExportMeta(
            nsys_version=values.get("EXPORT_PRODUCT_VERSION", ""),
            schema_version=values.get("EXPORT_SCHEMA_VERSION", ""),
            session_start_utc_ns=start,
        )

    def capture_env(self) -> dict[str, str]:
        """Environment variables nsys recorded for the launched process (newer exports only)."""
        if not {"name", "value"} <= set(self.columns("META_DATA_CAPTURE")):
            return {}
        df = self.query(
            "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'"
        )
        env = {}
        for item in df["value"].astype(str):
            key, sep, value = item.partition("=")
            if sep:
                env[key] = value.strip('"')
        return env


def _categorical_from_ids(ids: pd.Series, lookup: pd.Series) -> pd.Categorical:
    values = ids.to_numpy()
    if lookup.empty:  # string categories even when none resolve, so exports concatenate
        return pd.Categorical.from_codes(np.full(len(values), -1), categories=np.array([], dtype=str))
    lookup = lookup[~lookup.index.duplicated()]
    categories, cat_codes = np.unique(lookup.to_numpy(dtype=object).astype(str), return_inverse=True)
    order = np.argsort(lookup.index.to_numpy())
    sorted_ids = lookup.index.to_numpy()[order]
    sorted_codes = cat_codes[order]
    missing = pd.isna(values)
    filled = np.where(missing, -1, values).astype(np.int64) if missing.any() else values.astype(np.int64)
    pos = np.searchsorted(sorted_ids, filled)
    pos = np.clip(pos, 0, len(sorted_ids) - 1)
    found = (sorted_ids[pos] == filled) & ~missing
    codes = np.where(found, sorted_codes[pos], -1)
    return pd.Categorical.from_codes(codes, categories=categories)
