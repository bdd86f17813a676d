"""Keep freed memory in the process heap, for processes that handle big windows every second.

The collector's engines allocate the same few arrays of tens of MB every window (a reference
fabric window is ~6 M flow rows). glibc serves blocks over its mmap threshold (at most 32 MB
when it adapts) with fresh ``mmap`` pages and unmaps them on ``free``, so each window faulted
its arrays in again; with transparent huge pages on, those faults zero and compact 2 MB pages
and cost 0.1-0.3 s of kernel time in some windows (triangulation went from ~120 ms to 300-470
ms a window, measured with ``bench/triangulate_speed.py``). Raising the mmap threshold and the
trim threshold keeps freed blocks for the next window instead. The price: the process keeps
its peak heap rather than returning it between windows.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEEP_BYTES = 1 << 30  # blocks up to 1 GiB come from the heap, and 1 GiB of free top is kept


def libc_function(name: str) -> Any | None:
    """The C library's function ``name``, or None where it has none (not glibc, or an older
    one)."""
    lib = ctypes.util.find_library("c")
    if lib is None:
        return None
    try:
        return getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds for this process; False where there is no glibc ``mallopt``
    (musl, macOS): nothing changes there."""
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)
    )
