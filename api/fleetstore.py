"""The fleet tier's store: the collector's ``Store`` with the windows kept elsewhere.

The fleet tier (``fleet.py``) runs the collector's loops, API and writer over the shards'
summaries (``summaries.py``), but it is not where windows are stored: every shard keeps its
partitions' rows in its own DuckDB file and exports closed minutes as Parquet. So:

- what the tier itself writes stays in its DuckDB file, as a collector's: batch (summary) ids
  for idempotence, registrations, clocks, verdicts, decisions, jobs;
- the summaries' rows are held in memory, only as long as the loops may read them
  (``keep_ns``: the look-back and the longest settling wait, with room to spare); the
  triangulation feed and the clock round read them through the ``Store`` methods they call;
- history (``/v1/flows`` totals, pair series, host stalls) is DuckDB over the shards' Parquet
  files (every ``--parquet`` directory, ``WINDOW_SCHEMA`` columns: NICs by name, ``path`` as
  lists of link ids), with the collector's own SQL in its by-name form (``store.BY_NAME``):
  closed minutes and the open minute's parts
  (``shardexport.readable``), so it reaches the shards' last export, seconds ago. A file
  listed and then replaced or deleted by its shard fails the query, which is run again on a
  new listing.

A window older than ``keep_ns`` that triangulation has not judged yet is gone: the tier's
``fleetlens_triangulated_window_age_seconds`` shows a tier that fell that far behind.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.api import store as sql
from fleetlens.api.shardexport import readable
from fleetlens.api.store import Store

from fleetlens.batch import Batch, LayoutIds
from fleetlens.records import WINDOW_SCHEMA, nic_hosts

T = TypeVar("T")
LISTINGS = 3  # listings a history query is run on before a vanished file fails it


class HeldWindows:
    """Window rows by generation start, the newest ``keep_ns`` of them (thread-safe)."""

    def __init__(self, keep_ns: int) -> None:
        self._lock = threading.Lock()
        self._rows: dict[int, list[pa.Table]] = {}
        self._keep_ns = keep_ns

    def add(self, windows: pa.Table) -> None:
        rows = windows.select(WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
        starts = pc.unique(rows["start_ns"]).to_pylist()
        with self._lock:
            for s in starts:
                part = rows if len(starts) == 1 else rows.filter(pc.equal(rows["start_ns"], s))
                self._rows.setdefault(s, []).append(part)
            newest = max(self._rows, default=0)
            for s in [s for s in self._rows if s < newest - self._keep_ns]:
                del self._rows[s]

    def starts(self, after_ns: int | None = None) -> list[int]:
        with self._lock:
            return sorted(s for s in self._rows if after_ns is None or s > after_ns)

    def between(self, lo_ns: int, hi_ns: int) -> pa.Table:
        with self._lock:
            parts = [t for s in sorted(self._rows) if lo_ns <= s <= hi_ns for t in self._rows[s]]
        return pa.concat_tables(parts) if parts else WINDOW_SCHEMA.empty_table()


class FleetStore(Store):
    """A ``Store`` whose windows are held in memory (:class:`HeldWindows`) and whose
    history is the shards' Parquet files."""

    def __init__(
        self,
        path: Path,
        parquet: list[Path],
        keep_ns: int,
        threads: int | None = None,
        memory_limit: str | None = None,
    ) -> None:
        super().__init__(path, threads, memory_limit)
        self.parquet = parquet
        self.held = HeldWindows(keep_ns)
        self._pending: list[pa.Table] = []  # this transaction's rows (writer thread)

    # ---- writes: rows held once their transaction committed ------------------------------
    def insert_batches(self, batches: list[Batch], now_ns: int) -> list[bool]:
        self._pending = []
        try:
            stored = super().insert_batches(batches, now_ns)
            for t in self._pending:
                self.held.add(t)
            return stored
        finally:
            self._pending = []

    def _insert_windows(
        self, tables: list[pa.Table], layouts: Sequence[LayoutIds | None] = ()
    ) -> list[LayoutIds]:
        self._pending.append(pa.concat_tables(tables))
        return []  # held as they came: no storage ids

    def insert_windows_raw(self, table: pa.Table) -> None:
        self.held.add(table)

    # ---- the loops' reads ----------------------------------------------------------------
    def newest_window_start(self) -> int | None:
        starts = self.held.starts()
        return starts[-1] if starts else None

    def oldest_window_start(self) -> int | None:
        starts = self.held.starts()
        return starts[0] if starts else None

    def window_starts(self, after_ns: int | None = None) -> list[int]:
        return self.held.starts(after_ns)

    def first_window_per_host(self, after_ns: int) -> dict[str, int]:
        t = self.held.between(after_ns + 1, 2**63 - 1)
        if not t.num_rows:
            return {}
        hosts = pa.table({"h": nic_hosts(t["src_nic"]), "s": t["start_ns"]})
        got = hosts.group_by("h").aggregate([("s", "min")])
        return dict(zip(got["h"].to_pylist(), got["s_min"].to_pylist(), strict=True))

    def windows_between(self, lo_ns: int, hi_ns: int, without: tuple[str, ...] = ()) -> pa.Table:
        return _blank(self.held.between(lo_ns, hi_ns), without)

    def windows_since(self, lo_ns: int, without: tuple[str, ...] = ()) -> pa.Table:
        return self.windows_between(lo_ns, 2**63 - 1, without)

    def window_at(self, start_ns: int, without: tuple[str, ...] = ()) -> pa.Table:
        return self.windows_between(start_ns, start_ns, without)

    def read_windows(self, *, without: tuple[str, ...] = ()) -> pa.Table:
        return self.windows_between(0, 2**63 - 1, without)

    def links_on_paths(self, nics: list[str], since_ns: int) -> set[str]:
        """From the held windows only (a job's impact asks for 5 minutes of paths: every flow
        reports its current path every window, so the held seconds name them all)."""
        t = self.windows_since(since_ns)
        on = pc.and_(pc.is_in(t["src_nic"], pa.array(nics)), pc.is_in(t["dst_nic"], pa.array(nics)))
        paths = t.filter(on)["path"].combine_chunks()
        return set(pc.unique(paths.flatten()).to_pylist())

    # ---- history: the shards' Parquet ----------------------------------------------------
    def flow_totals(
        self, since_ns: int, until_ns: int, without: pa.Table | None = None
    ) -> pa.Table:
        params = {"since": since_ns, "until": until_ns}
        cur = self.read()
        text = sql.flow_totals_sql(sql.BY_NAME, without is not None)
        if without is not None:
            cur.register("_cut", without)
        try:
            return self._over_parquet(text, lambda t: cur.sql(t, params=params).to_arrow_table())
        finally:
            if without is not None:
                cur.unregister("_cut")

    def host_stalls(self, since_ns: int, until_ns: int, rule: sql.StallRule) -> pa.Table:
        params = {
            "since": since_ns, "until": until_ns, "stall_loss": rule.loss,
            "spread": rule.spread, "max_share": rule.max_share,
        }  # fmt: skip
        cur = self.read()
        return self._over_parquet(sql.host_stalls_sql(sql.BY_NAME), lambda text: (
            cur.sql(text, params=params).to_arrow_table()))  # fmt: skip

    def pair_series(
        self, src: str, dst: str, since_ns: int, until_ns: int, step_ns: int
    ) -> list[tuple[int, int, int, int, float, float, float, float]]:
        """As the collector's, every bucket from the shards' raw windows (no rollups)."""
        params = {
            "src": src, "dst": dst, "since": since_ns, "until": until_ns, "step": step_ns,
            "raw_lo": since_ns, "split": since_ns, "min_lo": since_ns,
            "minute": sql.MINUTE_NS,
        }  # fmt: skip
        text = sql.pair_series_sql(sql.BY_NAME).replace(
            "FROM windows_minute", "FROM (SELECT * FROM windows_minute WHERE false)"
        )
        cur = self.read()
        return self._over_parquet(text, lambda t: cur.execute(t, params).fetchall())

    def decode_paths(self, stored: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Parquet paths are lists of link ids already."""
        got = stored.combine_chunks() if isinstance(stored, pa.ChunkedArray) else stored
        return got.cast(pa.list_(pa.string()))

    def _over_parquet(self, text: str, run: Callable[[str], T]) -> T:
        """``run`` on the collector's SQL with its raw ``windows`` table read from the shards'
        files, listed again when one vanished meanwhile (its shard replaced or deleted it)."""

        def listed() -> T:
            return run(re.sub(r"FROM windows\b", f"FROM {self._source()}", text))

        for _ in range(LISTINGS - 1):
            with contextlib.suppress(duckdb.IOException, FileNotFoundError):
                return listed()
        return listed()

    def _source(self) -> str:
        files = [str(f) for d in self.parquet for f in readable(Path(d))]
        if not files:  # nothing exported yet: an empty table of the same columns
            return _EMPTY
        listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
        return f"read_parquet([{listed}], union_by_name = true)"


_EMPTY = (
    "(SELECT NULL::VARCHAR AS src_nic, NULL::VARCHAR AS dst_nic, NULL::INTEGER AS sport, "
    "NULL::BIGINT AS start_ns, NULL::BIGINT AS duration_ns, NULL::INTEGER AS sent, "
    "NULL::INTEGER AS received, NULL::DOUBLE AS owd_min_ns, NULL::DOUBLE AS owd_p50_ns, "
    "NULL::DOUBLE AS owd_p99_ns, NULL::DOUBLE AS owd_max_ns, NULL::VARCHAR[] AS path "
    "WHERE false)"
)


def _blank(table: pa.Table, without: tuple[str, ...]) -> pa.Table:
    """The list columns named in ``without`` null, as the collector's store leaves them."""
    for name in without:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, pa.nulls(table.num_rows, WINDOW_SCHEMA.field(name).type))
    return table
