"""Shared-memory segments as files in a tmpfs directory (``/dev/shm`` by default).

Why not ``multiprocessing.shared_memory``: it reserves pages lazily, so a full ``/dev/shm`` shows up
as SIGBUS at the first write into the segment, and it keeps a file descriptor open per segment.
Here every segment is reserved up front with ``posix_fallocate`` (no space is an error naming the
size and what is left), mapped, and its descriptor closed at once: open files stay bounded however
many segments a process maps.

A process that ends without :meth:`P2PTransport.close` still removes its segments' names
(:func:`own`): at interpreter exit, and on SIGTERM, which is how torchrun tears down the other
ranks of a failed job and which otherwise ends a process with no clean-up at all. Only SIGKILL
(torchrun's last resort, 30 s later) leaves them.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import glob
import mmap
import os
import resource
import signal
import threading
from types import FrameType

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


# -- the names this process must remove however it ends ----------------------------------------------

_owned: set[str] = set()
_owned_lock = threading.Lock()
_owner_pid = 0  # the process whose segments _owned names: a forked child (a DataLoader worker) owns none
_at_exit = False
_on_sigterm = False


def own(prefix: str) -> None:
    """Remove every segment under ``prefix`` if this process ends before :func:`disown` (see the
    module's doc). The SIGTERM handler is installed only where SIGTERM still has its default
    action (it ends the process), and from the main thread (Python's rule): a handler of the
    program's own (finish the step, checkpoint, then exit) keeps its segments until it exits, when
    the exit handler removes them. After the clean-up SIGTERM ends the process as before, so the
    exit status torchrun sees is unchanged."""
    global _at_exit, _on_sigterm, _owner_pid
    with _owned_lock:
        _owned.add(prefix)
        _owner_pid = os.getpid()
        if not _at_exit:
            atexit.register(_remove_owned)
            _at_exit = True
        if _on_sigterm or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            _remove_owned()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
        _on_sigterm = True


def disown(prefix: str) -> None:
    """The segments under ``prefix`` were removed by their owner (a clean close)."""
    with _owned_lock:
        _owned.discard(prefix)


def _remove_owned() -> None:
    if os.getpid() != _owner_pid:  # a forked child ending: the segments are its parent's
        return
    for prefix in list(_owned):
        with contextlib.suppress(OSError):
            remove_all(prefix)
