"""``GET /v1/flows``: per-flow totals over a period, the evidence of ``fleetlens audit``.

One aggregation over the raw windows (``Store.flow_totals``: flows need the source port,
which the minute rollups drop), the one the audit's local reader runs on a copy of the DuckDB
file too: a window counts when it lies wholly inside [since, until), and a flow's path is the
one that carried most of those windows, so a remote audit sees exactly the evidence a local
one reads.

Paging: with LIMIT/OFFSET in SQL every page would aggregate the whole period again, so reading
F flows costs F/limit full aggregations (quadratic in fleet size: 10^6 flows are 1000 pages).
The whole period is aggregated once instead, sorted, and kept for ``TTL_S`` under its exact
(since, until); pages are slices of it. Pages of one period therefore come from one snapshot
(stable order, consistent X-Total-Count) even while windows keep arriving. One period is kept
at a time (one audit pages at a time; its memory is ~100 bytes a flow plus paths as ints).

A period that is still live (its end later than the longest a window may wait for its last
upload, ``triangulate_max_wait_ns`` ago) is aggregated afresh by every first page (offset 0),
so a caller polling it sees the windows stored since; the later pages of one paging still
read the snapshot its first page took.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pyarrow as pa
from fleetlens.api.models import FlowOut
from fleetlens.api.service import Collector

TTL_S = 60.0


@dataclass
class _Entry:
    key: tuple[int, int, int]  # (store identity, since, until)
    expires: float  # time.monotonic()
    table: pa.Table


_lock = threading.Lock()
_last: _Entry | None = None


def _period(c: Collector, since: int, until: int, first_page: bool) -> pa.Table:
    global _last
    key = (id(c.store), since, until)
    now = time.monotonic()
    live = until > time.time_ns() - c.settings.triangulate_max_wait_ns
    with _lock:
        hit = _last if _last is not None and _last.key == key and _last.expires > now else None
    if hit is not None and not (live and first_page):
        return hit.table
    t = c.store.flow_totals(since, until)
    with _lock:
        _last = _Entry(key, now + TTL_S, t)
    return t


def flows(
    c: Collector, since: int, until: int, limit: int, offset: int
) -> tuple[int, list[FlowOut]]:
    """(total flows in the period, one page ordered by src NIC, dst NIC, source port)."""
    t = _period(c, since, until, first_page=offset == 0)
    page = t.slice(offset, limit) if offset < t.num_rows else t.slice(0, 0)
    paths = c.store.decode_paths(page["path"]).to_pylist()  # after fetching the rows
    rows = page.drop_columns(["path"]).to_pylist()
    return t.num_rows, [FlowOut(**r, path=p) for r, p in zip(rows, paths, strict=True)]
