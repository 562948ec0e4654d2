"""How an export is opened so that nothing is ever written beside it, whatever its journal mode.

SQLite's ``mode=ro`` does not promise that: a WAL-mode database opened read-only gets ``-wal`` and
``-shm`` files created next to it (and is refused, "unable to open database file", in a directory
the user cannot write). So the journal decides the way in:

- a rollback-journal database with no hot journal: ``mode=ro``, as before (SQLite writes nothing);
- a WAL-mode database whose ``-wal`` file is absent or empty: ``mode=ro&immutable=1`` (SQLite
  neither locks nor looks for a WAL, so it creates nothing; there is no WAL content to miss);
- a ``-wal`` or ``-journal`` file that holds content (a writer that never checkpointed, or one
  that crashed): its committed pages matter, and reading them through SQLite would write beside
  the file, so the export and that file are copied into a private temporary directory and the copy
  is read. That costs one copy of the file, only in this rare case.

:func:`journal_files` names the files whose content the export's rows depend on, for the cache's
content key (:func:`nsysan.ingest.cache.export_key`).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from nsysan.errors import InputError

_WAL_MODE = 2  # the file format's read and write version bytes (18, 19) in WAL mode


def _wal_mode(path: Path) -> bool:
    with path.open("rb") as fh:
        header = fh.read(20)
    return len(header) == 20 and (header[18] == _WAL_MODE or header[19] == _WAL_MODE)


def journal_files(path: Path) -> list[Path]:
    """The ``-wal`` and ``-journal`` files beside ``path`` that hold content, which SQLite would
    read (or roll back) together with it."""
    out = []
    for suffix in ("-wal", "-journal"):
        side = path.with_name(path.name + suffix)
        try:
            if side.is_file() and side.stat().st_size > 0:
                out.append(side)
        except OSError:
            continue
    return out


@dataclass
class Snapshot:
    """The SQLite URI to read ``path`` through, and the private copy behind it, if any."""

    path: Path
    uri: str
    copy_dir: Path | None = None

    def close(self) -> None:
        """Remove the private copy (nothing to do when the export is read in place)."""
        if self.copy_dir is not None:
            shutil.rmtree(self.copy_dir, ignore_errors=True)
            self.copy_dir = None


def _uri(path: Path, params: str) -> str:
    return f"file:{quote(str(path))}?{params}"


def open_snapshot(path: Path) -> Snapshot:
    """A read-only way into ``path`` that writes nothing beside it (see the module's doc)."""
    resolved = path.resolve()
    sides = journal_files(resolved)
    if not sides:
        wal = _wal_mode(resolved)
        return Snapshot(path, _uri(resolved, "mode=ro&immutable=1" if wal else "mode=ro"))
    copy_dir = Path(tempfile.gettempdir())
    try:
        copy_dir = Path(tempfile.mkdtemp(prefix="nsysan-export-"))
        target = copy_dir / resolved.name
        shutil.copyfile(resolved, target)
        for side in sides:
            shutil.copyfile(side, copy_dir / side.name)
    except OSError as exc:
        if copy_dir.name.startswith("nsysan-export-"):
            shutil.rmtree(copy_dir, ignore_errors=True)
        raise InputError(
            f"{path}: its {sides[0].name} holds changes not yet in the file, and a private copy to read them "
            f"could not be made in {copy_dir.parent} ({exc.strerror or exc}); free space there or set TMPDIR"
        ) from None
    # the copy is ours: SQLite may create its -shm there and roll a hot journal back, as it needs
    return Snapshot(path, _uri(target, "mode=rw"), copy_dir)
