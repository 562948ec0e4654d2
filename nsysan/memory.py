"""Handing memory the process has freed back to the operating system, between stages of a large reduce.

glibc keeps what small allocations freed in its heap (a rank's compact table arrives as many arrays
of tens of KiB), where the large arrays of a later stage, which it maps on their own, cannot reuse
it: at 1,024 ranks the coordinator's resident memory would count the job's compact tables twice,
once joined and once freed (benchmarks/ranks.py). ``malloc_trim`` returns those pages. Where the C
library has no such call (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_freed_memory() -> None:
    """Return the heap's free pages to the operating system (glibc's ``malloc_trim(0)``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
