"""Keep freed memory in the process, so that the kernels' temporaries do not fault in fresh pages.

Every kernel allocates its outputs and temporaries with numpy, megabytes each on a CNN's
feature maps. glibc's malloc serves a block above its mmap threshold (128 KiB at start)
with a fresh mmap and returns it to the system when freed, so the next step's arrays of the
same size start as untouched pages: one page fault per 4 KiB written, which made a batch
norm of a (32, 16, 32, 32) map take 16 ms where its arithmetic takes 2 ms. Raising the mmap
threshold to glibc's maximum and the trim threshold far above it lets freed blocks be
reused from the heap, step after step: the buffer reuse of a framework's caching
allocator, with no change to any kernel or number.

A process-wide setting of the C library; elsewhere than glibc (macOS, musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling on 64-bit systems (4 * 1024 * 1024 * sizeof(long))
_TRIM_THRESHOLD = 1024 * 1024 * 1024  # return freed heap to the system only above 1 GiB free at its top

_done = False


def keep_freed_memory() -> bool:
    """Tune glibc's malloc once per process; True if it took effect."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    _done = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    return _done
