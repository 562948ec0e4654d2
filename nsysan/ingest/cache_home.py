"""Where nsysan keeps what it derives from exports, and the hashing both of its caches share: the
frame cache (:mod:`nsysan.ingest.cache`) and the raw reports' exports (:mod:`nsysan.ingest.raw_reports`)
name entries by a hash of every byte they were made from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

CHUNK_BYTES = 1 << 20
KEY_CHARS = 32  # an entry's name: the first 32 hex digits of a SHA-256


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def cache_home() -> Path:
    """``$XDG_CACHE_HOME/nsysan`` (``~/.cache/nsysan``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nsysan"


def hash_file(digest: _Digest, path: Path) -> None:
    """Feed every byte of ``path`` to ``digest``, a MiB at a time (exports run to gigabytes)."""
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            digest.update(chunk)


def is_key(name: str) -> bool:
    """Whether ``name`` is an entry's name (so clearing a cache removes only entries)."""
    return len(name) == KEY_CHARS and all(c in "0123456789abcdef" for c in name)


def is_entry(path: Path) -> bool:
    """Whether ``path`` is an entry folder of either cache."""
    return path.is_dir() and is_key(path.name)
