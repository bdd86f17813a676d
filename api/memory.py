"""Where the collector's resident memory goes, part by part (issue 29, point 4).

Each part is read at scrape time (``fleetlens_memory_bytes{part}``, ``metrics.py``) and
``bench/realtime.py`` prints them per minute:

- ``rss``: the process's resident set (``/proc/self/statm``), what the bound is on;
- ``duckdb``: DuckDB's buffer manager (``duckdb_memory()``: cached blocks of the file, the
  uncommitted rows of the open transaction, query state), bounded by its ``memory_limit``
  (``Settings.duckdb_memory_limit``);
- ``arrow``: bytes Arrow's memory pool has handed out and not freed (decoded batches waiting
  for the writer, the look-back, the engines' Arrow tables);
- ``lookback``: the window rows held in memory for the loops (``feed.RecentWindows``), bounded
  by ``Settings.loop_lookback_ns`` plus the feed's spare generations;
- ``ingest``: request bodies the ingest path holds, from read to their commit (their decoded
  batches are views of them), bounded by ``Settings.ingest_max_held_bytes``;
- ``heap_used`` / ``heap_free``: glibc's malloc heap (numpy, Python objects), in use and
  freed but kept (``fleetlens/heap.py`` keeps up to 1 GiB free per arena on purpose).

``lookback`` and ``ingest`` are mostly Arrow buffers: they are parts of ``arrow``, not added
to it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import pyarrow as pa
from fleetlens.api.store import Store

from fleetlens.heap import libc_function

_PAGE = os.sysconf("SC_PAGE_SIZE")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def _mallinfo2() -> Callable[[], _Mallinfo2] | None:
    fn = libc_function("mallinfo2")  # glibc >= 2.33
    if fn is not None:
        fn.restype = _Mallinfo2
    return fn


_MALLINFO2 = _mallinfo2()


def rss_bytes() -> int:
    """This process's resident set."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def duckdb_bytes(store: Store) -> int:
    """What DuckDB's buffer manager holds (every tag of ``duckdb_memory()``)."""
    # fetchall: the read cursor is the thread's, and a result left unfinished blocks its next use
    rows = store.read().execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()
    return int(rows[0][0] or 0)


def usage(store: Store, lookback: Callable[[], int], ingest: Callable[[], int]) -> dict[str, int]:
    """The parts, in bytes (heap parts only where glibc answers ``mallinfo2``)."""
    parts = {
        "rss": rss_bytes(),
        "duckdb": duckdb_bytes(store),
        "arrow": pa.total_allocated_bytes(),
        "lookback": lookback(),
        "ingest": ingest(),
    }
    if _MALLINFO2 is not None:
        m = _MALLINFO2()
        parts["heap_used"] = m.uordblks + m.hblkhd
        parts["heap_free"] = m.fordblks
    return parts
