"""Raw nsys reports (``.nsys-rep``, ``.qdrep``) read through their SQLite export, made here with the
nsys on this machine, as a user would run ``nsys export --type sqlite`` by hand.

The export never goes beside the report (its directory may be read-only, or shared): it goes to
``$XDG_CACHE_HOME/nsysan/exports/KEY/NAME.sqlite`` (``~/.cache/...``), KEY a hash of the report's
bytes and of the nsys binary that exported it, so a second look at the same report exports nothing and a
newer nsys exports it again. With the cache off (``--no-cache``, ``NSYSAN_CACHE=0``), and for a
library caller that configured nothing, it goes to a temporary directory removed when the process
ends. A ``.qdstrm`` (a capture nsys never finished
importing) cannot be exported and is refused with what to run.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from nsysan.errors import InputError
from nsysan.ingest.cache_home import KEY_CHARS, cache_home, hash_file, is_entry
from nsysan.nsys import NsysNotFound, find_nsys

RAW_SUFFIXES = (".nsys-rep", ".qdrep")
UNFINISHED_SUFFIX = ".qdstrm"

# a Path: that directory (the CLI's cache); False (a library caller that configured nothing): a
# temporary one, so that a read writes nothing lasting unless asked, as with the frame cache
_where: Path | bool = False
_temporary: Path | None = None
# this process's exports: {(resolved report, its stat identity): the .sqlite}
_done: dict[tuple[str, tuple[int, ...]], Path] = {}
# what each SQLite made in the exports cache was made from: {its path: the path the user gave}
_sources: dict[str, str] = {}


def remember_source(made: Path, source: Path) -> None:
    """Note that ``made`` (an export or copy in the cache) stands for the user's ``source``."""
    _sources[str(made)] = str(source)


def with_sources(text: str) -> str:
    """``text`` (an error message) with each cached export's path replaced by what the user gave:
    a message about a report or a Parquet export names that, not a file in the cache."""
    for made, source in _sources.items():
        text = text.replace(made, source)
    return text


def configure(directory: Path | None, *, cached: bool = True) -> None:
    """Where exports go: ``directory`` (None: ``$XDG_CACHE_HOME/nsysan/exports``), or with
    ``cached=False`` a temporary directory removed at exit (also where nothing was configured)."""
    global _where
    _where = (directory or exports_dir()) if cached else False


def is_raw(path: Path) -> bool:
    return path.suffix.lower() in RAW_SUFFIXES or path.suffix.lower() == UNFINISHED_SUFFIX


def sqlite_of(path: Path) -> Path:
    """The SQLite export of raw report ``path``, exported now unless this report's bytes were
    exported before by the same nsys."""
    if path.suffix.lower() == UNFINISHED_SUFFIX:
        raise InputError(
            f"{path}: is an unfinished nsys capture (.qdstrm); open it in Nsight Systems or run "
            "QdstrmImporter on it to make the .nsys-rep, then pass that"
        )
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    identity = (str(path.resolve()), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    if identity in _done and _done[identity].is_file():
        return _done[identity]
    try:
        nsys = find_nsys()
        tool = nsys.resolve().stat()
    except (NsysNotFound, OSError) as exc:
        raise InputError(
            f"{path}: a raw nsys report, which nsysan exports with nsys: {exc}; or run "
            f"`nsys export --type sqlite {path.name}` where nsys is and pass the .sqlite"
        ) from None
    # another nsys (a new install, an upgrade) may export the same report differently: exported again
    digest = hashlib.sha256(f"{nsys.resolve()}\0{tool.st_size}\0{tool.st_mtime_ns}\0".encode())
    try:
        hash_file(digest, path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    folder = export_directory() / digest.hexdigest()[:KEY_CHARS]
    target = folder / (path.name[: -len(path.suffix)] + ".sqlite")
    if not target.is_file():
        _export(nsys, path, folder, target)
    _done[identity] = target
    remember_source(target, path)
    return target


def exports_dir(cache_dir: Path | None = None) -> Path:
    """Where a cache directory given as ``--cache`` (None: the default) keeps its exports."""
    if cache_dir is not None:
        return cache_dir / "exports"
    return cache_home() / "exports"


def _entries(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if is_entry(p)]


def exports_info(folder: Path) -> tuple[int, int]:
    """(exported reports, bytes) kept in ``folder``."""
    files = [f for e in _entries(folder) for f in e.glob("*.sqlite") if not f.name.startswith(".")]  # not partial
    return len(files), sum(f.stat().st_size for f in files)


def clear_exports(folder: Path) -> tuple[int, int]:
    """Remove every kept export: (removed, left), the ones still there afterwards counted apart."""
    entries = _entries(folder)
    for entry in entries:
        shutil.rmtree(entry, ignore_errors=True)
    left = sum(entry.exists() for entry in entries)
    return len(entries) - left, left


def export_directory() -> Path:
    """Where exports made in this process go: the configured cache, or a temporary directory
    removed at exit."""
    global _temporary
    if _where is False:
        if _temporary is None:
            _temporary = Path(tempfile.mkdtemp(prefix="nsysan-exports-"))
            atexit.register(shutil.rmtree, _temporary, True)
        return _temporary
    return _where if isinstance(_where, Path) else exports_dir()


def partial_file(folder: Path, target: Path) -> Path:
    """A new empty file in ``folder`` to write ``target`` into, renamed into place when complete, so
    an interrupted export or copy is never taken for a finished one (its name starts with a dot)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".sqlite", dir=folder)
    os.close(fd)
    return Path(partial)


def _export(nsys: Path, path: Path, folder: Path, target: Path) -> None:
    """``nsys export`` into a temporary name in ``folder``, renamed into place when complete, so
    an interrupted export is never taken for a finished one."""
    try:
        partial = str(partial_file(folder, target))
    except OSError as exc:
        raise InputError(
            f"{path}: cannot write its SQLite export to {folder} ({exc.strerror}); set XDG_CACHE_HOME or "
            "run `nsys export --type sqlite` yourself and pass the .sqlite"
        ) from None
    if sys.stderr.isatty():  # it can take minutes; in a log, a failure stays one line
        sys.stderr.write(f"nsysan: note: exporting {path} with {nsys} (once; kept in {folder.parent})\n")
    argv = [str(nsys), "export", "--type", "sqlite", "--quiet", "true", "--force-overwrite", "true",
            "--output", partial, str(path)]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    except OSError as exc:
        Path(partial).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()
        raise InputError(f"{path}: cannot run {nsys} to export it ({exc.strerror})") from None
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    if done.returncode != 0 or not Path(partial).is_file() or Path(partial).stat().st_size == 0:
        Path(partial).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if nothing else is in it
        said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = said[-1] if said else f"exit status {done.returncode}"
        raise InputError(
            f"{path}: nsys could not export this report ({reason[:300]}); if another nsys wrote it, run "
            f"`nsys export --type sqlite {path.name}` with that one and pass the .sqlite"
        )
    os.replace(partial, target)
