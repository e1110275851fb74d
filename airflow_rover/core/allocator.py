"""glibc malloc settings for the node processes that move large messages (PS and workers).

Every PushPull allocates and frees buffers of a megabyte and more (gRPC's slices, the
message's bytes, the arrays decoded from it). Past glibc's mmap threshold each such buffer is
mapped fresh and unmapped when freed, and one freed at the top of a thread's arena is handed
back to the kernel: either way the next one faults its pages in again, zeroed. Raising both
thresholds keeps that memory in the process for reuse.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024
"""Buffers under this come from the arenas (glibc's largest value on 64-bit)."""
TRIM_THRESHOLD = 64 * 1024 * 1024
"""Free memory an arena keeps at its top before it gives any back."""


def keep_freed_memory() -> bool:
    """Set both thresholds in this process; False where the C library has no ``mallopt``
    (not glibc) or refuses them (nothing changes then)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    if not done:
        log.info("malloc thresholds not set: this C library refused them")
    return done
