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
NCCL's payload structs (``NVTX_EVENTS.binaryData``) as bytes whatever type the Arrow side gives
them, unsigned 64-bit values as the same 64 bits signed (2**64 - 1 is -1, as in nsys's SQLite),
booleans 0 and 1, as nsys's SQLite export stores them.
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
from nsysan.ingest.raw_reports import export_directory, partial_file, remember_source

STREAMS_SUFFIXES = (".arrows",)  # one file, a stream per table (nsys 2022.4 --type arrow)
TABLE_FILE_SUFFIXES = (".parquet", ".arrow", ".feather", ".arrows")  # one file per table (arrowdir, parquetdir)
# tables nsys writes (their names make a directory an nsys export): every export has some of them
_MARKERS = re.compile(
    r"^(META_DATA_EXPORT|EXPORT_META_DATA|StringIds|ThreadNames|PROCESSES|NVTX_EVENTS|OSRT_API|CUPTI_ACTIVITY_KIND_\w+"
    r"|TARGET_INFO_\w+|ENUM_\w+)$"
)
# how nsys names its directory exports (its --force-overwrite help lists them): report1_pqtdir/
DIR_SUFFIXES = ("_pqtdir", "_arwdir")
# columns nsys's SQLite keeps as bytes (NCCL's payload structs), whatever type the Arrow side gives
_BLOB_COLUMNS = {("NVTX_EVENTS", "binaryData")}
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FORMAT = b"nsysan arrow export copy 1\0"  # change when the copy changes, so old copies are made again
_BATCH_ROWS = 65_536
_ARROW_FILE_MAGIC = b"ARROW1"

# this process's copies: {(resolved input, its files' identities): the .sqlite}
_done: dict[tuple[str, tuple[tuple[str, int, int], ...]], Path] = {}


def export_stem(path: Path) -> str:
    """The capture's name: ``job`` for ``job.arrows``, ``job_pqtdir`` and ``job_arwdir``."""
    name = path.resolve().name
    if path.suffix.lower() in STREAMS_SUFFIXES:
        return name[: -len(path.suffix)]
    for suffix in DIR_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def is_arrow_export(path: Path) -> bool:
    """Whether ``path`` is an nsys export in Arrow or Parquet: a ``.arrows`` file, or a directory
    of table files one of which is named after a table nsys writes."""
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
    for f in files:
        digest.update(f.name.encode() + b"\0")
        try:
            hash_file(digest, f)
        except OSError as exc:
            raise InputError(f"{path}: cannot read {f.name} ({exc.strerror})") from None
    folder = export_directory() / digest.hexdigest()[:KEY_CHARS]
    target = folder / f"{export_stem(path) or 'export'}.sqlite"
    if not target.is_file():
        _copy(path, files, folder, target)
    _done[identity] = target
    remember_source(target, path)
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
    source: dict[str, Path] = {}  # table -> the file it came from
    con = adbc.connect(str(out))
    try:
        for name, reader, f in _tables(path, files):
            if not _NAME.match(name):
                for _ in reader:  # read past it: the next stream of a .arrows file follows
                    pass
                continue
            fresh = name.casefold() not in source
            if fresh:
                source[name.casefold()] = f
            elif source[name.casefold()] != f:  # a table given twice would be read twice
                raise InputError(f"{path}: table {name} is in both {source[name.casefold()].name} and {f.name}")
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


def _tables(path: Path, files: list[Path]) -> Iterator[tuple[str, Any, Path]]:
    """(table name, a RecordBatchReader, its file) for every table of the export, in file order.
    A stream of a ``.arrows`` file must end with Arrow's end-of-stream marker: a file cut at a
    message boundary reads as a shorter table otherwise."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    for f in files:
        suffix = f.suffix.lower()
        try:
            if suffix == ".parquet":
                pf = pq.ParquetFile(f)
                yield f.stem, pa.RecordBatchReader.from_batches(pf.schema_arrow, pf.iter_batches(_BATCH_ROWS)), f
                continue
            with f.open("rb") as fh:
                magic = fh.read(len(_ARROW_FILE_MAGIC))
            if magic == _ARROW_FILE_MAGIC:  # the IPC file format (arrowdir may write either)
                reader = ipc.open_file(f)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
                yield f.stem, pa.RecordBatchReader.from_batches(reader.schema, batches), f
                continue
            size = f.stat().st_size
            first = True
            with pa.OSFile(str(f), "rb") as source:
                while source.tell() < size:  # streams one after the other: one per table
                    stream = ipc.open_stream(source)
                    meta = stream.schema.metadata or {}
                    named = meta.get(b"table_name")
                    if named is None and not (first and suffix != ".arrows"):
                        raise InputError(f"{path}: {f.name} holds an Arrow stream without a table_name")
                    yield (named.decode("utf-8", "replace") if named else f.stem), stream, f
                    first = False
                    end = source.tell()  # the stream was read to its end by now
                    source.seek(max(end - len(_END_OF_STREAM), 0))
                    if source.read(len(_END_OF_STREAM)) != _END_OF_STREAM:
                        raise InputError(f"{path}: {f.name} is cut short (a stream without its end marker)")
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

    target = pa.schema([pa.field(f.name, pa.binary() if (name, f.name) in _BLOB_COLUMNS else _target_type(f.type))
                        for f in reader.schema])  # fmt: skip

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
    if pa.types.is_string(target) or pa.types.is_binary(target):
        # text as it was written, valid UTF-8 or not (nsys's SQLite stores the bytes); blobs as bytes
        return pc.cast(col, target, safe=False)
    if pa.types.is_unsigned_integer(col.type) and col.type.bit_width == 64:
        # as nsys's SQLite stores a uint64 (an NVTX payload the application chose, an address):
        # the same 64 bits as a signed integer, 2**64 - 1 as -1
        return pc.cast(col, target, safe=False)
    try:
        return pc.cast(col, target)
    except pa.ArrowInvalid:
        raise InputError(f"{path}: table {table} column {column} holds a value SQLite cannot store") from None
