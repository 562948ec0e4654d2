"""Wake-ups and memory fences between processes: Linux futexes through ``ctypes``.

Python has no atomics, so the control ring (``ring.py``) relies on two things written here by hand:

* ``wait(addr, expected, timeout)``: sleep while the 32-bit word at ``addr`` still holds
  ``expected`` (``FUTEX_WAIT``; the kernel compares and sleeps atomically, so a wake-up between our
  last look and the sleep is never lost).
* ``bump_and_wake(addr)``: atomically add 1 to the word and wake every sleeper (``FUTEX_WAKE_OP``
  does the add inside the kernel with a locked instruction). Several producers ring the same
  doorbell; a plain ``+= 1`` from Python could lose an increment and with it a wake-up.

Memory ordering. Each Python-level load or store into the mapping is an opaque C call, so the C
compiler cannot move one across another. On x86-64 (TSO) the hardware keeps stores in program
order and loads in program order, and never moves a store before an earlier load: that is exactly
the release (producer: payload, then head) and acquire (consumer: head, then payload; payload read
before tail) ordering the ring needs, so ``fence`` does nothing there. On weaker architectures
``fence`` is a kernel atomic read-modify-write on a private word, which the kernel surrounds with
full barriers. ``full_fence`` orders a store before a later load of another word (Dekker's
pattern), which x86-64 does not do by itself (a store may wait in the store buffer while a later
load runs). There it takes and releases a private ``threading.Lock``: every lock implementation
acquires with an atomic read-modify-write (``lock cmpxchg``: glibc's semaphores under CPython 3.11
and 3.12, PyMutex from 3.13), and on x86-64 a locked instruction is a full barrier; ~0.1 us
against ~1-13 us for the kernel atomic, which it stays on other architectures. It runs once per
message on the sender's path (``p2p.py``: head, then the receiver's sleepers word).
"""

from __future__ import annotations

import ctypes
import platform
import threading

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_NR = ctypes.c_long(_SYS_FUTEX if _SYS_FUTEX is not None else -1)  # -1: callers check available() first
_FUTEX_WAIT, _FUTEX_WAKE_OP = 0, 5
_INT_MAX = 0x7FFFFFFF
# FUTEX_OP(FUTEX_OP_ADD, 1, FUTEX_OP_CMP_EQ, 0): *uaddr2 += 1, then wake sleepers on uaddr
_ADD_ONE = (1 << 28) | (0 << 24) | (1 << 12) | 0

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def supported() -> bool:
    """Whether this machine has the futex calls the shared-memory signalling needs."""
    return _SYS_FUTEX is not None


def wait(addr: int, expected: int, timeout: float) -> None:
    """Sleep until the word at ``addr`` changes from ``expected``, a wake-up, or ``timeout`` s."""
    ts = _Timespec(int(timeout), int((timeout % 1) * 1e9))
    _syscall(_NR, ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAIT),
             ctypes.c_uint32(expected), ctypes.byref(ts), None, ctypes.c_int(0))  # fmt: skip


def bump_and_wake(addr: int) -> None:
    """Atomically increment the word at ``addr`` and wake every process sleeping on it."""
    _syscall(_NR, ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAKE_OP),
             ctypes.c_int(_INT_MAX), ctypes.c_void_p(0), ctypes.c_void_p(addr), ctypes.c_int(_ADD_ONE))  # fmt: skip


_scratch = ctypes.c_uint32(0)


def _kernel_fence() -> None:
    bump_and_wake(ctypes.addressof(_scratch))


def _compiler_fence() -> None:
    return None


_fence_lock = threading.Lock()


def _locked_fence() -> None:
    with _fence_lock:  # an atomic read-modify-write on acquire and on release: see the module's text
        pass


_X86 = platform.machine().lower() in ("x86_64", "amd64")
fence = _compiler_fence if _X86 else _kernel_fence
full_fence = _locked_fence if _X86 else _kernel_fence
