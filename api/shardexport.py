"""A shard's closed minutes as Parquet files any process can read (DuckDB, the fleet tier).

``<parquet-dir>/minute=<ISO minute, UTC>/shard=<I>.parquet`` holds every window the shard
stored whose ``start_ns`` lies in that minute, in ``WINDOW_SCHEMA`` (paths decoded). A minute
is written once it ended ``settle_s`` ago, and again whenever a commit (a late batch, a
drained backlog) or a reconciliation touches it; each write is a temporary file renamed over
the old one, so a reader sees the previous file or the new one, never half of one::

    duckdb -c "SELECT count(*) FROM read_parquet('DIR/*/*.parquet')"
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from fleetlens.api.store import Store

from fleetlens.batch import Batch

MINUTE_NS = 60_000_000_000


def minute_dir(minute_ns: int) -> str:
    t = dt.datetime.fromtimestamp(minute_ns / 1e9, dt.UTC)
    return f"minute={t.strftime('%Y-%m-%dT%H:%MZ')}"


class MinuteExport:
    """A ``CommitSink``: the minutes commits touched, written to Parquet once closed."""

    def __init__(self, store: Store, root: Path, shard: int, settle_s: float = 5.0) -> None:
        self.store, self.root, self.shard = store, root, shard
        self.settle_ns = int(settle_s * 1e9)
        self._dirty: set[int] = set()
        self._lock = threading.Lock()
        self.written = 0  # files written (metrics, tests)
        # After a restart nothing says which minutes were exported: every stored one is again.
        self.touch(s // MINUTE_NS * MINUTE_NS for s in store.window_starts())

    def committed(self, partition: str, batches: Sequence[Batch]) -> None:
        minutes: list[int] = []
        for b in batches:
            if b.rows:
                lo, hi = pc.min_max(b.windows["start_ns"]).values()
                minutes += range(lo.as_py() // MINUTE_NS * MINUTE_NS, hi.as_py() + 1, MINUTE_NS)
        self.touch(minutes)

    def touch(self, minutes: Iterable[int]) -> None:
        with self._lock:
            self._dirty.update(minutes)

    def export(self, now_ns: int, everything: bool = False) -> int:
        """Write the touched minutes that are closed (``everything``: all, at shutdown)."""
        with self._lock:
            due = sorted(m for m in self._dirty
                         if everything or m + MINUTE_NS + self.settle_ns <= now_ns)  # fmt: skip
            self._dirty.difference_update(due)
        for m in due:
            self._write(m)
        return len(due)

    def _write(self, minute_ns: int) -> None:
        path = self.root / minute_dir(minute_ns) / f"shard={self.shard}.parquet"
        table = self.store.windows_between(minute_ns, minute_ns + MINUTE_NS - 1)
        if not table.num_rows:  # every row of it reconciled away
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        self.written += 1
