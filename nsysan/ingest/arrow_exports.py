"""nsys exports written as Arrow or Parquet, read through a SQLite copy in the exports cache.

nsys writes the same tables as its SQLite export in other containers:

- ``nsys export --type arrow`` (2022.4, checked here with the real nsys): one ``.arrows`` file, a
  sequence of Arrow IPC streams, one per table, the table's name in each stream's schema metadata
  (``table_name``); text columns as ``binary``, ids as unsigned integers.
- ``--type parquetdir`` (nsys 2024 and later): a ``NAME_pqtdir`` directory holding one
  ``TABLE.parquet`` per table, text as Parquet strings (the layout public readers of it rely on;
  not produced here, where nsys is 2022.4); ``--type arrowdir``: taken to be the same with
  ``TABLE.arrow`` files (IPC file or stream format).

Everything nsysan reads from an export is SQL over nsys's schema (:mod:`nsysan.ingest.export`), so
these are copied once, table by table, into a SQLite file in the exports cache (ADBC's bulk ingest,
a batch at a time) and read from there as any export is: the same queries, hence the same figures
and findings as the SQLite export of the same capture. A second reader of the same tables in Arrow
would be a second implementation of every query to keep identical; the copy costs one pass over
the data, once per export (its key is a hash of every byte of the files, as for raw reports).

Text is copied byte for byte (nsys's SQLite holds what the application wrote, not always UTF-8),
unsigned ids become SQLite integers (refused past 2**63 - 1, which no nsys id reaches), booleans
0 and 1, as nsys's SQLite export stores them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nsysan.errors import InputError
from nsysan.ingest.cache_home import KEY_CHARS, hash_file
from nsysan.ingest.raw_reports import export_directory, partial_file

STREAMS_SUFFIXES = (".arrows",)  # one file, a stream per table (nsys 2022.4 --type arrow)
TABLE_FILE_SUFFIXES = (".parquet", ".arrow", ".feather", ".arrows")  # one file per table (arrowdir, parquetdir)
# the tables that make a directory an nsys export: one of these, by name, is in every export
_MARKERS = re.compile(
    r"^(META_DATA_EXPORT|StringIds|ThreadNames|PROCESSES|NVTX_EVENTS|OSRT_API|CUPTI_ACTIVITY_KIND_\w+|TARGET_INFO_\w+|ENUM_\w+)$"
)
PQTDIR_SUFFIX = "_pqtdir"  # how nsys names a parquetdir export: report1_pqtdir/
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FORMAT = b"nsysan arrow export copy 1\0"  # change when the copy changes, so old copies are made again
_BATCH_ROWS = 65_536
_ARROW_FILE_MAGIC = b"ARROW1"

# this process's copies: {(resolved input, its files' identities): the .sqlite}
_done: dict[tuple[str, tuple[tuple[str, int, int], ...]], Path] = {}


def is_arrow_export(path: Path) -> bool:
    """Whether ``path`` is an nsys export in Arrow or Parquet: a ``.arrows`` file, or a directory
    of table files one of which is named after a table every nsys export has."""
    if path.suffix.lower() in STREAMS_SUFFIXES:
        return path.is_file()
    return path.is_dir() and any(_MARKERS.match(f.stem) for f in _table_files(path))


def _table_files(folder: Path) -> list[Path]:
    try:
        return sorted(
            p
            for p in folder.iterdir()
            if p.suffix.lower() in TABLE_FILE_SUFFIXES and p.is_file() and _NAME.match(p.stem)
        )
    except OSError:
        return []


def sqlite_of_tables(path: Path) -> Path:
    """The SQLite copy of Arrow/Parquet export ``path``, made now unless these bytes were copied before."""
    files = [path] if path.is_file() else _table_files(path)
    try:
        stats = [(f, f.stat()) for f in files]
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    identity = (str(path.resolve()), tuple((f.name, s.st_size, s.st_mtime_ns) for f, s in stats))
    if identity in _done and _done[identity].is_file():
        return _done[identity]
    digest = hashlib.sha256(_FORMAT)
    try:
        for f in files:
            digest.update(f.name.encode() + b"\0")
            hash_file(digest, f)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    folder = export_directory() / digest.hexdigest()[:KEY_CHARS]
    stem = path.name[: -len(path.suffix)] if path.is_file() and path.suffix else path.name.removesuffix(PQTDIR_SUFFIX)
    target = folder / f"{stem}.sqlite"
    if not target.is_file():
        _copy(path, files, folder, target)
    _done[identity] = target
    return target


def _copy(path: Path, files: list[Path], folder: Path, target: Path) -> None:
    """Every table into a temporary SQLite file in ``folder``, renamed into place when complete."""
    try:
        partial = partial_file(folder, target)
    except OSError as exc:
        raise InputError(
            f"{path}: cannot write its SQLite copy to {folder} ({exc.strerror}); set XDG_CACHE_HOME"
        ) from None
    if sys.stderr.isatty():
        sys.stderr.write(f"nsysan: note: copying {path} into SQLite (once; kept in {folder.parent})\n")
    try:
        written = _write(path, files, partial)
        if not written:
            raise InputError(f"{path}: holds no nsys tables in Arrow or Parquet")
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if nothing else is in it
        raise


def _write(path: Path, files: list[Path], out: Path) -> int:
    import adbc_driver_sqlite.dbapi as adbc

    written = 0
    seen: set[str] = set()
    con = adbc.connect(str(out))
    try:
        for name, reader in _tables(path, files):
            if not _NAME.match(name):
                for _ in reader:  # read past it: the next stream of a .arrows file follows
                    pass
                continue
            fresh = name not in seen
            if fresh:
                seen.add(name)
            failed: list[BaseException] = []  # raised while ADBC pulled batches: ADBC wraps it
            try:
                with con.cursor() as cur:
                    if fresh:
                        cur.execute(_create(name, reader.schema, path))
                    cur.adbc_ingest(name, _converted(reader, name, path, failed), mode="append")
            except InputError:
                raise
            except Exception as exc:  # ADBC's own errors: a column it cannot bind
                if failed:
                    raise failed[0] from None
                raise InputError(
                    f"{path}: cannot copy table {name} into SQLite ({str(exc).splitlines()[0][:200]})"
                ) from None
            written += 1
        con.commit()
    finally:
        con.close()
    return written


def _tables(path: Path, files: list[Path]) -> Iterator[tuple[str, Any]]:
    """(table name, a RecordBatchReader) for every table of the export, in file order."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    for f in files:
        suffix = f.suffix.lower()
        try:
            if suffix == ".parquet":
                pf = pq.ParquetFile(f)
                yield f.stem, pa.RecordBatchReader.from_batches(pf.schema_arrow, pf.iter_batches(_BATCH_ROWS))
                continue
            with f.open("rb") as fh:
                magic = fh.read(len(_ARROW_FILE_MAGIC))
            if magic == _ARROW_FILE_MAGIC:  # the IPC file format (arrowdir may write either)
                reader = ipc.open_file(f)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
                yield f.stem, pa.RecordBatchReader.from_batches(reader.schema, batches)
                continue
            source = pa.OSFile(str(f), "rb")
            size = f.stat().st_size
            first = True
            while source.tell() < size:  # streams one after the other: one per table
                stream = ipc.open_stream(source)
                meta = stream.schema.metadata or {}
                named = meta.get(b"table_name")
                if named is None and not (first and suffix != ".arrows"):
                    raise InputError(f"{path}: {f.name} holds an Arrow stream without a table_name")
                yield (named.decode("utf-8", "replace") if named else f.stem), stream
                first = False
        except InputError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise InputError(
                f"{path}: cannot read {f.name} as Arrow or Parquet ({str(exc).splitlines()[0][:200]})"
            ) from None


def _declared(t: Any) -> str:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return "INTEGER"
    if pa.types.is_floating(t):
        return "REAL"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "TEXT"
    return ""


def _create(name: str, schema: Any, path: Path) -> str:
    """The table's CREATE statement, with the column types nsys's SQLite export declares."""
    cols = []
    for field in schema:
        if not _NAME.match(field.name):
            raise InputError(f"{path}: table {name} has a column named {field.name!r}, not one nsys writes")
        if not _declared(field.type):
            raise InputError(
                f"{path}: table {name} column {field.name} has Arrow type {field.type}, not one nsys writes"
            )
        cols.append(f'"{field.name}" {_declared(field.type)}')
    return f'CREATE TABLE "{name}" ({", ".join(cols)})'


def _converted(reader: Any, name: str, path: Path, failed: list[BaseException]) -> Any:
    """``reader``'s batches in the types SQLite stores as nsys's export does; what goes wrong
    while reading them is kept in ``failed``."""
    import pyarrow as pa

    target = pa.schema([pa.field(f.name, _target_type(f.type)) for f in reader.schema])

    def batches() -> Iterator[Any]:
        try:
            for batch in reader:
                cols = [_column(batch.column(i), target.field(i).type, name, f.name, path)
                        for i, f in enumerate(reader.schema)]  # fmt: skip
                yield pa.RecordBatch.from_arrays(cols, schema=target)
        except InputError as exc:
            failed.append(exc)
            raise
        except (OSError, pa.ArrowException) as exc:
            failed.append(InputError(f"{path}: cannot read table {name} ({str(exc).splitlines()[0][:200]})"))
            raise

    return pa.RecordBatchReader.from_batches(target, batches())


def _target_type(t: Any) -> Any:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_floating(t):
        return pa.float64()
    if _declared(t) == "TEXT":
        return pa.string()
    return pa.int64()


def _column(col: Any, target: Any, table: str, column: str, path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if col.type == target:
        return col
    if pa.types.is_string(target):
        # binary text as it was written, valid UTF-8 or not (nsys's SQLite stores the bytes)
        return pc.cast(col, target, safe=False)
    if pa.types.is_boolean(col.type) or pa.types.is_null(col.type):
        return pc.cast(col, target)
    try:
        return pc.cast(col, target)
    except pa.ArrowInvalid:
        raise InputError(f"{path}: table {table} column {column} holds a value beyond SQLite's integer range") from None
