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
from nsysan.ingest.raw_reports import RAW_SUFFIXES, is_raw, sqlite_of

EXPORT_SUFFIXES = (".sqlite", ".db", ".sqlite3")


def expand_inputs(inputs: Iterable[str | os.PathLike[str]], skipped: list[str] | None = None) -> list[Path]:
    """Files as given, directories as the exports inside them, globs expanded; order kept. A raw
    report (``.nsys-rep``) stands for its SQLite export, made with nsys once
    (:mod:`nsysan.ingest.raw_reports`), unless a ``.sqlite`` of the same name beside it is given too
    (nsys and ``nsysan capture`` write both; a directory or a glob names both).

    Inside a directory only regular files count: a FIFO, device or socket named ``x.sqlite``
    would block or stream forever, so it is skipped and a note appended to ``skipped`` (and a
    regular ``x.nsys-rep`` beside it is then exported, as it has no export beside it). A path
    given by name is kept whatever it is; opening it refuses what is not a regular file.
    """
    paths: list[Path] = []
    for item in inputs:
        text = str(item)
        path = Path(text)
        if path.is_dir():
            # exports, and regular raw reports (one beside its own export is dropped below)
            named = sorted(p for p in path.iterdir() if p.suffix.lower() in EXPORT_SUFFIXES
                           or (p.suffix.lower() in RAW_SUFFIXES and p.is_file()))  # fmt: skip
            found = [p for p in named if p.is_file()]
            if skipped is not None:
                skipped.extend(f"{p}: skipped, not a regular file" for p in named if not p.is_file())
            if not found:
                raise InputError(f"{path}: directory holds no .sqlite exports or .nsys-rep reports")
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
    exported = {(p.parent.resolve(), p.stem) for p in paths if not is_raw(p)}
    paths = [p for p in paths if not (is_raw(p) and (p.parent.resolve(), p.stem) in exported)]
    paths = [sqlite_of(p) if is_raw(p) and p.is_file() else p for p in paths]
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
