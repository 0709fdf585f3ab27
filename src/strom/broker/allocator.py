"""Process-level tuning of glibc's allocator for a broker's allocation pattern.

Every produce and fetch allocates and frees buffers of about a megabyte (a request
frame, a read from a segment, a response). glibc serves blocks above its mmap
threshold with a fresh mmap and returns them with munmap, so each such buffer
costs page faults on every touch of every page. The threshold adapts upwards only
after certain frees, which made throughput depend on the order of past requests
(measured: consume at 320 or 560 MB/s depending on what was produced before, 1,250+
MB/s with a fixed threshold). Fixing the threshold at its maximum keeps these
buffers on the heap, where they are reused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's upper bound for the mmap threshold on 64-bit systems.
MMAP_THRESHOLD = 32 * 1024 * 1024
# Free heap memory above this is returned to the OS; below it, it is kept for reuse.
TRIM_THRESHOLD = 128 * 1024 * 1024


def keep_large_buffers_on_heap() -> bool:
    """Apply the thresholds; returns False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    log.debug("malloc thresholds", extra={"applied": applied})
    return applied
