"""What the user named on the command line, as the export files to open.

Paths, directories and glob patterns are expanded here, apart from reading, so a caller that only
lists or validates files (the CLI's output check, the dashboard's library) needs no export open.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path

from nsysan.errors import InputError
from nsysan.ingest.arrow_exports import STREAMS_SUFFIXES, export_stem, is_arrow_export, sqlite_of_tables
from nsysan.ingest.raw_reports import RAW_SUFFIXES, is_raw, sqlite_of

EXPORT_SUFFIXES = (".sqlite", ".db", ".sqlite3")


def expand_inputs(inputs: Iterable[str | os.PathLike[str]], skipped: list[str] | None = None) -> list[Path]:
    """Files as given, directories as the exports inside them, globs expanded; order kept. A raw
    report (``.nsys-rep``) stands for its SQLite export, made with nsys once
    (:mod:`nsysan.ingest.raw_reports`), unless a ``.sqlite`` of the same name beside it is given too
    (nsys and ``nsysan capture`` write both; a directory or a glob names both). An export in Arrow
    or Parquet (a ``.arrows`` file, an ``arrowdir`` / ``parquetdir`` directory) stands for its
    SQLite copy (:mod:`nsysan.ingest.arrow_exports`), made once.

    Inside a directory only regular files count: a FIFO, device or socket named ``x.sqlite``
    would block or stream forever, so it is skipped and a note appended to ``skipped`` (and a
    regular ``x.nsys-rep`` beside it is then exported, as it has no export beside it). A path
    given by name is kept whatever it is; opening it refuses what is not a regular file.
    """
    paths: list[Path] = []
    for item in inputs:
        text = str(item)
        path = Path(text)
        if path.is_dir() and is_arrow_export(path):
            paths.append(path)
        elif path.is_dir():
            # exports, regular raw reports and Arrow streams (one beside its own export is dropped
            # below), and directories that are Arrow/Parquet exports
            named = sorted(p for p in path.iterdir() if p.suffix.lower() in EXPORT_SUFFIXES
                           or (p.suffix.lower() in (*RAW_SUFFIXES, *STREAMS_SUFFIXES) and p.is_file()))  # fmt: skip
            found = [p for p in named if p.is_file()]
            if skipped is not None:
                skipped.extend(f"{p}: skipped, not a regular file" for p in named if not p.is_file())
            for sub in (p for p in path.iterdir() if p.is_dir()):
                if not os.access(sub, os.R_OK | os.X_OK):
                    if skipped is not None:
                        skipped.append(f"{sub}: skipped, cannot read this directory")
                elif is_arrow_export(sub):
                    found.append(sub)
            found.sort(key=lambda p: p.name)
            if not found:
                raise InputError(
                    f"{path}: directory holds no .sqlite exports, .nsys-rep reports or Arrow/Parquet exports"
                )
            paths.extend(found)
        elif not path.exists() and glob.has_magic(text):
            matched = sorted(Path(p) for p in glob.glob(text))
            if not matched:
                raise InputError(f"{text}: pattern matches no files")
            paths.extend(expand_inputs(matched, skipped))
        else:
            paths.append(path)
    # a capture's report beside its own export, both named (a glob over run directories): the
    # export is read, the report not exported again as a second copy of the same ranks
    # (and an Arrow/Parquet export beside the SQLite one, as `nsys export --type sqlite,parquetdir`
    # writes them: the SQLite one is read)
    arrow = {p for p in paths if is_arrow_export(p)}  # each ask lists a directory: asked once
    capture = {p: _capture(p, p in arrow) for p in paths}
    exported = {capture[p] for p in paths if not is_raw(p)}
    paths = [p for p in paths if not (is_raw(p) and capture[p] in exported)]
    sqlite = {capture[p] for p in paths if not is_raw(p) and p not in arrow}
    paths = [p for p in paths if not (p in arrow and capture[p] in sqlite)]
    paths = [_readable(p, p in arrow) for p in paths]
    seen: set[Path] = set()
    unique = []
    for p in paths:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    if not unique:
        raise InputError("no trace given")
    return unique


def _capture(path: Path, arrow: bool) -> tuple[Path, str]:
    """Which capture a file or export directory holds, by its place and name: ``job.sqlite``,
    ``job.nsys-rep``, ``job.arrows`` and ``job_pqtdir/`` beside each other are one capture.
    ``arrow``: whether ``path`` is an Arrow/Parquet export."""
    where = (path.resolve() if path.is_dir() else path).parent.resolve()  # "." is in its parent
    return where, export_stem(path) if arrow else path.stem


def _readable(path: Path, arrow: bool) -> Path:
    """The SQLite file read for ``path``: itself, or the export made of a raw report or the copy
    made of an Arrow/Parquet export (``arrow``)."""
    if arrow:
        return sqlite_of_tables(path)
    if is_raw(path) and path.is_file():
        return sqlite_of(path)
    return path
