"""Shared-memory segments as files in a tmpfs directory (``/dev/shm`` by default).

Why not ``multiprocessing.shared_memory``: it reserves pages lazily, so a full ``/dev/shm`` shows up
as SIGBUS at the first write into the segment, and it keeps a file descriptor open per segment.
Here every segment is reserved up front with ``posix_fallocate`` (no space is an error naming the
size and what is left), mapped, and its descriptor closed at once: open files stay bounded however
many segments a process maps.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import mmap
import os
import resource

from nsysan.transport.errors import SharedMemoryFull, TransportError

DEFAULT_DIR = "/dev/shm"


def shm_dir() -> str:
    """Where segments live; ``NSYSAN_P2P_SHM_DIR`` overrides (tests point it at a small tmpfs)."""
    return os.environ.get("NSYSAN_P2P_SHM_DIR") or DEFAULT_DIR


class Segment:
    """One mapped segment file. ``create`` reserves its whole size before mapping it; opening an
    existing one with ``size=None`` maps all of it."""

    def __init__(self, path: str, size: int | None, *, create: bool, owner: str = "") -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            raise TransportError(f"{owner}shared-memory segment {path} is gone") from None
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            raise TransportError(
                f"{owner}cannot open shared-memory segment {path}: too many open files ({os.strerror(exc.errno)}; "
                f"this process may open {limit}); raise the limit (ulimit -n) or close files the job keeps open"
            ) from None
        try:
            if create:
                if size is None:
                    raise ValueError("a new segment needs its size")
                _reserve(fd, path, size, owner)
            self.size = os.fstat(fd).st_size if size is None else size
            self.map = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            if create:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            raise
        finally:
            os.close(fd)

    def unlink(self) -> None:
        """Remove the name; the memory lives on while some process maps it."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a tensor over it still lives: the mapping goes with it
            self.map.close()


def _reserve(fd: int, path: str, size: int, owner: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise
        directory = os.path.dirname(path)
        st = os.statvfs(directory)
        raise SharedMemoryFull(
            f"{owner}cannot reserve {size} bytes ({size / 2**20:.1f} MiB) of shared memory in {directory}: "
            f"{st.f_bavail * st.f_frsize} bytes free of {st.f_blocks * st.f_frsize} ({os.strerror(exc.errno)}); "
            f"enlarge it (docker run --shm-size=...) or send smaller messages"
        ) from None


def remove_all(prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix`` (a dead rank's, or ours on close)."""
    removed = 0
    for path in glob.glob(glob.escape(prefix) + "*"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed += 1
    return removed
