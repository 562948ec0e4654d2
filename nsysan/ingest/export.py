"""One nsys SQLite export, opened read-only, with its tables, strings, enums and metadata.

Everything that touches SQL lives here so that the rest of nsysan sees only pandas frames.
A user's trace is never written, nor anything beside it: the file is opened read-only in a way
that creates no ``-wal`` / ``-shm`` file (:mod:`nsysan.ingest.snapshot`) and every query is a
``SELECT``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sqlite3
import stat
import struct
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nsysan.arrays import distinct
from nsysan.errors import CorruptExportError, InputError, NotAnExportError, QueryTimeLimitError
from nsysan.ingest.slices import ProcessSlice, gpu_use_queries, slices_of
from nsysan.ingest.snapshot import open_snapshot

SQLITE_MAGIC = b"SQLite format 3\x00"
CHUNK_ROWS = 250_000
# Integer reads convert each chunk at once; small chunks keep the row tuples in cache (measured:
# 20k rows per chunk reads 1M kernels ~40% faster than 250k).
INT_CHUNK_ROWS = 20_000

# The latest timestamp nsysan accepts (about 2.3 years of ns since the session start): far beyond
# any capture, and small enough that sums of a few hundred such durations stay inside int64.
MAX_TIMESTAMP_NS = 2**56
# Session start times (UTC ns since 1970) beyond this are not a date in this era.
MAX_UTC_NS = 2**62

# Every read through sqlite3 gives Python control every this many SQLite VM steps (about a
# millisecond): Ctrl-C then stops the query, and so does the time limit below.
_PROGRESS_STEPS = 20_000
QUERY_TIME_LIMIT_ENV = "NSYSAN_QUERY_TIME_LIMIT"
# Seconds one query may run: a read of the 8M-kernel benchmark export's kernel table takes ~10 s,
# so only a query that cannot be what nsys wrote comes near it.
DEFAULT_QUERY_TIME_LIMIT_S = 600.0

_RAW_REPORT_SUFFIXES = (".nsys-rep", ".qdrep", ".qdstrm")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names nsys gives its tables (CUPTI_ACTIVITY_KIND_KERNEL, NVTX_EVENTS, ENUM_..., StringIds): a
# view, trigger or virtual table under such a name is not what nsys wrote.
_NSYS_NAME = re.compile(r"^([A-Z][A-Z0-9_]*|StringIds|ThreadNames)$")


def query_time_limit() -> float:
    """Seconds one read may run, from ``NSYSAN_QUERY_TIME_LIMIT`` (default 600)."""
    raw = os.environ.get(QUERY_TIME_LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_QUERY_TIME_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise InputError(f"{QUERY_TIME_LIMIT_ENV}={raw!r}: give a number of seconds greater than 0")
    return value


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
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        # Opening a FIFO would block until a writer appears; a device could stream forever.
        raise InputError(f"{path}: not a regular file (a FIFO, device or socket); give the .sqlite export itself")
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
        raise InputError(f"{path}: not an SQLite file; nsysan reads the output of `nsys export --type sqlite`")
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
                f"{path}: truncated SQLite file ({actual} of {expected} bytes); copy or export it again"
            )


class NsysExport:
    """A read-only handle on one nsys SQLite export.

    Opening validates the file (exists, is SQLite, is not truncated, looks like an nsys export)
    and raises an :class:`~nsysan.errors.InputError` subclass with a one-line reason otherwise.
    """

    def __init__(self, path: str | os.PathLike[str], part: ProcessSlice | None = None) -> None:
        self.path = Path(path)
        self.part = part or ProcessSlice()
        self._views: list[str] = []  # the slice's TEMP views, created on each connection (see nsysan.ingest.slices)
        self._time_limit_s = query_time_limit()
        _check_sqlite_file(self.path)
        self._snapshot = open_snapshot(self.path)  # nothing written beside the file, WAL mode included
        self._deadline = float("inf")  # when the query in progress must stop (see _start_query)
        # Python's sqlite3, not SQLAlchemy: the reads need the DBAPI connection itself (progress
        # handler, text factory, cursors read in chunks), and SQLAlchemy's import is ~0.15 s of
        # every command's start
        self._conn: sqlite3.Connection | None = None
        # The Arrow reader's own read-only connection (ADBC's SQLite driver): opened on the first
        # integer read; False once it failed or is not installed (the sqlite3 path then reads).
        self._arrow_uri = self._snapshot.uri
        self._arrow: Any = None if os.environ.get("NSYSAN_ARROW", "1") != "0" else False
        self._enums: dict[str, pd.DataFrame] = {}
        self._replace_bad_utf8 = False
        # (what, reason) -> rows left out or repaired while reading, for the report's limitations
        self.dropped: Counter[tuple[str, str]] = Counter()
        # per table, rows left out for their timestamps: by a read of the whole table, or else
        # by the largest filtered read (only the rows nsysan looked at)
        self.time_drops: dict[str, Counter[tuple[str, str]]] = {}
        self.partial_time_drops: dict[str, Counter[tuple[str, str]]] = {}
        self._usable: dict[str, np.ndarray | None] = {}  # a read's verdict on its rows' timestamps
        self.columns_by_table = self._read_catalogue()
        if "StringIds" not in self.columns_by_table:
            self.close()
            raise NotAnExportError(
                f"{self.path}: SQLite file is not an nsys export (no StringIds table); "
                "nsysan reads the output of `nsys export --type sqlite`"
            )
        self._views = self.part.view_statements(self.columns_by_table)
        if self._views and self._conn is not None:
            try:
                self._create_views(self._conn)
            except BaseException:
                self.close()  # the connection, and a private copy of the file if one was made
                raise

    # -- connection -------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # a reader may be opened in one thread and read in another (one at a time)
            conn = sqlite3.connect(self._snapshot.uri, uri=True, check_same_thread=False)
            self._guard(conn)
            self._conn = conn
            if self._views:
                self._create_views(conn)
        return self._conn

    def _guard(self, dbapi: sqlite3.Connection) -> None:
        """Let Ctrl-C and the time limit stop any query on this sqlite3 connection: SQLite calls
        the handler every few thousand steps, Python runs a pending SIGINT handler inside it, and
        a non-zero answer (or the KeyboardInterrupt) makes SQLite stop with "interrupted"."""
        dbapi.set_progress_handler(lambda: time.monotonic() > self._deadline, _PROGRESS_STEPS)

    def _start_query(self) -> None:
        self._deadline = time.monotonic() + self._time_limit_s

    def _create_views(self, dbapi: Any) -> None:
        """This slice's views on a new connection (TEMP objects belong to their connection)."""
        try:
            cursor = dbapi.cursor()
            for sql in self._views:
                cursor.execute(sql)
            cursor.close()
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None

    def close(self) -> None:
        if self._arrow:
            self._arrow.close()
        self._arrow = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._snapshot.close()

    def __enter__(self) -> NsysExport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _corrupt(self, exc: Exception) -> InputError:
        """What a database error while reading means to the user. "interrupted" is the progress
        handler's doing: the time limit when it has passed, otherwise Ctrl-C (the sqlite3 module
        swallows the KeyboardInterrupt raised inside the handler, so it is raised again here)."""
        reason = str(exc).splitlines()[0]
        if reason == "interrupted":
            if time.monotonic() <= self._deadline:
                raise KeyboardInterrupt
            return QueryTimeLimitError(
                f"{self.path}: a read ran past {self._time_limit_s:g} s and was stopped (no read of a real nsys "
                f"export comes near that; set {QUERY_TIME_LIMIT_ENV}=SECONDS to allow more)"
            )
        return CorruptExportError(f"{self.path}: SQLite cannot read this export ({reason})")

    def _read_catalogue(self) -> dict[str, tuple[str, ...]]:
        """Tables with their columns; schema text that is not UTF-8 means a damaged file.

        nsys writes plain tables only. A view, trigger or virtual table named as nsys names its
        tables was put there after export, and reading it could run any query (a recursive view
        never ends, and Ctrl-C cannot stop it): the export is refused. Other views are never read."""
        try:
            self._start_query()
            conn = self._connection()
            schema = conn.execute(
                "SELECT type, name, tbl_name, CAST(sql AS TEXT) FROM sqlite_master WHERE type IN ('table', 'view', 'trigger')"
            ).fetchall()
            catalogue: dict[str, tuple[str, ...]] = {}
            for kind, name, table, sql in schema:
                virtual = kind == "table" and str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL")
                if kind == "trigger" and _NSYS_NAME.match(str(table)):
                    raise NotAnExportError(f"{self.path}: has a trigger ({name}) on table {table}; nsys writes none, "
                                           "so the file was changed after export; export the report again")  # fmt: skip
                if (kind == "view" or virtual) and _NSYS_NAME.match(str(name)):
                    what = "a view" if kind == "view" else "a virtual table"
                    raise NotAnExportError(f"{self.path}: {name} is {what}, not the table nsys writes, so the file was "
                                           "changed after export; export the report again")  # fmt: skip
                if kind != "table" or virtual or not _IDENT.match(name):
                    continue
                cols = conn.execute(f"PRAGMA table_info({name})").fetchall()
                catalogue[name] = tuple(c[1] for c in cols)
            return catalogue
        except NotAnExportError:
            self.close()
            raise
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            self.close()
            if not isinstance(exc, UnicodeDecodeError) and "decode" not in str(exc).lower():
                raise self._corrupt(exc) from None
            raise CorruptExportError(
                f"{self.path}: corrupt export (schema text is not UTF-8); copy or export it again"
            ) from None

    # -- schema -----------------------------------------------------------------------------

    def has_table(self, name: str) -> bool:
        return name in self.columns_by_table

    def columns(self, table: str) -> tuple[str, ...]:
        return self.columns_by_table.get(table, ())

    def has_columns(self, table: str, *names: str) -> bool:
        """Whether ``table`` has every column of ``names``, compared as SQLite does (ignoring case)."""
        have = {c.casefold() for c in self.columns(table)}
        return all(n.casefold() in have for n in names)

    # -- reading ----------------------------------------------------------------------------

    def query(self, sql: str, params: tuple[object, ...] = (), *, integers: bool = False) -> pd.DataFrame:
        """Run one SELECT and return its rows as a frame, fetched in bounded chunks.

        Rows come as plain tuples from a sqlite3 cursor: pandas and numpy build columns from
        tuples in C. With ``integers=True`` (every selected value a non-NULL integer) chunks become one
        int64 array, several times cheaper than pandas' per-column object conversion; if a value
        is not an integer after all, the query is read again the general way.

        Reads go first through Arrow: SQLite's values land in Arrow arrays in C, with no Python
        object per value. Integer reads (:meth:`_arrow_ints`) become one int64 block; others
        (:meth:`_arrow_frame`) columns typed as the path above would type them. Anything Arrow
        cannot read so (a type that changes down a column, a damaged file, text that is not UTF-8,
        no ADBC driver installed) is read by the path above.
        """
        df = self._arrow_ints(sql, params) if integers else self._arrow_frame(sql, params)
        if df is not None:
            return df
        try:
            dbapi = self._connection()
            if self._replace_bad_utf8:
                dbapi.text_factory = _lenient_text
            cursor = dbapi.cursor()
            try:
                self._start_query()
                cursor.execute(sql, params)
                names = [d[0] for d in cursor.description]
                blocks: list[np.ndarray] = []  # integers=True: one int64 block per chunk
                chunks: list[pd.DataFrame] = []
                while rows := cursor.fetchmany(INT_CHUNK_ROWS if integers else CHUNK_ROWS):
                    if integers:
                        try:
                            blocks.append(np.array(rows, dtype=np.int64))
                            continue
                        except (TypeError, ValueError, OverflowError):
                            return self.query(sql, params)
                    chunks.append(pd.DataFrame.from_records(rows, columns=names, coerce_float=False))
            finally:
                cursor.close()
        except sqlite3.DatabaseError as exc:
            if not self._replace_bad_utf8 and "decode" in str(exc).lower():
                # One bad byte must not cost a whole export: decode with replacement characters.
                self._replace_bad_utf8 = True
                self.dropped[("", "Text with bytes that are not UTF-8 is shown with replacement characters")] = 1
                return self.query(sql, params, integers=integers)
            raise self._corrupt(exc) from None
        if not blocks and not chunks:
            return _no_rows(names, integers)
        if blocks:
            block = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
            block = block.reshape(-1, len(names))
            return pd.DataFrame({n: np.ascontiguousarray(block[:, i]) for i, n in enumerate(names)}, copy=False)
        return chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)

    def _arrow_batches(self, sql: str, params: tuple[object, ...]) -> tuple[Any, list[Any]] | None:
        """The SELECT's schema and record batches through ADBC's SQLite driver, or None where the
        read failed (the caller then reads through sqlite3, which decides what is wrong)."""
        if self._arrow is False:
            return None
        try:
            if self._arrow is None:
                import adbc_driver_sqlite.dbapi as adbc

                connection = adbc.connect(self._arrow_uri)
                try:
                    self._create_views(connection)
                except Exception:
                    connection.close()
                    raise
                self._arrow = connection
            cursor = self._arrow.cursor()
        except Exception:
            self._arrow = False  # no driver, or it cannot open the file: the sqlite3 path reads
            return None
        try:
            cursor.execute(sql, params or None)
            reader = cursor.fetch_record_batch()
            return reader.schema, list(reader)
        except Exception:  # a type change mid-table, a damaged page: the sqlite3 path decides
            return None
        finally:
            cursor.close()

    def _arrow_ints(self, sql: str, params: tuple[object, ...] = ()) -> pd.DataFrame | None:
        """An all-integer SELECT read through Arrow into one int64 block, or None where a value is
        not a non-NULL integer (Arrow would type it otherwise) or the read failed.

        Record batches are copied into the block one at a time and let go, so the peak is the
        columns once in Arrow plus once in numpy, and pandas takes the block without a copy.
        """
        read = self._arrow_batches(sql, params)
        if read is None:
            return None
        schema, batches = read
        names = list(schema.names)
        rows = sum(b.num_rows for b in batches)
        if rows == 0:  # no rows: Arrow cannot know the types
            return _no_rows(names, integers=True)
        if any(str(t) != "int64" for t in schema.types) or any(c.null_count for b in batches for c in b.columns):
            return None
        block = np.empty((len(names), rows), dtype=np.int64)
        at = 0
        batches.reverse()
        while batches:
            batch = batches.pop()
            for i, column in enumerate(batch.columns):
                block[i, at : at + batch.num_rows] = column.to_numpy()
            at += batch.num_rows
        del batch, column
        _release_arrow_memory()
        return pd.DataFrame(block.T, columns=names, copy=False)

    def _arrow_frame(self, sql: str, params: tuple[object, ...] = ()) -> pd.DataFrame | None:
        """A SELECT of any columns read through Arrow, each typed as ``DataFrame.from_records``
        types the sqlite3 path's rows: int64 (float64 with NaN where some are NULL; None objects
        where all are), float64, pandas' ``str`` for text. None for anything else, for text that is
        not UTF-8, or when decoding with replacement characters was needed before.

        NVTX's text and payload columns took that path at about 3 us a row; real PyTorch captures
        hold two to five NVTX events per kernel.
        """
        if self._replace_bad_utf8:
            return None
        read = self._arrow_batches(sql, params)
        if read is None:
            return None
        import pyarrow as pa

        schema, batches = read
        names = list(schema.names)
        if sum(b.num_rows for b in batches) == 0:  # no rows: Arrow cannot know the types
            return _no_rows(names, integers=False)
        try:
            table = pa.Table.from_batches(batches, schema=schema)
            del batches
            table.validate(full=True)  # text that is not UTF-8 fails here, not in a detector
            columns = {name: _from_arrow(table.column(i)) for i, name in enumerate(names)}
        except (pa.ArrowException, ValueError):
            return None
        del table
        if any(c is None for c in columns.values()):
            return None
        _release_arrow_memory()
        return pd.DataFrame(columns, columns=names, copy=False)

    def scalar(self, sql: str, params: tuple[object, ...] = ()) -> object:
        try:
            self._start_query()
            row = self._connection().execute(sql, params).fetchone()
            return None if row is None else row[0]
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None

    def has_rows(self, table: str | None) -> bool:
        if not table or not self.has_table(table):
            return False
        return bool(self.scalar(f"SELECT EXISTS (SELECT 1 FROM {table})"))

    def count(self, table: str) -> int:
        if not self.has_table(table):
            return 0
        rows = self.scalar(f"SELECT count(*) FROM {table}")
        return rows if isinstance(rows, int) else 0

    def process_slices(self) -> list[ProcessSlice]:
        """How this export's processes are mapped: groups that share no GPU (see
        :mod:`nsysan.ingest.slices`). One scan of each GPU table, in SQLite."""
        pairs = [
            self.query(sql, integers=True).to_numpy(dtype=np.int64) for sql in gpu_use_queries(self.columns_by_table)
        ]
        return slices_of(np.concatenate(pairs).reshape(-1, 2) if pairs else np.empty((0, 2), dtype=np.int64))

    def dropped_counts(self) -> Counter[tuple[str, str]]:
        """(what, reason) -> rows left out or repaired so far, all tables together."""
        out = Counter(self.dropped)
        for table in set(self.time_drops) | set(self.partial_time_drops):
            out.update(self.time_drops.get(table, self.partial_time_drops.get(table, Counter())))
        return out

    # -- strings and enums ------------------------------------------------------------------

    def strings(self, ids: np.ndarray) -> pd.Series:
        """The StringIds values of ``ids``, indexed by id; ids the table lacks (dangling) read as
        ``<unknown string N>`` so a damaged table never turns a name into a missing value."""
        unique = distinct(np.asarray(ids, dtype=np.int64))
        wanted = json.dumps(unique.tolist())
        df = self.query(
            "SELECT id AS id, CAST(value AS TEXT) AS value FROM StringIds "
            "WHERE typeof(id) = 'integer' AND id IN (SELECT value FROM json_each(?))",
            (wanted,),
        )
        found = pd.Series(df["value"].to_numpy(dtype=object), index=df["id"].to_numpy(dtype=np.int64))
        found = found[~found.index.duplicated()]
        dangling = unique[~np.isin(unique, found.index.to_numpy())]
        if len(dangling):
            self.dropped[("string ids", "missing from StringIds, shown as <unknown string N>")] += len(dangling)
            labels = pd.Series([f"<unknown string {i}>" for i in dangling.tolist()], index=dangling, dtype=object)
            found = pd.concat([found.astype(object), labels])
        return found.fillna("").astype(str)

    def resolve(self, ids: pd.Series) -> pd.Categorical:
        """Turn a column of StringIds ids into a categorical of their text (NA stays missing)."""
        filled, missing = _whole_ids(pd.Series(ids))
        present = filled[~missing]
        return _categorical_from_ids(ids, self.strings(present))

    def enum(self, table: str) -> pd.DataFrame:
        """An ``ENUM_*`` table as (id, name, label); empty when this export lacks it."""
        if table not in self._enums:
            if not self.has_columns(table, "id", "name"):
                self._enums[table] = pd.DataFrame(
                    {"id": pd.Series(dtype="int64"), "name": pd.Series(dtype=object), "label": pd.Series(dtype=object)}
                )
            else:
                label = "label" if self.has_columns(table, "label") else "name"
                # Only integer ids name a value; text names whatever SQLite stored.
                df = self.query(
                    f"SELECT id AS id, CAST(name AS TEXT) AS name, CAST({label} AS TEXT) AS label FROM {table} "
                    "WHERE typeof(id) = 'integer'"
                )
                df["id"] = df["id"].astype("int64")
                df["name"], df["label"] = df["name"].fillna("").astype(str), df["label"].fillna("").astype(str)
                self._enums[table] = df
        return self._enums[table]

    # -- metadata ---------------------------------------------------------------------------

    @functools.cached_property
    def meta(self) -> ExportMeta:
        values: dict[str, str] = {}
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if self.has_columns(table, "name", "value"):
                df = self.query(f"SELECT CAST(name AS TEXT) AS name, CAST(value AS TEXT) AS value FROM {table}")
                values.update(zip(df["name"].fillna("").astype(str), df["value"].fillna("").astype(str), strict=True))
        start = None
        if self.has_columns("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
            value = self.scalar("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
            # Anything but a whole ns count of this era cannot align clocks: treat it as unknown.
            if isinstance(value, int) and 0 <= value < MAX_UTC_NS:
                start = value
            elif value is not None:
                self.dropped[("session start times", "not a valid UTC time, clocks not aligned")] += 1
        return ExportMeta(
            nsys_version=values.get("EXPORT_PRODUCT_VERSION", ""),
            schema_version=values.get("EXPORT_SCHEMA_VERSION", ""),
            session_start_utc_ns=start,
        )

    def capture_env(self) -> dict[str, str]:
        """Environment variables nsys recorded for the launched process (newer exports only)."""
        if not self.has_columns("META_DATA_CAPTURE", "name", "value"):
            return {}
        df = self.query(
            "SELECT CAST(value AS TEXT) AS value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'"
        )
        env = {}
        for item in df["value"].dropna().astype(str):
            key, sep, value = item.partition("=")
            if sep:
                env[key] = value.strip('"')
        return env


def _no_rows(names: list[str], integers: bool) -> pd.DataFrame:
    """The frame of a SELECT that returned nothing, whichever path read it: int64 columns for an
    integer read, object columns otherwise."""
    return pd.DataFrame({name: pd.Series(dtype="int64" if integers else "object") for name in names})


def _from_arrow(column: Any) -> np.ndarray | pd.api.extensions.ExtensionArray | None:
    """One column of :meth:`NsysExport._arrow_frame` as the sqlite3 path would type it, or None."""
    import pyarrow as pa

    n, nulls = len(column), column.null_count
    if pa.types.is_int64(column.type):
        if nulls == n:
            return np.full(n, None, dtype=object)
        values: np.ndarray = column.to_numpy() if nulls == 0 else column.to_numpy().astype(np.float64)
        return values
    if pa.types.is_float64(column.type):
        floats: np.ndarray = column.to_numpy()
        return floats
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text: pd.api.extensions.ExtensionArray = pd.array(column, dtype=pd.StringDtype(na_value=np.nan))
        return text
    return None


def _release_arrow_memory() -> None:
    """Hand Arrow's freed buffers back to the system (its allocator keeps them for reuse), so a
    read's Arrow copy does not stay in the process's footprint beside the frames built from it."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _lenient_text(raw: bytes) -> str:
    """SQLite text to str, undecodable bytes replaced (the fallback once strict decoding failed)."""
    return raw.decode("utf-8", errors="replace")


def object_ints(col: pd.Series) -> pd.Series:
    """A column of mixed SQLite values as Int64: integers exactly (no trip through float), whole
    REALs as their integer, text, BLOBs and other REALs as NA. Only damaged columns get here."""
    kinds = col.map(type)
    out = pd.Series(pd.NA, index=col.index, dtype="Int64")
    is_int = kinds.isin([int]).to_numpy()
    if is_int.any():
        out[is_int] = pd.array(col[is_int].tolist(), dtype="Int64")
    is_float = kinds.isin([float]).to_numpy()
    if is_float.any():
        f = col[is_float].astype("float64")
        v = f.to_numpy()
        with np.errstate(invalid="ignore"):
            whole = np.isfinite(v) & (v % 1 == 0) & (np.abs(v) < 2.0**63)
        out[np.flatnonzero(is_float)[whole]] = f[whole].astype("int64").to_numpy()
    return out


def _whole_ids(ids: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """ids as int64 plus a mask of those that are no id (NA, text, fractions, beyond int64)."""
    if ids.dtype == np.int64:
        return ids.to_numpy(), np.zeros(len(ids), dtype=bool)
    if ids.dtype == "Int64":
        missing = ids.isna().to_numpy()
        return ids.fillna(-1).to_numpy(dtype=np.int64), missing
    if ids.dtype == object:
        exact = object_ints(ids)
        missing = exact.isna().to_numpy()
        return exact.fillna(-1).to_numpy(dtype=np.int64), missing
    numeric = pd.to_numeric(ids, errors="coerce").astype("float64").to_numpy()
    with np.errstate(invalid="ignore"):
        missing = ~(np.isfinite(numeric) & (numeric % 1 == 0) & (np.abs(numeric) < 2.0**63))
    return np.where(missing, -1, numeric).astype(np.int64), missing


def _categorical_from_ids(ids: pd.Series, lookup: pd.Series) -> pd.Categorical:
    if lookup.empty:  # string categories even when none resolve, so exports concatenate
        return pd.Categorical.from_codes(np.full(len(ids), -1), categories=pd.Index(np.array([], dtype=str)))
    lookup = lookup[~lookup.index.duplicated()]
    categories, cat_codes = np.unique(lookup.to_numpy(dtype=object).astype(str), return_inverse=True)
    order = np.argsort(lookup.index.to_numpy())
    sorted_ids = lookup.index.to_numpy()[order]
    sorted_codes = cat_codes[order]
    filled, missing = _whole_ids(pd.Series(ids))
    pos = np.searchsorted(sorted_ids, filled)
    pos = np.clip(pos, 0, len(sorted_ids) - 1)
    found = (sorted_ids[pos] == filled) & ~missing
    codes = np.where(found, sorted_codes[pos], -1)
    return pd.Categorical.from_codes(codes, categories=pd.Index(categories))
