"""One-copy transfers of ordinary CPU tensors: the receiver reads the sender's memory directly with
``process_vm_readv`` (Linux cross-memory attach, "CMA", as in MPI's single-copy path).

The kernel pins the sender's pages and copies them into the receiver's buffer: one copy instead of
staging into shared memory and copying out again. Its cost per source page makes it fast when the
sender's tensor lies in transparent huge pages (0.9-1.0x a ``copy_`` on the 2-CPU VM this was
measured on) and about 0.4-0.5x a ``copy_`` on 4 KiB pages (docs/transport.md, "Measured").

Allowed when the reader may ptrace the sender (same user, the sender dumpable; with Yama
``ptrace_scope`` 1 also an ancestor, or the sender allowed it with ``PR_SET_PTRACER``): the transport
probes every peer once at set-up (:func:`probe`) and keeps the shared-memory path for the others.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select

_libc = ctypes.CDLL(None, use_errno=True)
_readv = getattr(_libc, "process_vm_readv", None)
if _readv is not None:
    _readv.restype = ctypes.c_ssize_t
    _readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]

STEP = 16 << 20  # bytes per call: bounds the time one call holds the sender's mm, loops over partial reads


class _ScanArg(ctypes.Structure):  # struct pm_scan_arg (linux/fs.h)
    _fields_ = [(name, ctypes.c_uint64) for name in ("size", "flags", "start", "end", "walk_end", "vec", "vec_len",
                "max_pages", "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]  # fmt: skip


class _Region(ctypes.Structure):  # struct page_region
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("categories", ctypes.c_uint64)]


_PAGEMAP_SCAN = (3 << 30) | (ctypes.sizeof(_ScanArg) << 16) | (ord("f") << 8) | 16  # _IOWR('f', 16, ...)
_PAGE_IS_HUGE = 1 << 6
_pagemap: tuple[int, int] | None = None  # (pid, fd of /proc/self/pagemap): reopened after a fork
_scan_works = True


def huge_fraction(address: int, nbytes: int) -> float | None:
    """The share of ``[address, address + nbytes)`` of this process in huge pages (THP or hugetlb),
    from the kernel's PAGEMAP_SCAN (Linux 6.7+, a walk of the range's page tables: ~0.2 ms for
    64 MiB); None when the kernel cannot tell."""
    global _pagemap, _scan_works
    if not _scan_works or nbytes <= 0:
        return None
    if _pagemap is None or _pagemap[0] != os.getpid():
        try:
            _pagemap = (os.getpid(), os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            _scan_works = False
            return None
    start, end = address & ~4095, (address + nbytes + 4095) & ~4095
    regions = (_Region * 32)()
    huge = 0
    while start < end:
        arg = _ScanArg(ctypes.sizeof(_ScanArg), 0, start, end, 0, ctypes.addressof(regions), len(regions), 0, 0,
                       _PAGE_IS_HUGE, 0, _PAGE_IS_HUGE)  # fmt: skip
        found = _libc.ioctl(_pagemap[1], ctypes.c_ulong(_PAGEMAP_SCAN), ctypes.byref(arg))
        if found < 0:
            _scan_works = False  # ENOTTY/EINVAL: a kernel without PAGEMAP_SCAN
            return None
        huge += sum(regions[i].end - regions[i].start for i in range(found))
        if arg.walk_end <= start:
            break
        start = arg.walk_end
    return min(1.0, huge / (end - (address & ~4095)))


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def read(pid: int, local: int, remote: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``remote`` of process ``pid`` to our address ``local``.

    Raises ``OSError`` (``ESRCH``: the process is gone, ``EFAULT``: the range is not mapped there,
    ``EPERM``: not allowed); a short read is continued where it stopped."""
    if _readv is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available")
    done = 0
    while done < nbytes:
        n = min(STEP, nbytes - done)
        mine, theirs = _Iovec(local + done, n), _Iovec(remote + done, n)
        got = _readv(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
        if got < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        if got == 0:  # nothing readable at the next byte: the same as a fault there
            raise OSError(errno.EFAULT, f"read stopped after {done} of {nbytes} bytes")
        done += got


def probe(pid: int, address: int, expected: bytes) -> str | None:
    """Read ``expected``'s length from ``address`` in ``pid``: None when the bytes match, else why not."""
    buf = ctypes.create_string_buffer(len(expected))
    try:
        read(pid, ctypes.addressof(buf), address, len(expected))
    except OSError as exc:
        return f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror}"
    return None if buf.raw == expected else "read the wrong bytes"


class Watch:
    """Whether a process that was alive at construction has ended since: a pid file descriptor
    (``pidfd_open``), so a pid reused by another process after the peer died is never mistaken for
    the peer. Without pidfds, falls back to ``os.kill(pid, 0)`` plus the zombie state."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        opener = getattr(os, "pidfd_open", None)
        if opener is not None:
            try:
                self.fd = opener(pid)
            except OSError:
                self.fd = None

    def ended(self) -> bool:
        if self.fd is not None:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return bool(poller.poll(0))  # readable once the process has exited
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
        except (FileNotFoundError, IndexError):
            return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
