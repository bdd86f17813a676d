"""A shard's minutes as Parquet files any process can read (DuckDB, the fleet tier).

``<parquet-dir>/minute=<ISO minute, UTC>/shard=<I>.parquet`` holds every window the shard
stored whose ``start_ns`` lies in that minute, in ``WINDOW_SCHEMA`` (paths decoded). A minute
is written once it ended ``settle_s`` ago, and again whenever a commit (a late batch, a
drained backlog) or a reconciliation touches it; each write is a temporary file renamed over
the old one, so a reader sees the previous file or the new one, never half of one.

The minute still open is there too, in **parts**: at every export the windows committed since
the last one, ``shard=<I>.part-<seq>.parquet`` (``seq`` increases). A minute's file covers
the parts that existed when it was written, and says so in its metadata
(:data:`PARTS_THROUGH`: the highest ``seq`` it covers); those parts are then deleted, later
ones add to it. A reader takes the minute files and the parts they do not cover
(:func:`readable`), so history reaches the last export (a few seconds), never counting a
window twice however a listing interleaves with the writes. A plain glob reads every window
once too, but for the instant between a minute file's write and its covered parts' deletion::

    duckdb -c "SELECT count(*) FROM read_parquet('DIR/*/*.parquet')"
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fleetlens.api.config import MINUTE_NS
from fleetlens.api.store import Store

from fleetlens.batch import Batch
from fleetlens.records import WINDOW_SCHEMA

PARTS_THROUGH = b"fleetlens.parts_through"  # a minute file's metadata: the parts it covers
_PART = re.compile(r"^shard=(\d+)\.part-(\d+)\.parquet$")


def minute_dir(minute_ns: int) -> str:
    t = dt.datetime.fromtimestamp(minute_ns / 1e9, dt.UTC)
    return f"minute={t.strftime('%Y-%m-%dT%H:%MZ')}"


class MinuteExport:
    """A ``CommitSink``: the minutes commits touched, written to Parquet once closed, and the
    open minute's new windows as parts."""

    def __init__(self, store: Store, root: Path, shard: int, settle_s: float = 5.0) -> None:
        self.store, self.root, self.shard = store, root, shard
        self.settle_ns = int(settle_s * 1e9)
        self._dirty: set[int] = set()
        self._now: set[int] = set()  # written at the next export, closed or not
        self._fresh: list[pa.Table] = []  # committed since the last export, new to this file
        self._lock = threading.Lock()
        self._seq = max((s for m in root.glob("minute=*") for s in _part_seqs(m, shard)),
                        default=0)  # fmt: skip
        self.written = 0  # files written (metrics, tests)
        # After a restart nothing says which minutes were exported: every stored one is again.
        self.touch(s // MINUTE_NS * MINUTE_NS for s in store.window_starts())

    def committed(self, partition: str, batches: Sequence[Batch]) -> None:
        self.touch(_minutes(batches))

    def stored(self, batches: Sequence[Batch]) -> None:
        """Batches this commit stored for the first time: their windows go to the next parts."""
        with self._lock:
            self._fresh += [b.windows.select(WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
                            for b in batches if b.rows]  # fmt: skip

    def forgotten(self, batches: Sequence[Batch]) -> None:
        """Batches deleted from the file (a reconciliation): their minutes, open or closed,
        are written again at the next export (a part cannot be taken back)."""
        with self._lock:
            self._now.update(_minutes(batches))

    def touch(self, minutes: Iterable[int]) -> None:
        with self._lock:
            self._dirty.update(minutes)

    def export(self, now_ns: int, everything: bool = False) -> int:
        """Write the touched minutes that are closed (``everything``: all, at shutdown), then
        the open minutes' new windows as parts; the number of minute files written."""
        with self._lock:
            due = {m for m in self._dirty if everything or m + MINUTE_NS + self.settle_ns <= now_ns}
            due |= self._now
            self._dirty.difference_update(due)
            self._now.clear()
            fresh, self._fresh = self._fresh, []
        for m in sorted(due):
            self._write(m)
        if fresh:
            self._write_parts(pa.concat_tables(fresh), due)
        return len(due)

    def _write(self, minute_ns: int) -> None:
        d = self.root / minute_dir(minute_ns)
        path = d / f"shard={self.shard}.parquet"
        covered = _part_seqs(d, self.shard)  # committed, so in the rows read next
        table = self.store.windows_between(minute_ns, minute_ns + MINUTE_NS - 1)
        if not table.num_rows:  # every row of it reconciled away
            path.unlink(missing_ok=True)
        else:
            through = str(max(covered, default=0)).encode()
            _replace(table.replace_schema_metadata({PARTS_THROUGH: through}), path)
            self.written += 1
        for seq in covered:
            (d / _part_name(self.shard, seq)).unlink(missing_ok=True)

    def _write_parts(self, rows: pa.Table, written: set[int]) -> None:
        """One part per minute of ``rows``, but for the minutes just written whole."""
        minute = pc.multiply(pc.divide(rows["start_ns"], MINUTE_NS), MINUTE_NS)
        for m in pc.unique(minute).to_pylist():
            if m in written:
                continue
            self._seq = max(self._seq + 1, time.time_ns())
            d = self.root / minute_dir(m)
            d.mkdir(parents=True, exist_ok=True)
            _replace(rows.filter(pc.equal(minute, m)), d / _part_name(self.shard, self._seq))


def readable(directory: Path) -> list[Path]:
    """The Parquet files of a shard's export directory (or of several shards' shared one)
    that together hold each stored window once: every minute file, and the parts that no
    minute file of their shard covers."""
    out: list[Path] = []
    parts: dict[Path, list[tuple[int, int, Path]]] = {}  # directory -> (shard, seq, file)
    for f in sorted(directory.glob("**/*.parquet")):
        if p := _PART.match(f.name):
            parts.setdefault(f.parent, []).append((int(p[1]), int(p[2]), f))
        else:  # minute files, and files of another layout (written by hand): read as they are
            out.append(f)
    seen = set(out)
    for d, listed in parts.items():
        # Only the minutes with parts (the open ones) need their file's footer read.
        through: dict[int, int] = {}
        for s in {s for s, _, _ in listed}:
            minute = d / f"shard={s}.parquet"
            through[s] = _covers(minute)
            if through[s] and minute not in seen:  # written since the listing: read it too
                out.append(minute)
        out += [f for shard, seq, f in listed if seq > through[shard]]
    return out


def _covers(minute_file: Path) -> int:
    """The highest part sequence a minute file covers (0: none, no file yet, or a file that
    says nothing). A file replaced since it was listed says what its successor covers, which
    covers more."""
    try:
        meta = pq.read_schema(minute_file).metadata or {}
    except FileNotFoundError:
        return 0
    return int(meta.get(PARTS_THROUGH, b"0"))


def _minutes(batches: Sequence[Batch]) -> list[int]:
    minutes: list[int] = []
    for b in batches:
        if b.rows:
            lo, hi = pc.min_max(b.windows["start_ns"]).values()
            minutes += range(lo.as_py() // MINUTE_NS * MINUTE_NS, hi.as_py() + 1, MINUTE_NS)
    return minutes


def _part_name(shard: int, seq: int) -> str:
    return f"shard={shard}.part-{seq}.parquet"


def _part_seqs(d: Path, shard: int) -> list[int]:
    return [int(p[2]) for f in d.glob(f"shard={shard}.part-*.parquet")
            if (p := _PART.match(f.name))]  # fmt: skip


def _replace(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
