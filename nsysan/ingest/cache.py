"""A Parquet cache of ingested frames, so that a second look at the same export skips SQLite, and
of what a report made of each export, so that a second report skips the analysis too.

Each export gets one entry: a directory named by a hash of the export's whole content (and of
any ``-wal`` / ``-journal`` file whose commits the file does not show yet) and by
:data:`READER_VERSION`, so a copied or touched export still hits and any changed byte misses. The
hash costs about 1 s per GiB, paid once: ``identities/`` remembers it per file under the file's
stat identity (device, inode, size, mtime and ctime; no write, and no ``touch`` putting an mtime
back, leaves ctime as it was). In it, one Parquet file per read (a frame, a set of kernel columns, the
launch calls of some kernels, the timestamp audit), each carrying in its metadata what that read
noted on the export (rows left out, strings missing): a hit replays those notes, so the report's
limitations are the same as on a cold read. Beside them, :meth:`FrameCache.value` keeps values a
caller computed from the export (``nsysan report``'s map result, keyed by nsysan's code, the
settings and the rank table: :mod:`nsysan.engine`).

The cache lives in ``$XDG_CACHE_HOME/nsysan/frames`` (``~/.cache/nsysan/frames``), never beside
the user's trace unless asked (``--cache DIR``). Writes go to a temporary file renamed into place;
an entry that cannot be read is read from the export again and rewritten; a directory that cannot
be written costs one note on stderr and nothing else. Turned on per process with :func:`configure`
(the CLI does) or ``NSYSAN_CACHE`` (``1``/``on``, ``0``/``off`` or a directory).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import stat
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

import pandas as pd

from nsysan.ingest.cache_home import KEY_CHARS, cache_home, hash_file, is_entry, is_key
from nsysan.ingest.export import NsysExport
from nsysan.ingest.snapshot import journal_files

# Bump whenever a reader's output changes (a column, a dtype, a rule on dropped rows): entries
# written by another version are never read.
READER_VERSION = "3"
IDENTITIES = "identities"  # the remembered content hashes, beside the entries
_META_KEY = b"nsysan"
ENV = "NSYSAN_CACHE"
T = TypeVar("T")
# this process's content hashes: {resolved path: (stat identities of the file and its journal, key)}
_known: dict[str, tuple[list[list[int]], str]] = {}


def default_dir() -> Path:
    return cache_home() / "frames"


def _stat_identity(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def export_key(path: Path, identities: Path | None = None) -> str:
    """The identity of one export's contents as nsysan reads them: a hash of every byte of the
    file and of its ``-wal`` / ``-journal`` file with content (a WAL-mode export written after it
    was cached). A header-only hash missed changes beyond the first MiB whose writer put size and
    mtime back; a whole-file hash misses nothing. When ``identities`` is a directory of remembered
    hashes, a file whose stat identity is unchanged is not read again."""
    parts = [path, *journal_files(path.resolve())]  # beside the file a symlink names, as it is read
    stats = [_stat_identity(p) for p in parts]
    known = _known.get(str(path.resolve()))
    if known is not None and known[0] == stats:
        return known[1]
    memo = identities / hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:KEY_CHARS] if identities else None
    key = _remembered(memo, stats) if memo is not None else None
    if key is None:
        digest = hashlib.sha256(READER_VERSION.encode())
        for part in parts:
            digest.update(f" {part.stat().st_size} ".encode())
            hash_file(digest, part)
        key = digest.hexdigest()[:KEY_CHARS]
        if stats != [_stat_identity(p) for p in parts] or _racy(stats):  # not remembered, hashed again next time
            return key
        if memo is not None:
            _remember(memo, stats, key)
    _known[str(path.resolve())] = (stats, key)
    return key


_RACY_NS = 2_000_000_000


def _racy(stats: list[list[int]]) -> bool:
    """Whether a file changed so recently that a write in the same clock tick as the hash would
    leave its stat identity as it is (file times come from a coarse clock: milliseconds, or seconds
    on some file systems); git's "racy" rule. Such a hash is not remembered."""
    return time.time_ns() - max(max(s[3], s[4]) for s in stats) < _RACY_NS


def _remembered(memo: Path, stats: list[list[int]]) -> str | None:
    """The hash remembered for a file with exactly these stat identities, read only from a regular
    file of this user's that nobody else may write (another user could otherwise point an export
    at a different entry)."""
    try:
        fd = os.open(memo, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (hasattr(os, "getuid") and not _private(st)):
                return None
            doc = json.loads(fh.read(1 << 16))
            key = doc.get("key") if doc.get("stats") == stats and doc.get("version") == READER_VERSION else None
        except (OSError, ValueError, AttributeError):
            return None
    return key if isinstance(key, str) and is_key(key) else None


def _remember(memo: Path, stats: list[list[int]], key: str) -> None:
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{memo.name}.", suffix=".tmp", dir=memo.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump({"version": READER_VERSION, "stats": stats, "key": key}, fh)
        os.replace(tmp, memo)
    except OSError:
        pass  # an unwritable cache: the hash is computed again next time, nothing else changes


@dataclass
class CacheInfo:
    location: Path
    entries: int
    files: int
    size_bytes: int


class FrameCache:
    """One cache directory (see the module's doc)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_dir()
        self.writable = True
        self.hits = 0
        self.misses = 0

    # -- maintenance ------------------------------------------------------------------------

    def info(self) -> CacheInfo:
        entries = [p for p in self.directory.iterdir() if is_entry(p)] if self.directory.is_dir() else []
        files = [f for e in entries for f in e.iterdir() if f.is_file()]
        return CacheInfo(self.directory, len(entries), len(files), sum(f.stat().st_size for f in files))

    def clear(self) -> tuple[int, int]:
        """Remove every entry (only nsysan's entry directories): (removed, left), the entries that
        are still there afterwards (a read-only directory) counted apart, never as removed."""
        entries = [p for p in self.directory.iterdir() if is_entry(p)] if self.directory.is_dir() else []
        for entry in entries:
            shutil.rmtree(entry, ignore_errors=True)
        shutil.rmtree(self.directory / IDENTITIES, ignore_errors=True)
        left = sum(entry.exists() for entry in entries)
        return len(entries) - left, left

    # -- reads ------------------------------------------------------------------------------

    def read(self, x: NsysExport, name: str, reader: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """``reader()``'s frame for export ``x``, from the cache when an entry holds it; otherwise
        read, then stored with the notes the read left on ``x``."""
        entry = self._entry(x)
        file = entry / f"{_safe(name)}.parquet" if entry is not None else None
        if file is not None and file.is_file():
            hit = _load(file)
            if hit is not None:
                df, notes = hit
                _replay(x, notes)
                self.hits += 1
                return df
        self.misses += 1
        before = _snapshot(x)
        df = reader()
        if file is not None and self.writable:
            self._store(file, df, _notes_since(x, before))
        return df

    def _entry(self, x: NsysExport) -> Path | None:
        key = getattr(x, "_cache_key", None)
        if key is None:
            try:
                key = export_key(x.path, self.directory / IDENTITIES)
            except OSError:
                key = ""
            x._cache_key = key  # type: ignore[attr-defined]
        return self.directory / key if key else None

    def value(self, path: Path, name: str, compute: Callable[[], T]) -> T:
        """``compute()``'s value for the export at ``path``, kept in the export's entry under
        ``name``, which must say everything else the value depends on. It holds what nsysan made of
        an export (a map's result), so a re-report skips the analysis, not only SQLite.

        Stored with pickle, and loading a pickle can run code, so a value is read only from a
        regular file (not a link) that this user owns and nobody else may write, in an entry
        directory of the same kind; nsysan makes both so. Anything else, or a damaged file, is
        computed again and rewritten.
        """
        if not hasattr(os, "getuid"):  # no owners to check (Windows): not kept
            return compute()
        try:  # only a regular file has an identity (reading a FIFO's would wait forever)
            file = (
                self.directory / export_key(path, self.directory / IDENTITIES) / f"{_safe(name)}.pickle"
                if path.is_file()
                else None
            )
        except OSError:
            file = None
        if file is None:  # not an export: compute() says so, in its own words
            return compute()
        hit = _load_value(file)
        if hit is not None:
            self.hits += 1
            return cast(T, hit[0])
        self.misses += 1
        value = compute()
        if self.writable:  # a value pickle cannot hold stays uncached, nothing else changes
            with contextlib.suppress(pickle.PicklingError, AttributeError, TypeError):
                self._write(file, lambda fh: pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL))
            with contextlib.suppress(OSError):
                _make_private(file.parent)
        return value

    def _store(self, file: Path, df: pd.DataFrame, notes: dict[str, Any]) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            plain, dtypes = _encode(df)
            table = pa.Table.from_pandas(plain, preserve_index=False)
            meta = dict(table.schema.metadata or {})
            doc = {"version": READER_VERSION, "notes": notes, "columns": list(df.columns), "dtypes": dtypes}
            meta[_META_KEY] = json.dumps(doc).encode()
            table = table.replace_schema_metadata(meta)
            self._write(file, lambda fh: pq.write_table(table, fh, compression="zstd"))
        except (ImportError, ValueError, TypeError, NotImplementedError) as exc:
            # a frame Arrow cannot hold (mixed objects): that read stays uncached, nothing else changes
            _ = exc

    def _write(self, file: Path, dump: Callable[[BinaryIO], object]) -> None:
        """``dump`` into a temporary file (mode 0600) renamed to ``file``; a directory that cannot
        be written turns the cache off with one note on stderr."""
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    dump(fh)
                os.replace(tmp, file)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            self.writable = False
            sys.stderr.write(
                f"nsysan: note: frame cache {self.directory} is not writable ({exc.strerror or exc}); "
                "reading without it\n"
            )


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _encode(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """``df`` with categoricals as their codes, and what restores every column's exact dtype
    (Parquet's own pandas metadata loses empty categories, their dtype and object columns)."""
    plain: dict[str, Any] = {}
    dtypes: dict[str, Any] = {}
    for i, name in enumerate(df.columns):
        col = df.iloc[:, i]
        if isinstance(col.dtype, pd.CategoricalDtype):
            cats = col.cat.categories
            dtypes[name] = {"category": cats.tolist(), "dtype": str(cats.dtype), "ordered": bool(col.cat.ordered)}
            plain[name] = col.cat.codes.to_numpy()
        else:
            dtypes[name] = str(col.dtype)
            plain[name] = col
    return pd.DataFrame(plain), dtypes


def _decode(df: pd.DataFrame, columns: list[str], dtypes: dict[str, Any]) -> pd.DataFrame:
    out: dict[str, Any] = {}
    for name in columns:
        col, dtype = df[name], dtypes[name]
        if isinstance(dtype, dict):
            cats: Any = pd.Index(dtype["category"], dtype=dtype["dtype"])
            out[name] = pd.Categorical.from_codes(col.to_numpy(), categories=cats, ordered=dtype["ordered"])
        elif dtype != str(col.dtype):
            out[name] = col.astype(object).where(col.notna(), None) if dtype == "object" else col.astype(dtype)
        else:
            out[name] = col
    return pd.DataFrame(out, columns=columns)


def _private(st: os.stat_result) -> bool:
    """Owned by this user, and nobody else may write it."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _make_private(directory: Path) -> None:
    """Take group and others' write permission off an entry directory of this user's."""
    st = os.lstat(directory)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o022:
        os.chmod(directory, stat.S_IMODE(st.st_mode) & ~0o022)


def _load_value(file: Path) -> tuple[Any] | None:
    """(the stored value,), or None when there is none, it is damaged, or it or its entry directory
    is not this user's alone (a pickle can run code: one somebody else could write is never loaded;
    a link or a FIFO planted in its place is not followed or waited on)."""
    try:
        entry = os.lstat(file.parent)
        if not stat.S_ISDIR(entry.st_mode) or not _private(entry):
            return None
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _private(st):
            return None
        try:
            return (pickle.load(fh),)
        except Exception:
            return None


def _load(file: Path) -> tuple[pd.DataFrame, dict[str, Any]] | None:
    """A stored frame and its notes, or None when the file is damaged or from another reader."""
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(file)
        meta = json.loads((table.schema.metadata or {})[_META_KEY])
        if meta.get("version") != READER_VERSION:
            return None
        return _decode(table.to_pandas(), meta["columns"], meta["dtypes"]), meta["notes"]
    except Exception:
        return None


# -- the notes a read leaves on the export --------------------------------------------------------


def _key(k: tuple[str, str]) -> list[str]:
    return [k[0], k[1]]


def _snapshot(x: NsysExport) -> tuple[Counter[tuple[str, str]], set[str], dict[str, int]]:
    return Counter(x.dropped), set(x.time_drops), {t: sum(c.values()) for t, c in x.partial_time_drops.items()}


def _notes_since(x: NsysExport, before: tuple[Counter[tuple[str, str]], set[str], dict[str, int]]) -> dict[str, Any]:
    dropped, timed, partial = before
    delta = [[*_key(k), n - dropped.get(k, 0)] for k, n in x.dropped.items() if n != dropped.get(k, 0)]
    times = {t: [[*_key(k), n] for k, n in c.items()] for t, c in x.time_drops.items() if t not in timed}
    parts = {
        t: [[*_key(k), n] for k, n in c.items()]
        for t, c in x.partial_time_drops.items()
        if t not in partial or sum(c.values()) != partial[t]
    }
    return {"dropped": delta, "time_drops": times, "partial_time_drops": parts}


def _replay(x: NsysExport, notes: dict[str, Any]) -> None:
    """What the cached read noted on its export, noted again as the read itself would."""
    for what, reason, n in notes.get("dropped", []):
        x.dropped[(what, reason)] += int(n)
    for table, rows in notes.get("time_drops", {}).items():
        x.time_drops.setdefault(table, Counter({(w, r): int(n) for w, r, n in rows}))
    for table, rows in notes.get("partial_time_drops", {}).items():
        counts = Counter({(w, r): int(n) for w, r, n in rows})
        if table not in x.partial_time_drops or sum(counts.values()) > sum(x.partial_time_drops[table].values()):
            x.partial_time_drops[table] = counts


# -- the process's cache --------------------------------------------------------------------------

_configured: FrameCache | bool | None = None  # None: not configured (NSYSAN_CACHE decides); False: off


def configure(enabled: bool, directory: Path | None = None) -> None:
    """Turn the cache on (in ``directory``, else the default) or off for this process's loads."""
    global _configured
    _configured = FrameCache(directory) if enabled else False


def process_cache() -> FrameCache | None:
    """The cache :func:`~nsysan.ingest.trace.load_trace` uses when not told: as configured, else as
    ``NSYSAN_CACHE`` says (off when unset, so a library user's reads write nothing unasked)."""
    global _configured
    if _configured is None:
        value = os.environ.get(ENV, "").strip()
        if value.lower() in ("", "0", "off", "no", "false"):
            return None
        _configured = FrameCache(None if value.lower() in ("1", "on", "yes", "true") else Path(value))
    return _configured if isinstance(_configured, FrameCache) else None
